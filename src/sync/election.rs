//! [`Election`]: leader election on the fair mutex's queue, with the leader's record (its term
//! and value) beside it, and observers told of every change by push.

use std::collections::VecDeque;
use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::Stream;
use futures_util::stream::BoxStream;
use tokio::time::Instant;

use super::MutexGuard;
use crate::acquire::Engine;
use crate::core::Core;
use crate::error::{Error, Result};
use crate::lease::Lost;
use crate::lease::release::Retry;
use crate::notify::{Heard, Watch};
use crate::protocol::election::{Proclaim, ReadLeader, Reading, Version};
use crate::protocol::wake::{self, Wake};
use crate::protocol::{Claim, Family};
use crate::time::after;
use crate::token::OwnerToken;

/// The longest value a leader may proclaim, in bytes. Every change is published whole to every
/// observer.
pub const MAX_LEADER_VALUE: usize = 64 * 1024;

/// A leader election: the candidates of every client and process queue in FIFO order for one
/// leadership, which its holder keeps with a watchdog lease like any lock.
///
/// Made by [`LockClient::election`](crate::LockClient::election).
///
/// * [`campaign`](Self::campaign) waits for the candidate's turn (in the queue of a
///   [`FairMutex`](crate::FairMutex), woken by push), then writes its value, and returns a
///   [`Leadership`]: the leader's **term** is its fencing token, strictly rising with every
///   new leader, for the resources it writes to refuse a deposed leader.
/// * [`leader`](Self::leader) reads who leads now; [`observe`](Self::observe) streams every
///   change (a new leader, a new value, a resignation) in order, pushed on the name's channel.
/// * A leader that dies is followed by the next candidate when its lease runs out (the client's
///   lease, 30 s by default: choose a short one with [`with_lease`](Self::with_lease) for a
///   fast failover); a leader that cannot renew learns [`Leadership::lost`].
///
/// ```no_run
/// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
/// use std::time::Duration;
///
/// let election = client.election("billing-jobs")?.with_lease(Duration::from_secs(2))?;
/// let leadership = election.campaign("worker-7").await?;
/// let term = leadership.term();
/// tokio::select! {
///     _ = leadership.lost() => eprintln!("term {term} ended: stop at once"),
///     _ = async { /* the singleton's work, writes fenced with `term` */ } => {}
/// }
/// if leadership.is_held() {
///     // (Once deposed, it would fail with `NotHeld`.)
///     leadership.resign().await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Election {
    engine: Engine,
}

impl fmt::Debug for Election {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Election")
            .field("name", &self.engine.name)
            .field("lease", &self.engine.lease)
            .field("watchdog", &self.engine.renew)
            .finish()
    }
}

/// Who leads an election: the term (the leadership's fencing token) and the value its leader
/// proclaimed.
///
/// ```no_run
/// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
/// if let Some(leader) = client.election("jobs")?.leader().await? {
///     println!("{} leads in term {}", leader.value, leader.term);
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leader {
    /// The leader's term: strictly rising with every new leader.
    pub term: u64,
    /// What the leader proclaimed.
    pub value: String,
}

fn check_value(value: &str) -> Result<()> {
    if value.len() > MAX_LEADER_VALUE {
        return Err(Error::invalid(
            "leader value",
            format!(
                "{} bytes, at most {MAX_LEADER_VALUE} are allowed",
                value.len()
            ),
        ));
    }
    Ok(())
}

impl Election {
    pub(crate) fn new(core: Arc<Core>, name: &str) -> Result<Self> {
        let mut engine = Engine::new(core, name, Family::Election, 0)?;
        // Renewed whatever the client's `watchdog` setting: a leadership has no natural end,
        // and no `extend` to keep it by hand.
        engine.renew = true;
        Ok(Self { engine })
    }

    /// The election's name.
    ///
    /// ```no_run
    /// # fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// assert_eq!(client.election("a")?.name(), "a");
    /// # Ok(()) }
    /// ```
    pub fn name(&self) -> &str {
        &self.engine.name
    }

