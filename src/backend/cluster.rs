//! Redis Cluster: requests routed by the hash slot of their first key (every key of a name
//! shares one hash tag, so every script touches one slot), and wake-ups by sharded pub/sub.
//!
//! Requests go over one `ClusterConnection` (one multiplexed connection per node, kept and
//! re-made by redis-rs), which follows `MOVED` and `ASK` redirects and waits out `TRYAGAIN`
//! while a slot migrates. Scripts are the `SPUBLISH` form; a node that does not have one cached
//! (a new master after a failover) is sent its source.
//!
//! The subscription `SSUBSCRIBE`s each wanted channel on the node that owns its slot. A node
//! unsubscribes a channel by itself when its slot moves away: that channel's waiters are woken
//! (their next script call follows the redirect) and the channel is subscribed again, now on the
//! new owner. A lost connection to any node wakes every waiter, and every wanted channel is
//! subscribed again; so does a master that leaves a `PING`, sent to every master every 10 s
//! while any channel is wanted, unanswered for 2 s.
//!
//! redis-rs connects to a node again only when its connection breaks: a request that times out
//! leaves the connection in place. One that stays open and says nothing (a NAT or a load
//! balancer that forgot it) is given up by redlatch: after a request times out, the next one
//! goes on a new cluster connection (the caller's retry, the watchdog's next renewal), and the
//! subscription moves to a new one when its `PING` goes unanswered.

use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{ErrorKind, PushInfo, PushKind, ServerErrorKind, Value};
use tokio::sync::{mpsc, watch};

use super::Request;
use super::script::{By, Publish, Script, by_source};
use super::slots::{Short, Slots};
use super::subscription::{HEARTBEAT_ANSWER, Listener, Requests, heartbeat, pause};
use crate::error::Result;

/// How often channels without waiters are looked for, to be unsubscribed.
const SWEEP_EVERY: Duration = Duration::from_millis(500);
/// How long after a failed subscription it is tried again.
const RESUBSCRIBE_AFTER: Duration = Duration::from_millis(50);

/// How long a new cluster connection's script loads may take before requests go on without
/// them (they then send a script's source where a node lacks it).
const LOAD_LIMIT: Duration = Duration::from_millis(500);

/// The number of hash slots of a Redis Cluster.
const SLOTS: u16 = 16384;

/// The hash slot of `key`: of the part between the first `{` and the next `}` when it is not
/// empty, else of the whole key.
pub(crate) fn slot(key: &str) -> u16 {
    slot_of(key.as_bytes())
}

fn slot_of(bytes: &[u8]) -> u16 {
    let tagged = bytes.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &bytes[open + 1..];
        rest.iter()
            .position(|&b| b == b'}')
            .filter(|&close| close > 0)
            .map(|close| &rest[..close])
    });
    crc16::State::<crc16::XMODEM>::calculate(tagged.unwrap_or(bytes)) % SLOTS
}

/// Where the cluster connection comes from.
pub(crate) enum Source {
    /// A client of our own.
    Client(Box<ClusterClient>),
    /// The caller's deadpool pool (one connection taken from it for good).
    Pool(deadpool_redis::cluster::Pool),
}

/// One cluster connection, made on first use (and again after an unrecoverable failure or a
/// timeout), with every script loaded on every node (for [`LOAD_LIMIT`] at most).
pub(crate) struct Connector {
    source: Source,
    scripts: Vec<&'static Script>,
    /// The subscription's connection, whose pushes go to the client's push sender (requests'
    /// go nowhere).
    subscribes: bool,
    /// The connection and the number it was made as (the count of connections made).
    conn: StdMutex<Option<(ClusterConnection, u64)>>,
    made: std::sync::atomic::AtomicU64,
    connecting: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let source = match self.source {
            Source::Client(_) => "client",
            Source::Pool(_) => "pool",
        };
        f.debug_struct("Connector")
            .field("source", &source)
            .finish_non_exhaustive()
    }
}

impl Connector {
    /// The requests' connection, each made with `scripts` loaded on every node.
    pub(crate) fn requests(source: Source, scripts: Vec<&'static Script>) -> Arc<Self> {
        Self::new(source, scripts, false)
    }

    /// The subscription's connection.
    pub(crate) fn subscription(source: Source) -> Arc<Self> {
        Self::new(source, Vec::new(), true)
    }

