//! Durable writes (one server): script calls that count only once replicas acknowledged them.
//!
//! `WAIT` blocks the connection it is sent on, and counts only that connection's writes, so
//! durable calls go over a connection of their own, never the one every other request shares;
//! one per durability setting used (up to eight, `single::DURABLE_CONNECTIONS`), so that one
//! setting's long `WAIT` (many replicas, a long timeout) never holds up the calls and renewals
//! of another. A task owns each: it takes every
//! call queued since its last round, sends them back to back
//! (with `ROLE`, which says how many replicas are connected), then one `WAIT` that covers them
//! all (group commit), and answers each call with its reply and the acknowledgements. Calls
//! that want their writes fsynced wait with one `WAITAOF` instead; the server is asked once per
//! connection whether it has the command (Redis 7.2 and later), and without it they are refused
//! before they run.

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{Cmd, Value};
use tokio::sync::{mpsc, oneshot};

use super::script::Script;
use super::single::{demoted, send_on};
use super::source::Source;
use crate::config::Durability;
use crate::error::{Error, Result};

/// The most calls one round carries.
const BATCH: usize = 256;
/// How much longer than its timeout a `WAIT` may take to answer before the call is given up.
const WAIT_MARGIN: Duration = Duration::from_secs(1);

/// How many replicas a durable call waits for, and for how long at most.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Want {
    /// At least this many; `None`: every replica connected when the call ran.
    pub(crate) replicas: Option<u32>,
    pub(crate) timeout: Duration,
    /// Fsynced to the append-only file (`WAITAOF`) rather than received (`WAIT`); `Some(true)`:
    /// by the master too.
    pub(crate) aof: Option<bool>,
}

impl Want {
    /// What `durability` asks of each durable call; `None`: nothing (not durable).
    pub(crate) fn of(durability: Durability) -> Option<Self> {
        let (replicas, timeout, aof) = match durability {
            Durability::AllReplicas { timeout } => (None, timeout, None),
            Durability::Replicas { count, timeout } => (Some(count), timeout, None),
            Durability::Fsynced {
                local,
                replicas,
                timeout,
            } => (Some(replicas), timeout, Some(local)),
            _ => return None,
        };
        Some(Self {
            replicas,
            timeout,
            aof,
        })
    }
}

/// A durable call's reply: the script's raw reply, and how many replicas acknowledged it of
/// how many were wanted.
#[derive(Debug)]
pub(crate) struct Acked {
    pub(crate) raw: Value,
    pub(crate) acked: u32,
    pub(crate) wanted: u32,
}

struct Job {
    cmd: Cmd,
    source: &'static str,
    want: Want,
    reply: oneshot::Sender<Result<Acked>>,
}

/// A durable connection's task, as its callers see it.
#[derive(Debug, Clone)]
pub(crate) struct Durable {
    jobs: mpsc::UnboundedSender<Job>,
}

impl Durable {
    /// Starts the task on the current runtime: it takes its connection from `source` on first
    /// use (and again after a failure or a failover), loading `scripts`.
    pub(crate) fn spawn(source: Source, scripts: Vec<&'static Script>) -> Self {
        let (jobs, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(source, scripts, rx));
        Self { jobs }
    }

    /// Runs `cmd` (the `EVALSHA` of the script whose source is `source`) and waits for `want`.
    pub(crate) async fn send(&self, cmd: Cmd, source: &'static str, want: Want) -> Result<Acked> {
        let (reply, rx) = oneshot::channel();
        self.jobs
            .send(Job {
                cmd,
                source,
                want,
                reply,
            })
            .map_err(|_| gone())?;
        rx.await.map_err(|_| gone())?
    }

    /// Completes once every call queued before it has run: a request sent on another
    /// connection afterwards reaches the server after them. (A `PING` in the queue, which
    /// waits for no replica.)
    pub(crate) async fn barrier(&self) {
        let (reply, rx) = oneshot::channel();
        let job = Job {
            cmd: redis::cmd("PING"),
            source: "",
            want: Want {
                replicas: Some(0),
                timeout: Duration::from_millis(1),
                aof: None,
            },
            reply,
        };
        if self.jobs.send(job).is_ok() {
            let _ = rx.await;
        }
    }
}

fn gone() -> Error {
    Error::Redis(redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::BrokenPipe,
        "the durable connection's task is gone",
    )))
}

/// A failure to connect, for each call of a round: the same error (a pool's or Redis's, of the
/// same kind, so that a caller tells them apart as for any request), or its text as an I/O
/// error where it cannot be copied.
fn again(err: &Error) -> Error {
    use deadpool_redis::PoolError;
    match err {
        Error::Redis(e) => Error::Redis(e.clone()),
        Error::Pool(PoolError::Backend(e)) => Error::Pool(PoolError::Backend(e.clone())),
        Error::Pool(PoolError::Timeout(t)) => Error::Pool(PoolError::Timeout(*t)),
        Error::Pool(PoolError::Closed) => Error::Pool(PoolError::Closed),
        other => shared(other),
    }
}

