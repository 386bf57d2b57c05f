//! The watchdog: one task per client that renews every watched hold, in batches.
//!
//! Guards register and unregister through a shared inbox rather than a channel, so taking and
//! releasing locks does not wake the task: a new hold wakes it only when it is due before the
//! moment the task already plans to look. The task keeps the holds in a map and their due times
//! in a heap; it wakes when the earliest is due, takes every renewal due within the next
//! quarter interval too, and sends them in batches of up to [`BATCH`] holds of one durability
//! per script call. Batches go out without waiting for each other's answers: a slow one (a
//! durable renewal's `WAIT`, a Redlock node that does not answer) holds up no other renewal.
//! With the default 30 s lease, 10,000 held guards cost a few script calls per second.
//!
//! A hold is lost, never to be held again, when a renewal finds the lock gone or owned by
//! another, or when its lease would have run out (measured from the moment the last successful
//! renewal was sent) without Redis answering, or, for a durable hold, without enough replicas
//! acknowledging a renewal. A hold with a fixed lease is not renewed (unless
//! a release handed it over: then once, at once, to its full lease); it is marked lost when its
//! lease runs out.

use foldhash::HashMap;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex, MutexGuard as StdGuard};
use std::time::Duration;

use futures_util::stream::FuturesUnordered;
use futures_util::{FutureExt, StreamExt};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::Hold;
use super::release::{UNDECIDED, UNREPLICATED, extend};
use crate::backend::Backend;
use crate::config::millis;
use crate::protocol::foreign;
use crate::time::{after, sleep_until};

/// The most holds one renewal script call carries.
pub(crate) const BATCH: usize = 256;

/// Commands waiting in the inbox beyond this many wake the task, so a client that takes and
/// releases many locks between renewals does not pile them up.
const INBOX_LIMIT: usize = 4096;

#[derive(Debug)]
enum Command {
    /// Watch a hold from the given due time on (counted from its registration, however late
    /// the task reads its inbox).
    Watch(Arc<Hold>, Instant),
    Forget(u64),
}

/// The state shared by the watchdog task and the guards of one client.
#[derive(Debug)]
pub(crate) struct Watchdog {
    inbox: StdMutex<Vec<Command>>,
    /// When the task next looks at its holds, in ms after `epoch`: 0 while it is awake (it
    /// reads the inbox before it sleeps again), `u64::MAX` while nothing is due.
    next_look: AtomicU64,
    wake: Notify,
    stopped: AtomicBool,
    epoch: Instant,
}

impl Watchdog {
    /// Starts the task on the current runtime. It runs until [`stop`](Self::stop).
    pub(crate) fn spawn(backend: Arc<Backend>) -> Arc<Self> {
        let dog = Arc::new(Self {
            inbox: StdMutex::new(Vec::new()),
            next_look: AtomicU64::new(u64::MAX),
            wake: Notify::new(),
            stopped: AtomicBool::new(false),
            epoch: Instant::now(),
        });
        tokio::spawn(run(Arc::clone(&dog), backend));
        dog
    }

    /// Renews `hold` from now on (or only watches its expiry, for a fixed lease).
    pub(crate) fn watch(&self, hold: Arc<Hold>) {
        let due = first_due(&hold, Instant::now());
        let due_ms = self.since_epoch(due);
        let queued = self.push(Command::Watch(hold, due));
        if due_ms < self.next_look.load(Ordering::SeqCst) || queued >= INBOX_LIMIT {
            self.wake.notify_one();
        }
    }

    /// Stops watching the hold with this id. Never wakes the task early: forgetting a hold
    /// cannot make anything due sooner.
    pub(crate) fn forget(&self, id: u64) {
        if self.push(Command::Forget(id)) >= INBOX_LIMIT {
            self.wake.notify_one();
        }
    }

    /// Ends the task (the client and every guard are gone).
    pub(crate) fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        self.wake.notify_one();
    }

    fn push(&self, command: Command) -> usize {
        let mut inbox = self.inbox();
        inbox.push(command);
        inbox.len()
    }

    fn inbox(&self) -> StdGuard<'_, Vec<Command>> {
        // Every update is one push or one take, so a poisoned lock still holds a valid list.
        self.inbox.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn since_epoch(&self, at: Instant) -> u64 {
        millis(at.saturating_duration_since(self.epoch))
    }
}

/// How often a hold is renewed: every third of the time a renewal's lease is counted on (the
/// lease less the drift allowance). Were it a third of the lease itself, an allowance of two
/// thirds or more would let the hold's deadline pass before its next renewal was due.
fn interval(hold: &Hold) -> Duration {
    hold.drift.validity(hold.lease) / 3
}

