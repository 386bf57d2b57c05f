//! [`RwLockReadGuard`]: proof that an owner holds an [`RwLock`](crate::RwLock) for reading.

use std::fmt;
use std::time::Duration;

use crate::acquire::Engine;
use crate::error::Result;
use crate::lease::{Held, HoldView, Lost};
use crate::protocol::Op;
use crate::token::OwnerToken;

/// Proof that this owner holds an [`RwLock`](crate::RwLock) for reading, once.
///
/// Read guards carry no fencing token: readers do not write.
///
/// # Drop
///
/// Dropping the guard releases its hold in the background (the client's release queue); if the
/// runtime is gone, the lease runs out instead. Call [`unlock`](Self::unlock) to release now.
///
/// ```no_run
/// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
/// let reader = client.rwlock("a")?.read().await?;
/// reader.unlock().await?;
/// # Ok(()) }
/// ```
#[must_use = "if unused the lock is released at once"]
#[clippy::has_significant_drop]
pub struct RwLockReadGuard {
    held: Held,
    /// The lock's machinery, for re-entry and downgrade.
    engine: Engine,
}

impl fmt::Debug for RwLockReadGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RwLockReadGuard")
            .field("name", &self.engine.name)
            .field("held", &self.is_held())
            .finish_non_exhaustive()
    }
}

impl RwLockReadGuard {
    pub(super) fn new(held: Held, engine: Engine) -> Self {
        Self { held, engine }
    }

    /// The lock's name.
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// assert_eq!(client.rwlock("a")?.read().await?.name(), "a");
    /// # Ok(()) }
    /// ```
    pub fn name(&self) -> &str {
        self.held.name()
    }

    /// The owner of this hold; a capability for [`RwLock::read_as`](crate::RwLock::read_as).
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// let reader = client.rwlock("a")?.read().await?;
    /// let carried = reader.owner().to_string();
    /// # Ok(()) }
    /// ```
    pub fn owner(&self) -> &OwnerToken {
        self.held.share();
        &self.held.owner
    }

    /// False once the lease is known lost.
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// assert!(client.rwlock("a")?.read().await?.is_held());
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
    /// let reader = client.rwlock("a")?.read().await?;
    /// let left = reader.valid_until().saturating_duration_since(std::time::Instant::now());
    /// # Ok(()) }
    /// ```
    pub fn valid_until(&self) -> std::time::Instant {
        self.held.valid_until()
    }

    /// A future that completes when the lease is known lost. It does not borrow the guard.
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// let reader = client.rwlock("a")?.read().await?;
    /// let lost = reader.lost();
    /// # Ok(()) }
    /// ```
    pub fn lost(&self) -> Lost {
        self.held.lost()
    }

    /// A cheap view of this hold that does not keep it (see
    /// [`MutexGuard::view`](crate::MutexGuard::view)).
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// let guard = client.rwlock("a")?.read().await?;
    /// assert!(guard.view().is_held());
    /// # Ok(()) }
    /// ```
    pub fn view(&self) -> HoldView {
        self.held.view()
    }

    /// Makes the remaining lease at least `lease` from now.
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`](crate::Error::NotHeld) if the hold is lost, invalid leases and
    /// connection errors.
    /// [`Error::NotReplicated`](crate::Error::NotReplicated) if the handle's durability wants
    /// replica acknowledgements that did not come (the deadline stays where it was).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: an extension that still reaches Redis only lengthens the lease.
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// let reader = client.rwlock("a")?.read().await?;
    /// reader.extend(std::time::Duration::from_secs(60)).await?;
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "redlatch.extend", skip_all, fields(lock = %self.name()))]
    pub async fn extend(&self, lease: Duration) -> Result<()> {
        self.held.extend(lease).await
    }

    /// Adds one read hold for the same owner, even while a writer waits (it could not get in
    /// before this hold is released anyway).
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`](crate::Error::NotHeld) if this hold is lost; connection errors.
    ///
    /// # Cancel safety
    ///
    /// As [`RwLock::read_as`](crate::RwLock::read_as).
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// let outer = client.rwlock("a")?.read().await?;
    /// let inner = outer.reenter().await?;
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "redlatch.reenter", skip_all, fields(lock = %self.name()))]
    pub async fn reenter(&self) -> Result<RwLockReadGuard> {
        let held = self.engine.again(Op::Read, &self.held).await?;
        Ok(RwLockReadGuard::new(held, self.engine.clone()))
    }

    /// Releases this read hold now; the last read hold of the last reader lets a queued writer
    /// in.
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`](crate::Error::NotHeld) if the hold was gone: nothing was changed.
    ///
    /// # Cancel safety
    ///
    /// A cancelled `unlock` may or may not have released the hold; it is gone within a lease.
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// client.rwlock("a")?.read().await?.unlock().await?;
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "redlatch.unlock", skip_all, fields(lock = %self.name()))]
    pub async fn unlock(self) -> Result<()> {
        self.held.release().await
    }
}
