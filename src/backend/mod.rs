//! The backend: how a request reaches Redis. The lowest layer; it knows scripts, connections and
//! the subscription, and nothing of what a lock is.
//!
//! A request is typed ([`Request`]): the protocol layer above says which script it runs with
//! which keys and arguments and how its reply decodes, and the backend carries it to a server
//! and hands back the decoded reply. The backend is one server ([`single::Node`], at a fixed
//! address or, with the `sentinel` feature, the master the sentinels name: [`Source`]; every
//! script over one multiplexed connection, run by SHA with the source as the fallback, [`Script`],
//! [`By`]) or, with the `cluster` feature, a Redis Cluster (`cluster::Node`: each call routed by
//! the hash slot of its first key, batches grouped by slot, wake-ups by sharded pub/sub), or N
//! independent servers for Redlock ([`Quorum`]: a request carried to every server at once, each
//! call bounded by a deadline, the decoded replies handed back as they come, for the layers
//! above to count). The seam is [`Backend::run`] and [`Backend::batch_group`], and
//! [`Backend::as_quorum`] where replies are voted on.
//!
//! Wake-ups come from one subscription connection per server, which tells a [`Listener`] (the
//! client's waiter registry) what it hears, and subscribes to what its [`Subscriber`] asks for.

mod clock;
#[cfg(feature = "cluster")]
mod cluster;
mod durable;
mod quorum;
mod script;
#[cfg(feature = "sentinel")]
mod sentinel;
mod single;
#[cfg(feature = "cluster")]
mod slots;
mod source;
mod subscription;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use deadpool_redis::Pool;
use redis::Value;
use tokio::sync::watch;

pub(crate) use clock::ServerClock;
pub(crate) use durable::Want;
pub(crate) use quorum::Quorum;
#[cfg(test)]
pub(crate) use script::Publish;
pub(crate) use script::{By, Call, Logged, Script};
#[cfg(feature = "sentinel")]
pub(crate) use sentinel::Master;
pub(crate) use source::Source;
pub(crate) use subscription::{Listener, Requests, Subscriber, channel as subscription};

use crate::error::Result;
use single::Node;

/// A typed request: one script call and the decoding of its reply. `Sync`, so that a boxed
/// future that borrows it is `Send`.
pub(crate) trait Request: Sync {
    /// The decoded reply.
    type Reply;
    /// The script call, naming the script `by` hash or source: keys (the first one routes it)
    /// and arguments.
    fn call(&self, by: By) -> Call;
    /// Decodes the raw reply (typed errors for foreign data and unexpected replies).
    fn decode(&self, raw: Value) -> Result<Self::Reply>;
    /// The hold the request acts on, as its lock key and owner, where its calls must reach a
    /// server in the order they were made (an acquisition, then what undoes it): a Redlock
    /// client puts such a call on a node's connection once the call before it about the same
    /// hold is on it. `None` (the default): no order is kept.
    fn hold(&self) -> Option<(&str, &str)> {
        None
    }
    /// Whether the request may be sent again when its answer was lost and it may have run:
    /// true (the default) where a second run has the effect of one (a read, an expiry set
    /// again, a script that answers a repeat from its request log); false where it could undo
    /// what happened in between (a forced unlock would end a hold taken since its first run).
    /// Only a Redis Cluster's requests are ever sent again by redlatch.
    #[cfg(feature = "cluster")]
    fn resendable(&self) -> bool {
        true
    }
}

/// A typed request sent as plain commands, pipelined in one round trip, without a script:
/// where a few commands can do an operation's common case alone (the plain mutex's
/// acquisition of a free lock), they cost the server a fraction of a script call. A single
/// command's error comes back as its value ([`Value::ServerError`]), for `decode` to read.
pub(crate) trait Commands {
    /// The decoded reply.
    type Reply;
    /// The commands, in order (every key in one hash slot).
    fn pipeline(&self) -> redis::Pipeline;
    /// Decodes their replies, one per command.
    fn decode(&self, replies: Vec<Value>) -> Result<Self::Reply>;
}

/// A timeout that happened on our side (no answer within a limit of redlatch's own), as redis-rs
/// reports its own: an answer that may be lost, for the callers that tell them apart.
pub(crate) fn timed_out(what: &'static str) -> redis::RedisError {
    std::io::Error::new(std::io::ErrorKind::TimedOut, what).into()
}

/// A reply element as text: a bulk string (bytes that are not UTF-8 replaced), a simple string
/// or an integer; `None` for anything else.
pub(crate) fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(i) => Some(i.to_string()),
        _ => None,
    }
}

/// Where requests go.
#[derive(Debug)]
pub(crate) struct Backend {
    servers: Servers,
    /// The servers' clock as heard: where fresh fencing tokens start.
    clock: ServerClock,
    /// Requests sent (a Redlock client's: its servers count their own).
    sent: AtomicU64,
}

#[derive(Debug)]
enum Servers {
    /// One server.
    Single(Node),
    /// A Redis Cluster.
    #[cfg(feature = "cluster")]
    Cluster(cluster::Node),
    /// Independent servers voting (Redlock).
    Quorum(Quorum),
}

