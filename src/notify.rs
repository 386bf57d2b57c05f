//! Push wake-up: one subscription connection per server, shared by every waiter of a client.
//!
//! Each lock has a channel (`<prefix>:{<name>}:wake`); a release publishes to it. The client
//! subscribes to a channel while it has local waiters for that lock (and for a short linger
//! after, so a busy lock does not churn SUBSCRIBE/UNSUBSCRIBE), and keeps a FIFO queue of its
//! local waiters per channel. A message wakes only as many local waiters as it names (one for a
//! mutex), oldest first, so a release never sets off a herd of retries inside a process.
//!
//! Waiters of the queued primitives (fair mutex, semaphore, read-write lock) queue in Redis
//! instead, and join with their id as a tag: a release there publishes the ids of the waiters it
//! lets through, and only those are woken, in whichever client they wait.
//!
//! Only the oldest local waiter (the front) keeps a fallback timer, set to the moment the
//! holder's lease would run out; the others wait for their turn. If the subscription connection
//! drops, every waiter falls back to jittered backoff polling until it is back, and all are
//! woken once it is, since a release may have been missed in between.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex, MutexGuard as StdGuard};
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::{Notify, mpsc, watch};
use tokio::time::Instant;

/// No hand-over recorded in a slot.
const NO_GRANT: u64 = u64::MAX;

/// How long a channel stays subscribed after its last local waiter left.
const LINGER: Duration = Duration::from_secs(2);
/// How often idle channels are looked for.
const SWEEP_EVERY: Duration = Duration::from_millis(500);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SubState {
    /// SUBSCRIBE sent, not confirmed yet.
    Pending,
    /// Confirmed: releases reach this client.
    Active,
    /// The subscription connection is down: waiters poll.
    Down,
}

#[derive(Debug)]
struct Slot {
    notify: Notify,
    /// A wake-up was delivered to this waiter and not consumed yet.
    pending: AtomicBool,
    /// The waiter's id in a Redis queue: it is woken by name only (and by a reconnect).
    tag: Option<Box<str>>,
    /// The fencing token of a hold that a release handed to this waiter ([`NO_GRANT`]: none)
    /// and the first term of its lease in ms.
    grant: AtomicU64,
    term_ms: AtomicU64,
}

impl Default for Slot {
    fn default() -> Self {
        Self {
            notify: Notify::new(),
            pending: AtomicBool::new(false),
            tag: None,
            grant: AtomicU64::new(NO_GRANT),
            term_ms: AtomicU64::new(0),
        }
    }
}

impl Slot {
    fn give(&self) -> bool {
        let fresh = !self.pending.swap(true, Ordering::AcqRel);
        if fresh {
            self.notify.notify_one();
        }
        fresh
    }
}

#[derive(Debug, Default)]
struct Queue {
    slots: VecDeque<Arc<Slot>>,
    /// When the current holder's lease runs out, as last seen by a local waiter.
    holder_deadline: Option<Instant>,
    /// Since when the queue has been empty.
    idle_since: Option<Instant>,
}

impl Queue {
    /// Gives a wake-up to the first `n` waiters that do not have one pending.
    fn wake(&mut self, mut n: usize) {
        for slot in &self.slots {
            if n == 0 {
                break;
            }
            if slot.give() {
                n -= 1;
            }
        }
    }

    fn wake_all(&mut self) {
        self.wake(usize::MAX);
    }

    /// Wakes the waiters named in `ids`: space-separated ids, each with `:<fence>:<ms>` when
    /// the release handed it a hold with that fencing token, for that first term.
    fn wake_named(&mut self, ids: &str) {
        for part in ids.split(' ') {
            let mut fields = part.split(':');
            let id = fields.next().unwrap_or_default();
            let grant = match (fields.next(), fields.next()) {
                (Some(fence), Some(ms)) => fence.parse::<u64>().ok().zip(ms.parse::<u64>().ok()),
                _ => None,
            };
            for slot in self.slots.iter().filter(|s| s.tag.as_deref() == Some(id)) {
                if let Some((fence, ms)) = grant {
                    slot.term_ms.store(ms, Ordering::Release);
                    slot.grant.store(fence, Ordering::Release);
                }
                slot.give();
            }
        }
    }
}

#[derive(Debug)]
struct Channel {
    queue: StdMutex<Queue>,
    state: watch::Sender<SubState>,
}

