//! [`Semaphore`]: a counting semaphore whose permits are owned and leased.

use std::fmt;
use std::time::Duration;

use crate::client::LockClient;
use crate::error::{Error, Result};
use crate::lease::{Family, Held, Lost, Op};
use crate::queue::Queued;
use crate::token::OwnerToken;
use crate::wait::{Attempt, Claim};

/// A distributed counting semaphore: at most `permits` permits are out at once, fleet-wide.
///
/// Made by [`LockClient::semaphore`]. Each acquisition is a [`SemaphorePermit`] with its own id,
/// lease and fencing token, recorded in Redis:
///
/// * **Leased permits**: a crashed holder's permits come back when its lease runs out (30 s by
///   default); the watchdog renews the permits that are held. Releasing twice, or releasing a
///   permit whose lease ran out, is refused with [`Error::NotHeld`] and never frees a permit
///   that is not yours.
/// * **Order**: waiters queue in Redis and are served first come, first served, so a waiter for
///   many permits is not starved by a stream of single-permit acquirers: they queue behind it.
///   A release wakes only the waiters it can satisfy.
/// * **Capacity** is part of the name's state while it is in use (held or waited on): a client
///   that asks with another capacity gets [`Error::CapacityMismatch`]. When nothing is held and
///   nobody waits, nothing is stored, and the next user sets the capacity.
///
/// ```no_run
/// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
/// let pool = client.semaphore("pdf-renderers", 4)?;
/// let permit = pool.acquire().await?;
/// // ... at most 4 renders run at once across the fleet ...
/// permit.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Semaphore {
    inner: Queued,
}

impl fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Semaphore")
            .field("name", &self.inner.name)
            .field("capacity", &self.inner.capacity)
            .field("lease", &self.inner.lease)
            .field("watchdog", &self.inner.renew)
            .finish()
    }
}

impl Semaphore {
    pub(crate) fn new(client: LockClient, name: &str, permits: u32) -> Result<Self> {
        if permits == 0 {
            return Err(Error::invalid(
                "permits",
                "a semaphore needs at least one permit",
            ));
        }
        Ok(Self {
            inner: Queued::new(client, name, Family::Semaphore, permits)?,
        })
    }

    /// The semaphore's name.
    ///
    /// ```no_run
    /// # fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// assert_eq!(client.semaphore("s", 3)?.name(), "s");
    /// # Ok(()) }
    /// ```
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The number of permits this handle was made with.
    ///
    /// ```no_run
    /// # fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// assert_eq!(client.semaphore("s", 3)?.capacity(), 3);
    /// # Ok(()) }
    /// ```
    pub fn capacity(&self) -> u32 {
        self.inner.capacity
    }

    /// This handle with a fixed lease: its permits last `lease` from the acquisition and the
    /// watchdog does not renew them (call [`SemaphorePermit::extend`] to lengthen one).
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
    /// let s = client.semaphore("s", 3)?.with_lease(Duration::from_secs(10))?;
    /// # Ok(()) }
    /// ```
    pub fn with_lease(self, lease: Duration) -> Result<Self> {
        Ok(Self {
            inner: self.inner.with_lease(lease)?,
        })
    }

