//! Releasing and renewing holds through the protocol's operations, and the release queue that
//! releases the holds of dropped guards in the background.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use super::Hold;
use crate::backend::Backend;
use crate::config::{FENCE_TTL, millis};
use crate::error::{Error, Result};
use crate::protocol::{Family, mutex, queue};

/// Starts the release queue: holds sent to it are released, each in a task of its own (a
/// pool out of connections is waited for a little), until every sender is gone.
pub(super) fn spawn(backend: Arc<Backend>) -> mpsc::UnboundedSender<Arc<Hold>> {
    let (releases, rx) = mpsc::unbounded_channel();
    tokio::spawn(run(backend, rx));
    releases
}

async fn run(backend: Arc<Backend>, mut jobs: mpsc::UnboundedReceiver<Arc<Hold>>) {
    while let Some(hold) = jobs.recv().await {
        let backend = Arc::clone(&backend);
        tokio::spawn(async move {
            for attempt in 0..3u32 {
                match release(&backend, &hold).await {
                    Ok(()) => return,
                    Err(Error::Pool(err)) => {
                        tracing::debug!(lock = %hold.name, attempt, error = %err, "release waits for a connection");
                        tokio::time::sleep(Duration::from_millis(20 << attempt)).await;
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

/// Releases one hold of `hold.owner` (or its place in a queue) with the script of its family.
pub(crate) async fn release(backend: &Backend, hold: &Hold) -> Result<()> {
    if let Some(quorum) = backend.as_quorum() {
        return super::quorum::release(quorum, hold).await;
    }
    match hold.family {
        Family::Mutex => {
            backend
                .run(&mutex::Release {
                    name: &hold.name,
                    keys: &hold.keys,
                    owner: &hold.owner,
                    message: None,
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
                })
                .await
        }
    }
}

/// Renews holds, each to at least its given lease in ms: one script call per script family and
/// per group of keys the backend takes in one call (on a cluster, a hash slot), the calls in
/// flight together. One status per item, in order: `1` renewed, `0` not held any more,
/// negative for foreign data. A Redlock client asks every node and counts (see [`super::quorum`]).
pub(crate) async fn extend(backend: &Backend, items: &[(&Hold, u64)]) -> Result<Vec<i64>> {
    if let Some(quorum) = backend.as_quorum() {
        return super::quorum::extend(quorum, items).await;
    }
    // (is a mutex, batch group) -> item indices, in first-seen order.
    let mut groups: Vec<((bool, u16), Vec<usize>)> = Vec::new();
    for (i, (hold, _)) in items.iter().enumerate() {
        let group = (
            hold.family == Family::Mutex,
            backend.batch_group(&hold.keys.lock),
        );
        match groups.iter_mut().find(|(g, _)| *g == group) {
            Some((_, members)) => members.push(i),
            None => groups.push((group, vec![i])),
        }
    }
    let calls = groups.iter().map(|((is_mutex, _), members)| async move {
        let statuses = if *is_mutex {
            let renewals: Vec<mutex::Renewal<'_>> = members
                .iter()
                .map(|&i| mutex::Renewal {
                    lock: &items[i].0.keys.lock,
                    owner: &items[i].0.owner,
                    ms: items[i].1,
                })
                .collect();
            backend.run(&mutex::Extend { items: &renewals }).await
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
            backend.run(&queue::Extend { items: &renewals }).await
        };
        statuses.map(|s| (members, s))
    });
    let mut out = vec![0; items.len()];
    for result in futures_util::future::join_all(calls).await {
        let (members, statuses) = result?;
        for (&i, status) in members.iter().zip(statuses) {
            out[i] = status;
        }
    }
    Ok(out)
}