impl Channel {
    fn queue(&self) -> StdGuard<'_, Queue> {
        // A panic while holding this lock cannot leave the queue inconsistent (every update is
        // a single push, remove or flag), so a poisoned lock is used as is.
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[derive(Debug)]
struct Shared {
    channels: StdMutex<HashMap<String, Arc<Channel>>>,
    commands: mpsc::UnboundedSender<String>,
    connected: AtomicBool,
}

impl Shared {
    fn channels(&self) -> StdGuard<'_, HashMap<String, Arc<Channel>>> {
        self.channels.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sets the state of the `names` channels (all, if `None`) and wakes all their waiters.
    fn set(&self, names: Option<&[String]>, state: SubState) {
        let channels = self.channels();
        let chosen: Vec<&Arc<Channel>> = match names {
            Some(names) => names.iter().filter_map(|n| channels.get(n)).collect(),
            None => channels.values().collect(),
        };
        for channel in chosen {
            channel.state.send_replace(state);
            channel.queue().wake_all();
        }
    }
}

/// The wake-up side of one server: the channel registry and its subscription task.
#[derive(Debug, Clone)]
pub(crate) struct Notifier {
    shared: Arc<Shared>,
}

impl Notifier {
    /// Starts the subscription task on the current runtime. It stops when `shutdown`'s sender
    /// is dropped.
    pub(crate) fn spawn(client: redis::Client, shutdown: watch::Receiver<()>) -> Self {
        let (commands, rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            channels: StdMutex::new(HashMap::new()),
            commands,
            connected: AtomicBool::new(false),
        });
        tokio::spawn(run(client, Arc::clone(&shared), rx, shutdown));
        Self { shared }
    }

    /// True if this client already has waiters queued on `channel`: a new arrival queues behind
    /// them instead of barging in with its own attempt.
    pub(crate) fn has_waiters(&self, channel: &str) -> bool {
        self.shared
            .channels()
            .get(channel)
            .is_some_and(|c| !c.queue().slots.is_empty())
    }

    /// True if releases on `channel` reach this client right now.
    pub(crate) fn is_subscribed(&self, channel: &str) -> bool {
        self.shared
            .channels()
            .get(channel)
            .is_some_and(|c| *c.state.borrow() == SubState::Active)
    }

    /// Queues a waiter on `channel`, subscribing if this is the first.
    pub(crate) fn join(&self, name: &str) -> Waiter {
        self.join_slot(name, Slot::default())
    }

    /// Registers a waiter that Redis queues under `id`: it is woken only by a message naming it.
    pub(crate) fn join_named(&self, name: &str, id: &str) -> Waiter {
        self.join_slot(
            name,
            Slot {
                tag: Some(id.into()),
                ..Slot::default()
            },
        )
    }

    fn join_slot(&self, name: &str, slot: Slot) -> Waiter {
        let slot = Arc::new(slot);
        // The slot is queued under the registry lock, so the sweep cannot retire the channel
        // between finding it and joining it.
        let mut channels = self.shared.channels();
        let channel = match channels.get(name) {
            Some(c) => Arc::clone(c),
            None => {
                let state = if self.shared.connected.load(Ordering::Acquire) {
                    SubState::Pending
                } else {
                    SubState::Down
                };
                let c = Arc::new(Channel {
                    queue: StdMutex::new(Queue::default()),
                    state: watch::Sender::new(state),
                });
                channels.insert(name.to_owned(), Arc::clone(&c));
                // The task subscribes; if it is gone the waiter polls (state stays Down).
                if self.shared.commands.send(name.to_owned()).is_err() {
                    c.state.send_replace(SubState::Down);
                }
                c
            }
        };
        {
            let mut q = channel.queue();
            q.slots.push_back(Arc::clone(&slot));
            q.idle_since = None;
        }
        drop(channels);
        Waiter {
            channel,
            slot,
            consumed: AtomicBool::new(false),
        }
    }
}

/// One queued waiter. Dropping it leaves the queue and hands any wake-up it holds on.
#[derive(Debug)]
pub(crate) struct Waiter {
    channel: Arc<Channel>,
    slot: Arc<Slot>,
    /// A wake-up was consumed and the attempt it triggered has not finished.
    consumed: AtomicBool,
}

impl Waiter {
    /// Waits until the subscription is confirmed or known to be down.
    pub(crate) async fn ready(&self) {
        let mut rx = self.channel.state.subscribe();
        let _ = rx.wait_for(|s| *s != SubState::Pending).await;
    }

    /// True while releases reach this client by push.
    pub(crate) fn push_active(&self) -> bool {
        *self.channel.state.borrow() == SubState::Active
    }

    /// True if this is the oldest local waiter.
    pub(crate) fn is_front(&self) -> bool {
        self.channel
            .queue()
            .slots
            .front()
            .is_some_and(|s| Arc::ptr_eq(s, &self.slot))
    }

    pub(crate) fn holder_deadline(&self) -> Option<Instant> {
        self.channel.queue().holder_deadline
    }

    pub(crate) fn set_holder_deadline(&self, deadline: Option<Instant>) {
        self.channel.queue().holder_deadline = deadline;
    }

    /// Completes when this waiter is woken or becomes the front.
    pub(crate) async fn woken(&self) {
        self.slot.notify.notified().await;
    }

