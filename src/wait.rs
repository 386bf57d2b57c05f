//! The waiting loop shared by every primitive: try, queue, sleep until woken or until the
//! holder's lease would run out, try again.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::Node;
use crate::config::{Backoff, Config};
use crate::error::{Error, Result};
use crate::notify::Waiter;
use crate::time::{after, sleep_until};

/// The answer to one attempt.
#[derive(Debug)]
pub(crate) enum Attempt<T> {
    Acquired(T),
    /// Held by another owner, whose lease has this much left (`None`: unknown or no expiry).
    Busy(Option<Duration>),
}

impl<T> Attempt<T> {
    /// The value, if acquired; `None` when busy.
    pub(crate) fn acquired(self) -> Option<T> {
        match self {
            Self::Acquired(value) => Some(value),
            Self::Busy(_) => None,
        }
    }

    pub(crate) fn map<U>(self, f: impl FnOnce(T) -> U) -> Attempt<U> {
        match self {
            Self::Acquired(value) => Attempt::Acquired(f(value)),
            Self::Busy(wait) => Attempt::Busy(wait),
        }
    }
}

/// How an attempt claims the lock for its owner (the scripts' `claim` argument).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Claim {
    /// The owner token was made for this call. If Redis says it already holds, an earlier
    /// attempt was granted and its answer lost: that hold is returned as is, not added to.
    New,
    /// A token the caller carried: join the owner's holds, or acquire.
    As,
    /// Re-entry only: add a hold if the owner still holds, else report busy.
    Again,
    /// A waiter that queued earlier asks again (its timer ran out, or it missed its message):
    /// as [`New`](Self::New), and it keeps its place. `fresh` when the owner was made for this
    /// wait (the wait began with `New`).
    Queued { fresh: bool },
}

impl Claim {
    pub(crate) fn code(self) -> &'static str {
        match self {
            Self::New => "new",
            Self::As => "as",
            Self::Again => "again",
            Self::Queued { .. } => "queued",
        }
    }

    /// The owner was made for this acquisition: whatever it holds, this acquisition got, and
    /// may be given back blindly.
    pub(crate) fn is_fresh(self) -> bool {
        matches!(self, Self::New | Self::Queued { fresh: true })
    }
}

/// Runs one attempt and notes, in `unanswered`, if it failed without an answer: it may have
/// been granted in Redis all the same.
pub(crate) async fn noting_lost_answers<T>(
    unanswered: &AtomicBool,
    attempt: impl Future<Output = Result<Attempt<T>>>,
) -> Result<Attempt<T>> {
    let result = attempt.await;
    if matches!(&result, Err(err) if err.is_lost_answer()) {
        unanswered.store(true, Ordering::Relaxed);
    }
    result
}

/// Runs `cleanup` when dropped before [`disarm`](Self::disarm): what an attempt of a new owner
/// leaves behind when its caller gives up while the request may be on its way to Redis. The
/// cleanup goes through the client's background queue, on the same connection and so after the
/// request, and gives back whatever the request may have got (what it did not get is refused
/// harmlessly).
pub(crate) struct OnCancel<F: FnOnce()>(Option<F>);

impl<F: FnOnce()> OnCancel<F> {
    pub(crate) fn new(cleanup: F) -> Self {
        Self(Some(cleanup))
    }

    /// The attempt has its answer: nothing to clean up here.
    pub(crate) fn disarm(mut self) {
        self.0 = None;
    }
}

impl<F: FnOnce()> Drop for OnCancel<F> {
    fn drop(&mut self) {
        if let Some(cleanup) = self.0.take() {
            cleanup();
        }
    }
}

/// Where waiters queue.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Queueing<'a> {
    /// In this client only (the plain mutex): Redis keeps no queue, a release wakes the oldest
    /// local waiter of each client, and only that front waiter keeps a fallback timer.
    Local,
    /// In Redis (fair mutex, semaphore, read-write lock): the attempt queues the waiter, a
    /// release names the waiters it lets through (as `id`), and each waiter keeps its own timer
    /// for the moment the script said something may change unannounced (a lease running out).
    Server {
        /// How releases name the waiter: `client/owner` (see `queue_lib.lua`).
        id: &'a str,
    },
}

