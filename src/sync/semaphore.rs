//! [`Semaphore`]: a counting semaphore whose permits are owned and leased.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::SemaphorePermit;
use crate::acquire::{Ask, Engine};
use crate::core::Core;
use crate::error::{Error, Result};
use crate::inspect::LockKind;
use crate::protocol::{Claim, Family, Op, SEMAPHORE_LAYOUT, admin};
use crate::token::OwnerToken;

/// A distributed counting semaphore: at most `permits` permits are out at once, fleet-wide.
///
/// Made by [`LockClient::semaphore`](crate::LockClient::semaphore). Each acquisition is a [`SemaphorePermit`] with its own id,
/// lease and fencing token, recorded in Redis:
///
/// * **Leased permits**: a crashed holder's permits come back when its lease runs out (30 s by
///   default); the watchdog renews the permits that are held. Releasing twice, or releasing a
///   permit whose lease ran out, is refused with [`Error::NotHeld`](crate::Error::NotHeld) and never frees a permit
///   that is not yours.
/// * **Order**: waiters queue in Redis and are served first come, first served, so a waiter for
///   many permits is not starved by a stream of single-permit acquirers: they queue behind it.
///   A release wakes only the waiters it can satisfy.
/// * **Capacity** is part of the name's state while it is in use (held or waited on): a client
///   that asks with another capacity gets [`Error::CapacityMismatch`](crate::Error::CapacityMismatch). When nothing is held and
///   nobody waits, the stored capacity (if the keys are still there) no longer counts, and the
///   next user sets it.
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
    engine: Engine,
}

impl fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Semaphore")
            .field("name", &self.engine.name)
            .field("capacity", &self.engine.capacity)
            .field("lease", &self.engine.lease)
            .field("watchdog", &self.engine.renew)
            .finish()
    }
}

