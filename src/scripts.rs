//! The Lua scripts under `lua/v1/`, embedded at compile time, and the decoding of their replies.
//!
//! Scripts run by SHA (`EVALSHA`); a server whose script cache is empty (`NOSCRIPT`: after a
//! restart, a failover or `SCRIPT FLUSH`) is sent the script's source with `EVAL`, which runs
//! it and caches it in one step, so no flush between a load and a retry can reach the caller.
//! The tests at the bottom pin every script's SHA1: changing a script is a deliberate act that
//! updates the pin, `lua/README.md` and the CHANGELOG together.

use std::sync::LazyLock;

use redis::{Cmd, ToRedisArgs, Value};

use crate::error::{Error, Result, wrong_type};

/// One Lua script: its source and SHA1.
#[derive(Debug)]
pub(crate) struct Script {
    source: &'static str,
    hash: String,
}

impl Script {
    fn new(source: &'static str) -> Self {
        Self {
            source,
            hash: redis::Script::new(source).get_hash().to_owned(),
        }
    }

    #[cfg(test)]
    pub(crate) fn get_hash(&self) -> &str {
        &self.hash
    }

    /// A call of this script with no keys or arguments yet.
    pub(crate) fn prepare_invoke(&self) -> Call<'_> {
        Call {
            script: self,
            keys: Vec::new(),
            args: Vec::new(),
        }
    }

    /// A call of this script with its first key.
    pub(crate) fn key(&self, key: impl ToRedisArgs) -> Call<'_> {
        let mut call = self.prepare_invoke();
        call.key(key);
        call
    }
}

/// A script call being built: its keys and arguments.
#[derive(Debug)]
pub(crate) struct Call<'a> {
    script: &'a Script,
    keys: Vec<Vec<u8>>,
    args: Vec<Vec<u8>>,
}

impl Call<'_> {
    pub(crate) fn key(&mut self, key: impl ToRedisArgs) -> &mut Self {
        self.keys.extend(key.to_redis_args());
        self
    }

    pub(crate) fn arg(&mut self, arg: impl ToRedisArgs) -> &mut Self {
        self.args.extend(arg.to_redis_args());
        self
    }

    fn command(&self, verb: &str, script: &str) -> Cmd {
        let mut cmd = redis::cmd(verb);
        cmd.arg(script)
            .arg(self.keys.len())
            .arg(&self.keys)
            .arg(&self.args);
        cmd
    }

    /// `EVALSHA`: runs the script from the server's cache.
    pub(crate) fn by_hash(&self) -> Cmd {
        self.command("EVALSHA", &self.script.hash)
    }

    /// `EVAL`: sends the source, for a server that does not have it cached.
    pub(crate) fn by_source(&self) -> Cmd {
        self.command("EVAL", self.script.source)
    }
}

/// The key-layout version these scripts read and write (the `v1` of `lua/v1/`).
#[cfg(test)]
pub(crate) const LAYOUT_VERSION: u32 = 1;
/// The layout tag the mutex scripts store in the `~layout` field of the lock hash.
pub(crate) const MUTEX_LAYOUT: &str = "mutex:1";
/// The layout tags the queue scripts store in the `~layout` field of the meta hash.
pub(crate) const FAIR_LAYOUT: &str = "fair:1";
pub(crate) const SEMAPHORE_LAYOUT: &str = "semaphore:1";
pub(crate) const RWLOCK_LAYOUT: &str = "rwlock:1";

macro_rules! script {
    ($name:ident, $file:literal) => {
        pub(crate) static $name: LazyLock<Script> =
            LazyLock::new(|| Script::new(include_str!(concat!("../lua/v1/", $file))));
    };
}