/// A failure shared by every call of a round, one error each.
fn shared(err: &dyn std::fmt::Display) -> Error {
    Error::Redis(redis::RedisError::from(std::io::Error::other(
        err.to_string(),
    )))
}

async fn run(source: Source, scripts: Vec<&'static Script>, mut rx: mpsc::UnboundedReceiver<Job>) {
    // The connection, the source's generation when it was made, and whether its server has
    // `WAITAOF` (once asked).
    let mut conn: Option<(MultiplexedConnection, u64, Option<bool>)> = None;
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while batch.len() < BATCH {
            match rx.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let generation = source.generation();
        let (c, mut aof) = match conn.clone().filter(|(_, made, _)| *made == generation) {
            Some((c, _, aof)) => (c, aof),
            None => match source.connect(&scripts).await {
                Ok(c) => (c, None),
                Err(err) => {
                    conn = None;
                    for job in batch {
                        let _ = job.reply.send(Err(again(&err)));
                    }
                    continue;
                }
            },
        };
        if aof.is_none() && batch.iter().any(|job| job.want.aof.is_some()) {
            aof = probe_waitaof(&c).await;
        }
        conn = Some((c.clone(), generation, aof));
        if aof != Some(true) && batch.iter().any(|job| job.want.aof.is_some()) {
            // Refused before anything is taken: the server has no `WAITAOF`, or did not say.
            let (refused, rest): (Vec<Job>, Vec<Job>) =
                batch.into_iter().partition(|job| job.want.aof.is_some());
            for job in refused {
                let _ = job.reply.send(Err(match aof {
                    Some(_) => Error::Unsupported {
                        what: "Durability::Fsynced (WAITAOF)",
                        reason: "the server has no WAITAOF (Redis 7.2 and later have it), or \
                                 this user may not run it",
                    },
                    None => shared(&"the server did not say whether it has WAITAOF"),
                }));
            }
            batch = rest;
            if batch.is_empty() {
                continue;
            }
        }
        if let Err(err) = round(c, batch).await {
            tracing::debug!(error = %err, "durable connection failed; taking a new one");
            conn = None;
        }
    }
}

/// Whether the server has `WAITAOF` for this connection's user (`None`: it did not say).
/// Asked with a `WAITAOF 0 0 1`, which waits for nothing: a server without it (7.0, 7.1)
/// answers with an unknown command, and a user who may not run it has it no more than such a
/// server does. (`COMMAND INFO`, asked before, failed for a user without `COMMAND`, and every
/// fsynced call failed after it, asked again each time.)
async fn probe_waitaof(conn: &MultiplexedConnection) -> Option<bool> {
    let mut conn = conn.clone();
    let probe = redis::cmd("WAITAOF")
        .arg(0)
        .arg(0)
        .arg(1)
        .query_async::<Value>(&mut conn)
        .await;
    match probe {
        Ok(_) => Some(true),
        // Only a refusal that will not change; anything else is asked again next time.
        Err(err) => match err.kind() {
            redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm) => Some(false),
            redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError)
                if err.to_string().to_lowercase().contains("unknown command") =>
            {
                Some(false)
            }
            _ => None,
        },
    }
}

