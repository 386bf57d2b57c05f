//! The Lua scripts under `lua/v1/`, embedded at compile time. The tests at the bottom pin every
//! script's SHA1: changing a script is a deliberate act that updates the pin, `lua/README.md`
//! and the CHANGELOG together.

use std::sync::LazyLock;

#[cfg(test)]
use crate::backend::Publish;
use crate::backend::Script;

/// The key-layout version these scripts read and write (the `v1` of `lua/v1/`).
#[cfg(test)]
pub(crate) const LAYOUT_VERSION: u32 = 1;

/// A script: a prelude that names the publish command, then its files in order (a library
/// first where it has one: `calls_lib.lua` runs a command over any number of arguments,
/// `keys_lib.lua` recognises foreign data, `queue_lib.lua` is the queue machinery). Two forms: `PUBLISH` for one server, `SPUBLISH` for Redis Cluster. A script
/// marked `once` changes hold counts: its cluster form runs its files as `main` through
/// `once_lib.lua`, once per request id.
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
                false,
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
                true,
            )
        });
    };
}

script!(once MUTEX_ACQUIRE, "mutex_lib.lua", "mutex_acquire.lua");
script!(once MUTEX_RELEASE, "mutex_lib.lua", "mutex_release.lua");
script!(MUTEX_EXTEND, "mutex_lib.lua", "mutex_extend.lua");
script!(
    MUTEX_CONFIRM,
    "keys_lib.lua",
    "mutex_lib.lua",
    "mutex_confirm.lua"
);
script!(
    once QUEUE_ACQUIRE,
    "calls_lib.lua",
    "queue_acquire_fast.lua",
    "keys_lib.lua",
    "queue_lib.lua",
    "queue_acquire.lua"
);
script!(
    once QUEUE_RELEASE,
    "calls_lib.lua",
    "queue_release_fast.lua",
    "keys_lib.lua",
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
                "97e8f33e28a0d35fa033b1b45951ec72c81d5a50",
                "b61ec6f4eae0a7d591f4499e3ae86ca053ff0bfe",
            ),
            (
                &*MUTEX_RELEASE,
                "f39ca5fe0444dc64152c1724295af0d34115d70f",
                "b0a9ea81445e5a20e50507280b8343a1ce1ce888",
            ),
            (
                &*MUTEX_EXTEND,
                "e4d4a542b3007eb87df9de027907e9027ade696e",
                "df2fff347055448210602bb3d9223b656684067f",
            ),
            (
                &*MUTEX_CONFIRM,
                "6b3f0edb113ca52644695d022f49dbf7a2410809",
                "a3e2af615d035bc294fc084db6f957735d019122",
            ),
            (
                &*QUEUE_ACQUIRE,
                "d7dd8c09b1807faa9aafa95019ab40bd43baf046",
                "eec31cbc1febfd83508e110019b1bcf204fb4ad8",
            ),
            (
                &*QUEUE_RELEASE,
                "1a9be87533edea7c3e4a42b62ac4a19813c21735",
                "3b5078ca2ed63f747f89cdfd03ad8a7250697a13",
            ),
            (
                &*QUEUE_EXTEND,
                "08e2af07f6f9aedc7a3f23f4aebf9746090985c3",
                "74277a5380022b068709600d313db61cd782b4d8",
            ),
            (
                &*INSPECT,
                "ff0332495d6970831bbd5d734f86b88059ec5f47",
                "fb215a0f2dab9e0e2662b896ed39453cdfa4a892",
            ),
            (
                &*FORCE_UNLOCK,
                "087e1f4f3165a550d692c93b052d5e8f6aed5371",
                "897322b61f568b0828566986eb7dbb4e3133a4bd",
            ),
            (
                &*ELECT_PROCLAIM,
                "f3a756a92c3374660f184d6244fc5327940ccadd",
                "a197b692cc80b23eca6c751cfc7f829ade070188",
            ),
            (
                &*ELECT_LEADER,
                "7d65d916e09bc3fb240cb36850e6db8f2909d4f5",
                "dc47a1e31c6c9f55b399e6c255406034c0f42c53",
            ),
        ];
        for (script, plain, sharded) in pins {
            assert_eq!(script.hash(Publish::Plain), plain);
            assert_eq!(script.hash(Publish::Sharded), sharded);
        }
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
