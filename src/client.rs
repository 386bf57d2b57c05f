//! [`LockClient`]: the entry point, and its builder.

use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::Pool;
use redis::IntoConnectionInfo;

use crate::backend::Source;
use crate::config::{Config, Drift, Durability, FENCE_TTL, Fencing, LocalHandoff, millis};
use crate::core::Core;
use crate::error::{Error, Result};
use crate::inspect::{ForceUnlocked, Snapshot};
use crate::key::LockKeys;
use crate::protocol::admin;
use crate::sync::{Election, FairMutex, Mutex, RwLock, Semaphore};

/// The entry point: a cheap, cloneable handle to one Redis server and the background work that
/// serves every lock made from it.
///
/// A client owns three background tasks, started when it is built and stopped when the client,
/// every handle made from it and every guard are gone:
///
/// * the **watchdog**, one task that renews the leases of all held guards (batched: one script
///   call per 256 locks due together);
/// * the **release queue**, which releases the locks of guards that were dropped rather than
///   unlocked;
/// * the **subscription**, one dedicated connection on which releases wake waiting tasks.
///
/// Requests go over one multiplexed connection taken from the pool (and taken again after a
/// connection failure), so a lock operation costs exactly one round trip. The subscription
/// needs its own connection, which a pool cannot lend: that is why the client is given the
/// server's address as well as the pool.
///
/// ```no_run
/// # async fn demo() -> redlatch::Result<()> {
/// use deadpool_redis::{Config, Runtime};
///
/// let url = "redis://127.0.0.1:6379";
/// let pool = Config::from_url(url).create_pool(Some(Runtime::Tokio1)).expect("pool");
/// let client = redlatch::LockClient::new(pool, url)?;
/// let guard = client.mutex("orders:42")?.lock().await?;
/// // ... critical section ...
/// guard.unlock().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct LockClient {
    core: Arc<Core>,
}

impl LockClient {
    /// A client with the default settings (see [`LockClientBuilder`]) over `pool`, whose
    /// wake-up subscription connects to `server` (the server the pool connects to).
    ///
    /// Must be called inside a tokio runtime: the background tasks are spawned on it. Nothing
    /// is sent to Redis until the first lock operation.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`] if `server` is not a valid Redis address, and
    /// [`Error::InvalidArgument`] outside a tokio runtime.
    ///
    /// ```no_run
    /// # fn demo(pool: deadpool_redis::Pool) -> redlatch::Result<()> {
    /// let client = redlatch::LockClient::new(pool, "redis://127.0.0.1:6379")?;
    /// # Ok(()) }
    /// ```
    pub fn new(pool: Pool, server: impl IntoConnectionInfo) -> Result<Self> {
        Self::builder(pool, server).build()
    }

    /// A builder for a client with settings other than the defaults.
    ///
    /// ```no_run
    /// # fn demo(pool: deadpool_redis::Pool) -> redlatch::Result<()> {
    /// use std::time::Duration;
    ///
    /// let client = redlatch::LockClient::builder(pool, "redis://127.0.0.1:6379")
    ///     .key_prefix("billing")
    ///     .default_lease(Duration::from_secs(10))
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn builder(pool: Pool, server: impl IntoConnectionInfo) -> LockClientBuilder {
        LockClientBuilder {
            target: Target::Single {
                pool,
                server: server.into_connection_info(),
            },
            config: Config::default(),
            refused: None,
        }
    }

    /// A client with the default settings for the Redis Cluster that `cluster` (a redis-rs
    /// client builder: seed nodes, credentials, TLS...) reaches.
    ///
    /// redlatch sets on the builder what it needs: RESP3 with its own push sender (wake-ups
    /// come by sharded pub/sub, on a cluster connection of their own), a timeout of 2 s per
    /// request (redis-rs's retries included; a request that went straight to its master and
    /// lost its answer there is sent again through the cluster connection, with 2 s of its
    /// own, so one call can take 4 s), and retry waits of 5 to 500 ms (instead of redis-rs's
    /// 1.28 s at least, which every `TRYAGAIN` of a slot migration would cost). Requests go
    /// straight to the master of their slot when they can (see the README's cluster section),
    /// connecting without a password: a cluster that asks for one is reached through redis-rs's
    /// cluster connection only. Nothing is sent until the first lock operation.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`] if redis-rs cannot make a client of the builder (no seed, seeds with
    /// different credentials), and [`Error::InvalidArgument`] outside a tokio runtime.
    ///
    /// ```no_run
    /// # async fn demo() -> redlatch::Result<()> {
    /// use redis::cluster::ClusterClientBuilder;
    ///
    /// let seeds = ["redis://127.0.0.1:7000", "redis://127.0.0.1:7001"];
    /// let client = redlatch::LockClient::cluster(ClusterClientBuilder::new(seeds))?;
    /// let guard = client.fair_mutex("orders:42")?.lock().await?;
    /// guard.unlock().await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "cluster")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
    pub fn cluster(cluster: redis::cluster::ClusterClientBuilder) -> Result<Self> {
        Self::cluster_builder(cluster).build()
    }

