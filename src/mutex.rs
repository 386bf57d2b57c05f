//! [`Mutex`]: a reentrant lock with a hold count per owner, and its guard.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::backend::Node;
use crate::client::LockClient;
use crate::config::{FENCE_TTL, lease_ms, millis};
use crate::error::{Error, Result};
use crate::fair::FairMutex;
use crate::key::LockKeys;
use crate::lease::{Held, Hold, Kind, Lease, Lost};
use crate::scripts::{MUTEX_ACQUIRE, MUTEX_EXTEND, MUTEX_LAYOUT, MUTEX_RELEASE, Reply, statuses};
use crate::token::OwnerToken;
use crate::wait::{Attempt, Claim, OnCancel, Queueing, noting_lost_answers, wait_for};

/// A distributed, reentrant mutual-exclusion lock, named in Redis.
///
/// Made by [`LockClient::mutex`]. The handle is cheap to clone and holds no lock itself; each
/// successful acquisition returns a [`MutexGuard`], which proves ownership until it is unlocked
/// or dropped.
///
/// * **Ownership** belongs to an [`OwnerToken`]. Each [`lock`](Self::lock) makes a new owner,
///   so two calls never share a hold by accident. Re-entering is explicit:
///   [`MutexGuard::reenter`], or [`lock_as`](Self::lock_as) with a token carried from
///   elsewhere (another task, another process). The lock is free only when every hold of its
///   owner is released.
/// * **Leases**: every hold has one (30 s by default). The client's watchdog renews it every
///   third of the lease while the guard lives; [`with_lease`](Self::with_lease) gives a fixed
///   lease that the watchdog leaves alone. A crashed holder's lock frees itself when its lease
///   runs out.
/// * **Fencing**: every fresh acquisition gets a [`fencing_token`](MutexGuard::fencing_token)
///   above all earlier ones for this name, so a storage system can refuse writes from a holder
///   whose lease has run out.
/// * **Waiting** is by push: a release wakes one waiting task per client at once (about one
///   round trip), and local waiters are served oldest first.
///
/// ```no_run
/// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
/// let mutex = client.mutex("invoice:7")?;
/// let guard = mutex.lock().await?;
/// // Pass the fencing token to the storage you write to.
/// let token = guard.fencing_token();
/// # let _ = token;
/// guard.unlock().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Mutex {
    client: LockClient,
    name: Arc<str>,
    keys: Arc<LockKeys>,
    lease: Duration,
    renew: bool,
}

impl fmt::Debug for Mutex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mutex")
            .field("name", &self.name)
            .field("lease", &self.lease)
            .field("watchdog", &self.renew)
            .finish()
    }
}

impl Mutex {
    pub(crate) fn new(client: LockClient, name: &str) -> Result<Self> {
        let config = &client.inner.config;
        let keys = LockKeys::new(&config.prefix, name)?;
        Ok(Self {
            lease: config.lease,
            renew: config.watchdog,
            name: name.into(),
            keys: Arc::new(keys),
            client,
        })
    }

    /// The lock's name.
    ///
    /// ```no_run
    /// # fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// assert_eq!(client.mutex("a")?.name(), "a");
    /// # Ok(()) }
    /// ```
    pub fn name(&self) -> &str {
        &self.name
    }

    /// This handle with a fixed lease: guards it acquires hold the lock for `lease` from the
    /// acquisition, and the watchdog does not renew them (call
    /// [`MutexGuard::extend`] to lengthen one).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if `lease` is outside
    /// [`MIN_LEASE`](crate::MIN_LEASE)..=[`MAX_LEASE`](crate::MAX_LEASE).
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// use std::time::Duration;
    ///
    /// let guard = client.mutex("report")?.with_lease(Duration::from_secs(5))?.lock().await?;
    /// # Ok(()) }
    /// ```
    pub fn with_lease(mut self, lease: Duration) -> Result<Self> {
        lease_ms(lease)?;
        self.lease = lease;
        self.renew = false;
        Ok(self)
    }

