//! The Lua scripts under `lua/v1/`, embedded at compile time. The tests at the bottom pin every
//! script's SHA1: changing a script is a deliberate act that updates the pin, `lua/README.md`
//! and the CHANGELOG together.

use std::sync::LazyLock;

#[cfg(test)]
use crate::backend::Publish;
use crate::backend::{Logged, Script};

/// The key-layout version these scripts read and write (the `v1` of `lua/v1/`).
#[cfg(test)]
pub(crate) const LAYOUT_VERSION: u32 = 1;

/// A script: a prelude that names the publish command, then its files in order (a library
/// first where it has one: `calls_lib.lua` runs a command over any number of arguments and tells
/// queued waiters on their clients' channels, `keys_lib.lua` recognises foreign data,
/// `queue_lib.lua` is the queue machinery). Two forms: `PUBLISH` for one server, `SPUBLISH` for
/// Redis Cluster. A script marked `once` changes hold counts: its cluster form runs its files
/// as `main` through `once_lib.lua`, once per request id (the cluster client re-sends a request
/// whose reply it lost). One marked `logged` (the acquisitions) does so in both forms: a wait
/// asks again after a lost answer on any server.
macro_rules! script {
    ($name:ident, $($file:literal),+) => {
        pub(crate) static $name: LazyLock<Script> = LazyLock::new(|| {
            Script::new(
                concat!(
                    "local PUBLISH = 'PUBLISH'\n",
                    $(include_str!(concat!("../../lua/v1/", $file))),+
                ),
                concat!(
                    "local PUBLISH = 'SPUBLISH'\n",
                    $(include_str!(concat!("../../lua/v1/", $file))),+
                ),
                Logged::Never,
            )
        });
    };
    (logged $name:ident, $($file:literal),+) => {
        pub(crate) static $name: LazyLock<Script> = LazyLock::new(|| {
            Script::new(
                concat!(
                    "local PUBLISH = 'PUBLISH'\nlocal function main()\n",
                    $(include_str!(concat!("../../lua/v1/", $file))),+,
                    "end\n",
                    include_str!("../../lua/v1/once_lib.lua"),
                ),
                concat!(
                    "local PUBLISH = 'SPUBLISH'\nlocal function main()\n",
                    $(include_str!(concat!("../../lua/v1/", $file))),+,
                    "end\n",
                    include_str!("../../lua/v1/once_lib.lua"),
                ),
                Logged::Always,
            )
        });
    };
    (once $name:ident, $($file:literal),+) => {
        pub(crate) static $name: LazyLock<Script> = LazyLock::new(|| {
            Script::new(
                concat!(
                    "local PUBLISH = 'PUBLISH'\n",
                    $(include_str!(concat!("../../lua/v1/", $file))),+
                ),
                concat!(
                    "local PUBLISH = 'SPUBLISH'\nlocal function main()\n",
                    $(include_str!(concat!("../../lua/v1/", $file))),+,
                    "end\n",
                    include_str!("../../lua/v1/once_lib.lua"),
                ),
                Logged::Sharded,
            )
        });
    };
}

script!(
    logged MUTEX_ACQUIRE,
    "keys_lib.lua",
    "mutex_lib.lua",
    "mutex_acquire.lua"
);
script!(
    once MUTEX_RELEASE,
    "mutex_release_fast.lua",
    "mutex_lib.lua",
    "mutex_release.lua"
);
script!(MUTEX_EXTEND, "mutex_lib.lua", "mutex_extend.lua");
script!(
    MUTEX_CONFIRM,
    "keys_lib.lua",
    "mutex_lib.lua",
    "mutex_confirm.lua"
);
script!(MUTEX_REVOKE, "mutex_lib.lua", "mutex_revoke.lua");
script!(
    logged QUEUE_ACQUIRE,
    "calls_lib.lua",
    "keys_lib.lua",
    "queue_acquire_fast.lua",
    "queue_lib.lua",
    "queue_acquire.lua"
);
script!(
    once QUEUE_RELEASE,
    "queue_release_thin.lua",
    "calls_lib.lua",
    "keys_lib.lua",
    "queue_release_fast.lua",
    "queue_lib.lua",
    "queue_release.lua"
);
script!(
    QUEUE_EXTEND,
    "calls_lib.lua",
    "keys_lib.lua",
    "queue_lib.lua",
    "queue_extend.lua"
);
script!(ELECT_PROCLAIM, "elect_proclaim.lua");
script!(ELECT_LEADER, "elect_leader.lua");
script!(INSPECT, "keys_lib.lua", "mutex_lib.lua", "inspect.lua");
script!(
    FORCE_UNLOCK,
    "calls_lib.lua",
    "keys_lib.lua",
    "mutex_lib.lua",
    "force_unlock.lua"
);

