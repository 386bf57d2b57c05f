//! Time arithmetic that cannot panic: every instant moved by a configured or caller-given
//! duration goes through [`after`], which saturates far in the future instead of overflowing.

use std::time::Duration;

use tokio::time::Instant;

/// The latest an instant is moved ahead: about 30 years, as tokio's own "far future". A
/// deadline this far off is no deadline at all.
const FAR: Duration = Duration::from_secs(30 * 365 * 24 * 3600);

/// `at + d`, saturating at [`FAR`] ahead of `at`.
pub(crate) fn after(at: Instant, d: Duration) -> Instant {
    at.checked_add(d.min(FAR)).unwrap_or(at)
}

/// Sleeps until `at`, or for ever when there is no `at`.
pub(crate) async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn after_saturates() {
        let now = Instant::now();
        assert_eq!(
            after(now, Duration::from_secs(1)),
            now + Duration::from_secs(1)
        );
        assert_eq!(after(now, Duration::MAX), now + FAR);
        assert!(after(now, Duration::from_secs(u64::MAX)) > now);
    }
}