    /// Acquires one permit, waiting in the queue as long as it takes.
    ///
    /// # Errors
    ///
    /// [`Error::CapacityMismatch`] if the semaphore is in use with another capacity,
    /// [`Error::Pool`] or [`Error::Redis`] if Redis cannot be reached on the first attempt,
    /// [`Error::WrongType`] or [`Error::Layout`] if the name holds other data.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe. Dropping the future leaves the queue at once; a permit already on its way
    /// is released again, so a cancelled acquire never holds a permit for longer than one round
    /// trip.
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// let permit = client.semaphore("s", 3)?.acquire().await?;
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "redlatch.acquire", skip_all, fields(semaphore = %self.inner.name, permits = 1))]
    pub async fn acquire(&self) -> Result<SemaphorePermit> {
        self.acquire_inner(1, None).await
    }

    /// Acquires `n` permits at once, all or nothing, waiting in the queue as long as it takes.
    /// Waiters behind it wait too, so it is not starved by smaller requests.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if `n` is zero or above the capacity; as
    /// [`acquire`](Self::acquire) otherwise.
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Self::acquire).
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// let three = client.semaphore("s", 8)?.acquire_many(3).await?;
    /// assert_eq!(three.permits(), 3);
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "redlatch.acquire", skip_all, fields(semaphore = %self.inner.name, permits = n))]
    pub async fn acquire_many(&self, n: u32) -> Result<SemaphorePermit> {
        self.acquire_inner(n, None).await
    }

    /// As [`acquire`](Self::acquire), leaving the queue with [`Error::Timeout`] after
    /// `timeout`.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`], and as [`acquire`](Self::acquire).
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Self::acquire).
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// use std::time::Duration;
    ///
    /// let permit = client.semaphore("s", 3)?.acquire_timeout(Duration::from_millis(500)).await?;
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "redlatch.acquire", skip_all, fields(semaphore = %self.inner.name, permits = 1))]
    pub async fn acquire_timeout(&self, timeout: Duration) -> Result<SemaphorePermit> {
        self.acquire_inner(1, Some(timeout)).await
    }

    /// As [`acquire_many`](Self::acquire_many), leaving the queue with [`Error::Timeout`]
    /// after `timeout`.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`], and as [`acquire_many`](Self::acquire_many).
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Self::acquire).
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// use std::time::Duration;
    ///
    /// let two = client.semaphore("s", 3)?.acquire_many_timeout(2, Duration::from_secs(1)).await?;
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "redlatch.acquire", skip_all, fields(semaphore = %self.inner.name, permits = n))]
    pub async fn acquire_many_timeout(&self, n: u32, timeout: Duration) -> Result<SemaphorePermit> {
        self.acquire_inner(n, Some(timeout)).await
    }

    /// Takes one permit if one is free and nobody is queued, in one round trip; `Ok(None)`
    /// otherwise (it does not queue).
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire).
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Self::acquire).
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// match client.semaphore("s", 3)?.try_acquire().await? {
    ///     Some(permit) => permit.release().await?,
    ///     None => println!("all permits are out"),
    /// }
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "redlatch.try_acquire", skip_all, fields(semaphore = %self.inner.name, permits = 1))]
    pub async fn try_acquire(&self) -> Result<Option<SemaphorePermit>> {
        self.try_acquire_many(1).await
    }

    /// Takes `n` permits if they are free and nobody is queued, in one round trip; `Ok(None)`
    /// otherwise.
    ///
    /// # Errors
    ///
    /// As [`acquire_many`](Self::acquire_many).
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Self::acquire).
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// let maybe = client.semaphore("s", 3)?.try_acquire_many(2).await?;
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "redlatch.try_acquire", skip_all, fields(semaphore = %self.inner.name, permits = n))]
    pub async fn try_acquire_many(&self, n: u32) -> Result<Option<SemaphorePermit>> {
        Ok(self.try_attempt(n).await?.acquired())
    }

    /// One attempt for `n` permits without queueing. Busy carries how long until the earliest
    /// permit's lease could run out.
    pub(crate) async fn try_attempt(&self, n: u32) -> Result<Attempt<SemaphorePermit>> {
        self.check(n)?;
        let attempt = self
            .inner
            .try_acquire(Op::Permits, n, OwnerToken::new(), Claim::New)
            .await?;
        Ok(attempt.map(|held| SemaphorePermit { held, permits: n }))
    }

    /// The permits free right now: the capacity minus the permits held by live leases. Only a
    /// snapshot: another client may take them a moment later.
    ///
    /// # Errors
    ///
    /// [`Error::CapacityMismatch`] if the semaphore is in use with another capacity, and
    /// connection or foreign-data errors as [`acquire`](Self::acquire).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// let s = client.semaphore("s", 3)?;
    /// let permit = s.acquire().await?;
    /// assert!(s.available_permits().await? <= 2);
    /// # Ok(()) }
    /// ```
    pub async fn available_permits(&self) -> Result<u32> {
        let snapshot = crate::inspect::inspect(&self.inner.client, &self.inner.name).await?;
        match (snapshot.kind, snapshot.capacity) {
            (None, _) => Ok(self.inner.capacity),
            (Some(crate::LockKind::Semaphore), Some(theirs)) if theirs != self.inner.capacity => {
                Err(Error::CapacityMismatch {
                    name: self.inner.name.to_string(),
                    ours: self.inner.capacity,
                    theirs,
                })
            }
            (Some(crate::LockKind::Semaphore), _) => Ok(self
                .inner
                .capacity
                .saturating_sub(snapshot.permits_in_use.unwrap_or_default())),
            (Some(_), _) => Err(Error::Layout {
                key: self.inner.keys.lock.clone(),
                found: format!("{:?}", snapshot.kind),
                expected: crate::scripts::SEMAPHORE_LAYOUT,
            }),
        }
    }

    fn check(&self, n: u32) -> Result<()> {
        if n == 0 || n > self.inner.capacity {
            return Err(Error::invalid(
                "permits",
                format!("asked for {n}, the semaphore has {}", self.inner.capacity),
            ));
        }
        Ok(())
    }

    async fn acquire_inner(&self, n: u32, timeout: Option<Duration>) -> Result<SemaphorePermit> {
        self.check(n)?;
        let held = self
            .inner
            .acquire(Op::Permits, n, OwnerToken::new(), Claim::New, timeout)
            .await?;
        Ok(SemaphorePermit { held, permits: n })
    }
}

