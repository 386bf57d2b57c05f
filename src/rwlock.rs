//! [`RwLock`]: many readers or one writer, with queued waiters so writers are not starved.

use std::fmt;
use std::time::Duration;

use crate::client::LockClient;
use crate::error::Result;
use crate::lease::{Family, Held, Lost, Op};
use crate::queue::Queued;
use crate::token::OwnerToken;
use crate::wait::{Attempt, Claim};

/// A distributed read-write lock: any number of readers, or one writer.
///
/// Made by [`LockClient::rwlock`].
///
/// * **No writer starvation**: waiters queue in Redis in arrival order. A reader may join the
///   current readers only while nobody is queued; once a writer waits, new readers queue
///   behind it, and the writer goes next when the readers ahead of it are done. Readers queued
///   together are let in together.
/// * **Downgrade, never upgrade**: a writer may also take read holds
///   ([`RwLockWriteGuard::read`]), which keep the lock after the write hold is released. A
///   reader that asks for the write lock (through [`write_as`](Self::write_as) with its own
///   owner token) gets [`Error::Upgrade`](crate::Error::Upgrade) at once instead of deadlocking
///   against another reader doing the same.
/// * Write guards carry a **fencing token**; every guard has a lease renewed by the watchdog,
///   [`lost`](RwLockWriteGuard::lost) and `is_held`, like [`MutexGuard`](crate::MutexGuard).
///   Read holds are re-entrant per owner, as write holds are.
///
/// ```no_run
/// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
/// let config = client.rwlock("config")?;
/// let reader = config.read().await?;
/// // ... many processes read at once ...
/// reader.unlock().await?;
///
/// let writer = config.write().await?;
/// // ... one writes, fenced ...
/// # let _ = writer.fencing_token();
/// writer.unlock().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RwLock {
    inner: Queued,
}

impl fmt::Debug for RwLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RwLock")
            .field("name", &self.inner.name)
            .field("lease", &self.inner.lease)
            .field("watchdog", &self.inner.renew)
            .finish()
    }
}

impl RwLock {
    pub(crate) fn new(client: LockClient, name: &str) -> Result<Self> {
        Ok(Self {
            inner: Queued::new(client, name, Family::RwLock, 0)?,
        })
    }

    /// The lock's name.
    ///
    /// ```no_run
    /// # fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// assert_eq!(client.rwlock("a")?.name(), "a");
    /// # Ok(()) }
    /// ```
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// This handle with a fixed lease that the watchdog does not renew.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) if `lease` is outside
    /// [`MIN_LEASE`](crate::MIN_LEASE)..=[`MAX_LEASE`](crate::MAX_LEASE).
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// use std::time::Duration;
    ///
    /// let lock = client.rwlock("a")?.with_lease(Duration::from_secs(5))?;
    /// # Ok(()) }
    /// ```
    pub fn with_lease(self, lease: Duration) -> Result<Self> {
        Ok(Self {
            inner: self.inner.with_lease(lease)?,
        })
    }