/// When the task first looks at a new hold: a third of its lease from now (or of a shorter
/// first term), at once for a handed-over hold with a fixed lease, or its expiry if it is not
/// renewed.
fn first_due(hold: &Hold, now: Instant) -> Instant {
    if hold.renew {
        let left = hold.expires_at().saturating_duration_since(now);
        after(now, interval(hold).min(left / 3))
    } else if hold.is_handed() {
        now
    } else {
        hold.expires_at()
    }
}

/// A fixed lease that a release handed over is renewed once, at once, to its full length: the
/// lease counts from the moment the waiter has the hold, and the renewal tells Redis that the
/// waiter's client is alive (an unanswered hand-over that runs out takes the client's other
/// waiters with it).
fn renewing(hold: &Hold) -> bool {
    hold.renew || hold.is_handed()
}

struct Entry {
    hold: Arc<Hold>,
    /// When the task next looks at it: its renewal, or its expiry if it is not renewed.
    due: Instant,
    renewing: bool,
    /// A renewal of it is out: it is not due again until its answer is applied.
    in_flight: bool,
}

/// The holds the task watches, by id, and their due times, earliest first. The heap may hold
/// stale items (a hold forgotten or rescheduled since): an item counts only if it matches the
/// entry's `due`.
#[derive(Default)]
struct Schedule {
    entries: HashMap<u64, Entry>,
    heap: BinaryHeap<Reverse<(Instant, u64)>>,
}

impl Schedule {
    fn set(&mut self, hold: Arc<Hold>, due: Instant, renewing: bool) {
        self.heap.push(Reverse((due, hold.id)));
        self.entries.insert(
            hold.id,
            Entry {
                hold,
                due,
                renewing,
                in_flight: false,
            },
        );
    }

    fn reschedule(&mut self, id: u64, due: Instant, renewing: bool) {
        if let Some(e) = self.entries.get_mut(&id) {
            e.due = due;
            e.renewing = renewing;
            e.in_flight = false;
            self.heap.push(Reverse((due, id)));
        }
    }

    /// The earliest live item (not in flight), dropping stale ones on the way.
    fn peek(&mut self) -> Option<(Instant, u64)> {
        while let Some(&Reverse((due, id))) = self.heap.peek() {
            if self
                .entries
                .get(&id)
                .is_some_and(|e| e.due == due && !e.in_flight)
            {
                return Some((due, id));
            }
            self.heap.pop();
        }
        None
    }

    /// Rebuilds the heap when stale items outnumber live ones.
    fn compact(&mut self) {
        if self.heap.len() > 2 * self.entries.len() + 1024 {
            self.heap = self
                .entries
                .iter()
                .filter(|(_, e)| !e.in_flight)
                .map(|(id, e)| Reverse((e.due, *id)))
                .collect();
        }
    }
}

async fn run(dog: Arc<Watchdog>, backend: Arc<Backend>) {
    let mut schedule = Schedule::default();
    // Renewals out, each applied as its answer comes: a slow one (a durable renewal's `WAIT`,
    // a Redlock node that does not answer) never holds up the others, nor the next due ones.
    let mut in_flight = FuturesUnordered::new();
    loop {
        // The batches out are driven here too, not only while the task waits below: a task
        // kept busy by its inbox must not hold them back.
        settle(&mut in_flight, &mut schedule);
        dog.next_look.store(0, Ordering::SeqCst);
        if dog.stopped.load(Ordering::SeqCst) {
            return;
        }
        let commands = std::mem::take(&mut *dog.inbox());
        for command in commands {
            match command {
                // A hold let go before the task saw it never enters the schedule (most short
                // holds: their guard sends no word then).
                Command::Watch(hold, _) if hold.is_ended() => {}
                Command::Watch(hold, due) => {
                    let renewing = renewing(&hold);
                    let id = hold.id;
                    let watched = Arc::clone(&hold);
                    schedule.set(hold, due, renewing);
                    watched.watched.store(true, Ordering::SeqCst);
                    if watched.is_ended() {
                        schedule.entries.remove(&id);
                    }
                }
                Command::Forget(id) => {
                    schedule.entries.remove(&id);
                }
            }
        }
        for chunk in take_due(&mut schedule) {
            in_flight.push(renew(&backend, chunk));
        }
        // Sent now (their first poll), not when the task next waits.
        settle(&mut in_flight, &mut schedule);
        schedule.compact();
        let next = schedule.peek().map(|(due, _)| due);
        dog.next_look.store(
            next.map_or(u64::MAX, |d| dog.since_epoch(d)),
            Ordering::SeqCst,
        );
        // Anything pushed after the inbox was read, while `next_look` said "awake", did not
        // wake us: look again before sleeping.
        if !dog.inbox().is_empty() {
            continue;
        }
        tokio::select! {
            _ = dog.wake.notified() => {}
            _ = sleep_until(next) => {}
            Some((chunk, sent_at, outcome)) = in_flight.next(), if !in_flight.is_empty() => {
                apply(&mut schedule, &chunk, sent_at, outcome);
            }
        }
    }
}

