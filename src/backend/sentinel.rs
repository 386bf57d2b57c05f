//! Redis Sentinel: the master that the sentinels name now, and a watch on their
//! `+switch-master` announcements, so that every connection moves to the new master as soon as
//! a failover is announced rather than when the old one fails it.

use std::time::Duration;

use futures_util::StreamExt;
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{ConnectionAddr, ConnectionInfo, RedisError, RedisResult};
use tokio::sync::watch;

use super::subscription::{HEARTBEAT_ANSWER, heartbeat};
use super::text;

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
    /// redis-rs takes the first sentinel of the list that names a master which says it is one,
    /// without comparing what the others say: a sentinel that has not learned of a failover
    /// (or monitors another set under the same name) names the old master, which a pause or a
    /// partition can leave saying it is master for a while. The sentinels are asked for their
    /// configuration epoch too, and the master of the newest one that answers in time wins: if
    /// that is another server, it is taken once it confirms it is master, and if it does not,
    /// the lookup fails (and is made again by the next request) rather than settle on an older
    /// one.
    ///
    /// # Errors
    ///
    /// No sentinel answered, none named a master that confirmed it, or the newest one named
    /// did not.
    pub(crate) async fn client(&self) -> RedisResult<redis::Client> {
        let chosen = self.client.lock().await.async_get_client().await?;
        let info = chosen.get_connection_info();
        let (chosen_host, chosen_port) = match info.addr() {
            ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
                (host.as_str(), *port)
            }
            // Sentinels name TCP addresses only.
            _ => return Ok(chosen),
        };
        let newest = self.newest().await;
        // Of several masters named in the newest epoch (sentinels that disagree), the one
        // redis-rs chose stands.
        if newest
            .iter()
            .any(|named| named.host == chosen_host && named.port == chosen_port)
        {
            return Ok(chosen);
        }
        let Some(Named { host, port, .. }) = newest.into_iter().next() else {
            return Ok(chosen);
        };
        let addr = match info.addr() {
            ConnectionAddr::Tcp(..) => ConnectionAddr::Tcp(host, port),
            ConnectionAddr::TcpTls {
                insecure,
                tls_params,
                ..
            } => ConnectionAddr::TcpTls {
                host,
                port,
                insecure: *insecure,
                tls_params: tls_params.clone(),
            },
            _ => return Ok(chosen),
        };
        tracing::info!(
            chosen = ?info.addr(),
            newest = ?addr,
            "a sentinel named an older master than the newest configuration does"
        );
        let newest = redis::Client::open(info.clone().set_addr(addr))?;
        if says_master(&newest).await {
            Ok(newest)
        } else {
            Err(RedisError::from((
                redis::ErrorKind::MasterNameNotFoundBySentinel,
                "the master of the sentinels' newest configuration did not confirm it is master",
            )))
        }
    }

    /// The masters named in the newest configuration (the highest `config-epoch`) by the
    /// sentinels that answer within [`HEARTBEAT_ANSWER`], in the sentinels' order; empty if
    /// none does. What a sentinel thinks of the master's health (`s_down`, or `disconnected`
    /// while its link to a master just switched to is being made) does not matter here: an
    /// older configuration's master is no better, and the chosen one must confirm `ROLE`.
    async fn newest(&self) -> Vec<Named> {
        let asks = self.sentinels.iter().map(|sentinel| async move {
            tokio::time::timeout(HEARTBEAT_ANSWER, master_of(sentinel, &self.name))
                .await
                .ok()
                .and_then(Result::ok)
                .flatten()
        });
        let answers: Vec<Named> = futures_util::future::join_all(asks)
            .await
            .into_iter()
            .flatten()
            .collect();
        let newest = answers.iter().map(|named| named.epoch).max();
        answers
            .into_iter()
            .filter(|named| Some(named.epoch) == newest)
            .collect()
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

/// A master as one sentinel names it.
#[derive(Debug, PartialEq, Eq)]
struct Named {
    host: String,
    port: u16,
    /// The configuration epoch it was named in: every failover raises it.
    epoch: u64,
}

/// The master called `name` as `sentinel` names it (`SENTINEL MASTER`), unless the sentinel
/// does not know it.
async fn master_of(sentinel: &ConnectionInfo, name: &str) -> RedisResult<Option<Named>> {
    let mut conn = redis::Client::open(sentinel.clone())?
        .get_multiplexed_async_connection()
        .await?;
    let reply: redis::Value = redis::cmd("SENTINEL")
        .arg("MASTER")
        .arg(name)
        .query_async(&mut conn)
        .await?;
    Ok(named(reply))
}

/// The fields of a `SENTINEL MASTER` reply (pairs in an array, or a map in RESP3) that say
/// where the master is and in which configuration epoch.
fn named(reply: redis::Value) -> Option<Named> {
    let pairs: Vec<(String, String)> = match reply {
        redis::Value::Map(map) => map
            .iter()
            .filter_map(|(k, v)| Some((text(k)?, text(v)?)))
            .collect(),
        redis::Value::Array(items) => items
            .chunks_exact(2)
            .filter_map(|pair| Some((text(&pair[0])?, text(&pair[1])?)))
            .collect(),
        _ => return None,
    };
    let field = |name: &str| {
        pairs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    Some(Named {
        host: field("ip")?.to_owned(),
        port: field("port")?.parse().ok()?,
        epoch: field("config-epoch")?.parse().ok()?,
    })
}

/// Whether the server of `client` says it is a master (`ROLE`), within [`HEARTBEAT_ANSWER`].
async fn says_master(client: &redis::Client) -> bool {
    let ask = async {
        let mut conn = client.get_multiplexed_async_connection().await?;
        redis::cmd("ROLE")
            .query_async::<redis::Value>(&mut conn)
            .await
    };
    match tokio::time::timeout(HEARTBEAT_ANSWER, ask).await {
        Ok(Ok(redis::Value::Array(role))) => {
            role.first().and_then(text).as_deref() == Some("master")
        }
        _ => false,
    }
}

/// What a sentinel that did not answer in time fails the listening with.
fn silent() -> RedisError {
    super::timed_out("the sentinel did not answer in time")
}

#[cfg(test)]
mod tests {
    use super::{Named, named};
    use redis::Value;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn reply(flags: &str) -> Vec<(Value, Value)> {
        [
            ("name", "locks"),
            ("ip", "10.0.0.2"),
            ("port", "6380"),
            ("flags", flags),
            ("config-epoch", "3"),
        ]
        .into_iter()
        .map(|(k, v)| (bulk(k), bulk(v)))
        .collect()
    }

    #[test]
    fn a_master_reply_reads_as_pairs_or_a_map() {
        let want = Some(Named {
            host: "10.0.0.2".into(),
            port: 6380,
            epoch: 3,
        });
        let flat = reply("master")
            .into_iter()
            .flat_map(|(k, v)| [k, v])
            .collect();
        assert_eq!(named(Value::Array(flat)), want);
        assert_eq!(named(Value::Map(reply("master"))), want);
    }

    /// A sentinel's view of the master's health does not hide the epoch it names it in (a
    /// link just switched to a new master reads `disconnected` for a moment).
    #[test]
    fn a_master_is_named_whatever_its_flags_and_a_partial_reply_is_not() {
        for flags in ["master,s_down", "master,o_down", "master,disconnected"] {
            assert_eq!(
                named(Value::Map(reply(flags))).map(|n| n.epoch),
                Some(3),
                "{flags}"
            );
        }
        assert_eq!(named(Value::Nil), None);
        assert_eq!(named(Value::Map(vec![(bulk("ip"), bulk("x"))])), None);
    }
}
