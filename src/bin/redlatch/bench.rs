//! The contention benchmark, shared by `redlatch bench` and `cargo bench --bench contention`
//! (which adds the Rust peers): the scenarios, the libraries they run, the figures they take,
//! and the table, JSON and chart they write.
//!
//! Every figure is the median of the repetitions (3 in full mode), taken figure by figure. The
//! repetitions are rounds over every configuration, so a drift of the machine's speed over
//! minutes falls on every library alike. The raw reference (redlatch's two mutex scripts by
//! `EVALSHA`, no library logic) is measured at every task count of the uncontended scenario,
//! and each uncontended figure is compared with the raw one of the same task count.
//! Requests are counted with `INFO commandstats`: every command clients sent, leaving out the
//! commands a library's scripts run inside Redis and the measurement's own `INFO`.
#![allow(dead_code, unreachable_pub)]

use std::error::Error;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use deadpool_redis::{Config, Runtime};
use indicatif::{ProgressBar, ProgressStyle};
use redis::aio::MultiplexedConnection;
use redlatch::LockClient;
use serde_json::{Value, json};

#[path = "measure.rs"]
mod measure;
pub use measure::{
    AnyResult, BoxFut, Contend, LUA, cleanup, commandstats, contended_run, cpu_steal,
    given_server_note, handoff_run, loop_tasks, process_cpu, raw_cycles, requests, script_commands,
};

// ---------------------------------------------------------------------------------------------
// Libraries
// ---------------------------------------------------------------------------------------------

/// A lock library, as one client (a stand-in for one process) sees it.
pub trait Library: Send + Sync {
    /// A handle on the lock `name` for one task. `lease` overrides the library's default (and
    /// its renewal, where it has one) for holders that must stay quiet.
    fn contender<'a>(
        &'a self,
        name: &'a str,
        lease: Option<Duration>,
    ) -> BoxFut<'a, AnyResult<Box<dyn Contender>>>;
}

/// One task's handle on one lock.
pub trait Contender: Send + Sync {
    /// Waits for the lock as the library waits by default.
    fn lock(&self) -> BoxFut<'_, AnyResult<Box<dyn Hold>>>;
}

/// A held lock.
pub trait Hold: Send {
    /// Releases it and waits for the answer.
    fn release(self: Box<Self>) -> BoxFut<'static, AnyResult<()>>;
}

/// Makes a new client of a library: a stand-in for another process.
pub type Connect = Arc<dyn Fn() -> BoxFut<'static, AnyResult<Arc<dyn Library>>> + Send + Sync>;

/// One library configuration under test.
#[derive(Clone)]
pub struct Entry {
    /// Its name in the JSON (`library`).
    pub name: &'static str,
    pub connect: Connect,
    /// Commands its scripts run inside Redis: not requests of their own.
    pub script_commands: Vec<String>,
    /// Key namespaces it writes to besides `{prefix}:` (keys `{namespace}:...`), deleted with
    /// the bench's own keys at the end of a run.
    pub namespaces: Vec<String>,
}

/// Which redlatch primitive an entry runs.
#[derive(Debug, Clone, Copy)]
pub enum Primitive {
    Mutex,
    Fair,
    /// A semaphore of this many permits; each acquisition takes one.
    Semaphore(u32),
}

struct Redlatch {
    client: LockClient,
    primitive: Primitive,
}

/// A redlatch client on its own pool.
pub fn redlatch_client(url: &str, prefix: &str) -> AnyResult<LockClient> {
    let mut config = Config::from_url(url);
    config.pool = Some(deadpool_redis::PoolConfig::new(64));
    let pool = config.create_pool(Some(Runtime::Tokio1))?;
    Ok(LockClient::builder(pool, url).key_prefix(prefix).build()?)
}

/// A redlatch primitive as a benchmark entry.
pub fn redlatch_entry(name: &'static str, url: &str, prefix: &str, primitive: Primitive) -> Entry {
    let (url, prefix) = (url.to_owned(), prefix.to_owned());
    Entry {
        name,
        connect: Arc::new(move || {
            let (url, prefix) = (url.clone(), prefix.clone());
            Box::pin(async move {
                let client = redlatch_client(&url, &prefix)?;
                Ok(Arc::new(Redlatch { client, primitive }) as Arc<dyn Library>)
            })
        }),
        script_commands: script_commands(LUA),
        namespaces: Vec::new(),
    }
}

/// redlatch's entries: the mutex, the fair mutex and a semaphore of one permit.
pub fn redlatch_entries(url: &str, prefix: &str) -> Vec<Entry> {
    vec![
        redlatch_entry("redlatch-mutex", url, prefix, Primitive::Mutex),
        redlatch_entry("redlatch-fair", url, prefix, Primitive::Fair),
        redlatch_entry("redlatch-semaphore", url, prefix, Primitive::Semaphore(1)),
    ]
}

