//! The wait: try, queue, sleep until woken or until the holder's lease would run out, try again.
//!
//! * The plain mutex queues its waiters in the client: if this client already has waiters on
//!   the name's channel, a new caller queues behind them without trying first (no barging past
//!   local waiters). If the client still listens to the channel (a subscription lingers after
//!   its last waiter), the caller joins the local queue before its first attempt, and a busy
//!   answer (which marked the lock, so its release publishes) is its only attempt until it is
//!   woken. Otherwise, after the first failed attempt the caller joins the local queue
//!   (subscribing) and tries once more, which closes the window between the failure and the
//!   subscription. A release wakes the oldest local waiter of each client; only that
//!   front waiter keeps a fallback timer, for the moment the holder's lease would run out.
//! * The queued primitives queue in Redis: the caller always tries first (Redis keeps the
//!   order), and a busy attempt takes a place in the queue. If this client already listens to
//!   the channel, the waiter registers for its wake-up before that attempt, so no message naming
//!   it can slip past and the attempt is its only one until it is woken; otherwise it subscribes
//!   after the attempt and tries once more, as above. A release that lets it through names it,
//!   and usually hands it the hold in the same message: no further round trip. Each waiter
//!   keeps its own timer, for the moment the script said something may change unannounced.
//! * While push is down every waiter polls with jittered backoff, bounded by the moment it was
//!   told things may change.
//! * Once waiting, a connection failure is waited out like a busy lock, until the deadline; so
//!   is a first attempt that timed out (a server paused or busy). The first attempt's other
//!   errors go straight to the caller, so a wrong address fails fast.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::OwnedMutexGuard;
use tokio::time::Instant;

use super::engine::RequestId;
use super::queued::{self, Place, take};
use super::{Ask, Attempt, Engine};
use crate::config::Backoff;
use crate::error::{Error, Result};
use crate::lease::Held;
use crate::meter;
use crate::notify::Waiter;
use crate::protocol::wake::Grant;
use crate::protocol::{Claim, queue};
use crate::time::{after, sleep_until};

/// How long after its first sending a request whose answers were lost is sent again under the
/// same id: less than the request log keeps an entry (10 s, `once_lib.lua`). Later, the attempt
/// takes a new id (the first may then be counted twice, once in a lease at most).
const RESEND_WITHIN: Duration = Duration::from_secs(9);

/// The most a waiter puts off its look at a holder's lease end, to spread the looks of several
/// waiters: the default backoff minimum.
const JITTER: Duration = Duration::from_millis(10);

/// Waits for `ask` up to `timeout` (`None`: as long as it takes). `waited`: the caller already
/// waited for its turn behind other tasks of this client (local hand-off), so it is a waiter
/// from its first attempt on: an attempt that cannot reach Redis is waited out, as a queued
/// waiter's is, instead of failing the call.
pub(super) async fn acquire(
    engine: &Engine,
    ask: Ask,
    timeout: Option<Duration>,
    waited: bool,
) -> Result<Held> {
    let started = Instant::now();
    let in_redis = engine.family.is_queued();
    // A hand-over names the client and the owner: waits for one carried owner in one client
    // take turns, and the later one re-enters the earlier one's hold.
    let turn = match (in_redis, ask.claim) {
        (true, Claim::As) => {
            let key = format!("{}/{}", engine.keys.wake, ask.owner.as_field());
            Some(engine.core.turns.take(key, timeout).await?)
        }
        _ => None,
    };
    let mut attempts = Attempts {
        engine,
        ask,
        place: in_redis.then(Arc::default),
        unanswered: AtomicBool::new(false),
        resend: std::sync::Mutex::new(None),
        waited,
        acquired: false,
        turn,
    };
    let deadline = timeout.map(|t| after(started, t));
    // The first attempt, when it is made before any registration (see `wait`), is made here:
    // an acquisition it answers never builds the wait, which is boxed so that the uncontended
    // acquire's future stays small.
    let first = if tries_unregistered(engine, in_redis, ask.claim) {
        let sent = Instant::now();
        let answer = attempts.attempt().await;
        match answer {
            Ok(Attempt::Acquired(held)) => {
                attempts.acquired = true;
                crate::timeline::hop("acquired");
                return Ok(held);
            }
            answer => Some((sent, answer)),
        }
    } else {
        None
    };
    let waited = timeout.unwrap_or_default();
    let result = Box::pin(wait(&attempts, deadline, waited, first)).await;
    if result.is_ok() {
        attempts.acquired = true;
        crate::timeline::hop("acquired");
    }
    result
}

