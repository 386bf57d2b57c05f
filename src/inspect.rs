//! [`Snapshot`]: the state of one name, as [`LockClient::inspect`] reads it.

use std::fmt;
use std::time::Duration;

use redis::Value;

use crate::client::LockClient;
use crate::config::FENCE_TTL;
use crate::error::{Error, Result, wrong_type};
use crate::key::LockKeys;
use crate::scripts::{
    FAIR_LAYOUT, FORCE_UNLOCK, INSPECT, MUTEX_LAYOUT, RWLOCK_LAYOUT, Reply, SEMAPHORE_LAYOUT, int,
};
use crate::token::SHORT_ID_LEN;

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
    /// The client (process) it waits in: its places go together if that client is found gone.
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

/// What [`LockClient::force_unlock`] removed.
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

fn kind_of(layout: &str, keys: &LockKeys) -> Result<Option<LockKind>> {
    Ok(match layout {
        "" => None,
        MUTEX_LAYOUT => Some(LockKind::Mutex),
        FAIR_LAYOUT => Some(LockKind::FairMutex),
        SEMAPHORE_LAYOUT => Some(LockKind::Semaphore),
        RWLOCK_LAYOUT => Some(LockKind::RwLock),
        _ => {
            return Err(Error::Layout {
                key: keys.lock.clone(),
                found: layout.to_owned(),
                expected: "a layout of version 1",
            });
        }
    })
}

pub(crate) async fn force_unlock(client: &LockClient, name: &str) -> Result<ForceUnlocked> {
    let keys = LockKeys::new(&client.inner.config.prefix, name)?;
    let mut invocation = FORCE_UNLOCK.prepare_invoke();
    for key in keys.queued() {
        invocation.key(key);
    }
    invocation
        .arg(&keys.wake)
        .arg(crate::config::millis(FENCE_TTL));
    let raw = client.inner.node.invoke(&invocation).await?;
    let keys_list = keys.queued();
    let raw = match raw {
        // The status of a successful removal is the layout tag, not a number.
        Value::Array(items) if matches!(items.first(), Some(Value::BulkString(_))) => items,
        other => {
            let (status, reply) =
                Reply::decode("force_unlock", other, &keys_list, "a layout of version 1")?;
            return Err(reply.unexpected(status));
        }
    };
    let layout = match raw.first() {
        Some(v) => text(v)?,
        None => String::new(),
    };
    let count = |i: usize| {
        raw.get(i)
            .map(count)
            .transpose()
            .map(Option::unwrap_or_default)
    };
    Ok(ForceUnlocked {
        kind: kind_of(&layout, &keys)?,
        holders: count(1)?,
        waiters: count(2)?,
    })
}

pub(crate) async fn inspect(client: &LockClient, name: &str) -> Result<Snapshot> {
    let keys = LockKeys::new(&client.inner.config.prefix, name)?;
    let mut invocation = INSPECT.prepare_invoke();
    for key in keys.queued() {
        invocation.key(key);
    }
    let raw = client.inner.node.invoke(&invocation).await?;
    parse(name, raw, &keys)
}

fn bad(detail: String) -> Error {
    Error::Protocol {
        script: "inspect",
        detail,
    }
}

fn text(v: &Value) -> Result<String> {
    match v {
        Value::BulkString(b) => Ok(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Ok(s.clone()),
        Value::Int(i) => Ok(i.to_string()),
        other => Err(bad(format!("expected text, got {other:?}"))),
    }
}

fn num(v: &Value) -> Result<i64> {
    int(v).ok_or_else(|| bad(format!("expected an integer, got {v:?}")))
}

fn count(v: &Value) -> Result<u32> {
    Ok(u32::try_from(num(v)?.max(0)).unwrap_or(u32::MAX))
}

fn millis(v: &Value) -> Result<Option<Duration>> {
    Ok(u64::try_from(num(v)?).ok().map(Duration::from_millis))
}

fn short(id: &str) -> String {
    id.chars().take(SHORT_ID_LEN).collect()
}

fn parse(name: &str, raw: Value, keys: &LockKeys) -> Result<Snapshot> {
    let Value::Array(items) = raw else {
        return Err(bad(format!("expected an array, got {raw:?}")));
    };
    match items.first() {
        Some(Value::Int(-1)) => {
            let key = match items.get(2).and_then(int) {
                Some(2) => &keys.holders,
                Some(3) => &keys.queue,
                Some(4) => &keys.fence,
                _ => &keys.lock,
            };
            let found = items.get(1).map(text).transpose()?.unwrap_or_default();
            return Err(wrong_type(key, &found));
        }
        Some(Value::Int(-2)) => {
            return Err(Error::Layout {
                key: keys.lock.clone(),
                found: items.get(1).map(text).transpose()?.unwrap_or_default(),
                expected: "a layout of version 1",
            });
        }
        _ => {}
    }
    let [
        layout,
        _used,
        cap,
        last,
        Value::Array(holders),
        Value::Array(waiters),
    ] = &items[..]
    else {
        return Err(bad(format!("unexpected reply {items:?}")));
    };
    let kind = kind_of(&text(layout)?, keys)?;
    let holders = holders
        .chunks(4)
        .map(|h| match h {
            [id, x, n, left] => Ok(HolderInfo {
                id: short(&text(id)?),
                exclusive_holds: count(x)?,
                shared_holds: count(n)?,
                lease_left: millis(left)?,
            }),
            _ => Err(bad(format!("truncated holder {h:?}"))),
        })
        .collect::<Result<Vec<_>>>()?;
    let waiters = waiters
        .chunks(3)
        .map(|w| match w {
            [id, want, client] => {
                let want = text(want)?;
                // op, units, then `/` and the lease it asked for
                let units = want
                    .get(1..)
                    .and_then(|rest| rest.split('/').next())
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(1);
                let wants = match want.chars().next() {
                    Some('r') => Wants::Read,
                    Some('w') => Wants::Write,
                    Some('s') => Wants::Permits(units),
                    _ => Wants::Exclusive,
                };
                Ok(WaiterInfo {
                    id: short(&text(id)?),
                    wants,
                    client: text(client)?,
                })
            }
            _ => Err(bad(format!("truncated waiter {w:?}"))),
        })
        .collect::<Result<Vec<_>>>()?;
    let semaphore = kind == Some(LockKind::Semaphore);
    let last = num(last)?;
    Ok(Snapshot {
        name: name.to_owned(),
        permits_in_use: semaphore.then(|| holders.iter().map(|h| h.shared_holds).sum()),
        capacity: if semaphore { Some(count(cap)?) } else { None },
        last_fencing_token: u64::try_from(last).ok().filter(|t| *t > 0),
        kind,
        holders,
        waiters,
    })
}