/// How a cluster backend reaches the cluster.
#[cfg(feature = "cluster")]
pub(crate) enum ClusterSource {
    /// A client builder of the caller's: redlatch sets RESP3, the push sender, its response
    /// timeout and retry waits, and makes one connection for requests and another for the
    /// subscription.
    Builder(Box<redis::cluster::ClusterClientBuilder>),
    /// The caller's deadpool pool for requests, and the seed addresses for a subscription
    /// client of redlatch's own.
    Pool {
        pool: deadpool_redis::cluster::Pool,
        seeds: Vec<redis::ConnectionInfo>,
    },
}

/// How long a cluster node may take to answer one request before redis-rs counts it failed
/// (and retries it, within the caller's own deadline).
#[cfg(feature = "cluster")]
const CLUSTER_RESPONSE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// Applies what redlatch needs to a cluster client builder: RESP3 with `pushes` as the push
/// sender, and short retry waits (redis-rs waits at least 1.28 s before retrying a `TRYAGAIN`
/// by default; a slot migration asks for many).
#[cfg(feature = "cluster")]
fn cluster_settings(
    builder: redis::cluster::ClusterClientBuilder,
    pushes: impl redis::aio::AsyncPushSender,
) -> redis::cluster::ClusterClientBuilder {
    builder
        .use_protocol(redis::ProtocolVersion::RESP3)
        .push_sender(pushes)
        .response_timeout(CLUSTER_RESPONSE_TIMEOUT)
        .min_retry_wait(5)
        .max_retry_wait(500)
        .retry_wait_formula(5, 2)
}

impl Backend {
    /// One server (or the master a set of sentinels names), reached through `source` for
    /// requests (each new connection loading `scripts`) and for the subscription, which serves
    /// `listener` the channels `requests` ask for until `shutdown`'s sender is dropped. Must be
    /// called inside a tokio runtime.
    pub(crate) fn single(
        source: Source,
        scripts: Vec<&'static Script>,
        listener: Arc<dyn Listener>,
        requests: Requests,
        shutdown: watch::Receiver<()>,
    ) -> Self {
        #[cfg(feature = "sentinel")]
        if let Source::Sentinel(master) = &source {
            master.watch(shutdown.clone());
        }
        subscription::spawn(source.clone(), listener, requests, shutdown);
        Self {
            servers: Servers::Single(Node::new(source, scripts)),
            clock: ServerClock::default(),
            sent: AtomicU64::new(0),
        }
    }

    /// A Redis Cluster reached through `source`, each connection loading `scripts` on every
    /// node; its sharded subscription serves `listener` the channels `requests` ask for until
    /// `shutdown`'s sender is dropped. Must be called inside a tokio runtime.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`](crate::Error::Redis) if the client cannot be made from the builder or
    /// the seed addresses.
    #[cfg(feature = "cluster")]
    pub(crate) fn cluster(
        source: ClusterSource,
        scripts: Vec<&'static Script>,
        listener: Arc<dyn Listener>,
        requests: Requests,
        shutdown: watch::Receiver<()>,
    ) -> Result<Self> {
        let (tx, pushes) = tokio::sync::mpsc::unbounded_channel();
        let tx = cluster::push_sender(Arc::clone(&listener), tx);
        let (requesting, subscribing, seed) = match source {
            ClusterSource::Builder(builder) => {
                // Two connections of one client: requests never share a node connection with
                // subscriptions, whose confirmations (redis-rs re-subscribes by itself after a
                // slot moves) would otherwise be taken for a request's reply. Only the
                // subscription's pushes reach `tx` (see `Connector::requests`).
                let client = cluster_settings(*builder, tx).build()?;
                (
                    cluster::Connector::requests(
                        cluster::Source::Client(Box::new(client.clone())),
                        scripts,
                    ),
                    cluster::Connector::subscription(cluster::Source::Client(Box::new(client))),
                    None,
                )
            }
            ClusterSource::Pool { pool, seeds } => {
                let seed = seeds.first().cloned();
                let builder = redis::cluster::ClusterClientBuilder::new(seeds);
                let client = cluster_settings(builder, tx).build()?;
                (
                    cluster::Connector::requests(cluster::Source::Pool(pool), scripts),
                    cluster::Connector::subscription(cluster::Source::Client(Box::new(client))),
                    seed,
                )
            }
        };
        cluster::spawn_subscription(subscribing, pushes, listener, requests, shutdown);
        Ok(Self {
            servers: Servers::Cluster(cluster::Node::new(requesting, seed)),
            clock: ServerClock::default(),
            sent: AtomicU64::new(0),
        })
    }

    /// Independent servers (Redlock, with `settings`), each reached through its pool for requests (each new
    /// connection loading `scripts`) and through its client for its subscription; the
    /// subscriptions serve `listener` the channels `requests` ask for until `shutdown`'s
    /// sender is dropped. Must be called inside a tokio runtime.
    pub(crate) fn quorum(
        settings: crate::config::Redlock,
        servers: Vec<(Pool, redis::Client)>,
        scripts: Vec<&'static Script>,
        listener: Arc<dyn Listener>,
        requests: Requests,
        shutdown: watch::Receiver<()>,
    ) -> Self {
        Self {
            servers: Servers::Quorum(quorum::start(
                settings, servers, &scripts, listener, requests, shutdown,
            )),
            clock: ServerClock::default(),
            sent: AtomicU64::new(0),
        }
    }