    /// Takes a read hold as a new owner, waiting as long as it takes.
    ///
    /// # Errors
    ///
    /// [`Error::Pool`](crate::Error::Pool) or [`Error::Redis`](crate::Error::Redis) if Redis
    /// cannot be reached on the first attempt, [`Error::WrongType`](crate::Error::WrongType) or
    /// [`Error::Layout`](crate::Error::Layout) if the name holds other data.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future leaves the queue at once, and a hold already on its way
    /// is released again.
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// let reader = client.rwlock("a")?.read().await?;
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "redlatch.read", skip_all, fields(lock = %self.inner.name))]
    pub async fn read(&self) -> Result<RwLockReadGuard> {
        self.acquire_read(OwnerToken::new(), Claim::New, None).await
    }

    /// As [`read`](Self::read), giving up with [`Error::Timeout`](crate::Error::Timeout) after
    /// `timeout`.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`](crate::Error::Timeout), and as [`read`](Self::read).
    ///
    /// # Cancel safety
    ///
    /// As [`read`](Self::read).
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// use std::time::Duration;
    ///
    /// let reader = client.rwlock("a")?.read_timeout(Duration::from_secs(1)).await?;
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "redlatch.read", skip_all, fields(lock = %self.inner.name))]
    pub async fn read_timeout(&self, timeout: Duration) -> Result<RwLockReadGuard> {
        self.acquire_read(OwnerToken::new(), Claim::New, Some(timeout))
            .await
    }

    /// Takes a read hold if no writer holds the lock and nobody is queued; `Ok(None)`
    /// otherwise.
    ///
    /// # Errors
    ///
    /// As [`read`](Self::read).
    ///
    /// # Cancel safety
    ///
    /// As [`read`](Self::read).
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// let maybe = client.rwlock("a")?.try_read().await?;
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "redlatch.try_read", skip_all, fields(lock = %self.inner.name))]
    pub async fn try_read(&self) -> Result<Option<RwLockReadGuard>> {
        let held = self
            .inner
            .try_acquire(Op::Read, 1, OwnerToken::new(), Claim::New)
            .await?;
        Ok(held.acquired().map(|held| self.read_guard(held)))
    }

    /// Takes a read hold for `owner`: at once if `owner` already reads or writes (re-entry,
    /// or a writer's downgrade), else through the queue.
    ///
    /// # Errors
    ///
    /// As [`read`](Self::read).
    ///
    /// # Cancel safety
    ///
    /// As [`read`](Self::read); the owner's hold count is what it was.
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient, owner: redlatch::OwnerToken) -> redlatch::Result<()> {
    /// let reader = client.rwlock("a")?.read_as(&owner).await?;
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "redlatch.read", skip_all, fields(lock = %self.inner.name))]
    pub async fn read_as(&self, owner: &OwnerToken) -> Result<RwLockReadGuard> {
        self.acquire_read(*owner, Claim::As, None).await
    }

    /// Takes the write lock as a new owner, waiting as long as it takes. New readers queue
    /// behind a waiting writer.
    ///
    /// # Errors
    ///
    /// As [`read`](Self::read).
    ///
    /// # Cancel safety
    ///
    /// As [`read`](Self::read).
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// let writer = client.rwlock("a")?.write().await?;
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "redlatch.write", skip_all, fields(lock = %self.inner.name))]
    pub async fn write(&self) -> Result<RwLockWriteGuard> {
        self.acquire_write(OwnerToken::new(), Claim::New, None)
            .await
    }

    /// As [`write`](Self::write), giving up with [`Error::Timeout`](crate::Error::Timeout)
    /// after `timeout`.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`](crate::Error::Timeout), and as [`write`](Self::write).
    ///
    /// # Cancel safety
    ///
    /// As [`read`](Self::read).
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// use std::time::Duration;
    ///
    /// let writer = client.rwlock("a")?.write_timeout(Duration::from_secs(1)).await?;
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "redlatch.write", skip_all, fields(lock = %self.inner.name))]
    pub async fn write_timeout(&self, timeout: Duration) -> Result<RwLockWriteGuard> {
        self.acquire_write(OwnerToken::new(), Claim::New, Some(timeout))
            .await
    }

    /// Takes the write lock if nobody holds or waits for the lock; `Ok(None)` otherwise.
    ///
    /// # Errors
    ///
    /// As [`read`](Self::read).
    ///
    /// # Cancel safety
    ///
    /// As [`read`](Self::read).
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// let maybe = client.rwlock("a")?.try_write().await?;
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "redlatch.try_write", skip_all, fields(lock = %self.inner.name))]
    pub async fn try_write(&self) -> Result<Option<RwLockWriteGuard>> {
        let held = self
            .inner
            .try_acquire(Op::Write, 1, OwnerToken::new(), Claim::New)
            .await?;
        Ok(held.acquired().map(|held| self.write_guard(held)))
    }

    /// Takes the write lock for `owner`: at once if `owner` already writes (re-entry), else
    /// through the queue.
    ///
    /// # Errors
    ///
    /// [`Error::Upgrade`](crate::Error::Upgrade) at once if `owner` holds a read lock and not
    /// the write lock; as [`read`](Self::read) otherwise.
    ///
    /// # Cancel safety
    ///
    /// As [`read_as`](Self::read_as).
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// let lock = client.rwlock("a")?;
    /// let reader = lock.read().await?;
    /// let refused = lock.write_as(reader.owner()).await;
    /// assert!(matches!(refused, Err(redlatch::Error::Upgrade { .. })));
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "redlatch.write", skip_all, fields(lock = %self.inner.name))]
    pub async fn write_as(&self, owner: &OwnerToken) -> Result<RwLockWriteGuard> {
        self.acquire_write(*owner, Claim::As, None).await
    }

    async fn acquire_read(
        &self,
        owner: OwnerToken,
        claim: Claim,
        timeout: Option<Duration>,
    ) -> Result<RwLockReadGuard> {
        let held = self
            .inner
            .acquire(Op::Read, 1, owner, claim, timeout)
            .await?;
        Ok(self.read_guard(held))
    }

    async fn acquire_write(
        &self,
        owner: OwnerToken,
        claim: Claim,
        timeout: Option<Duration>,
    ) -> Result<RwLockWriteGuard> {
        let held = self
            .inner
            .acquire(Op::Write, 1, owner, claim, timeout)
            .await?;
        Ok(self.write_guard(held))
    }

    /// One attempt for an owner that already holds the lock: re-entry or downgrade.
    async fn again(&self, op: Op, held: &Held) -> Result<Held> {
        if held.hold().is_lost() {
            return Err(held.not_held());
        }
        match self
            .inner
            .attempt(op, 1, held.owner, Claim::Again, None)
            .await?
        {
            Attempt::Acquired(again) => Ok(again),
            Attempt::Busy(_) => {
                held.hold().mark_lost();
                Err(held.not_held())
            }
        }
    }

    fn read_guard(&self, held: Held) -> RwLockReadGuard {
        RwLockReadGuard {
            held,
            lock: self.clone(),
        }
    }

    fn write_guard(&self, held: Held) -> RwLockWriteGuard {
        RwLockWriteGuard {
            held,
            lock: self.clone(),
        }
    }
}

