//! The short way to a cluster master: a plain multiplexed connection per master and the slot
//! map read from the cluster, so a request whose master is known goes straight to it, as on one
//! server, rather than through redis-rs's cluster connection (whose single task every request
//! and reply crosses: one more task hop each way, tens of microseconds on a virtual machine).
//!
//! The short way is only a shortcut. A request it cannot place (no map yet, a master it cannot
//! reach) goes the long way; so does one that a master redirects (`MOVED`, `ASK`), asks to wait
//! (`TRYAGAIN`, `CLUSTERDOWN`, ...), or whose reply is lost, and the map is read again. A
//! request that may have run is sent the long way as the very same command, with the same
//! request id, so a script that changes hold counts still runs once; one that a second run
//! could harm (a forced unlock) is not sent again: its caller gets the error. A master that
//! asks for a password the short way does not have turns the shortcut off for good.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use redis::{ErrorKind, IntoConnectionInfo, RedisError, ServerErrorKind, Value};

/// How long a connection to a master may take to open before the long way is taken.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// How long a master may take to answer one request the short way.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);

/// What became of a request sent the short way.
pub(crate) enum Short {
    /// Its reply.
    Done(redis::RedisResult<Value>),
    /// Not sent, or not run (a redirect, a wait), or maybe run (a lost reply of a resendable
    /// request): send the same command the long way.
    Long,
}

/// (first slot, last slot, `host:port` of its master) of every range of the cluster.
type Map = Arc<Vec<(u16, u16, String)>>;

/// The slot map and the connections of the short way.
pub(crate) struct Slots {
    /// How to connect to a master but its address: a seed's settings (credentials, database,
    /// TCP settings), or the defaults.
    template: Option<redis::ConnectionInfo>,
    /// (first slot, last slot, `host:port`) of every range, when known.
    map: StdMutex<Option<Map>>,
    conns: StdMutex<HashMap<String, MultiplexedConnection>>,
    reading: AtomicBool,
    off: AtomicBool,
}

