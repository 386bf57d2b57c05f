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
/// How long the fencing counter of a name lives after its last fresh acquisition: 7 days.
///
/// ```
/// assert_eq!(redlatch::FENCE_TTL.as_secs(), 7 * 24 * 3600);
/// ```
pub const FENCE_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

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
