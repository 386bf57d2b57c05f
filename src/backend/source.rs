//! Where one server's connections come from: a fixed address (the caller's pool for requests,
//! a client of that address for the subscription), or, with the `sentinel` feature, the master
//! that Sentinel names now, for both.
//!
//! A source also says when its server has changed under open connections ([`Source::moves`]):
//! after a Sentinel failover, connections to the old master are given up at once instead of
//! waiting for them to fail.

#[cfg(feature = "sentinel")]
use std::sync::Arc;

use deadpool_redis::Pool;
use redis::aio::{AsyncPushSender, MultiplexedConnection};
use redis::{AsyncConnectionConfig, ProtocolVersion};
use tokio::sync::watch;

use super::script::{Publish, Script};
use crate::error::Result;

#[cfg(feature = "sentinel")]
use super::sentinel::Master;

/// Where one server's connections come from.
#[derive(Debug, Clone)]
pub(crate) enum Source {
    /// One address: requests through the caller's pool, the subscription through a client of
    /// the same address.
    Fixed {
        pool: Pool,
        server: Box<redis::Client>,
    },
    /// The master that the sentinels name now.
    #[cfg(feature = "sentinel")]
    Sentinel(Arc<Master>),
}

impl Source {
    /// A connection of its own for requests, with `scripts` loaded, so that a call is by hash
    /// even on its first use.
    pub(crate) async fn connect(
        &self,
        scripts: &[&'static Script],
    ) -> Result<MultiplexedConnection> {
        let mut conn = match self {
            Self::Fixed { pool, .. } => {
                // Boxed: the pool's future is several kilobytes, and every lock future would
                // carry it.
                deadpool_redis::Connection::take(Box::pin(pool.get()).await?)
            }
            #[cfg(feature = "sentinel")]
            Self::Sentinel(master) => {
                Box::pin(master.client())
                    .await?
                    .get_multiplexed_async_connection()
                    .await?
            }
        };
        let mut load = redis::pipe();
        for script in scripts {
            load.add_command(script.load(Publish::Plain)).ignore();
        }
        // A failed load costs nothing: a call by hash falls back to the source.
        let _: redis::RedisResult<()> = load.query_async(&mut conn).await;
        Ok(conn)
    }

    /// A subscription connection: RESP3, whatever the address says, so that what the server
    /// pushes (messages, and the connection's end) goes to `pusher` as the reader reads it.
    pub(crate) async fn push_connection(
        &self,
        pusher: impl AsyncPushSender,
    ) -> redis::RedisResult<MultiplexedConnection> {
        let client = match self {
            Self::Fixed { server, .. } => resp3(server)?,
            #[cfg(feature = "sentinel")]
            Self::Sentinel(master) => resp3(&master.client().await?)?,
        };
        let config = AsyncConnectionConfig::new().set_push_sender(pusher);
        client
            .get_multiplexed_async_connection_with_config(&config)
            .await
    }

    /// How many times the server has changed (0 for a fixed address): a connection made at
    /// another count is to a server that is no longer the one to use.
    pub(crate) fn generation(&self) -> u64 {
        match self {
            Self::Fixed { .. } => 0,
            #[cfg(feature = "sentinel")]
            Self::Sentinel(master) => master.generation(),
        }
    }

    /// Counts the server's changes (Sentinel's failovers, as this client heard them); `None`
    /// for a fixed address, which never changes. A connection made before the count moved is
    /// to a server that is no longer the one to use.
    pub(crate) fn moves(&self) -> Option<watch::Receiver<u64>> {
        match self {
            Self::Fixed { .. } => None,
            #[cfg(feature = "sentinel")]
            Self::Sentinel(master) => Some(master.moves()),
        }
    }
}

/// `client`'s address and settings, over RESP3.
fn resp3(client: &redis::Client) -> redis::RedisResult<redis::Client> {
    let info = client.get_connection_info().clone();
    let settings = info
        .redis_settings()
        .clone()
        .set_protocol(ProtocolVersion::RESP3);
    redis::Client::open(info.set_redis_settings(settings))
}
