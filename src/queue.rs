//! The shared machinery of the primitives whose waiters queue in Redis: [`FairMutex`],
//! [`Semaphore`] and [`RwLock`].
//!
//! Their state lives in three keys under one hash tag (see `lua/v1/queue_lib.lua`): a meta
//! hash, a sorted set of shared holders' leases, and the FIFO queue of waiters, timed by the
//! server's clock. One set of scripts serves all three; the `op` argument says what is asked
//! for (exclusive, read, write, permits).
//!
//! A waiter's place in the queue is a [`Lease`] of its own, named by its queue member: nothing
//! renews it (a place has no deadline), and dropping it (the wait ended, timed out or was
//! cancelled) removes the place in the background. A dead waiter is passed over when the hold
//! handed to it runs out unrenewed (its first term is the waiter timeout), and with it every
//! other waiter of its client.
//!
//! [`FairMutex`]: crate::FairMutex
//! [`Semaphore`]: crate::Semaphore
//! [`RwLock`]: crate::RwLock

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex, Weak};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::backend::Node;
use crate::client::LockClient;
use crate::config::{FENCE_TTL, MAX_LEASE, lease_ms, millis};
use crate::error::{Error, Result};
use crate::key::LockKeys;
use crate::lease::{Family, Held, Hold, Kind, Lease, Op};
use crate::scripts::{QUEUE_ACQUIRE, QUEUE_EXTEND, QUEUE_RELEASE, Reply, statuses};
use crate::time::after;
use crate::token::OwnerToken;
use crate::wait::{Attempt, Claim, OnCancel, Queueing, noting_lost_answers, wait_for};

/// A waiter's place in the queue while it waits. Shared by the wait loop and its attempts, so
/// it is left only when the last of them is done with it.
type Place = StdMutex<Option<Lease>>;

/// One turn per carried owner and name in a client (see [`Queued::acquire`]), while in use.
pub(crate) type Turns = StdMutex<HashMap<String, Weak<tokio::sync::Mutex<()>>>>;

/// A handle on one named queued primitive: what [`FairMutex`](crate::FairMutex),
/// [`Semaphore`](crate::Semaphore) and [`RwLock`](crate::RwLock) wrap.
#[derive(Clone)]
pub(crate) struct Queued {
    pub(crate) client: LockClient,
    pub(crate) name: Arc<str>,
    pub(crate) keys: Arc<LockKeys>,
    pub(crate) family: Family,
    /// The semaphore's permits (0 for the locks).
    pub(crate) capacity: u32,
    pub(crate) lease: Duration,
    pub(crate) renew: bool,
}

impl fmt::Debug for Queued {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Queued")
            .field("name", &self.name)
            .field("lease", &self.lease)
            .field("watchdog", &self.renew)
            .finish_non_exhaustive()
    }
}

impl Queued {
    pub(crate) fn new(
        client: LockClient,
        name: &str,
        family: Family,
        capacity: u32,
    ) -> Result<Self> {
        let config = &client.inner.config;
        let keys = LockKeys::new(&config.prefix, name)?;
        Ok(Self {
            lease: config.lease,
            renew: config.watchdog,
            name: name.into(),
            keys: Arc::new(keys),
            family,
            capacity,
            client,
        })
    }

    /// A fixed lease that the watchdog does not renew.
    pub(crate) fn with_lease(mut self, lease: Duration) -> Result<Self> {
        lease_ms(lease)?;
        self.lease = lease;
        self.renew = false;
        Ok(self)
    }

