//! Client settings, their defaults and validation, and the fallback backoff.

use std::time::Duration;

use crate::error::{Error, Result};

/// The default lease: 30 s, renewed by the watchdog every 10 s.
///
/// ```
/// assert_eq!(redlatch::DEFAULT_LEASE, std::time::Duration::from_secs(30));
/// ```
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// The shortest lease accepted.
///
/// ```
/// assert_eq!(redlatch::MIN_LEASE, std::time::Duration::from_millis(10));
/// ```
pub const MIN_LEASE: Duration = Duration::from_millis(10);
/// The longest lease accepted: a year.
///
/// ```
/// assert!(redlatch::MAX_LEASE >= std::time::Duration::from_secs(365 * 24 * 3600));
/// ```
pub const MAX_LEASE: Duration = Duration::from_secs(365 * 24 * 3600);
/// How long the fencing counter of a name lives: 7 days after it was made, or after the last
/// token an acquisition script issued or confirmed from it (a Redlock client's acquisitions
/// always run the script; on one server, the one-round-trip acquire of a name seen free raises
/// it and keeps its TTL). A counter made again after it expired starts a second ahead of the
/// server's clock, above the tokens issued from the one before while that clock does not go
/// back.
///
/// ```
/// assert_eq!(redlatch::FENCE_TTL.as_secs(), 7 * 24 * 3600);
/// ```
pub const FENCE_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

/// How much of a lease a client does not count on: `rate` of it (clocks that tick at slightly
/// different speeds) plus `fixed` (Redis counts leases in whole milliseconds of its own clock).
/// A hold is taken to be valid for the lease, counted from just before its request was sent,
/// less this allowance. Default: 1 % + 2 ms, Redlock's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Drift {
    pub(crate) rate: f64,
    pub(crate) fixed: Duration,
}

impl Default for Drift {
    fn default() -> Self {
        Self {
            rate: 0.01,
            fixed: Duration::from_millis(2),
        }
    }
}

impl Drift {
    /// How long a lease granted by a request is known to run, counted from when the request
    /// was sent.
    pub(crate) fn validity(self, lease: Duration) -> Duration {
        lease.saturating_sub(self.allowance(lease))
    }

    /// The part of `lease` not counted on.
    pub(crate) fn allowance(self, lease: Duration) -> Duration {
        // Rounded up, in nanoseconds: the allowance is never smaller than asked.
        #[allow(clippy::cast_precision_loss)]
        let nanos = (lease.as_nanos() as f64 * self.rate).ceil();
        let rated = Duration::try_from_secs_f64(nanos / 1e9).unwrap_or(Duration::MAX);
        rated.saturating_add(self.fixed)
    }
}

/// How a Redlock client makes its fencing tokens (see the README's Redlock section).
///
/// ```
/// assert_eq!(redlatch::Fencing::default(), redlatch::Fencing::Quorum);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Fencing {
    /// Two rounds (the default): every granting node issues a token above its counter, the
    /// acquisition's token is the highest, and a second round raises the counters of the
    /// granting nodes that issued less to it, where the lock is still held; the acquisition
    /// succeeds only when a majority is at the token. Tokens rise with every acquisition
    /// without relying on any clock: two majorities share a node, which orders them. The
    /// client proposes one value to every node (the highest server clock it heard, in µs,
    /// carried on by its monotonic clock), so that usually a majority issues the same token
    /// and the second round is not needed.
    #[default]
    Quorum,
    /// One round: the token is the highest counter of the granting nodes, each at least its
    /// clock in microseconds. Tokens rise across acquisitions only as long as the nodes' clocks
    /// differ by less than the time between one holder's lease ending and the next
    /// acquisition; a node clock stepped back can break that.
    Clock,
}