    /// A builder for a cluster client (see [`LockClient::cluster`]) with settings other than
    /// the defaults.
    ///
    /// ```no_run
    /// # fn demo() -> redlatch::Result<()> {
    /// use std::time::Duration;
    /// use redis::cluster::ClusterClientBuilder;
    ///
    /// let client = redlatch::LockClient::cluster_builder(ClusterClientBuilder::new([
    ///     "redis://127.0.0.1:7000",
    /// ]))
    /// .key_prefix("billing")
    /// .default_lease(Duration::from_secs(10))
    /// .build()?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "cluster")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
    pub fn cluster_builder(cluster: redis::cluster::ClusterClientBuilder) -> LockClientBuilder {
        LockClientBuilder {
            target: Target::Cluster(ClusterTarget::Builder(Box::new(cluster))),
            config: Config::default(),
            refused: None,
        }
    }

    /// A client with the default settings whose requests go through `pool`, a deadpool-redis
    /// cluster pool (one connection is taken from it for good: it multiplexes every request),
    /// and whose wake-up subscription is a cluster client of its own made from `seeds`.
    ///
    /// A pool's clients use redis-rs's defaults, which redlatch cannot change: a request that
    /// meets `TRYAGAIN` during a slot migration waits at least 1.28 s before it is retried.
    /// [`LockClient::cluster`] sets shorter waits.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`] for a seed that is not a valid address or seeds with different
    /// credentials, and [`Error::InvalidArgument`] outside a tokio runtime or without seeds.
    ///
    /// ```no_run
    /// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use deadpool_redis::cluster::{Config, Runtime};
    ///
    /// let seeds = vec!["redis://127.0.0.1:7000".to_owned()];
    /// let pool = Config::from_urls(seeds.clone()).create_pool(Some(Runtime::Tokio1))?;
    /// let client = redlatch::LockClient::cluster_pool(pool, seeds)?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "cluster")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
    pub fn cluster_pool<S: IntoConnectionInfo>(
        pool: deadpool_redis::cluster::Pool,
        seeds: impl IntoIterator<Item = S>,
    ) -> Result<Self> {
        Self::cluster_pool_builder(pool, seeds).build()
    }

