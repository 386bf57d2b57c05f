//! The protocol: what each script takes and answers, typed. Each operation is a
//! [`Request`](crate::backend::Request) that the backend carries: its script call (keys and
//! arguments in the order the script's header gives) and the decoding of its reply into typed
//! answers and errors. The layers above never see a raw reply or a script argument.
//!
//! * [`mutex`]: the plain mutex's acquire, release and batched extend;
//! * [`queue`]: the queued primitives' (fair mutex, semaphore, read-write lock), and the queue
//!   member and waiter id formats;
//! * [`election`]: the leader's record of an election (whose hold is the queue scripts');
//! * [`take`]: the acquisition of an idle name in plain commands, without a script;
//! * [`admin`]: `inspect` and `force_unlock`;
//! * [`wake`]: the grammar of the messages releases publish on a name's channel.
//!
//! The scripts themselves are in `lua/v1/` ([`scripts`] embeds and pins them); their contracts
//! are in `lua/README.md`.

pub(crate) mod admin;
pub(crate) mod election;
pub(crate) mod mutex;
pub(crate) mod queue;
mod reply;
mod scripts;
pub(crate) mod take;
pub(crate) mod wake;

use std::time::Duration;

pub(crate) use reply::foreign;
pub(crate) use scripts::all as scripts;

/// The layout tag that starts the string of a held plain mutex (`lua/v1/mutex_lib.lua`).
pub(crate) const MUTEX_LAYOUT: &str = "mutex:2";
/// The layout tags the queue scripts store in the `~layout` field of the meta hash.
pub(crate) const FAIR_LAYOUT: &str = "fair:1";
pub(crate) const SEMAPHORE_LAYOUT: &str = "semaphore:1";
pub(crate) const RWLOCK_LAYOUT: &str = "rwlock:1";
pub(crate) const ELECTION_LAYOUT: &str = "election:1";

/// What a name is used as, and so which scripts and layout serve it. Each stores its own layout
/// tag, so one name cannot be used as two kinds at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Family {
    /// The plain mutex: the `mutex_*` scripts.
    Mutex,
    /// The queued primitives: the `queue_*` scripts.
    Fair,
    Semaphore,
    RwLock,
    /// A leader election: a fair mutex's queue and hold under a tag of its own, with the
    /// leader's record beside them (the `elect_*` scripts).
    Election,
}

impl Family {
    /// The primitive's kind as the metrics label it (`kind`).
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Mutex => "mutex",
            Self::Fair => "fair_mutex",
            Self::Semaphore => "semaphore",
            Self::RwLock => "rwlock",
            Self::Election => "election",
        }
    }

    pub(crate) fn layout(self) -> &'static str {
        match self {
            Self::Mutex => MUTEX_LAYOUT,
            Self::Fair => FAIR_LAYOUT,
            Self::Semaphore => SEMAPHORE_LAYOUT,
            Self::RwLock => RWLOCK_LAYOUT,
            Self::Election => ELECTION_LAYOUT,
        }
    }

    /// What it is called in the public API, for error messages.
    pub(crate) fn what(self) -> &'static str {
        match self {
            Self::Mutex => "Mutex",
            Self::Fair => "FairMutex",
            Self::Semaphore => "Semaphore",
            Self::RwLock => "RwLock",
            Self::Election => "Election",
        }
    }

    /// Its waiters queue in Redis (everything but the plain mutex).
    pub(crate) fn is_queued(self) -> bool {
        self != Self::Mutex
    }
}

/// What a hold is: the `op` argument of the queue scripts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    /// A mutex's or fair mutex's only mode.
    Exclusive,
    Read,
    Write,
    /// One permit id holding one or more permits.
    Permits,
    /// Not a hold: a waiter's place in the queue. `fresh` when the owner was made for this
    /// wait: leaving then also gives back a hold that a hand-over may already have given it.
    Waiting {
        fresh: bool,
    },
}

impl Op {
    pub(crate) fn code(self) -> &'static str {
        match self {
            Self::Exclusive => "x",
            Self::Read => "r",
            Self::Write => "w",
            Self::Permits => "s",
            Self::Waiting { fresh: false } => "q",
            Self::Waiting { fresh: true } => "Q",
        }
    }

    /// The exclusive hold of its name (whose lease is the meta hash's `~wexp`), as opposed to
    /// shared holds (read holds, permits: leases in the holders set).
    pub(crate) fn is_exclusive(self) -> bool {
        matches!(self, Self::Exclusive | Self::Write)
    }

    /// A hold, not a waiter's place.
    pub(crate) fn is_hold(self) -> bool {
        !matches!(self, Self::Waiting { .. })
    }
}

/// How an attempt claims the lock for its owner (the scripts' `claim` argument).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Claim {
    /// The owner token was made for this call. If Redis says it already holds, an earlier
    /// attempt was granted and its answer lost: that hold is returned as is, not added to.
    New,
    /// A token the caller carried: join the owner's holds, or acquire.
    As,
    /// Re-entry only: add a hold if the owner still holds, else report busy.
    Again,
    /// A waiter that queued earlier asks again (its timer ran out, or it missed its message):
    /// as [`New`](Self::New), and it keeps its place. `fresh` when the owner was made for this
    /// wait (the wait began with `New`); a carried owner's (`queued-as`) takes a hold it finds
    /// as handed to it only while the hold is marked with its client.
    Queued { fresh: bool },
}

impl Claim {
    /// Whether an acquisition with this claim may run twice with the effect of once: a fresh
    /// owner's second run finds its hold and returns it. A carried owner's would add a hold.
    pub(crate) fn repeats_safely(self) -> bool {
        matches!(self, Self::New | Self::Queued { fresh: true })
    }

    pub(crate) fn code(self) -> &'static str {
        match self {
            Self::New => "new",
            Self::As => "as",
            Self::Again => "again",
            Self::Queued { fresh: true } => "queued",
            Self::Queued { fresh: false } => "queued-as",
        }
    }

    /// The owner was made for this acquisition: whatever it holds, this acquisition got, and
    /// may be given back blindly.
    pub(crate) fn is_fresh(self) -> bool {
        matches!(self, Self::New | Self::Queued { fresh: true })
    }
}

/// The answer to an acquisition attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answer {
    /// Acquired, with this fencing token (0 for read holds), the server clock in µs when the
    /// script read it (the mutex's acquisition without a floor or with a new counter; every
    /// grant of the queue scripts), and the last token of the block the grant took (`fence`
    /// itself, or more for a plain mutex's local hand-off: see `mutex::Acquire::tokens`).
    Granted {
        fence: u64,
        clock: Option<u64>,
        last: u64,
    },
    /// Not now: nothing changes without a wake-up message for `wait` (until the holder's lease
    /// ends, or the earliest lease end; `None`: unknown or never). `ticket` when the attempt
    /// left (or kept) the owner waiting in the name's queue: its place's ticket, which a
    /// hand-over message for that place carries. `last`: the last fencing token issued at the
    /// name, when the answer tells it (a plain mutex's), which the attempt after the release
    /// proposes a token above.
    Busy {
        wait: Option<Duration>,
        ticket: Option<u64>,
        last: Option<u64>,
    },
}

/// A duration in ms from a script, where negative means none.
fn ms(value: i64) -> Option<Duration> {
    u64::try_from(value).ok().map(Duration::from_millis)
}