/// Whether an acquisition waits for replicas to have its write before it counts (`WAIT`), and
/// for how many. A grant that fewer replicas acknowledged within the timeout is released again
/// and the acquisition fails with [`Error::NotReplicated`](crate::Error::NotReplicated).
/// Durable writes go over a connection of their own (one per setting used, up to eight), one
/// `WAIT` covering every durable write of that setting sent meanwhile, so the wait never holds
/// up other lock operations. One server (a master with
/// replicas) only: a cluster or Redlock client refuses it with
/// [`Error::Unsupported`](crate::Error::Unsupported).
///
/// It narrows the window in which a failover forgets a granted lock; it does not close it (a
/// replica that acknowledged need not be the one promoted, and Redis calls `WAIT` best effort).
/// Fencing tokens are what protect a store. See the README's "Replicas and failover".
///
/// ```
/// use std::time::Duration;
/// use redlatch::Durability;
///
/// assert_eq!(Durability::default(), Durability::None);
/// let all = Durability::AllReplicas { timeout: Duration::from_millis(500) };
/// let one = Durability::Replicas { count: 1, timeout: Duration::from_millis(500) };
/// assert_ne!(all, one);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Durability {
    /// No `WAIT` is ever sent (the default).
    #[default]
    None,
    /// Acknowledged by every replica connected to the master when the write ran (none
    /// connected: nothing to wait for), within `timeout`. How many are connected is read with
    /// `ROLE` (ACL category `@dangerous`): a user that may not run it gets
    /// [`Error::NotReplicated`](crate::Error::NotReplicated) with `acked: 0` for every write,
    /// whose hold is given back; give such a user [`Replicas`](Self::Replicas) instead.
    AllReplicas {
        /// How long to wait at most.
        timeout: Duration,
    },
    /// Acknowledged by at least `count` replicas within `timeout`.
    Replicas {
        /// How many replicas at least.
        count: u32,
        /// How long to wait at most.
        timeout: Duration,
    },
    /// Written to the append-only file and fsynced (`WAITAOF`, Redis 7.2 and later): by the
    /// master itself when `local` is set, and by at least `replicas` replicas, within
    /// `timeout`. Counted as acknowledgements, the master's included when `local` is set. The
    /// server is asked once (per connection, with a `WAITAOF` that waits for nothing) whether
    /// it has `WAITAOF`; one that does not (7.0, 7.1), or does not let the user run it, fails
    /// every such acquisition with [`Error::Unsupported`] before anything is taken.
    Fsynced {
        /// The master's own fsync too (it needs `appendonly yes`).
        local: bool,
        /// How many replicas at least.
        replicas: u32,
        /// How long to wait at most.
        timeout: Duration,
    },
}

impl Durability {
    /// How long a durable write waits at most: `None` for [`Durability::None`].
    pub(crate) fn timeout(self) -> Option<Duration> {
        match self {
            Self::None => None,
            Self::AllReplicas { timeout }
            | Self::Replicas { timeout, .. }
            | Self::Fsynced { timeout, .. } => Some(timeout),
        }
    }

    pub(crate) fn validate(self) -> Result<()> {
        match self.timeout() {
            // `WAIT` and `WAITAOF` count whole milliseconds, and a timeout of 0 waits for ever.
            Some(timeout) if timeout < Duration::from_millis(1) || timeout > MAX_LEASE => {
                Err(Error::invalid(
                    "durability",
                    format!("need 1 ms <= timeout <= {MAX_LEASE:?}, got {timeout:?}"),
                ))
            }
            _ => Ok(()),
        }
    }
}

