//! The waiter registry: who waits in this client for which channel, and what wakes them. The
//! backend's subscription (one connection per server) tells it what it hears, as its
//! [`Listener`]; messages are read with the protocol's grammar ([`wake`]).
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
//! Observers ([`Notifier::watch`]) are not waiters: each hears every message on its channel, in
//! order, through a bounded buffer (a full buffer drops the message and says so), and keeps the
//! channel subscribed while it lives. An election's observers use them.
//!
//! Only the oldest local waiter (the front) keeps a fallback timer, set to the moment the
//! holder's lease would run out; the others wait for their turn. If the subscription connection
//! drops, every waiter falls back to jittered backoff polling until it is back, and all are
//! woken once it is, since a release may have been missed in between.

use foldhash::HashMap;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex, MutexGuard as StdGuard};
use std::time::Duration;

use tokio::sync::{Notify, mpsc, watch};
use tokio::time::Instant;

use crate::backend::{Listener, Subscriber};
use crate::protocol::wake::{self, Grant, Wake};

/// How long a channel stays subscribed after its last local waiter left.
const LINGER: Duration = Duration::from_secs(2);

/// How many messages an observer's buffer holds before it drops one (and is told so).
const WATCH_BUFFER: usize = 256;

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
    /// The hold that a release handed to this waiter, not taken yet (the latest message's).
    grant: StdMutex<Option<Grant>>,
}