/// The attempts of one wait. Dropped, its place leaves the queue, unless an attempt took the
/// lock (which removed the place in Redis and disarmed its lease); and if an attempt went
/// unanswered, whatever it may have got is given back, whether the wait ended in an error or
/// was dropped between attempts.
struct Attempts<'a> {
    engine: &'a Engine,
    ask: Ask,
    /// The waiter's place in the queue (queued primitives).
    place: Option<Arc<Place>>,
    /// An attempt failed without an answer: it may have been granted in Redis all the same.
    unanswered: AtomicBool,
    /// The claim, request id and first sending of the last attempts, while none of them got an
    /// answer and their claim must not run twice (a carried owner's, which adds a hold each
    /// time): the next attempt with that claim is the same request sent again, and a script
    /// that ran already answers it from the name's request log, for as long as the log keeps
    /// it ([`RESEND_WITHIN`]).
    resend: std::sync::Mutex<Option<(Claim, u128, Instant)>>,
    /// The caller waited for its turn in this client before its first attempt.
    waited: bool,
    /// The wait ended with the hold.
    acquired: bool,
    /// A carried owner's turn in this client (see [`Turns`](crate::core::Turns)).
    turn: Option<OwnedMutexGuard<()>>,
}

impl Drop for Attempts<'_> {
    fn drop(&mut self) {
        if !self.acquired && self.unanswered.load(Ordering::Relaxed) {
            self.engine.abandon(self.ask, self.place.is_some());
        }
        // The waiter's place, when it leaves the queue (not granted): its release, in the
        // background, names the queue member, which the owner's next wait in this client
        // shares. That wait takes its turn only once the release has run (the place keeps it,
        // also for a place an attempt still running makes), so that it never takes over the
        // place (a queue's `ZADD NX` keeps it), nor the hold handed to it, for the release to
        // take away after.
        if let (Some(place), Some(turn)) = (&self.place, self.turn.take()) {
            place.keep_turn(turn);
        }
    }
}

impl Attempts<'_> {
    fn attempt(&self) -> impl Future<Output = Result<Attempt<Held>>> + '_ {
        let mut ask = self.ask;
        if let Some(place) = &self.place
            && take(place).is_some()
        {
            // Once queued, the owner held nothing when it queued: a hold it finds is one a
            // release handed over (its message missed), to be taken as is; a carried owner's
            // only while the hold is marked with this client (else another client's wait of the
            // owner took it, and this one joins it).
            ask.claim = Claim::Queued {
                fresh: self.ask.claim == Claim::New,
            };
        }
        let mut first_sent = Instant::now();
        if !ask.claim.repeats_safely() {
            let resent = self
                .resend()
                .filter(|(claim, _, sent)| *claim == ask.claim && sent.elapsed() < RESEND_WITHIN);
            if let Some((_, _, sent)) = resent {
                first_sent = sent;
            }
            ask.request = Some(RequestId {
                id: resent.map_or_else(|| fastrand::u128(..), |(_, id, _)| id),
                again: resent.is_some(),
            });
        }
        async move {
            crate::timeline::hop("attempt.sent");
            let result = self.engine.attempt(ask, self.place.clone()).await;
            crate::timeline::hop("attempt.answered");
            if matches!(&result, Err(err) if err.is_lost_answer()) {
                self.unanswered.store(true, Ordering::Relaxed);
            }
            // The id is kept until an attempt gets an answer: one that failed on a connection
            // (lost, or not sent at all) may follow one that ran.
            *self.resend() = match (&result, ask.request) {
                (Err(err), Some(request)) if err.is_connection() => {
                    Some((ask.claim, request.id, first_sent))
                }
                _ => None,
            };
            result
        }
    }

    fn resend(&self) -> std::sync::MutexGuard<'_, Option<(Claim, u128, Instant)>> {
        self.resend.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A release handed the waiter the hold. If it handed over the place that this waiter's
    /// latest answered attempt, sent at `sent`, found waiting (`waiting`: the send time and the
    /// place's ticket), Redis granted it after `sent`, and its first term runs until `sent`
    /// plus the term at least. `None` when that has passed, or when the message is about
    /// another place (a late message about a place since dropped) or none is known: the waiter
    /// must ask again, which confirms the hold and renews its lease, or finds none.
    fn handed(&self, grant: Grant, waiting: Option<(Instant, u64)>) -> Option<Result<Held>> {
        let Some(place) = &self.place else {
            return Some(Err(Error::Protocol {
                script: "mutex_release",
                detail: "a hand-over message on a mutex channel".into(),
            }));
        };
        let (granted_after, _) = waiting.filter(|(sent, ticket)| {
            grant.ticket == Some(*ticket)
                && after(*sent, self.engine.core.config.drift.validity(grant.term)) > Instant::now()
        })?;
        // Redis removed the place when it handed the hold over.
        if let Some(lease) = take(place).take() {
            lease.disarm();
        }
        Some(Ok(queued::handed(
            self.engine,
            self.ask,
            grant,
            granted_after,
        )))
    }
}

