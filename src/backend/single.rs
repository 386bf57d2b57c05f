//! One Redis server: requests multiplexed over one connection taken from the caller's
//! `deadpool_redis::Pool` (cloned per request, taken again after a connection failure), so a
//! lock operation costs exactly its script call and no pool check-out round trip.

use std::time::Duration;

use deadpool_redis::Pool;
use redis::aio::MultiplexedConnection;
use redis::{Cmd, ErrorKind, ServerErrorKind, Value};
use tokio::time::Instant;

use super::Request;
use super::durable::{Acked, Durable, Want};
use super::script::{By, Publish, Script, by_source};
use crate::error::Result;

/// How long requests may go unanswered (each timing out) before the connection is given up for
/// a new one. Shorter stalls keep it: a server that is only slow (paused, busy) still runs the
/// requests sent, in order, and a release sent before a stall still happens after it.
const STALL: Duration = Duration::from_secs(2);

/// One Redis server.
pub(crate) struct Node {
    pool: Pool,
    /// Loaded on every new connection: a call is then by hash even on its first use, so one
    /// that a pause holds up still runs when the pause ends (a hash the server does not know
    /// fails then, and nobody is left to send the source).
    scripts: Vec<&'static Script>,
    conn: std::sync::Mutex<Option<MultiplexedConnection>>,
    connecting: tokio::sync::Mutex<()>,
    /// Since when requests have been timing out with no answer between.
    stalled_since: std::sync::Mutex<Option<Instant>>,
    /// The connection of durable calls, whose `WAIT` would block every other request.
    durable: std::sync::OnceLock<Durable>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("pool", &self.pool.status())
            .finish()
    }
}

impl Node {
    pub(crate) fn new(pool: Pool, scripts: Vec<&'static Script>) -> Self {
        Self {
            pool,
            scripts,
            conn: std::sync::Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
            stalled_since: std::sync::Mutex::new(None),
            durable: std::sync::OnceLock::new(),
        }
    }

    fn cached(&self) -> Option<MultiplexedConnection> {
        self.conn.lock().ok().and_then(|c| c.clone())
    }

    /// The shared multiplexed connection, taken from the pool on first use and after a failure.
    async fn connection(&self) -> Result<MultiplexedConnection> {
        if let Some(conn) = self.cached() {
            return Ok(conn);
        }
        let _single_flight = self.connecting.lock().await;
        if let Some(conn) = self.cached() {
            return Ok(conn);
        }
        let conn = connect(&self.pool, &self.scripts).await?;
        if let Ok(mut slot) = self.conn.lock() {
            *slot = Some(conn.clone());
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
        let mut conn = self.connection().await?;
        let reply = send_on(&mut conn, by_hash, source).await;
        match reply {
            Ok(value) => {
                self.stalled(false);
                Ok(value)
            }
            Err(err) => {
                let broken = err.is_unrecoverable_error() || err.is_connection_dropped();
                let stalled = err.is_timeout() && self.stalled(true);
                let failed = err.is_io_error() && !err.is_timeout();
                // A demoted master still answers (`PING` too, so a pool cannot tell): the next
                // request takes another connection, which a Sentinel-aware pool makes to the
                // new master.
                let demoted = matches!(
                    err.kind(),
                    ErrorKind::Server(ServerErrorKind::ReadOnly | ServerErrorKind::MasterDown)
                );
                if (broken || stalled || failed || demoted)
                    && let Ok(mut slot) = self.conn.lock()
                {
                    slot.take();
                }
                Err(err.into())
            }
        }
    }

    /// Runs `request` over the durable connection (started on first use), then waits for
    /// `want` replicas to acknowledge it: its raw reply and the acknowledgements.
    pub(crate) async fn send_durable<R: Request>(&self, request: &R, want: Want) -> Result<Acked> {
        let durable = self
            .durable
            .get_or_init(|| Durable::spawn(self.pool.clone(), self.scripts.clone()));
        let (by_hash, source) = request.call(By::hash(Publish::Plain)).into_parts();
        durable.send(by_hash, source, want).await
    }

    /// Notes an answer (`timed_out` false) or a timeout; true when requests have been timing
    /// out for longer than [`STALL`].
    fn stalled(&self, timed_out: bool) -> bool {
        let Ok(mut since) = self.stalled_since.lock() else {
            return false;
        };
        if !timed_out {
            *since = None;
            return false;
        }
        let first = *since.get_or_insert_with(Instant::now);
        if first.elapsed() >= STALL {
            *since = None;
            return true;
        }
        false
    }
}

/// Sends `by_hash` on `conn`, or the script's source by `EVAL` if the server lacks it.
pub(super) async fn send_on(
    conn: &mut MultiplexedConnection,
    by_hash: &Cmd,
    source: &str,
) -> redis::RedisResult<Value> {
    match by_hash.query_async(conn).await {
        Err(err) if err.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            by_source(by_hash, source).query_async(conn).await
        }
        other => other,
    }
}

/// A connection of its own from `pool`, with `scripts` loaded, so that a call is by hash even
/// on its first use.
pub(super) async fn connect(
    pool: &Pool,
    scripts: &[&'static Script],
) -> Result<MultiplexedConnection> {
    // Boxed: the pool's future is several kilobytes, and every lock future would carry it.
    let mut conn = deadpool_redis::Connection::take(Box::pin(pool.get()).await?);
    let mut load = redis::pipe();
    for script in scripts {
        load.add_command(script.load(Publish::Plain)).ignore();
    }
    // A failed load costs nothing: a call by hash falls back to the source.
    let _: redis::RedisResult<()> = load.query_async(&mut conn).await;
    Ok(conn)
}
