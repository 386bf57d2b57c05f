//! Local hand-off (lock cohorting): a plain mutex's hold passes between the waiting tasks of
//! one client without a round trip, up to a bound ([`LocalHandoff`]).
//!
//! * [`Cohorts`] is the client's registry: one [`Cohort`] per name that has a task of this
//!   client taking it in Redis for the others (the leader) or holding it, and its queue of
//!   local waiters (oldest first). A name leaves the registry when it has neither.
//! * A hold taken in Redis by a leader carries a [`Baton`]: the fencing tokens reserved with it
//!   (when other tasks of the client waited, or the name's last hold had to go back to Redis
//!   for want of them: a leader alone reserves none, which saves the server a command) and when
//!   it was taken. When its guard lets go ([`Held`]'s release or drop), the hold goes
//!   to the oldest live waiter, as a new [`Held`] with the next token, the same [`Hold`] (the
//!   lease the watchdog renews, the loss signal) and the same owner in Redis. Past the bound, or
//!   once the owner token may be in use elsewhere, it is released in Redis and the oldest waiter
//!   becomes the leader ([`Turn::Lead`]).
//! * Every task counted as active (a leader, or a holder with a baton) hands its turn on, or
//!   gives it up, exactly once: a new leader, a waiter whose turn message was lost, and a
//!   waiter that saw the hold lost each lead in their turn, so waiters never wait for nobody.

use foldhash::HashMap;
use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex, MutexGuard as StdGuard, Weak};

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::{Held, Hold, Lease};
use crate::config::LocalHandoff;

type Map = StdMutex<HashMap<Arc<str>, Arc<Cohort>>>;

/// Locks `m`; every update under these locks is a push, a pop, a count or an assignment, so a
/// poisoned lock still holds a consistent value.
fn lock<T>(m: &StdMutex<T>) -> StdGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The client's names with a local leader or holder, or local waiters.
#[derive(Debug, Default)]
pub(crate) struct Cohorts(Arc<Map>);

/// What a task that asks for a name of a [`Cohort`] does next.
pub(crate) enum Entered {
    /// Take it in Redis (for itself, then for the others).
    Lead,
    /// Wait for its turn.
    Wait(oneshot::Receiver<Turn>),
}

/// A waiter's turn.
#[derive(Debug)]
pub(crate) enum Turn {
    /// The hold, passed on: the waiter holds the lock.
    Pass(Held),
    /// Take the lock in Redis. `release`: a hold let go by a dropped guard, to release in Redis
    /// first; `head_start`: the hold went back to Redis at the bound while waiters of this
    /// client remained, so if its release woke waiters elsewhere, hold back to let them in.
    Lead {
        release: Option<Lease>,
        head_start: bool,
    },
}

impl Cohorts {
    /// A task asks for `name`: it leads if nobody of this client is taking or holding it, else
    /// it queues.
    pub(crate) fn enter(&self, name: &Arc<str>, settings: LocalHandoff) -> (Arc<Cohort>, Entered) {
        let mut map = lock(&self.0);
        let cohort = Arc::clone(map.entry(Arc::clone(name)).or_insert_with(|| {
            Arc::new(Cohort {
                name: Arc::clone(name),
                settings,
                registry: Arc::downgrade(&self.0),
                state: StdMutex::default(),
            })
        }));
        let mut state = lock(&cohort.state);
        let entered = if state.active == 0 {
            state.active = 1;
            Entered::Lead
        } else {
            let (tx, rx) = oneshot::channel();
            state.queue.retain(|w| !w.is_closed());
            state.queue.push_back(tx);
            Entered::Wait(rx)
        };
        drop(state);
        drop(map);
        (cohort, entered)
    }
}

/// One name of the registry.
pub(crate) struct Cohort {
    name: Arc<str>,
    settings: LocalHandoff,
    registry: Weak<Map>,
    state: StdMutex<State>,
}

impl fmt::Debug for Cohort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cohort")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Default)]
struct State {
    /// Leaders and holders with a baton.
    active: u32,
    /// Local waiters, oldest first (some may have given up: their receiver is closed).
    queue: VecDeque<oneshot::Sender<Turn>>,
    /// The hold the latest leader took, while it is passed around.
    hold: Option<Arc<Hold>>,
    /// A hold went back to Redis with waiters left because it had no tokens reserved for
    /// passes (it was taken while nobody waited): the next leader reserves them.
    starved: bool,
}

