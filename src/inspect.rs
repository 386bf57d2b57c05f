//! [`Snapshot`]: the state of one name, as [`LockClient::inspect`](crate::LockClient::inspect)
//! reads it, and what [`LockClient::force_unlock`](crate::LockClient::force_unlock) removed. The
//! types only: the protocol layer reads them from the scripts' replies.

use std::fmt;
use std::time::Duration;

/// What a name is in use as.
///
/// ```no_run
/// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
/// if client.inspect("jobs").await?.kind == Some(redlatch::LockKind::Semaphore) {
///     println!("`jobs` is a semaphore");
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LockKind {
    /// A [`Mutex`](crate::Mutex).
    Mutex,
    /// A [`FairMutex`](crate::FairMutex).
    FairMutex,
    /// A [`Semaphore`](crate::Semaphore).
    Semaphore,
    /// An [`RwLock`](crate::RwLock).
    RwLock,
    /// An [`Election`](crate::Election).
    Election,
}

/// The state of one name at one instant, read in one atomic script call.
///
/// Owners appear as the first 8 hex digits of their token ([`OwnerToken::short_id`]), never in
/// full: the token is a capability. Holders and waiters whose time has run out are left out,
/// even if no script has cleaned them up yet.
///
/// `Display` prints it for people (the command-line tool's `inspect`).
///
/// ```no_run
/// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
/// let guard = client.fair_mutex("report")?.lock().await?;
/// let snapshot = client.inspect("report").await?;
/// assert_eq!(snapshot.kind, Some(redlatch::LockKind::FairMutex));
/// assert_eq!(snapshot.holders[0].id, guard.owner().short_id());
/// println!("{snapshot}");
/// # Ok(()) }
/// ```
///
/// [`OwnerToken::short_id`]: crate::OwnerToken::short_id
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Snapshot {
    /// The name inspected.
    pub name: String,
    /// What the name is in use as; `None` when nothing is stored under it (free, nobody waits).
    pub kind: Option<LockKind>,
    /// Who holds it.
    pub holders: Vec<HolderInfo>,
    /// Who waits for it, in queue order (fair mutex, semaphore and read-write lock; waiters of a
    /// plain mutex queue inside their clients and do not show).
    pub waiters: Vec<WaiterInfo>,
    /// Semaphores: permits held.
    pub permits_in_use: Option<u32>,
    /// Semaphores: the capacity the semaphore is in use with.
    pub capacity: Option<u32>,
    /// The last fencing token issued for this name, while its counter lives.
    pub last_fencing_token: Option<u64>,
}

/// One holder in a [`Snapshot`].
///
/// ```no_run
/// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
/// for holder in client.inspect("report").await?.holders {
///     println!("{} holds {} time(s), {:?} left", holder.id, holder.exclusive_holds, holder.lease_left);
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HolderInfo {
    /// The first 8 hex digits of the owner token (a semaphore permit's own id).
    pub id: String,
    /// Exclusive holds: of a mutex, fair mutex or write lock (re-entered holds count each).
    pub exclusive_holds: u32,
    /// Read holds of a read-write lock, or the permits a semaphore permit holds.
    pub shared_holds: u32,
    /// Lease left; `None` if the key has no expiry (foreign tampering).
    pub lease_left: Option<Duration>,
}

/// What a queued waiter asks for.
///
/// ```
/// assert_eq!(redlatch::Wants::Permits(2), redlatch::Wants::Permits(2));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Wants {
    /// The fair mutex.
    Exclusive,
    /// A read lock.
    Read,
    /// The write lock.
    Write,
    /// This many permits.
    Permits(u32),
}

/// One queued waiter in a [`Snapshot`].
///
/// ```no_run
/// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
/// for (place, waiter) in client.inspect("report").await?.waiters.iter().enumerate() {
///     println!("{place}: {} wants {:?} (client {})", waiter.id, waiter.wants, waiter.client);
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct WaiterInfo {
    /// The first 8 hex digits of the waiter's owner token.
    pub id: String,
    /// What it waits for.
    pub wants: Wants,
    /// The client (process) it waits in, by its id (16 hex digits): its places go together if
    /// that client is found gone.
    pub client: String,
}

impl fmt::Display for Snapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Some(kind) = self.kind else {
            return writeln!(f, "{}: free, nothing stored", self.name);
        };
        writeln!(f, "{}: {kind:?}", self.name)?;
        if let (Some(used), Some(cap)) = (self.permits_in_use, self.capacity) {
            writeln!(f, "  permits: {used} of {cap} in use")?;
        }
        if let Some(token) = self.last_fencing_token {
            writeln!(f, "  last fencing token: {token}")?;
        }
        writeln!(f, "  holders: {}", self.holders.len())?;
        for h in &self.holders {
            let left = h
                .lease_left
                .map_or_else(|| "no expiry".to_owned(), |d| format!("{d:?} left"));
            writeln!(
                f,
                "    {}  exclusive {}  shared {}  {left}",
                h.id, h.exclusive_holds, h.shared_holds
            )?;
        }
        writeln!(f, "  waiters: {}", self.waiters.len())?;
        for (i, w) in self.waiters.iter().enumerate() {
            writeln!(
                f,
                "    {i}. {}  wants {:?}  in client {}",
                w.id, w.wants, w.client
            )?;
        }
        Ok(())
    }
}

/// What [`LockClient::force_unlock`](crate::LockClient::force_unlock) removed.
///
/// ```no_run
/// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
/// let removed = client.force_unlock("stuck").await?;
/// println!("{} holder(s), {} waiter(s) removed", removed.holders, removed.waiters);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ForceUnlocked {
    /// What the name was in use as; `None` when nothing was stored under it.
    pub kind: Option<LockKind>,
    /// How many owners held it (read holds and permits count per owner).
    pub holders: u32,
    /// How many queued waiters lost their place (they are told, and ask again).
    pub waiters: u32,
}
