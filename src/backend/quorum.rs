//! Redlock: N independent Redis servers, each reached as one server is ([`Node`]), and asked
//! together. This module carries a request to every node at once, each call bounded by a
//! deadline, and hands back the replies as they come; how they are counted (a majority of
//! grants, of renewals, of confirmations) belongs to the layers above, which know what a reply
//! means.
//!
//! Calls about one hold (an acquisition, then its release or confirmation) are put on each
//! node's connection in the order they were made: such a call waits, on each node, until the
//! one before it is on the connection there, and the two then run in that order, pipelined.
//! Nothing else would order them: a client's first calls to a node wait for its connection,
//! and a call made later could find the connection made and go out first.
//!
//! Each node has its wake-up subscription, all feeding the client's one waiter registry through
//! a [`Merged`] listener: a release is published by every node that ran it, and a message heard
//! again from another node (the same channel and payload, within [`ECHO`]) is dropped, so a
//! waiter wakes once. Push counts as up while any node's subscription is.

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use redis::Value;
use tokio::sync::watch;
use tokio::time::Instant;

use super::script::{By, Publish};
use super::single::Node;
use super::source::Source;
use super::subscription::{self, Listener, Requests};
use super::{Request, Script};
use crate::config::Redlock;
use crate::error::{Error, Result};

/// How long a message is remembered, to drop the same message heard from another node.
const ECHO: Duration = Duration::from_secs(2);
/// The most messages remembered at once.
const ECHO_LIMIT: usize = 8192;
/// How long a call to one node may run, answered or not, before it is given up; also the
/// longest it waits, before it is sent, for the call before it about the same hold.
const LINGER: Duration = Duration::from_secs(10);

/// The independent servers of a Redlock client.
#[derive(Debug)]
pub(crate) struct Quorum {
    nodes: Vec<Arc<Node>>,
    settings: Redlock,
    /// Calls sent, one per server asked.
    sent: std::sync::atomic::AtomicU64,
    /// Per node, the last call about each hold not yet on the connection (see [`Link`]).
    chains: Arc<Chains>,
}

impl Quorum {
    /// The client's Redlock settings.
    pub(crate) fn settings(&self) -> &Redlock {
        &self.settings
    }

    /// How long one node may take to answer one call about holds of `lease`.
    pub(crate) fn node_timeout(&self, lease: Duration) -> Duration {
        self.settings.node_timeout(lease)
    }