    fn new(source: Source, scripts: Vec<&'static Script>, subscribes: bool) -> Arc<Self> {
        Arc::new(Self {
            source,
            scripts,
            subscribes,
            conn: StdMutex::new(None),
            made: std::sync::atomic::AtomicU64::new(0),
            connecting: tokio::sync::Mutex::new(()),
        })
    }

    /// How long a request may wait for its answer before redlatch counts it timed out, where
    /// redis-rs does not: a deadpool pool's cluster client has no response timeout, and a
    /// silent node would hold its requests for ever. Our own client's is redis-rs's own
    /// ([`CLUSTER_RESPONSE_TIMEOUT`](super::CLUSTER_RESPONSE_TIMEOUT), retries included).
    fn limit(&self) -> Option<Duration> {
        match self.source {
            Source::Client(_) => None,
            Source::Pool(_) => Some(super::CLUSTER_RESPONSE_TIMEOUT),
        }
    }

    fn cached(&self) -> Option<(ClusterConnection, u64)> {
        self.conn.lock().ok().and_then(|c| c.clone())
    }

    /// Drops connection number `made` (see [`get`](Self::get)) if it is still the one in use:
    /// the next request makes a new one. (Callers that find the same connection failed forget
    /// it once, not the one made after it.)
    fn forget(&self, made: u64) {
        if let Ok(mut slot) = self.conn.lock()
            && slot.as_ref().is_some_and(|(_, n)| *n == made)
        {
            slot.take();
        }
    }

    /// The connection in use, made first if there is none, and its number.
    async fn get(&self) -> Result<(ClusterConnection, u64)> {
        if let Some(conn) = self.cached() {
            return Ok(conn);
        }
        let _single_flight = self.connecting.lock().await;
        if let Some(conn) = self.cached() {
            return Ok(conn);
        }
        let conn = match &self.source {
            Source::Client(client) if self.subscribes => client.get_async_connection().await?,
            // The requests' connection: its pushes (a node's connection lost, as an idle one
            // the server closes) are no news for the subscription's, which has its own. They
            // go nowhere, rather than to the client's push sender, which the subscription's
            // are for.
            Source::Client(client) => {
                let quiet = redis::cluster::ClusterConfig::new()
                    .set_response_timeout(super::CLUSTER_RESPONSE_TIMEOUT)
                    .set_push_sender(|_: redis::PushInfo| Ok::<(), ()>(()));
                client.get_async_connection_with_config(quiet).await?
            }
            Source::Pool(pool) => {
                deadpool_redis::cluster::Connection::take(Box::pin(pool.get()).await?)
            }
        };
        // `SCRIPT LOAD` goes to every node, all scripts at once and for `LOAD_LIMIT` at most:
        // a node that does not answer holds up the requests that wait for the connection that
        // long, not a response timeout per script. A failed load costs nothing: a call by
        // hash falls back to the source.
        let loads = self.scripts.iter().map(|script| {
            let mut conn = conn.clone();
            async move {
                let _: redis::RedisResult<Value> =
                    script.load(Publish::Sharded).query_async(&mut conn).await;
            }
        });
        let _ = tokio::time::timeout(LOAD_LIMIT, futures_util::future::join_all(loads)).await;
        let made = self
            .made
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            .wrapping_add(1);
        if let Ok(mut slot) = self.conn.lock() {
            *slot = Some((conn.clone(), made));
        }
        Ok((conn, made))
    }
}

/// The requests side of a cluster.
#[derive(Debug)]
pub(crate) struct Node {
    connector: Arc<Connector>,
    slots: Arc<Slots>,
}

/// The slot of a script call's first key (`EVALSHA sha numkeys key ...`).
fn first_key_slot(cmd: &redis::Cmd) -> Option<u16> {
    match cmd.args_iter().nth(3)? {
        redis::Arg::Simple(key) => Some(slot_of(key)),
        _ => None,
    }
}

impl Node {
    /// Requests through `connector`'s cluster connection, and the short way to masters
    /// connecting as to `seed` (see [`Slots`]).
    pub(crate) fn new(connector: Arc<Connector>, seed: Option<redis::ConnectionInfo>) -> Self {
        Self {
            connector,
            slots: Slots::new(seed),
        }
    }