/// Waits for a lock or permit announced on `channel`, calling `attempt` whenever it may be
/// free, until it succeeds or `deadline` passes.
///
/// * [`Queueing::Local`]: if this client already has waiters on the channel, a new caller
///   queues behind them without trying first (no barging past local waiters). After the first
///   failed attempt the caller joins the local queue (subscribing if needed) and tries once
///   more, which closes the window between the failure and the subscription.
/// * [`Queueing::Server`]: the caller always tries first (Redis keeps the order). If this
///   client already listens to the channel, the waiter registers for its wake-up before that
///   attempt, so no message naming it can slip past and the attempt is its only one until it
///   is woken; otherwise it subscribes after the attempt and tries once more, as above.
/// * Woken it tries again, unless the message says a release handed it the hold (server
///   queueing): then `handed` makes the value from the hold's fencing token and first term.
/// * While push is down every waiter polls with jittered backoff
///   bounded by the moment it was told things may change.
pub(crate) async fn wait_for<T, F, Fut, G>(
    node: &Node,
    config: &Config,
    channel: &str,
    queueing: Queueing<'_>,
    timeout: Option<Duration>,
    mut attempt: F,
    mut handed: G,
) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Attempt<T>>>,
    G: FnMut(u64, Duration) -> Result<T>,
{
    let started = Instant::now();
    let deadline = timeout.map(|t| after(started, t));
    let timed_out = || Error::Timeout {
        waited: timeout.unwrap_or_default(),
    };
    let notifier = node.notifier();
    let mut backoff = Backoff::new(config);
    let server = matches!(queueing, Queueing::Server { .. });
    let join = || match queueing {
        Queueing::Server { id } => notifier.join_named(channel, id),
        Queueing::Local => notifier.join(channel),
    };
    // A server-queued waiter on a channel this client already listens to registers first; on
    // any other channel it tries first, so an uncontended acquire never subscribes.
    let mut waiter: Option<Waiter> = (server && notifier.is_subscribed(channel)).then(join);
    // Releases reached this client before the first attempt was sent.
    let heard_from_start = waiter.as_ref().is_some_and(Waiter::push_active);
    let mut must_try = server || !notifier.has_waiters(channel);
    let mut queued = false;
    // Server queueing: when the last attempt said something may change unannounced.
    let mut own_deadline: Option<Instant> = None;
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
                Err(err) if queued && err.is_connection() => {
                    tracing::debug!(error = %err, "attempt failed while waiting, retrying");
                    Attempt::Busy(None)
                }
                other => other?,
            };
            match answer {
                Attempt::Acquired(value) => {
                    if let (Some(w), false) = (&waiter, server) {
                        // The next local waiter arms its timer for our lease, not the old one.
                        w.set_holder_deadline(Some(after(Instant::now(), config.lease)));
                    }
                    return Ok(value);
                }
                Attempt::Busy(wait) => {
                    let at = wait.map(|p| after(Instant::now(), p));
                    let w = waiter.get_or_insert_with(join);
                    if server {
                        own_deadline = at;
                    } else {
                        w.set_holder_deadline(at);
                    }
                    if !queued {
                        queued = true;
                        if !(server && heard_from_start) {
                            if !within(deadline, w.ready()).await {
                                return Err(timed_out());
                            }
                            continue;
                        }
                    }
                }
            }
        }
        let w = match waiter {
            Some(ref w) => w,
            None => {
                queued = true;
                let w = waiter.insert(join());
                if !within(deadline, w.ready()).await {
                    return Err(timed_out());
                }
                w
            }
        };
        let now = Instant::now();
        let known = if server {
            own_deadline
        } else {
            w.holder_deadline()
        };
        let jitter = config.backoff_min.mul_f64(fastrand::f64());
        let timer = if !w.push_active() {
            let poll = after(now, backoff.next_delay());
            Some(known.map_or(poll, |d| poll.min(d.max(now))))
        } else if server || w.is_front() {
            // Unknown (the last attempt did not reach Redis): poll with backoff.
            Some(after(
                known.unwrap_or_else(|| after(now, backoff.next_delay())),
                jitter,
            ))
        } else {
            None
        };
        let timer = match (timer, deadline) {
            (Some(t), Some(d)) => Some(t.min(d)),
            (t, d) => t.or(d),
        };
        tokio::select! {
            _ = w.woken() => {
                if let Some((fence, term)) = w.take_grant() {
                    // A release gave us the hold already (server queueing): no round trip.
                    w.take_wake();
                    w.settled();
                    return handed(fence, term);
                }
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
