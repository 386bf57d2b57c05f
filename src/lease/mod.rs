//! Leases: the state of one hold ([`Hold`]), the guard-side handle that registers it with the
//! watchdog ([`Lease`]), what every guard carries ([`Held`]), the client's background tasks
//! ([`Tasks`]: the [`watchdog`] and the [`release`] queue) and the loss signal ([`Lost`]).
//!
//! This layer renews and releases holds through the protocol's operations, never through a
//! primitive: a hold knows its family and op, which say which script serves it.

pub(crate) mod cohort;
mod free;
mod quorum;
pub(crate) mod release;
mod view;
pub(crate) mod watchdog;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

pub(crate) use free::FreeNames;
pub use view::HoldView;

use crate::backend::{Backend, Want};
use crate::config::{Drift, lease_ms};
use crate::error::{Error, Result};
use crate::key::LockKeys;
use crate::protocol::{Family, Op, foreign};
use crate::time::after;
use crate::token::OwnerToken;
use cohort::{Baton, LetGo};
use watchdog::Watchdog;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// One hold of a lock, shared by its guard and the background tasks.
#[derive(Debug)]
pub(crate) struct Hold {
    pub(crate) id: u64,
    /// Which scripts serve it.
    pub(crate) family: Family,
    /// What it is: a mutex's or fair mutex's exclusive hold, a read or write hold, a permit, or
    /// (never renewed) a waiter's place in the queue.
    pub(crate) op: Op,
    pub(crate) name: Arc<str>,
    pub(crate) keys: Arc<LockKeys>,
    /// The owner token as stored in Redis (a capability: never logged); for a waiter's place,
    /// its queue member.
    pub(crate) owner: String,
    pub(crate) lease: Duration,
    /// Renewed by the watchdog (false for a fixed lease).
    pub(crate) renew: bool,
    /// What of a lease is not counted on.
    pub(crate) drift: Drift,
    /// Conservative local estimate of when the lease runs out: from just before the request
    /// that granted or last renewed it was sent, the lease less the drift allowance.
    expires_at: StdMutex<Instant>,
    /// A release handed this hold over: the watchdog renews it once even if its lease is
    /// fixed, and that renewal is also the waiter's answer (see `queue_lib.lua`).
    handed: AtomicBool,
    /// Its guard let it go (released, or handed to the release queue).
    ended: AtomicBool,
    /// The watchdog task took it into its schedule (a hold let go before the task saw it never
    /// enters it, and needs no word to leave it).
    watched: AtomicBool,
    /// Renewals count only once replicas acknowledged them (`None`: at once).
    pub(crate) durable: Option<Want>,
    /// The string the grant left under the name's key, when the hold is all that is there in
    /// that form (a plain mutex held once, no waiter marked): its release compares and deletes
    /// it before any library loads, and falls back to reading the lock when it changed.
    pub(crate) value: Option<String>,
    /// Lost: never to be held again.
    lost: AtomicBool,
    /// Lost at its deadline, not by an answer: renewals may have reached Redis with their
    /// answers lost, so Redis may hold it still.
    lapsed: AtomicBool,
    /// Its owner token is its own: made for its acquisition, and never read out nor re-entered
    /// ([`Held::share`]), so that no other hold can have that owner and a release of it frees
    /// no other. A hold lost at its deadline is released when let go only then.
    own: AtomicBool,
    /// Which of the guards it passes through (local hand-off) has it: 0 for the first, one
    /// more at each let-go of a guard that could pass it.
    turn: AtomicU64,
    /// The loss signal, made by the first caller that waits for it (most holds never are).
    signal: std::sync::OnceLock<watch::Sender<Status>>,
    /// The local waiters this hold passes between (local hand-off): told when it is lost.
    cohort: std::sync::OnceLock<std::sync::Weak<cohort::Cohort>>,
    /// Kept alive until the hold's release has run ([`keep`](Self::keep)).
    kept: StdMutex<Option<Kept>>,
}

/// What a hold keeps alive until it is gone.
struct Kept(#[allow(dead_code)] Box<dyn Send + Sync>);

impl std::fmt::Debug for Kept {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Kept")
    }
}