enum RedlatchHandle {
    Mutex(redlatch::Mutex),
    Fair(redlatch::FairMutex),
    Semaphore(redlatch::Semaphore),
}

impl Library for Redlatch {
    fn contender<'a>(
        &'a self,
        name: &'a str,
        lease: Option<Duration>,
    ) -> BoxFut<'a, AnyResult<Box<dyn Contender>>> {
        Box::pin(async move {
            let handle = match (self.primitive, lease) {
                (Primitive::Mutex, None) => RedlatchHandle::Mutex(self.client.mutex(name)?),
                (Primitive::Mutex, Some(l)) => {
                    RedlatchHandle::Mutex(self.client.mutex(name)?.with_lease(l)?)
                }
                (Primitive::Fair, None) => RedlatchHandle::Fair(self.client.fair_mutex(name)?),
                (Primitive::Fair, Some(l)) => {
                    RedlatchHandle::Fair(self.client.fair_mutex(name)?.with_lease(l)?)
                }
                (Primitive::Semaphore(n), None) => {
                    RedlatchHandle::Semaphore(self.client.semaphore(name, n)?)
                }
                (Primitive::Semaphore(n), Some(l)) => {
                    RedlatchHandle::Semaphore(self.client.semaphore(name, n)?.with_lease(l)?)
                }
            };
            Ok(Box::new(handle) as Box<dyn Contender>)
        })
    }
}

impl Contender for RedlatchHandle {
    fn lock(&self) -> BoxFut<'_, AnyResult<Box<dyn Hold>>> {
        Box::pin(async move {
            Ok(match self {
                Self::Mutex(m) => Box::new(m.lock().await?) as Box<dyn Hold>,
                Self::Fair(m) => Box::new(m.lock().await?) as Box<dyn Hold>,
                Self::Semaphore(s) => Box::new(s.acquire().await?) as Box<dyn Hold>,
            })
        })
    }
}

impl Hold for redlatch::MutexGuard {
    fn release(self: Box<Self>) -> BoxFut<'static, AnyResult<()>> {
        Box::pin(async move { Ok(redlatch::MutexGuard::unlock(*self).await?) })
    }
}

impl Hold for redlatch::SemaphorePermit {
    fn release(self: Box<Self>) -> BoxFut<'static, AnyResult<()>> {
        Box::pin(async move { Ok(redlatch::SemaphorePermit::release(*self).await?) })
    }
}

// ---------------------------------------------------------------------------------------------
// Plan
// ---------------------------------------------------------------------------------------------

/// How long and how much: full or quick.
#[derive(Debug, Clone)]
pub struct Plan {
    pub mode: &'static str,
    pub repetitions: usize,
    pub phase: Duration,
    pub warm_up: Duration,
    pub uncontended_tasks: Vec<usize>,
    pub contended_tasks: Vec<usize>,
    pub handoff_samples: u64,
    pub handoff_limit: Duration,
    /// The holder holds 1 ms to this many ms (at random) once the waiter is blocked.
    pub handoff_hold_ms: u64,
    pub idle_waiters: usize,
    pub idle_window: Duration,
    pub watchdog_guards: usize,
    pub watchdog_lease: Duration,
    pub watchdog_window: Duration,
}

