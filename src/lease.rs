//! Leases: the state of one hold, the guard-side handle that registers it with the watchdog
//! (`crate::watchdog`), and the queue that releases dropped holds.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::backend::Node;
use crate::client::LockClient;
use crate::config::lease_ms;
use crate::error::{Error, Result};
use crate::key::LockKeys;
use crate::scripts::{FAIR_LAYOUT, MUTEX_LAYOUT, RWLOCK_LAYOUT, SEMAPHORE_LAYOUT, foreign};
use crate::time::after;
use crate::token::OwnerToken;
use crate::watchdog::Watchdog;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Which primitive a hold belongs to, and so which scripts renew and release it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A plain [`Mutex`](crate::Mutex) hold: the `mutex_*` scripts.
    Mutex,
    /// A hold, or a waiter's place in the queue, of a primitive run by the `queue_*` scripts.
    Queued(Family, Op),
}

impl Kind {
    /// The layout tag the kind's scripts read and write.
    pub(crate) fn layout(self) -> &'static str {
        match self {
            Self::Mutex => MUTEX_LAYOUT,
            Self::Queued(family, _) => family.layout(),
        }
    }
}

/// The primitives the queue scripts run; each stores its own layout tag, so one name cannot be
/// used as two kinds at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Family {
    Fair,
    Semaphore,
    RwLock,
}

impl Family {
    pub(crate) fn layout(self) -> &'static str {
        match self {
            Self::Fair => FAIR_LAYOUT,
            Self::Semaphore => SEMAPHORE_LAYOUT,
            Self::RwLock => RWLOCK_LAYOUT,
        }
    }
}

/// What a queued hold is: the `op` argument of the queue scripts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    /// The fair mutex's only mode.
    Exclusive,
    Read,
    Write,
    /// One permit id holding one or more permits.
    Permits,
    /// Not a hold: a waiter's place in the queue (never renewed: it has no deadline). `fresh` when
    /// the owner was made for this wait: leaving then also gives back a hold that a hand-over
    /// may already have given it.
    Waiting {
        fresh: bool,
    },
}

impl Op {
    pub(crate) fn code(self) -> &'static str {
        match self {
            Self::Exclusive => "x",
            Self::Read => "r",
            Self::Write => "w",
            Self::Permits => "s",
            Self::Waiting { fresh: false } => "q",
            Self::Waiting { fresh: true } => "Q",
        }
    }
}

/// One hold of a lock, shared by its guard and the background tasks.
#[derive(Debug)]
pub(crate) struct Hold {
    pub(crate) id: u64,
    pub(crate) kind: Kind,
    pub(crate) name: Arc<str>,
    pub(crate) keys: Arc<LockKeys>,
    /// The owner token as stored in Redis (a capability: never logged).
    pub(crate) owner: String,
    pub(crate) lease: Duration,
    /// Renewed by the watchdog (false for a fixed lease).
    pub(crate) renew: bool,
    /// Conservative local estimate of when the lease runs out.
    expires_at: StdMutex<Instant>,
    /// A release handed this hold over: the watchdog renews it once even if its lease is
    /// fixed, and that renewal is also the waiter's answer (see `queue_lib.lua`).
    handed: AtomicBool,
    /// Its guard let it go (released, or handed to the release queue).
    ended: AtomicBool,
    lost: watch::Sender<bool>,
}

impl Hold {
    pub(crate) fn new(
        kind: Kind,
        name: Arc<str>,
        keys: Arc<LockKeys>,
        owner: String,
        lease: Duration,
        renew: bool,
        sent_at: Instant,
    ) -> Self {
        Self {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            kind,
            name,
            keys,
            owner,
            lease,
            renew,
            expires_at: StdMutex::new(after(sent_at, lease)),
            handed: AtomicBool::new(false),
            ended: AtomicBool::new(false),
            lost: watch::Sender::new(false),
        }
    }

    pub(crate) fn is_lost(&self) -> bool {
        *self.lost.borrow()
    }

    /// Marks the hold lost. It never becomes held again.
    pub(crate) fn mark_lost(&self) {
        self.lost
            .send_if_modified(|lost| !std::mem::replace(lost, true));
    }

    pub(crate) fn lost_signal(&self) -> watch::Receiver<bool> {
        self.lost.subscribe()
    }

    /// Its guard let it go: it is being released, or is released.
    #[cfg(feature = "tower")]
    pub(crate) fn is_ended(&self) -> bool {
        self.ended.load(Ordering::Relaxed)
    }

    /// A release handed this hold over.
    pub(crate) fn is_handed(&self) -> bool {
        self.handed.load(Ordering::Relaxed)
    }

    pub(crate) fn expires_at(&self) -> Instant {
        *self.expires_at.lock().unwrap_or_else(|p| p.into_inner())
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
        *at = (*at).max(after(sent_at, lease));
    }
}

/// Handles on the client's background tasks, shared by the client and every guard. When the
/// last one goes, the watchdog stops and the release queue ends once it is drained.
#[derive(Debug, Clone)]
pub(crate) struct Tasks(Arc<TasksInner>);

#[derive(Debug)]
struct TasksInner {
    watchdog: Arc<Watchdog>,
    releases: mpsc::UnboundedSender<Arc<Hold>>,
}

impl Drop for TasksInner {
    fn drop(&mut self) {
        self.watchdog.stop();
    }
}

