//! Durable writes (one server): script calls that count only once replicas acknowledged them.
//!
//! `WAIT` blocks the connection it is sent on, and counts only that connection's writes, so
//! durable calls go over a connection of their own, never the one every other request shares.
//! One task owns it: it takes every call queued since its last round, sends them back to back
//! (with `ROLE`, which says how many replicas are connected), then one `WAIT` that covers them
//! all (group commit), and answers each call with its reply and the acknowledgements.

use std::time::Duration;

use deadpool_redis::Pool;
use redis::aio::MultiplexedConnection;
use redis::{Cmd, Value};
use tokio::sync::{mpsc, oneshot};

use super::script::Script;
use super::single::{connect, send_on};
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

/// The durable connection's task, as its callers see it.
#[derive(Debug)]
pub(crate) struct Durable {
    jobs: mpsc::UnboundedSender<Job>,
}

impl Durable {
    /// Starts the task on the current runtime: it takes its connection from `pool` on first
    /// use (and again after a failure), loading `scripts`.
    pub(crate) fn spawn(pool: Pool, scripts: Vec<&'static Script>) -> Self {
        let (jobs, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(pool, scripts, rx));
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
}

fn gone() -> Error {
    Error::Redis(redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::BrokenPipe,
        "the durable connection's task is gone",
    )))
}

/// A failure shared by every call of a round, one error each.
fn shared(err: &dyn std::fmt::Display) -> Error {
    Error::Redis(redis::RedisError::from(std::io::Error::other(
        err.to_string(),
    )))
}

async fn run(pool: Pool, scripts: Vec<&'static Script>, mut rx: mpsc::UnboundedReceiver<Job>) {
    let mut conn: Option<MultiplexedConnection> = None;
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while batch.len() < BATCH {
            match rx.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let c = match conn.clone() {
            Some(c) => c,
            None => match connect(&pool, &scripts).await {
                Ok(c) => {
                    conn = Some(c.clone());
                    c
                }
                Err(err) => {
                    for job in batch {
                        let _ = job.reply.send(Err(shared(&err)));
                    }
                    continue;
                }
            },
        };
        if let Err(err) = round(c, batch).await {
            tracing::debug!(error = %err, "durable connection failed; taking a new one");
            conn = None;
        }
    }
}

/// One round: the calls and `ROLE` back to back, then one `WAIT` for them all.
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
        .map(|job| job.want.replicas.unwrap_or(connected))
        .collect();
    let most = wanted.iter().copied().max().unwrap_or(0);
    let timeout = batch
        .iter()
        .map(|job| job.want.timeout)
        .max()
        .unwrap_or_default();
    let acked = if most == 0 {
        Ok(0)
    } else {
        // The wait may last its whole timeout: longer than the connection's response timeout
        // (redis-rs: 500 ms by default) would count a slow answer as a lost one.
        let mut conn = conn.clone();
        conn.set_response_timeout(timeout.saturating_add(WAIT_MARGIN));
        redis::cmd("WAIT")
            .arg(most)
            .arg(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX))
            .query_async::<i64>(&mut conn)
            .await
            .map(|n| u32::try_from(n).unwrap_or(0))
    };
    let broken = match (&acked, &role) {
        (Err(err), _) | (_, Err(err)) => Some(err.clone()),
        _ => None,
    };
    for ((job, reply), wanted) in batch.into_iter().zip(replies).zip(wanted) {
        let answer = match (reply, &acked) {
            (Ok(raw), Ok(acked)) => Ok(Acked {
                raw,
                acked: *acked,
                wanted,
            }),
            (Err(err), _) => Err(Error::from(err)),
            (Ok(_), Err(err)) => Err(shared(err)),
        };
        let _ = job.reply.send(answer);
    }
    match broken {
        Some(err) => Err(err),
        None => Ok(()),
    }
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
