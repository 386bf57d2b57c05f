//! [`Engine`]: the acquisition machinery of one named primitive, and one attempt, cancel safe.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::queued::{self, Place};
use super::{Attempt, wait};
use crate::backend::{Request, Want};
use crate::config::{Durability, FENCE_TTL, lease_ms, millis};
use crate::core::Core;
use crate::error::{Error, Result};
use crate::key::LockKeys;
use crate::lease::{Held, Hold, Lease};
use crate::meter;
use crate::protocol::take::{Fence, Take, Taken};
use crate::protocol::{Answer, Claim, Family, Op, foreign, mutex, queue};
use crate::time::after;
use crate::token::OwnerToken;

/// What one acquisition asks for: `units` of `op` for `owner`, claimed as `claim`; a fresh
/// plain mutex grant takes up to `tokens` fencing tokens (more than one for a hold passed
/// locally; see `mutex::block_end`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ask {
    pub(crate) op: Op,
    pub(crate) units: u32,
    pub(crate) owner: OwnerToken,
    pub(crate) claim: Claim,
    pub(crate) tokens: u32,
    /// The id its script call carries where it runs once per request (see `once_lib.lua`);
    /// `None`: a new one.
    pub(crate) request: Option<RequestId>,
}

/// A request id that an attempt's script call carries, and whether the attempt sends again a
/// request whose answer was lost (`again`): a script that ran already then answers from its
/// log rather than adding a hold a second time, and a grant may be that first run's, whose
/// lease counted from a moment this process does not know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RequestId {
    pub(crate) id: u128,
    pub(crate) again: bool,
}

impl Ask {
    /// The id its script call carries (`None`: a new one).
    pub(crate) fn request_id(&self) -> Option<u128> {
        self.request.map(|r| r.id)
    }

    /// It sends again a request whose answer was lost.
    pub(crate) fn is_again(&self) -> bool {
        self.request.is_some_and(|r| r.again)
    }

    /// One unit of `op` for `owner`.
    pub(crate) fn one(op: Op, owner: OwnerToken, claim: Claim) -> Self {
        Self {
            op,
            units: 1,
            owner,
            claim,
            tokens: 1,
            request: None,
        }
    }
}

/// The acquisition machinery of one named primitive: what every handle wraps.
#[derive(Clone)]
pub(crate) struct Engine {
    pub(crate) core: Arc<Core>,
    pub(crate) name: Arc<str>,
    pub(crate) keys: Arc<LockKeys>,
    pub(crate) family: Family,
    /// The semaphore's permits (0 for the locks).
    pub(crate) capacity: u32,
    /// The lease of every hold it takes, and whether the watchdog renews it.
    pub(crate) lease: Duration,
    pub(crate) renew: bool,
    /// Whether its acquisitions wait for replicas.
    pub(crate) durability: Durability,
    /// A queued primitive's waiters' channel: this client's own of the name
    /// (`queue::client_channel`), made once per handle rather than per wait.
    client_wake: Option<Arc<str>>,
}

impl fmt::Debug for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Engine")
            .field("name", &self.name)
            .field("family", &self.family)
            .field("lease", &self.lease)
            .field("watchdog", &self.renew)
            .finish_non_exhaustive()
    }
}

/// Runs `cleanup` when dropped before [`disarm`](Self::disarm): what an attempt of a new owner
/// leaves behind when its caller gives up while the request may be on its way to Redis. The
/// cleanup goes through the client's background queue, on the same connection and so after the
/// request (a durable request's, once the durable connection's calls queued before it ran), and
/// gives back whatever the request may have got (what it did not get is refused harmlessly).
pub(super) struct OnCancel<F: FnOnce()>(Option<F>);

impl<F: FnOnce()> OnCancel<F> {
    pub(super) fn new(cleanup: F) -> Self {
        Self(Some(cleanup))
    }