    /// A builder for a client over a deadpool-redis cluster pool (see
    /// [`LockClient::cluster_pool`]) with settings other than the defaults.
    ///
    /// ```no_run
    /// # fn demo(pool: deadpool_redis::cluster::Pool) -> redlatch::Result<()> {
    /// let client = redlatch::LockClient::cluster_pool_builder(pool, ["redis://127.0.0.1:7000"])
    ///     .key_prefix("billing")
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "cluster")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
    pub fn cluster_pool_builder<S: IntoConnectionInfo>(
        pool: deadpool_redis::cluster::Pool,
        seeds: impl IntoIterator<Item = S>,
    ) -> LockClientBuilder {
        let seeds = seeds
            .into_iter()
            .map(IntoConnectionInfo::into_connection_info)
            .collect();
        LockClientBuilder {
            target: Target::Cluster(ClusterTarget::Pool { pool, seeds }),
            config: Config::default(),
            refused: None,
        }
    }

    /// A client with the default settings for the master called `master` that the
    /// sentinels at `sentinels` monitor (Redis Sentinel: a master, its replicas, and the
    /// sentinels that promote a replica when the master fails).
    ///
    /// Requests and the wake-up subscription go to the server the sentinels name as master
    /// (and that confirms it with `ROLE`), and follow it after a failover: as soon as a sentinel
    /// announces it (`+switch-master`, which the client listens for on one sentinel at a time),
    /// or when the old master fails a request or answers `READONLY` or `MASTERDOWN`. Waiters
    /// resume on the new master; holds that it does not know (a write the old master had not
    /// replicated when it failed) report [`lost`](crate::MutexGuard::lost) at their next
    /// renewal. [`Durability`] narrows that window; the README's "Replicas and failover" section
    /// says what closes it. The master's credentials, database and TLS settings, if any, are
    /// given with [`sentinel_node`](LockClientBuilder::sentinel_node); a sentinel's, in its
    /// address. Nothing is sent until the first lock operation.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`] for an address that is not valid or no address at all, and
    /// [`Error::InvalidArgument`] outside a tokio runtime.
    ///
    /// ```no_run
    /// # async fn demo() -> redlatch::Result<()> {
    /// let sentinels = ["redis://10.0.0.1:26379", "redis://10.0.0.2:26379", "redis://10.0.0.3:26379"];
    /// let client = redlatch::LockClient::sentinel(sentinels, "mymaster")?;
    /// let guard = client.mutex("orders:42")?.lock().await?;
    /// guard.unlock().await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "sentinel")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sentinel")))]
    pub fn sentinel<S: IntoConnectionInfo>(
        sentinels: impl IntoIterator<Item = S>,
        master: &str,
    ) -> Result<Self> {
        Self::sentinel_builder(sentinels, master).build()
    }

    /// A builder for a Sentinel client (see [`LockClient::sentinel`]) with settings other than
    /// the defaults.
    ///
    /// ```no_run
    /// # fn demo() -> redlatch::Result<()> {
    /// use std::time::Duration;
    /// use redlatch::Durability;
    ///
    /// let client = redlatch::LockClient::sentinel_builder(["redis://10.0.0.1:26379"], "mymaster")
    ///     .durability(Durability::AllReplicas { timeout: Duration::from_millis(200) })
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "sentinel")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sentinel")))]
    pub fn sentinel_builder<S: IntoConnectionInfo>(
        sentinels: impl IntoIterator<Item = S>,
        master: &str,
    ) -> LockClientBuilder {
        let sentinels = sentinels
            .into_iter()
            .map(IntoConnectionInfo::into_connection_info)
            .collect();
        LockClientBuilder {
            target: Target::Sentinel {
                sentinels,
                master: master.to_owned(),
                node: None,
            },
            config: Config::default(),
            refused: None,
        }
    }

    /// A builder for a Redlock client over independent Redis servers (masters that do not
    /// replicate each other), each given as a pool and its address as for
    /// [`LockClient::new`]. Use 3 or 5: a lock is held when a majority of them granted it, so it
    /// survives the loss of a minority.
    ///
    /// Only [`Mutex`] works on it, with its whole API; [`fair_mutex`](Self::fair_mutex),
    /// [`semaphore`](Self::semaphore) and [`rwlock`](Self::rwlock) return
    /// [`Error::Unsupported`]: a semaphore whose permits are counted per node admits more than
    /// its permits in all (three nodes of two permits each: A on nodes 1 and 2, B on 2 and 3, C
    /// on 1 and 3), and per-node FIFO queues need not agree on who is next. Fencing tokens
    /// rise with every acquisition across any majorities (see [`Fencing`]); a guard's
    /// [`valid_until`](crate::MutexGuard::valid_until) is the send time of the first request
    /// plus the lease, less the drift allowance. The README's Redlock section says what holds
    /// under which conditions (persistence, clock drift).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use deadpool_redis::{Config, Runtime};
    ///
    /// let urls = ["redis://10.0.0.1:6379", "redis://10.0.0.2:6379", "redis://10.0.0.3:6379"];
    /// let mut nodes = Vec::new();
    /// for url in urls {
    ///     nodes.push((Config::from_url(url).create_pool(Some(Runtime::Tokio1))?, url));
    /// }
    /// let client = redlatch::LockClient::redlock(nodes)
    ///     .node_timeout(Duration::from_millis(50))
    ///     .build()?;
    /// let guard = client.mutex("orders:42")?.lock().await?;
    /// println!("token {} valid until {:?}", guard.fencing_token(), guard.valid_until());
    /// guard.unlock().await?;
    /// # Ok(()) }
    /// ```
    pub fn redlock<S: IntoConnectionInfo>(
        nodes: impl IntoIterator<Item = (Pool, S)>,
    ) -> LockClientBuilder {
        let nodes = nodes
            .into_iter()
            .map(|(pool, server)| (pool, server.into_connection_info()))
            .collect();
        LockClientBuilder {
            target: Target::Redlock(nodes),
            config: Config {
                redlock: Some(crate::config::Redlock::default()),
                ..Config::default()
            },
            refused: None,
        }
    }

    /// A client with its own pool (deadpool's defaults) for the server at `url`.
    ///
    /// # Errors
    ///
    /// As [`LockClient::new`], and [`Error::InvalidArgument`] if the pool cannot be made.
    ///
    /// ```no_run
    /// # async fn demo() -> redlatch::Result<()> {
    /// let client = redlatch::LockClient::from_url("redis://127.0.0.1:6379")?;
    /// # Ok(()) }
    /// ```
    pub fn from_url(url: &str) -> Result<Self> {
        let pool = deadpool_redis::Config::from_url(url)
            .create_pool(Some(deadpool_redis::Runtime::Tokio1))
            .map_err(|e| Error::invalid("url", e.to_string()))?;
        Self::new(pool, url)
    }

    /// A handle to the reentrant mutex called `name`. Handles are cheap: make one per use or
    /// keep it, as you like.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if `name` is empty, longer than
    /// [`MAX_NAME_LEN`](crate::MAX_NAME_LEN) bytes, or contains braces or control characters.
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// let mutex = client.mutex("orders:42")?;
    /// assert!(client.mutex("").is_err());
    /// # Ok(()) }
    /// ```
    pub fn mutex(&self, name: &str) -> Result<Mutex> {
        Mutex::new(Arc::clone(&self.core), name)
    }

    /// A handle to the fair (FIFO) mutex called `name`.
    ///
    /// # Errors
    ///
    /// As [`mutex`](Self::mutex); [`Error::Unsupported`](crate::Error::Unsupported) on a
    /// Redlock client (which serves the plain `Mutex` only).
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// let turn = client.fair_mutex("printer")?.lock().await?;
    /// # Ok(()) }
    /// ```
    pub fn fair_mutex(&self, name: &str) -> Result<FairMutex> {
        FairMutex::new(Arc::clone(&self.core), name)
    }

    /// A handle to the leader election called `name`.
    ///
    /// # Errors
    ///
    /// As [`mutex`](Self::mutex); [`Error::Unsupported`](crate::Error::Unsupported) on a
    /// Redlock client.
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// let leadership = client.election("scheduler")?.campaign("host-a").await?;
    /// # Ok(()) }
    /// ```
    pub fn election(&self, name: &str) -> Result<Election> {
        Election::new(Arc::clone(&self.core), name)
    }

    /// A handle to the counting semaphore called `name`, with `permits` permits. Every client
    /// using one name must agree on the number while it is in use.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if `permits` is zero, and as [`mutex`](Self::mutex) for the
    /// name; [`Error::Unsupported`](crate::Error::Unsupported) on a Redlock client (which
    /// serves the plain `Mutex` only).
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// let permit = client.semaphore("renderers", 4)?.acquire().await?;
    /// assert!(client.semaphore("renderers", 0).is_err());
    /// # Ok(()) }
    /// ```
    pub fn semaphore(&self, name: &str, permits: u32) -> Result<Semaphore> {
        Semaphore::new(Arc::clone(&self.core), name, permits)
    }

    /// A handle to the read-write lock called `name`.
    ///
    /// # Errors
    ///
    /// As [`mutex`](Self::mutex); [`Error::Unsupported`](crate::Error::Unsupported) on a
    /// Redlock client (which serves the plain `Mutex` only).
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// let reader = client.rwlock("config")?.read().await?;
    /// # Ok(()) }
    /// ```
    pub fn rwlock(&self, name: &str) -> Result<RwLock> {
        RwLock::new(Arc::clone(&self.core), name)
    }

    /// Reads the state of `name`, whatever primitive it is in use as: holders with their hold
    /// counts and remaining lease, queued waiters, permits, and the last fencing token. One
    /// script call, so the snapshot is consistent; it changes nothing.
    ///
    /// On a Redlock client every server is asked: the snapshot is one whose holders the most
    /// servers agree on, and its last fencing token the highest that a majority of them has
    /// reached (the holder's; a server that granted late may be ahead of it).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a bad name, [`Error::WrongType`] or [`Error::Layout`] if
    /// the keys hold data redlatch does not understand, and connection errors (on a Redlock
    /// client: when no server answered).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// let snapshot = client.inspect("printer").await?;
    /// if snapshot.kind.is_none() {
    ///     println!("nothing stored: free");
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn inspect(&self, name: &str) -> Result<Snapshot> {
        let keys = LockKeys::new(&self.core.config.prefix, name)?;
        let request = admin::Inspect { name, keys: &keys };
        match self.core.backend.as_quorum() {
            None => self.core.backend.run(&request).await,
            Some(quorum) => {
                let answers = self.on_every_node(quorum, &request).await?;
                Ok(admin::agreed(answers, quorum.majority()))
            }
        }
    }

    /// Runs `request` on every node of a Redlock client: the answers of the nodes that gave
    /// one within the node timeout, or the first failure if none did.
    async fn on_every_node<R: crate::backend::Request>(
        &self,
        quorum: &crate::backend::Quorum,
        request: &R,
    ) -> Result<Vec<R::Reply>> {
        let timeout = quorum.node_timeout(self.core.config.lease);
        let deadline = crate::time::after(tokio::time::Instant::now(), timeout);
        let mut answers = Vec::with_capacity(quorum.len());
        let mut failure = None;
        let mut replies = quorum.each(request, deadline);
        while let Some((_, reply)) = replies.next().await {
            match reply {
                Ok(answer) => answers.push(answer),
                Err(err) => {
                    failure.get_or_insert(err);
                }
            }
        }
        match (answers.is_empty(), failure) {
            (true, Some(err)) => Err(err),
            _ => Ok(answers),
        }
    }

    /// Ends every hold and queue place of `name` at once, whatever primitive it is in use as:
    /// an administrator's last resort for a lock whose holder is stuck but alive (a crashed
    /// holder's lease runs out by itself). Its keys are deleted, except the fencing counter, so
    /// tokens keep rising. Waiting clients are told and try again (queued waiters lose their
    /// place and queue anew); holders learn it at their next renewal, when their guards become
    /// lost, so their work may overlap the next holder's until then: fencing tokens are what
    /// protects storage from that. A Redlock client asks every server, and reports the most
    /// holders and waiters any of them removed.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a bad name; [`Error::WrongType`] or [`Error::Layout`] if
    /// the name's keys hold data redlatch did not write (it is left alone); connection errors.
    /// A connection error may come after the script ran: [`inspect`](Self::inspect) before
    /// calling again, since a second call also ends the holds taken in between. redlatch never
    /// sends it again by itself, but on a Redis Cluster redis-rs does, when a node's connection
    /// breaks while the call is on it.
    ///
    /// # Cancel safety
    ///
    /// One script call: dropping the future may leave it done or not done, never half done.
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// let removed = client.force_unlock("stuck-job").await?;
    /// println!("{} holders, {} waiters removed", removed.holders, removed.waiters);
    /// # Ok(()) }
    /// ```
    pub async fn force_unlock(&self, name: &str) -> Result<ForceUnlocked> {
        let keys = LockKeys::new(&self.core.config.prefix, name)?;
        let request = admin::ForceUnlock {
            keys: &keys,
            fence_ttl_ms: millis(FENCE_TTL),
        };
        match self.core.backend.as_quorum() {
            None => self.core.backend.run(&request).await,
            Some(quorum) => {
                let answers = self.on_every_node(quorum, &request).await?;
                Ok(admin::most(answers))
            }
        }
    }

    /// The prefix of every key this client writes.
    ///
    /// ```no_run
    /// # fn demo(client: redlatch::LockClient) {
    /// assert_eq!(client.key_prefix(), "redlatch");
    /// # }
    /// ```
    pub fn key_prefix(&self) -> &str {
        &self.core.config.prefix
    }

    /// How many requests this client has sent to Redis for its operations: each script call
    /// and each pipeline of plain commands (one round trip) counts one, a Redlock client's call
    /// once per server asked; the subscription's own commands are not counted. For monitoring
    /// and benchmarks: a server's command statistics cannot tell a round trip of several plain
    /// commands from the same commands run inside a script.
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// let before = client.requests();
    /// client.mutex("a")?.lock().await?.unlock().await?;
    /// assert!(client.requests() - before <= 2);
    /// # Ok(()) }
    /// ```
    pub fn requests(&self) -> u64 {
        self.core.backend.requests()
    }
}