/// `--handoff-hold-ms`: a whole number of ms, at least 2 (holds are drawn from 1 ms up to it).
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
enum Job<'a> {
    /// The raw scripts with this many tasks.
    Raw(usize),
    Uncontended(&'a Entry, usize),
    Handoff(&'a Entry),
    Contended(&'a Entry, usize, Duration),
    Idle(&'a Entry),
    Semaphore,
    Watchdog,
}

impl Job<'_> {
    fn label(&self, plan: &Plan) -> String {
        match self {
            Job::Raw(tasks) => format!("raw EVALSHA pairs x{tasks}"),
            Job::Uncontended(e, tasks) => format!("uncontended: {} x{tasks}", e.name),
            Job::Handoff(e) => format!("hand-off: {}", e.name),
            Job::Contended(e, tasks, cs) => format!(
                "contended: {} x{tasks}, {} ms critical section",
                e.name,
                cs.as_millis()
            ),
            Job::Idle(e) => format!("idle waiters: {}", e.name),
            Job::Semaphore => "semaphore: 8 permits, 64 tasks".to_owned(),
            Job::Watchdog => format!("watchdog: {} guards", plan.watchdog_guards),
        }
    }
}

/// Everything a run needs.
pub struct Bench {
    pub url: String,
    pub prefix: String,
    pub plan: Plan,
    /// Entries that run scenarios 2 to 5.
    pub entries: Vec<Entry>,
    /// Entries that take part in the contended scenarios (the mutexes and the peers).
    pub contended: Vec<&'static str>,
    /// The directory for `contention.json` and `contention.svg`.
    pub out_dir: PathBuf,
    /// Whether the server is one the tool started for this run (`"server": "own"` in the JSON)
    /// or one it was given (`"given"`).
    pub own_server: bool,
}

/// One row of the results.
#[derive(Debug, Clone, Default)]
pub struct Record {
    pub scenario: &'static str,
    pub library: &'static str,
    pub tasks: usize,
    pub ops_per_s: f64,
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
    pub max_us: Option<f64>,
    pub max_wait_ms: Option<f64>,
    pub jain: Option<f64>,
    pub requests_per_acq: Option<f64>,
    pub retake_share: Option<f64>,
    pub critical_section_ms: Option<f64>,
    pub cpu_pct: Option<f64>,
    pub most_out: Option<f64>,
    pub mean_us: Option<f64>,
    pub hold_ms: Option<f64>,
    /// Hand-off: the latencies sampled.
    pub samples: Option<f64>,
    /// Watchdog: the guards' lease.
    pub lease_ms: Option<f64>,
    /// Uncontended: the figure over the raw scripts' at the same task count.
    pub of_raw: Option<f64>,
}

impl Record {
    fn json(&self) -> Value {
        json!({
            "scenario": self.scenario,
            "library": self.library,
            "tasks": self.tasks,
            "ops_per_s": self.ops_per_s,
            "p50_us": self.p50_us,
            "p99_us": self.p99_us,
            "max_us": self.max_us,
            "max_wait_ms": self.max_wait_ms,
            "jain": self.jain,
            "requests_per_acq": self.requests_per_acq,
            "retake_share": self.retake_share,
            "critical_section_ms": self.critical_section_ms,
            "cpu_pct": self.cpu_pct,
            "most_out": self.most_out,
            "mean_us": self.mean_us,
            "hold_ms": self.hold_ms,
            "samples": self.samples.map(|n| n.round() as u64),
            "lease_ms": self.lease_ms,
            "of_raw": self.of_raw,
        })
    }
}

/// The median, figure by figure, of repeated records of one configuration.
fn median_record(runs: Vec<Record>) -> Record {
    fn med(mut v: Vec<f64>) -> f64 {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    }
    fn med_opt(runs: &[Record], f: impl Fn(&Record) -> Option<f64>) -> Option<f64> {
        let v: Vec<f64> = runs.iter().filter_map(&f).collect();
        (!v.is_empty()).then(|| med(v))
    }
    let mut out = runs[0].clone();
    out.ops_per_s = med(runs.iter().map(|r| r.ops_per_s).collect());
    out.p50_us = med_opt(&runs, |r| r.p50_us);
    out.p99_us = med_opt(&runs, |r| r.p99_us);
    out.max_us = med_opt(&runs, |r| r.max_us);
    out.max_wait_ms = med_opt(&runs, |r| r.max_wait_ms);
    out.jain = med_opt(&runs, |r| r.jain);
    out.requests_per_acq = med_opt(&runs, |r| r.requests_per_acq);
    out.retake_share = med_opt(&runs, |r| r.retake_share);
    out.cpu_pct = med_opt(&runs, |r| r.cpu_pct);
    out.most_out = med_opt(&runs, |r| r.most_out);
    out.mean_us = med_opt(&runs, |r| r.mean_us);
    out.samples = med_opt(&runs, |r| r.samples);
    out
}

// ---------------------------------------------------------------------------------------------
// Running
// ---------------------------------------------------------------------------------------------

impl Bench {
    /// Every configuration, in the order of the table.
    fn jobs(&self) -> Vec<Job<'_>> {
        let plan = &self.plan;
        let mut jobs: Vec<Job<'_>> = plan
            .uncontended_tasks
            .iter()
            .map(|&t| Job::Raw(t))
            .collect();
        for entry in &self.entries {
            jobs.extend(
                plan.uncontended_tasks
                    .iter()
                    .map(|&t| Job::Uncontended(entry, t)),
            );
        }
        jobs.extend(self.entries.iter().map(Job::Handoff));
        for entry in self
            .entries
            .iter()
            .filter(|e| self.contended.contains(&e.name))
        {
            for &tasks in &plan.contended_tasks {
                for cs in [Duration::ZERO, Duration::from_millis(1)] {
                    jobs.push(Job::Contended(entry, tasks, cs));
                }
            }
        }
        jobs.extend(self.entries.iter().map(Job::Idle));
        jobs.extend([Job::Semaphore, Job::Watchdog]);
        jobs
    }

    /// Runs every scenario, prints the table and writes the JSON and the chart. The bench's keys
    /// are deleted at the end, also when a scenario failed.
    pub async fn run(&self) -> AnyResult<Value> {
        let mut conn = redis::Client::open(self.url.as_str())?
            .get_multiplexed_async_connection()
            .await?;
        let plan = &self.plan;
        let steal_before = cpu_steal();
        let started = Instant::now();
        let measured = self.measure_all(&mut conn).await;
        if let Err(err) = self.cleanup(&mut conn).await {
            eprintln!("warning: could not delete the bench's keys: {err}");
        }
        let mut records = measured?;

        // Uncontended figures over the raw ones of the same task count.
        let raw_at = |tasks: usize| {
            records
                .iter()
                .find(|r| r.scenario == "raw" && r.tasks == tasks)
                .map(|r| r.ops_per_s)
        };
        let of_raw: Vec<Option<f64>> = records
            .iter()
            .map(|r| {
                (r.scenario == "uncontended")
                    .then(|| raw_at(r.tasks))
                    .flatten()
                    .filter(|raw| *raw > 0.0)
                    .map(|raw| r.ops_per_s / raw)
            })
            .collect();
        for (r, ratio) in records.iter_mut().zip(of_raw) {
            r.of_raw = ratio;
        }
        // The headline raw figure: at 32 tasks, or the most tasks measured.
        let headline = records
            .iter()
            .filter(|r| r.scenario == "raw")
            .max_by_key(|r| (r.tasks == 32, r.tasks));
        let (raw_tasks, raw_cycles_per_s) = headline.map_or((0, 0.0), |r| (r.tasks, r.ops_per_s));

        let steal_pct = steal_before
            .zip(cpu_steal())
            .map(|((s0, t0), (s1, t1))| 100.0 * (s1 - s0) as f64 / (t1 - t0).max(1) as f64);
        let machine = machine(&mut conn).await;
        print_table(&records);
        println!(
            "{} mode, {:.0} s, {} server; raw EVALSHA acquire+release, {raw_tasks} tasks: \
             {raw_cycles_per_s:.0} cycles/s",
            plan.mode,
            started.elapsed().as_secs_f64(),
            if self.own_server { "own" } else { "given" },
        );
        if let Some(pct) = steal_pct {
            println!("CPU time the hypervisor took during the run (steal): {pct:.1}%");
        }
        let report = json!({
            "mode": plan.mode,
            "repetitions": plan.repetitions,
            "seconds": started.elapsed().as_secs_f64(),
            "server": if self.own_server { "own" } else { "given" },
            "raw_cycles_per_s": raw_cycles_per_s,
            "raw_tasks": raw_tasks,
            "steal_pct": steal_pct,
            "machine": machine,
            "records": records.iter().map(Record::json).collect::<Vec<_>>(),
        });
        std::fs::create_dir_all(&self.out_dir)?;
        let json_path = self.out_dir.join("contention.json");
        std::fs::write(&json_path, serde_json::to_string_pretty(&report)?)?;
        let svg_path = self.out_dir.join("contention.svg");
        chart(&records, &svg_path)?;
        println!("wrote {} and {}", json_path.display(), svg_path.display());
        Ok(report)
    }

    /// Every job, repetition by repetition; the median record of each configuration.
    async fn measure_all(&self, conn: &mut MultiplexedConnection) -> AnyResult<Vec<Record>> {
        let plan = &self.plan;
        let jobs = self.jobs();
        let bar = ProgressBar::new((plan.repetitions * jobs.len()) as u64);
        bar.set_style(ProgressStyle::with_template(
            "{spinner} [{bar:30}] {pos}/{len} {msg} {elapsed}",
        )?);
        bar.enable_steady_tick(Duration::from_millis(200));
        let semaphore_entry = redlatch_entry(
            "redlatch-semaphore",
            &self.url,
            &self.prefix,
            Primitive::Semaphore(8),
        );
        // Repetition by repetition over every job, so that a machine whose speed drifts over
        // minutes (a shared virtual machine) slows every library alike.
        let mut runs: Vec<Vec<Record>> = vec![Vec::new(); jobs.len()];
        for _ in 0..plan.repetitions {
            for (job, out) in jobs.iter().zip(&mut runs) {
                bar.set_message(job.label(plan));
                let record = match *job {
                    Job::Raw(tasks) => raw_cycles(&self.url, &self.prefix, tasks, plan.phase)
                        .await
                        .map(|ops_per_s| Record {
                            scenario: "raw",
                            library: "raw-evalsha",
                            tasks,
                            ops_per_s,
                            ..Record::default()
                        }),
                    Job::Uncontended(entry, tasks) => uncontended(entry, tasks, plan.phase).await,
                    Job::Handoff(entry) => handoff(entry, plan).await,
                    Job::Contended(entry, tasks, cs) => {
                        contended(entry, conn, tasks, cs, plan).await
                    }
                    Job::Idle(entry) => idle(entry, conn, plan).await,
                    Job::Semaphore => semaphore(&semaphore_entry, conn, 64, plan).await,
                    Job::Watchdog => watchdog(&self.url, &self.prefix, conn, plan).await,
                };
                let record = match record {
                    Ok(record) => record,
                    Err(err) => {
                        bar.finish_and_clear();
                        return Err(format!("{}: {err}", job.label(plan)).into());
                    }
                };
                out.push(record);
                bar.inc(1);
            }
        }
        bar.finish_and_clear();
        Ok(runs
            .into_iter()
            .filter(|r| !r.is_empty())
            .map(median_record)
            .collect())
    }

    /// Deletes every key of the run: the bench's prefix and the entries' other namespaces.
    async fn cleanup(&self, conn: &mut MultiplexedConnection) -> AnyResult<()> {
        cleanup(conn, &self.prefix).await?;
        let mut namespaces: Vec<&String> =
            self.entries.iter().flat_map(|e| &e.namespaces).collect();
        namespaces.sort();
        namespaces.dedup();
        for namespace in namespaces {
            cleanup(conn, namespace).await?;
        }
        Ok(())
    }
}

/// `tasks` tasks of one client, each on a name of its own: lock and release in a loop.
async fn uncontended(entry: &Entry, tasks: usize, phase: Duration) -> AnyResult<Record> {
    let lib = (entry.connect)().await?;
    let run = format!("u{}", fastrand::u32(..));
    let mut contenders = Vec::new();
    for t in 0..tasks {
        contenders.push(Arc::from(lib.contender(&format!("{run}-{t}"), None).await?));
    }
    let contenders: Arc<Vec<Arc<dyn Contender>>> = Arc::new(contenders);
    let ops = loop_tasks(tasks, phase, move |task| {
        let c = Arc::clone(&contenders[task]);
        Box::pin(async move { c.lock().await?.release().await })
    })
    .await?;
    Ok(Record {
        scenario: "uncontended",
        library: entry.name,
        tasks,
        ops_per_s: ops,
        ..Record::default()
    })
}

/// One holder and one waiter, in two clients, taking turns. The holder waits until the other
/// task is inside `lock()`, holds a random `hold` more (1 to 5 ms by default), and releases;
/// the sample is the time from the start of the release to the waiter's `lock()` returning.
/// The releaser asks again only after the other task has the lock, so every sample is a
/// hand-off to a different task that was already blocked.
///
/// With holds of a few ms, a waiter that polls at a fixed interval (distkit: 50 ms) is always
/// released just after its first attempt and waits almost a whole interval; holds spread over
/// more than the interval (`--handoff-hold-ms 100`) put the release at a random point of its
/// cycle instead, at the price of longer idle gaps, which on a virtual machine make every
/// wake-up slower.
async fn handoff(entry: &Entry, plan: &Plan) -> AnyResult<Record> {
    let hold_us = 1_000..plan.handoff_hold_ms.max(2) * 1_000;
    let name = format!("h{}", fastrand::u32(..));
    // Two clients: stand-ins for two processes, kept until the run ends.
    let (a, b) = ((entry.connect)().await?, (entry.connect)().await?);
    let contenders = [
        a.contender(&name, None).await?,
        b.contender(&name, None).await?,
    ];
    let deadline = Instant::now() + plan.handoff_limit;
    let h = handoff_run(contenders, plan.handoff_samples, hold_us, deadline).await?;
    drop((a, b));
    let mean_s = h.mean() / 1e6;
    Ok(Record {
        scenario: "handoff",
        library: entry.name,
        tasks: 2,
        ops_per_s: if mean_s > 0.0 { 1.0 / mean_s } else { 0.0 },
        mean_us: Some(h.mean()),
        hold_ms: Some(plan.handoff_hold_ms as f64),
        samples: Some(h.len() as f64),
        p50_us: Some(h.value_at_quantile(0.5) as f64),
        p99_us: Some(h.value_at_quantile(0.99) as f64),
        max_us: Some(h.max() as f64),
        max_wait_ms: Some(h.max() as f64 / 1000.0),
        ..Record::default()
    })
}

/// A bench contender in a contended run.
impl Contend for Box<dyn Contender> {
    type Guard = Box<dyn Hold>;

    fn take(&self) -> BoxFut<'_, AnyResult<Box<dyn Hold>>> {
        self.lock()
    }

    fn give_back(guard: Box<dyn Hold>) -> BoxFut<'static, AnyResult<()>> {
        guard.release()
    }
}

