//! Releasing and renewing holds through the protocol's operations, and the release queue that
//! releases the holds of dropped guards in the background.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{FreeNames, Hold};
use crate::backend::{Backend, Request, Want};
use crate::config::{FENCE_TTL, millis};
use crate::error::{Error, Result};
use crate::protocol::{Family, mutex, queue};
use crate::time::after;

/// How long a background release that could not be sent (no connection) is tried again for:
/// until the hold's lease would have run out, but for a second at least (one lost at its
/// deadline may be held in Redis longer) and a minute at most (a waiter's place has no lease of
/// its own); and the longest pause between two tries.
const RETRY_AT_LEAST: Duration = Duration::from_secs(1);
const RETRY_AT_MOST: Duration = Duration::from_secs(60);
const RETRY_PAUSE_MAX: Duration = Duration::from_secs(1);

/// Starts the release queue: holds sent to it are released, each in a task of its own, until
/// every sender is gone. A release that could not be sent (no connection: a blip of the network
/// or the server) is tried again, with backoff, until the hold's lease would have run out in
/// Redis anyway, so that a short outage does not leave every hold let go meanwhile taken for
/// the rest of its lease.
pub(super) fn spawn(
    backend: Arc<Backend>,
    free: Arc<FreeNames>,
) -> mpsc::UnboundedSender<Arc<Hold>> {
    let (releases, rx) = mpsc::unbounded_channel();
    tokio::spawn(run(backend, free, rx));
    releases
}

async fn run(
    backend: Arc<Backend>,
    free: Arc<FreeNames>,
    mut jobs: mpsc::UnboundedReceiver<Arc<Hold>>,
) {
    // Dropped when the queue ends (the client and every guard are gone): releases still waiting
    // for a connection then stop.
    let (_open, closed) = tokio::sync::watch::channel(());
    while let Some(hold) = jobs.recv().await {
        let (backend, free) = (Arc::clone(&backend), Arc::clone(&free));
        let mut closed = closed.clone();
        tokio::spawn(async move {
            // Whatever the hold keeps goes once its release has run, or given up.
            let hold = LetKeptGo(hold);
            let now = Instant::now();
            let until = hold
                .expires_at()
                .clamp(after(now, RETRY_AT_LEAST), after(now, RETRY_AT_MOST));
            let mut retry = Retry::until(until);
            loop {
                match release(&backend, &free, &hold).await {
                    Ok(_) => return,
                    Err(Error::Pool(err)) if retry.fits() => {
                        tracing::debug!(lock = %hold.name, error = %err, "release waits for a connection");
                        tokio::select! {
                            () = retry.pause() => {}
                            _ = closed.changed() => return,
                        }
                    }
                    Err(Error::NotHeld { .. }) => {
                        tracing::debug!(lock = %hold.name, "nothing to release: the hold or queue place was already gone");
                        return;
                    }
                    Err(err) => {
                        tracing::warn!(lock = %hold.name, error = %err, "background release failed; the lease will run out");
                        return;
                    }
                }
            }
        });
    }
}

/// A hold in the release queue: what it keeps ([`Hold::keep`]) goes when this is dropped.
struct LetKeptGo(Arc<Hold>);

impl std::ops::Deref for LetKeptGo {
    type Target = Hold;

    fn deref(&self) -> &Hold {
        &self.0
    }
}

impl Drop for LetKeptGo {
    fn drop(&mut self) {
        self.0.let_kept_go();
    }
}

/// The pauses between the tries of something sent again after a connection failure: from
/// 20 ms, doubling up to [`RETRY_PAUSE_MAX`], while a try after the next pause still comes
/// before `until`.
pub(crate) struct Retry {
    pause: Duration,
    until: Instant,
}

impl Retry {
    pub(crate) fn until(until: Instant) -> Self {
        Self {
            pause: Duration::from_millis(20),
            until,
        }
    }

    /// Whether a try after the next pause still comes before the deadline.
    pub(crate) fn fits(&self) -> bool {
        after(Instant::now(), self.pause) < self.until
    }

    /// Waits out the next pause.
    pub(crate) async fn pause(&mut self) {
        tokio::time::sleep(self.pause).await;
        self.pause = self.pause.saturating_mul(2).min(RETRY_PAUSE_MAX);
    }
}

/// Releases one hold of `hold.owner` (or its place in a queue) with the script of its family:
/// `true` when others may want the name (a plain mutex's release woke waiters that had found it
/// busy; a queued primitive's left it held or waited for). A release that says neither leaves
/// the name among those the client saw `free`; one that does (or fails) takes it out, so the
/// next acquisition there begins with its script.
pub(crate) async fn release(backend: &Backend, free: &FreeNames, hold: &Hold) -> Result<bool> {
    crate::timeline::hop("release.sent");
    let released = send_release(backend, hold).await;
    crate::timeline::hop("release.answered");
    if hold.op.is_hold() {
        free.released(&hold.keys.lock, matches!(released, Ok(false)));
    }
    released
}