    /// The attempt has its answer: nothing to clean up here.
    pub(super) fn disarm(mut self) {
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

impl Engine {
    /// The machinery for `name`, used as `family` (with `capacity` permits for a semaphore),
    /// with the client's lease settings.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a bad name; [`Error::Unsupported`] for a queued
    /// primitive on a Redlock client.
    pub(crate) fn new(core: Arc<Core>, name: &str, family: Family, capacity: u32) -> Result<Self> {
        let keys = LockKeys::new(&core.config.prefix, name)?;
        if family.is_queued() && core.backend.as_quorum().is_some() {
            return Err(Error::Unsupported {
                what: family.what(),
                reason: "a Redlock client serves the plain Mutex only: a majority of per-node \
                         queues or permit counts cannot keep their promises",
            });
        }
        let client_wake = family
            .is_queued()
            .then(|| queue::client_channel(&keys.wake, &core.id).into());
        Ok(Self {
            client_wake,
            lease: core.config.lease,
            renew: core.config.watchdog,
            durability: core.config.durability,
            name: name.into(),
            keys: Arc::new(keys),
            family,
            capacity,
            core,
        })
    }

    /// The channel its waiters listen on: a queued primitive's are named on their client's
    /// own channel of the name; the plain mutex's wake-ups go to every client on the name's.
    pub(super) fn waiters_channel(&self) -> &str {
        self.client_wake.as_deref().unwrap_or(&self.keys.wake)
    }

    /// A fixed lease that the watchdog does not renew.
    pub(crate) fn with_lease(mut self, lease: Duration) -> Result<Self> {
        // Whole milliseconds, as the scripts take it: the local estimate of its end must not run
        // past the server's by the fraction cut off.
        let lease = Duration::from_millis(lease_ms(lease)?);
        // A grant is counted on for the lease less the client's drift allowance: with nothing
        // left, every grant would come too late to be used.
        if self.core.config.drift.validity(lease).is_zero() {
            return Err(Error::invalid(
                "lease",
                format!("the client's drift allowance leaves nothing of {lease:?}"),
            ));
        }
        self.lease = lease;
        self.renew = false;
        Ok(self)
    }

    /// Acquisitions that wait for replicas as `durability` says.
    pub(crate) fn with_durability(mut self, durability: Durability) -> Result<Self> {
        durability.validate()?;
        if durability != Durability::None && !self.core.backend.serves_durability() {
            return Err(crate::backend::durability_unsupported());
        }
        self.durability = durability;
        Ok(self)
    }

    /// Runs an acquisition request, durably when this handle asks for it: the answer, and for
    /// a durable one how many replicas acknowledged it of how many were wanted.
    pub(super) async fn send<R: Request<Reply = Answer>>(
        &self,
        request: &R,
    ) -> Result<(Answer, Option<(u32, u32)>)> {
        match Want::of(self.durability) {
            None => Ok((self.core.backend.run(request).await?, None)),
            Some(want) => {
                let (answer, acked, wanted) = self.core.backend.run_durable(request, want).await?;
                Ok((answer, Some((acked, wanted))))
            }
        }
    }

    /// A grant that fewer replicas acknowledged than wanted is released again (its hold
    /// dropped) and fails.
    pub(super) fn replicated(held: Held, acks: Option<(u32, u32)>) -> Result<Held> {
        match acks {
            Some((acked, wanted)) if acked < wanted => {
                // Given back unused: no guard had it, so no hold time is counted.
                let mut held = held;
                held.since = None;
                drop(held);
                Err(Error::NotReplicated { acked, wanted })
            }
            _ => Ok(held),
        }
    }

    /// Acquires, waiting up to `timeout` (`None`: as long as it takes). A zero timeout makes one
    /// attempt without queueing and fails with [`Error::Timeout`] (carrying the holder's
    /// remaining lease) if it is busy.
    pub(crate) async fn acquire(&self, ask: Ask, timeout: Option<Duration>) -> Result<Held> {
        let started = Instant::now();
        let result = if self.passes_locally(ask, timeout) {
            super::cohort::acquire(self, ask, timeout).await
        } else {
            self.acquire_in_redis(ask, timeout, false).await
        };
        meter::acquire_ended(
            self.family.label(),
            started.elapsed(),
            result.as_ref().map(|_| ()),
        );
        result
    }

    /// Whether the holds of `ask` pass between this client's tasks (local hand-off): a new
    /// owner of a plain mutex that waits, with the watchdog's lease and no durability, on a
    /// client that has it on (never a Redlock client).
    fn passes_locally(&self, ask: Ask, timeout: Option<Duration>) -> bool {
        self.family == Family::Mutex
            && ask.claim == Claim::New
            && self.renew
            && self.durability == Durability::None
            && timeout != Some(Duration::ZERO)
            && self.core.config.handoff.is_on()
            && self.core.backend.as_quorum().is_none()
    }

    /// [`acquire`](Self::acquire), every attempt in Redis; `waited`: the caller already waited
    /// for its turn in this client (see [`wait::acquire`]).
    pub(super) async fn acquire_in_redis(
        &self,
        ask: Ask,
        timeout: Option<Duration>,
        waited: bool,
    ) -> Result<Held> {
        if timeout == Some(Duration::ZERO) {
            return match self.try_once(ask).await? {
                Attempt::Acquired(held) => Ok(held),
                Attempt::Busy(lease_left)
                | Attempt::Queued {
                    wait: lease_left, ..
                } => Err(Error::Timeout {
                    waited: Duration::ZERO,
                    lease_left,
                }),
            };
        }
        wait::acquire(self, ask, timeout, waited).await
    }

    /// One attempt without queueing. Busy carries how long until the holder's (or the earliest)
    /// lease could run out. A new owner's attempt whose answer was lost is given back in the
    /// background.
    pub(crate) async fn try_acquire(&self, ask: Ask) -> Result<Attempt<Held>> {
        let started = Instant::now();
        let attempt = self.try_once(ask).await;
        match &attempt {
            Ok(Attempt::Acquired(_)) => {
                meter::acquire_ended(self.family.label(), started.elapsed(), Ok(()));
            }
            Ok(_) => {}
            Err(err) => meter::acquire_ended(self.family.label(), started.elapsed(), Err(err)),
        }
        attempt
    }

    /// [`try_acquire`](Self::try_acquire), not counted in the metrics (the caller counts).
    async fn try_once(&self, ask: Ask) -> Result<Attempt<Held>> {
        let attempt = self.attempt(ask, None).await;
        if matches!(&attempt, Err(err) if err.is_lost_answer()) {
            self.abandon(ask, false);
        }
        attempt
    }

    /// One more hold of `op` for the owner of `held`, which holds the lock: re-entry, or a
    /// writer's downgrade. If Redis says the owner holds nothing any more, `held` is marked lost.
    pub(crate) async fn again(&self, op: Op, held: &Held) -> Result<Held> {
        if held.hold().is_lost() {
            return Err(held.not_held());
        }
        // Its owner now has another hold.
        held.share();
        match self
            .attempt(Ask::one(op, held.owner, Claim::Again), None)
            .await?
        {
            Attempt::Acquired(mut again) => {
                // The same hold, counted once more: the same token.
                if op == held.hold().op {
                    again.fence = held.fence;
                }
                Ok(again)
            }
            Attempt::Busy(_) | Attempt::Queued { .. } => {
                held.hold().mark_lost();
                Err(held.not_held())
            }
        }
    }

    /// One attempt, cancel safe. With a `place`, a busy attempt of a queued primitive queues the
    /// owner (or keeps its place). A new owner's attempt runs in the caller's task: if the caller
    /// gives up before the answer, whatever the owner may hold is released and its place left,
    /// in the background. An attempt for an owner that may hold already (re-entry, a carried
    /// token) runs in its own task instead, so that it completes even if the caller is
    /// cancelled: a hold nobody receives is dropped, and so released exactly once; a place
    /// nobody keeps is left.
    pub(super) async fn attempt(
        &self,
        ask: Ask,
        place: Option<Arc<Place>>,
    ) -> Result<Attempt<Held>> {
        let queueing = place.is_some();
        if ask.claim.is_fresh() {
            let cancelled = OnCancel::new(|| self.abandon(ask, queueing));
            let result = self.run(ask, place).await;
            cancelled.disarm();
            return result;
        }
        let (tx, rx) = oneshot::channel();
        let this = self.clone();
        tokio::spawn(async move {
            let result = this.run(ask, place).await;
            if let Err(Err(err)) = tx.send(result)
                && err.is_lost_answer()
            {
                // The caller is gone: nobody else will clean up after a lost answer.
                this.abandon(ask, queueing);
            }
        });
        rx.await.map_err(|_| Error::Protocol {
            script: self.script(),
            detail: "the acquisition task stopped without an answer".into(),
        })?
    }

    /// An acquisition ends in an error (or is cancelled) after an attempt may have been granted,
    /// or queued, without its answer arriving: in the background, a new owner releases whatever
    /// it may hold, and a queued waiter leaves the queue (releasing a hold that a hand-over gave
    /// it); what does not exist is refused harmlessly. A carried owner's other holds are not
    /// touched.
    pub(super) fn abandon(&self, ask: Ask, queued: bool) {
        // A durable attempt goes on the durable connection, where it may wait behind calls
        // that wait for replicas: what gives it back goes on the shared connection, so only
        // once it has run (else it would find nothing, and the attempt then take what nobody
        // has).
        if let Some(want) = Want::of(self.durability)
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            let this = self.clone();
            runtime.spawn(async move {
                this.core.backend.after_durable(want).await;
                this.give_back(ask, queued);
            });
            return;
        }
        self.give_back(ask, queued);
    }

    /// What [`abandon`](Self::abandon) sends, at once.
    fn give_back(&self, ask: Ask, queued: bool) {
        let fresh = ask.claim.is_fresh();
        if fresh {
            let hold = self.hold(ask.op, ask.owner.as_field(), self.lease, Instant::now());
            drop(Lease::new(hold, self.core.tasks.clone()));
        }
        if queued {
            drop(queued::place(self, ask.op, ask.units, &ask.owner, fresh));
        }
    }

    /// A hold of `op` for `owner` (as stored in Redis), granted by a request sent at
    /// `sent_at`.
    pub(super) fn hold(&self, op: Op, owner: String, lease: Duration, sent_at: Instant) -> Hold {
        Hold::new(
            self.family,
            op,
            Arc::clone(&self.name),
            Arc::clone(&self.keys),
            owner,
            lease,
            self.renew,
            self.core.config.drift,
            sent_at,
        )
        .durable(Want::of(self.durability))
    }

    /// The granted hold of `ask` (its owner as stored in Redis: `owner`), with fencing token
    /// `fence`, registered with the watchdog; `value`, the string the grant left under the
    /// name's key, when it is all there is (see [`Hold::value`]).
    pub(super) fn held(
        &self,
        ask: Ask,
        owner: String,
        fence: u64,
        sent_at: Instant,
        value: Option<String>,
    ) -> Held {
        let hold = self
            .hold(ask.op, owner, self.lease, sent_at)
            .with_value(value)
            .owned(ask.claim.is_fresh());
        Held {
            owner: ask.owner,
            fence,
            block: fence,
            lease: Lease::new(hold, self.core.tasks.clone()),
            baton: None,
            since: Some(Instant::now()),
        }
    }

    /// The script an attempt runs, for error messages.
    fn script(&self) -> &'static str {
        if self.family.is_queued() {
            "queue_acquire"
        } else {
            "mutex_acquire"
        }
    }