    /// This handle with its own lease, renewed by the watchdog while the leadership is held:
    /// a dead leader is followed within about this lease. (Unlike the locks' `with_lease`, the
    /// watchdog keeps renewing, also on a client built with
    /// [`watchdog(false)`](crate::LockClientBuilder::watchdog): a leadership has no natural
    /// end.)
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if `lease` is outside
    /// [`MIN_LEASE`](crate::MIN_LEASE)..=[`MAX_LEASE`](crate::MAX_LEASE), or if the client's
    /// drift allowance ([`LockClientBuilder::drift`](crate::LockClientBuilder::drift)) leaves
    /// nothing of it.
    ///
    /// ```no_run
    /// # fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// use std::time::Duration;
    ///
    /// let election = client.election("jobs")?.with_lease(Duration::from_secs(2))?;
    /// # Ok(()) }
    /// ```
    pub fn with_lease(self, lease: Duration) -> Result<Self> {
        let mut engine = self.engine.with_lease(lease)?;
        engine.renew = true;
        Ok(Self { engine })
    }

    /// Stands as a candidate with `value` (what observers and [`leader`](Self::leader) will
    /// see, such as an address): takes a place at the tail of the queue, waits for its turn as
    /// long as it takes, then proclaims `value` and returns the leadership.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if `value` is longer than [`MAX_LEADER_VALUE`];
    /// [`Error::Pool`] or [`Error::Redis`] if Redis cannot be reached on the first attempt or
    /// when proclaiming; [`Error::NotHeld`] if the leadership's lease ran out before its value
    /// could be written; [`Error::WrongType`] or [`Error::Layout`] if the name's keys hold
    /// other data, or the name is in use as another primitive.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe. Dropping the future leaves the queue at once (in the background); a
    /// leadership already won is resigned again.
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// let leadership = client.election("jobs")?.campaign("10.0.0.7:8080").await?;
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "redlatch.campaign", skip_all, fields(election = %self.engine.name))]
    pub async fn campaign(&self, value: impl Into<String>) -> Result<Leadership> {
        self.stand(value.into(), None).await
    }

    /// As [`campaign`](Self::campaign), giving up after `timeout`.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] if the turn did not come within `timeout`, else as
    /// [`campaign`](Self::campaign).
    ///
    /// # Cancel safety
    ///
    /// As [`campaign`](Self::campaign).
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// use std::time::Duration;
    ///
    /// match client.election("jobs")?.campaign_timeout("me", Duration::from_secs(1)).await {
    ///     Ok(leadership) => leadership.resign().await?,
    ///     Err(redlatch::Error::Timeout { .. }) => println!("someone else leads"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "redlatch.campaign", skip_all, fields(election = %self.engine.name))]
    pub async fn campaign_timeout(
        &self,
        value: impl Into<String>,
        timeout: Duration,
    ) -> Result<Leadership> {
        self.stand(value.into(), Some(timeout)).await
    }

    async fn stand(&self, value: String, timeout: Option<Duration>) -> Result<Leadership> {
        check_value(&value)?;
        let guard =
            MutexGuard::acquire(&self.engine, OwnerToken::new(), Claim::New, timeout).await?;
        let mut leadership = Leadership {
            guard: Some(guard),
            engine: self.engine.clone(),
            value: String::new(),
        };
        // Dropped here (cancelled, or refused), the leadership resigns in the background.
        leadership.proclaim(value).await?;
        Ok(leadership)
    }

    /// Who leads now: the term and value of the leader whose lease runs, if any. A new leader
    /// is seen from the moment its [`campaign`](Self::campaign) wrote its value.
    ///
    /// # Errors
    ///
    /// [`Error::Pool`] or [`Error::Redis`] if Redis cannot be reached;
    /// [`Error::WrongType`] or [`Error::Layout`] if the name's keys hold other data, or the
    /// name is in use as another primitive.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// let who = client.election("jobs")?.leader().await?.map(|l| l.value);
    /// # Ok(()) }
    /// ```
    pub async fn leader(&self) -> Result<Option<Leader>> {
        Ok(leader_of(&read(&self.engine).await?))
    }

    /// A stream of the election's changes, pushed on its channel: first who leads now, then
    /// each new leader, each new value, and `None` when nobody leads (a resignation, a lease
    /// that ran out, a new leader that has not written its value yet). Changes come in the
    /// order they happened, each within about one round trip; a stream read too slowly for its
    /// buffer (256 messages) skips to the present (the changes it missed are not shown, and
    /// nothing older than what it shows comes after).
    ///
    /// A leader that dies without resigning publishes nothing: the stream reads the election
    /// again when that leader's lease would end, as Redis says (a read when a new leader's
    /// record arrives learns it, whatever lease this handle has; then one read per lease while
    /// the leader lives), and shows the next leader as soon as it writes its value.
    ///
    /// # Errors
    ///
    /// As [`leader`](Self::leader), and [`Error::Unsubscribed`] if the channel cannot be
    /// subscribed within the election's lease. Once running, the stream ends with an
    /// [`Error::Unsubscribed`] item if the subscription is lost (changes could be missed from
    /// then on: observe again), or with the error of a read that fails.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future unsubscribes (after a short linger). Reading the
    /// stream is cancel safe too: a change is taken only when an item is returned.
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// use futures_util::StreamExt;
    ///
    /// let mut changes = client.election("jobs")?.observe().await?;
    /// while let Some(change) = changes.next().await {
    ///     match change? {
    ///         Some(leader) => println!("term {}: {}", leader.term, leader.value),
    ///         None => println!("no leader"),
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn observe(&self) -> Result<LeaderStream> {
        let mut watch = self.engine.core.notifier.watch(&self.engine.keys.wake);
        let unsubscribed = || Error::Unsubscribed {
            name: self.engine.name.to_string(),
        };
        if !tokio::time::timeout(self.engine.lease, watch.active())
            .await
            .unwrap_or(false)
        {
            return Err(unsubscribed());
        }
        let reading = read(&self.engine).await?;
        let mut observer = Observer {
            engine: self.engine.clone(),
            watch,
            version: (0, 0),
            shown: None,
            timer: None,
            out: VecDeque::new(),
            ended: false,
        };
        observer.apply(reading);
        // The first item is the present, whatever it is.
        if observer.out.is_empty() {
            observer.out.push_back(Ok(None));
        }
        Ok(LeaderStream {
            inner: Box::pin(futures_util::stream::unfold(
                observer,
                |mut observer| async move { observer.step().await.map(|item| (item, observer)) },
            )),
        })
    }
}