/// `tasks` tasks of one client looping on one name, measured for a phase after a warm-up
/// ([`contended_run`]).
async fn contended(
    entry: &Entry,
    conn: &mut MultiplexedConnection,
    tasks: usize,
    critical: Duration,
    plan: &Plan,
) -> AnyResult<Record> {
    let lib = (entry.connect)().await?;
    let name = format!("c{}", fastrand::u32(..));
    let mut contenders = Vec::new();
    for _ in 0..tasks {
        contenders.push(lib.contender(&name, None).await?);
    }
    let run = contended_run(
        conn,
        contenders,
        critical,
        plan.warm_up,
        plan.phase,
        &entry.script_commands,
    )
    .await?;
    drop(lib);
    Ok(Record {
        scenario: if critical.is_zero() {
            "contended"
        } else {
            "contended-1ms"
        },
        library: entry.name,
        tasks,
        ops_per_s: run.per_s,
        max_wait_ms: Some(run.max_wait.as_secs_f64() * 1000.0),
        jain: Some(run.jain),
        requests_per_acq: Some(run.requests_per_acq),
        retake_share: Some(run.retake_share),
        critical_section_ms: Some(critical.as_secs_f64() * 1000.0),
        ..Record::default()
    })
}

/// `waiters` tasks of one client blocked on a name another client holds (with a long fixed
/// lease, so the holder sends nothing): the requests per second they cause.
async fn idle(entry: &Entry, conn: &mut MultiplexedConnection, plan: &Plan) -> AnyResult<Record> {
    let name = format!("i{}", fastrand::u32(..));
    let holder_lib = (entry.connect)().await?;
    let holder = holder_lib
        .contender(&name, Some(Duration::from_secs(300)))
        .await?
        .lock()
        .await?;
    let lib = (entry.connect)().await?;
    let mut waiters = Vec::new();
    for _ in 0..plan.idle_waiters {
        let contender = lib.contender(&name, None).await?;
        waiters.push(tokio::spawn(async move {
            let hold = contender.lock().await?;
            hold.release().await
        }));
    }
    // Let them settle: subscribe, queue, make their first attempts.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = commandstats(conn).await?;
    let started = Instant::now();
    tokio::time::sleep(plan.idle_window).await;
    let after = commandstats(conn).await?;
    let elapsed = started.elapsed();
    for w in &waiters {
        w.abort();
    }
    holder.release().await?;
    drop((lib, holder_lib));
    Ok(Record {
        scenario: "idle",
        library: entry.name,
        tasks: plan.idle_waiters,
        ops_per_s: requests(&before, &after, &entry.script_commands) as f64 / elapsed.as_secs_f64(),
        ..Record::default()
    })
}