    async fn run(&self, ask: Ask, place: Option<Arc<Place>>) -> Result<Attempt<Held>> {
        if self.family.is_queued() {
            return queued::run(self, ask, place).await;
        }
        if let Some(quorum) = self.core.backend.as_quorum() {
            return super::quorum::run(self, quorum, ask).await;
        }
        self.run_mutex(ask).await
    }

    /// One attempt at a plain mutex on one server or a cluster. A fresh owner's attempt at a
    /// name this client last saw free is first made in plain commands ([`Engine::take`]); if
    /// the lock was not free, or the fence key did not confirm the proposed token,
    /// `mutex_acquire` runs as for any attempt (with the same owner, whose hold it then finds
    /// and issues a new token). What an attempt finds is noted for the next one.
    async fn run_mutex(&self, ask: Ask) -> Result<Attempt<Held>> {
        let owner = ask.owner.as_field();
        let floor = self.core.backend.clock().now();
        let waiters = self.core.notifier.has_waiters(&self.keys.wake);
        if let Some(token) = self.proposal(ask, floor) {
            // The string a grant leaves when no waiter of this client marked it is what its
            // release compares and deletes.
            let value = mutex::value(token, waiters, &owner);
            let fence = Fence::Token {
                token,
                last: mutex::block_end(token, ask.tokens, floor.unwrap_or(0)),
            };
            if let Some(taken) = self.take(ask, &owner, value, !waiters, fence).await {
                return taken;
            }
        }
        let request = mutex::Acquire {
            keys: &self.keys,
            owner: &owner,
            lease_ms: lease_ms(self.lease)?,
            fence_ttl_ms: millis(FENCE_TTL),
            claim: ask.claim,
            floor: floor.unwrap_or(0),
            waiters,
            tokens: ask.tokens,
            request: ask.request_id(),
        };
        let sent_at = Instant::now();
        let (answer, acks) = self.send_noted(&request, ask, sent_at, true).await?;
        let Some(sent_at) = self.counted_from(ask, &owner, &answer, sent_at).await? else {
            return Ok(Attempt::Busy(None));
        };
        Ok(match answer {
            Answer::Granted { fence, last, .. } => {
                let value = (!waiters).then(|| mutex::value(fence, false, &owner));
                let mut held = self.held(ask, owner, fence, sent_at, value);
                held.block = last;
                Attempt::Acquired(Self::replicated(held, acks)?)
            }
            Answer::Busy { wait, .. } => Attempt::Busy(wait),
        })
    }