async fn read(engine: &Engine) -> Result<Reading> {
    engine
        .core
        .backend
        .run(&ReadLeader { keys: &engine.keys })
        .await
}

fn leader_of(reading: &Reading) -> Option<Leader> {
    reading.leader.as_ref().map(|(value, _)| Leader {
        term: reading.version.0,
        value: value.clone(),
    })
}

/// The leadership of an election, won by [`Election::campaign`]: the leader's term, its value,
/// and its lease, renewed by the watchdog while it is held.
///
/// # Drop
///
/// Dropping it resigns in the background (on a tokio runtime; else the hold is released by
/// the client's background queue): observers are told (tried again after a connection error,
/// until the lease would end), and the next candidate leads.
#[must_use = "if unused the leadership is resigned at once"]
pub struct Leadership {
    /// `None` once resigned.
    guard: Option<MutexGuard>,
    engine: Engine,
    value: String,
}

impl fmt::Debug for Leadership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leadership")
            .field("name", &self.engine.name)
            .field("term", &self.term())
            .field("value", &self.value)
            .field("held", &self.is_held())
            .finish()
    }
}

impl Leadership {
    fn guard(&self) -> Result<&MutexGuard> {
        self.guard.as_ref().ok_or_else(|| Error::NotHeld {
            name: self.engine.name.to_string(),
        })
    }

    /// The election's name.
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// let leadership = client.election("jobs")?.campaign("me").await?;
    /// assert_eq!(leadership.name(), "jobs");
    /// # Ok(()) }
    /// ```
    pub fn name(&self) -> &str {
        &self.engine.name
    }