impl Hold {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        family: Family,
        op: Op,
        name: Arc<str>,
        keys: Arc<LockKeys>,
        owner: String,
        lease: Duration,
        renew: bool,
        drift: Drift,
        sent_at: Instant,
    ) -> Self {
        Self {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            family,
            op,
            name,
            keys,
            owner,
            lease,
            renew,
            drift,
            expires_at: StdMutex::new(after(sent_at, drift.validity(lease))),
            handed: AtomicBool::new(false),
            ended: AtomicBool::new(false),
            watched: AtomicBool::new(false),
            durable: None,
            value: None,
            lost: AtomicBool::new(false),
            lapsed: AtomicBool::new(false),
            own: AtomicBool::new(false),
            turn: AtomicU64::new(0),
            signal: std::sync::OnceLock::new(),
            cohort: std::sync::OnceLock::new(),
            kept: StdMutex::new(None),
        }
    }

    /// Renewals that count only once replicas acknowledged them as `want` says.
    pub(crate) fn durable(mut self, want: Option<Want>) -> Self {
        self.durable = want;
        self
    }

    /// The string its grant left under the name's key (see [`Hold::value`]).
    pub(crate) fn with_value(mut self, value: Option<String>) -> Self {
        self.value = value;
        self
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }

    /// Marks the hold lost. It never becomes held again.
    pub(crate) fn mark_lost(&self) {
        let first = !self.lost.swap(true, Ordering::SeqCst);
        if first {
            self.signal_status();
        }
        if first && !self.is_ended() {
            crate::meter::lost(self.family.label());
        }
        if first && let Some(cohort) = self.cohort.get().and_then(std::sync::Weak::upgrade) {
            cohort.lost(self);
        }
    }

    /// Marks the hold lost at its deadline, with no answer from Redis saying it is gone: Redis
    /// may hold it still (renewals that reached it, their answers lost), so its guard's drop
    /// still releases it if its owner is its own (a release finds the hold by its owner: one
    /// carried to another acquisition could have taken the name again since, and would lose
    /// that hold).
    pub(crate) fn mark_lapsed(&self) {
        self.lapsed.store(true, Ordering::SeqCst);
        self.mark_lost();
    }

    /// Its owner token was made for its acquisition (`own`: see [`Hold::own`]).
    pub(crate) fn owned(self, own: bool) -> Self {
        self.own.store(own, Ordering::SeqCst);
        self
    }

    /// Whether its guard's drop releases it: it is not lost, or lost only at its deadline
    /// (Redis may hold it still) with an owner token of its own.
    fn may_remain(&self) -> bool {
        !self.is_lost() || (self.lapsed.load(Ordering::SeqCst) && self.own.load(Ordering::SeqCst))
    }

    /// Which guard has the hold now: 0 for the first, one more at each let-go of a guard that
    /// could pass it.
    pub(crate) fn turn(&self) -> u64 {
        self.turn.load(Ordering::SeqCst)
    }

    /// The guard that had the hold lets go of it, and may pass it to another (local
    /// hand-off): its views say not held from now on, and their loss futures complete.
    pub(crate) fn next_turn(&self) {
        self.turn.fetch_add(1, Ordering::SeqCst);
        self.signal_status();
    }

    fn status(&self) -> Status {
        Status {
            lost: self.is_lost(),
            turn: self.turn(),
        }
    }

    /// Sends the loss and the turn on the signal, if one was made. Pairs with the fence in
    /// [`Hold::lost_signal`]: either this finds the signal, or that finds the change. Both
    /// only ever grow, so sends that cross are merged, never undone.
    fn signal_status(&self) {
        std::sync::atomic::fence(Ordering::SeqCst);
        if let Some(signal) = self.signal.get() {
            let now = self.status();
            signal.send_if_modified(|s| s.merge(now));
        }
    }

    /// The loss signal: the hold's [`Status`], which says when it is lost and when its turn
    /// moves on.
    pub(crate) fn lost_signal(&self) -> watch::Receiver<Status> {
        let signal = self
            .signal
            .get_or_init(|| watch::Sender::new(self.status()));
        // A loss marked (or a turn ended) while the signal was being made may have found
        // none to send on: with a fence on both sides, either `signal_status` finds the
        // signal or this finds the change.
        std::sync::atomic::fence(Ordering::SeqCst);
        let now = self.status();
        signal.send_if_modified(|s| s.merge(now));
        signal.subscribe()
    }

    /// Its guard let it go: it is being released, or is released.
    pub(crate) fn is_ended(&self) -> bool {
        self.ended.load(Ordering::SeqCst)
    }

    /// Its guard lets it go: the watchdog stops watching it.
    fn end(&self, watchdog: &Watchdog) {
        self.ended.store(true, Ordering::SeqCst);
        // Either the task sees `ended` after taking the hold in (and drops it), or this sees
        // `watched` (and tells it): with both orders sequentially consistent, never neither.
        if self.watched.load(Ordering::SeqCst) {
            watchdog.forget(self.id);
        }
    }

    /// A release handed this hold over.
    pub(crate) fn is_handed(&self) -> bool {
        self.handed.load(Ordering::Relaxed)
    }

    pub(crate) fn expires_at(&self) -> Instant {
        *self.expires_at.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Not lost, not let go, and its lease has not run out as far as this process knows.
    pub(crate) fn is_live(&self) -> bool {
        !self.is_ended() && !self.is_lost() && Instant::now() < self.expires_at()
    }

    /// Keeps `value` alive until the background release of this hold's dropped lease has run
    /// (or given up); dropped at once if the lease is dropped without one (lost, or the client
    /// shutting down).
    pub(crate) fn keep(&self, value: Box<dyn Send + Sync>) {
        *self.kept.lock().unwrap_or_else(|p| p.into_inner()) = Some(Kept(value));
    }

    /// Drops what [`keep`](Self::keep) kept.
    fn let_kept_go(&self) {
        let kept = self.kept.lock().unwrap_or_else(|p| p.into_inner()).take();
        drop(kept);
    }

    /// A release handed this hold over, for a first term ending at `at` (never later than the
    /// lease would): the watchdog renews it in time, once at least.
    pub(crate) fn handed_until(&self, at: Instant) {
        let mut current = self.expires_at.lock().unwrap_or_else(|p| p.into_inner());
        *current = at.min(*current);
        self.handed.store(true, Ordering::Relaxed);
    }

    /// Redis confirmed, for a request sent at `sent_at`, that the lease runs at least `lease`.
    pub(crate) fn confirm(&self, sent_at: Instant, lease: Duration) {
        let mut at = self.expires_at.lock().unwrap_or_else(|p| p.into_inner());
        *at = (*at).max(after(sent_at, self.drift.validity(lease)));
    }
}