/// Whether a caller tries at once: a queued primitive's caller always (Redis keeps the order),
/// a plain mutex's when no local waiter is ahead of it, or when its owner is carried (`lock_as`,
/// a re-entry): that owner may hold the lock already, and joins its hold without waiting, where
/// behind local waiters that wait for that very hold it would wait for ever.
fn tries_at_once(engine: &Engine, in_redis: bool, claim: Claim) -> bool {
    in_redis || !claim.is_fresh() || !engine.core.notifier.has_waiters(engine.waiters_channel())
}

/// Whether a caller's first attempt goes out before it registers as a waiter: it tries at once
/// on a channel this client does not listen to.
fn tries_unregistered(engine: &Engine, in_redis: bool, claim: Claim) -> bool {
    tries_at_once(engine, in_redis, claim)
        && !engine.core.notifier.is_subscribed(engine.waiters_channel())
}

/// The loop (see the module docs). `first`: the answer of a first attempt already made without
/// registering (see [`tries_unregistered`]), and when it was sent.
async fn wait(
    attempts: &Attempts<'_>,
    deadline: Option<Instant>,
    waited: Duration,
    mut first: Option<(Instant, Result<Attempt<Held>>)>,
) -> Result<Held> {
    let engine = attempts.engine;
    let in_redis = attempts.place.is_some();
    let channel = engine.waiters_channel();
    let config = &engine.core.config;
    let notifier = &engine.core.notifier;
    // A queued waiter joins under its id (written when it joins: an acquisition that never
    // waits needs none).
    let join = || {
        if in_redis {
            let id = queue::waiter_id(&engine.core.id, &attempts.ask.owner.as_field());
            notifier.join_named(channel, &id)
        } else {
            notifier.join(channel)
        }
    };
    let mut backoff = Backoff::new(config);
    let mut must_try = first.is_some() || tries_at_once(engine, in_redis, attempts.ask.claim);
    // A waiter that tries at once on a channel this client already listens to registers first
    // (a plain mutex's, with no local waiter ahead of it); on any other channel it tries first,
    // so an uncontended acquire never subscribes.
    let mut waiter: Option<Waiter> =
        (first.is_none() && must_try && notifier.is_subscribed(channel)).then(join);
    // Releases reached this client before the first attempt was sent: a busy answer is then
    // waited out without a second attempt (its mark, or its place, makes the next release tell
    // this waiter).
    let heard_from_start = waiter.as_ref().is_some_and(Waiter::push_active);
    let mut queued = false;
    // Counted in the waiters gauge from the moment the name is found busy to the end.
    let mut counted: Option<meter::Waiting> = None;
    // Queued in Redis: when the last attempt said something may change unannounced, and when
    // the last attempt that found the waiter waiting was sent, with its place's ticket (a
    // hand-over of that place came after).
    let mut own_deadline: Option<Instant> = None;
    let mut waiting: Option<(Instant, u64)> = None;
    // A Redlock client's nodes may be held by other contenders' grants, given back without a
    // word: a waiter that looks itself looks again within the backoff maximum, whatever the
    // lease.
    let quorum = engine.core.backend.as_quorum().is_some();
    // When the holder's lease runs out, as last heard: what a timeout reports.
    let known = |waiter: &Option<Waiter>, own: Option<Instant>| {
        if in_redis {
            own
        } else {
            waiter.as_ref().and_then(Waiter::holder_deadline)
        }
    };
    let timed_out = |known: Option<Instant>| Error::Timeout {
        waited,
        lease_left: known.map(|d| d.saturating_duration_since(Instant::now())),
    };
    loop {
        if must_try {
            let (sent, answer) = match first.take() {
                Some(made) => made,
                None => (Instant::now(), attempts.attempt().await),
            };
            if let Some(w) = &waiter {
                w.settled();
            }
            // An attempt without an answer is waited out like a busy one (a waiter's, or any
            // that timed out); it says nothing about the waiter's place.
            let answer = match answer {
                Err(err) if (queued || attempts.waited || err.is_slow()) && err.is_connection() => {
                    tracing::debug!(error = %err, "attempt failed while waiting, retrying");
                    Attempt::Busy(None)
                }
                other => other?,
            };
            let wait = match answer {
                Attempt::Acquired(held) => {
                    if let Some(w) = &waiter {
                        w.served();
                        if !in_redis {
                            // The next local waiter arms its timer for our lease, not the old
                            // one.
                            w.set_holder_deadline(Some(after(Instant::now(), engine.lease)));
                        }
                    }
                    return Ok(held);
                }
                Attempt::Busy(wait) => wait,
                Attempt::Queued { wait, ticket } => {
                    waiting = Some((sent, ticket));
                    wait
                }
            };
            let at = wait.map(|p| after(Instant::now(), p));
            let w = waiter.get_or_insert_with(join);
            if in_redis {
                own_deadline = at;
            } else {
                w.set_holder_deadline(at);
            }
            if !queued {
                queued = true;
                counted.get_or_insert_with(|| meter::Waiting::new(engine.family.label()));
                if !heard_from_start {
                    if !within(deadline, w.ready()).await {
                        return Err(timed_out(known(&waiter, own_deadline)));
                    }
                    continue;
                }
            }
        }
        if waiter.is_none() {
            queued = true;
            counted.get_or_insert_with(|| meter::Waiting::new(engine.family.label()));
            let w = waiter.insert(join());
            if !within(deadline, w.ready()).await {
                return Err(timed_out(known(&waiter, own_deadline)));
            }
        }
        let Some(w) = &waiter else { continue };
        let now = Instant::now();
        let known_at = known(&waiter, own_deadline);
        // Spreads the looks of waiters that wait for the same lease end; never more than
        // `JITTER`, whatever the backoff's minimum, so a look is not put off long past it.
        let jitter = config.backoff_min.min(JITTER).mul_f64(fastrand::f64());
        let timer = if !w.push_active() {
            let poll = after(now, backoff.next_delay());
            Some(known_at.map_or(poll, |d| poll.min(d.max(now))))
        } else if in_redis || w.is_front() {
            // Unknown (the last attempt did not reach Redis): poll with backoff.
            Some(after(
                known_at.unwrap_or_else(|| after(now, backoff.next_delay())),
                jitter,
            ))
        } else {
            None
        };
        let timer = if quorum {
            timer.map(|t| t.min(after(now, config.backoff_max)))
        } else {
            timer
        };
        let timer = match (timer, deadline) {
            (Some(t), Some(d)) => Some(t.min(d)),
            (t, d) => t.or(d),
        };
        tokio::select! {
            _ = w.woken() => {
                crate::timeline::hop("waiter.woken");
                if let Some(grant) = w.take_grant() {
                    // A release gave us the hold already: no round trip, unless the message
                    // came too late to tell how long the hold has left.
                    w.take_wake();
                    w.settled();
                    if let Some(held) = attempts.handed(grant, waiting) {
                        if held.is_ok() {
                            w.served();
                        }
                        return held;
                    }
                    must_try = true;
                    continue;
                }
                must_try = if w.take_wake() {
                    if !in_redis {
                        // A release freed the lock: the attempt it calls for goes out in plain
                        // commands first, which cost the server a fraction of the script (a
                        // name taken again meanwhile costs the script after them, as any busy
                        // attempt).
                        engine.core.tasks.free().freed(&engine.keys.lock);
                    }
                    true
                } else {
                    !w.push_active()
                };
            }
            _ = sleep_until(timer) => {
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    return Err(timed_out(known_at));
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