impl State {
    /// Whether `hold` is the one local waiters wait for (not one whose turn ended when it was
    /// lost).
    fn is_current(&self, hold: &Hold) -> bool {
        self.hold
            .as_ref()
            .is_some_and(|h| std::ptr::eq(Arc::as_ptr(h), hold))
    }

    /// The oldest waiter still waiting.
    fn next_waiter(&mut self) -> Option<oneshot::Sender<Turn>> {
        while let Some(tx) = self.queue.pop_front() {
            if !tx.is_closed() {
                return Some(tx);
            }
        }
        None
    }
}

impl Cohort {
    /// A leader took `hold` in Redis: the hold local waiters now wait for, and whose loss lets
    /// the oldest of them take the lock in Redis again.
    pub(crate) fn holding(self: &Arc<Self>, hold: &Arc<Hold>) {
        let _ = hold.cohort.set(Arc::downgrade(self));
        lock(&self.state).hold = Some(Arc::clone(hold));
    }

    /// Whether a hold taken in Redis now should reserve tokens for passes: other tasks of this
    /// client wait for the name, or the last hold had to go back to Redis for want of them.
    pub(crate) fn wants_passes(&self) -> bool {
        let mut state = lock(&self.state);
        state.queue.retain(|w| !w.is_closed());
        std::mem::take(&mut state.starved) || !state.queue.is_empty()
    }

    /// How long the hold local waiters wait for has left, if one is known.
    pub(crate) fn lease_left(&self) -> Option<std::time::Duration> {
        let state = lock(&self.state);
        let hold = state.hold.as_ref()?;
        Some(hold.expires_at().saturating_duration_since(Instant::now()))
    }

    /// An active task (a leader that failed or gave up, a holder whose hold went back to
    /// Redis) ends its turn: the oldest waiter leads with `turn`, or, with none left, the task
    /// stops counting. A turn nobody takes is dropped (a hold in it is released in Redis by its
    /// lease, in the background).
    pub(crate) fn hand_on(self: &Arc<Self>, mut turn: Turn) {
        let mut state = lock(&self.state);
        loop {
            let Some(tx) = state.next_waiter() else {
                state.active = state.active.saturating_sub(1);
                if state.active == 0 {
                    state.hold = None;
                }
                drop(state);
                drop(turn);
                self.tidy();
                return;
            };
            match tx.send(turn) {
                Ok(()) => return,
                Err(back) => turn = back,
            }
        }
    }

    /// `hold` was lost (its lease ran out in Redis, or a renewal found it gone): its turn ends
    /// now, not when its guard lets go, so the oldest waiter leads, to take the lock in Redis
    /// again, while the holder that lost it finishes. Only the first report for the current
    /// hold counts.
    pub(super) fn lost(self: &Arc<Self>, hold: &Hold) {
        let mut state = lock(&self.state);
        if !state.is_current(hold) {
            return;
        }
        state.hold = None;
        drop(state);
        self.hand_on(Turn::Lead {
            release: None,
            head_start: false,
        });
    }

    /// Removes the name from the registry when nobody of this client takes, holds or waits
    /// for it.
    fn tidy(self: &Arc<Self>) {
        let Some(registry) = self.registry.upgrade() else {
            return;
        };
        let mut map = lock(&registry);
        let idle = {
            let state = lock(&self.state);
            state.active == 0 && state.queue.is_empty()
        };
        if idle && map.get(&self.name).is_some_and(|c| Arc::ptr_eq(c, self)) {
            map.remove(&self.name);
        }
    }
}

/// What a hold taken in Redis by a leader carries while it is passed around.
#[derive(Debug)]
pub(crate) struct Baton {
    cohort: Arc<Cohort>,
    /// When the hold was taken in Redis.
    since: Instant,
    /// The next fencing token to give, and the last one reserved.
    next: u64,
    last: u64,
    /// Tokens were reserved for passes when the hold was taken.
    reserved: bool,
    /// The owner token was read or re-entered: it may be in use elsewhere.
    shared: AtomicBool,
}