impl std::fmt::Debug for Slots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slots")
            .field("off", &self.off.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &StdMutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Slots {
    /// The short way, connecting to masters as to `seed` (`None`: with the defaults, no
    /// password). A seed reached over TLS turns it off: the long way has what TLS needs.
    pub(crate) fn new(seed: Option<redis::ConnectionInfo>) -> Arc<Self> {
        let plain =
            |info: &redis::ConnectionInfo| matches!(info.addr(), redis::ConnectionAddr::Tcp(..));
        let (template, off) = match seed {
            Some(info) => {
                let off = !plain(&info);
                (Some(info), off)
            }
            None => (
                redis::ConnectionAddr::Tcp("127.0.0.1".to_owned(), 6379)
                    .into_connection_info()
                    .ok(),
                false,
            ),
        };
        let off = off || template.is_none();
        Arc::new(Self {
            template,
            map: StdMutex::new(None),
            conns: StdMutex::new(HashMap::new()),
            reading: AtomicBool::new(false),
            off: AtomicBool::new(off),
        })
    }

    fn master_of(&self, slot: u16) -> Option<String> {
        let map = lock(&self.map).clone()?;
        map.iter()
            .find(|(first, last, _)| (*first..=*last).contains(&slot))
            .map(|(_, _, addr)| addr.clone())
    }

    /// Forgets the map (and the connection to `addr`, if given): the next request goes the
    /// long way and has the map read again.
    fn forget(&self, addr: Option<&str>) {
        lock(&self.map).take();
        if let Some(addr) = addr {
            lock(&self.conns).remove(addr);
        }
    }

    /// Reads the slot map through the cluster connection, in the background, unless a read is
    /// under way or the shortcut is off.
    pub(crate) fn read_map(self: &Arc<Self>, conn: &ClusterConnection) {
        if self.off.load(Ordering::Relaxed)
            || lock(&self.map).is_some()
            || self.reading.swap(true, Ordering::AcqRel)
        {
            return;
        }
        let (slots, mut conn) = (Arc::clone(self), conn.clone());
        tokio::spawn(async move {
            let read: redis::RedisResult<Vec<Value>> = redis::cmd("CLUSTER")
                .arg("SLOTS")
                .query_async(&mut conn)
                .await;
            if let Ok(ranges) = read {
                let map = ranges.iter().filter_map(range).collect::<Vec<_>>();
                if !map.is_empty() {
                    *lock(&slots.map) = Some(Arc::new(map));
                }
            }
            slots.reading.store(false, Ordering::Release);
        });
    }

    async fn conn(&self, addr: &str) -> Option<MultiplexedConnection> {
        if let Some(conn) = lock(&self.conns).get(addr).cloned() {
            return Some(conn);
        }
        let (host, port) = addr.rsplit_once(':')?;
        let info = self.template.clone()?.set_addr(redis::ConnectionAddr::Tcp(
            host.to_owned(),
            port.parse().ok()?,
        ));
        let client = redis::Client::open(info).ok()?;
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(Some(RESPONSE_TIMEOUT));
        let conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .ok()?;
        lock(&self.conns).insert(addr.to_owned(), conn.clone());
        Some(conn)
    }

    /// Sends `cmd`, keyed in `slot`, straight to the master that serves it, if known. A reply
    /// lost on the way is the caller's error, not a [`Short::Long`], unless `resendable`.
    pub(crate) async fn send(&self, slot: u16, cmd: &redis::Cmd, resendable: bool) -> Short {
        if self.off.load(Ordering::Relaxed) {
            return Short::Long;
        }
        let Some(addr) = self.master_of(slot) else {
            return Short::Long;
        };
        let Some(mut conn) = self.conn(&addr).await else {
            self.forget(Some(&addr));
            return Short::Long;
        };
        match cmd.query_async::<Value>(&mut conn).await {
            Ok(value) => Short::Done(Ok(value)),
            Err(err) if refused(&err) => {
                // The short way lacks a password or a permission the long way has.
                self.off.store(true, Ordering::Relaxed);
                Short::Long
            }
            Err(err) if elsewhere(&err) => {
                self.forget(None);
                Short::Long
            }
            Err(err) if lost(&err) => {
                self.forget(Some(&addr));
                if resendable {
                    Short::Long
                } else {
                    Short::Done(Err(err))
                }
            }
            Err(err) => Short::Done(Err(err)),
        }
    }
}

/// One range of `CLUSTER SLOTS`: `[first, last, [host, port, ...], replicas...]`.
fn range(value: &Value) -> Option<(u16, u16, String)> {
    let Value::Array(items) = value else {
        return None;
    };
    let [
        Value::Int(first),
        Value::Int(last),
        Value::Array(master),
        ..,
    ] = items.as_slice()
    else {
        return None;
    };
    let [Value::BulkString(host), Value::Int(port), ..] = master.as_slice() else {
        return None;
    };
    Some((
        u16::try_from(*first).ok()?,
        u16::try_from(*last).ok()?,
        format!("{}:{port}", String::from_utf8_lossy(host)),
    ))
}

/// The master asks for credentials or a permission the short way does not have.
fn refused(err: &RedisError) -> bool {
    matches!(
        err.kind(),
        ErrorKind::AuthenticationFailed | ErrorKind::Server(ServerErrorKind::NoPerm)
    ) || err.code().is_some_and(|c| c == "NOAUTH" || c == "NOPERM")
}

/// The request did not run here: another master serves the slot, or this one asks to wait.
fn elsewhere(err: &RedisError) -> bool {
    matches!(
        err.kind(),
        ErrorKind::Server(
            ServerErrorKind::Moved
                | ServerErrorKind::Ask
                | ServerErrorKind::TryAgain
                | ServerErrorKind::ClusterDown
                | ServerErrorKind::MasterDown
                | ServerErrorKind::ReadOnly
                | ServerErrorKind::BusyLoading
        )
    )
}

/// The connection failed: the request may have run or not.
fn lost(err: &RedisError) -> bool {
    err.is_io_error()
        || err.is_timeout()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
        || err.is_unrecoverable_error()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_of_cluster_slots_names_its_master() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let reply = Value::Array(vec![
            Value::Int(5461),
            Value::Int(10922),
            Value::Array(vec![bulk("127.0.0.1"), Value::Int(7001), bulk("id-1")]),
            Value::Array(vec![bulk("127.0.0.1"), Value::Int(7004), bulk("id-4")]),
        ]);
        assert_eq!(
            range(&reply),
            Some((5461, 10922, "127.0.0.1:7001".to_owned()))
        );
        assert_eq!(range(&Value::Array(vec![Value::Int(1)])), None);
        assert_eq!(range(&Value::Int(3)), None);
    }

    #[test]
    fn a_seed_over_tls_turns_the_short_way_off() {
        let tls = redis::ConnectionAddr::TcpTls {
            host: "127.0.0.1".to_owned(),
            port: 7000,
            insecure: false,
            tls_params: None,
        }
        .into_connection_info()
        .ok();
        assert!(Slots::new(tls).off.load(Ordering::Relaxed));
        let plain = "redis://127.0.0.1:7000".into_connection_info().ok();
        assert!(!Slots::new(plain).off.load(Ordering::Relaxed));
        assert!(!Slots::new(None).off.load(Ordering::Relaxed));
    }
}
