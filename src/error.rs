//! The one error type of the crate.

use std::time::Duration;

/// A `Result` whose error defaults to [`Error`].
///
/// ```
/// fn parse(name: &str) -> redlatch::Result<&str> {
///     Ok(name)
/// }
/// assert!(parse("a").is_ok());
/// ```
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in redlatch.
///
/// Busy is not an error: `try_lock` returns `Ok(None)` when another owner holds the lock.
///
/// ```
/// use redlatch::Error;
///
/// fn retry_later(err: &Error) -> bool {
///     matches!(err, Error::Timeout { .. } | Error::Pool(_) | Error::Redis(_))
/// }
/// assert!(retry_later(&Error::Timeout { waited: std::time::Duration::from_secs(1) }));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An argument was refused before anything was sent to Redis.
    #[error("invalid {what}: {reason}")]
    InvalidArgument {
        /// Which argument (`"name"`, `"lease"`, `"key prefix"`, ...).
        what: &'static str,
        /// Why it was refused.
        reason: String,
    },
    /// The wait for the lock ran past its deadline.
    #[error("timed out after {waited:?} waiting to acquire")]
    Timeout {
        /// How long the caller asked to wait.
        waited: Duration,
    },
    /// The caller does not hold the lock (any more): its lease ran out, the key was deleted, or
    /// another owner holds it now. Nothing was changed in Redis.
    #[error("lock `{name}` is not held by this owner (lease lost or already released)")]
    NotHeld {
        /// The lock's name.
        name: String,
    },
    /// Clients disagree on a semaphore's capacity: the name is in use (held or waited on) with
    /// another capacity. Nothing was changed.
    #[error("semaphore `{name}` is in use with capacity {theirs}, this handle says {ours}")]
    CapacityMismatch {
        /// The semaphore's name.
        name: String,
        /// The capacity this handle was made with.
        ours: u32,
        /// The capacity stored in Redis.
        theirs: u32,
    },
    /// A reader asked for the write lock while holding a read lock. Upgrading would deadlock
    /// against another reader doing the same, so it is refused; release the read hold first.
    #[error(
        "read-write lock `{name}`: this owner holds a read lock and cannot upgrade it to write"
    )]
    Upgrade {
        /// The lock's name.
        name: String,
    },
    /// A key that redlatch owns holds data of another Redis type (a string where a hash is
    /// expected, say). Nothing was changed.
    #[error("key `{key}` holds a Redis {found}, not redlatch data")]
    WrongType {
        /// The key.
        key: String,
        /// The Redis type found there.
        found: String,
    },
    /// The key holds redlatch data of a layout this version does not understand (another
    /// primitive on the same name, or a newer layout during a rolling deploy). Nothing was changed.
    #[error("key `{key}` has layout `{found}`, this client reads `{expected}`")]
    Layout {
        /// The key.
        key: String,
        /// The layout tag found (empty when the hash has none).
        found: String,
        /// The layout tag this client writes and reads.
        expected: &'static str,
    },
    /// No connection could be had from the pool.
    #[error("connection pool error")]
    Pool(#[from] deadpool_redis::PoolError),
    /// Redis or the connection to it failed.
    #[error("redis error")]
    Redis(#[from] redis::RedisError),
    /// A script answered with something this version does not expect.
    #[error("unexpected reply from script {script}: {detail}")]
    Protocol {
        /// The script's name.
        script: &'static str,
        /// What was wrong with the reply.
        detail: String,
    },
}

impl Error {
    /// The request may have run in Redis, but its answer never came back.
    pub(crate) fn is_lost_answer(&self) -> bool {
        matches!(self, Self::Redis(e)
            if e.is_timeout() || e.is_connection_dropped() || e.is_io_error())
    }

    pub(crate) fn invalid(what: &'static str, reason: impl Into<String>) -> Self {
        Self::InvalidArgument {
            what,
            reason: reason.into(),
        }
    }

    /// True when the failure came from reaching Redis (pool or connection), so a retry may
    /// succeed.
    ///
    /// ```
    /// let err = redlatch::Error::Timeout { waited: std::time::Duration::ZERO };
    /// assert!(!err.is_connection());
    /// ```
    pub fn is_connection(&self) -> bool {
        match self {
            Self::Pool(_) => true,
            Self::Redis(e) => {
                e.is_io_error()
                    || e.is_connection_dropped()
                    || e.is_connection_refusal()
                    || e.is_timeout()
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_is_lowercase_without_period() {
        let errors = [
            Error::invalid("name", "must not be empty"),
            Error::Timeout {
                waited: Duration::from_millis(5),
            },
            Error::NotHeld { name: "a".into() },
        ];
        for e in errors {
            let s = e.to_string();
            assert!(s.chars().next().is_some_and(|c| c.is_lowercase()), "{s}");
            assert!(!s.ends_with('.'), "{s}");
        }
    }
}