    /// Calls sent so far, one per server asked.
    pub(crate) fn requests(&self) -> u64 {
        self.sent.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How many servers there are.
    pub(crate) fn len(&self) -> usize {
        self.nodes.len()
    }

    /// How many make a majority.
    pub(crate) fn majority(&self) -> usize {
        self.nodes.len() / 2 + 1
    }

    /// Runs `request` on every node at once, waiting for each answer until `deadline`: the
    /// replies, with the node that gave each, in the order they come (a node that has not
    /// answered by `deadline` gives a timeout error).
    ///
    /// Each call runs to the end (an answer, a connection failure, or [`LINGER`]) whether or
    /// not anyone still waits for it: dropping the [`Replies`] stops waiting, never sending.
    /// A call about a hold ([`Request::hold`]) is put on a node's connection once the call
    /// before it about the same hold is: a release that follows an acquisition reaches a slow
    /// node after it, even if nobody waited for the acquisition's answer.
    pub(crate) fn each<'a, R: Request>(&self, request: &'a R, deadline: Instant) -> Replies<'a, R> {
        let all: Vec<usize> = (0..self.nodes.len()).collect();
        self.to(&all, request, deadline)
    }

    /// [`each`](Self::each) on the nodes `to` only.
    pub(crate) fn to<'a, R: Request>(
        &self,
        to: &[usize],
        request: &'a R,
        deadline: Instant,
    ) -> Replies<'a, R> {
        let (by_hash, source) = request.call(By::hash(Publish::Plain)).into_parts();
        let by_hash = Arc::new(by_hash);
        let hold = request.hold().map(|(lock, owner)| {
            let mut hasher = std::hash::DefaultHasher::new();
            (lock, owner).hash(&mut hasher);
            hasher.finish()
        });
        let mut replies = Replies {
            request,
            deadline,
            ready: VecDeque::new(),
            pending: FuturesUnordered::new(),
            unanswered: Vec::new(),
        };
        let noop = &mut std::task::Context::from_waker(std::task::Waker::noop());
        for &node in to {
            let Some(server) = self.nodes.get(node).map(Arc::clone) else {
                continue;
            };
            self.sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let by_hash = Arc::clone(&by_hash);
            let mut link = hold.map(|hold| Link::new(&self.chains, node, hold));
            let mut call: Call = Box::pin(async move {
                if let Some(link) = link.as_mut() {
                    link.after_the_one_before().await;
                }
                // On the connection: the next call about the hold may go.
                let sent = move || drop(link);
                let raw = tokio::time::timeout(LINGER, server.send_then(&by_hash, source, sent))
                    .await
                    .unwrap_or_else(|_| Err(no_answer()));
                (node, raw)
            });
            // The first step sends the request, unless it waits (for a connection, or for the
            // call before it about the same hold).
            match call.as_mut().poll(noop) {
                std::task::Poll::Ready(answer) => replies.ready.push_back(answer),
                std::task::Poll::Pending => {
                    replies.unanswered.push(node);
                    replies.pending.push(call);
                }
            }
        }
        replies
    }
}

/// Per node, the last call about each hold not yet on the connection (by a hash of its lock
/// key and owner: two holds that share one only wait for each other).
#[derive(Debug)]
struct Chains {
    by_node: Vec<StdMutex<HashMap<u64, Last>>>,
    /// Numbers the links, so that a call removes its own entry only.
    next: std::sync::atomic::AtomicU64,
}

/// A node's last call about one hold not yet on the connection: its number, and what tells
/// when it is.
#[derive(Debug)]
struct Last {
    id: u64,
    sent: watch::Receiver<()>,
}

/// A call's place among the calls about its hold on its node: made when the call is, it
/// becomes the node's last call about the hold, and keeps the call before it (if that one is
/// not on the connection yet) to wait for. Dropped once the call is on the connection (or has
/// failed, or is dropped), it lets the next one go.
struct Link {
    chains: Arc<Chains>,
    node: usize,
    hold: u64,
    id: u64,
    before: Option<watch::Receiver<()>>,
    /// Dropped with the link: the next call's receiver then reads the channel closed.
    _sent: watch::Sender<()>,
}

impl Link {
    fn new(chains: &Arc<Chains>, node: usize, hold: u64) -> Self {
        let id = chains
            .next
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (sent, receiver) = watch::channel(());
        let before = chains
            .by_node
            .get(node)
            .and_then(|calls| calls.lock().ok())
            .and_then(|mut calls| calls.insert(hold, Last { id, sent: receiver }))
            .map(|last| last.sent);
        Self {
            chains: Arc::clone(chains),
            node,
            hold,
            id,
            before,
            _sent: sent,
        }
    }

    /// Completes once the call before this one about the hold is on the node's connection (at
    /// once if there is none), or after [`LINGER`] at the latest.
    async fn after_the_one_before(&mut self) {
        if let Some(mut before) = self.before.take() {
            // Nothing is ever sent on the channel: `changed` ends when its sender is dropped.
            let _ = tokio::time::timeout(LINGER, before.changed()).await;
        }
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        if let Some(Ok(mut calls)) = self.chains.by_node.get(self.node).map(StdMutex::lock)
            && calls.get(&self.hold).is_some_and(|last| last.id == self.id)
        {
            calls.remove(&self.hold);
        }
    }
}

/// One node's call: its index and raw reply.
type Call = std::pin::Pin<Box<dyn Future<Output = (usize, Result<Value>)> + Send>>;