    /// Acquires `units` of `op` for `owner`, queueing in Redis and waiting up to `timeout`.
    pub(crate) async fn acquire(
        &self,
        op: Op,
        units: u32,
        owner: OwnerToken,
        claim: Claim,
        timeout: Option<Duration>,
    ) -> Result<Held> {
        let inner = &self.client.inner;
        let started = Instant::now();
        // A hand-over names the client and the owner: two waits of one carried owner in one
        // client could not tell whose it is. They take turns, and the later one re-enters the
        // earlier one's hold.
        let _turn = match claim {
            Claim::As => Some(self.turn(&owner, timeout).await?),
            _ => None,
        };
        let timeout = timeout.map(|t| t.saturating_sub(started.elapsed()));
        let tag = format!("{}/{}", inner.id, owner.as_field());
        let fresh = claim == Claim::New;
        let place: Arc<Place> = Arc::default();
        let queueing = Queueing::Server { id: &tag };
        let unanswered = AtomicBool::new(false);
        let result = wait_for(
            &inner.node,
            &inner.config,
            &self.keys.wake,
            queueing,
            timeout,
            || {
                // Once queued, the owner held nothing when it queued: any hold it finds is one
                // a release handed over (its message missed), to be taken as is.
                let queued = take(&place).is_some();
                let claim = if queued {
                    Claim::Queued { fresh }
                } else {
                    claim
                };
                let attempt = self.attempt(op, units, owner, claim, Some(Arc::clone(&place)));
                noting_lost_answers(&unanswered, attempt)
            },
            |fence, term| {
                // Redis removed the place when it handed the hold over.
                if let Some(lease) = take(&place).take() {
                    lease.disarm();
                }
                Ok(self.handed(op, owner, fence, term))
            },
        )
        .await;
        // Dropping `place` leaves the queue, unless an attempt took the lock (which removed
        // the place in Redis and disarmed its lease).
        if result.is_err() && unanswered.load(Ordering::Relaxed) {
            self.abandon(op, units, owner, claim, true);
        }
        result
    }

    /// The hold a release handed to this waiter, for a first `term` (its lease, or the waiter
    /// timeout if that is shorter): the watchdog renews it before that runs out, to the full
    /// lease (a fixed lease once, at once). The term started when the release ran, a moment
    /// before the message arrived, so the local estimate of its end is counted from a
    /// twentieth of it earlier.
    fn handed(&self, op: Op, owner: OwnerToken, fence: u64, term: Duration) -> Held {
        let now = Instant::now();
        let sent_at = now.checked_sub(term / 20).unwrap_or(now);
        let hold = self.hold(op, &owner, self.lease, sent_at);
        hold.handed_until(after(sent_at, term));
        Held {
            client: self.client.clone(),
            owner,
            fence,
            lease: Lease::new(hold, self.client.inner.tasks.clone()),
        }
    }

    /// One attempt without queueing. Busy carries how long until the earliest lease could run
    /// out.
    pub(crate) async fn try_acquire(
        &self,
        op: Op,
        units: u32,
        owner: OwnerToken,
        claim: Claim,
    ) -> Result<Attempt<Held>> {
        let attempt = self.attempt(op, units, owner, claim, None).await;
        if matches!(&attempt, Err(err) if err.is_lost_answer()) {
            self.abandon(op, units, owner, claim, false);
        }
        attempt
    }

    /// One attempt, cancel safe. With a `place`, a busy attempt queues the owner (or keeps its
    /// place). A new owner's attempt runs in the caller's task: if the caller gives up before
    /// the answer, whatever the owner may hold is released and its place left, in the
    /// background. An attempt for an owner that may hold already (re-entry, a carried token)
    /// runs in its own task instead, so that it completes even if the caller is cancelled: a
    /// hold nobody receives is dropped, and so released exactly once; a place nobody keeps is
    /// left.
    pub(crate) async fn attempt(
        &self,
        op: Op,
        units: u32,
        owner: OwnerToken,
        claim: Claim,
        place: Option<Arc<Place>>,
    ) -> Result<Attempt<Held>> {
        let queueing = place.is_some();
        if claim.is_fresh() {
            let cancelled = OnCancel::new(|| self.abandon(op, units, owner, claim, queueing));
            let result = self.run_attempt(op, units, owner, claim, place).await;
            cancelled.disarm();
            return result;
        }
        let (tx, rx) = oneshot::channel();
        let this = self.clone();
        tokio::spawn(async move {
            let result = this.run_attempt(op, units, owner, claim, place).await;
            if let Err(Err(err)) = tx.send(result)
                && err.is_lost_answer()
            {
                // The caller is gone: nobody else will clean up after a lost answer.
                this.abandon(op, units, owner, claim, queueing);
            }
        });
        rx.await.map_err(|_| Error::Protocol {
            script: "queue_acquire",
            detail: "the acquisition task stopped without an answer".into(),
        })?
    }