/// Takes every hold due now, or due within a quarter of its interval (marking it in flight),
/// and returns them in batches of one durability each (the backend waits for a batch's
/// slowest group); marks lost the ones whose lease ran out first.
fn take_due(schedule: &mut Schedule) -> Vec<Vec<Arc<Hold>>> {
    let now = Instant::now();
    let mut due: Vec<Arc<Hold>> = Vec::new();
    while let Some((at, id)) = schedule.peek() {
        let Some(e) = schedule.entries.get_mut(&id) else {
            break;
        };
        let slack = if e.renewing {
            interval(&e.hold) / 4
        } else {
            Duration::ZERO
        };
        if at > after(now, slack) {
            break;
        }
        schedule.heap.pop();
        let hold = Arc::clone(&e.hold);
        if hold.is_lost() {
            schedule.entries.remove(&id);
        } else if now >= hold.expires_at() {
            tracing::warn!(lock = %hold.name, "lease ran out before it could be renewed");
            hold.mark_lapsed();
            schedule.entries.remove(&id);
        } else if e.renewing {
            e.in_flight = true;
            due.push(hold);
        } else {
            // A fixed lease that was extended by hand: watch its new expiry.
            schedule.reschedule(id, hold.expires_at(), false);
        }
    }
    let mut chunks: Vec<Vec<Arc<Hold>>> = Vec::new();
    for hold in due {
        match chunks
            .iter_mut()
            .find(|chunk| chunk.len() < BATCH && chunk[0].durable == hold.durable)
        {
            Some(chunk) => chunk.push(hold),
            None => chunks.push(vec![hold]),
        }
    }
    chunks
}

/// Drives the batches out once, and applies the answers that have come.
fn settle<F>(in_flight: &mut FuturesUnordered<F>, schedule: &mut Schedule)
where
    F: std::future::Future<Output = (Vec<Arc<Hold>>, Instant, Outcome)>,
{
    while let Some(Some((chunk, sent_at, outcome))) = in_flight.next().now_or_never() {
        apply(schedule, &chunk, sent_at, outcome);
    }
}

/// What became of one batch's renewal: one status per hold, or why there is none.
type Outcome = std::result::Result<Vec<i64>, String>;

/// Renews one batch, within the time the earliest of its leases has left.
async fn renew(backend: &Backend, chunk: Vec<Arc<Hold>>) -> (Vec<Arc<Hold>>, Instant, Outcome) {
    let sent_at = Instant::now();
    let limit = chunk
        .iter()
        .map(|h| h.expires_at())
        .min()
        .unwrap_or(sent_at)
        .saturating_duration_since(sent_at)
        .max(Duration::from_millis(1));
    let items: Vec<(&Hold, u64)> = chunk.iter().map(|h| (&**h, millis(h.lease))).collect();
    let outcome = match tokio::time::timeout(limit, extend(backend, &items)).await {
        Ok(Ok(renewed)) => Ok(renewed.statuses),
        Ok(Err(err)) => Err(format!("{err:#}")),
        Err(_) => Err("no answer before the lease runs out".to_owned()),
    };
    crate::meter::renewed(chunk.iter().map(|h| h.family.label()), sent_at.elapsed());
    (chunk, sent_at, outcome)
}

/// Reschedules a renewed batch, marks lost what is gone, and retries a failed batch soon.
fn apply(schedule: &mut Schedule, chunk: &[Arc<Hold>], sent_at: Instant, outcome: Outcome) {
    let why = match outcome {
        Ok(results) => {
            let (mut unreplicated, mut undecided) = (Vec::new(), Vec::new());
            for (hold, status) in chunk.iter().zip(results) {
                if status == UNREPLICATED {
                    unreplicated.push(Arc::clone(hold));
                    continue;
                }
                if status == UNDECIDED {
                    undecided.push(Arc::clone(hold));
                    continue;
                }
                if status < 0 {
                    let err = foreign(&hold.keys.lock, status, hold.family.layout());
                    tracing::warn!(lock = %hold.name, error = %err, "lease renewal refused");
                }
                if status == 1 {
                    hold.confirm(sent_at, hold.lease);
                    let (due, renewing) = if hold.renew {
                        (after(sent_at, interval(hold)), true)
                    } else {
                        (hold.expires_at(), false)
                    };
                    schedule.reschedule(hold.id, due, renewing);
                } else {
                    tracing::warn!(lock = %hold.name, "lease lost: the lock is gone or held by another owner");
                    hold.mark_lost();
                    schedule.entries.remove(&hold.id);
                }
            }
            if !unreplicated.is_empty() {
                tracing::warn!(
                    holds = unreplicated.len(),
                    "lease renewal not acknowledged by enough replicas: the hold is at risk, \
                     lost at its deadline unless a later renewal is acknowledged"
                );
                retry_soon(schedule, &unreplicated);
            }
            if !undecided.is_empty() {
                tracing::debug!(
                    holds = undecided.len(),
                    "lease renewal undecided (no majority of nodes, or its call failed), retrying"
                );
                retry_soon(schedule, &undecided);
            }
            return;
        }
        Err(why) => why,
    };
    tracing::debug!(holds = chunk.len(), why, "lease renewal failed, retrying");
    retry_soon(schedule, chunk);
}