/// The replies to one request sent to several nodes, as they come. Dropped with calls still
/// running, it leaves them to finish in the background.
pub(crate) struct Replies<'a, R: Request> {
    request: &'a R,
    deadline: Instant,
    /// Answers that came before anyone waited.
    ready: VecDeque<(usize, Result<Value>)>,
    pending: FuturesUnordered<Call>,
    /// Nodes that have not answered, in the order they were asked.
    unanswered: Vec<usize>,
}

impl<R: Request> Replies<'_, R> {
    /// The next node's reply, decoded, or a timeout error for a node that has not answered by
    /// the deadline; `None` when every node was heard.
    pub(crate) async fn next(&mut self) -> Option<(usize, Result<R::Reply>)> {
        if let Some((node, raw)) = self.ready.pop_front() {
            return Some((node, raw.and_then(|v| self.request.decode(v))));
        }
        loop {
            if self.unanswered.is_empty() {
                return None;
            }
            if Instant::now() >= self.deadline {
                let node = self.unanswered.remove(0);
                return Some((node, Err(no_answer())));
            }
            let answer = tokio::select! {
                answer = self.pending.next() => answer,
                () = tokio::time::sleep_until(self.deadline) => continue,
            };
            let (node, raw) = answer?;
            // A node reported as timed out already is not reported again.
            if let Some(at) = self.unanswered.iter().position(|n| *n == node) {
                self.unanswered.remove(at);
                return Some((node, raw.and_then(|v| self.request.decode(v))));
            }
        }
    }

    /// Every reply (see [`next`](Self::next)).
    pub(crate) async fn all(mut self) -> Vec<(usize, Result<R::Reply>)> {
        let mut all = Vec::new();
        while let Some(reply) = self.next().await {
            all.push(reply);
        }
        all
    }
}

impl<R: Request> Drop for Replies<'_, R> {
    fn drop(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let pending = std::mem::take(&mut self.pending);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(pending.for_each(|_| async {}));
        }
    }
}

/// What a node that did not answer in time fails with: as a timeout, an answer that may be lost.
fn no_answer() -> Error {
    Error::Redis(super::timed_out("the node did not answer in time"))
}

