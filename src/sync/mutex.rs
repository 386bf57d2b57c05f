//! [`Mutex`]: a reentrant lock with a hold count per owner.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::MutexGuard;
use crate::acquire::Engine;
use crate::core::Core;
use crate::error::Result;
use crate::protocol::{Claim, Family};
use crate::token::OwnerToken;

/// A distributed, reentrant mutual-exclusion lock, named in Redis.
///
/// Made by [`LockClient::mutex`](crate::LockClient::mutex). The handle is cheap to clone and holds no lock itself; each
/// successful acquisition returns a [`MutexGuard`](crate::MutexGuard), which proves ownership until it is unlocked
/// or dropped.
///
/// * **Ownership** belongs to an [`OwnerToken`](crate::OwnerToken). Each [`lock`](Self::lock) makes a new owner,
///   so two calls never share a hold by accident. Re-entering is explicit:
///   [`MutexGuard::reenter`], or [`lock_as`](Self::lock_as) with a token carried from
///   elsewhere (another task, another process). The lock is free only when every hold of its
///   owner is released.
/// * **Leases**: every hold has one (30 s by default). The client's watchdog renews it every
///   third of the lease (less the drift allowance) while the guard lives; [`with_lease`](Self::with_lease) gives a fixed
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
    engine: Engine,
}

impl fmt::Debug for Mutex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mutex")
            .field("name", &self.engine.name)
            .field("lease", &self.engine.lease)
            .field("watchdog", &self.engine.renew)
            .finish()
    }
}

impl Mutex {
    pub(crate) fn new(core: Arc<Core>, name: &str) -> Result<Self> {
        Ok(Self {
            engine: Engine::new(core, name, Family::Mutex, 0)?,
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
        &self.engine.name
    }

    /// This handle with a fixed lease: guards it acquires hold the lock for `lease` from the
    /// acquisition, and the watchdog does not renew them (call
    /// [`MutexGuard::extend`] to lengthen one).
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
    /// let guard = client.mutex("report")?.with_lease(Duration::from_secs(5))?.lock().await?;
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
    ///     .mutex("a")?
    ///     .with_durability(Durability::AllReplicas { timeout: Duration::from_millis(500) })?;
    /// let held = durable.lock().await?;
    /// # Ok(()) }
    /// ```
    pub fn with_durability(self, durability: crate::Durability) -> Result<Self> {
        Ok(Self {
            engine: self.engine.with_durability(durability)?,
        })
    }

    /// Acquires the lock as a new owner, waiting as long as it takes.
    ///
    /// # Errors
    ///
    /// [`Error::Pool`](crate::Error::Pool) or [`Error::Redis`](crate::Error::Redis) if Redis cannot be reached on the first attempt
    /// (once the call waits, for a holder or behind this client's other tasks, an unreachable
    /// server is waited out), [`Error::WrongType`](crate::Error::WrongType) or
    /// [`Error::Layout`](crate::Error::Layout) if the lock's keys hold data redlatch does not own.
    /// With a durability (the client's or this handle's),
    /// [`Error::NotReplicated`](crate::Error::NotReplicated) when fewer replicas than wanted
    /// acknowledged the grant in time (it is given back), and
    /// [`Error::Unsupported`](crate::Error::Unsupported) for `Durability::Fsynced` on a server
    /// without `WAITAOF`.
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
    #[tracing::instrument(name = "redlatch.lock", skip_all, fields(lock = %self.engine.name))]
    pub async fn lock(&self) -> Result<MutexGuard> {
        self.acquire(OwnerToken::new(), Claim::New, None).await
    }

    /// As [`lock`](Self::lock), giving up with [`Error::Timeout`](crate::Error::Timeout) after `timeout`. The error
    /// carries how long the holder's lease had left (`lease_left`), for a `Retry-After`. A zero
    /// timeout makes one attempt: [`try_lock`](Self::try_lock) that says how long the holder
    /// keeps the lock.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`](crate::Error::Timeout) when the time runs out, and as [`lock`](Self::lock).
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
    #[tracing::instrument(name = "redlatch.lock", skip_all, fields(lock = %self.engine.name))]
    pub async fn lock_timeout(&self, timeout: Duration) -> Result<MutexGuard> {
        self.acquire(OwnerToken::new(), Claim::New, Some(timeout))
            .await
    }

    /// Acquires the lock if it is free, usually in one round trip (two when a name this client
    /// last saw free turns out busy). `Ok(None)` means another owner holds
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
    #[tracing::instrument(name = "redlatch.try_lock", skip_all, fields(lock = %self.engine.name))]
    pub async fn try_lock(&self) -> Result<Option<MutexGuard>> {
        self.try_acquire(OwnerToken::new(), Claim::New).await
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
    #[tracing::instrument(name = "redlatch.lock", skip_all, fields(lock = %self.engine.name))]
    pub async fn lock_as(&self, owner: &OwnerToken) -> Result<MutexGuard> {
        self.acquire(*owner, Claim::As, None).await
    }

    /// As [`lock_as`](Self::lock_as), giving up with [`Error::Timeout`](crate::Error::Timeout) after `timeout` (see
    /// [`lock_timeout`](Self::lock_timeout)).
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`](crate::Error::Timeout) when the time runs out, and as [`lock`](Self::lock).
    ///
    /// # Cancel safety
    ///
    /// As [`lock_as`](Self::lock_as).
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient, owner: redlatch::OwnerToken) -> redlatch::Result<()> {
    /// use std::time::Duration;
    ///
    /// let nested = client.mutex("a")?.lock_as_timeout(&owner, Duration::from_secs(2)).await?;
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "redlatch.lock", skip_all, fields(lock = %self.engine.name))]
    pub async fn lock_as_timeout(
        &self,
        owner: &OwnerToken,
        timeout: Duration,
    ) -> Result<MutexGuard> {
        self.acquire(*owner, Claim::As, Some(timeout)).await
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
    #[tracing::instrument(name = "redlatch.try_lock", skip_all, fields(lock = %self.engine.name))]
    pub async fn try_lock_as(&self, owner: &OwnerToken) -> Result<Option<MutexGuard>> {
        self.try_acquire(*owner, Claim::As).await
    }

    async fn acquire(
        &self,
        owner: OwnerToken,
        claim: Claim,
        timeout: Option<Duration>,
    ) -> Result<MutexGuard> {
        MutexGuard::acquire(&self.engine, owner, claim, timeout).await
    }

    async fn try_acquire(&self, owner: OwnerToken, claim: Claim) -> Result<Option<MutexGuard>> {
        MutexGuard::try_acquire(&self.engine, owner, claim).await
    }
}
