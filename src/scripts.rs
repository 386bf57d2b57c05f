//! The Lua scripts under `lua/v1/`, embedded at compile time, and the decoding of their replies.
//!
//! Scripts run by SHA (`EVALSHA`) with the `NOSCRIPT` fallback that [`redis::Script`] provides.
//! The tests at the bottom pin every script's SHA1: changing a script is a deliberate act that
//! updates the pin, `lua/README.md` and the CHANGELOG together.

use std::sync::LazyLock;

use redis::{Script, Value};

use crate::error::{Error, Result};

/// The key-layout version these scripts read and write (the `v1` of `lua/v1/`).
#[cfg(test)]
pub(crate) const LAYOUT_VERSION: u32 = 1;
/// The layout tag the mutex scripts store in the `~layout` field of the lock hash.
pub(crate) const MUTEX_LAYOUT: &str = "mutex:1";

macro_rules! script {
    ($name:ident, $file:literal) => {
        pub(crate) static $name: LazyLock<Script> =
            LazyLock::new(|| Script::new(include_str!(concat!("../lua/v1/", $file))));
    };
}

script!(MUTEX_ACQUIRE, "mutex_acquire.lua");
script!(MUTEX_RELEASE, "mutex_release.lua");
script!(MUTEX_EXTEND, "mutex_extend.lua");

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
                Err(Error::WrongType {
                    key: key.to_owned(),
                    found: text(reply.items.get(1)),
                })
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
            (&*MUTEX_ACQUIRE, "08f29ab2eeec66ee4e8d1ee8742240146e0e0856"),
            (&*MUTEX_RELEASE, "112365a4fce6f963802c944416e2695c16202fac"),
            (&*MUTEX_EXTEND, "ad94e925979a80afea80c0dcb190487a5bf05e4b"),
        ];
        for (script, sha) in pins {
            assert_eq!(script.get_hash(), sha);
        }
    }

    #[test]
    fn headers_name_the_layout_version() {
        let sources = [
            ("mutex_acquire", include_str!("../lua/v1/mutex_acquire.lua")),
            ("mutex_release", include_str!("../lua/v1/mutex_release.lua")),
            ("mutex_extend", include_str!("../lua/v1/mutex_extend.lua")),
        ];
        for (name, src) in sources {
            assert!(src.starts_with(&format!("-- name:    {name}\n")), "{name}");
            let layout = format!("-- layout:  {LAYOUT_VERSION}");
            assert!(src.contains(&layout), "{name} lacks `{layout}`");
            for section in ["-- KEYS[", "-- ARGV[", "-- returns:"] {
                assert!(src.contains(section), "{name} lacks {section}");
            }
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
            matches!(err, Error::WrongType { ref key, ref found } if key == "b" && found == "string")
        );
        let raw = Value::Array(vec![Value::Int(-2), Value::BulkString(b"rw:9".to_vec())]);
        let err = Reply::decode("t", raw, &["a"], MUTEX_LAYOUT).unwrap_err();
        assert!(matches!(err, Error::Layout { ref found, .. } if found == "rw:9"));
        let err = Reply::decode("t", Value::Nil, &[], MUTEX_LAYOUT).unwrap_err();
        assert!(matches!(err, Error::Protocol { .. }));
    }
}