impl Default for Slot {
    fn default() -> Self {
        Self {
            notify: Notify::new(),
            pending: AtomicBool::new(false),
            tag: None,
            grant: StdMutex::new(None),
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

/// What the registry tells an observer beside its messages.
#[derive(Debug, Default)]
struct WatchFlags {
    /// A message was dropped because the buffer was full.
    lagged: AtomicBool,
    /// The subscription went down since the observer last looked, even if it is back now.
    down: AtomicBool,
}

/// An observer's end in the registry (known by its flags).
#[derive(Debug)]
struct Watcher {
    tx: mpsc::Sender<Box<[u8]>>,
    flags: Arc<WatchFlags>,
}

#[derive(Debug, Default)]
struct Queue {
    slots: VecDeque<Arc<Slot>>,
    watchers: Vec<Watcher>,
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

    /// Wakes the waiters named in a message, storing the holds a release handed them.
    fn wake_named(&mut self, named: &[wake::Named<'_>]) {
        for n in named {
            for slot in self.slots.iter().filter(|s| s.tag.as_deref() == Some(n.id)) {
                if let Some(grant) = n.grant {
                    *lock(&slot.grant) = Some(grant);
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

/// Locks `m`. Every update under these locks is one assignment, push, remove or flag, so a
/// poisoned lock still holds a consistent value and is used as is.
fn lock<T>(m: &StdMutex<T>) -> StdGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Channel {
    fn queue(&self) -> StdGuard<'_, Queue> {
        lock(&self.queue)
    }
}

#[derive(Debug)]
struct Shared {
    channels: StdMutex<HashMap<String, Arc<Channel>>>,
    subscriber: Subscriber,
    connected: AtomicBool,
}

impl Shared {
    fn channels(&self) -> StdGuard<'_, HashMap<String, Arc<Channel>>> {
        lock(&self.channels)
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
            let mut q = channel.queue();
            if state == SubState::Down {
                for w in &q.watchers {
                    w.flags.down.store(true, Ordering::Release);
                }
            }
            q.wake_all();
        }
    }
}

/// The waiter registry of one client.
#[derive(Debug, Clone)]
pub(crate) struct Notifier {
    shared: Arc<Shared>,
}

impl Notifier {
    /// A registry that asks `subscriber` for the channels its waiters need.
    pub(crate) fn new(subscriber: Subscriber) -> Self {
        Self {
            shared: Arc::new(Shared {
                channels: StdMutex::new(HashMap::default()),
                subscriber,
                connected: AtomicBool::new(false),
            }),
        }
    }

    /// What the subscription reports to.
    pub(crate) fn listener(&self) -> Arc<dyn Listener> {
        Arc::clone(&self.shared) as Arc<dyn Listener>
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

    /// Registers an observer of `name`: it hears every message on the channel from now on,
    /// and keeps the channel subscribed until it is dropped.
    pub(crate) fn watch(&self, name: &str) -> Watch {
        let (tx, rx) = mpsc::channel(WATCH_BUFFER);
        let flags = Arc::new(WatchFlags::default());
        let mut channels = self.shared.channels();
        let channel = self.channel(&mut channels, name);
        {
            let mut q = channel.queue();
            q.watchers.push(Watcher {
                tx,
                flags: Arc::clone(&flags),
            });
            q.idle_since = None;
        }
        drop(channels);
        let state = channel.state.subscribe();
        Watch {
            channel,
            rx,
            flags,
            state,
        }
    }

    /// The registry's entry for `name`, made (and subscribed) if there is none.
    fn channel(&self, channels: &mut HashMap<String, Arc<Channel>>, name: &str) -> Arc<Channel> {
        match channels.get(name) {
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
                if !self.shared.subscriber.subscribe(name) {
                    c.state.send_replace(SubState::Down);
                }
                c
            }
        }
    }

    fn join_slot(&self, name: &str, slot: Slot) -> Waiter {
        let slot = Arc::new(slot);
        // The slot is queued under the registry lock, so the sweep cannot retire the channel
        // between finding it and joining it.
        let mut channels = self.shared.channels();
        let channel = self.channel(&mut channels, name);
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
            served: AtomicBool::new(false),
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
    /// The wait ended with the hold ([`served`](Self::served)).
    served: AtomicBool,
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

    /// Takes the hold that a release handed to this waiter, if any.
    pub(crate) fn take_grant(&self) -> Option<Grant> {
        lock(&self.slot.grant).take()
    }

    /// The attempt that a consumed wake-up triggered has an answer.
    pub(crate) fn settled(&self) {
        self.consumed.store(false, Ordering::Release);
    }

    /// The wait ended with the hold: leaving, this waiter tells nobody to look again.
    pub(crate) fn served(&self) {
        self.served.store(true, Ordering::Release);
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
        } else if !local
            && was_front
            && !self.served.load(Ordering::Acquire)
            && let Some(front) = q.slots.front()
        {
            // A release tells the first queued waiter of each client, by name, when a lease
            // ends sooner than the others were told (`queue_lib.lua`'s `tell_sooner`): leaving
            // without the hold, this one may have been told, and the next waiter of this
            // client looks again for itself, rather than at a time learned before.
            front.give();
        }
        if q.slots.is_empty() {
            q.idle_since = Some(Instant::now());
        }
    }
}

/// What an observer hears next.
#[derive(Debug)]
pub(crate) enum Heard {
    /// A message on the channel.
    Message(Box<[u8]>),
    /// Messages were dropped (the buffer was full): what they said must be read afresh.
    Lagged,
    /// The subscription is down: messages may be missed from now on.
    Down,
}

/// One observer of a channel. Dropping it stops its messages.
#[derive(Debug)]
pub(crate) struct Watch {
    channel: Arc<Channel>,
    rx: mpsc::Receiver<Box<[u8]>>,
    flags: Arc<WatchFlags>,
    state: watch::Receiver<SubState>,
}

impl Watch {
    /// Waits until the subscription is confirmed (true), or the registry is gone (false). A
    /// drop of the subscription before then does not count against the observer.
    pub(crate) async fn active(&mut self) -> bool {
        let active = self
            .state
            .wait_for(|s| *s == SubState::Active)
            .await
            .is_ok();
        self.flags.down.store(false, Ordering::Release);
        active
    }

    /// The next message, in the order the channel carried them.
    ///
    /// Cancel safe: a message is taken only when it is returned.
    pub(crate) async fn next(&mut self) -> Heard {
        loop {
            if self.flags.lagged.swap(false, Ordering::AcqRel) {
                return Heard::Lagged;
            }
            // Down now, or down and back since the last look: messages may have been missed.
            if self.flags.down.load(Ordering::Acquire)
                || *self.state.borrow_and_update() == SubState::Down
            {
                return Heard::Down;
            }
            tokio::select! {
                biased;
                message = self.rx.recv() => {
                    return message.map_or(Heard::Down, Heard::Message);
                }
                changed = self.state.changed() => {
                    if changed.is_err() {
                        return Heard::Down;
                    }
                }
            }
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let mut q = self.channel.queue();
        q.watchers.retain(|w| !Arc::ptr_eq(&w.flags, &self.flags));
        if q.slots.is_empty() && q.watchers.is_empty() {
            q.idle_since = Some(Instant::now());
        }
    }
}

impl Listener for Shared {
    fn channels(&self) -> Vec<String> {
        self.channels().keys().cloned().collect()
    }

    fn wants(&self, channel: &str) -> bool {
        self.channels().contains_key(channel)
    }

    fn connected(&self, channels: &[String]) {
        self.connected.store(true, Ordering::Release);
        // Anything released while we were away went unheard: everyone looks again. Channels
        // added since `channels` was read are not subscribed yet: their own subscription
        // marks them.
        self.set(Some(channels), SubState::Active);
    }

    fn subscribed(&self, channel: &str) {
        if let Some(c) = self.channels().get(channel)
            && c.state.send_replace(SubState::Active) == SubState::Down
        {
            // Made while the subscription was down (or after it was lost), its waiters may
            // have tried, found the name busy and missed the release since: they look again,
            // as after a reconnection. (A channel made while connected was Pending, and its
            // waiters try once it is confirmed.)
            c.queue().wake_all();
        }
    }

    fn disconnected(&self) {
        self.connected.store(false, Ordering::Release);
        self.set(None, SubState::Down);
    }

    fn unheard(&self, channel: &str) {
        self.set(Some(&[channel.to_owned()]), SubState::Down);
    }

    fn message(&self, channel: &str, payload: &[u8]) {
        crate::timeline::hop("wake.received");
        let Some(channel) = self.channels().get(channel).cloned() else {
            return;
        };
        let mut queue = channel.queue();
        match wake::parse(payload) {
            Wake::Count(n) => queue.wake(n),
            Wake::Named(named) => queue.wake_named(&named),
            Wake::Leader { .. } => {}
        }
        queue
            .watchers
            .retain(|w| match w.tx.try_send(payload.into()) {
                Ok(()) => true,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    w.flags.lagged.store(true, Ordering::Release);
                    true
                }
                Err(mpsc::error::TrySendError::Closed(_)) => false,
            });
    }

    /// Removes and returns the channels that have had no waiter for longer than [`LINGER`].
    fn idle(&self) -> Vec<String> {
        let now = Instant::now();
        let mut channels = self.channels();
        let idle: Vec<String> = channels
            .iter()
            .filter(|(_, c)| {
                let q = c.queue();
                q.slots.is_empty()
                    && q.watchers.is_empty()
                    && q.idle_since.is_some_and(|t| now - t >= LINGER)
            })
            .map(|(name, _)| name.clone())
            .collect();
        for name in &idle {
            channels.remove(name);
        }
        idle
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A channel made while the subscription was down starts `Down`; once subscribed, its
    /// waiters look again (a release may have gone unheard in between), as after a
    /// reconnection.
    #[tokio::test]
    async fn a_channel_subscribed_after_being_down_wakes_its_waiters() {
        let (subscriber, _requests) = crate::backend::subscription();
        let notifier = Notifier::new(subscriber);
        let listener = notifier.listener();
        let waiter = notifier.join("n:wake");
        assert!(!waiter.push_active());
        assert!(!waiter.take_wake());
        listener.subscribed("n:wake");
        assert!(waiter.push_active());
        assert!(waiter.take_wake(), "the waiter was not told to look again");
        // A channel made while connected is Pending, and its confirmation wakes nobody.
        listener.connected(&[]);
        let pending = notifier.join("m:wake");
        listener.subscribed("m:wake");
        assert!(pending.push_active());
        assert!(!pending.take_wake());
    }
}