/// `tasks` tasks over two clients looping on one semaphore (one yield while holding).
async fn semaphore(
    entry: &Entry,
    conn: &mut MultiplexedConnection,
    tasks: usize,
    plan: &Plan,
) -> AnyResult<Record> {
    let name = format!("s{}", fastrand::u32(..));
    let libs = [(entry.connect)().await?, (entry.connect)().await?];
    let out = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut contenders = Vec::new();
    for t in 0..tasks {
        contenders.push(Arc::from(libs[t % 2].contender(&name, None).await?));
    }
    let contenders: Arc<Vec<Arc<dyn Contender>>> = Arc::new(contenders);
    let before = commandstats(conn).await?;
    let counted = Arc::new(AtomicU64::new(0));
    let (out2, most2, counted2) = (Arc::clone(&out), Arc::clone(&most), Arc::clone(&counted));
    let ops = loop_tasks(tasks, plan.phase, move |task| {
        let c = Arc::clone(&contenders[task]);
        let (out, most, counted) = (Arc::clone(&out2), Arc::clone(&most2), Arc::clone(&counted2));
        Box::pin(async move {
            let hold = c.lock().await?;
            let now = out.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            tokio::task::yield_now().await;
            out.fetch_sub(1, Ordering::SeqCst);
            hold.release().await?;
            counted.fetch_add(1, Ordering::Relaxed);
            Ok(())
        })
    })
    .await?;
    let after = commandstats(conn).await?;
    let acquisitions = counted.load(Ordering::Relaxed) as f64;
    Ok(Record {
        scenario: "semaphore",
        library: entry.name,
        tasks,
        ops_per_s: ops,
        requests_per_acq: Some(
            requests(&before, &after, &entry.script_commands) as f64 / acquisitions.max(1.0),
        ),
        most_out: Some(most.load(Ordering::SeqCst) as f64),
        ..Record::default()
    })
}

