//! Reading script replies: a status code and its values, the shared negative statuses (foreign
//! data, foreign layout) as typed errors, and batch replies of one status per item.

use redis::Value;

use crate::error::{Error, Result, wrong_type};

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

    /// The UTF-8 text at `index`, if it is one.
    pub(crate) fn text(&self, index: usize) -> Option<String> {
        match self.items.get(index)? {
            Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
            Value::SimpleString(s) => Some(s.clone()),
            _ => None,
        }
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
    use crate::protocol::MUTEX_LAYOUT;

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
