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
                "c289e67cbf3b6d73eeac4880a9ff90dd882771e3",
                "b95e13dcbca89be2fae4d110f69960426212ce43",
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
                "06324da852602a2b51c90266c3ace38a454a1543",
                "4bd92258a2f38a71abb89569b4c9258bf793ed5c",
            ),
            (
                &*MUTEX_REVOKE,
                "c53b89f368696fa70f7d70ba5d9dc73817dfa201",
                "d33dc9b4952b032a44eda6d4e0e890ee1e39f177",
            ),
            (
                &*QUEUE_ACQUIRE,
                "94a00083367b6e08705cf677411033e6ec3eb389",
                "30c895e77bf8e0350cca3d83b91dd8c5c9b596a9",
            ),
            (
                &*QUEUE_RELEASE,
                "2864aecd78f2805f9e18ecac5eeb2191dfa64c77",
                "fb885bb391327f74d31eb670be0ec5f402fc75c4",
            ),
            (
                &*QUEUE_EXTEND,
                "55b497d7474629f39af7a1de08842d0983b8af61",
                "6fd22452a6b0383dbd10fcf098761d01c071437b",
            ),
            (
                &*INSPECT,
                "329749d11940c3553c1f619f0a62fa91e27c2ac2",
                "3d68536c7a2830684b98bbb2163ffc6abc2e8f5a",
            ),
            (
                &*FORCE_UNLOCK,
                "6c2f116c27fbd979dd4a3aef54351e6f2d7478b5",
                "bd162a6efa5b5e195687321436aca9cd671f2e86",
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