    /// Acquires the lock as a new owner, waiting as long as it takes.
    ///
    /// # Errors
    ///
    /// [`Error::Pool`] or [`Error::Redis`] if Redis cannot be reached, [`Error::WrongType`] or
    /// [`Error::Layout`] if the lock's keys hold data redlatch does not own.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe. Dropping the future gives up the wait; if an acquisition was already on its
    /// way to Redis, it completes in the background and is released at once, so a cancelled
    /// `lock` never leaves the lock held for longer than one round trip.
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// let guard = client.mutex("a")?.lock().await?;
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "redlatch.lock", skip_all, fields(lock = %self.name))]
    pub async fn lock(&self) -> Result<MutexGuard> {
        self.acquire(OwnerToken::new(), Claim::New, None).await
    }

    /// As [`lock`](Self::lock), giving up with [`Error::Timeout`] after `timeout`.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when the time runs out, and as [`lock`](Self::lock).
    ///
    /// # Cancel safety
    ///
    /// As [`lock`](Self::lock).
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// use std::time::Duration;
    ///
    /// match client.mutex("a")?.lock_timeout(Duration::from_millis(200)).await {
    ///     Ok(guard) => guard.unlock().await?,
    ///     Err(redlatch::Error::Timeout { .. }) => println!("busy, try later"),
    ///     Err(other) => return Err(other),
    /// }
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "redlatch.lock", skip_all, fields(lock = %self.name))]
    pub async fn lock_timeout(&self, timeout: Duration) -> Result<MutexGuard> {
        self.acquire(OwnerToken::new(), Claim::New, Some(timeout))
            .await
    }

    /// Acquires the lock if it is free, in one round trip. `Ok(None)` means another owner holds
    /// it: busy is not an error.
    ///
    /// # Errors
    ///
    /// As [`lock`](Self::lock).
    ///
    /// # Cancel safety
    ///
    /// As [`lock`](Self::lock).
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// if let Some(guard) = client.mutex("a")?.try_lock().await? {
    ///     guard.unlock().await?;
    /// }
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "redlatch.try_lock", skip_all, fields(lock = %self.name))]
    pub async fn try_lock(&self) -> Result<Option<MutexGuard>> {
        Ok(self
            .try_attempt(OwnerToken::new(), Claim::New)
            .await?
            .acquired())
    }

    /// Acquires the lock for `owner`, waiting as long as it takes. If `owner` already holds it
    /// (in this process or another), this adds one hold at once; the lock is free again only
    /// when every hold is released.
    ///
    /// The token is a capability: pass it only to code you trust to hold this lock.
    ///
    /// # Errors
    ///
    /// As [`lock`](Self::lock).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: an acquisition that reaches Redis after the future was dropped is released
    /// again, so the owner's hold count is what it was.
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient, header: &str) -> redlatch::Result<()> {
    /// // `header` came from the caller that holds the lock.
    /// let owner: redlatch::OwnerToken = header.parse()?;
    /// let nested = client.mutex("a")?.lock_as(&owner).await?;
    /// nested.unlock().await?; // the caller still holds the lock
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "redlatch.lock", skip_all, fields(lock = %self.name))]
    pub async fn lock_as(&self, owner: &OwnerToken) -> Result<MutexGuard> {
        self.acquire(*owner, Claim::As, None).await
    }

    /// As [`lock_as`](Self::lock_as), without waiting: `Ok(None)` if another owner holds it.
    ///
    /// # Errors
    ///
    /// As [`lock`](Self::lock).
    ///
    /// # Cancel safety
    ///
    /// As [`lock_as`](Self::lock_as).
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient, owner: redlatch::OwnerToken) -> redlatch::Result<()> {
    /// let maybe = client.mutex("a")?.try_lock_as(&owner).await?;
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "redlatch.try_lock", skip_all, fields(lock = %self.name))]
    pub async fn try_lock_as(&self, owner: &OwnerToken) -> Result<Option<MutexGuard>> {
        Ok(self.try_attempt(*owner, Claim::As).await?.acquired())
    }

    /// One attempt without waiting. Busy carries the holder's remaining lease. A new owner's
    /// attempt whose answer was lost is released in the background.
    pub(crate) async fn try_attempt(
        &self,
        owner: OwnerToken,
        claim: Claim,
    ) -> Result<Attempt<MutexGuard>> {
        let attempt = self.attempt(owner, claim).await;
        match attempt {
            Err(err) if err.is_lost_answer() => self.abandon_on_error(owner, claim, Err(err)),
            other => other,
        }
    }

    async fn acquire(
        &self,
        owner: OwnerToken,
        claim: Claim,
        timeout: Option<Duration>,
    ) -> Result<MutexGuard> {
        let inner = &self.client.inner;
        let unanswered = AtomicBool::new(false);
        let result = wait_for(
            &inner.node,
            &inner.config,
            &self.keys.wake,
            Queueing::Local,
            timeout,
            || noting_lost_answers(&unanswered, self.attempt(owner, claim)),
            // Mutex releases name no waiter, so they never hand a hold over.
            |_, _| {
                Err(Error::Protocol {
                    script: "mutex_release",
                    detail: "a hand-over message on a mutex channel".into(),
                })
            },
        )
        .await;
        if unanswered.load(Ordering::Relaxed) {
            self.abandon_on_error(owner, claim, result)
        } else {
            result
        }
    }

    /// One acquisition attempt, cancel safe. A new owner's attempt runs in the caller's task:
    /// if the caller gives up before the answer, whatever the owner may hold is released in the
    /// background. An attempt for an owner that may hold already (re-entry, a carried token)
    /// runs in its own task instead, so that it completes even if the caller is cancelled: the
    /// one hold it may add is released exactly once, and the earlier ones are left alone.
    pub(crate) async fn attempt(
        &self,
        owner: OwnerToken,
        claim: Claim,
    ) -> Result<Attempt<MutexGuard>> {
        if claim == Claim::New {
            let cancelled = OnCancel::new(|| self.abandon(owner));
            let result = self.run_acquire(owner, claim).await;
            cancelled.disarm();
            return result;
        }
        let (tx, rx) = oneshot::channel();
        let this = self.clone();
        tokio::spawn(async move {
            let result = this.run_acquire(owner, claim).await;
            if let Err(Err(err)) = tx.send(result)
                && err.is_lost_answer()
            {
                // The caller is gone: nobody else will clean up after a lost answer.
                let _ = this.abandon_on_error::<()>(owner, claim, Err(err));
            }
        });
        rx.await.map_err(|_| Error::Protocol {
            script: "mutex_acquire",
            detail: "the acquisition task stopped without an answer".into(),
        })?
    }

    /// A new owner's acquisition ends in an error after an attempt may have been granted
    /// without its answer arriving (a retry with [`Claim::New`] would have picked such a hold
    /// up, but there was none): release whatever the owner may hold, in the background.
    fn abandon_on_error<T>(&self, owner: OwnerToken, claim: Claim, result: Result<T>) -> Result<T> {
        if result.is_err() && claim == Claim::New {
            self.abandon(owner);
        }
        result
    }

    /// Releases, in the background, the hold a new owner may have got.
    fn abandon(&self, owner: OwnerToken) {
        let hold = self.hold(owner.as_field(), Instant::now());
        drop(Lease::new(hold, self.client.inner.tasks.clone()));
    }

    fn hold(&self, field: String, sent_at: Instant) -> Hold {
        Hold::new(
            Kind::Mutex,
            Arc::clone(&self.name),
            Arc::clone(&self.keys),
            field,
            self.lease,
            self.renew,
            sent_at,
        )
    }

    async fn run_acquire(&self, owner: OwnerToken, claim: Claim) -> Result<Attempt<MutexGuard>> {
        let inner = &self.client.inner;
        let field = owner.as_field();
        let lease = lease_ms(self.lease)?;
        let sent_at = Instant::now();
        let raw = inner
            .node
            .invoke(
                MUTEX_ACQUIRE
                    .key(&self.keys.lock)
                    .key(&self.keys.fence)
                    .arg(&field)
                    .arg(lease)
                    .arg(millis(FENCE_TTL))
                    .arg(claim.code()),
            )
            .await?;
        let keys = [self.keys.lock.as_str(), self.keys.fence.as_str()];
        let (status, reply) = Reply::decode("mutex_acquire", raw, &keys, MUTEX_LAYOUT)?;
        match status {
            1 => {
                let fence = reply.int(1)?;
                let lease = Lease::new(self.hold(field, sent_at), inner.tasks.clone());
                Ok(Attempt::Acquired(MutexGuard {
                    held: Held {
                        client: self.client.clone(),
                        owner,
                        fence: u64::try_from(fence).unwrap_or_default(),
                        lease,
                    },
                    source: Source::Plain(self.clone()),
                }))
            }
            0 => {
                let pttl = reply.int(1)?;
                let pttl = u64::try_from(pttl).ok().map(Duration::from_millis);
                Ok(Attempt::Busy(pttl))
            }
            other => Err(reply.unexpected(other)),
        }
    }
}

