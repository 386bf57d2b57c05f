//! A TCP proxy for fault injection, put between a client and a server on loopback: added
//! latency with jitter, replies held back and delivered later, a blackhole, a reset after the
//! request was sent, refused connections, connections left open and silent. The mode is
//! switched while a test runs and applies to every connection through the proxy, open or new
//! (but [`Mode::Strand`], which tells them apart). No root and no network namespace: just a
//! listener on a free loopback port.
//!
//! Bytes are never lost or reordered within a connection: what a mode holds back is delivered,
//! in order, once the mode lets it through (as TCP delivers once a network heals), unless the
//! connection is reset.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::Instant;

/// What the proxy does to the traffic it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Forward at once.
    Pass,
    /// Delay every chunk, both ways, by `base` plus a random share of `jitter`, keeping order.
    Delay {
        /// The fixed part of the delay.
        base: Duration,
        /// Up to this much more, drawn per chunk.
        jitter: Duration,
    },
    /// Requests reach the server; its replies are held back until the mode changes, then
    /// delivered.
    HoldReplies,
    /// Nothing goes through either way, and no connection is closed, until the mode changes;
    /// then what was held is delivered.
    Blackhole,
    /// Requests reach the server; when a reply comes, the client's connection is reset instead
    /// (the request ran, its answer is lost).
    ResetReplies,
    /// New connections are reset at once; open ones pass.
    Refuse,
    /// The connections open when this mode was set carry nothing either way and stay open (a
    /// half-open connection, as when a NAT or a load balancer forgets it); new ones pass. Any
    /// later mode applies to them again (and delivers what they held).
    Strand,
}

/// A running proxy. Dropping it closes every connection through it.
#[derive(Debug)]
pub struct Proxy {
    local: SocketAddr,
    mode: Arc<watch::Sender<Mode>>,
    /// Set: the next reply of any connection is lost (its connection reset) instead.
    armed: Arc<AtomicBool>,
    /// The mode to switch to when the armed reply is lost, if any.
    then: Arc<std::sync::Mutex<Option<Mode>>>,
    /// How many connections were reset for an armed reply.
    resets: watch::Sender<u64>,
    /// How many times [`Mode::Strand`] was set: a connection opened before the last time is
    /// stranded.
    strands: Arc<AtomicU64>,
    _stop: watch::Sender<()>,
}

impl Proxy {
    /// A proxy on a free loopback port forwarding to `upstream`, in [`Mode::Pass`]. Must be
    /// called inside a tokio runtime.
    ///
    /// # Errors
    ///
    /// When no loopback port can be bound.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let local = listener.local_addr()?;
        let (mode, mode_rx) = watch::channel(Mode::Pass);
        let mode = Arc::new(mode);
        let (stop, stop_rx) = watch::channel(());
        let armed = Arc::new(AtomicBool::new(false));
        let (resets, _) = watch::channel(0);
        let then = Arc::new(std::sync::Mutex::new(None));
        let strands = Arc::new(AtomicU64::new(0));
        let shot = Shot {
            armed: Arc::clone(&armed),
            resets: resets.clone(),
            then: Arc::clone(&then),
            mode: Arc::clone(&mode),
        };
        tokio::spawn(accept(
            listener,
            upstream,
            mode_rx,
            stop_rx,
            shot,
            Arc::clone(&strands),
        ));
        Ok(Self {
            local,
            mode,
            armed,
            then,
            resets,
            strands,
            _stop: stop,
        })
    }

    /// The next reply that comes through, on any connection, is lost: that connection is
    /// reset instead (its request ran). Then every reply passes again.
    pub fn lose_next_reply(&self) {
        *self.then.lock().unwrap_or_else(|p| p.into_inner()) = None;
        self.armed.store(true, Ordering::SeqCst);
    }

    /// As [`lose_next_reply`](Self::lose_next_reply), and the proxy switches to `mode` as it
    /// loses that reply, before the client's connection is reset: whatever the client sends
    /// next, on a new connection too, meets `mode` (for instance a reconnect that
    /// [`Mode::Blackhole`] holds up).
    pub fn lose_next_reply_then(&self, mode: Mode) {
        *self.then.lock().unwrap_or_else(|p| p.into_inner()) = Some(mode);
        self.armed.store(true, Ordering::SeqCst);
    }

    /// How many replies were lost for [`lose_next_reply`](Self::lose_next_reply).
    pub fn replies_lost(&self) -> u64 {
        *self.resets.borrow()
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.local
    }

    /// `redis://` and the proxy's address.
    pub fn url(&self) -> String {
        format!("redis://{}", self.local)
    }

    /// Switches every connection, open and new, to `mode`.
    pub fn set(&self, mode: Mode) {
        if mode == Mode::Strand {
            self.strands.fetch_add(1, Ordering::SeqCst);
        }
        self.mode.send_replace(mode);
    }

    /// The mode now.
    pub fn mode(&self) -> Mode {
        *self.mode.borrow()
    }
}