    /// The servers' clock as this client heard it: where fresh fencing tokens start.
    pub(crate) fn clock(&self) -> &ServerClock {
        &self.clock
    }

    /// Requests sent so far: script calls and pipelines, a Redlock client's once per server.
    pub(crate) fn requests(&self) -> u64 {
        let quorum = self.as_quorum().map_or(0, Quorum::requests);
        self.sent.load(Ordering::Relaxed) + quorum
    }

    fn count(&self) {
        self.sent.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether acquisitions can wait for replicas here: on one master (a server or Sentinel's
    /// master), not on a Redis Cluster nor over Redlock's independent servers.
    pub(crate) fn serves_durability(&self) -> bool {
        matches!(self.servers, Servers::Single(_))
    }

    /// The independent servers of a Redlock client, which the layers above ask one by one and
    /// count the answers of; `None` for one server or a cluster.
    pub(crate) fn as_quorum(&self) -> Option<&Quorum> {
        match &self.servers {
            Servers::Quorum(quorum) => Some(quorum),
            _ => None,
        }
    }

    /// Runs `request` and decodes its reply.
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`](crate::Error::Unsupported) on a Redlock client, whose requests
    /// go through [`as_quorum`](Self::as_quorum): one reply cannot stand for the servers'
    /// votes.
    pub(crate) async fn run<R: Request>(&self, request: &R) -> Result<R::Reply> {
        if self.as_quorum().is_none() {
            self.count();
        }
        let raw = match &self.servers {
            Servers::Single(node) => node.invoke(request).await?,
            // Boxed: the cluster's future is large, and every request's future, on any backend,
            // would be its size (each await of the layers above copies it).
            #[cfg(feature = "cluster")]
            Servers::Cluster(node) => {
                let invoke: std::pin::Pin<Box<dyn Future<Output = Result<Value>> + Send + '_>> =
                    Box::pin(node.invoke(request));
                invoke.await?
            }
            Servers::Quorum(_) => {
                return Err(crate::error::Error::Unsupported {
                    what: "this operation on a Redlock client",
                    reason: "it has no majority vote",
                });
            }
        };
        request.decode(raw)
    }

    /// Sends `request`'s commands in one round trip and decodes their replies, on one server
    /// (at a fixed address or the master Sentinel names); `None` on a Redis Cluster and a
    /// Redlock client, which send scripts only: the caller runs the operation's script
    /// instead.
    pub(crate) async fn run_commands<C: Commands>(&self, request: &C) -> Option<Result<C::Reply>> {
        match &self.servers {
            Servers::Single(node) => Some({
                self.count();
                node.send_commands(&request.pipeline())
                    .await
                    .and_then(|replies| request.decode(replies))
            }),
            #[cfg(feature = "cluster")]
            Servers::Cluster(_) => None,
            Servers::Quorum(_) => None,
        }
    }

    /// Runs `request` and waits until replicas acknowledged its writes as `want` says: the
    /// decoded reply, how many replicas acknowledged and how many were wanted. The call goes
    /// over a connection of its own, with one `WAIT` for every durable call sent meanwhile.
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`](crate::Error::Unsupported) on a Redis Cluster or a Redlock
    /// client, as the error of the request otherwise.
    pub(crate) async fn run_durable<R: Request>(
        &self,
        request: &R,
        want: Want,
    ) -> Result<(R::Reply, u32, u32)> {
        match &self.servers {
            Servers::Single(node) => {
                self.count();
                let acked = node.send_durable(request, want).await?;
                Ok((request.decode(acked.raw)?, acked.acked, acked.wanted))
            }
            _ => Err(durability_unsupported()),
        }
    }

    /// Completes once every durable call of `want` made before it has run: what is sent after
    /// it on the shared connection reaches the server after them.
    pub(crate) async fn after_durable(&self, want: Want) {
        if let Servers::Single(node) = &self.servers {
            node.durable_barrier(want).await;
        }
    }

    /// Which batch an item keyed by `key` may share one script call with: items of one group
    /// may go together. One server takes any keys in one call (one group); a cluster takes the
    /// keys of one hash slot only.
    pub(crate) fn batch_group(&self, key: &str) -> u16 {
        match &self.servers {
            Servers::Single(_) | Servers::Quorum(_) => {
                let _ = key;
                0
            }
            #[cfg(feature = "cluster")]
            Servers::Cluster(_) => cluster::slot(key),
        }
    }
}

/// What durability on a client that is not one master fails with.
pub(crate) fn durability_unsupported() -> crate::error::Error {
    crate::error::Error::Unsupported {
        what: "durability (WAIT for replicas)",
        reason: "it is served on one server (a master and its replicas) only",
    }
}
