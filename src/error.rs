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
/// let busy = Error::Timeout { waited: std::time::Duration::from_secs(1), lease_left: None };
/// assert!(retry_later(&busy));
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
    /// The wait for the lock ran past its deadline. A zero timeout tries once (without
    /// queueing) and ends here when the lock is busy.
    #[error("timed out after {waited:?} waiting to acquire")]
    Timeout {
        /// How long the caller asked to wait.
        waited: Duration,
        /// How long the holder's lease had left when the wait gave up, as last heard from
        /// Redis (for a queued primitive: until the earliest lease of the name could end);
        /// `None` when unknown. When it is worth trying again: a `Retry-After`.
        lease_left: Option<Duration>,
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
    /// A key of the name holds data redlatch did not write: another Redis type (a string where
    /// a hash belongs, say), a string that is not a fencing counter, or a sorted set without
    /// redlatch's marker. It was left exactly as it was; rename the data or use another key
    /// prefix ([`LockClientBuilder::key_prefix`](crate::LockClientBuilder::key_prefix)).
    #[error("key `{key}` holds {found}, not redlatch data; it was left unchanged")]
    WrongType {
        /// The key.
        key: String,
        /// What was found there, in words: `"a list"`, `"a string that is not a number"`,
        /// `"a sorted set without redlatch's `~` member"`...
        found: String,
    },
    /// The key holds a hash that is not of a layout this client reads: a hash without
    /// redlatch's `~layout` field (not redlatch data), the name in use as another primitive, or
    /// a newer layout during a rolling deploy. Nothing was changed.
    #[error("{}", layout_message(key, found, expected))]
    Layout {
        /// The key.
        key: String,
        /// The layout tag found (empty when the hash has none: not redlatch data).
        found: String,
        /// The layout tag this client writes and reads.
        expected: &'static str,
    },
    /// The client cannot serve this: a fair mutex, semaphore or read-write lock on a Redlock
    /// client ([`LockClient::redlock`](crate::LockClient::redlock)), where a majority vote
    /// cannot keep their promises (a semaphore whose permits are counted per node admits more
    /// than its permits in all; per-node FIFO queues disagree on who is next), or a setting
    /// that only a Redlock client takes. Nothing was sent to Redis.
    #[error("{what} is not supported: {reason}")]
    Unsupported {
        /// What was asked for.
        what: &'static str,
        /// Why it cannot be served.
        reason: &'static str,
    },
    /// Fewer replicas acknowledged a write within the durability timeout than the durability
    /// setting asks for ([`Durability`](crate::Durability)). After an acquisition, what was
    /// taken was released again; after an extension (`extend`), the hold keeps its old
    /// deadline. A failover now could forget the write. With
    /// [`Durability::Fsynced`](crate::Durability::Fsynced) and `local`, the master's own fsync
    /// counts as one acknowledgement.
    #[error("only {acked} of {wanted} replicas acknowledged the write in time")]
    NotReplicated {
        /// Replicas that acknowledged.
        acked: u32,
        /// Replicas the setting wanted.
        wanted: u32,
    },
    /// An election's observer could not subscribe to the election's channel, or lost the
    /// subscription: changes from then on could be missed. Observe again to go on.
    #[error("the subscription to election `{name}`'s changes could not be kept")]
    Unsubscribed {
        /// The election's name.
        name: String,
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

fn layout_message(key: &str, found: &str, expected: &str) -> String {
    if found.is_empty() {
        format!(
            "key `{key}` holds a hash without redlatch's `~layout` field, not redlatch data; it was left unchanged"
        )
    } else {
        format!(
            "key `{key}` has layout `{found}` (the name is in use as another primitive, or by a newer version), this client reads `{expected}`"
        )
    }
}

/// What a script found under `key` when it expected redlatch's data, in a reader's words: the
/// Redis type (`redis_type`, as `TYPE` names it), or for a key of the right type, why it is
/// not ours. The key's role comes from its suffix (names cannot contain braces, so
/// `}:fence` and the like are unambiguous).
pub(crate) fn wrong_type(key: &str, redis_type: &str) -> Error {
    let found = match redis_type {
        "string" if key.ends_with("}:fence") => "a string that is not a number".to_owned(),
        "zset"
            if key.ends_with("}:holders")
                || key.ends_with("}:queue")
                || key.ends_with("}:fence") =>
        {
            "a sorted set without redlatch's `~` member".to_owned()
        }
        "string" => "a string".to_owned(),
        "list" => "a list".to_owned(),
        "set" => "a set".to_owned(),
        "zset" => "a sorted set".to_owned(),
        "hash" => "a hash".to_owned(),
        "stream" => "a stream".to_owned(),
        "" => "a value of another type".to_owned(),
        other => format!("a value of type `{other}`"),
    };
    Error::WrongType {
        key: key.to_owned(),
        found,
    }
}

impl Error {
    /// The request may have run in Redis, but its answer never came back.
    pub(crate) fn is_lost_answer(&self) -> bool {
        matches!(self, Self::Redis(e)
            if e.is_timeout() || e.is_connection_dropped() || e.is_io_error())
    }

    /// The server is there but did not answer in time (paused, busy): waiting may help, where
    /// a refused connection (a wrong address) would not.
    pub(crate) fn is_slow(&self) -> bool {
        matches!(self, Self::Redis(e) if e.is_timeout() || is_passing(e))
    }

    pub(crate) fn invalid(what: &'static str, reason: impl Into<String>) -> Self {
        Self::InvalidArgument {
            what,
            reason: reason.into(),
        }
    }

    /// True when the failure came from reaching Redis (pool or connection) or from a server
    /// that cannot serve for a while (loading its data, a cluster failing over or moving a
    /// slot; sentinels that name no live master, as during a failover), so a retry may
    /// succeed.
    ///
    /// ```
    /// let err = redlatch::Error::Timeout { waited: std::time::Duration::ZERO, lease_left: None };
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
                    || is_passing(e)
                    || e.kind() == redis::ErrorKind::MasterNameNotFoundBySentinel
            }
            _ => false,
        }
    }
}

/// A server that cannot serve the request for a while and says so: loading its data, a cluster
/// failing over (`CLUSTERDOWN`, `MASTERDOWN`, `READONLY` from a demoted master, no connection to
/// the node that serves the slot yet) or moving a slot (`TRYAGAIN`, or a redirect the client ran
/// out of retries to follow).
fn is_passing(e: &redis::RedisError) -> bool {
    use redis::{ErrorKind, ServerErrorKind as K};
    e.kind() == ErrorKind::ClusterConnectionNotFound
        || matches!(
            e.kind(),
            ErrorKind::Server(
                K::BusyLoading
                    | K::TryAgain
                    | K::ClusterDown
                    | K::MasterDown
                    | K::ReadOnly
                    | K::Moved
                    | K::Ask
            )
        )
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
                lease_left: None,
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