/// What a hold's loss signal says: whether it is lost, and which guard has it (its turn).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Status {
    lost: bool,
    turn: u64,
}

impl Status {
    /// Takes in `now`; true if that changed anything.
    fn merge(&mut self, now: Status) -> bool {
        let merged = Status {
            lost: self.lost || now.lost,
            turn: self.turn.max(now.turn),
        };
        std::mem::replace(self, merged) != merged
    }

    /// Whether the guard of turn `turn` holds no more: the hold is lost, or passed on.
    fn over_for(&self, turn: u64) -> bool {
        self.lost || self.turn != turn
    }
}

/// Handles on the client's background tasks and the backend they use, shared by the client's
/// handles and every guard. When the last one goes, the watchdog stops and the release queue
/// ends once it is drained.
#[derive(Debug, Clone)]
pub(crate) struct Tasks(Arc<TasksInner>);

#[derive(Debug)]
struct TasksInner {
    backend: Arc<Backend>,
    watchdog: Arc<Watchdog>,
    releases: mpsc::UnboundedSender<Arc<Hold>>,
    free: Arc<FreeNames>,
}

impl Drop for TasksInner {
    fn drop(&mut self) {
        self.watchdog.stop();
    }
}

impl Tasks {
    /// Starts the watchdog and the release queue on the current runtime.
    pub(crate) fn spawn(backend: Arc<Backend>) -> Self {
        let free = Arc::new(FreeNames::default());
        let watchdog = Watchdog::spawn(Arc::clone(&backend));
        let releases = release::spawn(Arc::clone(&backend), Arc::clone(&free));
        Self(Arc::new(TasksInner {
            backend,
            watchdog,
            releases,
            free,
        }))
    }