impl Tasks {
    /// Starts the watchdog and the release queue on the current runtime.
    pub(crate) fn spawn(node: Arc<Node>) -> Self {
        let watchdog = Watchdog::spawn(Arc::clone(&node));
        let (releases, rx) = mpsc::unbounded_channel();
        tokio::spawn(release_task(node, rx));
        Self(Arc::new(TasksInner { watchdog, releases }))
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

    /// Stops watching and hands the hold to the caller, who releases it.
    pub(crate) fn disarm(mut self) -> Arc<Hold> {
        self.armed = false;
        self.hold.ended.store(true, Ordering::Relaxed);
        self.tasks.0.watchdog.forget(self.hold.id);
        Arc::clone(&self.hold)
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.armed {
            self.hold.ended.store(true, Ordering::Relaxed);
            self.tasks.0.watchdog.forget(self.hold.id);
            if !self.hold.is_lost() {
                // If the release queue is gone the client is shutting down; the lease then
                // simply runs out.
                let _ = self.tasks.0.releases.send(Arc::clone(&self.hold));
            }
        }
    }
}

async fn release_task(node: Arc<Node>, mut jobs: mpsc::UnboundedReceiver<Arc<Hold>>) {
    while let Some(hold) = jobs.recv().await {
        let node = Arc::clone(&node);
        tokio::spawn(async move {
            for attempt in 0..3u32 {
                match release(&node, &hold).await {
                    Ok(_) => return,
                    Err(crate::Error::Pool(err)) => {
                        tracing::debug!(lock = %hold.name, attempt, error = %err, "release waits for a connection");
                        tokio::time::sleep(Duration::from_millis(20 << attempt)).await;
                    }
                    Err(Error::NotHeld { .. }) => {
                        tracing::debug!(lock = %hold.name, "nothing to release: the hold or queue place was already gone");
                        return;
                    }
                    Err(err) => {
                        tracing::warn!(lock = %hold.name, error = %err, "background release failed; the lease will run out");
                        return;
                    }
                }
            }
        });
    }
}

/// Releases one hold of `hold.owner` (or its place in a queue) with the script of its kind.
pub(crate) async fn release(node: &Node, hold: &Hold) -> Result<()> {
    match hold.kind {
        Kind::Mutex => crate::mutex::release(node, hold).await,
        Kind::Queued(..) => crate::queue::release(node, hold).await,
    }
}

/// Renews holds, each to at least its given lease in ms, one script call per kind of script.
/// One status per item: `1` renewed, `0` not held any more, negative for foreign data.
pub(crate) async fn extend(node: &Node, items: &[(&Hold, u64)]) -> Result<Vec<i64>> {
    let (mutex, queued): (Vec<usize>, Vec<usize>) =
        (0..items.len()).partition(|&i| items[i].0.kind == Kind::Mutex);
    let mut out = vec![0; items.len()];
    for (group, is_mutex) in [(mutex, true), (queued, false)] {
        if group.is_empty() {
            continue;
        }
        let part: Vec<(&Hold, u64)> = group.iter().map(|&i| items[i]).collect();
        let statuses = if is_mutex {
            crate::mutex::extend_batch(node, &part).await?
        } else {
            crate::queue::extend_batch(node, &part).await?
        };
        for (i, status) in group.into_iter().zip(statuses) {
            out[i] = status;
        }
    }
    Ok(out)
}

/// What every guard carries: its client, owner, fencing token and lease. The public guards wrap
/// it and add what is particular to their primitive.
#[derive(Debug)]
pub(crate) struct Held {
    pub(crate) client: LockClient,
    pub(crate) owner: OwnerToken,
    pub(crate) fence: u64,
    pub(crate) lease: Lease,
}

impl Held {
    pub(crate) fn hold(&self) -> &Arc<Hold> {
        self.lease.hold()
    }

    pub(crate) fn is_held(&self) -> bool {
        let hold = self.hold();
        !hold.is_lost() && Instant::now() < hold.expires_at()
    }

    pub(crate) fn lost(&self) -> Lost {
        Lost::new(self.hold())
    }

    pub(crate) fn not_held(&self) -> Error {
        Error::NotHeld {
            name: self.hold().name.to_string(),
        }
    }

    /// Makes the remaining lease at least `lease` from now.
    pub(crate) async fn extend(&self, lease: Duration) -> Result<()> {
        let ms = lease_ms(lease)?;
        let hold = self.hold();
        if hold.is_lost() {
            return Err(self.not_held());
        }
        let sent_at = Instant::now();
        let status = extend(&self.client.inner.node, &[(hold, ms)])
            .await?
            .pop()
            .unwrap_or_default();
        match status {
            1 => {
                hold.confirm(sent_at, lease);
                Ok(())
            }
            0 => {
                hold.mark_lost();
                Err(self.not_held())
            }
            status => Err(foreign(&hold.keys.lock, status, hold.kind.layout())),
        }
    }

    /// Releases this hold now, instead of in the background on drop.
    pub(crate) async fn release(self) -> Result<()> {
        let Self { client, lease, .. } = self;
        let hold = lease.disarm();
        release(&client.inner.node, &hold).await
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
    pub(crate) fn new(hold: &Hold) -> Self {
        Self::from_signal(hold.lost_signal())
    }

    /// Completes when `signal` says lost, or when its hold is gone.
    pub(crate) fn from_signal(mut signal: watch::Receiver<bool>) -> Self {
        Self {
            inner: Box::pin(async move {
                // The sender lives as long as the hold; if it is gone, so is the hold.
                let _ = signal.wait_for(|lost| *lost).await;
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
