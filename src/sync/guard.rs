//! [`MutexGuard`](crate::MutexGuard): proof that an owner holds a [`Mutex`](crate::Mutex) or a
//! [`FairMutex`](crate::FairMutex) once.

use std::fmt;
use std::time::Duration;

use crate::acquire::{Ask, Engine};
use crate::error::Result;
use crate::lease::{Held, HoldView, Lost};
use crate::protocol::{Claim, Family, Op};
use crate::token::OwnerToken;

/// Proof that this owner holds a [`Mutex`](crate::Mutex) or a [`FairMutex`](crate::FairMutex)
/// once. One hold per guard: a re-entered lock has one guard per hold.
///
/// There is no `Deref`: the lock guards no local data, it guards whatever the name stands for.
/// Check [`is_held`](Self::is_held) or race the work against [`lost`](Self::lost) when the work
/// may outlast the lease, and hand [`fencing_token`](Self::fencing_token) to storage that can
/// refuse stale writers.
///
/// # Drop
///
/// Dropping the guard releases its hold in the background (the client's release queue), which
/// needs the tokio runtime the client runs on; if that is gone, the lease runs out instead. A
/// release that cannot be sent (no connection) is tried again, with backoff, until the lease
/// would have run out anyway.
/// Call [`unlock`](Self::unlock) to release now and see the outcome. A plain mutex's hold may
/// instead pass to the next task of this client waiting for the name, with no round trip (see
/// [`LocalHandoff`](crate::LocalHandoff)).
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
    /// The handle's machinery, for re-entry.
    engine: Engine,
}

impl fmt::Debug for MutexGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MutexGuard")
            .field("name", &self.name())
            .field("fair", &(self.engine.family == Family::Fair))
            .field("fencing_token", &self.held.fence)
            .field("held", &self.is_held())
            .finish_non_exhaustive()
    }
}

impl MutexGuard {
    fn new(held: Held, engine: Engine) -> Self {
        Self { held, engine }
    }

    /// The owner as stored in Redis, for the crate's own requests (an election's record): unlike
    /// [`owner`](Self::owner), the token does not leave the crate, so the hold stays its own.
    pub(super) fn owner_field(&self) -> String {
        self.held.owner.as_field()
    }

    /// Redis said this hold is gone (an election's leader that found its record taken): it is
    /// lost from now on, as a renewal that found it gone would mark it.
    pub(super) fn mark_lost(&self) {
        self.held.hold().mark_lost();
    }

    /// Takes the lock of `engine` (a mutex or fair mutex) for `owner`, waiting up to `timeout`.
    pub(super) async fn acquire(
        engine: &Engine,
        owner: OwnerToken,
        claim: Claim,
        timeout: Option<Duration>,
    ) -> Result<Self> {
        let ask = Ask::one(Op::Exclusive, owner, claim);
        let held = engine.acquire(ask, timeout).await?;
        Ok(Self::new(held, engine.clone()))
    }

    /// Takes the lock of `engine` for `owner` if it is free, in one round trip.
    pub(super) async fn try_acquire(
        engine: &Engine,
        owner: OwnerToken,
        claim: Claim,
    ) -> Result<Option<Self>> {
        let attempt = engine
            .try_acquire(Ask::one(Op::Exclusive, owner, claim))
            .await?;
        Ok(attempt
            .acquired()
            .map(|held| Self::new(held, engine.clone())))
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
        self.held.name()
    }

    /// The owner of this hold. It is a capability: hand it only to code that may re-enter.
    ///
    /// A plain mutex's hold whose owner was read is released in Redis when let go, never passed
    /// to another task of this client (see [`LocalHandoff`](crate::LocalHandoff)): the token
    /// may be in use elsewhere. A passed hold keeps the owner token it had in Redis.
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// let guard = client.mutex("a")?.lock().await?;
    /// let header_value = guard.owner().to_string();
    /// # Ok(()) }
    /// ```
    pub fn owner(&self) -> &OwnerToken {
        self.held.share();
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

    /// Until when the lease is known to run, as this process measures it: the moment the last
    /// request that confirmed it (the acquisition, or a renewal) was sent, plus the lease, less
    /// 2 ms and 1 % of it for clock resolution and drift (Redlock's allowance). The server's own
    /// deadline is never earlier. Work that must end while the lock is held should
    /// end before this; after it (the process was paused, say), [`is_held`](Self::is_held) is
    /// false.
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// let guard = client.mutex("a")?.lock().await?;
    /// let left = guard.valid_until().saturating_duration_since(std::time::Instant::now());
    /// # Ok(()) }
    /// ```
    pub fn valid_until(&self) -> std::time::Instant {
        self.held.valid_until()
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

    /// A cheap view of this hold that does not keep it: name, fencing token, `is_held` and
    /// `lost`, for code that watches the hold without owning it (a middleware's handler).
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// let guard = client.mutex("a")?.lock().await?;
    /// let view = guard.view();
    /// tokio::spawn(async move {
    ///     view.lost().await;
    ///     eprintln!("`{}` lost", view.name());
    /// });
    /// # Ok(()) }
    /// ```
    pub fn view(&self) -> HoldView {
        self.held.view()
    }

    /// Makes the remaining lease at least `lease` from now (a longer remaining lease is kept).
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`](crate::Error::NotHeld) if the hold is lost (the guard is then lost for good),
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a lease outside the bounds, and connection errors.
    /// [`Error::NotReplicated`](crate::Error::NotReplicated) if the handle's durability wants
    /// replica acknowledgements that did not come (the deadline stays where it was).
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
    /// The lock stays held until both guards are released; a re-entered hold is not passed to
    /// other tasks of this client (see [`LocalHandoff`](crate::LocalHandoff)).
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`](crate::Error::NotHeld) if this hold is lost, and as [`Mutex::lock`](crate::Mutex::lock).
    ///
    /// # Cancel safety
    ///
    /// As [`Mutex::lock_as`](crate::Mutex::lock_as).
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
        self.held.share();
        let held = self.engine.again(Op::Exclusive, &self.held).await?;
        Ok(Self::new(held, self.engine.clone()))
    }

    /// Releases this hold now. The lock is free once every hold of the owner is released. A
    /// plain mutex's hold may instead pass to the next task of this client waiting for the
    /// name, at once (see [`LocalHandoff`](crate::LocalHandoff)).
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`](crate::Error::NotHeld) if the owner no longer held the lock (its lease ran out, or the key
    /// was deleted): nothing was changed. A hold known lost whose owner was read out
    /// ([`owner`](Self::owner)) or re-entered gets it without a request, since the owner token
    /// may hold the lock again elsewhere (through `lock_as`), and its release would end that
    /// hold. Connection errors leave the release to the lease.
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
