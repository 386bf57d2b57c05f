//! One Redis server: requests multiplexed over one connection taken from the caller's
//! `deadpool_redis::Pool` (cloned per request, taken again after a connection failure), so a
//! lock operation costs exactly its script call and no pool check-out round trip.

use deadpool_redis::Pool;
use redis::aio::MultiplexedConnection;
use redis::{ErrorKind, ServerErrorKind, Value};

use super::Request;
use super::script::By;
use crate::error::Result;

/// One Redis server.
pub(crate) struct Node {
    pool: Pool,
    conn: std::sync::Mutex<Option<MultiplexedConnection>>,
    connecting: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("pool", &self.pool.status())
            .finish()
    }
}

impl Node {
    pub(crate) fn new(pool: Pool) -> Self {
        Self {
            pool,
            conn: std::sync::Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
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
        // Boxed: the pool's future is several kilobytes, and every lock future would carry it.
        let conn = deadpool_redis::Connection::take(Box::pin(self.pool.get()).await?);
        if let Ok(mut slot) = self.conn.lock() {
            *slot = Some(conn.clone());
        }
        Ok(conn)
    }

    /// Runs a script by its SHA1 and returns its raw reply. A server that does not have the
    /// script cached is sent its source (`EVAL`), which runs and caches it at once: a cache
    /// flushed again in between cannot fail the call, as a load followed by a retry could.
    pub(crate) async fn invoke<R: Request>(&self, request: &R) -> Result<Value> {
        let mut conn = self.connection().await?;
        let by_hash = request.call(By::Hash).into_cmd();
        let reply = match by_hash.query_async(&mut conn).await {
            Err(err) if err.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                let by_source = request.call(By::Source).into_cmd();
                by_source.query_async(&mut conn).await
            }
            other => other,
        };
        match reply {
            Ok(value) => Ok(value),
            Err(err) => {
                let broken = err.is_unrecoverable_error()
                    || err.is_connection_dropped()
                    || err.is_io_error();
                if broken && let Ok(mut slot) = self.conn.lock() {
                    slot.take();
                }
                Err(err.into())
            }
        }
    }
}
