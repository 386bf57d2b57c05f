//! Metrics through the [`metrics`](https://docs.rs/metrics) crate's facade (feature `metrics`):
//! the application installs whichever recorder (exporter) it wants, and without one every call
//! here costs one check (each metric's key is a static: see `by_kind`). Without the feature,
//! every function is empty.
//!
//! Labelled by primitive kind only (`kind`: `mutex`, `fair_mutex`, `semaphore`, `rwlock`,
//! `election`), never by name, so the number of series stays bounded however many names a
//! service uses. The names (see the crate docs' "Metrics" section):
//!
//! * `redlatch_acquisitions_total` (counter), `redlatch_wait_seconds` (histogram: from the call
//!   to the hold, timed-out waits excluded), `redlatch_timeouts_total` (counter);
//! * `redlatch_hold_seconds` (histogram: from the acquisition to the guard letting go);
//! * `redlatch_leases_lost_total` (counter: holds found lost while their guard held them);
//! * `redlatch_renewals_total` (counter: holds the watchdog renewed, or tried to) and
//!   `redlatch_renewal_seconds` (histogram: one renewal call, which renews a batch; no `kind`);
//! * `redlatch_handovers_total` (counter, label `via`: `redis`, a queued primitive's release
//!   handing its hold to a waiter here; `local`, a plain mutex's hold passed between this
//!   client's tasks);
//! * `redlatch_errors_total` (counter, label `error`: `connection`, `timeout`, `pool`, `redis`,
//!   `foreign_data`, `not_replicated`, `protocol`, `refused`): acquisitions that failed;
//! * `redlatch_waiters` (gauge): waits of this client going on now (the name found busy, or a
//!   plain mutex's task queued behind another task of this client that takes it).

use std::time::Duration;

use crate::error::Error;

/// `metrics::$metric!($name, "kind" => kind, ...)` with `kind` written as a literal for every
/// primitive kind, so that the metric's key is a static, built and hashed once, instead of a
/// key whose labels are allocated and hashed on every call (which costs that even with no
/// recorder installed). Further labels must be literals too.
#[cfg(feature = "metrics")]
macro_rules! by_kind {
    ($metric:ident, $name:literal, $kind:expr $(, $key:literal => $value:literal)*) => {
        match $kind {
            "mutex" => ::metrics::$metric!($name, "kind" => "mutex" $(, $key => $value)*),
            "fair_mutex" => ::metrics::$metric!($name, "kind" => "fair_mutex" $(, $key => $value)*),
            "semaphore" => ::metrics::$metric!($name, "kind" => "semaphore" $(, $key => $value)*),
            "rwlock" => ::metrics::$metric!($name, "kind" => "rwlock" $(, $key => $value)*),
            "election" => ::metrics::$metric!($name, "kind" => "election" $(, $key => $value)*),
            other => ::metrics::$metric!($name, "kind" => other $(, $key => $value)*),
        }
    };
}

/// The `error` label of an error.
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
fn error_kind(err: &Error) -> &'static str {
    match err {
        Error::Pool(_) => "pool",
        Error::Redis(e) if e.is_timeout() => "timeout",
        _ if err.is_connection() => "connection",
        Error::Redis(_) => "redis",
        Error::WrongType { .. } | Error::Layout { .. } => "foreign_data",
        Error::NotReplicated { .. } => "not_replicated",
        Error::Protocol { .. } => "protocol",
        _ => "refused",
    }
}

/// An acquisition ended after `waited`: a hold, a timeout, or an error.
pub(crate) fn acquire_ended(kind: &'static str, waited: Duration, outcome: Result<(), &Error>) {
    #[cfg(feature = "metrics")]
    match outcome {
        Ok(()) => {
            by_kind!(counter, "redlatch_acquisitions_total", kind).increment(1);
            by_kind!(histogram, "redlatch_wait_seconds", kind).record(waited.as_secs_f64());
        }
        Err(Error::Timeout { .. }) => {
            by_kind!(counter, "redlatch_timeouts_total", kind).increment(1);
        }
        Err(err) => {
            ::metrics::counter!(
                "redlatch_errors_total", "kind" => kind, "error" => error_kind(err)
            )
            .increment(1);
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (kind, waited, outcome);
}

/// A guard let its hold go after holding it for `held`.
pub(crate) fn let_go(kind: &'static str, held: Duration) {
    #[cfg(feature = "metrics")]
    by_kind!(histogram, "redlatch_hold_seconds", kind).record(held.as_secs_f64());
    #[cfg(not(feature = "metrics"))]
    let _ = (kind, held);
}

/// A hold was found lost while its guard held it.
pub(crate) fn lost(kind: &'static str) {
    #[cfg(feature = "metrics")]
    by_kind!(counter, "redlatch_leases_lost_total", kind).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = kind;
}

/// One renewal call of the watchdog, for holds of these kinds, took `took`.
pub(crate) fn renewed(kinds: impl Iterator<Item = &'static str>, took: Duration) {
    #[cfg(feature = "metrics")]
    {
        for kind in kinds {
            by_kind!(counter, "redlatch_renewals_total", kind).increment(1);
        }
        ::metrics::histogram!("redlatch_renewal_seconds").record(took.as_secs_f64());
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (kinds, took);
}

/// A hold was handed over: by a release in Redis (`local` false) or between this client's
/// tasks.
pub(crate) fn handed_over(kind: &'static str, local: bool) {
    #[cfg(feature = "metrics")]
    if local {
        by_kind!(counter, "redlatch_handovers_total", kind, "via" => "local").increment(1);
    } else {
        by_kind!(counter, "redlatch_handovers_total", kind, "via" => "redis").increment(1);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (kind, local);
}

/// A wait of this client (the name found busy, or queued behind a task of this client that takes
/// it), counted in `redlatch_waiters` while it lives.
#[derive(Debug)]
pub(crate) struct Waiting {
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    kind: &'static str,
}

impl Waiting {
    pub(crate) fn new(kind: &'static str) -> Self {
        #[cfg(feature = "metrics")]
        by_kind!(gauge, "redlatch_waiters", kind).increment(1.0);
        Self { kind }
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        #[cfg(feature = "metrics")]
        by_kind!(gauge, "redlatch_waiters", self.kind).decrement(1.0);
    }
}