/// Local hand-off (lock cohorting) for the plain [`Mutex`](crate::Mutex): when a hold is let
/// go while other tasks of the same client wait for the same name, the next of them gets the
/// hold without a round trip to Redis, up to a bound; then the lock goes back to Redis, so that
/// waiters in other processes get their turn.
///
/// * **Bound**: a hold taken in Redis passes to at most `passes` local waiters in turn, and
///   only within `within` of its acquisition; then the last local holder releases it in Redis.
///   A waiter in another process that found the lock busy waits at most for that (plus the
///   last critical section and about a round trip); the next local waiter then holds back for
///   `head_start`, so that the other process, woken by the release's message, gets the lock
///   first. Default: 64 passes, 5 ms, 2 ms head start.
/// * **Fencing**: the acquisition in Redis takes up to `passes + 1` fencing tokens at once, and
///   each local holder gets the next: tokens rise with every acquisition, local or not. A
///   block ends at most one second (1,000,000 tokens) past the server's clock as the client
///   estimates it, where a new counter starts: however many passes a hold reserves, and
///   however often, the name's counter never runs further ahead of the clock than that (a
///   counter that ran that far takes no block, and its holds pass no further until the clock
///   catches up).
/// * **Lease, watchdog and `lost()`**: the hold in Redis is the same one, renewed by the
///   watchdog as long as some local guard holds it; every local guard sees its lease and its
///   loss.
/// * **What is passed**: holds of [`Mutex::lock`](crate::Mutex::lock) and
///   [`lock_timeout`](crate::Mutex::lock_timeout) (a new owner each, with the watchdog's lease
///   and no [`Durability`]). A hold is not passed once its owner token was read
///   ([`MutexGuard::owner`](crate::MutexGuard::owner)) or re-entered, since the token may be in
///   use elsewhere; it is released in Redis as before. A passed hold keeps its owner token in
///   Redis, so [`inspect`](crate::LockClient::inspect) names the token the current local
///   holder's `owner()` returns, and shows the fencing token of the acquisition in Redis.
/// * Waiting tasks of one client queue in the client (oldest first) behind one task that waits
///   in Redis for them all.
///
/// On by default; [`LocalHandoff::off`] turns it off (every acquisition then goes to Redis).
///
/// ```
/// use std::time::Duration;
/// use redlatch::LocalHandoff;
///
/// let default = LocalHandoff::default();
/// assert_eq!(default.passes(), 64);
/// let shorter = LocalHandoff::new(16, Duration::from_millis(1));
/// assert_eq!(shorter.within(), Duration::from_millis(1));
/// assert_eq!(LocalHandoff::off().passes(), 0);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalHandoff {
    passes: u32,
    within: Duration,
    head_start: Duration,
}

impl Default for LocalHandoff {
    fn default() -> Self {
        Self {
            passes: 64,
            within: Duration::from_millis(5),
            head_start: Duration::from_millis(2),
        }
    }
}

impl LocalHandoff {
    /// The most passes a hold taken in Redis makes (at most [`LocalHandoff::MAX_PASSES`]), and
    /// how long after its acquisition it may still be passed. The head start is the default's.
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let settings = redlatch::LocalHandoff::new(16, Duration::from_millis(1));
    /// assert_eq!(settings.passes(), 16);
    /// ```
    pub fn new(passes: u32, within: Duration) -> Self {
        Self {
            passes,
            within,
            ..Self::default()
        }
    }

    /// No local hand-off: every acquisition goes to Redis.
    ///
    /// ```
    /// assert_eq!(redlatch::LocalHandoff::off().passes(), 0);
    /// ```
    pub fn off() -> Self {
        Self {
            passes: 0,
            within: Duration::ZERO,
            head_start: Duration::ZERO,
        }
    }

    /// These settings with `head_start`: how long the next local waiter holds back after a
    /// hold went back to Redis and woke waiters elsewhere (at most 1 s).
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let settings = redlatch::LocalHandoff::default().with_head_start(Duration::from_millis(5));
    /// assert_eq!(settings.head_start(), Duration::from_millis(5));
    /// ```
    #[must_use]
    pub fn with_head_start(mut self, head_start: Duration) -> Self {
        self.head_start = head_start;
        self
    }

    /// The most passes a hold taken in Redis makes.
    ///
    /// ```
    /// assert_eq!(redlatch::LocalHandoff::default().passes(), 64);
    /// ```
    pub fn passes(&self) -> u32 {
        self.passes
    }