/// Many guards held at once on one client: the renewal requests per second, and the client
/// process's CPU while it does nothing else. The guards are released (and the releases
/// awaited) after the window, so that none of their work falls into the next job.
async fn watchdog(
    url: &str,
    prefix: &str,
    conn: &mut MultiplexedConnection,
    plan: &Plan,
) -> AnyResult<Record> {
    use futures_util::StreamExt;

    let mut config = Config::from_url(url);
    config.pool = Some(deadpool_redis::PoolConfig::new(64));
    let client = LockClient::builder(config.create_pool(Some(Runtime::Tokio1))?, url)
        .key_prefix(prefix)
        .default_lease(plan.watchdog_lease)
        .build()?;
    let run = format!("w{}", fastrand::u32(..));
    let mut guards = Vec::with_capacity(plan.watchdog_guards);
    let mut failed = None;
    for chunk in (0..plan.watchdog_guards).collect::<Vec<_>>().chunks(256) {
        let locks = chunk.iter().map(|i| {
            let mutex = client.mutex(&format!("{run}-{i}"));
            async move { mutex?.lock().await }
        });
        for guard in futures_util::future::join_all(locks).await {
            match guard {
                Ok(guard) => guards.push(guard),
                Err(err) => failed = Some(err),
            }
        }
        if failed.is_some() {
            break;
        }
    }
    let window = async {
        if let Some(err) = failed {
            return Err(Box::new(err) as Box<dyn Error + Send + Sync>);
        }
        // The window opens as soon as the last guard is held, so the first renewals (due a
        // third of the lease after each acquisition) may fall early in it; over a window of
        // whole renewal periods every guard is renewed about window / (lease / 3) times.
        let before = commandstats(conn).await?;
        let cpu_before = process_cpu();
        let started = Instant::now();
        tokio::time::sleep(plan.watchdog_window).await;
        let after = commandstats(conn).await?;
        let cpu_after = process_cpu();
        let elapsed = started.elapsed().as_secs_f64();
        let cpu = cpu_after
            .zip(cpu_before)
            .map(|(after, before)| 100.0 * (after - before) / elapsed);
        let renewals = requests(&before, &after, &script_commands(LUA)) as f64 / elapsed;
        Ok((renewals, cpu))
    }
    .await;
    let total = guards.len();
    let lost = guards.iter().filter(|g| !g.is_held()).count();
    // Outside the window, and whatever happened in it: every release sent and answered before
    // the job ends.
    let released: Vec<redlatch::Result<()>> = futures_util::stream::iter(guards)
        .filter(|g| std::future::ready(g.is_held()))
        .map(redlatch::MutexGuard::unlock)
        .buffer_unordered(256)
        .collect()
        .await;
    drop(client);
    let (ops_per_s, cpu_pct) = window?;
    if lost > 0 {
        return Err(format!("{lost} of {total} guards lost their lease").into());
    }
    if let Some(Err(err)) = released.into_iter().find(Result::is_err) {
        return Err(format!("releasing the guards: {err}").into());
    }
    Ok(Record {
        scenario: "watchdog",
        library: "redlatch-mutex",
        tasks: plan.watchdog_guards,
        ops_per_s,
        cpu_pct,
        lease_ms: Some(plan.watchdog_lease.as_secs_f64() * 1000.0),
        ..Record::default()
    })
}

