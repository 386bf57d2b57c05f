//! One Redlock attempt: the plain mutex's acquisition asked of N independent servers at once.
//!
//! 1. The clock starts before the first send. `mutex_acquire` goes to every node, each call
//!    bounded by the node timeout and by the validity left; the attempt decides as soon as a
//!    majority granted, or as soon as so many refused or failed that no majority can.
//! 2. A grant counts only if the validity left (lease − elapsed − drift allowance) is still
//!    positive. Its fencing token is the highest counter the granting nodes issued. With
//!    [`Fencing::Quorum`], every node is offered one proposal (the highest server clock this
//!    client heard, in µs, moved on by its monotonic clock; at first, each node's own clock)
//!    and issues max(its last token + 1, the proposal), setting its counter to it with the
//!    grant; a proposal too low (a server clock behind, a name taken twice in one µs) costs
//!    the second round, never the order of tokens;
//!    when fewer than a majority issued the token itself, a second round (`mutex_confirm`)
//!    raises the counters of the others that granted, where the owner still holds the lock,
//!    and the attempt succeeds only if a majority is at the token within the validity. With
//!    [`Fencing::Clock`], each node issues max(its last token + 1, its clock in µs), and there
//!    is no second round.
//! 3. A failure gives back what it may have taken, in the background and without a wake-up
//!    message (nobody held the lock), unless every node refused: a fresh owner releases on
//!    every node (a node that has not answered yet may still grant, and runs the release after
//!    the acquisition: calls about one hold go on its connection in order), so the caller
//!    does not wait for stragglers; a carried owner, whose other holds stay, revokes its
//!    request (`mutex_revoke`, by the request id the attempt's call carried) on every node
//!    that did not refuse: the hold it added there, if any, is released, and a call still on
//!    its way changes nothing.
//!    A fresh owner's attempt uses an owner token of its own, so what one attempt left behind
//!    is never taken for the next attempt's hold.
//! 4. A split vote (some grants, no majority) answers busy for a random pause around the
//!    backoff minimum, so that contenders retry out of step; a plain busy answer waits for a
//!    release's message, or the backoff maximum at the latest (the holds it met may have been
//!    other contenders' grants, given back without a word).

use std::sync::Arc;

use tokio::time::Instant;

use super::engine::{OnCancel, late_answer};
use super::{Ask, Attempt, Engine};
use crate::backend::Quorum;
use crate::config::{Durability, FENCE_TTL, Fencing, lease_ms, millis};
use crate::error::{Error, Result};
use crate::lease::Held;
use crate::protocol::{Answer, Claim, mutex};
use crate::time::after;
use crate::token::OwnerToken;

