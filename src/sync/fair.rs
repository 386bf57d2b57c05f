//! [`FairMutex`]: a reentrant lock whose waiters are served in strict FIFO order across every
//! client.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::MutexGuard;
use crate::acquire::Engine;
use crate::core::Core;
use crate::error::Result;
use crate::protocol::{Claim, Family};
use crate::token::OwnerToken;

/// A distributed, reentrant mutex that serves its waiters first come, first served, across
/// every client and process.
///
/// Made by [`LockClient::fair_mutex`](crate::LockClient::fair_mutex); its guard is the same [`MutexGuard`](crate::MutexGuard) as the plain
/// [`Mutex`](crate::Mutex)'s, with the same powers: re-entry, fencing tokens, watchdog leases
/// and [`lost`](MutexGuard::lost).
///
/// * **Order**: waiters queue in Redis, ordered by a ticket taken when they first asked. A
///   newcomer never overtakes a queued waiter, and a release wakes only the waiter at the head
///   (one message, naming it; no herd).
/// * **Dead waiters** are passed over: the head of the queue is handed the lock for a first
///   term of the waiter timeout at most (by default the client's default lease, 30 s; see
///   [`LockClientBuilder::waiter_timeout`](crate::LockClientBuilder::waiter_timeout)), which a
///   live waiter answers (its watchdog renews the hold) and a dead one lets run out, timed by
///   the server's clock.
///   When a client lets a hold run out, its other queued waiters go too, so a crashed process
///   holds up the queue for one waiter timeout at most, however many waiters it had. A
///   cancelled or timed out wait leaves the queue at once.
/// * **Nothing stays behind**: every key (queue, leases) expires with the last lease, and is
///   deleted when the last hold is released with nobody waiting.
///
/// A plain [`Mutex`](crate::Mutex) is cheaper (no queue) and fair among the waiters of one
/// client, but a releaser in another process can take it again before them; use `FairMutex`
/// when every process must get its turn.
///
/// ```no_run
/// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
/// let turn = client.fair_mutex("printer")?.lock().await?;
/// // ... use the printer ...
/// turn.unlock().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct FairMutex {
    engine: Engine,
}

impl fmt::Debug for FairMutex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FairMutex")
            .field("name", &self.engine.name)
            .field("lease", &self.engine.lease)
            .field("watchdog", &self.engine.renew)
            .finish()
    }
}

impl FairMutex {
    pub(crate) fn new(core: Arc<Core>, name: &str) -> Result<Self> {
        Ok(Self {
            engine: Engine::new(core, name, Family::Fair, 0)?,
        })
    }

    /// The lock's name.
    ///
    /// ```no_run
    /// # fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// assert_eq!(client.fair_mutex("a")?.name(), "a");
    /// # Ok(()) }
    /// ```
    pub fn name(&self) -> &str {
        &self.engine.name
    }

    /// This handle with a fixed lease that the watchdog does not renew (see
    /// [`Mutex::with_lease`](crate::Mutex::with_lease)).
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
    /// let guard = client.fair_mutex("a")?.with_lease(Duration::from_secs(5))?.lock().await?;
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
    ///     .fair_mutex("a")?
    ///     .with_durability(Durability::AllReplicas { timeout: Duration::from_millis(500) })?;
    /// let held = durable.lock().await?;
    /// # Ok(()) }
    /// ```
    pub fn with_durability(self, durability: crate::Durability) -> Result<Self> {
        Ok(Self {
            engine: self.engine.with_durability(durability)?,
        })
    }