    /// Sends an acquire script's `request` for `ask` (sent at `sent_at`) and notes what its
    /// answer tells: the server clock a grant carries, and for the names this client saw free,
    /// a fresh owner's grant (its block of tokens; `free`: the grant shows nobody else held the
    /// name, as a plain mutex's does), or another holder (a busy answer, or an error: a state
    /// unknown).
    pub(super) async fn send_noted<R: Request<Reply = Answer>>(
        &self,
        request: &R,
        ask: Ask,
        sent_at: Instant,
        free: bool,
    ) -> Result<(Answer, Option<(u32, u32)>)> {
        let names = self.core.tasks.free();
        let (answer, acks) = self
            .send(request)
            .await
            .inspect_err(|_| names.taken(&self.keys.lock))?;
        match answer {
            Answer::Granted { clock, last, .. } => {
                if let Some(us) = clock {
                    self.core.backend.clock().heard(us, sent_at);
                }
                if ask.claim.is_fresh() {
                    names.granted(&self.keys.lock, last, free);
                }
            }
            Answer::Busy { last, .. } => names.busy(&self.keys.lock, last),
        }
        Ok((answer, acks))
    }

    /// The token an attempt proposes when it is first made in plain commands: a fresh owner's,
    /// without waiting for replicas, at a name this client last saw free (not an election's,
    /// whose leader's record lives in the queue state). The client's estimate of the server
    /// clock (`floor`), above the last token it issued there; 0 for a read hold, which takes
    /// none. `None`: the attempt runs its script.
    pub(super) fn proposal(&self, ask: Ask, floor: Option<u64>) -> Option<u64> {
        if ask.claim != Claim::New
            || self.durability != Durability::None
            || self.family == Family::Election
        {
            return None;
        }
        let last = self.core.tasks.free().last(&self.keys.lock)?;
        if ask.op == Op::Read {
            return Some(0);
        }
        floor.map(|floor| floor.max(last.saturating_add(1)))
    }

