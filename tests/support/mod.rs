//! Shared test harness: a Redis server per test (or `REDIS_URL`), clients on separate pools,
//! and helpers to look at what is left in Redis.
#![allow(dead_code, unreachable_pub)]

pub mod server;

use std::time::Duration;

use deadpool_redis::{Config, Pool, Runtime};
use redlatch::LockClient;
pub use server::RedisServer;

/// One server for one test: our own process, or the one `REDIS_URL` names.
pub struct TestRedis {
    /// Our own process, when we started one (fault-injection tests need it).
    pub server: Option<RedisServer>,
    pub url: String,
    /// A prefix no other test uses, so tests can share a `REDIS_URL` server.
    pub prefix: String,
}

impl TestRedis {
    /// `REDIS_URL` when set, else a fresh server.
    pub fn new() -> Self {
        match std::env::var("REDIS_URL") {
            Ok(url) if !url.is_empty() => Self {
                server: None,
                url,
                prefix: unique("rltest"),
            },
            _ => Self::own(),
        }
    }

    /// Always a fresh server of our own, for tests that kill, pause or flush it.
    pub fn own() -> Self {
        let server = RedisServer::start();
        Self {
            url: server.url(),
            server: Some(server),
            prefix: unique("rltest"),
        }
    }

    pub fn server(&mut self) -> &mut RedisServer {
        self.server
            .as_mut()
            .expect("this test needs its own server")
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

    /// A plain connection for looking at Redis directly.
    pub async fn conn(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url.as_str())
            .expect("client")
            .get_multiplexed_async_connection()
            .await
            .expect("connection")
    }

    /// Every key under this test's prefix.
    pub async fn keys(&self) -> Vec<String> {
        let mut conn = self.conn().await;
        let mut keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{}:*", self.prefix))
            .query_async(&mut conn)
            .await
            .expect("KEYS");
        keys.sort();
        keys
    }

    /// The keys left behind other than fencing counters (which outlive locks on purpose).
    pub async fn leftovers(&self) -> Vec<String> {
        self.keys()
            .await
            .into_iter()
            .filter(|k| !k.ends_with(":fence"))
            .collect()
    }

    /// Every key under this test's prefix, with its remaining time to live in ms: `-1` means
    /// the key would stay for ever.
    pub async fn ttls(&self) -> Vec<(String, i64)> {
        let mut conn = self.conn().await;
        let mut out = Vec::new();
        for key in self.keys().await {
            let ttl: i64 = redis::cmd("PTTL")
                .arg(&key)
                .query_async(&mut conn)
                .await
                .expect("PTTL");
            out.push((key, ttl));
        }
        out
    }

    pub fn lock_key(&self, name: &str) -> String {
        format!("{}:{{{name}}}", self.prefix)
    }

    /// Calls of one command since the server started (`INFO commandstats`).
    pub async fn calls(&self, command: &str) -> u64 {
        let mut conn = self.conn().await;
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut conn)
            .await
            .expect("INFO");
        let needle = format!("cmdstat_{command}:calls=");
        info.lines()
            .find_map(|l| l.strip_prefix(&needle))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }
}

pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

/// Runs a test body with an overall limit, so a hang fails instead of stalling CI.
pub async fn within<T>(limit: Duration, fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(limit, fut)
        .await
        .expect("test exceeded its time limit")
}

/// Logs to the test writer when `RUST_LOG` is set.
pub fn trace_init() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// Reads `key`, yields, and writes it back plus one: an increment that is exact only when no
/// one else runs it at the same time, which is what a lock must guarantee.
pub async fn racy_increment(conn: &mut redis::aio::MultiplexedConnection, key: &str) {
    let value: Option<u64> = redis::cmd("GET")
        .arg(key)
        .query_async(conn)
        .await
        .expect("GET");
    tokio::task::yield_now().await;
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg(value.unwrap_or(0) + 1)
        .query_async(conn)
        .await
        .expect("SET");
}

/// Polls `check` every few milliseconds until it holds: for conditions no signal announces
/// (what another client or Redis did), never for ordering our own tasks.
pub async fn until<F, Fut>(mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    while !check().await {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Runs `body` on a runtime of its own in another thread, then drops that runtime with
/// whatever it still runs (watchdog, release queue, waiters): a process that dies without
/// cleaning up anything.
pub fn crashing<F, Fut>(body: F)
where
    F: FnOnce() -> Fut + Send,
    Fut: std::future::Future<Output = ()>,
{
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let rt = tokio::runtime::Runtime::new().expect("runtime");
            rt.block_on(body());
        });
    });
}

impl TestRedis {
    /// Waits until clients have gone quiet: the count of script calls stops moving for 200 ms
    /// (only meaningful while no lease is short enough to be renewed meanwhile). Returns it.
    pub async fn settle(&self) -> u64 {
        let mut last = self.calls("evalsha").await;
        loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let now = self.calls("evalsha").await;
            if now == last {
                return now;
            }
            last = now;
        }
    }

    /// How many waiters `client` sees queued for `name`.
    pub async fn queued(&self, client: &LockClient, name: &str) -> usize {
        client.inspect(name).await.expect("inspect").waiters.len()
    }
}