/// Every script, for a connection to load when it is made.
pub(crate) fn all() -> Vec<&'static Script> {
    vec![
        &MUTEX_ACQUIRE,
        &MUTEX_RELEASE,
        &MUTEX_EXTEND,
        &MUTEX_CONFIRM,
        &MUTEX_REVOKE,
        &QUEUE_ACQUIRE,
        &QUEUE_RELEASE,
        &QUEUE_EXTEND,
        &ELECT_PROCLAIM,
        &ELECT_LEADER,
        &INSPECT,
        &FORCE_UNLOCK,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::MUTEX_LAYOUT;

    /// Pins each script's SHA1. A failing pin means a script changed: update the pin, the
    /// contract in `lua/README.md` and the CHANGELOG in the same commit. A change that old
    /// clients cannot read needs `lua/v2/` instead.
    #[test]
    fn script_hashes_are_pinned() {
        let pins = [
            (
                &*MUTEX_ACQUIRE,
                "884dd6a0792f82ad482caa47356e0ac9724e63db",
                "e39eb649556c7bad97653ba38ddf70240e3b58c0",
            ),
            (
                &*MUTEX_RELEASE,
                "c27d033d79975288161a8315dec82192e38c18bc",
                "c328bbbf9f776c9412b5db131c62f8473e3da6a6",
            ),
            (
                &*MUTEX_EXTEND,
                "859ce93dbe8feacff2aae0cf9f831a0e88415b31",
                "9c094e69259167e9b3a9168397ba35d573d61a4e",
            ),
            (
                &*MUTEX_CONFIRM,
                "f3f0918fc7147e9f3a30c4ca55259cdfbe64a28f",
                "aa62c05760be07bd93d302a6b7fd371c82d37ac3",
            ),
            (
                &*MUTEX_REVOKE,
                "c53b89f368696fa70f7d70ba5d9dc73817dfa201",
                "d33dc9b4952b032a44eda6d4e0e890ee1e39f177",
            ),
            (
                &*QUEUE_ACQUIRE,
                "2a1e82eda6d059e578f949b049fe26cb268f0c82",
                "d9613b73df9b2424913c2b204b01ca1e33816330",
            ),
            (
                &*QUEUE_RELEASE,
                "00b5f1b3505c5a018a81cbfae86998122fd28ccd",
                "665394a641bedd71642f036839fae4376b79bdef",
            ),
            (
                &*QUEUE_EXTEND,
                "a7191883e8966d1f998d33c39b9e33e6bac46b3b",
                "9fbc84f121022e5a63dd54010aa06211a69c761f",
            ),
            (
                &*INSPECT,
                "e63dcd10a11f1724b2101f8f075fb9701eec70a5",
                "083fa853435aa06978c8d577f602210742feb88c",
            ),
            (
                &*FORCE_UNLOCK,
                "944e2ed119db2fc4f3eb292ae72131d7a44720de",
                "1dfc510bb135473eb2527eda368bfab10fb6265d",
            ),
            (
                &*ELECT_PROCLAIM,
                "dc3be5b3bd19bd12216c822d7b622ea6a8d2443e",
                "b79ad418d98666deb0968f603802431e02a636a5",
            ),
            (
                &*ELECT_LEADER,
                "d873bc5e9de006904bc48769179801abe020b631",
                "bbbdac4f42725c9b4eaae802761de14557e387b7",
            ),
        ];
        for (script, plain, sharded) in pins {
            assert_eq!(script.hash(Publish::Plain), plain);
            assert_eq!(script.hash(Publish::Sharded), sharded);
        }
    }

    /// The short form of `queue_release` derives the fence key's lifetime: the client's.
    #[test]
    fn short_release_knows_the_fence_lifetime() {
        let ms = crate::config::millis(crate::config::FENCE_TTL);
        let line = format!("local FENCE_TTL_MS = '{ms}'");
        assert!(include_str!("../../lua/v1/queue_release_thin.lua").contains(&line));
    }

    #[test]
    fn headers_name_the_layout_version() {
        let mutex = [
            ("mutex_lib", include_str!("../../lua/v1/mutex_lib.lua")),
            (
                "mutex_acquire",
                include_str!("../../lua/v1/mutex_acquire.lua"),
            ),
            (
                "mutex_release",
                include_str!("../../lua/v1/mutex_release.lua"),
            ),
            (
                "mutex_extend",
                include_str!("../../lua/v1/mutex_extend.lua"),
            ),
            (
                "mutex_confirm",
                include_str!("../../lua/v1/mutex_confirm.lua"),
            ),
        ];
        let queue = [
            ("calls_lib", include_str!("../../lua/v1/calls_lib.lua")),
            ("keys_lib", include_str!("../../lua/v1/keys_lib.lua")),
            ("queue_lib", include_str!("../../lua/v1/queue_lib.lua")),
            (
                "queue_acquire",
                include_str!("../../lua/v1/queue_acquire.lua"),
            ),
            (
                "queue_release",
                include_str!("../../lua/v1/queue_release.lua"),
            ),
            (
                "queue_extend",
                include_str!("../../lua/v1/queue_extend.lua"),
            ),
            ("inspect", include_str!("../../lua/v1/inspect.lua")),
            ("once_lib", include_str!("../../lua/v1/once_lib.lua")),
            (
                "force_unlock",
                include_str!("../../lua/v1/force_unlock.lua"),
            ),
            (
                "elect_proclaim",
                include_str!("../../lua/v1/elect_proclaim.lua"),
            ),
            (
                "elect_leader",
                include_str!("../../lua/v1/elect_leader.lua"),
            ),
        ];
        for (name, src) in mutex.into_iter().chain(queue) {
            assert!(src.starts_with(&format!("-- name:    {name}\n")), "{name}");
            let layout = format!("-- layout:  {LAYOUT_VERSION}");
            assert!(src.contains(&layout), "{name} lacks `{layout}`");
            for section in ["-- KEYS[", "-- ARGV[", "-- returns:"] {
                assert!(src.contains(section), "{name} lacks {section}");
            }
        }
        let lib = include_str!("../../lua/v1/mutex_lib.lua");
        assert!(lib.contains(&format!("'{MUTEX_LAYOUT}'")));
        for (name, src) in mutex {
            assert!(src.contains("mutex:2"), "{name}");
        }
    }
}