/// Proof that this owner holds an [`RwLock`] for reading, once.
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
    lock: RwLock,
}

/// Proof that this owner holds an [`RwLock`] for writing, once.
///
/// # Drop
///
/// Dropping the guard releases its hold in the background (the client's release queue); if the
/// runtime is gone, the lease runs out instead. Call [`unlock`](Self::unlock) to release now.
///
/// ```no_run
/// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
/// let writer = client.rwlock("a")?.write().await?;
/// writer.unlock().await?;
/// # Ok(()) }
/// ```
#[must_use = "if unused the lock is released at once"]
#[clippy::has_significant_drop]
pub struct RwLockWriteGuard {
    held: Held,
    lock: RwLock,
}

impl fmt::Debug for RwLockReadGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RwLockReadGuard")
            .field("name", &self.lock.inner.name)
            .field("held", &self.is_held())
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for RwLockWriteGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RwLockWriteGuard")
            .field("name", &self.lock.inner.name)
            .field("fencing_token", &self.held.fence)
            .field("held", &self.is_held())
            .finish_non_exhaustive()
    }
}

impl RwLockReadGuard {
    /// The lock's name.
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// assert_eq!(client.rwlock("a")?.read().await?.name(), "a");
    /// # Ok(()) }
    /// ```
    pub fn name(&self) -> &str {
        &self.lock.inner.name
    }

