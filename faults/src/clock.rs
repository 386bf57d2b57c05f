//! `CLOCK_MONOTONIC` in nanoseconds: the one clock every process on a host reads alike, so the
//! intervals that workers log can be compared with each other and with the faults' times.

use std::time::Instant;

use nix::time::{ClockId, clock_gettime};

/// Now, in ns of `CLOCK_MONOTONIC`.
pub fn now_ns() -> u64 {
    clock_gettime(ClockId::CLOCK_MONOTONIC)
        .map(|t| {
            u64::try_from(t.tv_sec()).unwrap_or(0) * 1_000_000_000
                + u64::try_from(t.tv_nsec()).unwrap_or(0)
        })
        .unwrap_or(0)
}

/// Turns `Instant`s of this process into ns of `CLOCK_MONOTONIC`.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    base: Instant,
    base_ns: u64,
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock {
    /// A clock anchored now.
    pub fn new() -> Self {
        Self {
            base: Instant::now(),
            base_ns: now_ns(),
        }
    }

    /// `at` in ns of `CLOCK_MONOTONIC`.
    pub fn ns(&self, at: Instant) -> u64 {
        if at >= self.base {
            let after = u64::try_from((at - self.base).as_nanos()).unwrap_or(u64::MAX);
            self.base_ns.saturating_add(after)
        } else {
            let before = u64::try_from((self.base - at).as_nanos()).unwrap_or(u64::MAX);
            self.base_ns.saturating_sub(before)
        }
    }
}