    /// The leader's term: the leadership's fencing token, strictly rising with every new
    /// leader of this election. Send it with every write the leader makes, and have the
    /// resource refuse a term below the highest it has seen.
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// let leadership = client.election("jobs")?.campaign("me").await?;
    /// println!("leading in term {}", leadership.term());
    /// # Ok(()) }
    /// ```
    pub fn term(&self) -> u64 {
        self.guard.as_ref().map_or(0, MutexGuard::fencing_token)
    }

    /// The value this leader proclaimed last.
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// let leadership = client.election("jobs")?.campaign("me").await?;
    /// assert_eq!(leadership.value(), "me");
    /// # Ok(()) }
    /// ```
    pub fn value(&self) -> &str {
        &self.value
    }

    /// True while the leadership's lease is known to run (see
    /// [`MutexGuard::is_held`](crate::MutexGuard::is_held)).
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// let leadership = client.election("jobs")?.campaign("me").await?;
    /// assert!(leadership.is_held());
    /// # Ok(()) }
    /// ```
    pub fn is_held(&self) -> bool {
        self.guard.as_ref().is_some_and(MutexGuard::is_held)
    }

    /// Until when the leadership's lease is known to run, as this process measures it (see
    /// [`MutexGuard::valid_until`](crate::MutexGuard::valid_until)); now, once resigned.
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// let leadership = client.election("jobs")?.campaign("me").await?;
    /// let left = leadership.valid_until().saturating_duration_since(std::time::Instant::now());
    /// # Ok(()) }
    /// ```
    pub fn valid_until(&self) -> std::time::Instant {
        self.guard
            .as_ref()
            .map_or_else(std::time::Instant::now, MutexGuard::valid_until)
    }

    /// Completes when the leadership is known lost (its lease could not be renewed in time,
    /// or another took it): stop acting as the leader at once.
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// let leadership = client.election("jobs")?.campaign("me").await?;
    /// leadership.lost().await;
    /// eprintln!("no longer the leader");
    /// # Ok(()) }
    /// ```
    pub fn lost(&self) -> Lost {
        match &self.guard {
            Some(guard) => guard.lost(),
            None => Lost::ended(),
        }
    }

    /// Writes a new value for this leader, which observers see next.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if `value` is longer than [`MAX_LEADER_VALUE`];
    /// [`Error::NotHeld`] if this leadership is over (its lease ran out, or it was lost, or
    /// Redis no longer holds it: it is then lost from this call on, and
    /// [`lost`](Self::lost) completes); [`Error::Pool`] or [`Error::Redis`] if Redis cannot be
    /// reached.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may leave the new value written or not; [`value`](Self::value)
    /// keeps the old one until an answer says it was written.
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// let mut leadership = client.election("jobs")?.campaign("starting").await?;
    /// leadership.proclaim("serving").await?;
    /// # Ok(()) }
    /// ```
    pub async fn proclaim(&mut self, value: impl Into<String>) -> Result<()> {
        let value = value.into();
        check_value(&value)?;
        let guard = self.guard()?;
        if !guard.is_held() {
            // Lost (or its lease ran out) here: Redis may hold it still, for up to a lease, but
            // a leader told to stop must not write a value every observer would take for its.
            return Err(Error::NotHeld {
                name: self.engine.name.to_string(),
            });
        }
        let written = write_record(&self.engine, guard, Some(&value)).await?;
        match written {
            Some(_) => {
                self.value = value;
                Ok(())
            }
            None => {
                // Deposed: the leadership is lost now, not at its next renewal.
                guard.mark_lost();
                Err(Error::NotHeld {
                    name: self.engine.name.to_string(),
                })
            }
        }
    }