/// Proof that this process holds some permits of a [`Semaphore`], under one permit id, with one
/// lease.
///
/// # Drop
///
/// Dropping the permit releases it in the background (the client's release queue), which needs
/// the tokio runtime the client runs on; if that is gone, the lease runs out instead. Call
/// [`release`](Self::release) to release now and see the outcome.
///
/// ```no_run
/// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
/// let permit = client.semaphore("s", 3)?.acquire().await?;
/// tokio::select! {
///     _ = permit.lost() => eprintln!("lease lost, stopping"),
///     _ = async { /* the work */ } => {}
/// }
/// permit.release().await?;
/// # Ok(()) }
/// ```
#[must_use = "if unused the permit is released at once"]
#[clippy::has_significant_drop]
pub struct SemaphorePermit {
    held: Held,
    permits: u32,
}

impl fmt::Debug for SemaphorePermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SemaphorePermit")
            .field("name", &self.name())
            .field("permits", &self.permits)
            .field("fencing_token", &self.held.fence)
            .field("held", &self.is_held())
            .finish_non_exhaustive()
    }
}

impl SemaphorePermit {
    #[cfg(feature = "tower")]
    pub(crate) fn held(&self) -> &Held {
        &self.held
    }

    /// The semaphore's name.
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// assert_eq!(client.semaphore("s", 3)?.acquire().await?.name(), "s");
    /// # Ok(()) }
    /// ```
    pub fn name(&self) -> &str {
        &self.held.hold().name
    }

    /// How many permits this holds.
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// assert_eq!(client.semaphore("s", 3)?.acquire_many(2).await?.permits(), 2);
    /// # Ok(()) }
    /// ```
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// The permit's id, as [`LockClient::inspect`] shows its first 8 digits. Unlike a lock's
    /// owner token it grants nothing: permits cannot be re-entered.
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// let permit = client.semaphore("s", 3)?.acquire().await?;
    /// println!("holding permit {}", permit.id().short_id());
    /// # Ok(()) }
    /// ```
    pub fn id(&self) -> &OwnerToken {
        &self.held.owner
    }

    /// This acquisition's fencing token: above every token issued for this name before it.
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// let s = client.semaphore("s", 3)?;
    /// let (a, b) = (s.acquire().await?, s.acquire().await?);
    /// assert!(b.fencing_token() > a.fencing_token());
    /// # Ok(()) }
    /// ```
    pub fn fencing_token(&self) -> u64 {
        self.held.fence
    }

    /// False once the lease is known lost (see [`MutexGuard::is_held`](crate::MutexGuard::is_held)).
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// assert!(client.semaphore("s", 3)?.acquire().await?.is_held());
    /// # Ok(()) }
    /// ```
    pub fn is_held(&self) -> bool {
        self.held.is_held()
    }

    /// A future that completes when the lease is known lost. It does not borrow the permit.
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// let permit = client.semaphore("s", 3)?.acquire().await?;
    /// let lost = permit.lost();
    /// # Ok(()) }
    /// ```
    pub fn lost(&self) -> Lost {
        self.held.lost()
    }

    /// Makes the remaining lease at least `lease` from now (a longer one is kept).
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`] if the permit is lost, [`Error::InvalidArgument`] for a lease outside
    /// the bounds, and connection errors.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: an extension that still reaches Redis only lengthens the lease.
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// use std::time::Duration;
    ///
    /// let permit = client.semaphore("s", 3)?.with_lease(Duration::from_secs(5))?.acquire().await?;
    /// permit.extend(Duration::from_secs(30)).await?;
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "redlatch.extend", skip_all, fields(semaphore = %self.name()))]
    pub async fn extend(&self, lease: Duration) -> Result<()> {
        self.held.extend(lease).await
    }

    /// Gives the permits back now and wakes the waiters they satisfy.
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`] if the permit was already released or its lease ran out: nothing
    /// was changed, and no permit was freed twice.
    ///
    /// # Cancel safety
    ///
    /// A cancelled `release` may or may not have released the permit; either way the watchdog
    /// no longer renews it, so it comes back within one lease.
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// let permit = client.semaphore("s", 3)?.acquire().await?;
    /// permit.release().await?;
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "redlatch.release", skip_all, fields(semaphore = %self.name()))]
    pub async fn release(self) -> Result<()> {
        self.held.release().await
    }
}