/// The one-shot reply loss shared by a proxy's connections.
#[derive(Clone)]
struct Shot {
    armed: Arc<AtomicBool>,
    resets: watch::Sender<u64>,
    /// The mode to switch to as the reply is lost ([`Proxy::lose_next_reply_then`]).
    then: Arc<std::sync::Mutex<Option<Mode>>>,
    mode: Arc<watch::Sender<Mode>>,
}

async fn accept(
    listener: TcpListener,
    upstream: SocketAddr,
    mode: watch::Receiver<Mode>,
    mut stop: watch::Receiver<()>,
    shot: Shot,
    strands: Arc<AtomicU64>,
) {
    loop {
        let client = tokio::select! {
            _ = stop.changed() => return,
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => client,
                Err(_) => continue,
            },
        };
        if *mode.borrow() == Mode::Refuse {
            let _ = client.set_zero_linger();
            drop(client);
            continue;
        }
        let (mode, stop, shot) = (mode.clone(), stop.clone(), shot.clone());
        let stranded = Stranded {
            born: strands.load(Ordering::SeqCst),
            strands: Arc::clone(&strands),
        };
        tokio::spawn(async move {
            if let Ok(server) = TcpStream::connect(upstream).await {
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                carry(client, server, mode, stop, shot, stranded).await;
            }
        });
    }
}

/// Whether a connection is one that [`Mode::Strand`] strands.
struct Stranded {
    /// How many times the mode had been set when the connection was opened.
    born: u64,
    strands: Arc<AtomicU64>,
}

impl Stranded {
    /// The mode that applies to this connection: under [`Mode::Strand`], a blackhole if it was
    /// open when the mode was last set, else a pass.
    fn mode(&self, mode: Mode) -> Mode {
        match mode {
            Mode::Strand if self.born < self.strands.load(Ordering::SeqCst) => Mode::Blackhole,
            Mode::Strand => Mode::Pass,
            other => other,
        }
    }
}

/// Bytes read one way and not written yet, each with the moment it may be written.
#[derive(Default)]
struct Queue {
    chunks: VecDeque<(Instant, Vec<u8>)>,
    /// The latest due time given: later chunks are never due earlier (order is kept).
    last_due: Option<Instant>,
}

impl Queue {
    fn push(&mut self, chunk: Vec<u8>, mode: Mode) {
        let now = Instant::now();
        let delay = match mode {
            Mode::Delay { base, jitter } => base + jitter.mul_f64(fastrand::f64()),
            _ => Duration::ZERO,
        };
        let due = self.last_due.map_or(now + delay, |d| d.max(now + delay));
        self.last_due = Some(due);
        self.chunks.push_back((due, chunk));
    }

    /// The chunks that may be written now, in order.
    fn ready(&mut self, now: Instant, mode: Mode, replies: bool) -> Vec<Vec<u8>> {
        let held = match mode {
            Mode::Blackhole => true,
            Mode::HoldReplies => replies,
            _ => false,
        };
        let mut out = Vec::new();
        if held {
            return out;
        }
        while let Some((due, _)) = self.chunks.front() {
            if matches!(mode, Mode::Delay { .. }) && *due > now {
                break;
            }
            out.extend(self.chunks.pop_front().map(|(_, c)| c));
        }
        out
    }

    fn next_due(&self, mode: Mode) -> Option<Instant> {
        match mode {
            Mode::Delay { .. } => self.chunks.front().map(|(due, _)| *due),
            _ => None,
        }
    }
}