/// Proof that this owner holds a [`Mutex`] or a [`FairMutex`] once. One hold per guard: a
/// re-entered lock has one guard per hold.
///
/// There is no `Deref`: the lock guards no local data, it guards whatever the name stands for.
/// Check [`is_held`](Self::is_held) or race the work against [`lost`](Self::lost) when the work
/// may outlast the lease, and hand [`fencing_token`](Self::fencing_token) to storage that can
/// refuse stale writers.
///
/// # Drop
///
/// Dropping the guard releases its hold in the background (the client's release queue), which
/// needs the tokio runtime the client runs on; if that is gone, the lease runs out instead.
/// Call [`unlock`](Self::unlock) to release now and see the outcome.
///
/// ```no_run
/// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
/// let guard = client.mutex("a")?.lock().await?;
/// tokio::select! {
///     _ = guard.lost() => eprintln!("lease lost, stopping"),
///     _ = async { /* the work */ } => {}
/// }
/// guard.unlock().await?;
/// # Ok(()) }
/// ```
#[must_use = "if unused the lock is released at once"]
#[clippy::has_significant_drop]
pub struct MutexGuard {
    held: Held,
    source: Source,
}

/// The handle a guard came from, for [`MutexGuard::reenter`].
#[derive(Debug, Clone)]
enum Source {
    Plain(Mutex),
    Fair(FairMutex),
}

