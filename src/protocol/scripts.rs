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

script!(
    once MUTEX_ACQUIRE,
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
script!(
    once QUEUE_ACQUIRE,
    "calls_lib.lua",
    "keys_lib.lua",
    "queue_acquire_fast.lua",
    "queue_lib.lua",
    "queue_acquire.lua"
);
script!(
    once QUEUE_RELEASE,
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
                "63e8575ec68f35fedce476b2b71b025a0d8b455c",
                "ae2e94e28602c0c034bec4f0f9867cf767992120",
            ),
            (
                &*MUTEX_RELEASE,
                "65f04557e171186f43f3c00a80cc0b48344420b9",
                "41e5fa4e853c9ea048d88d4b58e37b54e7c13754",
            ),
            (
                &*MUTEX_EXTEND,
                "859ce93dbe8feacff2aae0cf9f831a0e88415b31",
                "9c094e69259167e9b3a9168397ba35d573d61a4e",
            ),
            (
                &*MUTEX_CONFIRM,
                "de2cd5f33e81075d784a5ef0f2a3b8d979c30c51",
                "8497151beea7cdf1aa70118941b69ca0b35e245c",
            ),
            (
                &*QUEUE_ACQUIRE,
                "f3c727f59853c5df91ab5d69fbd07e970cde45f6",
                "2cf68fdf98efa233985cf9cbd18534c2a372564a",
            ),
            (
                &*QUEUE_RELEASE,
                "96fe707ad795b4d1b14d5460c1104781f65418e8",
                "43906a1acb9e83a20db9e206fcc754c393e0ae07",
            ),
            (
                &*QUEUE_EXTEND,
                "c0753d274f748ce6b63a7c8b01038844d9839582",
                "56ee63731a639d81216abdeea1ebf0b3be4913ad",
            ),
            (
                &*INSPECT,
                "e892e5e7dfdced51e8f9c3458724ebed23c5da7e",
                "30ab03d95a5a1b8b0af8f1ef61f29c30c24207c0",
            ),
            (
                &*FORCE_UNLOCK,
                "7b6c1f00a1b80cb4e093800530f046d6722f6dae",
                "231eceeafc442186d1756299b74a633ad286db95",
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