// ---------------------------------------------------------------------------------------------
// Measurements
// ---------------------------------------------------------------------------------------------

/// The machine and server the figures come from.
async fn machine(conn: &mut MultiplexedConnection) -> Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_owned())
        })
        .unwrap_or_default();
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(conn)
        .await
        .unwrap_or_default();
    let version = info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap_or_default()
        .to_owned();
    json!({
        "cpu": cpu,
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "os": std::env::consts::OS,
        "redis": version,
    })
}

// ---------------------------------------------------------------------------------------------
// Output
// ---------------------------------------------------------------------------------------------

fn fmt_opt(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.digits$}"))
}

fn print_table(records: &[Record]) {
    let scenarios = [
        (
            "uncontended",
            "uncontended lock+release, each task on its own name (ops/s); \"of raw\": over the raw \
             EVALSHA pairs at the same task count",
        ),
        (
            "handoff",
            "hand-off from a release to a waiter blocked in another client",
        ),
        (
            "contended",
            "tasks of one client looping on one name, empty critical section",
        ),
        ("contended-1ms", "the same with a 1 ms critical section"),
        (
            "idle",
            "waiters blocked on a held name: Redis requests/s they cause",
        ),
        (
            "semaphore",
            "semaphore of 8 permits, tasks over two clients",
        ),
        (
            "watchdog",
            "guards held on one client: renewal requests/s and client CPU",
        ),
    ];
    for (scenario, title) in scenarios {
        let rows: Vec<&Record> = records
            .iter()
            .filter(|r| {
                r.scenario == scenario || (scenario == "uncontended" && r.scenario == "raw")
            })
            .collect();
        if rows.is_empty() {
            continue;
        }
        println!("\n{title}");
        match scenario {
            "uncontended" => {
                println!(
                    "  {:<20} {:>6} {:>10} {:>8}",
                    "library", "tasks", "ops/s", "of raw"
                );
                for r in rows {
                    let of_raw = r
                        .of_raw
                        .map_or_else(|| "-".to_owned(), |v| format!("{:.0}%", 100.0 * v));
                    println!(
                        "  {:<20} {:>6} {:>10.0} {:>8}",
                        r.library, r.tasks, r.ops_per_s, of_raw
                    );
                }
            }
            "handoff" => {
                println!(
                    "  {:<20} {:>10} {:>10} {:>10} {:>8}",
                    "library", "p50 µs", "p99 µs", "max µs", "samples"
                );
                for r in rows {
                    println!(
                        "  {:<20} {:>10} {:>10} {:>10} {:>8}",
                        r.library,
                        fmt_opt(r.p50_us, 0),
                        fmt_opt(r.p99_us, 0),
                        fmt_opt(r.max_us, 0),
                        fmt_opt(r.samples, 0)
                    );
                }
            }
            "contended" | "contended-1ms" => {
                println!(
                    "  {:<20} {:>6} {:>10} {:>8} {:>12} {:>7} {:>9}",
                    "library", "tasks", "acq/s", "re-take", "longest ms", "Jain", "req/acq"
                );
                for r in rows {
                    println!(
                        "  {:<20} {:>6} {:>10.0} {:>7.1}% {:>12} {:>7} {:>9}",
                        r.library,
                        r.tasks,
                        r.ops_per_s,
                        100.0 * r.retake_share.unwrap_or_default(),
                        fmt_opt(r.max_wait_ms, 1),
                        fmt_opt(r.jain, 3),
                        fmt_opt(r.requests_per_acq, 2)
                    );
                }
            }
            "idle" => {
                println!("  {:<20} {:>8} {:>12}", "library", "waiters", "requests/s");
                for r in rows {
                    println!("  {:<20} {:>8} {:>12.2}", r.library, r.tasks, r.ops_per_s);
                }
            }
            "semaphore" => {
                for r in rows {
                    println!(
                        "  {:<20} {:>4} tasks {:>10.0} acq/s, {} req/acq, at most {} permits out",
                        r.library,
                        r.tasks,
                        r.ops_per_s,
                        fmt_opt(r.requests_per_acq, 2),
                        fmt_opt(r.most_out, 0)
                    );
                }
            }
            _ => {
                for r in rows {
                    println!(
                        "  {:<20} {:>6} guards, {} ms lease: {:>8.1} renewal requests/s, client \
                         CPU {}%",
                        r.library,
                        r.tasks,
                        fmt_opt(r.lease_ms, 0),
                        r.ops_per_s,
                        fmt_opt(r.cpu_pct, 1)
                    );
                }
            }
        }
    }
    println!();
}

