//! The waiting loop shared by every primitive: try, queue, sleep until woken or until the
//! holder's lease would run out, try again.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::Node;
use crate::config::{Backoff, Config};
use crate::error::{Error, Result};
use crate::notify::Waiter;

/// The answer to one attempt.
#[derive(Debug)]
pub(crate) enum Attempt<T> {
    Acquired(T),
    /// Held by another owner, whose lease has this much left (`None`: unknown or no expiry).
    Busy(Option<Duration>),
}

/// Waits for a lock or permit announced on `channel`, calling `attempt` whenever it may be
/// free, until it succeeds or `deadline` passes.
///
/// * If this client already has waiters on the channel, a new caller queues behind them without
///   trying first (no barging past local waiters).
/// * After the first failed attempt the caller joins the local queue (subscribing if needed) and
///   tries once more, which closes the window between the failure and the subscription.
/// * Woken by a release it tries again. Only the front waiter also keeps a timer, at the moment
///   the holder's lease would run out; while push is down every waiter polls with jittered
///   backoff bounded by that moment.
pub(crate) async fn wait_for<T, F, Fut>(
    node: &Node,
    config: &Config,
    channel: &str,
    timeout: Option<Duration>,
    mut attempt: F,
) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Attempt<T>>>,
{
    let started = Instant::now();
    let deadline = timeout.map(|t| started + t);
    let timed_out = || Error::Timeout {
        waited: timeout.unwrap_or_default(),
    };
    let notifier = node.notifier();
    let mut backoff = Backoff::new(config);
    let mut must_try = !notifier.has_waiters(channel);
    let mut waiter: Option<Waiter> = None;
    loop {
        if must_try {
            let answer = attempt().await;
            if let Some(w) = &waiter {
                w.settled();
            }
            let answer = match answer {
                // Once waiting, a connection failure is waited out like a busy lock: the
                // attempt is retried with backoff until the deadline. The first attempt's
                // errors go straight to the caller, so a wrong address fails fast.
                Err(err) if waiter.is_some() && err.is_connection() => {
                    tracing::debug!(error = %err, "attempt failed while waiting, retrying");
                    Attempt::Busy(None)
                }
                other => other?,
            };
            match answer {
                Attempt::Acquired(value) => {
                    if let Some(w) = &waiter {
                        // The next local waiter arms its timer for our lease, not the old one.
                        w.set_holder_deadline(Some(Instant::now() + config.lease));
                    }
                    return Ok(value);
                }
                Attempt::Busy(pttl) => {
                    let holder_deadline = pttl.map(|p| Instant::now() + p);
                    match &waiter {
                        Some(w) => w.set_holder_deadline(holder_deadline),
                        None => {
                            let w = notifier.join(channel);
                            w.set_holder_deadline(holder_deadline);
                            if !within(deadline, w.ready()).await {
                                return Err(timed_out());
                            }
                            waiter = Some(w);
                            continue;
                        }
                    }
                }
            }
        }
        let w = match waiter {
            Some(ref w) => w,
            None => {
                let w = waiter.insert(notifier.join(channel));
                if !within(deadline, w.ready()).await {
                    return Err(timed_out());
                }
                w
            }
        };
        let now = Instant::now();
        let timer = if !w.push_active() {
            let poll = now + backoff.next_delay();
            Some(w.holder_deadline().map_or(poll, |d| poll.min(d.max(now))))
        } else if w.is_front() {
            let jitter = config.backoff_min.mul_f64(fastrand::f64());
            Some(
                w.holder_deadline()
                    .unwrap_or_else(|| now + backoff.next_delay())
                    + jitter,
            )
        } else {
            None
        };
        let timer = match (timer, deadline) {
            (Some(t), Some(d)) => Some(t.min(d)),
            (t, d) => t.or(d),
        };
        tokio::select! {
            _ = w.woken() => {
                must_try = w.take_wake() || !w.push_active();
            }
            _ = sleep_until(timer) => {
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    return Err(timed_out());
                }
                must_try = true;
            }
        }
    }
}

/// Sleeps until `at`, or for ever when there is no `at`.
pub(crate) async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Runs `fut` to completion unless `deadline` passes first; false if it did.
async fn within(deadline: Option<Instant>, fut: impl Future<Output = ()>) -> bool {
    match deadline {
        Some(d) => tokio::time::timeout_at(d, fut).await.is_ok(),
        None => {
            fut.await;
            true
        }
    }
}