    /// Takes a place at the tail of the queue and waits for its turn, as long as it takes.
    ///
    /// # Errors
    ///
    /// [`Error::Pool`](crate::Error::Pool) or [`Error::Redis`](crate::Error::Redis) if Redis
    /// cannot be reached on the first attempt (later failures are waited out),
    /// [`Error::WrongType`](crate::Error::WrongType) or [`Error::Layout`](crate::Error::Layout)
    /// if the name's keys hold other data, or the name is in use as another primitive.
    /// With a durability (the client's or this handle's),
    /// [`Error::NotReplicated`](crate::Error::NotReplicated) when fewer replicas than wanted
    /// acknowledged the grant in time (it is given back), and
    /// [`Error::Unsupported`](crate::Error::Unsupported) for `Durability::Fsynced` on a server
    /// without `WAITAOF`.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe. Dropping the future leaves the queue at once (in the background); an
    /// acquisition already on its way is released again, so a cancelled `lock` never holds the
    /// lock for longer than one round trip and never stalls the waiters behind it.
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// let guard = client.fair_mutex("a")?.lock().await?;
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "redlatch.lock", skip_all, fields(lock = %self.engine.name, fair = true))]
    pub async fn lock(&self) -> Result<MutexGuard> {
        self.acquire(OwnerToken::new(), Claim::New, None).await
    }

    /// As [`lock`](Self::lock), leaving the queue with
    /// [`Error::Timeout`](crate::Error::Timeout) after `timeout`; the error carries how long
    /// until the earliest lease of the lock could run out (`lease_left`), for a `Retry-After`.
    /// A zero timeout makes one attempt without queueing, as [`try_lock`](Self::try_lock).
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`](crate::Error::Timeout) when the time runs out, and as
    /// [`lock`](Self::lock).
    ///
    /// # Cancel safety
    ///
    /// As [`lock`](Self::lock).
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// use std::time::Duration;
    ///
    /// let guard = client.fair_mutex("a")?.lock_timeout(Duration::from_secs(2)).await?;
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "redlatch.lock", skip_all, fields(lock = %self.engine.name, fair = true))]
    pub async fn lock_timeout(&self, timeout: Duration) -> Result<MutexGuard> {
        self.acquire(OwnerToken::new(), Claim::New, Some(timeout))
            .await
    }

    /// Takes the lock only if it is free and nobody is queued for it, usually in one round trip
    /// (two when a name this client last saw idle turns out in use).
    /// `Ok(None)` means busy; it does not queue.
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
    /// if let Some(guard) = client.fair_mutex("a")?.try_lock().await? {
    ///     guard.unlock().await?;
    /// }
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "redlatch.try_lock", skip_all, fields(lock = %self.engine.name, fair = true))]
    pub async fn try_lock(&self) -> Result<Option<MutexGuard>> {
        MutexGuard::try_acquire(&self.engine, OwnerToken::new(), Claim::New).await
    }

    /// Acquires the lock for `owner`: at once if `owner` already holds it (one more hold),
    /// else through the queue. The token is a capability: pass it only to code you trust.
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
    /// let owner: redlatch::OwnerToken = header.parse()?;
    /// let nested = client.fair_mutex("a")?.lock_as(&owner).await?;
    /// nested.unlock().await?;
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "redlatch.lock", skip_all, fields(lock = %self.engine.name, fair = true))]
    pub async fn lock_as(&self, owner: &OwnerToken) -> Result<MutexGuard> {
        self.acquire(*owner, Claim::As, None).await
    }

    /// As [`lock_as`](Self::lock_as), leaving the queue with
    /// [`Error::Timeout`](crate::Error::Timeout) after `timeout` (see
    /// [`lock_timeout`](Self::lock_timeout)).
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`](crate::Error::Timeout) when the time runs out, and as
    /// [`lock`](Self::lock).
    ///
    /// # Cancel safety
    ///
    /// As [`lock_as`](Self::lock_as).
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient, owner: redlatch::OwnerToken) -> redlatch::Result<()> {
    /// use std::time::Duration;
    ///
    /// let nested = client.fair_mutex("a")?.lock_as_timeout(&owner, Duration::from_secs(2)).await?;
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "redlatch.lock", skip_all, fields(lock = %self.engine.name, fair = true))]
    pub async fn lock_as_timeout(
        &self,
        owner: &OwnerToken,
        timeout: Duration,
    ) -> Result<MutexGuard> {
        self.acquire(*owner, Claim::As, Some(timeout)).await
    }

    /// As [`lock_as`](Self::lock_as), without waiting: `Ok(None)` if another owner holds it or
    /// waiters are queued.
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
    /// let maybe = client.fair_mutex("a")?.try_lock_as(&owner).await?;
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "redlatch.try_lock", skip_all, fields(lock = %self.engine.name, fair = true))]
    pub async fn try_lock_as(&self, owner: &OwnerToken) -> Result<Option<MutexGuard>> {
        MutexGuard::try_acquire(&self.engine, *owner, Claim::As).await
    }

    async fn acquire(
        &self,
        owner: OwnerToken,
        claim: Claim,
        timeout: Option<Duration>,
    ) -> Result<MutexGuard> {
        MutexGuard::acquire(&self.engine, owner, claim, timeout).await
    }
}