    /// The owner of this hold; a capability for [`RwLock::read_as`].
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// let reader = client.rwlock("a")?.read().await?;
    /// let carried = reader.owner().to_string();
    /// # Ok(()) }
    /// ```
    pub fn owner(&self) -> &OwnerToken {
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

    /// Makes the remaining lease at least `lease` from now.
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`](crate::Error::NotHeld) if the hold is lost, invalid leases and
    /// connection errors.
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
    /// As [`RwLock::read_as`].
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// let outer = client.rwlock("a")?.read().await?;
    /// let inner = outer.reenter().await?;
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "redlatch.reenter", skip_all, fields(lock = %self.name()))]
    pub async fn reenter(&self) -> Result<RwLockReadGuard> {
        let held = self.lock.again(Op::Read, &self.held).await?;
        Ok(self.lock.read_guard(held))
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

impl RwLockWriteGuard {
    /// The lock's name.
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// assert_eq!(client.rwlock("a")?.write().await?.name(), "a");
    /// # Ok(()) }
    /// ```
    pub fn name(&self) -> &str {
        &self.lock.inner.name
    }

    /// The owner of this hold; a capability for [`RwLock::write_as`] and
    /// [`RwLock::read_as`].
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// let writer = client.rwlock("a")?.write().await?;
    /// let carried = writer.owner().to_string();
    /// # Ok(()) }
    /// ```
    pub fn owner(&self) -> &OwnerToken {
        &self.held.owner
    }

    /// The fencing token of this write holding: above every token issued for this name before
    /// it. Re-entered write holds share it.
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// let writer = client.rwlock("a")?.write().await?;
    /// let token = writer.fencing_token();
    /// # Ok(()) }
    /// ```
    pub fn fencing_token(&self) -> u64 {
        self.held.fence
    }

    /// False once the lease is known lost.
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// assert!(client.rwlock("a")?.write().await?.is_held());
    /// # Ok(()) }
    /// ```
    pub fn is_held(&self) -> bool {
        self.held.is_held()
    }

    /// A future that completes when the lease is known lost. It does not borrow the guard.
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// let writer = client.rwlock("a")?.write().await?;
    /// tokio::select! {
    ///     _ = writer.lost() => { /* stop writing */ }
    ///     _ = async { /* the work */ } => {}
    /// }
    /// # Ok(()) }
    /// ```
    pub fn lost(&self) -> Lost {
        self.held.lost()
    }

    /// Makes the remaining lease at least `lease` from now.
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`](crate::Error::NotHeld) if the hold is lost, invalid leases and
    /// connection errors.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: an extension that still reaches Redis only lengthens the lease.
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// let writer = client.rwlock("a")?.write().await?;
    /// writer.extend(std::time::Duration::from_secs(60)).await?;
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "redlatch.extend", skip_all, fields(lock = %self.name()))]
    pub async fn extend(&self, lease: Duration) -> Result<()> {
        self.held.extend(lease).await
    }

    /// Adds one write hold for the same owner; the lock stays write-locked until both are
    /// released.
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`](crate::Error::NotHeld) if this hold is lost; connection errors.
    ///
    /// # Cancel safety
    ///
    /// As [`RwLock::write_as`].
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// let outer = client.rwlock("a")?.write().await?;
    /// let inner = outer.reenter().await?;
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "redlatch.reenter", skip_all, fields(lock = %self.name()))]
    pub async fn reenter(&self) -> Result<RwLockWriteGuard> {
        let held = self.lock.again(Op::Write, &self.held).await?;
        Ok(self.lock.write_guard(held))
    }

    /// Takes a read hold as the same owner (downgrade): release the write guard afterwards and
    /// this process keeps reading, with other readers let in, and no writer in between.
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`](crate::Error::NotHeld) if this hold is lost; connection errors.
    ///
    /// # Cancel safety
    ///
    /// As [`RwLock::read_as`].
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// let writer = client.rwlock("a")?.write().await?;
    /// // ... write ...
    /// let reader = writer.read().await?;
    /// writer.unlock().await?; // still reading; other readers may join
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "redlatch.downgrade", skip_all, fields(lock = %self.name()))]
    pub async fn read(&self) -> Result<RwLockReadGuard> {
        let held = self.lock.again(Op::Read, &self.held).await?;
        Ok(self.lock.read_guard(held))
    }

    /// Releases this write hold now. Queued readers (up to the next writer), or the next
    /// writer, are woken when the lock frees.
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
    /// client.rwlock("a")?.write().await?.unlock().await?;
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "redlatch.unlock", skip_all, fields(lock = %self.name()))]
    pub async fn unlock(self) -> Result<()> {
        self.held.release().await
    }
}