/// Settings for a [`LockClient`]. Every setter has a documented default.
///
/// ```no_run
/// # fn demo(pool: deadpool_redis::Pool) -> redlatch::Result<()> {
/// use std::time::Duration;
///
/// let client = redlatch::LockClient::builder(pool, "redis://127.0.0.1:6379")
///     .key_prefix("jobs")
///     .default_lease(Duration::from_secs(15))
///     .watchdog(true)
///     .wait_backoff(Duration::from_millis(5), Duration::from_millis(500))
///     .build()?;
/// # Ok(()) }
/// ```
#[must_use = "a builder does nothing until `.build()` is called"]
#[derive(Debug)]
pub struct LockClientBuilder {
    target: Target,
    config: Config,
    /// A setting was given to a builder of a client that does not take it (a Redlock setting
    /// to another client, Sentinel's to another): `build` refuses it.
    refused: Option<Error>,
}

/// What a client is built for. (A builder lives for one statement: the size of its variants
/// does not matter.)
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
enum Target {
    Single {
        pool: Pool,
        server: redis::RedisResult<redis::ConnectionInfo>,
    },
    #[cfg(feature = "cluster")]
    Cluster(ClusterTarget),
    Redlock(Vec<(Pool, redis::RedisResult<redis::ConnectionInfo>)>),
    #[cfg(feature = "sentinel")]
    Sentinel {
        sentinels: redis::RedisResult<Vec<redis::ConnectionInfo>>,
        master: String,
        node: Option<redis::sentinel::SentinelNodeConnectionInfo>,
    },
}

