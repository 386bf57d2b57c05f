//! The wake-up subscription: one connection per server on which releases reach this client.
//!
//! The task owns the connection and nothing else: which channels are wanted, and what a
//! message means, belong to its [`Listener`] (the client's waiter registry), which it tells of
//! every confirmation and disconnection. Messages reach the listener straight from the
//! connection's reader (a RESP3 connection's push sender, [`Pusher`]), with no task in between:
//! from the socket to the waiter's wake-up is one task switch. After a reconnection it
//! subscribes again to every channel the listener still wants; anything released meanwhile went
//! unheard, which the listener answers by waking its waiters. When its [`Source`] announces a
//! new server (a Sentinel failover), it moves there at once.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{AsyncPushSender, SendError};
use redis::{Msg, PushInfo, PushKind};
use tokio::sync::{mpsc, watch};

use super::source::Source;

/// How often channels without waiters are looked for, to be unsubscribed.
const SWEEP_EVERY: Duration = Duration::from_millis(500);
/// The longest wait between two attempts to connect: to one address, and to the master that
/// Sentinel names (which a failover is expected to change within seconds).
const RETRY_MAX: Duration = Duration::from_secs(1);
const RETRY_MAX_SENTINEL: Duration = Duration::from_millis(250);
/// How often the connection is asked for a `PING` while any channel is wanted, and how long
/// its answer may take. A connection dropped without a word (a NAT or a load balancer that
/// forgot it, a host gone) or a server that hangs would otherwise leave every waiter of this
/// client deaf, each hand-over to it waiting for its fallback timer (the holder's lease),
/// until some new channel's `SUBSCRIBE` failed.
pub(super) const HEARTBEAT: Duration = Duration::from_secs(10);
pub(super) const HEARTBEAT_ANSWER: Duration = Duration::from_secs(2);

/// What the subscription tells, and asks, the waiter registry.
pub(crate) trait Listener: Send + Sync + 'static {
    /// Every channel wanted now: subscribed again after a reconnection.
    fn channels(&self) -> Vec<String>;
    /// Whether `channel` is still wanted (it may have been given up since it was asked for).
    fn wants(&self, channel: &str) -> bool;
    /// The connection is up and `channels` are subscribed: releases on them reach us.
    fn connected(&self, channels: &[String]);
    /// A newly asked-for channel is subscribed.
    fn subscribed(&self, channel: &str);
    /// The connection is down: no release reaches us until it is back.
    fn disconnected(&self);
    /// `channel` alone is no longer subscribed (on a cluster: its slot moved to another node);
    /// until it is subscribed again, releases on it do not reach us.
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    fn unheard(&self, channel: &str);
    /// A message arrived on `channel`.
    fn message(&self, channel: &str, payload: &[u8]);
    /// Channels without waiters for a while: they are unsubscribed and forgotten.
    fn idle(&self) -> Vec<String>;
}

/// Asks the subscription task for channels.
#[derive(Debug, Clone)]
pub(crate) struct Subscriber {
    commands: mpsc::UnboundedSender<String>,
}

impl Subscriber {
    /// Asks for `channel`; false if the subscription task is gone (the client is shutting
    /// down), when no release will reach us.
    pub(crate) fn subscribe(&self, channel: &str) -> bool {
        self.commands.send(channel.to_owned()).is_ok()
    }
}

/// The task's end of the [`Subscriber`]'s requests.
#[derive(Debug)]
pub(crate) struct Requests(mpsc::UnboundedReceiver<String>);

impl Requests {
    /// The receiving end, for a subscription task.
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    pub(crate) fn into_inner(self) -> mpsc::UnboundedReceiver<String> {
        self.0
    }
}

/// A subscriber and the requests it sends, to be handed to the task.
pub(crate) fn channel() -> (Subscriber, Requests) {
    let (commands, rx) = mpsc::unbounded_channel();
    (Subscriber { commands }, Requests(rx))
}

/// Runs the subscription of `source`'s server until `shutdown`'s sender is dropped.
pub(super) fn spawn(
    source: Source,
    listener: Arc<dyn Listener>,
    requests: Requests,
    shutdown: watch::Receiver<()>,
) {
    tokio::spawn(run(source, listener, requests.0, shutdown));
}