impl fmt::Debug for MutexGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MutexGuard")
            .field("name", &self.name())
            .field("fair", &matches!(self.source, Source::Fair(_)))
            .field("fencing_token", &self.held.fence)
            .field("held", &self.is_held())
            .finish_non_exhaustive()
    }
}

impl MutexGuard {
    #[cfg(feature = "tower")]
    pub(crate) fn held(&self) -> &Held {
        &self.held
    }

    pub(crate) fn fair(held: Held, mutex: FairMutex) -> Self {
        Self {
            held,
            source: Source::Fair(mutex),
        }
    }

    /// The lock's name.
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// let guard = client.mutex("a")?.lock().await?;
    /// assert_eq!(guard.name(), "a");
    /// # Ok(()) }
    /// ```
    pub fn name(&self) -> &str {
        &self.held.hold().name
    }

    /// The owner of this hold. It is a capability: hand it only to code that may re-enter.
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// let guard = client.mutex("a")?.lock().await?;
    /// let header_value = guard.owner().to_string();
    /// # Ok(()) }
    /// ```
    pub fn owner(&self) -> &OwnerToken {
        &self.held.owner
    }

    /// The fencing token of this holding: above every token issued for this name before it.
    /// Re-entered holds share the token of the holding they joined.
    ///
    /// Tokens come from a counter kept beside the lock for 7 days after the last fresh
    /// acquisition ([`FENCE_TTL`](crate::FENCE_TTL)) and never fall below the Redis server's
    /// clock in microseconds, so they keep rising after the counter expires, as long as that
    /// clock does not go back.
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// let mutex = client.mutex("a")?;
    /// let first = mutex.lock().await?;
    /// let t1 = first.fencing_token();
    /// first.unlock().await?;
    /// assert!(mutex.lock().await?.fencing_token() > t1);
    /// # Ok(()) }
    /// ```
    pub fn fencing_token(&self) -> u64 {
        self.held.fence
    }

    /// False once the lease is known lost: a renewal found the lock gone or owned by another,
    /// Redis could not be reached before the lease ran out, or a fixed lease ran out. A lost
    /// guard never becomes held again.
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// let guard = client.mutex("a")?.lock().await?;
    /// assert!(guard.is_held());
    /// # Ok(()) }
    /// ```
    pub fn is_held(&self) -> bool {
        self.held.is_held()
    }

