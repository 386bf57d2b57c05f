//! [`SemaphorePermit`]: proof that this process holds permits of a
//! [`Semaphore`](crate::Semaphore).

use std::fmt;
use std::time::Duration;

use crate::error::Result;
use crate::lease::{Held, HoldView, Lost};
use crate::token::OwnerToken;

/// Proof that this process holds some permits of a [`Semaphore`](crate::Semaphore), under one
/// permit id, with one lease.
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
    pub(super) fn new(held: Held, permits: u32) -> Self {
        Self { held, permits }
    }

    /// The semaphore's name.
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// assert_eq!(client.semaphore("s", 3)?.acquire().await?.name(), "s");
    /// # Ok(()) }
    /// ```
    pub fn name(&self) -> &str {
        self.held.name()
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

    /// The permit's id, as [`LockClient::inspect`](crate::LockClient::inspect) shows its first 8 digits. Unlike a lock's
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

    /// Until when the lease is known to run, as this process measures it: the moment the last
    /// request that confirmed it (the acquisition, or a renewal) was sent, plus the lease, less
    /// 2 ms and 1 % of it for clock resolution and drift (Redlock's allowance). The server's own
    /// deadline is never earlier. Work that must end while the lock is held should
    /// end before this; after it (the process was paused, say), [`is_held`](Self::is_held) is
    /// false.
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// let permit = client.semaphore("s", 3)?.acquire().await?;
    /// let left = permit.valid_until().saturating_duration_since(std::time::Instant::now());
    /// # Ok(()) }
    /// ```
    pub fn valid_until(&self) -> std::time::Instant {
        self.held.valid_until()
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

    /// A cheap view of this permit that does not keep it (see
    /// [`MutexGuard::view`](crate::MutexGuard::view)).
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// let permit = client.semaphore("s", 3)?.acquire().await?;
    /// let view = permit.view();
    /// assert_eq!(view.fencing_token(), permit.fencing_token());
    /// # Ok(()) }
    /// ```
    pub fn view(&self) -> HoldView {
        self.held.view()
    }

    /// Makes the remaining lease at least `lease` from now (a longer one is kept).
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`](crate::Error::NotHeld) if the permit is lost, [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a lease outside
    /// the bounds, and connection errors.
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
    /// [`Error::NotHeld`](crate::Error::NotHeld) if the permit was already released or its lease ran out: nothing
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
