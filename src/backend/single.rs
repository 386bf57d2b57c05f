//! One Redis server: requests multiplexed over one connection taken from its [`Source`] (the
//! caller's `deadpool_redis::Pool`, or the master Sentinel names), cloned per request and taken
//! again after a connection failure or a failover, so a lock operation costs exactly its script
//! call and no pool check-out round trip.

use std::sync::atomic::{AtomicU64, Ordering};
use std::task::Poll;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{Cmd, ErrorKind, Pipeline, ServerErrorKind, Value};
use tokio::time::Instant;

use super::Request;
use super::durable::{Acked, Durable, Want};
use super::script::{By, Publish, Script, by_source};
use super::source::Source;
use crate::config::millis;
use crate::error::Result;

/// How long requests may go unanswered (each timing out) before the connection is given up for
/// a new one. Shorter stalls keep it: a server that is only slow (paused, busy) still runs the
/// requests sent, in order, and a release sent before a stall still happens after it.
const STALL: Duration = Duration::from_secs(2);

/// The most durability settings with a durable connection of their own, per server: further
/// settings (handles that work their timeouts out per call, say) share the last one.
const DURABLE_CONNECTIONS: usize = 8;

/// The durable connection `want`'s calls go on, among `durables`: its own, or the last one once
/// there are [`DURABLE_CONNECTIONS`]; `None` when it has none yet.
fn durable_of(durables: &[(Want, Durable)], want: Want) -> Option<Durable> {
    match durables.iter().find(|(w, _)| *w == want) {
        Some((_, durable)) => Some(durable.clone()),
        None if durables.len() >= DURABLE_CONNECTIONS => durables.last().map(|(_, d)| d.clone()),
        None => None,
    }
}

