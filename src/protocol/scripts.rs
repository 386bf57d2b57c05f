//! The Lua scripts under `lua/v1/`, embedded at compile time. The tests at the bottom pin every
//! script's SHA1: changing a script is a deliberate act that updates the pin, `lua/README.md`
//! and the CHANGELOG together.

use std::sync::LazyLock;

use crate::backend::Script;

/// The key-layout version these scripts read and write (the `v1` of `lua/v1/`).
#[cfg(test)]
pub(crate) const LAYOUT_VERSION: u32 = 1;

macro_rules! script {
    ($name:ident, $file:literal) => {
        pub(crate) static $name: LazyLock<Script> =
            LazyLock::new(|| Script::new(include_str!(concat!("../../lua/v1/", $file))));
    };
}

/// A script that recognises foreign data: `lua/v1/keys_lib.lua` followed by its own file.
macro_rules! checking_script {
    ($name:ident, $file:literal) => {
        pub(crate) static $name: LazyLock<Script> = LazyLock::new(|| {
            Script::new(concat!(
                include_str!("../../lua/v1/keys_lib.lua"),
                include_str!(concat!("../../lua/v1/", $file))
            ))
        });
    };
}

/// A queue script: `lua/v1/keys_lib.lua`, `lua/v1/queue_lib.lua`, then the operation's own
/// file.
macro_rules! queue_script {
    ($name:ident, $file:literal) => {
        pub(crate) static $name: LazyLock<Script> = LazyLock::new(|| {
            Script::new(concat!(
                include_str!("../../lua/v1/keys_lib.lua"),
                include_str!("../../lua/v1/queue_lib.lua"),
                include_str!(concat!("../../lua/v1/", $file))
            ))
        });
    };
}

script!(MUTEX_ACQUIRE, "mutex_acquire.lua");
script!(MUTEX_RELEASE, "mutex_release.lua");
script!(MUTEX_EXTEND, "mutex_extend.lua");
queue_script!(QUEUE_ACQUIRE, "queue_acquire.lua");
queue_script!(QUEUE_RELEASE, "queue_release.lua");
queue_script!(QUEUE_EXTEND, "queue_extend.lua");
checking_script!(INSPECT, "inspect.lua");
checking_script!(FORCE_UNLOCK, "force_unlock.lua");

/// Every script, for a connection to load when it is made.
pub(crate) fn all() -> Vec<&'static Script> {
    vec![
        &MUTEX_ACQUIRE,
        &MUTEX_RELEASE,
        &MUTEX_EXTEND,
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
            (&*MUTEX_ACQUIRE, "cd8f49ed5949b25c35f46f5d6a36ba7d9371d46e"),
            (&*MUTEX_RELEASE, "112365a4fce6f963802c944416e2695c16202fac"),
            (&*MUTEX_EXTEND, "ad94e925979a80afea80c0dcb190487a5bf05e4b"),
            (&*QUEUE_ACQUIRE, "85281b2aa8292e8cd9ffad189c52131d766a1449"),
            (&*QUEUE_RELEASE, "05086d46161a8dd215165f55a45e960355ec3c1e"),
            (&*QUEUE_EXTEND, "50ea714ea7fe02d25937f6c3495ac6912271ad72"),
            (&*INSPECT, "c3c6e4fa023569a2e60dbfa4ce29244fa9d2dd90"),
            (&*FORCE_UNLOCK, "616c529b713bec3ed4b915003050d1ec86e19752"),
        ];
        for (script, sha) in pins {
            assert_eq!(script.hash(), sha);
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