impl Baton {
    /// The baton of a hold taken in Redis at `since` with token `fence`, and `passes` more
    /// reserved after it.
    pub(crate) fn new(cohort: Arc<Cohort>, since: Instant, fence: u64, passes: u32) -> Self {
        Self {
            cohort,
            since,
            next: fence.saturating_add(1),
            last: fence.saturating_add(u64::from(passes)),
            reserved: passes > 0,
            shared: AtomicBool::new(false),
        }
    }

    pub(crate) fn share(&self) {
        self.shared.store(true, Ordering::Relaxed);
    }
}

/// What became of a hold whose guard let go.
pub(crate) enum LetGo {
    /// It carried no baton: release it as any hold.
    Plain,
    /// Passed to a local waiter: nothing to release.
    Passed,
    /// Release it in Redis; then the successor (if any) takes the lock in Redis for the
    /// waiters left.
    Release(Option<Successor>),
}

/// The oldest local waiter, chosen to take the lock in Redis once a hold is released there.
/// It is told its turn when [`Successor::lead`] is called, or when this is dropped unused (a
/// release whose future was dropped at its await point): either way the turn goes on, to the
/// next waiter if this one gave up meanwhile, so local waiters never wait for nobody.
pub(crate) struct Successor {
    cohort: Arc<Cohort>,
    leader: Option<oneshot::Sender<Turn>>,
}

impl Successor {
    /// Tells the successor to lead: to release `release` in Redis first, if given, and to hold
    /// back for the head start if `head_start` (this client's waiters remained when the hold
    /// went back to Redis, so waiters elsewhere get their turn).
    pub(crate) fn lead(mut self, release: Option<Lease>, head_start: bool) {
        self.send(Turn::Lead {
            release,
            head_start,
        });
    }

    fn send(&mut self, turn: Turn) {
        if let Some(leader) = self.leader.take()
            && let Err(turn) = leader.send(turn)
        {
            self.cohort.hand_on(turn);
        }
    }
}

impl Drop for Successor {
    fn drop(&mut self) {
        self.send(Turn::Lead {
            release: None,
            head_start: false,
        });
    }
}

/// The guard of `held` lets go of it: passes the hold to the oldest local waiter if the bound
/// allows, else says who leads once it is released.
pub(crate) fn let_go(held: &mut Held) -> LetGo {
    let Some(baton) = held.baton.take() else {
        return LetGo::Plain;
    };
    // The guard's turn ends here, whoever has the hold next.
    held.hold().next_turn();
    let settings = baton.cohort.settings;
    let passable = !baton.shared.load(Ordering::Relaxed)
        && baton.next <= baton.last
        && held.hold().is_live()
        && baton.since.elapsed() < settings.within();
    let cohort = Arc::clone(&baton.cohort);
    let mut state = lock(&cohort.state);
    if !state.is_current(held.hold()) {
        // Lost earlier: its turn went on then.
        return LetGo::Release(None);
    }
    if passable {
        while let Some(tx) = state.next_waiter() {
            let next = Held {
                owner: held.owner,
                fence: baton.next,
                block: baton.last,
                lease: held.lease.relay(),
                baton: Some(Baton {
                    cohort: Arc::clone(&cohort),
                    since: baton.since,
                    next: baton.next.saturating_add(1),
                    last: baton.last,
                    reserved: baton.reserved,
                    shared: AtomicBool::new(false),
                }),
                since: Some(Instant::now()),
            };
            match tx.send(Turn::Pass(next)) {
                Ok(()) => return LetGo::Passed,
                Err(Turn::Pass(mut back)) => {
                    // Gave up just now: the hold comes back, for the next one.
                    back.baton = None;
                    back.since = None;
                    held.lease = back.lease.relay();
                }
                Err(Turn::Lead { .. }) => {}
            }
        }
    }
    let leader = state.next_waiter();
    if leader.is_some() && !baton.reserved {
        state.starved = true;
    }
    if leader.is_none() {
        state.active = state.active.saturating_sub(1);
        if state.active == 0 {
            state.hold = None;
        }
    }
    drop(state);
    match leader {
        Some(leader) => LetGo::Release(Some(Successor {
            cohort,
            leader: Some(leader),
        })),
        None => {
            cohort.tidy();
            LetGo::Release(None)
        }
    }
}