/// A script that recognises foreign data: `lua/v1/keys_lib.lua` followed by its own file.
macro_rules! checking_script {
    ($name:ident, $file:literal) => {
        pub(crate) static $name: LazyLock<Script> = LazyLock::new(|| {
            Script::new(concat!(
                include_str!("../lua/v1/keys_lib.lua"),
                include_str!(concat!("../lua/v1/", $file))
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
                include_str!("../lua/v1/keys_lib.lua"),
                include_str!("../lua/v1/queue_lib.lua"),
                include_str!(concat!("../lua/v1/", $file))
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

/// Reads an integer from a script reply element (Lua numbers arrive as integers, tokens as
/// strings).
pub(crate) fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    }
}

fn text(v: Option<&Value>) -> String {
    match v {
        Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
        Some(Value::SimpleString(s)) => s.clone(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

/// The error for a negative per-item status of a batch script: `-1` foreign data, `-2` foreign
/// layout (where `expected` is the layout the caller reads).
pub(crate) fn foreign(key: &str, status: i64, expected: &'static str) -> Error {
    if status == -1 {
        wrong_type(key, "")
    } else {
        Error::Layout {
            key: key.to_owned(),
            found: "another layout".to_owned(),
            expected,
        }
    }
}

/// Reads a batch script's reply: exactly one integer per item.
pub(crate) fn statuses(script: &'static str, raw: Value, expected: usize) -> Result<Vec<i64>> {
    let bad = |detail: String| Error::Protocol { script, detail };
    let Value::Array(items) = raw else {
        return Err(bad(format!("expected an array, got {raw:?}")));
    };
    if items.len() != expected {
        return Err(bad(format!(
            "expected {expected} results, got {}",
            items.len()
        )));
    }
    items
        .iter()
        .map(|v| int(v).ok_or_else(|| bad(format!("not an integer: {v:?}"))))
        .collect()
}

/// A script reply: a status code followed by its values.
#[derive(Debug)]
pub(crate) struct Reply {
    script: &'static str,
    items: Vec<Value>,
}

impl Reply {
    /// Splits a raw reply and turns the shared negative statuses (foreign type, foreign layout)
    /// into typed errors. `keys` are the script's KEYS, for the error message.
    pub(crate) fn decode(
        script: &'static str,
        raw: Value,
        keys: &[&str],
        layout: &'static str,
    ) -> Result<(i64, Self)> {
        let items = match raw {
            Value::Array(items) => items,
            other => {
                return Err(Error::Protocol {
                    script,
                    detail: format!("expected an array, got {other:?}"),
                });
            }
        };
        let reply = Self { script, items };
        let status = reply.int(0)?;
        match status {
            -1 => {
                let index = reply.int(2).unwrap_or(1);
                let key = usize::try_from(index - 1)
                    .ok()
                    .and_then(|i| keys.get(i))
                    .copied()
                    .unwrap_or_default();
                Err(wrong_type(key, &text(reply.items.get(1))))
            }
            -2 => Err(Error::Layout {
                key: keys.first().copied().unwrap_or_default().to_owned(),
                found: text(reply.items.get(1)),
                expected: layout,
            }),
            _ => Ok((status, reply)),
        }
    }

    /// The integer at `index`, or a protocol error.
    pub(crate) fn int(&self, index: usize) -> Result<i64> {
        self.items
            .get(index)
            .and_then(int)
            .ok_or_else(|| Error::Protocol {
                script: self.script,
                detail: format!("element {index} of {:?} is not an integer", self.items),
            })
    }

    pub(crate) fn unexpected(&self, status: i64) -> Error {
        Error::Protocol {
            script: self.script,
            detail: format!("unknown status {status} in {:?}", self.items),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pins each script's SHA1. A failing pin means a script changed: update the pin, the
    /// contract in `lua/README.md` and the CHANGELOG in the same commit. A change that old
    /// clients cannot read needs `lua/v2/` instead.
    #[test]
    fn script_hashes_are_pinned() {
        let pins = [
            (&*MUTEX_ACQUIRE, "5956a5caf87f7c06245b7174cccfd5e84f7ffec4"),
            (&*MUTEX_RELEASE, "112365a4fce6f963802c944416e2695c16202fac"),
            (&*MUTEX_EXTEND, "ad94e925979a80afea80c0dcb190487a5bf05e4b"),
            (&*QUEUE_ACQUIRE, "4eaf45625667c1d3f28d74ee9a9329ebf2fb3b2f"),
            (&*QUEUE_RELEASE, "88fbf0eff59f8087f67d45236a03c3f15e3b6d18"),
            (&*QUEUE_EXTEND, "c9af6facb4ebf5250bdf7d38faf9fed2b1665459"),
            (&*INSPECT, "c3c6e4fa023569a2e60dbfa4ce29244fa9d2dd90"),
            (&*FORCE_UNLOCK, "616c529b713bec3ed4b915003050d1ec86e19752"),
        ];
        for (script, sha) in pins {
            assert_eq!(script.get_hash(), sha);
        }
    }

    #[test]
    fn headers_name_the_layout_version() {
        let mutex = [
            ("mutex_acquire", include_str!("../lua/v1/mutex_acquire.lua")),
            ("mutex_release", include_str!("../lua/v1/mutex_release.lua")),
            ("mutex_extend", include_str!("../lua/v1/mutex_extend.lua")),
        ];
        let queue = [
            ("keys_lib", include_str!("../lua/v1/keys_lib.lua")),
            ("queue_lib", include_str!("../lua/v1/queue_lib.lua")),
            ("queue_acquire", include_str!("../lua/v1/queue_acquire.lua")),
            ("queue_release", include_str!("../lua/v1/queue_release.lua")),
            ("queue_extend", include_str!("../lua/v1/queue_extend.lua")),
            ("inspect", include_str!("../lua/v1/inspect.lua")),
            ("force_unlock", include_str!("../lua/v1/force_unlock.lua")),
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

    #[test]
    fn decode_maps_foreign_data_to_typed_errors() {
        let raw = Value::Array(vec![
            Value::Int(-1),
            Value::BulkString(b"string".to_vec()),
            Value::Int(2),
        ]);
        let err = Reply::decode("t", raw, &["a", "b"], MUTEX_LAYOUT).unwrap_err();
        assert!(
            matches!(err, Error::WrongType { ref key, ref found } if key == "b" && found == "a string")
        );
        let raw = Value::Array(vec![Value::Int(-2), Value::BulkString(b"rw:9".to_vec())]);
        let err = Reply::decode("t", raw, &["a"], MUTEX_LAYOUT).unwrap_err();
        assert!(matches!(err, Error::Layout { ref found, .. } if found == "rw:9"));
        let err = Reply::decode("t", Value::Nil, &[], MUTEX_LAYOUT).unwrap_err();
        assert!(matches!(err, Error::Protocol { .. }));
    }
}