    /// Runs a script by its SHA1, or by its source on a node that does not have it cached, and
    /// returns its raw reply: straight to the master that serves its keys when the slot map is
    /// known, else (and when that master redirects, asks to wait or loses the reply, unless
    /// the request is not [resendable](Request::resendable)) through the cluster connection,
    /// with the same command.
    pub(crate) async fn invoke<R: Request>(&self, request: &R) -> Result<Value> {
        let by = By::hash(Publish::Sharded);
        // The same command by source (`EVAL`) where a node lacks the script: with the same
        // request id, so that a request that ran already on a node that had it is not run
        // again where it answers from the request log.
        let (mut cmd, source) = request.call(by).into_parts();
        let mut by_hash = true;
        if let Some(slot) = first_key_slot(&cmd) {
            match self.slots.send(slot, &cmd, request.resendable()).await {
                // The master does not have the script (a new master): its source, the long way.
                Short::Done(Err(err))
                    if err.kind() == ErrorKind::Server(ServerErrorKind::NoScript) =>
                {
                    cmd = by_source(&cmd, source);
                    by_hash = false;
                }
                Short::Done(reply) => return reply.map_err(Into::into),
                Short::Long => {}
            }
        }
        let (mut conn, made) = self.connector.get().await?;
        self.slots.read_map(&conn);
        let call = async {
            match cmd.query_async(&mut conn).await {
                Err(err)
                    if by_hash && err.kind() == ErrorKind::Server(ServerErrorKind::NoScript) =>
                {
                    by_source(&cmd, source).query_async(&mut conn).await
                }
                other => other,
            }
        };
        let reply = match self.connector.limit() {
            Some(limit) => tokio::time::timeout(limit, call).await.unwrap_or_else(|_| {
                Err(super::timed_out(
                    "a cluster node left the request unanswered",
                ))
            }),
            None => call.await,
        };
        reply.map_err(|err| {
            // A timeout: redis-rs would keep the connection (it connects to a node again only
            // when its connection breaks), and one that is open and silent would time out every
            // request to that node. The next request goes on a new one.
            if err.is_unrecoverable_error() || err.is_timeout() {
                self.connector.forget(made);
            }
            err.into()
        })
    }
}

/// Runs the sharded subscription over `connector`'s connection, whose client sends its pushes
/// to `pushes`, until `shutdown`'s sender is dropped.
pub(crate) fn spawn_subscription(
    connector: Arc<Connector>,
    pushes: mpsc::UnboundedReceiver<PushInfo>,
    listener: Arc<dyn Listener>,
    requests: Requests,
    shutdown: watch::Receiver<()>,
) {
    tokio::spawn(run(connector, pushes, listener, requests, shutdown));
}

/// What the cluster client does with each push: a wake-up message goes straight to `listener`
/// (from redis-rs's own task, with no hop through ours: a hand-over's latency is the path of its
/// message); everything else (confirmations, unsolicited unsubscribes, lost connections) goes to
/// the subscription task through `rest`.
pub(crate) fn push_sender(
    listener: Arc<dyn Listener>,
    rest: mpsc::UnboundedSender<PushInfo>,
) -> impl Fn(PushInfo) -> std::result::Result<(), ()> + Send + Sync + 'static {
    move |push: PushInfo| {
        if push.kind == PushKind::SMessage
            && let (Some(channel), Some(Value::BulkString(payload))) =
                (push.data.first().and_then(super::text), push.data.get(1))
        {
            listener.message(&channel, payload);
            return Ok(());
        }
        rest.send(push).map_err(|_| ())
    }
}

/// Subscribes `channel` in the background; a failure sends it to `again` after a short wait.
fn subscribe(
    conn: &ClusterConnection,
    channel: String,
    listener: &Arc<dyn Listener>,
    again: &mpsc::UnboundedSender<String>,
) {
    let mut conn = conn.clone();
    let listener = Arc::clone(listener);
    let again = again.clone();
    tokio::spawn(async move {
        match conn.ssubscribe(&channel).await {
            Ok(()) => listener.subscribed(&channel),
            Err(err) => {
                tracing::debug!(%channel, error = %err, "sharded subscription failed, retrying");
                // Its waiters poll until it is made (a node that does not answer may never
                // confirm it, and a waiter must not wait for a message it cannot get).
                listener.unheard(&channel);
                tokio::time::sleep(RESUBSCRIBE_AFTER).await;
                let _ = again.send(channel);
            }
        }
    });
}