    /// How long after its acquisition in Redis a hold may still be passed.
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// assert_eq!(redlatch::LocalHandoff::default().within(), Duration::from_millis(5));
    /// ```
    pub fn within(&self) -> Duration {
        self.within
    }

    /// How long the next local waiter holds back after a hold went back to Redis and woke
    /// waiters elsewhere.
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// assert_eq!(redlatch::LocalHandoff::default().head_start(), Duration::from_millis(2));
    /// ```
    pub fn head_start(&self) -> Duration {
        self.head_start
    }

    /// The most passes accepted.
    pub const MAX_PASSES: u32 = 1_000_000;

    /// Whether holds are passed at all.
    pub(crate) fn is_on(&self) -> bool {
        self.passes > 0 && !self.within.is_zero()
    }

    fn validate(&self) -> Result<()> {
        if self.passes > Self::MAX_PASSES
            || self.within > MAX_LEASE
            || self.head_start > Duration::from_secs(1)
        {
            return Err(Error::invalid(
                "local hand-off",
                format!(
                    "need passes <= {}, within <= {MAX_LEASE:?} and a head start of at most 1s, \
                     got {self:?}",
                    Self::MAX_PASSES
                ),
            ));
        }
        Ok(())
    }
}

/// A Redlock client's settings.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) struct Redlock {
    /// How long one node may take to answer one call (`None`: 5 % of the lease, between
    /// 2 ms and 1 s).
    pub(crate) node_timeout: Option<Duration>,
    pub(crate) fencing: Fencing,
}

impl Redlock {
    /// The per-node timeout for holds of `lease`.
    pub(crate) fn node_timeout(&self, lease: Duration) -> Duration {
        self.node_timeout
            .unwrap_or_else(|| (lease / 20).clamp(Duration::from_millis(2), Duration::from_secs(1)))
    }
}

/// Settings shared by every handle of one client.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) prefix: String,
    pub(crate) lease: Duration,
    pub(crate) watchdog: bool,
    pub(crate) backoff_min: Duration,
    pub(crate) backoff_max: Duration,
    /// The first term of a hold handed to a queued waiter of this client (`None`: the default
    /// lease).
    pub(crate) waiter_timeout: Option<Duration>,
    pub(crate) drift: Drift,
    /// Whether acquisitions wait for replicas (overridable per handle).
    pub(crate) durability: Durability,
    /// A Redlock client's settings (`None`: any other client).
    pub(crate) redlock: Option<Redlock>,
    /// Local hand-off of the plain mutex's holds.
    pub(crate) handoff: LocalHandoff,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            prefix: "redlatch".to_owned(),
            lease: DEFAULT_LEASE,
            watchdog: true,
            backoff_min: Duration::from_millis(10),
            backoff_max: Duration::from_secs(1),
            waiter_timeout: None,
            drift: Drift::default(),
            durability: Durability::None,
            redlock: None,
            handoff: LocalHandoff::default(),
        }
    }
}

/// A duration in whole milliseconds, as the scripts take it.
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Checks a lease and returns it in whole milliseconds.
pub(crate) fn lease_ms(lease: Duration) -> Result<u64> {
    if lease < MIN_LEASE || lease > MAX_LEASE {
        return Err(Error::invalid(
            "lease",
            format!("{lease:?} is outside {MIN_LEASE:?}..={MAX_LEASE:?}"),
        ));
    }
    Ok(millis(lease))
}

impl Config {
    /// The first term of a hold handed to a queued waiter of this client: how long a dead waiter
    /// at the head of a queue holds it up.
    pub(crate) fn waiter_timeout(&self) -> Duration {
        self.waiter_timeout.unwrap_or(self.lease)
    }

