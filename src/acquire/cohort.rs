//! Local hand-off, the waiting side: a plain mutex's acquisition in a client that passes holds
//! between its tasks ([`crate::lease::cohort`]) queues behind the task that takes or holds the
//! name for this client, and takes the lock in Redis itself when its turn says so.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::{Ask, Engine};
use crate::error::{Error, Result};
use crate::lease::cohort::{Baton, Cohort, Entered, Turn};
use crate::lease::{Held, Lease, release};
use crate::time::{after, sleep_until};

/// Acquires `ask` (a new owner of a plain mutex) up to `timeout`: passed a hold by another task
/// of this client, or taking the lock in Redis in its turn.
pub(super) async fn acquire(engine: &Engine, ask: Ask, timeout: Option<Duration>) -> Result<Held> {
    let deadline = timeout.map(|t| after(Instant::now(), t));
    let settings = engine.core.config.handoff;
    let (cohort, entered) = engine.core.cohorts.enter(&engine.name, settings);
    let waited = matches!(entered, Entered::Wait(_));
    let (release, head_start) = match entered {
        Entered::Lead => (None, false),
        Entered::Wait(turn) => {
            // Waits behind this client's leader: counted while it does.
            let waiting = crate::meter::Waiting::new(engine.family.label());
            let mut place = Place {
                turn,
                cohort: Arc::clone(&cohort),
            };
            let turn = tokio::select! {
                // A turn lost on its way (its sender dropped unsent) is the turn to lead.
                turn = &mut place.turn => turn.unwrap_or(Turn::Lead { release: None, head_start: false }),
                () = sleep_until(deadline) => {
                    // A hold passed just as the deadline came is taken; a turn to lead goes
                    // on to the next waiter at once.
                    if let Some(held) = place.passed() {
                        crate::meter::handed_over(engine.family.label(), true);
                        return Ok(held);
                    }
                    return Err(Error::Timeout {
                        waited: timeout.unwrap_or_default(),
                        lease_left: cohort.lease_left(),
                    });
                }
            };
            drop(waiting);
            match turn {
                Turn::Pass(held) => {
                    crate::meter::handed_over(engine.family.label(), true);
                    return Ok(held);
                }
                Turn::Lead {
                    release,
                    head_start,
                } => (release, head_start),
            }
        }
    };
    let leading = Leading(Some(Arc::clone(&cohort)));
    let woke_others = match release {
        Some(lease) => released(engine, lease).await,
        None => true,
    };
    if head_start && woke_others {
        let until = after(Instant::now(), settings.head_start());
        sleep_until(Some(deadline.map_or(until, |d| d.min(until)))).await;
    }
    let remaining = deadline.map(|d| d.saturating_duration_since(Instant::now()));
    // Tokens for the passes, reserved with the hold, when other tasks of this client wait for
    // the name (or the last hold went back to Redis for want of them); a leader alone takes
    // one (the block costs the server a command), and its hold goes back to Redis if a waiter
    // comes meanwhile.
    let passes = if cohort.wants_passes() {
        settings.passes()
    } else {
        0
    };
    let ask = Ask {
        tokens: passes.saturating_add(1),
        ..ask
    };
    let mut held = engine.acquire_in_redis(ask, remaining, waited).await?;
    leading.done();
    cohort.holding(held.hold());
    // The block Redis gave may be shorter than asked (`mutex::BLOCK_SPAN`).
    let reserved = held.block.saturating_sub(held.fence);
    let passes = passes.min(u32::try_from(reserved).unwrap_or(u32::MAX));
    held.baton = Some(Baton::new(cohort, Instant::now(), held.fence, passes));
    Ok(held)
}

/// Releases the hold a dropped guard let go, for the new leader: whether that woke waiters
/// elsewhere. The release runs in a task of its own, which ends the lease once it is answered:
/// a leader cancelled while it is on its way leaves it to finish, rather than drop the lease
/// still armed, which would release the hold a second time (one hold of an owner with others,
/// when the hold had been re-entered).
async fn released(engine: &Engine, lease: Lease) -> bool {
    let tasks = engine.core.tasks.clone();
    let release = tokio::spawn(async move {
        let told = release::release(tasks.backend(), tasks.free(), lease.hold()).await;
        lease.disarm();
        told
    });
    match release.await {
        Ok(Ok(told)) => told,
        Ok(Err(err)) => {
            tracing::debug!(lock = %engine.name, error = %err, "releasing a hold let go failed; its lease will run out");
            false
        }
        Err(_) => false,
    }
}

/// A local waiter's place in its cohort's queue (a hold passed to it is counted as handed over
/// when it is taken from here, not when it is sent). A turn sent to it as it gives up (its deadline
/// came, or its future was dropped) is not lost with it: a passed hold is let go again (to the
/// next waiter, or released in Redis), and a turn to lead goes to the next waiter. Without
/// this, a turn to lead dropped unread left every other waiter of the client waiting for a
/// leader that never came.
struct Place {
    turn: oneshot::Receiver<Turn>,
    cohort: Arc<Cohort>,
}

impl Place {
    /// The hold passed to this waiter, if one has just come; a turn to lead that came instead
    /// goes on to the next waiter.
    fn passed(&mut self) -> Option<Held> {
        self.turn.close();
        match self.turn.try_recv() {
            Ok(Turn::Pass(held)) => Some(held),
            Ok(lead) => {
                self.cohort.hand_on(lead);
                None
            }
            Err(_) => None,
        }
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        // A passed hold dropped here is let go as any: to the next waiter, or to Redis. No
        // guard had it: it is not counted in the hold time.
        if let Some(mut held) = self.passed() {
            held.since = None;
        }
    }
}

/// A leader that has not taken the lock: if it fails or is cancelled, the next local waiter
/// leads.
struct Leading(Option<Arc<Cohort>>);

impl Leading {
    fn done(mut self) {
        self.0 = None;
    }
}

impl Drop for Leading {
    fn drop(&mut self) {
        if let Some(cohort) = self.0.take() {
            cohort.hand_on(Turn::Lead {
                release: None,
                head_start: false,
            });
        }
    }
}