    /// Waits for this client's turn to wait for the carried `owner` here (see `acquire`).
    async fn turn(
        &self,
        owner: &OwnerToken,
        timeout: Option<Duration>,
    ) -> Result<tokio::sync::OwnedMutexGuard<()>> {
        let key = format!("{}/{}", self.keys.wake, owner.as_field());
        let turn = {
            let mut turns = self
                .client
                .inner
                .turns
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            turns.retain(|_, t| t.strong_count() > 0);
            match turns.get(&key).and_then(Weak::upgrade) {
                Some(turn) => turn,
                None => {
                    let turn = Arc::new(tokio::sync::Mutex::new(()));
                    turns.insert(key, Arc::downgrade(&turn));
                    turn
                }
            }
        };
        match timeout {
            None => Ok(turn.lock_owned().await),
            Some(t) => tokio::time::timeout(t, turn.lock_owned())
                .await
                .map_err(|_| Error::Timeout { waited: t }),
        }
    }

    /// An acquisition ends in an error after an attempt may have been granted, or queued,
    /// without its answer arriving: in the background, a new owner releases whatever it may
    /// hold, and a queued waiter leaves the queue, releasing a hold that a hand-over gave it
    /// (what does not exist is refused harmlessly). A carried owner's other holds are not
    /// touched.
    fn abandon(&self, op: Op, units: u32, owner: OwnerToken, claim: Claim, queued: bool) {
        let fresh = claim.is_fresh();
        if fresh {
            let tasks = &self.client.inner.tasks;
            drop(Lease::new(
                self.hold(op, &owner, self.lease, Instant::now()),
                tasks.clone(),
            ));
        }
        if queued {
            drop(self.place(op, units, &owner, fresh));
        }
    }

    fn hold(&self, op: Op, owner: &OwnerToken, lease: Duration, sent_at: Instant) -> Hold {
        Hold::new(
            Kind::Queued(self.family, op),
            Arc::clone(&self.name),
            Arc::clone(&self.keys),
            owner.as_field(),
            lease,
            self.renew,
            sent_at,
        )
    }

    /// The lease of a waiter's place in the queue: nothing to renew (a place has no deadline),
    /// and dropping it leaves the queue in the background. Its owner is the waiter's queue
    /// member, as `queue_acquire` writes it.
    fn place(&self, op: Op, units: u32, owner: &OwnerToken, fresh: bool) -> Lease {
        let inner = &self.client.inner;
        let member = format!(
            "{}/{}/{}{units}/{}/{}",
            inner.id,
            owner.as_field(),
            op.code(),
            millis(self.lease),
            millis(inner.config.waiter_timeout())
        );
        let hold = Hold::new(
            Kind::Queued(self.family, Op::Waiting { fresh }),
            Arc::clone(&self.name),
            Arc::clone(&self.keys),
            member,
            MAX_LEASE,
            false,
            Instant::now(),
        );
        Lease::new(hold, inner.tasks.clone())
    }