    /// Steps down: observers are told that nobody leads, and the next candidate in the queue
    /// becomes the leader.
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`] if the leadership was already over (its lease ran out, or it was
    /// lost); [`Error::Pool`] or [`Error::Redis`] if Redis cannot be reached (the lease then
    /// runs out by itself). The resignation is tried again after a connection error, with
    /// backoff, until the lease would end, as a dropped leadership's is.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: whatever the future had not done when dropped is done in the background.
    ///
    /// ```no_run
    /// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
    /// let leadership = client.election("jobs")?.campaign("me").await?;
    /// leadership.resign().await?;
    /// # Ok(()) }
    /// ```
    pub async fn resign(mut self) -> Result<()> {
        let Some(guard) = &self.guard else {
            return Ok(());
        };
        // A leadership already lost still steps down below (Redis may hold it for up to a
        // lease), and says it was over.
        let was_held = guard.is_held();
        // The guard stays in the leadership until the record is written: dropped before, the
        // leadership resigns in the background (its `Drop`), as if never asked.
        let told = resign_record(&self.engine, guard).await;
        let Some(guard) = self.guard.take() else {
            return told;
        };
        // In a task of its own: the guard's lease is no longer renewed once its release
        // begins, so a release dropped before it was sent (this future cancelled while a
        // connection is made) would leave the name taken, with nobody leading, for the rest of
        // the lease.
        let unlocked = tokio::spawn(guard.unlock()).await.unwrap_or_else(|_| {
            Err(Error::Protocol {
                script: "mutex_release",
                detail: "the release task stopped without an answer".into(),
            })
        });
        let done = told.and(unlocked);
        if !was_held && done.is_ok() {
            return Err(Error::NotHeld {
                name: self.engine.name.to_string(),
            });
        }
        done
    }
}

/// Writes the record of `guard`'s leadership and publishes it: its `value`, or on resign
/// none. `None` if it does not lead with that term any more.
async fn write_record(
    engine: &Engine,
    guard: &MutexGuard,
    value: Option<&str>,
) -> Result<Option<u64>> {
    engine
        .core
        .backend
        .run(&Proclaim {
            keys: &engine.keys,
            owner: &guard.owner_field(),
            term: guard.fencing_token(),
            value,
        })
        .await
}

impl Drop for Leadership {
    fn drop(&mut self) {
        let Some(guard) = self.guard.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // The guard's own drop releases through the client's background queue.
            return;
        };
        let engine = self.engine.clone();
        runtime.spawn(async move {
            let _ = resign_record(&engine, &guard).await;
            drop(guard);
        });
    }
}

/// Writes and publishes the resignation of `guard`'s leadership, told again after a connection
/// error (as the release queue tries a release) until the leadership's lease would end anyway:
/// observers then read the election again.
async fn resign_record(engine: &Engine, guard: &MutexGuard) -> Result<()> {
    let mut retry = Retry::until(Instant::from_std(guard.valid_until()));
    loop {
        match write_record(engine, guard, None).await {
            Err(err) if err.is_connection() && retry.fits() => retry.pause().await,
            told => return told.map(drop),
        }
    }
}

/// The changes of an election, made by [`Election::observe`]: `Ok(Some(leader))` for a new
/// leader or value, `Ok(None)` when nobody leads, and a last `Err` if the stream cannot go on.
///
/// ```no_run
/// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
/// use futures_util::StreamExt;
///
/// let mut changes: redlatch::LeaderStream = client.election("jobs")?.observe().await?;
/// let now = changes.next().await;
/// # Ok(()) }
/// ```
pub struct LeaderStream {
    inner: BoxStream<'static, Result<Option<Leader>>>,
}

impl fmt::Debug for LeaderStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaderStream").finish_non_exhaustive()
    }
}

impl Stream for LeaderStream {
    type Item = Result<Option<Leader>>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.as_mut().poll_next(cx)
    }
}

/// The state behind a [`LeaderStream`]. Every record carries its version (term, then sequence
/// within the term), so a message or read older than what was shown is passed over. Records
/// come by message; a dropped message or the shown leader's lease end (a leader that died
/// publishes nothing) makes it read afresh.
struct Observer {
    engine: Engine,
    watch: Watch,
    version: Version,
    shown: Option<Leader>,
    /// When the shown leader's lease ends, unless renewed: read again then.
    timer: Option<Instant>,
    out: VecDeque<Result<Option<Leader>>>,
    ended: bool,
}

