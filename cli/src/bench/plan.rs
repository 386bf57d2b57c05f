//! How long and how much a run measures (full or quick), and the configurations it measures.

use std::time::Duration;

use super::library::Entry;

/// How long and how much: full or quick.
#[derive(Debug, Clone)]
pub struct Plan {
    /// `full` or `quick`.
    pub mode: &'static str,
    /// Rounds over every configuration; figures are the medians.
    pub repetitions: usize,
    /// How long a throughput figure is measured.
    pub phase: Duration,
    /// How long contended runs go before they are measured.
    pub warm_up: Duration,
    /// Task counts of the uncontended scenario (and the raw reference).
    pub uncontended_tasks: Vec<usize>,
    /// Task counts of the contended scenarios.
    pub contended_tasks: Vec<usize>,
    /// Hand-off samples per library.
    pub handoff_samples: u64,
    /// The time limit on taking them.
    pub handoff_limit: Duration,
    /// The holder holds 1 ms to this many ms (at random) once the waiter is blocked.
    pub handoff_hold_ms: u64,
    /// Blocked waiters of the idle scenario.
    pub idle_waiters: usize,
    /// How long their requests are counted.
    pub idle_window: Duration,
    /// Guards of the watchdog scenario.
    pub watchdog_guards: usize,
    /// Their lease.
    pub watchdog_lease: Duration,
    /// How long renewals are counted.
    pub watchdog_window: Duration,
}

/// The longest hand-off hold `--handoff-hold-ms` takes: a minute.
pub(crate) const MAX_HOLD_MS: u64 = 60_000;

/// `--handoff-hold-ms`: a whole number of ms, from 2 (holds are drawn from 1 ms up to it) to
/// 60,000 (a minute).
pub fn parse_hold_ms(value: &str) -> Result<u64, String> {
    let ms: u64 = value
        .parse()
        .map_err(|_| format!("`{value}` is not a whole number of milliseconds"))?;
    if ms < 2 {
        return Err(format!(
            "{ms} ms is too short: holds are drawn from 1 ms up to (not including) this value, \
             so it must be 2 or more"
        ));
    }
    if ms > MAX_HOLD_MS {
        return Err(format!(
            "{ms} ms is too long: a hand-off's hold is at most {MAX_HOLD_MS} ms (a minute)"
        ));
    }
    Ok(ms)
}

impl Plan {
    /// About 15 minutes with the peers. The watchdog window is 30 s at the default 30 s lease:
    /// three renewal periods (one every 10 s).
    pub fn full() -> Self {
        Self {
            mode: "full",
            repetitions: 3,
            phase: Duration::from_secs(2),
            warm_up: Duration::from_millis(300),
            uncontended_tasks: vec![1, 8, 32, 128],
            contended_tasks: vec![2, 4, 16, 64],
            handoff_samples: 300,
            handoff_limit: Duration::from_secs(25),
            handoff_hold_ms: 5,
            idle_waiters: 16,
            idle_window: Duration::from_secs(10),
            watchdog_guards: 10_000,
            watchdog_lease: redlatch::DEFAULT_LEASE,
            watchdog_window: Duration::from_secs(30),
        }
    }

    /// Under 2 minutes with the peers: one repetition, short phases, fewer task counts, and a
    /// 3 s lease for the watchdog so renewals happen within the window.
    pub fn quick() -> Self {
        Self {
            mode: "quick",
            repetitions: 1,
            phase: Duration::from_millis(500),
            warm_up: Duration::from_millis(200),
            uncontended_tasks: vec![1, 32],
            contended_tasks: vec![16],
            handoff_samples: 40,
            handoff_limit: Duration::from_secs(4),
            handoff_hold_ms: 5,
            idle_waiters: 16,
            idle_window: Duration::from_secs(2),
            watchdog_guards: 2_000,
            watchdog_lease: Duration::from_secs(3),
            watchdog_window: Duration::from_secs(3),
        }
    }

    /// The quick plan or the full one, with hand-off holds of `handoff_hold_ms` at most.
    pub fn new(quick: bool, handoff_hold_ms: u64) -> Self {
        let mut plan = if quick { Self::quick() } else { Self::full() };
        plan.handoff_hold_ms = handoff_hold_ms;
        plan
    }
}

/// One measured configuration: a scenario, a library where it has one, and its task count and
/// critical section.
#[derive(Clone, Copy)]
pub(crate) enum Job<'a> {
    /// The raw scripts with this many tasks.
    Raw(usize),
    /// The minimal lock (`SET NX PX` and a compare-and-delete) with this many tasks.
    Minimal(usize),
    Uncontended(&'a Entry, usize),
    /// The publish relay (the floor of a chain of hand-overs) around this many clients.
    Relay(usize),
    Handoff(&'a Entry),
    /// Tasks over clients, with a critical section.
    Contended(&'a Entry, usize, usize, Duration),
    /// Tasks of one client looping on one name, and a waiter in another client.
    RemoteWaiter(&'a Entry, usize),
    Idle(&'a Entry),
    Semaphore,
    Watchdog,
    /// One task's acquire + release latency.
    Latency(&'a Entry),
    /// Tasks of one client on one name of the cluster.
    ClusterContended(&'a Entry, usize),
    /// One task's acquire latency over the Redlock scenario's servers.
    Redlock(&'a super::RedlockRow),
    /// One row of the replicas scenario.
    Replicas(super::replicas::ReplicasRow),
}

impl Job<'_> {
    pub(crate) fn label(&self, plan: &Plan) -> String {
        match self {
            Job::Raw(tasks) => format!("the mutex's requests by hand x{tasks}"),
            Job::Minimal(tasks) => {
                format!("minimal lock (SET NX PX + compare-and-delete) x{tasks}")
            }
            Job::Uncontended(e, tasks) => format!("uncontended: {} x{tasks}", e.name),
            Job::Relay(clients) => format!("publish relay around {clients} clients"),
            Job::Handoff(e) => format!("hand-off: {}", e.name),
            Job::Contended(e, tasks, clients, cs) => format!(
                "contended: {} x{tasks} over {clients} client(s), {} ms critical section",
                e.name,
                cs.as_millis()
            ),
            Job::RemoteWaiter(e, tasks) => {
                format!(
                    "remote waiter: {} x{tasks} and one in another client",
                    e.name
                )
            }
            Job::Idle(e) => format!("idle waiters: {}", e.name),
            Job::Semaphore => "semaphore: 8 permits, 64 tasks".to_owned(),
            Job::Watchdog => format!("watchdog: {} guards", plan.watchdog_guards),
            Job::Latency(e) => format!("latency: {}", e.name),
            Job::ClusterContended(e, tasks) => format!("contended: {} x{tasks}", e.name),
            Job::Redlock(row) => format!("redlock acquire: {}", row.entry.name),
            Job::Replicas(row) => format!("replicas: {}", row.name()),
        }
    }
}