    async fn run_attempt(
        &self,
        op: Op,
        units: u32,
        owner: OwnerToken,
        claim: Claim,
        place: Option<Arc<Place>>,
    ) -> Result<Attempt<Held>> {
        let inner = &self.client.inner;
        let field = owner.as_field();
        let lease = lease_ms(self.lease)?;
        let patience = inner.config.waiter_timeout();
        let capacity = if self.family == Family::Semaphore {
            self.capacity
        } else {
            0
        };
        let mut invocation = QUEUE_ACQUIRE.prepare_invoke();
        for key in self.keys.queued() {
            invocation.key(key);
        }
        invocation
            .arg(self.family.layout())
            .arg(op.code())
            .arg(&field)
            .arg(units)
            .arg(capacity)
            .arg(lease)
            .arg(if place.is_some() { millis(patience) } else { 0 })
            .arg(millis(FENCE_TTL))
            .arg(&self.keys.wake)
            .arg(claim.code())
            .arg(&inner.id);
        let sent_at = Instant::now();
        let lease = |op: Op, lease: Duration| {
            Lease::new(self.hold(op, &owner, lease, sent_at), inner.tasks.clone())
        };
        let raw = inner.node.invoke(&invocation).await?;
        let keys = self.keys.queued();
        let (status, reply) = Reply::decode("queue_acquire", raw, &keys, self.family.layout())?;
        match status {
            1 => {
                if let Some(lease) = place.as_deref().and_then(|p| take(p).take()) {
                    // Redis removed the place when it granted the hold.
                    lease.disarm();
                }
                let fence = reply.int(1)?;
                Ok(Attempt::Acquired(Held {
                    client: self.client.clone(),
                    owner,
                    fence: u64::try_from(fence).unwrap_or_default(),
                    lease: lease(op, self.lease),
                }))
            }
            0 => {
                let (wait, queued) = (reply.int(1)?, reply.int(2)? == 1);
                if let Some(place) = place.as_deref()
                    && queued
                {
                    let mut slot = take(place);
                    if slot.is_none() {
                        *slot = Some(self.place(op, units, &owner, claim.is_fresh()));
                    }
                }
                Ok(Attempt::Busy(
                    u64::try_from(wait).ok().map(Duration::from_millis),
                ))
            }
            -3 => Err(Error::CapacityMismatch {
                name: self.name.to_string(),
                ours: self.capacity,
                theirs: u32::try_from(reply.int(1)?).unwrap_or_default(),
            }),
            -4 => Err(Error::Upgrade {
                name: self.name.to_string(),
            }),
            other => Err(reply.unexpected(other)),
        }
    }
}

fn take(place: &Place) -> std::sync::MutexGuard<'_, Option<Lease>> {
    // Every update is one assignment, so a poisoned lock still holds a consistent value.
    place.lock().unwrap_or_else(|p| p.into_inner())
}

/// Releases one hold of `hold.owner`, or leaves the queue for a waiter's place.
pub(crate) async fn release(node: &Node, hold: &Hold) -> Result<()> {
    let Kind::Queued(family, op) = hold.kind else {
        return Err(Error::Protocol {
            script: "queue_release",
            detail: "not a queued hold".into(),
        });
    };
    let mut invocation = QUEUE_RELEASE.prepare_invoke();
    for key in hold.keys.queued() {
        invocation.key(key);
    }
    invocation
        .arg(family.layout())
        .arg(op.code())
        .arg(&hold.owner)
        .arg(&hold.keys.wake)
        .arg(millis(FENCE_TTL));
    let raw = node.invoke(&invocation).await?;
    let keys = hold.keys.queued();
    let (status, reply) = Reply::decode("queue_release", raw, &keys, family.layout())?;
    match status {
        1..=3 => Ok(()),
        0 => Err(Error::NotHeld {
            name: hold.name.to_string(),
        }),
        other => Err(reply.unexpected(other)),
    }
}

/// Renews a batch of holds and queue places in one script call, each to at least its given ms;
/// one status per item (see `queue_extend.lua`).
pub(crate) async fn extend_batch(node: &Node, holds: &[(&Hold, u64)]) -> Result<Vec<i64>> {
    let mut invocation = QUEUE_EXTEND.prepare_invoke();
    for (hold, ms) in holds {
        for key in &hold.keys.queued()[..3] {
            invocation.key(*key);
        }
        let what = match hold.kind {
            Kind::Queued(_, Op::Exclusive | Op::Write) => "w",
            // Read holds and permits. A waiter's place is never renewed: it has no deadline.
            _ => "h",
        };
        invocation
            .arg(hold.kind.layout())
            .arg(what)
            .arg(&hold.owner)
            .arg(*ms);
    }
    let raw = node.invoke(&invocation).await?;
    statuses("queue_extend", raw, holds.len())
}
