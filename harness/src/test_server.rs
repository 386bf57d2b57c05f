//! A Redis server for one test: our own process, or the one `REDIS_URL` names, with a key prefix
//! no other test uses, and helpers to look at what is left under it.

use std::future::Future;
use std::time::Duration;

use redis::aio::MultiplexedConnection;

use crate::server::RedisServer;

/// One server for one test.
#[derive(Debug)]
pub struct TestServer {
    /// Our own process, when we started one (fault-injection tests need it).
    pub server: Option<RedisServer>,
    /// The server's address.
    pub url: String,
    /// A prefix no other test uses, so tests can share a `REDIS_URL` server.
    pub prefix: String,
}

impl Default for TestServer {
    fn default() -> Self {
        Self::new()
    }
}

impl TestServer {
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

    /// The server process. Panics if the test runs against `REDIS_URL`.
    pub fn server(&mut self) -> &mut RedisServer {
        self.server
            .as_mut()
            .expect("this test needs its own server")
    }

    /// A plain connection for looking at Redis directly.
    pub async fn conn(&self) -> MultiplexedConnection {
        redis::Client::open(self.url.as_str())
            .expect("client")
            .get_multiplexed_async_connection()
            .await
            .expect("connection")
    }

    /// Every key under this test's prefix.
    pub async fn keys(&self) -> Vec<String> {
        self.keys_matching(&format!("{}:*", self.prefix)).await
    }

    /// Every key matching the glob `pattern` (`KEYS`: our own small test servers only).
    pub async fn keys_matching(&self, pattern: &str) -> Vec<String> {
        let mut conn = self.conn().await;
        let mut keys: Vec<String> = redis::cmd("KEYS")
            .arg(pattern)
            .query_async(&mut conn)
            .await
            .expect("KEYS");
        keys.sort();
        keys
    }

    /// The keys left behind other than fencing counters (which outlive locks on purpose) and
    /// request logs (which a carried owner's or a re-entry's acquisition writes, and which
    /// expire 10 s after their last write: see `lua/v1/once_lib.lua`).
    pub async fn leftovers(&self) -> Vec<String> {
        self.keys()
            .await
            .into_iter()
            .filter(|k| !k.ends_with(":fence") && !k.ends_with(":once"))
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

    /// The main key of `name` under this test's prefix: `<prefix>:{<name>}`.
    pub fn lock_key(&self, name: &str) -> String {
        format!("{}:{{{name}}}", self.prefix)
    }

    /// Calls of one command since the server started (`INFO commandstats`).
    pub async fn calls(&self, command: &str) -> u64 {
        let mut conn = self.conn().await;
        let stats = crate::measure::commandstats(&mut conn)
            .await
            .expect("INFO commandstats");
        stats.get(command).copied().unwrap_or(0)
    }

    /// A connection that listens to channels (RESP3: what the server pushes goes to the
    /// listener), subscribed to none yet.
    pub async fn listener(&self) -> Listener {
        let (tx, heard) = tokio::sync::mpsc::unbounded_channel();
        let conn = redis::Client::open(format!("{}?protocol=resp3", self.url))
            .expect("client")
            .get_multiplexed_async_connection_with_config(
                &redis::AsyncConnectionConfig::new().set_push_sender(tx),
            )
            .await
            .expect("connection");
        Listener { conn, heard }
    }

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
}

/// A connection that listens to channels, and what the server pushed to it.
#[derive(Debug)]
pub struct Listener {
    conn: MultiplexedConnection,
    heard: tokio::sync::mpsc::UnboundedReceiver<redis::PushInfo>,
}

impl Listener {
    /// Listens to `channel` from now on.
    pub async fn subscribe(&mut self, channel: &str) {
        self.conn.subscribe(channel).await.expect("SUBSCRIBE");
    }

    /// Stops listening to `channel`.
    pub async fn unsubscribe(&mut self, channel: &str) {
        self.conn.unsubscribe(channel).await.expect("UNSUBSCRIBE");
    }

    /// Listens to every channel that matches the glob `pattern` from now on.
    pub async fn psubscribe(&mut self, pattern: &str) {
        self.conn.psubscribe(pattern).await.expect("PSUBSCRIBE");
    }

    /// Stops listening to the channels of `pattern`.
    pub async fn punsubscribe(&mut self, pattern: &str) {
        self.conn.punsubscribe(pattern).await.expect("PUNSUBSCRIBE");
    }

    /// The messages heard on `channel` since the last call, in order (those on other channels
    /// are dropped). Every message published before this call was answered, on any
    /// connection, is among them: the server sends it to the listener before its answer to
    /// the `PING` this sends.
    pub async fn messages(&mut self, channel: &str) -> Vec<String> {
        self.heard()
            .await
            .into_iter()
            .filter(|(on, _)| on == channel)
            .map(|(_, payload)| payload)
            .collect()
    }

    /// Every message heard since the last call, by a subscription or a pattern, as its
    /// channel and payload, in order (see [`messages`](Self::messages)).
    pub async fn heard(&mut self) -> Vec<(String, String)> {
        let _: () = redis::cmd("PING")
            .query_async(&mut self.conn)
            .await
            .expect("PING");
        let mut messages = Vec::new();
        while let Ok(push) = self.heard.try_recv() {
            let mut data = push.data;
            match push.kind {
                redis::PushKind::Message => {}
                // The pattern first, then the channel and the payload.
                redis::PushKind::PMessage if !data.is_empty() => {
                    data.remove(0);
                }
                _ => continue,
            }
            let message: (String, String) =
                redis::FromRedisValue::from_redis_value(redis::Value::Array(data))
                    .expect("a message: channel and payload");
            messages.push(message);
        }
        messages
    }
}

/// `prefix` followed by a fresh random suffix.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

/// Runs a test body with an overall limit, so a hang fails instead of stalling CI.
pub async fn within<T>(limit: Duration, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(limit, fut)
        .await
        .expect("test exceeded its time limit")
}

/// Reads `key`, yields, and writes it back plus one: an increment that is exact only when no
/// one else runs it at the same time, which is what a lock must guarantee.
pub async fn racy_increment(conn: &mut MultiplexedConnection, key: &str) {
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
    Fut: Future<Output = bool>,
{
    while !check().await {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// [`until`], for at most `limit`: whether `check` came to hold in time (for work another task
/// finishes in the background, whose lateness the caller reports with what it then sees).
pub async fn until_within<F, Fut>(limit: Duration, check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    tokio::time::timeout(limit, until(check)).await.is_ok()
}

/// Runs `body` on a runtime of its own in another thread, then drops that runtime with
/// whatever it still runs (watchdog, release queue, waiters): a process that dies without
/// cleaning up anything.
pub fn crashing<F, Fut>(body: F)
where
    F: FnOnce() -> Fut + Send,
    Fut: Future<Output = ()>,
{
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let rt = tokio::runtime::Runtime::new().expect("runtime");
            rt.block_on(body());
        });
    });
}