    pub(crate) fn backend(&self) -> &Backend {
        &self.0.backend
    }

    /// The names this client last saw free.
    pub(crate) fn free(&self) -> &FreeNames {
        &self.0.free
    }
}

/// A live hold: registered with the watchdog, released in the background when dropped.
#[derive(Debug)]
pub(crate) struct Lease {
    hold: Arc<Hold>,
    tasks: Tasks,
    armed: bool,
}

impl Lease {
    pub(crate) fn new(hold: Hold, tasks: Tasks) -> Self {
        let hold = Arc::new(hold);
        tasks.0.watchdog.watch(Arc::clone(&hold));
        Self {
            hold,
            tasks,
            armed: true,
        }
    }

    pub(crate) fn hold(&self) -> &Arc<Hold> {
        &self.hold
    }

    /// The same hold in a lease of its own, for the next local holder (local hand-off): this
    /// one no longer releases it, and the watchdog goes on renewing it.
    pub(crate) fn relay(&mut self) -> Lease {
        let armed = std::mem::replace(&mut self.armed, false);
        Lease {
            hold: Arc::clone(&self.hold),
            tasks: self.tasks.clone(),
            armed,
        }
    }

    /// Stops watching and hands the hold to the caller, who releases it (or knows Redis let it
    /// go already).
    pub(crate) fn disarm(mut self) -> Arc<Hold> {
        self.end()
    }

    /// As [`disarm`](Self::disarm), in place.
    fn end(&mut self) -> Arc<Hold> {
        self.armed = false;
        self.hold.end(&self.tasks.0.watchdog);
        Arc::clone(&self.hold)
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.armed {
            self.hold.end(&self.tasks.0.watchdog);
            // If the release queue is gone the client is shutting down; the lease then simply
            // runs out.
            if self.hold.may_remain() && self.tasks.0.releases.send(Arc::clone(&self.hold)).is_ok()
            {
                return;
            }
            // No release will run.
            self.hold.let_kept_go();
        }
    }
}

/// What every guard carries: its owner, fencing token and lease. The public guards wrap it and
/// add what is particular to their primitive.
#[derive(Debug)]
pub(crate) struct Held {
    pub(crate) owner: OwnerToken,
    pub(crate) fence: u64,
    /// The last fencing token reserved with the hold: `fence`, or more for the passes of local
    /// hand-off (a plain mutex's block).
    pub(crate) block: u64,
    pub(crate) lease: Lease,
    /// A plain mutex's hold that may pass to another task of this client when let go.
    pub(crate) baton: Option<Baton>,
    /// When its guard got it (for the metrics); `None` for one never given to a guard.
    pub(crate) since: Option<Instant>,
}

/// A hold let go: passed to the next local waiter, or released in the background, after which
/// the next local waiter (if any) takes the lock in Redis.
impl Drop for Held {
    fn drop(&mut self) {
        if let Some(since) = self.since {
            crate::meter::let_go(self.hold().family.label(), since.elapsed());
        }
        if let LetGo::Release(Some(successor)) = cohort::let_go(self) {
            // The new leader releases the hold first: then it knows whether waiters elsewhere
            // were woken, and gives them a head start.
            successor.lead(Some(self.lease.relay()), true);
        }
    }
}

impl Held {
    pub(crate) fn hold(&self) -> &Arc<Hold> {
        self.lease.hold()
    }

    pub(crate) fn name(&self) -> &str {
        &self.hold().name
    }

    pub(crate) fn is_held(&self) -> bool {
        let hold = self.hold();
        !hold.is_lost() && Instant::now() < hold.expires_at()
    }

    pub(crate) fn lost(&self) -> Lost {
        Lost::from_signal(self.hold().lost_signal(), self.hold().turn())
    }

    pub(crate) fn valid_until(&self) -> std::time::Instant {
        self.hold().expires_at().into_std()
    }

    pub(crate) fn view(&self) -> HoldView {
        HoldView::new(self.hold(), self.fence)
    }