/// One attempt on `quorum` (see the module docs).
pub(super) async fn run(engine: &Engine, quorum: &Quorum, ask: Ask) -> Result<Attempt<Held>> {
    if engine.durability != Durability::None {
        return Err(Error::Unsupported {
            what: "durability (WAIT for replicas)",
            reason: "a Redlock client's servers are independent masters",
        });
    }
    let ask = if ask.claim == Claim::New {
        Ask {
            owner: OwnerToken::new(),
            ..ask
        }
    } else {
        ask
    };
    let owner = ask.owner.as_field();
    let lease_ms = lease_ms(engine.lease)?;
    let started = Instant::now();
    let valid_until = after(started, engine.core.config.drift.validity(engine.lease));
    let node_deadline = after(started, quorum.node_timeout(engine.lease)).min(valid_until);
    let fresh = ask.claim.is_fresh();
    let request_id = (!fresh).then(|| fastrand::u128(..));
    // A re-entry keeps its hold's token: it needs no second round.
    let two_rounds = ask.claim != Claim::Again && quorum.settings().fencing == Fencing::Quorum;
    // Cancelled between the first send and the answer: whatever a fresh owner got is released
    // on every node. (A carried owner's attempt runs in a task of its own, never cancelled.)
    let cancelled = OnCancel::new(|| {
        if fresh {
            engine.abandon(ask, false);
        }
    });
    let request = mutex::Acquire {
        keys: &engine.keys,
        owner: &owner,
        lease_ms,
        fence_ttl_ms: millis(FENCE_TTL),
        claim: ask.claim,
        // One round: each server's own clock. Two: the proposal, the same to every server.
        floor: if two_rounds {
            engine.core.backend.clock().now().unwrap_or(0)
        } else {
            0
        },
        waiters: engine.core.notifier.has_waiters(&engine.keys.wake),
        tokens: 1,
        // A new id for every attempt: a Redlock grant's validity counts from the attempt's
        // start over every node, which a logged answer of an earlier send would not follow. A
        // carried owner's is kept, to undo what the attempt added if it fails.
        request: request_id,
    };
    let majority = quorum.majority();
    let refusals_allowed = quorum.len() - majority;
    let mut granted: Vec<(usize, u64)> = Vec::with_capacity(quorum.len());
    let mut waits = Vec::new();
    let mut refused = Vec::new();
    let mut failure = None;
    let mut failed = 0;
    let mut replies = quorum.each(&request, node_deadline);
    while let Some((node, reply)) = replies.next().await {
        match reply {
            Ok(Answer::Granted { fence, clock, .. }) => {
                if let Some(us) = clock {
                    engine.core.backend.clock().heard(us, Instant::now());
                }
                granted.push((node, fence));
            }
            Ok(Answer::Busy { wait, .. }) => {
                waits.push(wait);
                refused.push(node);
            }
            Err(err) => {
                failed += 1;
                failure.get_or_insert(err);
            }
        }
        // A carried owner's attempt hears every node out (within the node timeout), so that
        // a failure gives back exactly the holds it added.
        if granted.len() >= majority || (fresh && waits.len() + failed > refusals_allowed) {
            break;
        }
    }
    drop(replies);
    let mut fence = granted.iter().map(|(_, f)| *f).max().unwrap_or_default();
    let mut won = granted.len() >= majority && Instant::now() < valid_until;
    if won && two_rounds {
        // A granting node that issued the token itself set its counter to it with the grant;
        // the others are raised to it by the second round, needed only when those are not a
        // majority already.
        let behind: Vec<usize> = granted
            .iter()
            .filter(|(_, f)| *f < fence)
            .map(|(node, _)| *node)
            .collect();
        let at_token = granted.len() - behind.len();
        if at_token < majority {
            let needed = majority - at_token;
            won = confirm(quorum, &behind, needed, engine, &owner, fence, valid_until).await;
        }
    }
    cancelled.disarm();
    if won {
        if ask.claim == Claim::Again {
            // A re-entry keeps its hold's token (the caller sets it); this one is not used.
            fence = 0;
        }
        return Ok(Attempt::Acquired(
            engine.held(ask, owner, fence, started, None),
        ));
    }
    // Nodes that did not answer may grant yet: what the attempt may have added is given back
    // unless every node refused.
    if refused.len() < quorum.len() {
        let undo = match request_id {
            None => Undo::Release,
            Some(request) => Undo::Revoke {
                request,
                nodes: (0..quorum.len()).filter(|n| !refused.contains(n)).collect(),
            },
        };
        give_back(engine, &owner, undo);
    }
    if ask.claim == Claim::Again && waits.len() < majority {
        // A re-entry that no majority refused says nothing against the hold it re-enters (a
        // busy answer would mark it lost): the nodes that failed or answered late are the
        // error.
        return Err(failure.unwrap_or_else(late_answer));
    }
    if waits.is_empty()
        && let Some(err) = failure
    {
        // No node said the name is held: too few servers answered to decide, which is the
        // error (as on one server that cannot be reached), not a contender.
        return Err(err);
    }
    let config = &engine.core.config;
    if !granted.is_empty() {
        // A split vote: nobody may hold the lock, and the grants given back announce nothing.
        // Try again after a random pause, out of step with the other contenders.
        let pause = config.backoff_min.mul_f64(0.5 + fastrand::f64());
        return Ok(Attempt::Busy(Some(pause)));
    }
    // Held, as far as these nodes say: a release will say when it is free. The nodes' holds
    // may be other contenders' grants, which are given back without a word: the wait looks
    // again after the backoff maximum at the latest (`wait::acquire`), while the caller is told
    // the holder's lease (a `Retry-After`).
    let wait = waits.iter().flatten().min().copied();
    Ok(Attempt::Busy(Some(wait.unwrap_or(config.backoff_max))))
}