/// Whether a master leaves a `PING` on `conn` (sent to every master; RESP3 allows it while
/// subscribed) unanswered for [`HEARTBEAT_ANSWER`]. Another failure (a master down) is not
/// silence: the lost connection's own notice, or the failed subscriptions, deal with it.
async fn silent(conn: &ClusterConnection) -> bool {
    let mut conn = conn.clone();
    let ping = redis::cmd("PING");
    match tokio::time::timeout(HEARTBEAT_ANSWER, ping.query_async::<Value>(&mut conn)).await {
        Err(_) => true,
        Ok(reply) => reply.is_err_and(|err| err.is_timeout()),
    }
}

async fn run(
    connector: Arc<Connector>,
    mut pushes: mpsc::UnboundedReceiver<PushInfo>,
    listener: Arc<dyn Listener>,
    requests: Requests,
    mut shutdown: watch::Receiver<()>,
) {
    let mut requests = requests.into_inner();
    let (again, mut retries) = mpsc::unbounded_channel::<String>();
    let mut retry = Duration::from_millis(10);
    loop {
        let conn = tokio::select! {
            _ = shutdown.changed() => return,
            conn = connector.get() => conn,
        };
        let (conn, made) = match conn {
            Ok(conn) => conn,
            Err(err) => {
                tracing::debug!(error = %err, "cluster unavailable, waiters poll");
                if !pause(&mut shutdown, &mut retry, Duration::from_secs(1)).await {
                    return;
                }
                continue;
            }
        };
        // Every wanted channel, one at a time: channels of different slots cannot share a
        // command.
        let names = listener.channels();
        let subscribed = futures_util::future::join_all(names.iter().map(|name| {
            let mut conn = conn.clone();
            async move { conn.ssubscribe(name).await }
        }));
        let subscribed = tokio::select! {
            _ = shutdown.changed() => return,
            all = subscribed => all.into_iter().all(|r| r.is_ok()),
        };
        if !subscribed {
            if !pause(&mut shutdown, &mut retry, Duration::from_secs(1)).await {
                return;
            }
            continue;
        }
        retry = Duration::from_millis(10);
        listener.connected(&names);
        let mut sweep = tokio::time::interval(SWEEP_EVERY);
        let mut heartbeat = heartbeat();
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = heartbeat.tick() => {
                    if !listener.channels().is_empty() && silent(&conn).await {
                        // redis-rs keeps a connection that is open and silent: a new one.
                        tracing::debug!("a cluster node did not answer a PING");
                        connector.forget(made);
                        break;
                    }
                }
                push = pushes.recv() => {
                    let Some(push) = push else { return };
                    let channel = push.data.first().and_then(super::text);
                    match (push.kind, channel) {
                        (PushKind::SSubscribe, Some(channel)) => listener.subscribed(&channel),
                        (PushKind::SUnsubscribe, Some(channel)) if listener.wants(&channel) => {
                            // The node gave the channel up: its slot moved. Whatever was
                            // released meanwhile went unheard.
                            listener.unheard(&channel);
                            subscribe(&conn, channel, &listener, &again);
                        }
                        (PushKind::Disconnection, _) => break,
                        _ => {}
                    }
                }
                name = requests.recv() => {
                    let Some(name) = name else { return };
                    if listener.wants(&name) {
                        subscribe(&conn, name, &listener, &again);
                    }
                }
                Some(name) = retries.recv() => {
                    if listener.wants(&name) {
                        subscribe(&conn, name, &listener, &again);
                    }
                }
                _ = sweep.tick() => {
                    for name in listener.idle() {
                        let mut conn = conn.clone();
                        tokio::spawn(async move {
                            let _ = conn.sunsubscribe(&name).await;
                        });
                    }
                }
            }
        }
        tracing::debug!("a cluster node's connection was lost, waiters poll until it is back");
        listener.disconnected();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_those_of_the_hash_tag() {
        // Values from `CLUSTER KEYSLOT` of Redis 7.0.
        assert_eq!(slot("foo"), 12182);
        assert_eq!(slot("{user1000}.following"), slot("user1000"));
        assert_eq!(slot("redlatch:{orders:42}:wake"), slot("orders:42"));
        // An empty tag does not count: the whole key is hashed.
        assert_ne!(slot("{}x"), slot("x"));
    }
}