    /// Takes the idle name for `ask` in one round trip of plain commands (`take::Take`): the
    /// hold's string `value` (kept for its release when `keep`), the fence key asked as
    /// `fence` says. `Some` with the grant, or the error; `None` when the script must run: the
    /// name was busy (noted), the token was not confirmed (the script finds the hold and issues
    /// one), or the backend sends scripts only.
    pub(super) async fn take(
        &self,
        ask: Ask,
        owner: &str,
        value: String,
        keep: bool,
        fence: Fence,
    ) -> Option<Result<Attempt<Held>>> {
        let free = self.core.tasks.free();
        let lease_ms = match lease_ms(self.lease) {
            Ok(ms) => ms,
            Err(err) => return Some(Err(err)),
        };
        let absent = [self.keys.holders.as_str(), self.keys.queue.as_str()];
        let take = Take {
            key: &self.keys.lock,
            fence_key: &self.keys.fence,
            value: &value,
            lease_ms,
            fence,
            absent: if self.family.is_queued() {
                &absent
            } else {
                &[]
            },
        };
        let sent_at = Instant::now();
        match self.core.backend.run_commands(&take).await? {
            Ok(Taken::Unconfirmed) => None,
            Ok(Taken::Busy) => {
                free.taken(&self.keys.lock);
                None
            }
            Err(err) => {
                free.taken(&self.keys.lock);
                Some(Err(err))
            }
            Ok(Taken::Granted) if self.too_late(sent_at) => Some(Err(late_answer())),
            Ok(Taken::Granted) => {
                let (token, last) = match fence {
                    Fence::Token { token, last } => (token, last),
                    Fence::Read => (0, 0),
                };
                free.granted(&self.keys.lock, last, true);
                let value = keep.then_some(value);
                let mut held = self.held(ask, owner.to_owned(), token, sent_at, value);
                held.block = last;
                Some(Ok(Attempt::Acquired(held)))
            }
        }
    }