/// One round: the calls and `ROLE` back to back, then one `WAIT` and one `WAITAOF` (each only
/// if a call wants it) for them all.
async fn round(conn: MultiplexedConnection, batch: Vec<Job>) -> redis::RedisResult<()> {
    let calls = batch.iter().map(|job| {
        let mut conn = conn.clone();
        async move { send_on(&mut conn, &job.cmd, job.source).await }
    });
    let role = {
        let mut conn = conn.clone();
        async move { redis::cmd("ROLE").query_async::<Value>(&mut conn).await }
    };
    let (replies, role) =
        futures_util::future::join(futures_util::future::join_all(calls), role).await;
    let connected = match &role {
        Ok(role) => connected_replicas(role),
        Err(_) => 0,
    };
    let wanted: Vec<u32> = batch
        .iter()
        .map(|job| match job.want.aof {
            None => job.want.replicas.unwrap_or(connected),
            Some(local) => job
                .want
                .replicas
                .unwrap_or(0)
                .saturating_add(u32::from(local)),
        })
        .collect();
    let received = wait(&conn, &batch, &wanted).await;
    let fsynced = wait_aof(&conn, &batch).await;
    // `ROLE` refused (an ACL without `@dangerous`) or unanswered: how many replicas are
    // connected is unknown, and a write that must reach all of them cannot be known to have.
    let role_failed = match &role {
        Ok(_) => None,
        Err(err) => {
            tracing::warn!(error = %err, "ROLE failed: a write cannot be confirmed on every replica");
            Some(err)
        }
    };
    // A refused `ROLE` is the user's rights, not the connection's state.
    let role_broken = role_failed.filter(|err| {
        err.is_io_error()
            || err.is_connection_dropped()
            || err.is_timeout()
            || err.is_unrecoverable_error()
    });
    let broken = match (&received, &fsynced, role_broken) {
        (Err(err), _, _) | (_, Err(err), _) | (_, _, Some(err)) => Some(err.clone()),
        // A demoted master: the next round takes a connection to the master there is now.
        _ => replies
            .iter()
            .find_map(|reply| reply.as_ref().err().filter(|err| demoted(err)).cloned()),
    };
    for ((job, reply), wanted) in batch.into_iter().zip(replies).zip(wanted) {
        let acked = match job.want.aof {
            None => received.clone(),
            Some(local) => fsynced.clone().map(|(on_master, on_replicas)| {
                let replicas = on_replicas.min(job.want.replicas.unwrap_or(0));
                replicas.saturating_add(u32::from(local && on_master > 0))
            }),
        };
        let every_replica = job.want.aof.is_none() && job.want.replicas.is_none();
        let answer = match (reply, acked) {
            (Ok(raw), _) if every_replica && role_failed.is_some() => Ok(Acked {
                raw,
                acked: 0,
                wanted: wanted.max(1),
            }),
            (Ok(raw), Ok(acked)) => Ok(Acked { raw, acked, wanted }),
            (Err(err), _) => Err(Error::from(err)),
            (Ok(_), Err(err)) => Err(Error::Redis(err)),
        };
        let _ = job.reply.send(answer);
    }
    match broken {
        Some(err) => Err(err),
        None => Ok(()),
    }
}

/// A clone of `conn` whose requests may take `timeout` and a margin: a wait may last its whole
/// timeout, longer than the connection's response timeout (redis-rs: 500 ms by default), which
/// would count a slow answer as a lost one.
fn waiting(conn: &MultiplexedConnection, timeout: Duration) -> MultiplexedConnection {
    let mut conn = conn.clone();
    conn.set_response_timeout(timeout.saturating_add(WAIT_MARGIN));
    conn
}

fn millis(timeout: Duration) -> u64 {
    u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX)
}

/// One `WAIT` for the most replicas the `WAIT` calls of `batch` want: how many acknowledged.
async fn wait(
    conn: &MultiplexedConnection,
    batch: &[Job],
    wanted: &[u32],
) -> redis::RedisResult<u32> {
    let waits = || {
        batch
            .iter()
            .zip(wanted)
            .filter(|(job, _)| job.want.aof.is_none())
    };
    let most = waits().map(|(_, wanted)| *wanted).max().unwrap_or(0);
    if most == 0 {
        return Ok(0);
    }
    let timeout = waits()
        .map(|(job, _)| job.want.timeout)
        .max()
        .unwrap_or_default();
    redis::cmd("WAIT")
        .arg(most)
        .arg(millis(timeout))
        .query_async::<i64>(&mut waiting(conn, timeout))
        .await
        .map(|n| u32::try_from(n).unwrap_or(0))
}

/// One `WAITAOF` for what the `WAITAOF` calls of `batch` want at most: how many fsynced, on the
/// master (0 or 1) and on replicas.
async fn wait_aof(conn: &MultiplexedConnection, batch: &[Job]) -> redis::RedisResult<(u32, u32)> {
    let fsyncs = || {
        batch
            .iter()
            .filter_map(|job| job.want.aof.map(|local| (job, local)))
    };
    if fsyncs().next().is_none() {
        return Ok((0, 0));
    }
    let local = fsyncs().any(|(_, local)| local);
    let replicas = fsyncs()
        .map(|(job, _)| job.want.replicas.unwrap_or(0))
        .max()
        .unwrap_or(0);
    let timeout = fsyncs()
        .map(|(job, _)| job.want.timeout)
        .max()
        .unwrap_or_default();
    let (on_master, on_replicas): (i64, i64) = redis::cmd("WAITAOF")
        .arg(u32::from(local))
        .arg(replicas)
        .arg(millis(timeout))
        .query_async(&mut waiting(conn, timeout))
        .await?;
    let count = |n: i64| u32::try_from(n).unwrap_or(0);
    Ok((count(on_master), count(on_replicas)))
}

/// How many replicas a master's `ROLE` reply lists (0 for anything else).
fn connected_replicas(role: &Value) -> u32 {
    match role {
        Value::Array(items) => match items.get(2) {
            Some(Value::Array(replicas)) => u32::try_from(replicas.len()).unwrap_or(u32::MAX),
            _ => 0,
        },
        _ => 0,
    }
}