async fn run(
    source: Source,
    listener: Arc<dyn Listener>,
    mut requests: mpsc::UnboundedReceiver<String>,
    mut shutdown: watch::Receiver<()>,
) {
    let mut retry = Duration::from_millis(10);
    let mut moves = source.moves();
    let retry_max = if moves.is_some() {
        RETRY_MAX_SENTINEL
    } else {
        RETRY_MAX
    };
    loop {
        if let Some(moves) = &mut moves {
            moves.mark_unchanged();
        }
        let (down, mut lost) = mpsc::unbounded_channel();
        let pusher = Pusher {
            listener: Arc::clone(&listener),
            down,
        };
        let conn = tokio::select! {
            _ = shutdown.changed() => return,
            conn = source.push_connection(pusher) => conn,
        };
        let mut conn = match conn {
            Ok(conn) => conn,
            Err(err) => {
                tracing::debug!(error = %err, "wake-up subscription unavailable, waiters poll");
                if !pause(&mut shutdown, &mut retry, retry_max).await {
                    return;
                }
                continue;
            }
        };
        let names = listener.channels();
        if !names.is_empty()
            && let Err(err) = conn.subscribe(&names).await
        {
            // Refused (a user without the channels' rights, a busy script): as a failed
            // connection, tried again after a pause, never at once.
            tracing::debug!(error = %err, "wake-up subscription refused, waiters poll");
            if !pause(&mut shutdown, &mut retry, retry_max).await {
                return;
            }
            continue;
        }
        retry = Duration::from_millis(10);
        // Channels asked for since `names` was read are not subscribed yet: their own
        // requests, queued, subscribe them.
        listener.connected(&names);
        let mut sweep = tokio::time::interval(SWEEP_EVERY);
        let mut heartbeat = heartbeat();
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = lost.recv() => break,
                _ = heartbeat.tick() => {
                    if !listener.channels().is_empty() && !alive(&mut conn).await {
                        tracing::debug!("the wake-up subscription did not answer a PING");
                        break;
                    }
                }
                name = requests.recv() => {
                    let Some(name) = name else { return };
                    if listener.wants(&name) {
                        if conn.subscribe(&name).await.is_err() {
                            break;
                        }
                        listener.subscribed(&name);
                    }
                }
                _ = sweep.tick() => {
                    let idle = listener.idle();
                    if !idle.is_empty() && conn.unsubscribe(&idle).await.is_err() {
                        break;
                    }
                }
                () = moved(&mut moves) => {
                    tracing::debug!("a new master was announced; the subscription moves to it");
                    break;
                }
            }
        }
        tracing::debug!("wake-up subscription lost, waiters poll until it is back");
        listener.disconnected();
    }
}

/// Ticks every [`HEARTBEAT`], the first one a heartbeat from now; a late tick delays the next.
pub(super) fn heartbeat() -> tokio::time::Interval {
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + HEARTBEAT, HEARTBEAT);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks
}

/// Whether the connection answers a `PING` in time (RESP3: allowed while subscribed).
async fn alive(conn: &mut redis::aio::MultiplexedConnection) -> bool {
    let ping = redis::cmd("PING");
    matches!(
        tokio::time::timeout(HEARTBEAT_ANSWER, ping.query_async::<()>(conn)).await,
        Ok(Ok(()))
    )
}

/// Waits `retry` before the next try, and doubles it up to `max`; false if the subscription
/// is shut down meanwhile.
pub(super) async fn pause(
    shutdown: &mut watch::Receiver<()>,
    retry: &mut Duration,
    max: Duration,
) -> bool {
    tokio::select! {
        _ = shutdown.changed() => return false,
        _ = tokio::time::sleep(*retry) => {}
    }
    *retry = (*retry * 2).min(max);
    true
}

/// What the connection's reader does with what the server pushes: a message goes to the
/// listener at once, in the reader's task; the connection's end is told to the subscription
/// task, which connects again.
struct Pusher {
    listener: Arc<dyn Listener>,
    down: mpsc::UnboundedSender<()>,
}

impl AsyncPushSender for Pusher {
    fn send(&self, info: PushInfo) -> Result<(), SendError> {
        match info.kind {
            PushKind::Disconnection => {
                let _ = self.down.send(());
            }
            PushKind::Message => {
                if let Some(msg) = Msg::from_push_info(info) {
                    self.listener
                        .message(msg.get_channel_name(), msg.get_payload_bytes());
                }
            }
            _ => {}
        }
        Ok(())
    }
}

/// Completes when the server changes (never for a fixed address).
async fn moved(moves: &mut Option<watch::Receiver<u64>>) {
    if let Some(moves) = moves
        && moves.changed().await.is_ok()
    {
        return;
    }
    std::future::pending().await
}
