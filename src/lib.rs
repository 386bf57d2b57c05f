//! Distributed locks for async Rust, backed by Redis.
//!
//! redlatch gives tokio services synchronization shared across processes through one Redis
//! server: a reentrant [`Mutex`], a strictly FIFO [`FairMutex`], a counting [`Semaphore`] with
//! leased permits, a read-write [`RwLock`] and a leader [`Election`], with what a lock service
//! needs beyond `SET NX`:
//!
//! * **leases and a watchdog**: every hold has a lease (30 s by default) that one background
//!   task per client renews while the guard lives, so a crashed holder frees the lock within a
//!   lease and a live one keeps it for as long as it works;
//! * **a loss signal**: [`MutexGuard::lost`] completes, and [`MutexGuard::is_held`] turns
//!   false, the moment the lease is known lost; a lost guard never becomes held again;
//! * **fencing tokens**: [`MutexGuard::fencing_token`] rises with every acquisition, so the
//!   storage you write to can refuse a holder whose lease ran out while it was paused;
//! * **push wake-up**: a release wakes the next waiter through one shared subscription, in about
//!   one round trip, with no herd of retries and no polling; the queued primitives hand the hold
//!   to the next waiter inside the release itself;
//! * **explicit reentrancy**: [`MutexGuard::reenter`], or [`Mutex::lock_as`] with an
//!   [`OwnerToken`] carried to another task or process;
//! * **cancel safety**: dropping a `lock()` future never leaves the lock held;
//! * **the whole method matrix** on every primitive, as tokio has it: wait, timed wait and
//!   single attempt, for a new owner or a carried one; a timed-out wait says how long the
//!   holder's lease had left ([`Error::Timeout`]), and every guard gives a [`HoldView`] for code
//!   that watches a hold it does not own;
//! * **tower layers** (feature `tower`, on by default): [`layer::LockLayer`] and
//!   [`layer::PermitLayer`] hold a lock or a permit for each HTTP request, for axum, hyper and
//!   tonic;
//! * **Redis Cluster** (feature `cluster`): `LockClient::cluster` runs every primitive on a
//!   sharded cluster, with wake-ups by sharded pub/sub, through slot moves and failovers;
//! * **metrics** (feature `metrics`): acquisitions, waits, holds, timeouts, lost leases,
//!   renewals, hand-overs, errors and waiters per primitive kind, through the `metrics` facade
//!   (see [Metrics and tracing](#metrics-and-tracing)).
//!
//! ```no_run
//! # async fn demo() -> redlatch::Result<()> {
//! let client = redlatch::LockClient::from_url("redis://127.0.0.1:6379")?;
//! let mutex = client.mutex("orders:42")?;
//!
//! let guard = mutex.lock().await?;
//! let token = guard.fencing_token(); // hand this to the storage you write to
//! # let _ = token;
//! guard.unlock().await?;
//! # Ok(()) }
//! ```
//!
//! The other primitives come from the same client, and [`LockClient::inspect`] shows what is
//! going on under any name:
//!
//! ```no_run
//! # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
//! let turn = client.fair_mutex("printer")?.lock().await?; // first come, first served
//! let permit = client.semaphore("renderers", 4)?.acquire().await?; // at most 4 at once
//! let reader = client.rwlock("config")?.read().await?; // many readers or one writer
//! println!("{}", client.inspect("printer").await?);
//! # Ok(()) }
//! ```
//!
//! # Guarantees and their limits
//!
//! On one Redis server, the lock is exclusive as long as holders finish within their lease;
//! the watchdog keeps the lease going while the process is alive and can reach Redis. A holder
//! that is paused (GC, swap, SIGSTOP) past its lease, or cut off from Redis, loses the lock
//! while it may still be working: that is what [`MutexGuard::lost`] and fencing tokens are for.
//! With asynchronous replication, a failover can lose a lock that the old master granted;
//! [`Durability`] makes acquisitions count only once replicas have them, which narrows that
//! window (fencing tokens are what close it for a store).
//!
//! On a Redis Cluster each name lives on the master that serves its hash slot, with the same
//! guarantees as on one server; when the slot moves, holders keep their holds and waiters
//! follow it, and requests that the cluster client re-sends after a lost reply change hold
//! counts once. The cluster section of the README says what holds during failovers.
//!
//! A Redlock client ([`LockClient::redlock`]) asks N independent masters and holds a
//! [`Mutex`] only when a majority granted it, so the loss of a minority of servers changes
//! nothing; its fencing tokens rise across any majorities without relying on clocks
//! ([`Fencing`]). It needs servers that keep what they granted across a restart
//! (`appendfsync always`, or a restart delayed by the longest lease); the README's Redlock
//! section says what holds under which conditions.
//!
//! # Metrics and tracing
//!
//! With the feature `metrics`, redlatch records through the [`metrics`](https://docs.rs/metrics)
//! facade; the application installs the recorder (exporter) it wants, and without one each
//! record costs one check. Labelled by primitive kind (`kind`: `mutex`, `fair_mutex`,
//! `semaphore`, `rwlock`, `election`), never by name, so the series stay few:
//!
//! | metric | type | what |
//! |---|---|---|
//! | `redlatch_acquisitions_total` | counter | holds taken (waits and single attempts) |
//! | `redlatch_wait_seconds` | histogram | from the call to the hold |
//! | `redlatch_timeouts_total` | counter | waits that ran out of time |
//! | `redlatch_hold_seconds` | histogram | from the hold to its guard letting go |
//! | `redlatch_leases_lost_total` | counter | holds found lost while their guard held them |
//! | `redlatch_renewals_total` | counter | holds the watchdog renewed (or tried to) |
//! | `redlatch_renewal_seconds` | histogram | one renewal call (a batch; no `kind`) |
//! | `redlatch_handovers_total` | counter | holds handed over, `via` `redis` (a queued primitive's release) or `local` (a mutex passed between this client's tasks) |
//! | `redlatch_errors_total` | counter | acquisitions that failed, by `error`: `connection`, `timeout`, `pool`, `redis`, `foreign_data`, `not_replicated`, `protocol`, `refused` |
//! | `redlatch_waiters` | gauge | waits of this client going on now (the name found busy, or queued behind a task of this client) |
//!
//! Logs go through [`tracing`](https://docs.rs/tracing) (`debug` and `warn`); the target
//! `redlatch::timeline` carries a `TRACE` event at each hop of the wake path, from a release to
//! the woken waiter's acquire returning (`redlatch bench --timeline` times them).
//!
//! # Redis layout
//!
//! A mutex is `<prefix>:{<name>}` (a string: the hold's fencing token, hold count and owner; its
//! TTL is the lease), `<prefix>:{<name>}:fence` (a sorted set whose member `~` scores the last
//! fencing token issued) and the channel `<prefix>:{<name>}:wake`. The queued primitives keep
//! their state in a hash under `<prefix>:{<name>}` and add `:holders` and `:queue` (sorted sets
//! timed by the server's clock); a single hold with nobody waiting is a string there instead.
//! Every key of a name shares the hash tag, so each script touches one slot. A name the client
//! last saw free is taken in one round trip of plain commands, without a script. The scripts
//! live in `lua/v1/`; see `lua/README.md` for their contracts.
//!
//! # Minimum supported Rust version
//!
//! Rust 1.88. Raising it is not a breaking change.