/// Two panels: hand-off latency (p50 and p99, log scale) and acquisitions/s of 16 tasks on
/// one name, per library.
fn chart(records: &[Record], path: &Path) -> AnyResult<()> {
    use plotters::prelude::*;

    let handoff: Vec<&Record> = records.iter().filter(|r| r.scenario == "handoff").collect();
    let tasks = records
        .iter()
        .filter(|r| r.scenario == "contended")
        .map(|r| r.tasks)
        .find(|t| *t == 16)
        .or_else(|| {
            records
                .iter()
                .find(|r| r.scenario == "contended")
                .map(|r| r.tasks)
        })
        .unwrap_or(16);
    let contended: Vec<&Record> = records
        .iter()
        .filter(|r| r.scenario == "contended" && r.tasks == tasks)
        .collect();
    let root = SVGBackend::new(path, (1200, 460)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(600);

    let labels: Vec<&str> = handoff.iter().map(|r| r.library).collect();
    let top = handoff
        .iter()
        .filter_map(|r| r.p99_us)
        .fold(1.0f64, f64::max)
        * 2.0
        / 1000.0;
    let mut chart = ChartBuilder::on(&left)
        .caption(
            "hand-off latency, ms (p50 solid, p99 light; log scale)",
            ("sans-serif", 16),
        )
        .margin(12)
        .x_label_area_size(60)
        .y_label_area_size(60)
        .build_cartesian_2d(
            (0..labels.len()).into_segmented(),
            (0.01f64..top.max(1.0)).log_scale(),
        )?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_label_formatter(&|x| match x {
            SegmentValue::CenterOf(i) => labels.get(*i).copied().unwrap_or_default().to_owned(),
            _ => String::new(),
        })
        .y_desc("ms")
        .draw()?;
    chart.draw_series(
        Histogram::vertical(&chart)
            .style(BLUE.mix(0.3).filled())
            .margin(8)
            .data(
                handoff
                    .iter()
                    .enumerate()
                    .map(|(i, r)| (i, r.p99_us.unwrap_or_default() / 1000.0)),
            ),
    )?;
    chart.draw_series(
        Histogram::vertical(&chart)
            .style(BLUE.filled())
            .margin(20)
            .data(
                handoff
                    .iter()
                    .enumerate()
                    .map(|(i, r)| (i, r.p50_us.unwrap_or_default() / 1000.0)),
            ),
    )?;

    let labels: Vec<&str> = contended.iter().map(|r| r.library).collect();
    let top = contended.iter().map(|r| r.ops_per_s).fold(1.0f64, f64::max) * 1.15;
    let caption = format!("{tasks} tasks on one name, empty critical section: acquisitions/s");
    let mut chart = ChartBuilder::on(&right)
        .caption(caption, ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(60)
        .y_label_area_size(70)
        .build_cartesian_2d((0..labels.len()).into_segmented(), 0f64..top)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_label_formatter(&|x| match x {
            SegmentValue::CenterOf(i) => labels.get(*i).copied().unwrap_or_default().to_owned(),
            _ => String::new(),
        })
        .draw()?;
    chart.draw_series(
        Histogram::vertical(&chart)
            .style(GREEN.filled())
            .margin(12)
            .data(contended.iter().enumerate().map(|(i, r)| (i, r.ops_per_s))),
    )?;
    root.present()?;
    Ok(())
}