#[cfg(feature = "cluster")]
enum ClusterTarget {
    Builder(Box<redis::cluster::ClusterClientBuilder>),
    Pool {
        pool: deadpool_redis::cluster::Pool,
        seeds: redis::RedisResult<Vec<redis::ConnectionInfo>>,
    },
}

#[cfg(feature = "cluster")]
impl std::fmt::Debug for ClusterTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Builder(builder) => f.debug_tuple("Builder").field(builder).finish(),
            Self::Pool { seeds, .. } => f
                .debug_struct("Pool")
                .field("seeds", seeds)
                .finish_non_exhaustive(),
        }
    }
}

impl LockClientBuilder {
    /// The prefix of every key and channel. Default: `"redlatch"`. At most
    /// [`MAX_PREFIX_LEN`](crate::MAX_PREFIX_LEN) bytes, no braces.
    ///
    /// ```no_run
    /// # fn demo(pool: deadpool_redis::Pool) -> redlatch::Result<()> {
    /// let client = redlatch::LockClient::builder(pool, "redis://127.0.0.1/")
    ///     .key_prefix("billing")
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.config.prefix = prefix.into();
        self
    }

    /// The lease of every acquisition that does not name its own. Default: 30 s. With the
    /// watchdog on, it is renewed every third of itself (less the
    /// [`drift`](Self::drift) allowance) while the guard lives.
    ///
    /// ```no_run
    /// # fn demo(pool: deadpool_redis::Pool) -> redlatch::Result<()> {
    /// use std::time::Duration;
    ///
    /// let client = redlatch::LockClient::builder(pool, "redis://127.0.0.1/")
    ///     .default_lease(Duration::from_secs(10))
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn default_lease(mut self, lease: Duration) -> Self {
        // Whole milliseconds, as the scripts take it (see `Engine::with_lease`).
        self.config.lease = Duration::from_millis(crate::config::millis(lease));
        self
    }

    /// Whether the watchdog renews default leases. Default: on. With it off, a guard holds the
    /// lock for exactly its lease unless it calls [`extend`](crate::MutexGuard::extend). An
    /// election's leadership, which has no natural end and no `extend`, is renewed either way.
    ///
    /// ```no_run
    /// # fn demo(pool: deadpool_redis::Pool) -> redlatch::Result<()> {
    /// let client = redlatch::LockClient::builder(pool, "redis://127.0.0.1/")
    ///     .watchdog(false)
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn watchdog(mut self, on: bool) -> Self {
        self.config.watchdog = on;
        self
    }

    /// How long a waiter of this client that reaches the head of a fair mutex, semaphore or
    /// read-write lock queue may take to answer: the lock is handed to it for a first term of
    /// this long at most (the watchdog renews it to the full lease once the waiter has it). A
    /// waiter whose process died lets that term run out, and then it and every other queued
    /// waiter of its client are passed over, so a crashed process holds up the queue for this
    /// long at most. Queued waiters send nothing while they wait. Default: the default lease
    /// (30 s).
    ///
    /// ```no_run
    /// # fn demo(pool: deadpool_redis::Pool) -> redlatch::Result<()> {
    /// use std::time::Duration;
    ///
    /// let client = redlatch::LockClient::builder(pool, "redis://127.0.0.1/")
    ///     .waiter_timeout(Duration::from_secs(5))
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn waiter_timeout(mut self, timeout: Duration) -> Self {
        self.config.waiter_timeout = Some(timeout);
        self
    }

    /// Bounds of the jittered exponential backoff a waiter uses when no wake-up can reach it
    /// (the subscription is down) and when the holder's remaining lease is unknown. Each wait
    /// is also bounded by the holder's remaining lease and by the caller's deadline (a waiter
    /// looks within 10 ms of the lease's end, spread so that waiters do not all ask at once,
    /// whatever `min`). Default:
    /// 10 ms to 1 s; `min` must be above zero and `max` at most [`MAX_LEASE`](crate::MAX_LEASE)
    /// (checked by [`build`](Self::build)).
    ///
    /// ```no_run
    /// # fn demo(pool: deadpool_redis::Pool) -> redlatch::Result<()> {
    /// use std::time::Duration;
    ///
    /// let client = redlatch::LockClient::builder(pool, "redis://127.0.0.1/")
    ///     .wait_backoff(Duration::from_millis(5), Duration::from_millis(500))
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn wait_backoff(mut self, min: Duration, max: Duration) -> Self {
        self.config.backoff_min = min;
        self.config.backoff_max = max;
        self
    }

    /// Redlock clients: how long one server may take to answer one call before it counts as
    /// not granting (or not renewing, releasing, confirming). Default: 5 % of the lease,
    /// between 2 ms and 1 s (1 s for the 30 s default lease). Keep it well under the lease:
    /// the validity left to a hold shrinks by the time an acquisition takes.
    ///
    /// ```no_run
    /// # fn demo(nodes: Vec<(deadpool_redis::Pool, String)>) -> redlatch::Result<()> {
    /// use std::time::Duration;
    ///
    /// let client = redlatch::LockClient::redlock(nodes)
    ///     .node_timeout(Duration::from_millis(50))
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        self.set_redlock(|r| r.node_timeout = Some(timeout));
        self
    }

    /// Redlock clients: how fencing tokens are made (see [`Fencing`]). Default:
    /// [`Fencing::Quorum`], two rounds, without relying on clocks.
    ///
    /// ```no_run
    /// # fn demo(nodes: Vec<(deadpool_redis::Pool, String)>) -> redlatch::Result<()> {
    /// let client = redlatch::LockClient::redlock(nodes)
    ///     .fencing(redlatch::Fencing::Clock)
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn fencing(mut self, fencing: Fencing) -> Self {
        self.set_redlock(|r| r.fencing = fencing);
        self
    }

    /// How much of a lease is not counted on: `rate` of it (clocks that run at slightly
    /// different speeds) plus `fixed` (Redis counts leases in whole milliseconds). A hold is
    /// valid, as [`valid_until`](crate::MutexGuard::valid_until) reports, for its lease counted
    /// from just before its request was sent, less this. Default: 1 % + 2 ms (Redlock's);
    /// `rate` must be below 0.5, and the allowance must leave something of the default lease.
    /// The watchdog renews every third of what is counted on (the lease less the allowance), so
    /// a larger allowance means more frequent renewals.
    ///
    /// ```no_run
    /// # fn demo(pool: deadpool_redis::Pool) -> redlatch::Result<()> {
    /// use std::time::Duration;
    ///
    /// let client = redlatch::LockClient::builder(pool, "redis://127.0.0.1/")
    ///     .drift(0.02, Duration::from_millis(5))
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn drift(mut self, rate: f64, fixed: Duration) -> Self {
        self.config.drift = Drift { rate, fixed };
        self
    }

    /// Whether acquisitions wait for replicas to have their write (`WAIT`), and for how many
    /// (see [`Durability`]); each handle may override it (`with_durability`). Default:
    /// [`Durability::None`], no `WAIT` is ever sent. One server (a master and its replicas)
    /// only: a cluster or Redlock client refuses it at `build`.
    ///
    /// ```no_run
    /// # fn demo(pool: deadpool_redis::Pool) -> redlatch::Result<()> {
    /// use std::time::Duration;
    /// use redlatch::Durability;
    ///
    /// let client = redlatch::LockClient::builder(pool, "redis://127.0.0.1/")
    ///     .durability(Durability::Replicas { count: 1, timeout: Duration::from_millis(500) })
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn durability(mut self, durability: Durability) -> Self {
        self.config.durability = durability;
        self
    }

    /// Local hand-off for the plain [`Mutex`](crate::Mutex): how many times, and for how long,
    /// a hold may pass between this client's own waiting tasks without going back to Redis
    /// (see [`LocalHandoff`]). Default: on, 64 passes within 5 ms. Redlock clients never pass
    /// holds locally.
    ///
    /// # Errors
    ///
    /// `build` fails with [`Error::InvalidArgument`] for more than
    /// [`LocalHandoff::MAX_PASSES`] passes, a window above [`MAX_LEASE`](crate::MAX_LEASE) or a
    /// head start above 1 s.
    ///
    /// ```no_run
    /// # fn demo(pool: deadpool_redis::Pool) -> redlatch::Result<()> {
    /// use redlatch::LocalHandoff;
    ///
    /// let client = redlatch::LockClient::builder(pool, "redis://127.0.0.1/")
    ///     .local_handoff(LocalHandoff::off())
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn local_handoff(mut self, handoff: LocalHandoff) -> Self {
        self.config.handoff = handoff;
        self
    }

    /// Sentinel clients: how to connect to the master the sentinels name (credentials,
    /// database, TLS). Default: redis-rs's defaults (no password, database 0, plain TCP).
    ///
    /// ```no_run
    /// # fn demo() -> redlatch::Result<()> {
    /// use redis::sentinel::SentinelNodeConnectionInfo;
    /// use redis::RedisConnectionInfo;
    ///
    /// let node = SentinelNodeConnectionInfo::default()
    ///     .set_redis_connection_info(RedisConnectionInfo::default().set_password("secret"));
    /// let client = redlatch::LockClient::sentinel_builder(["redis://10.0.0.1:26379"], "mymaster")
    ///     .sentinel_node(node)
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "sentinel")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sentinel")))]
    pub fn sentinel_node(mut self, info: redis::sentinel::SentinelNodeConnectionInfo) -> Self {
        match &mut self.target {
            Target::Sentinel { node, .. } => *node = Some(info),
            _ => {
                self.refused = Some(Error::Unsupported {
                    what: "Sentinel node settings",
                    reason: "only a Sentinel client (LockClient::sentinel) takes them",
                });
            }
        }
        self
    }

    /// A Redlock setting on another client is refused by `build`, not lost.
    fn set_redlock(&mut self, set: impl FnOnce(&mut crate::config::Redlock)) {
        let mut settings = self.config.redlock.unwrap_or_default();
        set(&mut settings);
        if matches!(self.target, Target::Redlock(_)) {
            self.config.redlock = Some(settings);
        } else {
            self.refused = Some(Error::Unsupported {
                what: "a node timeout or fencing mode",
                reason: "only a Redlock client (LockClient::redlock) takes them",
            });
        }
    }

    /// Builds the client and starts its background tasks on the current tokio runtime.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a bad setting (empty prefix, lease outside
    /// [`MIN_LEASE`](crate::MIN_LEASE)..=[`MAX_LEASE`](crate::MAX_LEASE), the same for the
    /// waiter timeout, a zero backoff minimum, a backoff minimum above its maximum or a maximum
    /// above `MAX_LEASE`, a durability timeout under 1 ms or above `MAX_LEASE`, a `drift` rate
    /// outside 0..0.5 or one that leaves nothing of the lease, a `local_handoff` outside its
    /// bounds, a Redlock node timeout of zero or above `MAX_LEASE`, no seed or no Redlock
    /// server) or outside a tokio runtime; [`Error::Unsupported`] for a durability on a Redis
    /// Cluster or Redlock client, or a setting of one kind of client given to another (Redlock's
    /// `fencing`, say, on a one-server client); [`Error::Redis`] for a bad server address.
    ///
    /// ```no_run
    /// # fn demo(pool: deadpool_redis::Pool) -> redlatch::Result<()> {
    /// let client = redlatch::LockClient::builder(pool, "redis://127.0.0.1/")
    ///     .key_prefix("billing")
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn build(self) -> Result<LockClient> {
        self.config.validate()?;
        let one_master = match &self.target {
            Target::Single { .. } => true,
            #[cfg(feature = "sentinel")]
            Target::Sentinel { .. } => true,
            _ => false,
        };
        if self.config.durability != Durability::None && !one_master {
            return Err(crate::backend::durability_unsupported());
        }
        if let Some(refused) = self.refused {
            return Err(refused);
        }
        let in_runtime = || {
            if tokio::runtime::Handle::try_current().is_err() {
                return Err(Error::invalid(
                    "runtime",
                    "a LockClient must be built inside a tokio runtime",
                ));
            }
            Ok(())
        };
        let core = match self.target {
            Target::Single { pool, server } => {
                let server = server?;
                in_runtime()?;
                let server = Box::new(redis::Client::open(server)?);
                Core::single(self.config, Source::Fixed { pool, server })
            }
            #[cfg(feature = "sentinel")]
            Target::Sentinel {
                sentinels,
                master,
                node,
            } => {
                let master = crate::backend::Master::new(sentinels?, master, node)?;
                in_runtime()?;
                Core::single(self.config, Source::Sentinel(Arc::new(master)))
            }
            #[cfg(feature = "cluster")]
            Target::Cluster(target) => {
                let source = match target {
                    ClusterTarget::Builder(builder) => {
                        crate::backend::ClusterSource::Builder(builder)
                    }
                    ClusterTarget::Pool { pool, seeds } => {
                        let seeds = seeds?;
                        if seeds.is_empty() {
                            return Err(Error::invalid(
                                "seeds",
                                "a cluster client needs at least one seed address",
                            ));
                        }
                        crate::backend::ClusterSource::Pool { pool, seeds }
                    }
                };
                in_runtime()?;
                Core::cluster(self.config, source)?
            }
            Target::Redlock(nodes) => {
                if nodes.is_empty() {
                    return Err(Error::invalid(
                        "nodes",
                        "a Redlock client needs at least one server (use 3 or 5)",
                    ));
                }
                let mut servers = Vec::with_capacity(nodes.len());
                for (pool, server) in nodes {
                    servers.push((pool, redis::Client::open(server?)?));
                }
                in_runtime()?;
                Core::quorum(self.config, servers)
            }
        };
        Ok(LockClient { core })
    }
}