/// Starts the subscriptions of `servers` (one per node, feeding `listener`, subscribing to what
/// `requests` ask for, until `shutdown`'s sender is dropped) and returns the nodes, each reached
/// through its pool and loading `scripts` on every connection.
pub(super) fn start(
    settings: Redlock,
    servers: Vec<(deadpool_redis::Pool, redis::Client)>,
    scripts: &[&'static Script],
    listener: Arc<dyn Listener>,
    requests: Requests,
    shutdown: watch::Receiver<()>,
) -> Quorum {
    let merged = Arc::new(Merged {
        inner: listener,
        up: servers.iter().map(|_| AtomicBool::new(false)).collect(),
        idle: StdMutex::new(vec![Vec::new(); servers.len()]),
        heard: StdMutex::new(Heard::default()),
    });
    let mut nodes = Vec::with_capacity(servers.len());
    let mut subscribers = Vec::with_capacity(servers.len());
    for (index, (pool, client)) in servers.into_iter().enumerate() {
        let (subscriber, node_requests) = subscription::channel();
        subscribers.push(subscriber);
        let node_listener = Arc::new(NodeListener {
            merged: Arc::clone(&merged),
            index,
        });
        let source = Source::Fixed {
            pool,
            server: Box::new(client),
        };
        subscription::spawn(
            source.clone(),
            node_listener,
            node_requests,
            shutdown.clone(),
        );
        nodes.push(Arc::new(Node::new(source, scripts.to_vec())));
    }
    // Every channel the registry asks for is asked of every node.
    let mut wanted = requests.into_inner();
    tokio::spawn(async move {
        while let Some(channel) = wanted.recv().await {
            for subscriber in &subscribers {
                subscriber.subscribe(&channel);
            }
        }
    });
    let chains = Arc::new(Chains {
        by_node: nodes.iter().map(|_| StdMutex::default()).collect(),
        next: std::sync::atomic::AtomicU64::new(0),
    });
    Quorum {
        nodes,
        settings,
        sent: std::sync::atomic::AtomicU64::new(0),
        chains,
    }
}

/// The client's waiter registry, as heard through every node's subscription.
struct Merged {
    inner: Arc<dyn Listener>,
    /// Which nodes' subscriptions are up.
    up: Vec<AtomicBool>,
    /// Channels the registry gave up, still to be unsubscribed on each node.
    idle: StdMutex<Vec<Vec<String>>>,
    heard: StdMutex<Heard>,
}

/// Messages heard lately, to drop the same message from another node.
#[derive(Default)]
struct Heard {
    order: VecDeque<(Instant, (String, Vec<u8>))>,
    seen: HashSet<(String, Vec<u8>)>,
}

impl Heard {
    /// True the first time `channel` and `payload` are heard within [`ECHO`].
    fn first(&mut self, channel: &str, payload: &[u8]) -> bool {
        let now = Instant::now();
        while let Some((at, _)) = self.order.front() {
            if now.saturating_duration_since(*at) < ECHO && self.order.len() < ECHO_LIMIT {
                break;
            }
            if let Some((_, key)) = self.order.pop_front() {
                self.seen.remove(&key);
            }
        }
        let key = (channel.to_owned(), payload.to_vec());
        if !self.seen.insert(key.clone()) {
            return false;
        }
        self.order.push_back((now, key));
        true
    }
}

/// One node's view of [`Merged`], given to that node's subscription task.
struct NodeListener {
    merged: Arc<Merged>,
    index: usize,
}

impl Listener for NodeListener {
    fn channels(&self) -> Vec<String> {
        self.merged.inner.channels()
    }

    fn wants(&self, channel: &str) -> bool {
        self.merged.inner.wants(channel)
    }

    fn connected(&self, channels: &[String]) {
        if let Some(up) = self.merged.up.get(self.index) {
            up.store(true, Ordering::Release);
        }
        self.merged.inner.connected(channels);
    }

    fn subscribed(&self, channel: &str) {
        self.merged.inner.subscribed(channel);
    }

    fn disconnected(&self) {
        if let Some(up) = self.merged.up.get(self.index) {
            up.store(false, Ordering::Release);
        }
        // Another node's release messages still reach us while its subscription is up.
        if !self.merged.up.iter().any(|up| up.load(Ordering::Acquire)) {
            self.merged.inner.disconnected();
        }
    }

    fn unheard(&self, channel: &str) {
        self.merged.inner.unheard(channel);
    }

    fn message(&self, channel: &str, payload: &[u8]) {
        let first = self
            .merged
            .heard
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .first(channel, payload);
        if first {
            self.merged.inner.message(channel, payload);
        }
    }

    fn idle(&self) -> Vec<String> {
        let fresh = self.merged.inner.idle();
        let mut idle = self.merged.idle.lock().unwrap_or_else(|p| p.into_inner());
        for (node, list) in idle.iter_mut().enumerate() {
            if node != self.index {
                list.extend(fresh.iter().cloned());
            }
        }
        let mut mine = idle
            .get_mut(self.index)
            .map(std::mem::take)
            .unwrap_or_default();
        mine.extend(fresh);
        mine
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_message_heard_again_from_another_node_is_dropped() {
        let mut heard = Heard::default();
        assert!(heard.first("c", b"1@a"));
        assert!(!heard.first("c", b"1@a"));
        assert!(heard.first("c", b"1@b"));
        assert!(heard.first("d", b"1@a"));
        for i in 0..ECHO_LIMIT + 10 {
            heard.first("e", i.to_string().as_bytes());
        }
        assert!(heard.order.len() <= ECHO_LIMIT);
        assert_eq!(heard.order.len(), heard.seen.len());
    }
}
