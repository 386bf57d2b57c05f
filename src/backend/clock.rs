//! The servers' clock as this client estimates it: the highest reading heard (µs, from `TIME`
//! inside a script), moved on by the monotonic clock since. Fencing tokens start from it (the
//! least token an acquisition issues), so a fresh token needs no `TIME` call. A reading older
//! than [`REFRESH`] is not used: the next acquisition has the server read its clock again, so
//! the estimate never drifts far from it.
//!
//! A reading is dated from when its request was sent, so the estimate is never behind the
//! server's clock, and runs ahead of it by at most the round trip that brought the reading.
//! A reading whose answer took longer than [`UNCERTAIN`] (a slow connection, a server that
//! stalled, a first request that had to connect) is not kept: a new fencing counter starts a
//! second ahead of the server's clock, and tokens issued from an estimate must stay below it.

use std::sync::Mutex as StdMutex;
use std::time::Duration;

use tokio::time::Instant;

/// How long a reading is used before the server is asked again.
pub(crate) const REFRESH: Duration = Duration::from_secs(60);

/// The longest round trip whose reading is kept: the most the estimate runs ahead of the
/// server's clock, well below the second by which a new fencing counter starts ahead of it.
pub(crate) const UNCERTAIN: Duration = Duration::from_millis(250);

/// The servers' clock as this client estimates it.
#[derive(Debug, Default)]
pub(crate) struct ServerClock {
    /// The reading (µs), when it was taken, and when it was kept.
    heard: StdMutex<Option<(u64, Instant, Instant)>>,
}

impl ServerClock {
    /// The servers' clock in µs now, from a reading heard within [`REFRESH`]; `None` without
    /// one.
    pub(crate) fn now(&self) -> Option<u64> {
        let heard = *self.heard.lock().unwrap_or_else(|p| p.into_inner());
        heard
            .filter(|(_, _, read)| read.elapsed() < REFRESH)
            .map(|(us, at, _)| us.saturating_add(micros(at.elapsed())))
    }

    /// A server said its clock read `us` in answer to a request sent at `at`. The highest
    /// reading counts (several servers: the one furthest ahead), unless the one kept is older
    /// than [`REFRESH`]; a reading whose answer took longer than [`UNCERTAIN`] is dropped.
    pub(crate) fn heard(&self, us: u64, at: Instant) {
        if at.elapsed() > UNCERTAIN {
            return;
        }
        let mut heard = self.heard.lock().unwrap_or_else(|p| p.into_inner());
        let replace = match *heard {
            None => true,
            Some((them, then, read)) => {
                read.elapsed() >= REFRESH
                    || them.saturating_add(micros(at.saturating_duration_since(then))) < us
            }
        };
        // A lower reading does not keep the one kept fresh: that one still ages out, so an
        // estimate that runs ahead is replaced within REFRESH.
        if replace {
            *heard = Some((us, at, Instant::now()));
        }
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_estimate_moves_on_and_is_dropped_when_old() {
        let clock = ServerClock::default();
        assert_eq!(clock.now(), None);
        clock.heard(1_000_000, Instant::now());
        tokio::time::advance(Duration::from_millis(5)).await;
        assert_eq!(clock.now(), Some(1_005_000));
        // A lower reading (another server behind) does not pull it back.
        clock.heard(1_000_000, Instant::now());
        assert_eq!(clock.now(), Some(1_005_000));
        // Lower readings do not keep it fresh.
        tokio::time::advance(REFRESH / 2).await;
        clock.heard(1_000_000, Instant::now());
        tokio::time::advance(REFRESH / 2).await;
        assert_eq!(clock.now(), None, "too old to be used");
        clock.heard(2_000_000, Instant::now());
        assert_eq!(clock.now(), Some(2_000_000));
    }

    #[tokio::test(start_paused = true)]
    async fn a_reading_whose_answer_was_slow_is_dropped() {
        let clock = ServerClock::default();
        let sent = Instant::now();
        tokio::time::advance(UNCERTAIN + Duration::from_millis(1)).await;
        clock.heard(1_000_000, sent);
        assert_eq!(clock.now(), None);
        // In time, it counts from when it was sent: never behind the server's clock.
        let sent = Instant::now();
        tokio::time::advance(UNCERTAIN).await;
        clock.heard(1_000_000, sent);
        assert_eq!(clock.now(), Some(1_000_000 + micros(UNCERTAIN)));
    }
}