impl Observer {
    async fn step(&mut self) -> Option<Result<Option<Leader>>> {
        loop {
            if let Some(item) = self.out.pop_front() {
                return Some(item);
            }
            if self.ended {
                return None;
            }
            let heard = match self.timer {
                Some(at) => tokio::select! {
                    heard = self.watch.next() => Some(heard),
                    () = tokio::time::sleep_until(at) => None,
                },
                None => Some(self.watch.next().await),
            };
            // Only a read can tell what a dropped message or the leader's lease end changed.
            let stale = match heard {
                Some(Heard::Message(payload)) => {
                    self.heard(&payload);
                    false
                }
                Some(Heard::Lagged) | None => true,
                Some(Heard::Down) => {
                    self.end(Error::Unsubscribed {
                        name: self.engine.name.to_string(),
                    });
                    false
                }
            };
            if stale {
                self.timer = None;
                match read(&self.engine).await {
                    Ok(reading) => {
                        self.catch_up(&reading).await;
                        self.apply(reading);
                    }
                    Err(e) => self.end(e),
                }
            }
        }
    }

    /// A read can be ahead of the messages still on their way: it saw a record whose message
    /// has not arrived. Those messages are waited for (briefly), so that every change is shown,
    /// in order, before the read's.
    async fn catch_up(&mut self, reading: &Reading) {
        if reading.leader.is_none() {
            return;
        }
        let deadline = after(Instant::now(), CATCH_UP);
        while self.version < reading.version && !self.ended {
            tokio::select! {
                heard = self.watch.next() => match heard {
                    Heard::Message(payload) => self.heard(&payload),
                    Heard::Lagged => return,
                    Heard::Down => self.end(Error::Unsubscribed {
                        name: self.engine.name.to_string(),
                    }),
                },
                () = tokio::time::sleep_until(deadline) => return,
            }
        }
    }

    fn end(&mut self, error: Error) {
        self.out.push_back(Err(error));
        self.ended = true;
    }

    fn show(&mut self, now: Option<Leader>) {
        if self.shown != now {
            self.shown.clone_from(&now);
            self.out.push_back(Ok(now));
        }
    }

    fn heard(&mut self, payload: &[u8]) {
        match wake::parse(payload) {
            Wake::Leader { term, seq, value } => {
                if (term, seq) > self.version {
                    let new_term = term > self.version.0;
                    self.version = (term, seq);
                    let now = value.map(|value| Leader {
                        term,
                        value: value.to_owned(),
                    });
                    // A new leader's lease is its own, not this observer's: a read soon after
                    // its record learns when it ends (and sets the timer there); a new value
                    // of the same leader keeps the timer a read set.
                    self.timer = match (&now, self.timer) {
                        (None, _) => None,
                        (Some(_), Some(at)) if !new_term => Some(at),
                        (Some(_), _) => Some(after(Instant::now(), LATE)),
                    };
                    self.show(now);
                }
            }
            // A hand-over: the new leader's record follows when it has written its value.
            Wake::Count(_) | Wake::Named(_) => {}
        }
    }

    fn apply(&mut self, reading: Reading) {
        if self.ended {
            return;
        }
        let now = leader_of(&reading);
        match &reading.leader {
            Some((_, left)) => {
                // The lease left comes from Redis: saturated, never an overflow.
                self.timer = Some(after(Instant::now(), left.saturating_add(LATE)));
                if reading.version >= self.version {
                    self.version = reading.version;
                    self.show(now);
                }
            }
            None => {
                self.timer = None;
                // The name is idle, whatever was shown before: (0, 0), or every record of the
                // terms up to its last token is past, and a message of them still on its way
                // is passed over (a leader that spoke and resigned since the last message
                // shown, or messages dropped from a full buffer).
                let idle = reading.version == (0, 0) || reading.version.1 == u64::MAX;
                if idle || reading.version >= self.version {
                    self.version = self.version.max(reading.version);
                    self.show(None);
                }
            }
        }
    }
}

/// How long after a leader's lease end an observer reads again: past the server's expiry.
const LATE: Duration = Duration::from_millis(5);

/// How long a read that is ahead of the messages waits for them.
const CATCH_UP: Duration = Duration::from_millis(100);
