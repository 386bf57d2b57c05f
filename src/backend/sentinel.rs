//! Redis Sentinel: the master that the sentinels name now, and a watch on their
//! `+switch-master` announcements, so that every connection moves to the new master as soon as
//! a failover is announced rather than when the old one fails it.

use std::time::Duration;

use futures_util::StreamExt;
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{ConnectionInfo, RedisError, RedisResult};
use tokio::sync::watch;

use super::subscription::{HEARTBEAT_ANSWER, heartbeat};

/// How long to wait before listening on the next sentinel after one failed.
const NEXT_SENTINEL: Duration = Duration::from_millis(200);

/// The master of one Sentinel-monitored set.
pub(crate) struct Master {
    name: String,
    sentinels: Vec<ConnectionInfo>,
    /// Asks the sentinels which server is the master, and checks that it says so (`ROLE`).
    client: tokio::sync::Mutex<SentinelClient>,
    /// How many failovers were announced since the client started.
    moves: watch::Sender<u64>,
}

impl std::fmt::Debug for Master {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Master")
            .field("name", &self.name)
            .field("sentinels", &self.sentinels.len())
            .field("moves", &*self.moves.borrow())
            .finish()
    }
}

impl Master {
    /// The master called `name` that `sentinels` monitor, reached with `node`'s settings
    /// (credentials, database, TLS; `None`: redis-rs's defaults).
    ///
    /// # Errors
    ///
    /// redis-rs's, for no sentinel or an address it cannot use.
    pub(crate) fn new(
        sentinels: Vec<ConnectionInfo>,
        name: String,
        node: Option<SentinelNodeConnectionInfo>,
    ) -> RedisResult<Self> {
        let client = SentinelClient::build(
            sentinels.clone(),
            name.clone(),
            node,
            SentinelServerType::Master,
        )?;
        Ok(Self {
            name,
            sentinels,
            client: tokio::sync::Mutex::new(client),
            moves: watch::Sender::new(0),
        })
    }

    /// A client of the server the sentinels name as master now (which confirmed it is one).
    ///
    /// # Errors
    ///
    /// No sentinel answered, or none named a master that confirmed it.
    pub(crate) async fn client(&self) -> RedisResult<redis::Client> {
        self.client.lock().await.async_get_client().await
    }

    /// Counts the failovers announced.
    pub(crate) fn moves(&self) -> watch::Receiver<u64> {
        self.moves.subscribe()
    }

    /// How many failovers were announced.
    pub(crate) fn generation(&self) -> u64 {
        *self.moves.borrow()
    }

    /// Listens to the sentinels' `+switch-master` announcements until `shutdown`'s sender is
    /// dropped: on one sentinel at a time, the next one when it fails. An announcement made
    /// between the two is not heard: once listening again, every connection checks the
    /// master the sentinels name, as after an announcement. Must be called inside a tokio
    /// runtime.
    pub(crate) fn watch(self: &std::sync::Arc<Self>, mut shutdown: watch::Receiver<()>) {
        let master = std::sync::Arc::clone(self);
        tokio::spawn(async move {
            let mut gap = false;
            for sentinel in master.sentinels.iter().cycle() {
                tokio::select! {
                    _ = shutdown.changed() => return,
                    ended = master.listen(sentinel, gap) => {
                        tracing::debug!(error = ?ended.err(), "sentinel announcements lost; trying the next sentinel");
                    }
                }
                gap = true;
                tokio::select! {
                    _ = shutdown.changed() => return,
                    _ = tokio::time::sleep(NEXT_SENTINEL) => {}
                }
            }
        });
    }

    /// Counts the failovers of this master that `sentinel` announces, until its connection ends
    /// or the sentinel goes silent: connecting and subscribing may take [`HEARTBEAT_ANSWER`],
    /// and the sentinel is asked for a `PING` every [`HEARTBEAT`](super::subscription::HEARTBEAT), answered within as long. A
    /// sentinel gone without a word (its host down, a partition) would otherwise leave the
    /// client deaf to failovers, each then noticed only when requests to the old master fail.
    ///
    /// After a `gap` in listening, the failovers counted go up by one once subscribed.
    async fn listen(&self, sentinel: &ConnectionInfo, gap: bool) -> RedisResult<()> {
        let subscribe = async {
            let mut pubsub = redis::Client::open(sentinel.clone())?
                .get_async_pubsub()
                .await?;
            pubsub.subscribe("+switch-master").await?;
            Ok::<_, RedisError>(pubsub)
        };
        let (mut sink, mut messages) = tokio::time::timeout(HEARTBEAT_ANSWER, subscribe)
            .await
            .map_err(|_| silent())??
            .split();
        if gap {
            tracing::debug!("listening to the sentinels again: connections check the master");
            self.moves.send_modify(|n| *n = n.wrapping_add(1));
        }
        let mut heartbeat = heartbeat();
        loop {
            tokio::select! {
                message = messages.next() => {
                    let Some(message) = message else { return Ok(()) };
                    // `<master name> <old ip> <old port> <new ip> <new port>`
                    let payload: String = message.get_payload().unwrap_or_default();
                    if payload.split(' ').next() == Some(self.name.as_str()) {
                        tracing::info!(announcement = %payload, "sentinel announced a new master");
                        self.moves.send_modify(|n| *n = n.wrapping_add(1));
                    }
                }
                _ = heartbeat.tick() => {
                    tokio::time::timeout(HEARTBEAT_ANSWER, sink.ping::<redis::Value>())
                        .await
                        .map_err(|_| silent())??;
                }
            }
        }
    }
}

/// What a sentinel that did not answer in time fails the listening with.
fn silent() -> RedisError {
    super::timed_out("the sentinel did not answer in time")
}