    /// When the lease of what `answer` (to a request for `ask` sent at `sent_at`) granted
    /// counts from: `sent_at`, or for a request sent again, whose grant may be the logged
    /// answer of its first run (its lease counting from a moment unknown here), the sending of
    /// a renewal of the owner's hold that confirmed it; `None` if that renewal found the hold
    /// gone (the grant ran out meanwhile: nothing is held, ask again). A grant that came after
    /// the lease it grants would have run out is [`late_answer`].
    pub(super) async fn counted_from(
        &self,
        ask: Ask,
        owner: &str,
        answer: &Answer,
        sent_at: Instant,
    ) -> Result<Option<Instant>> {
        if !matches!(answer, Answer::Granted { .. }) {
            return Ok(Some(sent_at));
        }
        if !ask.is_again() {
            if self.too_late(sent_at) {
                return Err(late_answer());
            }
            return Ok(Some(sent_at));
        }
        let renewed = Instant::now();
        let hold = self.hold(ask.op, owner.to_owned(), self.lease, renewed);
        let ms = millis(self.lease);
        let statuses = crate::lease::release::extend(self.core.tasks.backend(), &[(&hold, ms)])
            .await?
            .statuses;
        match statuses.first().copied().unwrap_or_default() {
            1 => Ok(Some(renewed)),
            status if status < 0 => Err(foreign(&self.keys.lock, status, self.family.layout())),
            _ => Ok(None),
        }
    }

    /// A grant to a request sent at `sent_at` came back after the lease it grants would have
    /// run out (as this process counts it): the hold cannot be used.
    pub(super) fn too_late(&self, sent_at: Instant) -> bool {
        Instant::now() >= after(sent_at, self.core.config.drift.validity(self.lease))
    }
}

/// What an attempt whose grant came too late fails with: as good as an answer lost, so the
/// wait asks again (which finds the hold and renews its lease) or, for a caller that does not
/// wait, the hold is given back.
pub(super) fn late_answer() -> Error {
    Error::Redis(crate::backend::timed_out(
        "the grant came after the lease it grants had run out",
    ))
}
