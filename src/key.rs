//! Key names: validation and the `{hash tag}` layout shared by every primitive.
//!
//! Every key and channel of one lock shares the hash tag `{<name>}`, so each script touches a
//! single slot and runs unchanged on Redis Cluster. The full schema is in `lua/README.md`.

use crate::error::{Error, Result};

/// The longest lock name accepted, in bytes.
///
/// ```
/// assert_eq!(redlatch::MAX_NAME_LEN, 512);
/// ```
pub const MAX_NAME_LEN: usize = 512;
/// The longest key prefix accepted, in bytes.
///
/// ```
/// assert_eq!(redlatch::MAX_PREFIX_LEN, 64);
/// ```
pub const MAX_PREFIX_LEN: usize = 64;

fn check(what: &'static str, value: &str, max: usize) -> Result<()> {
    if value.is_empty() {
        return Err(Error::invalid(what, "must not be empty"));
    }
    if value.len() > max {
        return Err(Error::invalid(
            what,
            format!("is {} bytes long, the limit is {max}", value.len()),
        ));
    }
    if let Some(c) = value
        .chars()
        .find(|c| matches!(c, '{' | '}') || c.is_control())
    {
        return Err(Error::invalid(
            what,
            format!("must not contain {c:?} (braces form the cluster hash tag)"),
        ));
    }
    Ok(())
}

pub(crate) fn check_prefix(prefix: &str) -> Result<()> {
    check("key prefix", prefix, MAX_PREFIX_LEN)
}

/// The keys and channel of one named lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LockKeys {
    /// The lock (the mutex's string) or meta hash (queued primitives): `<prefix>:{<name>}`.
    pub(crate) lock: String,
    /// The fencing counter: `<prefix>:{<name>}:fence`.
    pub(crate) fence: String,
    /// The wake-up channel: `<prefix>:{<name>}:wake`.
    pub(crate) wake: String,
    /// Queued primitives: shared holders' leases `…:holders` and the waiter order `…:queue`.
    pub(crate) holders: String,
    pub(crate) queue: String,
}

impl LockKeys {
    /// Validates `name` and derives its keys under `prefix` (validated by the client builder).
    pub(crate) fn new(prefix: &str, name: &str) -> Result<Self> {
        check("name", name, MAX_NAME_LEN)?;
        let lock = format!("{prefix}:{{{name}}}");
        Ok(Self {
            fence: format!("{lock}:fence"),
            wake: format!("{lock}:wake"),
            holders: format!("{lock}:holders"),
            queue: format!("{lock}:queue"),
            lock,
        })
    }

    /// The `KEYS` of `queue_acquire`, `queue_release` and `inspect`, in order (see
    /// `lua/v1/queue_lib.lua`); `queue_extend` takes the first three of each item.
    pub(crate) fn queued(&self) -> [&str; 4] {
        [&self.lock, &self.holders, &self.queue, &self.fence]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_share_one_hash_tag() {
        let k = LockKeys::new("redlatch", "orders:42").unwrap();
        assert_eq!(k.lock, "redlatch:{orders:42}");
        assert_eq!(k.fence, "redlatch:{orders:42}:fence");
        assert_eq!(k.wake, "redlatch:{orders:42}:wake");
        assert_eq!(k.queue, "redlatch:{orders:42}:queue");
        for key in k.queued() {
            assert!(key.starts_with("redlatch:{orders:42}"));
        }
    }

    #[test]
    fn bad_names_are_refused() {
        for bad in ["", "a{b", "a}b", "tab\there"] {
            assert!(matches!(
                LockKeys::new("p", bad),
                Err(Error::InvalidArgument { what: "name", .. })
            ));
        }
        let long = "x".repeat(MAX_NAME_LEN + 1);
        assert!(LockKeys::new("p", &long).is_err());
        assert!(LockKeys::new("p", &long[1..]).is_ok());
        assert!(check_prefix("").is_err());
        assert!(check_prefix("a{").is_err());
        assert!(check_prefix("ok").is_ok());
        assert!(LockKeys::new("p", "ünïcode ✓").is_ok());
    }
}
