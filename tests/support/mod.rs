//! Shared test harness: a Redis server per test (or `REDIS_URL`), clients on separate pools,
//! and helpers to look at what is left in Redis. The server side is `redlatch-harness`'s
//! `TestServer`; this adds the redlatch clients.
#![allow(dead_code, unreachable_pub, unused_imports)]

pub mod replicated;

use std::ops::{Deref, DerefMut};

use deadpool_redis::{Config, Pool, Runtime};
use redlatch::LockClient;
use redlatch_harness::TestServer;
pub use redlatch_harness::{
    RedisServer, crashing, racy_increment, unique, until, until_within, within,
};

/// One server for one test, and redlatch clients for it.
pub struct TestRedis(TestServer);

impl Deref for TestRedis {
    type Target = TestServer;

    fn deref(&self) -> &TestServer {
        &self.0
    }
}

impl DerefMut for TestRedis {
    fn deref_mut(&mut self) -> &mut TestServer {
        &mut self.0
    }
}

impl TestRedis {
    /// `REDIS_URL` when set, else a fresh server.
    pub fn new() -> Self {
        Self(TestServer::new())
    }

    /// Always a fresh server of our own, for tests that kill, pause or flush it.
    pub fn own() -> Self {
        Self(TestServer::own())
    }

    pub fn pool(&self) -> Pool {
        Config::from_url(&self.url)
            .create_pool(Some(Runtime::Tokio1))
            .expect("pool")
    }

    /// A client on its own pool: a stand-in for another process.
    pub fn client(&self) -> LockClient {
        self.builder().build().expect("client")
    }

    pub fn builder(&self) -> redlatch::LockClientBuilder {
        LockClient::builder(self.pool(), self.url.as_str()).key_prefix(&self.prefix)
    }

    /// A client builder (prefix set) whose connections go through a proxy of their own, to cut
    /// that client off from the server (`Proxy::set`); the proxy lives as long as it is kept.
    pub async fn through_proxy(
        &self,
    ) -> (redlatch_harness::proxy::Proxy, redlatch::LockClientBuilder) {
        let upstream = self
            .url
            .trim_start_matches("redis://")
            .parse()
            .expect("a loopback address");
        let proxy = redlatch_harness::proxy::Proxy::start(upstream)
            .await
            .expect("proxy");
        let pool = Config::from_url(proxy.url())
            .create_pool(Some(Runtime::Tokio1))
            .expect("pool");
        let builder = LockClient::builder(pool, proxy.url().as_str()).key_prefix(&self.prefix);
        (proxy, builder)
    }

    /// A writer of `name` in a process that then dies: its hold stays until `lease` runs out,
    /// never released or renewed. Returns when it asked for the hold (its lease began later).
    pub fn crashed_writer(&self, name: &str, lease: std::time::Duration) -> std::time::Instant {
        let mut taken = None;
        crashing(|| async {
            let client = self.builder().default_lease(lease).build().unwrap();
            // Before the request: its lease cannot start earlier.
            taken = Some(std::time::Instant::now());
            let writer = client.rwlock(name).unwrap().write().await.unwrap();
            // Never released and, once the runtime is gone, never renewed.
            let _ = Box::leak(Box::new(writer));
        });
        taken.expect("the writer took its hold")
    }

    /// How many waiters `client` sees queued for `name`; 0 while its look times out (a
    /// client still sending thousands of waiters' attempts on a slow machine: not yet).
    pub async fn queued(&self, client: &LockClient, name: &str) -> usize {
        match client.inspect(name).await {
            Ok(snapshot) => snapshot.waiters.len(),
            Err(redlatch::Error::Redis(err)) if err.is_timeout() => 0,
            Err(err) => panic!("inspect: {err}"),
        }
    }

    /// What is left, by the server's clock, of the exclusive hold of `name` when its state is a
    /// queued primitive's meta hash (a fair mutex, a writer, an election's leader): its lease
    /// end (`~wexp`), which the keys outlive.
    pub async fn exclusive_lease_left(&self, name: &str) -> std::time::Duration {
        let mut conn = self.conn().await;
        let ends: u64 = redis::cmd("HGET")
            .arg(self.lock_key(name))
            .arg("~wexp")
            .query_async(&mut conn)
            .await
            .expect("HGET ~wexp");
        let now = redlatch_harness::measure::server_micros(&mut conn)
            .await
            .expect("TIME")
            / 1000;
        std::time::Duration::from_millis(ends.saturating_sub(now))
    }

    /// Whether a client listens to a wake-up channel of `name` (the name's own, or a client's
    /// channel of it).
    pub async fn listened(&self, name: &str) -> bool {
        let mut conn = self.conn().await;
        let active: Vec<String> = redis::cmd("PUBSUB")
            .arg("CHANNELS")
            .arg(format!("{}:wake*", self.lock_key(name)))
            .query_async(&mut conn)
            .await
            .unwrap();
        !active.is_empty()
    }

    /// Waits until a waiter's busy attempt has marked the plain mutex `name` (the lock
    /// string's wait field is `w`): its holder's release will publish.
    pub async fn marked(&self, name: &str) {
        marked(self.conn().await, &self.lock_key(name)).await;
    }
}

/// Waits until a waiter's busy attempt has marked the plain mutex whose lock key is `lock` on
/// the server of `conn` (the lock string's wait field is `w`).
pub async fn marked(conn: redis::aio::MultiplexedConnection, lock: &str) {
    until(|| {
        let mut conn = conn.clone();
        async move {
            let v: Option<String> = redis::cmd("GET")
                .arg(lock)
                .query_async(&mut conn)
                .await
                .unwrap();
            v.is_some_and(|v| v.split(' ').nth(3) == Some("w"))
        }
    })
    .await;
}

/// Logs to the test writer when `RUST_LOG` is set.
pub fn trace_init() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}
