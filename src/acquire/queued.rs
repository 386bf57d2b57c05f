//! What the queued primitives (fair mutex, semaphore, read-write lock) add to an attempt: a
//! waiter's place in the queue in Redis, and holds that a release hands to a waiter.
//!
//! A waiter's place is a [`Lease`] of its own, named by its queue member: nothing renews it (a
//! place has no deadline), and dropping it (the wait ended, timed out or was cancelled) removes
//! the place in the background. A dead waiter is passed over when the hold handed to it runs out
//! unrenewed (its first term is the waiter timeout), and with it every other waiter of its
//! client.

use std::sync::{Arc, Mutex as StdMutex, MutexGuard as StdGuard};

use tokio::sync::OwnedMutexGuard;
use tokio::time::Instant;

use super::{Ask, Attempt, Engine};
use crate::config::{FENCE_TTL, MAX_LEASE, lease_ms, millis};
use crate::error::Result;
use crate::lease::{Held, Hold, Lease};
use crate::protocol::take::Fence;
use crate::protocol::wake::Grant;
use crate::protocol::{Answer, Op, queue};
use crate::time::after;
use crate::token::OwnerToken;

/// A waiter's place in the queue while it has one. Shared by the wait loop and its attempts (a
/// carried owner's run in a task of their own, which may queue it after the wait is gone), so
/// it is left only when the last of them is done with it.
#[derive(Default)]
pub(super) struct Place {
    lease: StdMutex<Option<Lease>>,
    /// A carried owner's turn in this client, once its wait is over: kept, when the place is
    /// dropped, until the place's release has run, so that the owner's next wait in this client
    /// (the same queue member) never queues, or is handed a hold, before that release.
    turn: StdMutex<Option<OwnedMutexGuard<()>>>,
}

impl Place {
    /// Keeps `turn` until the place, if it has one by the time every attempt is done, has left
    /// the queue.
    pub(super) fn keep_turn(&self, turn: OwnedMutexGuard<()>) {
        *self.turn.lock().unwrap_or_else(|p| p.into_inner()) = Some(turn);
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let turn = self
            .turn
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let lease = take(self).take();
        if let (Some(lease), Some(turn)) = (&lease, turn) {
            lease.hold().keep(Box::new(turn));
        }
    }
}

pub(super) fn take(place: &Place) -> StdGuard<'_, Option<Lease>> {
    // Every update is one assignment, so a poisoned lock still holds a consistent value.
    place.lease.lock().unwrap_or_else(|p| p.into_inner())
}

/// The lease of a waiter's place in the queue: nothing to renew (a place has no deadline), and
/// dropping it leaves the queue in the background. Its owner is the waiter's queue member, as
/// `queue_acquire` writes it.
pub(super) fn place(engine: &Engine, op: Op, units: u32, owner: &OwnerToken, fresh: bool) -> Lease {
    let core = &engine.core;
    let member = queue::member(
        &core.id,
        &owner.as_field(),
        op,
        units,
        millis(engine.lease),
        millis(core.config.waiter_timeout()),
    );
    let hold = Hold::new(
        engine.family,
        Op::Waiting { fresh },
        Arc::clone(&engine.name),
        Arc::clone(&engine.keys),
        member,
        MAX_LEASE,
        false,
        core.config.drift,
        Instant::now(),
    );
    Lease::new(hold, core.tasks.clone())
}

/// One attempt of a queued primitive. With a `place`, a busy attempt queues the owner (or keeps
/// its place), and a granted one takes the place out of the queue (Redis removed it).
pub(super) async fn run(
    engine: &Engine,
    ask: Ask,
    place: Option<Arc<Place>>,
) -> Result<Attempt<Held>> {
    let core = &engine.core;
    let owner = ask.owner.as_field();
    // An idle name this client last saw free: one round trip of plain commands, which leaves
    // the hold in the thin form (`queue_lib.lua`) when it is granted.
    if let Some(token) = engine.proposal(ask, core.backend.clock().now()) {
        let value = queue::thin(
            engine.family,
            ask.op,
            ask.units,
            engine.capacity,
            token,
            &owner,
        );
        let fence = if ask.op == Op::Read {
            Fence::Read
        } else {
            Fence::Token { token, last: token }
        };
        if let Some(taken) = engine.take(ask, &owner, value, true, fence).await {
            return taken;
        }
    }
    let request = queue::Acquire {
        name: &engine.name,
        keys: &engine.keys,
        family: engine.family,
        op: ask.op,
        owner: &owner,
        units: ask.units,
        capacity: engine.capacity,
        lease_ms: lease_ms(engine.lease)?,
        grace_ms: if place.is_some() {
            millis(core.config.waiter_timeout())
        } else {
            0
        },
        fence_ttl_ms: millis(FENCE_TTL),
        claim: ask.claim,
        client: &core.id,
        request: ask.request_id(),
    };
    let sent_at = Instant::now();
    let (answer, acks) = engine.send_noted(&request, ask, sent_at, false).await?;
    let Some(sent_at) = engine.counted_from(ask, &owner, &answer, sent_at).await? else {
        return Ok(Attempt::Busy(None));
    };
    match answer {
        Answer::Granted { fence, .. } => {
            if let Some(lease) = place.as_deref().and_then(|p| take(p).take()) {
                // Redis removed the place when it granted the hold.
                lease.disarm();
            }
            let held = engine.held(ask, owner, fence, sent_at, None);
            Ok(Attempt::Acquired(Engine::replicated(held, acks)?))
        }
        Answer::Busy { wait, ticket, .. } => {
            let (Some(place), Some(ticket)) = (place.as_deref(), ticket) else {
                return Ok(Attempt::Busy(wait));
            };
            {
                let mut slot = take(place);
                if slot.is_none() {
                    *slot = Some(self::place(
                        engine,
                        ask.op,
                        ask.units,
                        &ask.owner,
                        ask.claim.is_fresh(),
                    ));
                }
            }
            Ok(Attempt::Queued { wait, ticket })
        }
    }
}

/// The hold a release handed to this waiter, for a first term (its lease, or the waiter
/// timeout if that is shorter): the watchdog renews it before that runs out, to the full lease
/// (a fixed lease once, at once). The term started when the release ran, which was after
/// `granted_after` (the waiter's last attempt that found it still waiting): the local estimate
/// of its end counts from there, however late the message came.
pub(super) fn handed(engine: &Engine, ask: Ask, grant: Grant, granted_after: Instant) -> Held {
    let hold = engine
        .hold(ask.op, ask.owner.as_field(), engine.lease, granted_after)
        .owned(ask.claim.is_fresh());
    hold.handed_until(after(
        granted_after,
        engine.core.config.drift.validity(grant.term),
    ));
    crate::meter::handed_over(engine.family.label(), false);
    Held {
        owner: ask.owner,
        fence: grant.fence,
        block: grant.fence,
        lease: Lease::new(hold, engine.core.tasks.clone()),
        baton: None,
        since: Some(Instant::now()),
    }
}
