//! Releasing and renewing a Redlock client's holds: every node is asked at once, and the
//! answers are counted. A hold is renewed when a majority renewed it; it is gone when so many
//! nodes say it is not held there that no majority can; anything in between (nodes that did
//! not answer in time) is a failure the watchdog retries until the hold's validity ends.

use std::time::Duration;

use tokio::time::Instant;

use super::Hold;
use super::release::UNDECIDED;
use crate::backend::Quorum;
use crate::error::{Error, Result};
use crate::protocol::mutex;
use crate::time::after;

/// Releases one hold of `hold.owner` on every node. The release message carries one id for
/// every node, so a waiter that hears it from several wakes once. `Ok` when a node released a
/// hold, [`Error::NotHeld`] when a majority held nothing for the owner; the nodes that do not
/// answer within the node timeout are left to run out (or to run the release when they do).
/// [`Error::Pool`] only when the release reached no node (each failed for a connection), so
/// that a caller may send it again.
pub(super) async fn release(quorum: &Quorum, hold: &Hold) -> Result<()> {
    let message = format!("1@{:016x}", fastrand::u64(..));
    let request = mutex::Release {
        name: &hold.name,
        keys: &hold.keys,
        owner: &hold.owner,
        message: Some(&message),
        // Each node's lock carries the token that node issued: no one string to compare.
        expected: None,
    };
    let deadline = after(Instant::now(), quorum.node_timeout(hold.lease));
    let majority = quorum.majority();
    let (mut released, mut not_held) = (0, 0);
    let mut failure = None;
    let mut replies = quorum.each(&request, deadline);
    while let Some((_, reply)) = replies.next().await {
        match reply {
            Ok(_) => released += 1,
            Err(Error::NotHeld { .. }) => not_held += 1,
            // A node that may have run the release (it was sent, its answer did not come)
            // outranks one that never got it (`Error::Pool`): only a release that reached no
            // node may be sent again, or a re-entered hold would lose two counts for one.
            Err(err) => {
                if failure.as_ref().is_none_or(|f| matches!(f, Error::Pool(_))) {
                    failure = Some(err);
                }
            }
        }
        if released >= majority || not_held >= majority {
            break;
        }
    }
    if not_held >= majority || (released == 0 && failure.is_none()) {
        return Err(Error::NotHeld {
            name: hold.name.to_string(),
        });
    }
    match (released, failure) {
        (0, Some(err)) => Err(err),
        _ => Ok(()),
    }
}

/// Renews holds on every node, each to at least its lease in ms: one status per item, `1`
/// when a majority renewed it, `0` when a majority no longer can, a negative status when a
/// majority found foreign data, [`UNDECIDED`] when none of these (nodes did not answer in
/// time): nothing is known about that hold, and the caller tries it again. An error when no
/// hold was decided.
pub(super) async fn extend(quorum: &Quorum, items: &[(&Hold, u64)]) -> Result<Vec<i64>> {
    let renewals: Vec<mutex::Renewal<'_>> = items
        .iter()
        .map(|(hold, ms)| mutex::Renewal {
            lock: &hold.keys.lock,
            owner: &hold.owner,
            ms: *ms,
        })
        .collect();
    let longest = items
        .iter()
        .map(|(_, ms)| Duration::from_millis(*ms))
        .max()
        .unwrap_or_default();
    let request = mutex::Extend { items: &renewals };
    let deadline = after(Instant::now(), quorum.node_timeout(longest));
    let (nodes, majority) = (quorum.len(), quorum.majority());
    // Per item: nodes that renewed it, that do not hold it, that found foreign data.
    let mut votes = vec![[0usize; 3]; items.len()];
    let mut failure = None;
    let mut answered = 0;
    let mut replies = quorum.each(&request, deadline);
    while let Some((_, reply)) = replies.next().await {
        answered += 1;
        match reply {
            Ok(statuses) => {
                for (vote, status) in votes.iter_mut().zip(statuses) {
                    vote[match status {
                        1 => 0,
                        0 => 1,
                        _ => 2,
                    }] += 1;
                }
            }
            Err(err) => {
                failure.get_or_insert(err);
            }
        }
        let decided = votes
            .iter()
            .all(|v| v[0] >= majority || v[1] + v[2] > nodes - majority);
        if decided || answered == nodes {
            break;
        }
    }
    let statuses: Vec<i64> = votes
        .iter()
        .map(|v| {
            if v[0] >= majority {
                1
            } else if v[2] >= majority {
                -1
            } else if v[1] + v[2] > nodes - majority {
                0
            } else {
                UNDECIDED
            }
        })
        .collect();
    // One undecided hold says nothing of the others renewed in the same call.
    if statuses.iter().all(|s| *s == UNDECIDED) {
        return Err(failure.unwrap_or_else(|| Error::Protocol {
            script: "mutex_extend",
            detail: "no majority answered".into(),
        }));
    }
    Ok(statuses)
}