    /// Takes the pending wake-up, if any. Returns true if there was one: the caller should try
    /// again, and must call [`Waiter::settled`] once that attempt has an answer.
    pub(crate) fn take_wake(&self) -> bool {
        let had = self.slot.pending.swap(false, Ordering::AcqRel);
        if had {
            self.consumed.store(true, Ordering::Release);
        }
        had
    }

    /// Takes the fencing token and first lease term of a hold that a release handed to this
    /// waiter, if any.
    pub(crate) fn take_grant(&self) -> Option<(u64, Duration)> {
        let fence = self.slot.grant.swap(NO_GRANT, Ordering::AcqRel);
        let term = Duration::from_millis(self.slot.term_ms.load(Ordering::Acquire));
        (fence != NO_GRANT).then_some((fence, term))
    }

    /// The attempt that a consumed wake-up triggered has an answer.
    pub(crate) fn settled(&self) {
        self.consumed.store(false, Ordering::Release);
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        let mut q = self.channel.queue();
        let was_front = q.slots.front().is_some_and(|s| Arc::ptr_eq(s, &self.slot));
        q.slots.retain(|s| !Arc::ptr_eq(s, &self.slot));
        let unused_wake =
            self.slot.pending.load(Ordering::Acquire) || self.consumed.load(Ordering::Acquire);
        // Named waiters hand their turn on in Redis, when their queue place is removed.
        let local = self.slot.tag.is_none();
        if local && unused_wake {
            q.wake(1);
        } else if local
            && was_front
            && let Some(front) = q.slots.front()
        {
            // The new front owns the fallback timer now: let it arm it.
            front.notify.notify_one();
        }
        if q.slots.is_empty() {
            q.idle_since = Some(Instant::now());
        }
    }
}

async fn run(
    client: redis::Client,
    shared: Arc<Shared>,
    mut commands: mpsc::UnboundedReceiver<String>,
    mut shutdown: watch::Receiver<()>,
) {
    let mut retry = Duration::from_millis(10);
    loop {
        let conn = tokio::select! {
            _ = shutdown.changed() => return,
            conn = client.get_async_pubsub() => conn,
        };
        let (mut sink, mut stream) = match conn {
            Ok(conn) => conn.split(),
            Err(err) => {
                tracing::debug!(error = %err, "wake-up subscription unavailable, waiters poll");
                tokio::select! {
                    _ = shutdown.changed() => return,
                    _ = tokio::time::sleep(retry) => {}
                }
                retry = (retry * 2).min(Duration::from_secs(1));
                continue;
            }
        };
        let names: Vec<String> = shared.channels().keys().cloned().collect();
        if !names.is_empty() && sink.subscribe(&names).await.is_err() {
            continue;
        }
        retry = Duration::from_millis(10);
        shared.connected.store(true, Ordering::Release);
        // Anything released while we were away went unheard: everyone looks again. Channels
        // added since `names` was read are not subscribed yet: their own SUBSCRIBE, queued in
        // `commands`, marks them.
        shared.set(Some(&names), SubState::Active);
        let mut sweep = tokio::time::interval(SWEEP_EVERY);
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                msg = stream.next() => match msg {
                    Some(msg) => dispatch(&shared, &msg),
                    None => break,
                },
                name = commands.recv() => {
                    let Some(name) = name else { return };
                    let channel = shared.channels().get(&name).cloned();
                    if let Some(channel) = channel {
                        if sink.subscribe(&name).await.is_err() {
                            break;
                        }
                        channel.state.send_replace(SubState::Active);
                    }
                }
                _ = sweep.tick() => {
                    let idle = take_idle(&shared);
                    if !idle.is_empty() && sink.unsubscribe(&idle).await.is_err() {
                        break;
                    }
                }
            }
        }
        tracing::debug!("wake-up subscription lost, waiters poll until it is back");
        shared.connected.store(false, Ordering::Release);
        shared.set(None, SubState::Down);
    }
}

fn dispatch(shared: &Shared, msg: &redis::Msg) {
    let channel = shared.channels().get(msg.get_channel_name()).cloned();
    if let Some(channel) = channel {
        let mut queue = channel.queue();
        match msg.get_payload::<String>() {
            Ok(p) if p == "all" => queue.wake_all(),
            Ok(p) => match p.parse() {
                Ok(n) => queue.wake(n),
                Err(_) => queue.wake_named(&p),
            },
            Err(_) => queue.wake(1),
        }
    }
}

/// Removes and returns the channels that have had no waiter for longer than [`LINGER`].
fn take_idle(shared: &Shared) -> Vec<String> {
    let now = Instant::now();
    let mut channels = shared.channels();
    let idle: Vec<String> = channels
        .iter()
        .filter(|(_, c)| {
            let q = c.queue();
            q.slots.is_empty() && q.idle_since.is_some_and(|t| now - t >= LINGER)
        })
        .map(|(name, _)| name.clone())
        .collect();
    for name in &idle {
        channels.remove(name);
    }
    idle
}
