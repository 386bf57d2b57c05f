//! A master and a replica on loopback whose replication goes through a proxy a test can cut,
//! with a key prefix of the test's own and redlatch clients of either server.

use deadpool_redis::{Config, Runtime};
use redis::aio::MultiplexedConnection;
use redlatch::{LockClient, LockClientBuilder};
use redlatch_harness::RedisServer;
use redlatch_harness::proxy::Proxy;
use redlatch_harness::replication::ReplicaPair;
use redlatch_harness::unique;

/// A master and a replica that replicates it through a proxy.
pub struct Replicated {
    pub master: RedisServer,
    pub replica: RedisServer,
    pub link: Proxy,
    pub prefix: String,
}

impl Replicated {
    pub async fn start() -> Self {
        let ReplicaPair {
            master,
            replica,
            link,
        } = ReplicaPair::start().await.expect("master and replica");
        Self {
            master,
            replica,
            link,
            prefix: unique("replicas"),
        }
    }

    /// A client of `server` only (no Sentinel), under the prefix.
    pub fn builder(&self, server: &RedisServer) -> LockClientBuilder {
        let pool = Config::from_url(server.url())
            .create_pool(Some(Runtime::Tokio1))
            .expect("pool");
        LockClient::builder(pool, server.url().as_str()).key_prefix(&self.prefix)
    }

    pub async fn conn(&self, server: &RedisServer) -> MultiplexedConnection {
        redis::Client::open(server.url())
            .expect("url")
            .get_multiplexed_async_connection()
            .await
            .expect("connect")
    }

    /// How many times the master ran `command` (`INFO commandstats`).
    pub async fn calls(&self, command: &str) -> u64 {
        let mut conn = self.conn(&self.master).await;
        let stats = redlatch_harness::measure::commandstats(&mut conn)
            .await
            .expect("INFO commandstats");
        stats.get(command).copied().unwrap_or(0)
    }

    /// Whether `server` has the lock key of `name`.
    pub async fn exists(&self, server: &RedisServer, name: &str) -> bool {
        let mut conn = self.conn(server).await;
        redis::cmd("EXISTS")
            .arg(format!("{}:{{{name}}}", self.prefix))
            .query_async(&mut conn)
            .await
            .expect("EXISTS")
    }
}