/// Renews `chunk` again soon, and never later than each hold's deadline: a hold that cannot be
/// renewed is lost the moment its lease runs out, before Redis lets it go.
fn retry_soon(schedule: &mut Schedule, chunk: &[Arc<Hold>]) {
    let now = Instant::now();
    for hold in chunk {
        let retry = (interval(hold) / 4).clamp(Duration::from_millis(5), Duration::from_secs(1));
        let due = after(now, retry).min(hold.expires_at());
        schedule.reschedule(hold.id, due, true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::LockKeys;
    use crate::protocol::{Family, Op};

    fn hold(lease_ms: u64) -> Arc<Hold> {
        let keys = LockKeys::new("p", "n").unwrap();
        Arc::new(Hold::new(
            Family::Mutex,
            Op::Exclusive,
            "n".into(),
            Arc::new(keys),
            "owner".into(),
            Duration::from_millis(lease_ms),
            true,
            crate::config::Drift::default(),
            Instant::now(),
        ))
    }

    #[tokio::test]
    async fn the_schedule_skips_forgotten_and_rescheduled_holds() {
        let now = Instant::now();
        let mut s = Schedule::default();
        let (a, b, c) = (hold(300), hold(300), hold(300));
        s.set(Arc::clone(&a), now + Duration::from_millis(10), true);
        s.set(Arc::clone(&b), now + Duration::from_millis(20), true);
        s.set(Arc::clone(&c), now + Duration::from_millis(30), true);
        assert_eq!(s.peek(), Some((now + Duration::from_millis(10), a.id)));
        // Forgotten: its heap item is stale.
        s.entries.remove(&a.id);
        assert_eq!(s.peek(), Some((now + Duration::from_millis(20), b.id)));
        // Moved later: the old item is stale, the new one counts.
        s.reschedule(b.id, now + Duration::from_millis(40), true);
        assert_eq!(s.peek(), Some((now + Duration::from_millis(30), c.id)));
        s.entries.remove(&c.id);
        assert_eq!(s.peek(), Some((now + Duration::from_millis(40), b.id)));
        s.entries.remove(&b.id);
        assert_eq!(s.peek(), None);
        assert!(s.heap.is_empty());
    }

    #[tokio::test]
    async fn compacting_keeps_exactly_the_live_items() {
        let now = Instant::now();
        let mut s = Schedule::default();
        let live = hold(300);
        s.set(Arc::clone(&live), now + Duration::from_millis(5), true);
        for i in 0..3000u64 {
            let h = hold(300);
            s.set(Arc::clone(&h), now + Duration::from_millis(i), true);
            s.entries.remove(&h.id);
        }
        s.compact();
        assert_eq!(s.heap.len(), 1);
        assert_eq!(s.peek(), Some((now + Duration::from_millis(5), live.id)));
    }

    #[tokio::test]
    async fn a_new_hold_wakes_the_task_only_if_due_before_its_next_look() {
        let dog = Watchdog {
            inbox: StdMutex::new(Vec::new()),
            next_look: AtomicU64::new(u64::MAX),
            wake: Notify::new(),
            stopped: AtomicBool::new(false),
            epoch: Instant::now(),
        };
        let woken = || {
            let notified = dog.wake.notified();
            tokio::pin!(notified);
            notified.as_mut().enable()
        };
        dog.watch(hold(30_000));
        assert!(woken(), "a sleeping task with nothing due is woken");
        // The task plans to look in 1 s: a hold due in 10 s does not wake it, one due sooner does.
        dog.next_look.store(1_000, Ordering::SeqCst);
        dog.watch(hold(30_000));
        dog.forget(1);
        assert!(!woken());
        dog.watch(hold(300));
        assert!(woken());
        assert_eq!(dog.inbox().len(), 4);
    }
}