    pub(crate) fn validate(&self) -> Result<()> {
        crate::key::check_prefix(&self.prefix)?;
        lease_ms(self.lease)?;
        if let Some(t) = self.waiter_timeout {
            lease_ms(t).map_err(|_| {
                Error::invalid(
                    "waiter timeout",
                    format!("{t:?} is outside {MIN_LEASE:?}..={MAX_LEASE:?}"),
                )
            })?;
        }
        if self.backoff_min.is_zero()
            || self.backoff_min > self.backoff_max
            || self.backoff_max > MAX_LEASE
        {
            return Err(Error::invalid(
                "backoff",
                format!(
                    "need 0 < min <= max <= {MAX_LEASE:?}, got {:?}..{:?}",
                    self.backoff_min, self.backoff_max
                ),
            ));
        }
        if !(self.drift.rate.is_finite() && (0.0..0.5).contains(&self.drift.rate))
            || self.drift.fixed > MAX_LEASE
        {
            return Err(Error::invalid(
                "drift",
                format!(
                    "need a rate in 0..0.5 and a fixed part of at most {MAX_LEASE:?}, got {} and {:?}",
                    self.drift.rate, self.drift.fixed
                ),
            ));
        }
        if self.drift.validity(self.lease).is_zero() {
            return Err(Error::invalid(
                "drift",
                format!("it leaves nothing of the {:?} lease", self.lease),
            ));
        }
        self.durability.validate()?;
        self.handoff.validate()?;
        if let Some(t) = self.redlock.and_then(|q| q.node_timeout)
            && (t.is_zero() || t > MAX_LEASE)
        {
            return Err(Error::invalid(
                "node timeout",
                format!("need 0 < timeout <= {MAX_LEASE:?}, got {t:?}"),
            ));
        }
        Ok(())
    }
}

/// Jittered exponential backoff between `min` and `max`: each step doubles the ceiling, and a
/// step waits a random time between half the ceiling and the ceiling.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    ceiling: Duration,
    max: Duration,
}

impl Backoff {
    pub(crate) fn new(config: &Config) -> Self {
        Self {
            ceiling: config.backoff_min,
            max: config.backoff_max,
        }
    }

    pub(crate) fn next_delay(&mut self) -> Duration {
        let ceiling = self.ceiling;
        self.ceiling = self.ceiling.saturating_mul(2).min(self.max);
        ceiling.mul_f64(0.5 + fastrand::f64() / 2.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_stays_in_bounds() {
        let config = Config::default();
        let mut b = Backoff::new(&config);
        let mut last_ceiling = Duration::ZERO;
        for _ in 0..20 {
            let d = b.next_delay();
            assert!(
                d >= config.backoff_min / 2 && d <= config.backoff_max,
                "{d:?}"
            );
            assert!(b.ceiling >= last_ceiling);
            last_ceiling = b.ceiling;
        }
        assert_eq!(b.ceiling, config.backoff_max);
    }

    #[test]
    fn the_drift_allowance_is_never_below_its_rate() {
        let drift = Drift::default();
        for ms in [10, 333, 1_000, 5_000, 30_000, 86_400_000] {
            let lease = Duration::from_millis(ms);
            let allowance = drift.allowance(lease);
            assert!(
                allowance >= lease / 100 + Duration::from_millis(2),
                "{lease:?}"
            );
            assert!(allowance <= lease / 100 + Duration::from_millis(2) + Duration::from_micros(1));
            assert_eq!(drift.validity(lease), lease - allowance);
        }
    }

    #[test]
    fn leases_are_bounded() {
        assert!(lease_ms(Duration::ZERO).is_err());
        assert!(lease_ms(Duration::from_millis(9)).is_err());
        assert_eq!(lease_ms(Duration::from_millis(10)).unwrap(), 10);
        assert!(lease_ms(MAX_LEASE + Duration::from_secs(1)).is_err());
        let mut c = Config::default();
        assert!(c.validate().is_ok());
        c.backoff_min = Duration::ZERO;
        assert!(c.validate().is_err());
        c.backoff_min = MAX_LEASE;
        c.backoff_max = MAX_LEASE;
        assert!(c.validate().is_ok());
        c.backoff_max = MAX_LEASE + Duration::from_nanos(1);
        assert!(c.validate().is_err());
    }
}