async fn send_release(backend: &Backend, hold: &Hold) -> Result<bool> {
    if let Some(quorum) = backend.as_quorum() {
        return super::quorum::release(quorum, hold).await.map(|()| false);
    }
    match hold.family {
        Family::Mutex => {
            backend
                .run(&mutex::Release {
                    name: &hold.name,
                    keys: &hold.keys,
                    owner: &hold.owner,
                    message: None,
                    expected: hold.value.as_deref(),
                })
                .await
        }
        family => {
            backend
                .run(&queue::Release {
                    name: &hold.name,
                    keys: &hold.keys,
                    family,
                    op: hold.op,
                    owner: &hold.owner,
                    fence_ttl_ms: millis(FENCE_TTL),
                    expected: hold.value.as_deref(),
                })
                .await
        }
    }
}

/// The status of a renewal that Redis made but that fewer replicas acknowledged than the
/// hold's durability wants: it does not count, and the hold keeps its old deadline.
pub(crate) const UNREPLICATED: i64 = 2;

/// The status of a renewal that nothing decided: a Redlock renewal no majority decided either
/// way (nodes did not answer in time), or one whose call failed while other calls of its batch
/// (other slots, families or durabilities) were answered. Nothing is known of that hold, and it
/// is tried again soon.
pub(crate) const UNDECIDED: i64 = 3;

/// What a renewal of several holds came to: one status per hold, and the largest shortfall of
/// replica acknowledgements among them (acknowledged, wanted), if any.
#[derive(Debug)]
pub(crate) struct Renewed {
    pub(crate) statuses: Vec<i64>,
    pub(crate) shortfall: Option<(u32, u32)>,
}

/// Renews holds, each to at least its given lease in ms: one script call per script family,
/// per group of keys the backend takes in one call (on a cluster, a hash slot) and per
/// durability, the calls in flight together. One status per item, in order: `1` renewed, `0`
/// not held any more, [`UNREPLICATED`], negative for foreign data, [`UNDECIDED`] for the items
/// of a call that failed when another was answered (a master of a cluster down, say, must not
/// cost the holds on the others their renewal); the error when every call failed. A Redlock
/// client asks every node and counts (see [`super::quorum`]); a hold no majority decided is
/// [`UNDECIDED`].
pub(crate) async fn extend(backend: &Backend, items: &[(&Hold, u64)]) -> Result<Renewed> {
    if let Some(quorum) = backend.as_quorum() {
        return Ok(Renewed {
            statuses: super::quorum::extend(quorum, items).await?,
            shortfall: None,
        });
    }
    // (is a mutex, batch group, durability) -> item indices, in first-seen order.
    type Group = (bool, u16, Option<Want>);
    let mut groups: Vec<(Group, Vec<usize>)> = Vec::new();
    for (i, (hold, _)) in items.iter().enumerate() {
        let group = (
            hold.family == Family::Mutex,
            backend.batch_group(&hold.keys.lock),
            hold.durable,
        );
        match groups.iter_mut().find(|(g, _)| *g == group) {
            Some((_, members)) => members.push(i),
            None => groups.push((group, vec![i])),
        }
    }
    let calls = groups
        .iter()
        .map(|((is_mutex, _, want), members)| async move {
            let statuses = if *is_mutex {
                let renewals: Vec<mutex::Renewal<'_>> = members
                    .iter()
                    .map(|&i| mutex::Renewal {
                        lock: &items[i].0.keys.lock,
                        owner: &items[i].0.owner,
                        ms: items[i].1,
                    })
                    .collect();
                renew(backend, &mutex::Extend { items: &renewals }, *want).await
            } else {
                let renewals: Vec<queue::Renewal<'_>> = members
                    .iter()
                    .map(|&i| {
                        let hold = items[i].0;
                        queue::Renewal {
                            keys: &hold.keys,
                            family: hold.family,
                            exclusive: hold.op.is_exclusive(),
                            owner: &hold.owner,
                            ms: items[i].1,
                        }
                    })
                    .collect();
                renew(backend, &queue::Extend { items: &renewals }, *want).await
            };
            statuses.map(|s| (members, s))
        });
    let mut out = Renewed {
        statuses: vec![UNDECIDED; items.len()],
        shortfall: None,
    };
    let mut failure = None;
    let mut answered = false;
    for result in futures_util::future::join_all(calls).await {
        match result {
            Ok((members, (statuses, shortfall))) => {
                answered = true;
                for (&i, status) in members.iter().zip(statuses) {
                    out.statuses[i] = status;
                }
                out.shortfall = out.shortfall.max(shortfall);
            }
            Err(err) => {
                failure.get_or_insert(err);
            }
        }
    }
    match failure {
        Some(err) if !answered => Err(err),
        _ => Ok(out),
    }
}

/// Runs one renewal call, durably when `want` says: the statuses, a renewal that fewer
/// replicas acknowledged than wanted counted as [`UNREPLICATED`], and that shortfall.
async fn renew<R: Request<Reply = Vec<i64>>>(
    backend: &Backend,
    request: &R,
    want: Option<Want>,
) -> Result<(Vec<i64>, Option<(u32, u32)>)> {
    let Some(want) = want else {
        return Ok((backend.run(request).await?, None));
    };
    let (mut statuses, acked, wanted) = backend.run_durable(request, want).await?;
    if acked >= wanted {
        return Ok((statuses, None));
    }
    for status in statuses.iter_mut().filter(|s| **s == 1) {
        *status = UNREPLICATED;
    }
    Ok((statuses, Some((acked, wanted))))
}