    /// A future that completes when the lease is known lost (see [`is_held`](Self::is_held)).
    /// It does not borrow the guard.
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// let guard = client.mutex("a")?.lock().await?;
    /// let lost = guard.lost();
    /// tokio::select! {
    ///     _ = lost => { /* stop writing */ }
    ///     _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
    /// }
    /// # Ok(()) }
    /// ```
    pub fn lost(&self) -> Lost {
        self.held.lost()
    }

    /// Makes the remaining lease at least `lease` from now (a longer remaining lease is kept).
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`] if the hold is lost (the guard is then lost for good),
    /// [`Error::InvalidArgument`] for a lease outside the bounds, and connection errors.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: an extension that still reaches Redis only lengthens the lease.
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// use std::time::Duration;
    ///
    /// let guard = client.mutex("a")?.with_lease(Duration::from_secs(5))?.lock().await?;
    /// guard.extend(Duration::from_secs(60)).await?;
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "redlatch.extend", skip_all, fields(lock = %self.name()))]
    pub async fn extend(&self, lease: Duration) -> Result<()> {
        self.held.extend(lease).await
    }

    /// Adds one hold for the same owner, with the same lease settings, and returns its guard.
    /// The lock stays held until both guards are released.
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`] if this hold is lost, and as [`Mutex::lock`].
    ///
    /// # Cancel safety
    ///
    /// As [`Mutex::lock_as`].
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// let outer = client.mutex("a")?.lock().await?;
    /// let inner = outer.reenter().await?;
    /// inner.unlock().await?;
    /// outer.unlock().await?; // now the lock is free
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "redlatch.reenter", skip_all, fields(lock = %self.name()))]
    pub async fn reenter(&self) -> Result<MutexGuard> {
        if self.held.hold().is_lost() {
            return Err(self.held.not_held());
        }
        let owner = self.held.owner;
        let again = match &self.source {
            Source::Plain(mutex) => mutex.attempt(owner, Claim::Again).await?,
            Source::Fair(mutex) => mutex.try_attempt(owner, Claim::Again).await?,
        };
        match again {
            Attempt::Acquired(guard) => Ok(guard),
            Attempt::Busy(_) => {
                self.held.hold().mark_lost();
                Err(self.held.not_held())
            }
        }
    }

    /// Releases this hold now. The lock is free once every hold of the owner is released.
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`] if the owner no longer held the lock (its lease ran out, or the key
    /// was deleted): nothing was changed. Connection errors leave the release to the lease.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe in the sense that a cancelled `unlock` may or may not have released the
    /// hold; either way the watchdog no longer renews it, so it is gone within one lease.
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// let guard = client.mutex("a")?.lock().await?;
    /// guard.unlock().await?;
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "redlatch.unlock", skip_all, fields(lock = %self.name()))]
    pub async fn unlock(self) -> Result<()> {
        self.held.release().await
    }
}

/// Releases one hold of `hold.owner`.
pub(crate) async fn release(node: &Node, hold: &Hold) -> Result<()> {
    let raw = node
        .invoke(
            MUTEX_RELEASE
                .key(&hold.keys.lock)
                .arg(&hold.owner)
                .arg(&hold.keys.wake),
        )
        .await?;
    let (status, reply) = Reply::decode("mutex_release", raw, &[&hold.keys.lock], MUTEX_LAYOUT)?;
    match status {
        1 | 2 => Ok(()),
        0 => Err(Error::NotHeld {
            name: hold.name.to_string(),
        }),
        other => Err(reply.unexpected(other)),
    }
}

/// Renews a batch of holds in one script call, each to at least its lease in ms; one status per
/// hold (see `mutex_extend.lua`).
pub(crate) async fn extend_batch(node: &Node, holds: &[(&Hold, u64)]) -> Result<Vec<i64>> {
    let mut invocation = MUTEX_EXTEND.prepare_invoke();
    for (hold, ms) in holds {
        invocation.key(&hold.keys.lock).arg(&hold.owner).arg(*ms);
    }
    let raw = node.invoke(&invocation).await?;
    statuses("mutex_extend", raw, holds.len())
}