#![cfg_attr(docsrs, feature(doc_cfg))]
#![doc(test(attr(deny(warnings), allow(dead_code, unused_variables))))]

mod acquire;
mod backend;
mod client;
mod config;
mod core;
mod error;
mod inspect;
mod key;
#[cfg(feature = "tower")]
#[cfg_attr(docsrs, doc(cfg(feature = "tower")))]
pub mod layer;
mod lease;
mod meter;
mod notify;
mod protocol;
mod sync;
mod time;
mod timeline;
mod token;

pub use client::{LockClient, LockClientBuilder};
pub use config::{
    DEFAULT_LEASE, Durability, FENCE_TTL, Fencing, LocalHandoff, MAX_LEASE, MIN_LEASE,
};
pub use error::{Error, Result};
pub use inspect::{ForceUnlocked, HolderInfo, LockKind, Snapshot, WaiterInfo, Wants};
pub use key::{MAX_NAME_LEN, MAX_PREFIX_LEN};
pub use lease::{HoldView, Lost};
pub use sync::{
    Election, FairMutex, Leader, LeaderStream, Leadership, MAX_LEADER_VALUE, Mutex, MutexGuard,
    RwLock, RwLockReadGuard, RwLockWriteGuard, Semaphore, SemaphorePermit,
};
pub use token::OwnerToken;

/// The `deadpool-redis` this crate is built against, so the pool you pass matches.
pub use deadpool_redis;

/// The README's examples, compiled (and, where they do not say `no_run`, run) with the doc
/// tests, so that what a newcomer copies from it builds. They use every feature.
#[cfg(all(
    doctest,
    feature = "axum",
    feature = "cluster",
    feature = "sentinel",
    feature = "metrics"
))]
#[doc = include_str!("../README.md")]
struct ReadmeExamples;