/// Carries one connection both ways until either side closes (or the proxy stops).
async fn carry(
    mut client: TcpStream,
    mut server: TcpStream,
    mut mode: watch::Receiver<Mode>,
    mut stop: watch::Receiver<()>,
    shot: Shot,
    stranded: Stranded,
) {
    let (mut up, mut down) = (Queue::default(), Queue::default());
    let (mut buf_c, mut buf_s) = (vec![0u8; 16 * 1024], vec![0u8; 16 * 1024]);
    let (mut client_open, mut server_open) = (true, true);
    loop {
        let now = Instant::now();
        let current = stranded.mode(*mode.borrow());
        if current == Mode::ResetReplies && !down.chunks.is_empty() {
            // A reply came: the client never gets it.
            let _ = client.set_zero_linger();
            return;
        }
        if !down.chunks.is_empty() && shot.armed.swap(false, Ordering::SeqCst) {
            if let Some(next) = shot.then.lock().unwrap_or_else(|p| p.into_inner()).take() {
                shot.mode.send_replace(next);
            }
            let _ = client.set_zero_linger();
            shot.resets.send_modify(|n| *n += 1);
            return;
        }
        {
            let (mut cr, mut cw) = client.split();
            let (mut sr, mut sw) = server.split();
            for chunk in up.ready(now, current, false) {
                if sw.write_all(&chunk).await.is_err() {
                    return;
                }
            }
            for chunk in down.ready(now, current, true) {
                if cw.write_all(&chunk).await.is_err() {
                    return;
                }
            }
            if !client_open && up.chunks.is_empty() || !server_open && down.chunks.is_empty() {
                return;
            }
            let due = [up.next_due(current), down.next_due(current)]
                .into_iter()
                .flatten()
                .min();
            tokio::select! {
                _ = stop.changed() => return,
                _ = mode.changed() => {}
                _ = async {
                    match due {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                } => {}
                read = cr.read(&mut buf_c), if client_open => match read {
                    Ok(0) | Err(_) => client_open = false,
                    Ok(n) => up.push(buf_c[..n].to_vec(), current),
                },
                read = sr.read(&mut buf_s), if server_open => match read {
                    Ok(0) | Err(_) => server_open = false,
                    Ok(n) => down.push(buf_s[..n].to_vec(), current),
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server on loopback.
    async fn echo() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        addr
    }

    async fn round_trip(s: &mut TcpStream, text: &[u8]) -> std::io::Result<Vec<u8>> {
        s.write_all(text).await?;
        let mut buf = vec![0u8; text.len()];
        s.read_exact(&mut buf).await?;
        Ok(buf)
    }

    #[tokio::test]
    async fn modes_hold_delay_and_cut_as_they_say() {
        let proxy = Proxy::start(echo().await).await.unwrap();
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(round_trip(&mut s, b"ping").await.unwrap(), b"ping");

        // Held replies arrive once the mode lets them through, in order.
        proxy.set(Mode::HoldReplies);
        s.write_all(b"one").await.unwrap();
        let mut buf = [0u8; 3];
        let waited = tokio::time::timeout(Duration::from_millis(100), s.read_exact(&mut buf)).await;
        assert!(waited.is_err(), "a held reply came through");
        proxy.set(Mode::Pass);
        s.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"one");

        // A delay of 50 ms is at least 50 ms each way.
        proxy.set(Mode::Delay {
            base: Duration::from_millis(50),
            jitter: Duration::from_millis(10),
        });
        let started = Instant::now();
        assert_eq!(round_trip(&mut s, b"late").await.unwrap(), b"late");
        assert!(started.elapsed() >= Duration::from_millis(100));

        // A blackhole keeps everything, then delivers it.
        proxy.set(Mode::Blackhole);
        s.write_all(b"dark").await.unwrap();
        let waited = tokio::time::timeout(Duration::from_millis(100), s.read_exact(&mut buf)).await;
        assert!(waited.is_err(), "a reply came through a blackhole");
        proxy.set(Mode::Pass);
        let mut four = [0u8; 4];
        s.read_exact(&mut four).await.unwrap();
        assert_eq!(&four, b"dark");

        // A reset after the request: the reply is never read.
        proxy.set(Mode::ResetReplies);
        s.write_all(b"gone").await.unwrap();
        let read = s.read(&mut four).await;
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");

        // Refused: a new connection is reset; open ones would pass.
        proxy.set(Mode::Refuse);
        let mut refused = TcpStream::connect(proxy.addr()).await.unwrap();
        let read = round_trip(&mut refused, b"x").await;
        assert!(read.is_err(), "{read:?}");
        proxy.set(Mode::Pass);
        let mut again = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(round_trip(&mut again, b"back").await.unwrap(), b"back");

        // Stranded: the open connection says nothing and stays open; a new one passes, until
        // the mode is set again.
        proxy.set(Mode::Strand);
        again.write_all(b"lost").await.unwrap();
        let waited = tokio::time::timeout(Duration::from_millis(100), again.read_exact(&mut four));
        assert!(waited.await.is_err(), "a stranded connection answered");
        let mut fresh = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(round_trip(&mut fresh, b"new!").await.unwrap(), b"new!");
        proxy.set(Mode::Strand);
        fresh.write_all(b"gone").await.unwrap();
        let waited = tokio::time::timeout(Duration::from_millis(100), fresh.read_exact(&mut four));
        assert!(
            waited.await.is_err(),
            "a connection stranded again answered"
        );
    }
}