impl Semaphore {
    pub(crate) fn new(core: Arc<Core>, name: &str, permits: u32) -> Result<Self> {
        if permits == 0 {
            return Err(Error::invalid(
                "permits",
                "a semaphore needs at least one permit",
            ));
        }
        Ok(Self {
            engine: Engine::new(core, name, Family::Semaphore, permits)?,
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
        &self.engine.name
    }

    /// The number of permits this handle was made with.
    ///
    /// ```no_run
    /// # fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// assert_eq!(client.semaphore("s", 3)?.capacity(), 3);
    /// # Ok(()) }
    /// ```
    pub fn capacity(&self) -> u32 {
        self.engine.capacity
    }

    /// This handle with a fixed lease: its permits last `lease` from the acquisition and the
    /// watchdog does not renew them (call [`SemaphorePermit::extend`] to lengthen one).
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
    /// let s = client.semaphore("s", 3)?.with_lease(Duration::from_secs(10))?;
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
    ///     .semaphore("a", 2)?
    ///     .with_durability(Durability::AllReplicas { timeout: Duration::from_millis(500) })?;
    /// let held = durable.acquire().await?;
    /// # Ok(()) }
    /// ```
    pub fn with_durability(self, durability: crate::Durability) -> Result<Self> {
        Ok(Self {
            engine: self.engine.with_durability(durability)?,
        })
    }

    /// Acquires one permit, waiting in the queue as long as it takes.
    ///
    /// # Errors
    ///
    /// [`Error::CapacityMismatch`](crate::Error::CapacityMismatch) if the semaphore is in use with another capacity,
    /// [`Error::Pool`](crate::Error::Pool) or [`Error::Redis`](crate::Error::Redis) if Redis cannot be reached on the first attempt,
    /// [`Error::WrongType`](crate::Error::WrongType) or [`Error::Layout`](crate::Error::Layout) if the name holds other data.
    /// With a durability (the client's or this handle's),
    /// [`Error::NotReplicated`](crate::Error::NotReplicated) when fewer replicas than wanted
    /// acknowledged the grant in time (it is given back), and
    /// [`Error::Unsupported`](crate::Error::Unsupported) for `Durability::Fsynced` on a server
    /// without `WAITAOF`.
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
    #[tracing::instrument(name = "redlatch.acquire", skip_all, fields(semaphore = %self.engine.name, permits = 1))]
    pub async fn acquire(&self) -> Result<SemaphorePermit> {
        self.acquire_inner(1, None).await
    }

    /// Acquires `n` permits at once, all or nothing, waiting in the queue as long as it takes.
    /// Waiters behind it wait too, so it is not starved by smaller requests.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) if `n` is zero or above the capacity; as
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
    #[tracing::instrument(name = "redlatch.acquire", skip_all, fields(semaphore = %self.engine.name, permits = n))]
    pub async fn acquire_many(&self, n: u32) -> Result<SemaphorePermit> {
        self.acquire_inner(n, None).await
    }

    /// As [`acquire`](Self::acquire), leaving the queue with [`Error::Timeout`](crate::Error::Timeout) after
    /// `timeout`; the error carries how long until the earliest permit's lease could run out
    /// (`lease_left`), for a `Retry-After`. A zero timeout makes one attempt without queueing,
    /// as [`try_acquire`](Self::try_acquire).
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`](crate::Error::Timeout), and as [`acquire`](Self::acquire).
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
    #[tracing::instrument(name = "redlatch.acquire", skip_all, fields(semaphore = %self.engine.name, permits = 1))]
    pub async fn acquire_timeout(&self, timeout: Duration) -> Result<SemaphorePermit> {
        self.acquire_inner(1, Some(timeout)).await
    }

    /// As [`acquire_many`](Self::acquire_many), leaving the queue with [`Error::Timeout`](crate::Error::Timeout)
    /// after `timeout`.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`](crate::Error::Timeout), and as [`acquire_many`](Self::acquire_many).
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
    #[tracing::instrument(name = "redlatch.acquire", skip_all, fields(semaphore = %self.engine.name, permits = n))]
    pub async fn acquire_many_timeout(&self, n: u32, timeout: Duration) -> Result<SemaphorePermit> {
        self.acquire_inner(n, Some(timeout)).await
    }

    /// Takes one permit if one is free and nobody is queued, usually in one round trip (two
    /// when a name this client last saw idle turns out in use); `Ok(None)`
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
    #[tracing::instrument(name = "redlatch.try_acquire", skip_all, fields(semaphore = %self.engine.name, permits = 1))]
    pub async fn try_acquire(&self) -> Result<Option<SemaphorePermit>> {
        self.try_acquire_many(1).await
    }

    /// Takes `n` permits if they are free and nobody is queued, usually in one round trip (as
    /// [`try_acquire`](Self::try_acquire)); `Ok(None)`
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
    #[tracing::instrument(name = "redlatch.try_acquire", skip_all, fields(semaphore = %self.engine.name, permits = n))]
    pub async fn try_acquire_many(&self, n: u32) -> Result<Option<SemaphorePermit>> {
        self.check(n)?;
        let ask = Ask {
            op: Op::Permits,
            units: n,
            owner: OwnerToken::new(),
            claim: Claim::New,
            tokens: 1,
            request: None,
        };
        let attempt = self.engine.try_acquire(ask).await?;
        Ok(attempt.acquired().map(|held| SemaphorePermit::new(held, n)))
    }

    /// The permits free right now: the capacity minus the permits held by live leases. Only a
    /// snapshot: another client may take them a moment later.
    ///
    /// # Errors
    ///
    /// [`Error::CapacityMismatch`](crate::Error::CapacityMismatch) if the semaphore is in use
    /// (held or waited on) with another capacity, and
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
        let engine = &self.engine;
        let snapshot = engine
            .core
            .backend
            .run(&admin::Inspect {
                name: &engine.name,
                keys: &engine.keys,
            })
            .await?;
        match (snapshot.kind, snapshot.capacity) {
            (None, _) => Ok(engine.capacity),
            // Another capacity counts while the name is in use; an idle name's keys (leases
            // run out, nobody queued) outlive it until their expiry, and the next user sets it.
            (Some(LockKind::Semaphore), Some(theirs))
                if theirs != engine.capacity
                    && !(snapshot.holders.is_empty() && snapshot.waiters.is_empty()) =>
            {
                Err(Error::CapacityMismatch {
                    name: engine.name.to_string(),
                    ours: engine.capacity,
                    theirs,
                })
            }
            (Some(LockKind::Semaphore), _) => Ok(engine
                .capacity
                .saturating_sub(snapshot.permits_in_use.unwrap_or_default())),
            (Some(kind), _) => Err(Error::Layout {
                key: engine.keys.lock.clone(),
                found: admin::layout_of(kind).to_owned(),
                expected: SEMAPHORE_LAYOUT,
            }),
        }
    }

    fn check(&self, n: u32) -> Result<()> {
        if n == 0 || n > self.engine.capacity {
            return Err(Error::invalid(
                "permits",
                format!("asked for {n}, the semaphore has {}", self.engine.capacity),
            ));
        }
        Ok(())
    }

    async fn acquire_inner(&self, n: u32, timeout: Option<Duration>) -> Result<SemaphorePermit> {
        self.check(n)?;
        let ask = Ask {
            op: Op::Permits,
            units: n,
            owner: OwnerToken::new(),
            claim: Claim::New,
            tokens: 1,
            request: None,
        };
        let held = self.engine.acquire(ask, timeout).await?;
        Ok(SemaphorePermit::new(held, n))
    }
}