    pub(crate) fn not_held(&self) -> Error {
        Error::NotHeld {
            name: self.hold().name.to_string(),
        }
    }

    /// Makes the remaining lease at least `lease` from now. A durable hold's extension that
    /// fewer replicas acknowledged than wanted fails with [`Error::NotReplicated`] and leaves
    /// the hold's deadline where it was.
    pub(crate) async fn extend(&self, lease: Duration) -> Result<()> {
        let ms = lease_ms(lease)?;
        let hold = self.hold();
        if hold.is_lost() {
            return Err(self.not_held());
        }
        let sent_at = Instant::now();
        let renewed = release::extend(self.lease.tasks.backend(), &[(hold, ms)]).await?;
        let status = renewed.statuses.first().copied().unwrap_or_default();
        match status {
            // Lost meanwhile (its deadline passed while the call was out): the guard stays
            // lost, and says so.
            1 if hold.is_lost() => Err(self.not_held()),
            1 => {
                // Whole milliseconds, as Redis took it.
                hold.confirm(sent_at, Duration::from_millis(ms));
                Ok(())
            }
            release::UNREPLICATED => {
                let (acked, wanted) = renewed.shortfall.unwrap_or_default();
                Err(Error::NotReplicated { acked, wanted })
            }
            0 => {
                hold.mark_lost();
                Err(self.not_held())
            }
            status => Err(foreign(&hold.keys.lock, status, hold.family.layout())),
        }
    }

    /// The owner token may be used elsewhere (it was read, or re-entered): the hold is not
    /// passed to another local owner any more, nor released once lost at its deadline.
    pub(crate) fn share(&self) {
        self.hold().own.store(false, Ordering::SeqCst);
        if let Some(baton) = &self.baton {
            baton.share();
        }
    }

    /// Releases this hold now, instead of in the background on drop; or passes it to the next
    /// local waiter (local hand-off).
    pub(crate) async fn release(mut self) -> Result<()> {
        // Told its turn after the release, or, if this future is dropped before, when it is.
        let successor = match cohort::let_go(&mut self) {
            LetGo::Passed => return Ok(()),
            LetGo::Plain => None,
            LetGo::Release(successor) => successor,
        };
        let hold = self.lease.end();
        let tasks = &self.lease.tasks;
        let released = if hold.may_remain() {
            release::release(tasks.backend(), tasks.free(), &hold).await
        } else {
            // Lost, with an owner token that may be in use elsewhere (read out or re-entered):
            // a release would end another holder's hold of that owner, as a drop does not.
            Err(Error::NotHeld {
                name: hold.name.to_string(),
            })
        };
        if let Some(successor) = successor {
            successor.lead(None, matches!(released, Ok(true)));
        }
        released.map(drop)
    }
}

/// A future that completes when a guard's lease is known lost. Made by a guard's `lost()`; it
/// does not borrow the guard, so it can race the guarded work.
///
/// ```no_run
/// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
/// let guard = client.mutex("a")?.lock().await?;
/// let lost: redlatch::Lost = guard.lost();
/// tokio::spawn(async move {
///     lost.await;
///     eprintln!("lease lost");
/// });
/// # Ok(()) }
/// ```
#[must_use = "futures do nothing unless polled"]
pub struct Lost {
    inner: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'static>>,
}

impl Lost {
    /// A `Lost` that completes at once: for a hold that is already over.
    pub(crate) fn ended() -> Self {
        Self {
            inner: Box::pin(std::future::ready(())),
        }
    }

    /// Completes when `signal` says lost or passed on from turn `turn`, or when its hold is
    /// gone.
    pub(crate) fn from_signal(mut signal: watch::Receiver<Status>, turn: u64) -> Self {
        Self {
            inner: Box::pin(async move {
                // The sender lives as long as the hold; if it is gone, so is the hold.
                let _ = signal.wait_for(|s| s.over_for(turn)).await;
            }),
        }
    }
}

impl std::fmt::Debug for Lost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lost").finish_non_exhaustive()
    }
}

impl std::future::Future for Lost {
    type Output = ();

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        self.inner.as_mut().poll(cx)
    }
}