/// One Redis server.
pub(crate) struct Node {
    source: Source,
    /// Loaded on every new connection: a call is then by hash even on its first use, so one
    /// that a pause holds up still runs when the pause ends (a hash the server does not know
    /// fails then, and nobody is left to send the source).
    scripts: Vec<&'static Script>,
    /// The shared connection, and the source's generation when it was made.
    conn: std::sync::Mutex<Option<(MultiplexedConnection, u64)>>,
    connecting: tokio::sync::Mutex<()>,
    /// Since when requests have been timing out with no answer between: milliseconds after
    /// `epoch`, plus one (0 while they have not been). An atomic, so that an answer costs one
    /// read and no lock.
    stalled_since: AtomicU64,
    epoch: Instant,
    /// The connections of durable calls, whose `WAIT` would block every other request: one
    /// per durability setting used (up to [`DURABLE_CONNECTIONS`]), so that one setting's long
    /// `WAIT` never holds up the calls (and renewals) of another.
    durable: std::sync::Mutex<Vec<(Want, Durable)>>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

impl Node {
    pub(crate) fn new(source: Source, scripts: Vec<&'static Script>) -> Self {
        Self {
            source,
            scripts,
            conn: std::sync::Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
            stalled_since: AtomicU64::new(0),
            epoch: Instant::now(),
            durable: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// The shared connection, unless the server changed since it was made (a failover).
    fn cached(&self) -> Option<MultiplexedConnection> {
        let generation = self.source.generation();
        let mut slot = self.conn.lock().ok()?;
        match &*slot {
            Some((conn, made)) if *made == generation => Some(conn.clone()),
            Some(_) => {
                slot.take();
                None
            }
            None => None,
        }
    }

    /// The shared multiplexed connection, taken from the pool on first use and after a failure.
    async fn connection(&self) -> Result<MultiplexedConnection> {
        match self.cached() {
            Some(conn) => Ok(conn),
            // Connecting is rare and its future large: boxed, it leaves every request's future
            // the size of its send, which each await of the layers above copies.
            None => {
                let connect: std::pin::Pin<Box<dyn Future<Output = _> + Send + '_>> =
                    Box::pin(self.connect());
                connect.await
            }
        }
    }

    /// Takes a new shared connection (one caller at a time), unless another caller just did.
    async fn connect(&self) -> Result<MultiplexedConnection> {
        let _single_flight = self.connecting.lock().await;
        if let Some(conn) = self.cached() {
            return Ok(conn);
        }
        let generation = self.source.generation();
        let conn = self.source.connect(&self.scripts).await?;
        if let Ok(mut slot) = self.conn.lock() {
            *slot = Some((conn.clone(), generation));
        }
        Ok(conn)
    }

    /// Runs a script by its SHA1 and returns its raw reply. A server that does not have the
    /// script cached is sent its source (`EVAL`), which runs and caches it at once: a cache
    /// flushed again in between cannot fail the call, as a load followed by a retry could.
    pub(crate) async fn invoke<R: Request>(&self, request: &R) -> Result<Value> {
        let (by_hash, source) = request.call(By::hash(Publish::Plain)).into_parts();
        self.send(&by_hash, source).await
    }

    /// Sends `by_hash`, the `EVALSHA` call of the script whose source is `source` (sent
    /// instead, by `EVAL`, to a server that lacks it), and returns its raw reply.
    pub(crate) async fn send(&self, by_hash: &Cmd, source: &str) -> Result<Value> {
        self.send_then(by_hash, source, || ()).await
    }

    /// [`send`](Self::send), calling `sent` once the call is on the connection (or has failed
    /// before): what a caller sends after `sent` runs after this call, pipelined behind it.
    /// The first poll of the call puts it on the connection, the task's cooperative budget
    /// notwithstanding; it waits only for a connection to be made, or for room in the
    /// connection's queue. (A script the server lost, sent again by its source after the
    /// `NOSCRIPT` answer, may run after what was sent meanwhile.)
    pub(crate) async fn send_then(
        &self,
        by_hash: &Cmd,
        source: &str,
        sent: impl FnOnce(),
    ) -> Result<Value> {
        let mut conn = match self.connection().await {
            Ok(conn) => conn,
            Err(err) => {
                sent();
                return Err(err);
            }
        };
        let mut reply = std::pin::pin!(tokio::task::unconstrained(send_on(
            &mut conn, by_hash, source
        )));
        let first = std::future::poll_fn(|cx| Poll::Ready(reply.as_mut().poll(cx))).await;
        sent();
        let reply = match first {
            Poll::Ready(reply) => reply,
            Poll::Pending => reply.await,
        };
        self.answered(reply)
    }

    /// Sends `pipeline` (plain commands, in one round trip) and returns one reply per command,
    /// a command's error as its value.
    pub(crate) async fn send_commands(&self, pipeline: &Pipeline) -> Result<Vec<Value>> {
        let mut conn = self.connection().await?;
        // The connection's own method rather than `Pipeline::query_async`, whose trait call
        // boxes a future of a kilobyte for every request. Our pipelines are never transactions
        // and ignore no command: the replies come one per command, errors as values.
        let replies =
            self.answered(conn.send_packed_commands(pipeline, 0, pipeline.len()).await)?;
        // A command's error comes back as its value; one from a demoted master gives up the
        // connection all the same.
        let demoted_reply = replies.iter().any(|reply| {
            matches!(reply, Value::ServerError(err)
                if demoted(&redis::RedisError::from(err.clone())))
        });
        if demoted_reply && let Ok(mut slot) = self.conn.lock() {
            slot.take();
        }
        Ok(replies)
    }

    /// Notes how a request went: a connection that broke, stalled or now talks to a demoted
    /// master is given up for a new one.
    fn answered<T>(&self, reply: redis::RedisResult<T>) -> Result<T> {
        match reply {
            Ok(value) => {
                self.stalled(false);
                Ok(value)
            }
            Err(err) => {
                let broken = err.is_unrecoverable_error() || err.is_connection_dropped();
                let stalled = err.is_timeout() && self.stalled(true);
                let failed = err.is_io_error() && !err.is_timeout();
                if (broken || stalled || failed || demoted(&err))
                    && let Ok(mut slot) = self.conn.lock()
                {
                    slot.take();
                }
                Err(err.into())
            }
        }
    }

    /// The durable connections, as they are now (every update is one push: a poisoned lock
    /// still holds a valid list).
    fn durables(&self) -> std::sync::MutexGuard<'_, Vec<(Want, Durable)>> {
        self.durable.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Completes once every call queued on the durable connection of `want` before it has
    /// run (at once if none was ever made).
    pub(crate) async fn durable_barrier(&self, want: Want) {
        let durable = durable_of(&self.durables(), want);
        if let Some(durable) = durable {
            durable.barrier().await;
        }
    }

    /// The durable connection of `want`: its own, started on first use, or, once
    /// [`DURABLE_CONNECTIONS`] settings have one, the last one made (which then carries every
    /// further setting's calls too, each round waiting for the most any of them wants).
    fn durable(&self, want: Want) -> Durable {
        let mut durables = self.durables();
        if let Some(durable) = durable_of(&durables, want) {
            return durable;
        }
        let durable = Durable::spawn(self.source.clone(), self.scripts.clone());
        durables.push((want, durable.clone()));
        durable
    }

    /// Runs `request` over the durable connection of `want`, then waits for `want` replicas
    /// to acknowledge it: its raw reply and the acknowledgements.
    pub(crate) async fn send_durable<R: Request>(&self, request: &R, want: Want) -> Result<Acked> {
        let durable = self.durable(want);
        let (by_hash, source) = request.call(By::hash(Publish::Plain)).into_parts();
        durable.send(by_hash, source, want).await
    }

    /// Notes an answer (`timed_out` false) or a timeout; true when requests have been timing
    /// out for longer than [`STALL`].
    fn stalled(&self, timed_out: bool) -> bool {
        if !timed_out {
            if self.stalled_since.load(Ordering::Relaxed) != 0 {
                self.stalled_since.store(0, Ordering::Relaxed);
            }
            return false;
        }
        let now = millis(self.epoch.elapsed()).saturating_add(1);
        // The first timeout since an answer sets the start; later ones read it.
        let first = self
            .stalled_since
            .compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed)
            .err()
            .unwrap_or(now);
        // One caller of those that find the stall long enough gives the connection up; the
        // next timeout starts counting again.
        now.saturating_sub(first) >= millis(STALL)
            && self
                .stalled_since
                .compare_exchange(first, 0, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }
}

/// Sends `by_hash` on `conn`, or the script's source by `EVAL` if the server lacks it.
pub(super) async fn send_on(
    conn: &mut MultiplexedConnection,
    by_hash: &Cmd,
    source: &str,
) -> redis::RedisResult<Value> {
    match call(conn, by_hash).await {
        Err(err) if err.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            call(conn, &by_source(by_hash, source)).await
        }
        other => other,
    }
}

/// `cmd.query_async(conn)` for a [`Value`], without the boxed future of a kilobyte that the
/// trait call makes for every request: the connection's own method, and a server error in the
/// reply (at its top or inside it) as the error.
async fn call(conn: &mut MultiplexedConnection, cmd: &Cmd) -> redis::RedisResult<Value> {
    conn.send_packed_command(cmd).await?.extract_error()
}

/// A demoted master still answers (`PING` too, so a pool cannot tell): after `READONLY` or
/// `MASTERDOWN` the connection it came on is given up, and the next one is taken from the
/// source (a Sentinel source makes it to the new master).
pub(super) fn demoted(err: &redis::RedisError) -> bool {
    matches!(
        err.kind(),
        ErrorKind::Server(ServerErrorKind::ReadOnly | ServerErrorKind::MasterDown)
    )
}