/// The second round: raises the counter of each of `nodes` (granting nodes that issued a
/// lower token) to `fence` where `owner` still holds the lock. True when `needed` of them
/// confirmed before `valid_until`. (Nodes that granted after the decision need no
/// confirmation: the argument rests on one majority at the token.)
#[allow(clippy::too_many_arguments)]
async fn confirm(
    quorum: &Quorum,
    nodes: &[usize],
    needed: usize,
    engine: &Engine,
    owner: &str,
    fence: u64,
    valid_until: Instant,
) -> bool {
    let request = mutex::Confirm {
        keys: &engine.keys,
        owner,
        fence,
        fence_ttl_ms: millis(FENCE_TTL),
    };
    let deadline = after(Instant::now(), quorum.node_timeout(engine.lease)).min(valid_until);
    let (mut confirmed, mut refused) = (0, 0);
    let mut replies = quorum.to(nodes, &request, deadline);
    while let Some((_, reply)) = replies.next().await {
        match reply {
            Ok(true) => confirmed += 1,
            Ok(false) | Err(_) => refused += 1,
        }
        if confirmed >= needed || refused > nodes.len().saturating_sub(needed) {
            break;
        }
    }
    confirmed >= needed && Instant::now() < valid_until
}

/// What undoes a failed attempt on its nodes.
enum Undo {
    /// A fresh owner's: release on every node (a node that has not answered yet runs the
    /// release after the acquisition; one that refused finds nothing).
    Release,
    /// A carried owner's, whose other holds must stay: on each of `nodes` (those that did not
    /// refuse), release the hold the acquisition `request` added there, if it ran and granted,
    /// and keep one still on its way from running (`mutex_revoke`).
    Revoke { request: u128, nodes: Vec<usize> },
}

/// Gives back, in the background and without a wake-up message, what a failed attempt took
/// (see [`Undo`]).
fn give_back(engine: &Engine, owner: &str, undo: Undo) {
    let backend = Arc::clone(&engine.core.backend);
    let (name, keys) = (Arc::clone(&engine.name), Arc::clone(&engine.keys));
    let owner = owner.to_owned();
    let lease = engine.lease;
    tokio::spawn(async move {
        let Some(quorum) = backend.as_quorum() else {
            return;
        };
        let deadline = after(Instant::now(), quorum.node_timeout(lease));
        let failed: Vec<(usize, Error)> = match undo {
            Undo::Release => {
                let request = mutex::Release {
                    name: &name,
                    keys: &keys,
                    owner: &owner,
                    message: Some(""),
                    expected: None,
                };
                let answers = quorum.each(&request, deadline).all().await;
                answers
                    .into_iter()
                    .filter_map(|(node, answer)| answer.err().map(|err| (node, err)))
                    .collect()
            }
            Undo::Revoke { request, nodes } => {
                let request = mutex::Revoke {
                    keys: &keys,
                    owner: &owner,
                    request,
                };
                let answers = quorum.to(&nodes, &request, deadline).all().await;
                answers
                    .into_iter()
                    .filter_map(|(node, answer)| answer.err().map(|err| (node, err)))
                    .collect()
            }
        };
        for (node, err) in failed {
            if !matches!(err, Error::NotHeld { .. }) {
                tracing::debug!(lock = %name, node, error = %err, "giving back a failed attempt's grant failed; its lease will run out");
            }
        }
    });
}
