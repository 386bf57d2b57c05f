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
/// first where it has one: `keys_lib.lua` recognises foreign data, `queue_lib.lua` is the queue
/// machinery). Two forms: `PUBLISH` for one server, `SPUBLISH` for Redis Cluster. A script
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

script!(once MUTEX_ACQUIRE, "mutex_acquire.lua");
script!(once MUTEX_RELEASE, "mutex_release.lua");
script!(MUTEX_EXTEND, "mutex_extend.lua");
script!(MUTEX_CONFIRM, "mutex_confirm.lua");
script!(
    once QUEUE_ACQUIRE,
    "keys_lib.lua",
    "queue_lib.lua",
    "queue_acquire.lua"
);
script!(
    once QUEUE_RELEASE,
    "keys_lib.lua",
    "queue_lib.lua",
    "queue_release.lua"
);
script!(
    QUEUE_EXTEND,
    "keys_lib.lua",
    "queue_lib.lua",
    "queue_extend.lua"
);
script!(INSPECT, "keys_lib.lua", "inspect.lua");
script!(FORCE_UNLOCK, "keys_lib.lua", "force_unlock.lua");

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
                "c066536d3b4946618e53f94ee9b0e562c3fccaf5",
                "9862661d63f247017a4376a401038eb3412c1294",
            ),
            (
                &*MUTEX_RELEASE,
                "34277f200b4532718e9e4915c676d1da092c4829",
                "3fc2fade93ea660c3754a8878aec5b59a8dd1e08",
            ),
            (
                &*MUTEX_EXTEND,
                "90a36e9863f2cc962a72e1f1d89df945fbd7e0a1",
                "4c8fb1c3d1a8a6ac599f8a2d0ace651ba835a09f",
            ),
            (
                &*MUTEX_CONFIRM,
                "f8b98c9642fb6a4187a841c3d9d8bc91448dc2fd",
                "3a826f7eb605fe43add4e0eb18d7c088c8bc1143",
            ),
            (
                &*QUEUE_ACQUIRE,
                "0ba9552a6b1b0f8952a3593b9e75ef864edec099",
                "f8683247a5ffc45a0a5a5a687753239e11e37917",
            ),
            (
                &*QUEUE_RELEASE,
                "e753301047239e1ff7230a2cc4c6e55e29a4ea0b",
                "bc37538f2ba362a90263d619a092b7a89b670e56",
            ),
            (
                &*QUEUE_EXTEND,
                "17fa767f17b731f994dfbede74544dd3aec352d2",
                "6b1f8751c1b762168f99f2cd24f48e3fe2a91150",
            ),
            (
                &*INSPECT,
                "0fbb7ccf4803f4ded57548f7f332a53ab598c4b8",
                "5666e8a306df75b2921474f0816129a46d81c0bc",
            ),
            (
                &*FORCE_UNLOCK,
                "fe8cad711a8fcbb2bdff38ee44934798f5c8cd93",
                "2d7659df8ebcb7b034656e825f78a78e2abe169b",
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
        ];
        for (name, src) in mutex.into_iter().chain(queue) {
            assert!(src.starts_with(&format!("-- name:    {name}\n")), "{name}");
            let layout = format!("-- layout:  {LAYOUT_VERSION}");
            assert!(src.contains(&layout), "{name} lacks `{layout}`");
            for section in ["-- KEYS[", "-- ARGV[", "-- returns:"] {
                assert!(src.contains(section), "{name} lacks {section}");
            }
        }
        for (name, src) in mutex {
            assert!(src.contains(&format!("'{MUTEX_LAYOUT}'")), "{name}");
        }
    }
}
