//! [`RwLock`]: many readers or one writer, with queued waiters so writers are not starved.

mod read_guard;
mod write_guard;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

pub use read_guard::RwLockReadGuard;
pub use write_guard::RwLockWriteGuard;

use crate::acquire::{Ask, Engine};
use crate::core::Core;
use crate::error::Result;
use crate::protocol::{Claim, Family, Op};
use crate::token::OwnerToken;

/// A distributed read-write lock: any number of readers, or one writer.
///
/// Made by [`LockClient::rwlock`](crate::LockClient::rwlock).
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
    engine: Engine,
}

impl fmt::Debug for RwLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RwLock")
            .field("name", &self.engine.name)
            .field("lease", &self.engine.lease)
            .field("watchdog", &self.engine.renew)
            .finish()
    }
}

impl RwLock {
    pub(crate) fn new(core: Arc<Core>, name: &str) -> Result<Self> {
        Ok(Self {
            engine: Engine::new(core, name, Family::RwLock, 0)?,
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
        &self.engine.name
    }

    /// This handle with a fixed lease that the watchdog does not renew.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) if `lease` is outside
    /// [`MIN_LEASE`](crate::MIN_LEASE)..=[`MAX_LEASE`](crate::MAX_LEASE), or if the client's
    /// drift allowance ([`LockClientBuilder::drift`](crate::LockClientBuilder::drift)) leaves
    /// nothing of it.
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
            engine: self.engine.with_lease(lease)?,
        })
    }

    /// This handle with its own [`Durability`](crate::Durability) instead of the client's:
    /// its acquisitions count only once that many replicas have their write.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a timeout under 1 ms
    /// (`WAIT` counts whole milliseconds) or above [`MAX_LEASE`](crate::MAX_LEASE);
    /// [`Error::Unsupported`](crate::Error::Unsupported) on a Redis Cluster or Redlock client
    /// (only one master can wait for its replicas).
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// use std::time::Duration;
    /// use redlatch::Durability;
    ///
    /// let durable = client
    ///     .rwlock("a")?
    ///     .with_durability(Durability::AllReplicas { timeout: Duration::from_millis(500) })?;
    /// let held = durable.write().await?;
    /// # Ok(()) }
    /// ```
    pub fn with_durability(self, durability: crate::Durability) -> Result<Self> {
        Ok(Self {
            engine: self.engine.with_durability(durability)?,
        })
    }

    /// Takes a read hold as a new owner, waiting as long as it takes.
    ///
    /// # Errors
    ///
    /// [`Error::Pool`](crate::Error::Pool) or [`Error::Redis`](crate::Error::Redis) if Redis
    /// cannot be reached on the first attempt, [`Error::WrongType`](crate::Error::WrongType) or
    /// [`Error::Layout`](crate::Error::Layout) if the name holds other data.
    /// With a durability (the client's or this handle's),
    /// [`Error::NotReplicated`](crate::Error::NotReplicated) when fewer replicas than wanted
    /// acknowledged the grant in time (it is given back), and
    /// [`Error::Unsupported`](crate::Error::Unsupported) for `Durability::Fsynced` on a server
    /// without `WAITAOF`.
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
    #[tracing::instrument(name = "redlatch.read", skip_all, fields(lock = %self.engine.name))]
    pub async fn read(&self) -> Result<RwLockReadGuard> {
        self.acquire_read(OwnerToken::new(), Claim::New, None).await
    }

    /// As [`read`](Self::read), giving up with [`Error::Timeout`](crate::Error::Timeout) after
    /// `timeout`; the error carries how long until the earliest lease of the lock could run out
    /// (`lease_left`). A zero timeout makes one attempt without queueing, as
    /// [`try_read`](Self::try_read).
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
    #[tracing::instrument(name = "redlatch.read", skip_all, fields(lock = %self.engine.name))]
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
    #[tracing::instrument(name = "redlatch.try_read", skip_all, fields(lock = %self.engine.name))]
    pub async fn try_read(&self) -> Result<Option<RwLockReadGuard>> {
        self.try_read_inner(OwnerToken::new(), Claim::New).await
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
    #[tracing::instrument(name = "redlatch.read", skip_all, fields(lock = %self.engine.name))]
    pub async fn read_as(&self, owner: &OwnerToken) -> Result<RwLockReadGuard> {
        self.acquire_read(*owner, Claim::As, None).await
    }

    /// As [`read_as`](Self::read_as), giving up with [`Error::Timeout`](crate::Error::Timeout)
    /// after `timeout` (see [`read_timeout`](Self::read_timeout)).
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`](crate::Error::Timeout), and as [`read`](Self::read).
    ///
    /// # Cancel safety
    ///
    /// As [`read_as`](Self::read_as).
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient, owner: redlatch::OwnerToken) -> redlatch::Result<()> {
    /// use std::time::Duration;
    ///
    /// let reader = client.rwlock("a")?.read_as_timeout(&owner, Duration::from_secs(1)).await?;
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "redlatch.read", skip_all, fields(lock = %self.engine.name))]
    pub async fn read_as_timeout(
        &self,
        owner: &OwnerToken,
        timeout: Duration,
    ) -> Result<RwLockReadGuard> {
        self.acquire_read(*owner, Claim::As, Some(timeout)).await
    }

    /// As [`read_as`](Self::read_as), without waiting: at once if `owner` already reads or
    /// writes, or if no writer holds the lock and nobody is queued; `Ok(None)` otherwise.
    ///
    /// # Errors
    ///
    /// As [`read`](Self::read).
    ///
    /// # Cancel safety
    ///
    /// As [`read_as`](Self::read_as).
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient, owner: redlatch::OwnerToken) -> redlatch::Result<()> {
    /// let maybe = client.rwlock("a")?.try_read_as(&owner).await?;
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "redlatch.try_read", skip_all, fields(lock = %self.engine.name))]
    pub async fn try_read_as(&self, owner: &OwnerToken) -> Result<Option<RwLockReadGuard>> {
        self.try_read_inner(*owner, Claim::As).await
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
    #[tracing::instrument(name = "redlatch.write", skip_all, fields(lock = %self.engine.name))]
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
    #[tracing::instrument(name = "redlatch.write", skip_all, fields(lock = %self.engine.name))]
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
    #[tracing::instrument(name = "redlatch.try_write", skip_all, fields(lock = %self.engine.name))]
    pub async fn try_write(&self) -> Result<Option<RwLockWriteGuard>> {
        self.try_write_inner(OwnerToken::new(), Claim::New).await
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
    #[tracing::instrument(name = "redlatch.write", skip_all, fields(lock = %self.engine.name))]
    pub async fn write_as(&self, owner: &OwnerToken) -> Result<RwLockWriteGuard> {
        self.acquire_write(*owner, Claim::As, None).await
    }

    /// As [`write_as`](Self::write_as), giving up with [`Error::Timeout`](crate::Error::Timeout)
    /// after `timeout` (see [`write_timeout`](Self::write_timeout)).
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`](crate::Error::Timeout), and as [`write_as`](Self::write_as).
    ///
    /// # Cancel safety
    ///
    /// As [`read_as`](Self::read_as).
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient, owner: redlatch::OwnerToken) -> redlatch::Result<()> {
    /// use std::time::Duration;
    ///
    /// let writer = client.rwlock("a")?.write_as_timeout(&owner, Duration::from_secs(1)).await?;
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "redlatch.write", skip_all, fields(lock = %self.engine.name))]
    pub async fn write_as_timeout(
        &self,
        owner: &OwnerToken,
        timeout: Duration,
    ) -> Result<RwLockWriteGuard> {
        self.acquire_write(*owner, Claim::As, Some(timeout)).await
    }

    /// As [`write_as`](Self::write_as), without waiting: at once if `owner` already writes, or
    /// if nobody holds or waits for the lock; `Ok(None)` otherwise.
    ///
    /// # Errors
    ///
    /// As [`write_as`](Self::write_as).
    ///
    /// # Cancel safety
    ///
    /// As [`read_as`](Self::read_as).
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient, owner: redlatch::OwnerToken) -> redlatch::Result<()> {
    /// let maybe = client.rwlock("a")?.try_write_as(&owner).await?;
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "redlatch.try_write", skip_all, fields(lock = %self.engine.name))]
    pub async fn try_write_as(&self, owner: &OwnerToken) -> Result<Option<RwLockWriteGuard>> {
        self.try_write_inner(*owner, Claim::As).await
    }

    async fn acquire_read(
        &self,
        owner: OwnerToken,
        claim: Claim,
        timeout: Option<Duration>,
    ) -> Result<RwLockReadGuard> {
        let ask = Ask::one(Op::Read, owner, claim);
        let held = self.engine.acquire(ask, timeout).await?;
        Ok(RwLockReadGuard::new(held, self.engine.clone()))
    }

    async fn acquire_write(
        &self,
        owner: OwnerToken,
        claim: Claim,
        timeout: Option<Duration>,
    ) -> Result<RwLockWriteGuard> {
        let ask = Ask::one(Op::Write, owner, claim);
        let held = self.engine.acquire(ask, timeout).await?;
        Ok(RwLockWriteGuard::new(held, self.engine.clone()))
    }

    async fn try_read_inner(
        &self,
        owner: OwnerToken,
        claim: Claim,
    ) -> Result<Option<RwLockReadGuard>> {
        let attempt = self
            .engine
            .try_acquire(Ask::one(Op::Read, owner, claim))
            .await?;
        Ok(attempt
            .acquired()
            .map(|held| RwLockReadGuard::new(held, self.engine.clone())))
    }

    async fn try_write_inner(
        &self,
        owner: OwnerToken,
        claim: Claim,
    ) -> Result<Option<RwLockWriteGuard>> {
        let attempt = self
            .engine
            .try_acquire(Ask::one(Op::Write, owner, claim))
            .await?;
        Ok(attempt
            .acquired()
            .map(|held| RwLockWriteGuard::new(held, self.engine.clone())))
    }
}
