//! The fault matrix: one function per row, each starting its bed, its workers and its fault,
//! then running the checkers. Every row has a short version (`quick`: what `cargo test` runs)
//! and a full one (16 workers × 500 sections).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use redlatch::LockClient;
use redlatch_harness::check::{Section, fence_audit, overlaps};
use redlatch_harness::proxy::Mode;

use crate::bed::{Bed, ServerOpts};
use crate::clock::now_ns;
use crate::event::Event;
use crate::report::Report;
use crate::spec::{Kind, Spec};

/// How big a run is.
#[derive(Debug, Clone)]
pub struct Params {
    /// The short version: fewer sections and faults, a 1 s lease.
    pub quick: bool,
    /// The binary that runs a worker as `exe worker <spec>`.
    pub exe: PathBuf,
}

impl Params {
    fn lease(&self) -> Duration {
        if self.quick {
            Duration::from_secs(1)
        } else {
            Duration::from_secs(2)
        }
    }

    fn sections(&self) -> usize {
        if self.quick { 8 } else { 500 }
    }

    /// How many times a fault is injected: `full` in the full run, 2 at most in the short one.
    fn times(&self, full: usize) -> usize {
        if self.quick { full.min(2) } else { full }
    }

    /// The waiter timeout of the fair primitives in rows that kill holders: how long a dead
    /// waiter at the head may hold up the queue.
    fn waiter_timeout(&self) -> Duration {
        Duration::from_millis(500)
    }

    fn template(&self, kind: Kind) -> Spec {
        let lease = self.lease();
        Spec {
            id: String::new(),
            url: String::new(),
            resource: String::new(),
            prefix: String::new(),
            name: String::new(),
            kind,
            permits: 1,
            writers: 1,
            tasks: 4,
            sections: self.sections(),
            lease_ms: millis(lease),
            waiter_timeout_ms: None,
            hold_min_us: 200,
            hold_max_us: 1_000,
            timeout_ms: millis(lease * 5),
            obey_hold_flag: false,
            mutant_release: false,
            late_every: 0,
            double_release: false,
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Whether task `task` of a worker takes an exclusive hold.
pub fn exclusive(spec: &Spec, task: usize) -> bool {
    match spec.kind {
        Kind::Mutex | Kind::Reenter | Kind::Fair | Kind::Election => true,
        Kind::Semaphore => false,
        Kind::Rwlock => task < spec.writers,
    }
}

/// A row of the matrix.
#[derive(Debug, Clone, Copy)]
pub struct Row {
    /// `fault/primitive`.
    pub id: &'static str,
    /// The fault injected.
    pub fault: &'static str,
    /// The primitives it runs.
    pub primitives: &'static str,
    /// A negative control: it must make a checker fail.
    pub control: bool,
}

const fn row(id: &'static str, fault: &'static str, primitives: &'static str) -> Row {
    Row {
        id,
        fault,
        primitives,
        control: false,
    }
}

const fn control(id: &'static str, fault: &'static str, primitives: &'static str) -> Row {
    Row {
        id,
        fault,
        primitives,
        control: true,
    }
}

/// Every row, in the order of the matrix.
pub const ROWS: &[Row] = &[
    row("baseline/mutex", "none", "Mutex"),
    row("baseline/reenter", "none", "Mutex, re-entered"),
    row("baseline/fair", "none", "FairMutex"),
    row("baseline/semaphore", "none", "Semaphore of 3"),
    row("baseline/rwlock", "none", "RwLock"),
    row("kill/mutex", "SIGKILL the holder", "Mutex"),
    row("kill/reenter", "SIGKILL the holder", "Mutex, re-entered"),
    row("kill/fair", "SIGKILL the holder", "FairMutex"),
    row("kill/semaphore", "SIGKILL the holder", "Semaphore of 1"),
    row(
        "kill/election",
        "SIGKILL the leader; every worker observes",
        "Election, 5 candidates",
    ),
    row("pause/mutex", "SIGSTOP the holder for 2 × lease", "Mutex"),
    row(
        "pause/election",
        "SIGSTOP the leader for 2 × lease",
        "Election, 5 candidates",
    ),
    row("hold-replies/mutex", "replies held past the lease", "Mutex"),
    row(
        "hold-replies/fair",
        "replies held past the lease",
        "FairMutex",
    ),
    row(
        "jitter/all",
        "0–50 ms jitter on a quarter of the links",
        "all four",
    ),
    row(
        "blackhole/mutex",
        "the holder's link blackholed for 3 × lease",
        "Mutex",
    ),
    row(
        "blackhole/semaphore",
        "the holder's link blackholed for 3 × lease",
        "Semaphore of 2",
    ),
    row("reset/all", "links reset after the request", "all four"),
    row(
        "server-stop/all",
        "server SIGSTOP 0.5 s, 1 s, 3 s",
        "all four",
    ),
    row("client-pause/all", "CLIENT PAUSE 1000 WRITE", "all four"),
    row("debug-sleep/all", "DEBUG SLEEP 1", "all four"),
    row(
        "restart/persistent",
        "server killed, restarted with appendfsync always",
        "Mutex",
    ),
    row("wall-clock/all", "client wall clock jumps ±1 h", "all four"),
    row(
        "queue-kill/fair",
        "8 queued waiters, one SIGKILLed, CLIENT PAUSE",
        "FairMutex",
    ),
    row(
        "permits/semaphore",
        "P = 3; a holder SIGKILLed; double and late releases",
        "Semaphore of 3",
    ),
    row("writer/rwlock", "SIGKILL and SIGSTOP a writer", "RwLock"),
    control(
        "control/unfenced-register",
        "SIGSTOP the holder; the register is unfenced",
        "Mutex",
    ),
    control(
        "control/restart-empty",
        "server restarted without persistence",
        "Mutex",
    ),
    control(
        "control/mutant-release",
        "SIGSTOP the holder; release skips the owner check",
        "Mutex",
    ),
];

/// Runs the row called `id`.
pub async fn run(id: &str, params: &Params) -> Report {
    let Some(row) = ROWS.iter().find(|r| r.id == id) else {
        let mut report = Report {
            id: id.to_owned(),
            ..Report::default()
        };
        report.problem("no such row");
        return report;
    };
    let mut report = Report {
        id: row.id.to_owned(),
        fault: row.fault.to_owned(),
        primitives: row.primitives.to_owned(),
        control: row.control,
        timeout_ms: millis(params.lease() * 5) as f64,
        ..Report::default()
    };
    let started = Instant::now();
    let outcome = match id.split('/').next().unwrap_or_default() {
        "baseline" => baseline(row, params, &mut report).await,
        "kill" if row.id == "kill/election" => election_kill(params, &mut report).await,
        "kill" => kill(row, params, &mut report).await,
        "pause" if row.id == "pause/election" => {
            pause(params, &mut report, Kind::Election, false, false).await
        }
        "pause" => pause(params, &mut report, Kind::Mutex, false, false).await,
        "hold-replies" => hold_replies(row, params, &mut report).await,
        "jitter" => jitter(params, &mut report).await,
        "blackhole" => blackhole(row, params, &mut report).await,
        "reset" => reset(params, &mut report).await,
        "server-stop" | "client-pause" | "debug-sleep" => {
            server_fault(row, params, &mut report).await
        }
        "restart" => restart(params, &mut report, true).await,
        "wall-clock" => wall_clock(&mut report),
        "queue-kill" => queue_kill(params, &mut report).await,
        "permits" => permits(params, &mut report).await,
        "writer" => writer(params, &mut report).await,
        "control" => match id {
            "control/unfenced-register" => {
                pause(params, &mut report, Kind::Mutex, true, false).await
            }
            "control/restart-empty" => restart(params, &mut report, false).await,
            _ => pause(params, &mut report, Kind::Mutex, true, true).await,
        },
        _ => Err("no such row".to_owned()),
    };
    if let Err(err) = outcome {
        report.problem(format!("the row could not run: {err}"));
    }
    report.seconds = started.elapsed().as_secs_f64();
    report
}

/// The workers of one name.
struct Group {
    name: String,
    ids: Vec<String>,
    kind: Kind,
    capacity: usize,
}

/// Starts `processes` workers on `name` from `template`; `proxied(i)` puts worker `i` behind
/// a proxy of its own.
async fn group(
    bed: &mut Bed,
    name: &str,
    template: &Spec,
    processes: usize,
    proxied: impl Fn(usize) -> bool,
) -> Result<Group, String> {
    let mut ids = Vec::new();
    for i in 0..processes {
        let id = format!("{name}-w{i}");
        let spec = bed.spec(&id, name, template);
        bed.spawn(spec, proxied(i)).await?;
        ids.push(id);
    }
    let capacity = match template.kind {
        Kind::Semaphore => template.permits as usize,
        Kind::Rwlock => usize::MAX,
        _ => 1,
    };
    Ok(Group {
        name: name.to_owned(),
        ids,
        kind: template.kind,
        capacity,
    })
}

/// One group of every primitive, 4 workers of one task each: what the rows marked "all four"
/// run. `proxied(i)` as in [`group`].
async fn all_four(
    bed: &mut Bed,
    params: &Params,
    proxied: impl Fn(usize) -> bool + Copy,
) -> Result<Vec<Group>, String> {
    let mut groups = Vec::new();
    for kind in [Kind::Mutex, Kind::Fair, Kind::Semaphore, Kind::Rwlock] {
        let mut template = params.template(kind);
        // 16 workers in all, as in the other rows: 4 of one task per primitive.
        template.tasks = 1;
        template.permits = 2;
        if kind == Kind::Rwlock {
            // Worker 0 writes, the others read.
            template.writers = 0;
        }
        let name = kind.as_str();
        let mut g = Group {
            name: name.to_owned(),
            ids: Vec::new(),
            kind,
            capacity: 1,
        };
        for i in 0..4 {
            let id = format!("{name}-w{i}");
            let mut spec = bed.spec(&id, name, &template);
            if kind == Kind::Rwlock && i == 0 {
                spec.writers = 1;
            }
            bed.spawn(spec, proxied(i)).await?;
            g.ids.push(id);
        }
        g.capacity = match kind {
            Kind::Semaphore => 2,
            Kind::Rwlock => usize::MAX,
            _ => 1,
        };
        groups.push(g);
    }
    Ok(groups)
}

fn sections_of(bed: &Bed, group: &Group) -> Vec<Section> {
    bed.sections()
        .into_iter()
        .filter(|s| {
            group
                .ids
                .iter()
                .any(|id| s.worker.starts_with(&format!("{id}/")))
        })
        .collect()
}

/// Waits for the workers, then runs the checkers on every group: C1–C3 at once, C4 after one
/// lease more.
async fn finish(
    bed: &mut Bed,
    groups: &[Group],
    params: &Params,
    report: &mut Report,
) -> Result<(), String> {
    let limit = if params.quick {
        Duration::from_secs(90)
    } else {
        Duration::from_secs(600)
    };
    bed.calm().await?;
    if !bed.wait_done(limit).await {
        report.problem("workers still running at the time limit");
    }
    let mut conn = bed.resource_conn().await?;
    let mut exact = None::<bool>;
    for g in groups {
        let sections = sections_of(bed, g);
        report.sections += sections.len();
        let found = overlaps(&sections, g.capacity);
        report.overlaps += found.count;
        report.max_concurrent = report.max_concurrent.max(found.max_concurrent);
        if let Some(first) = found.first {
            report
                .notes
                .push(format!("{}: first overlap: {first}", g.name));
        }
        let resource = bed.resource_of(&g.name);
        let log = resource
            .fence_log(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
        let audit = fence_audit(&sections, &log);
        report.stale_accepted += audit.stale_accepted;
        report.stale_rejected += audit.stale_rejected;
        report.late_unchallenged += audit.late_unchallenged;
        report.tokens_out_of_order += audit.accepted_not_rising + audit.tokens_not_rising;
        if matches!(
            g.kind,
            Kind::Mutex | Kind::Reenter | Kind::Fair | Kind::Rwlock | Kind::Election
        ) {
            let (value, done) = resource
                .register(&mut conn)
                .await
                .map_err(|e| e.to_string())?;
            let this = value == done;
            exact = Some(exact.unwrap_or(true) && this);
            if !this {
                report
                    .notes
                    .push(format!("{}: register {value}, {done} updates", g.name));
            }
        }
    }
    report.register_exact = exact;
    let events = bed.events();
    report.failed = events
        .iter()
        .filter(|(_, e)| matches!(e, Event::Failed { .. }))
        .count();
    let mut waits: Vec<u64> = events
        .iter()
        .filter_map(|(_, e)| match e {
            Event::Acquired { ask, start, .. } => Some(start.saturating_sub(*ask)),
            Event::Failed { ask, at, .. } => Some(at.saturating_sub(*ask)),
            _ => None,
        })
        .collect();
    waits.sort_unstable();
    if let Some(&longest) = waits.last() {
        let p99 = waits[(waits.len() * 99 / 100).min(waits.len() - 1)];
        report.acquire_p99_ms = Some(p99 as f64 / 1e6);
        report.acquire_max_ms = Some(longest as f64 / 1e6);
    }
    // C4: one lease after the workers, nothing of the library is left, and nothing renews.
    tokio::time::sleep(params.lease() + Duration::from_millis(300)).await;
    let left = bed.leftovers().await?;
    report.keys_left = left.len();
    if !left.is_empty() {
        report.notes.push(format!("left: {left:?}"));
    }
    let calls = bed.script_calls().await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let later = bed.script_calls().await?;
    if later != calls {
        report.problem(format!(
            "{} script calls after the workers ended",
            later - calls
        ));
    }
    for g in groups.iter().filter(|g| g.kind == Kind::Semaphore) {
        let client = observer(bed)?;
        let available = client
            .semaphore(&g.name, g.capacity as u32)
            .map_err(|e| e.to_string())?
            .available_permits()
            .await
            .map_err(|e| e.to_string())?;
        if available as usize != g.capacity {
            report.problem(format!(
                "{}: {available} permits available of {}",
                g.name, g.capacity
            ));
        }
    }
    Ok(())
}

/// A client of the lock server for the test itself.
fn observer(bed: &Bed) -> Result<LockClient, String> {
    let pool = deadpool_redis::Config::from_url(bed.lock.url())
        .create_pool(Some(deadpool_redis::Runtime::Tokio1))
        .map_err(|e| e.to_string())?;
    LockClient::builder(pool, bed.lock.url().as_str())
        .key_prefix(&bed.prefix)
        .build()
        .map_err(|e| e.to_string())
}

/// The checks every row but the controls asks for: C1, C3 (no stale write accepted, tokens in
/// order), C2 where there is a register, C4.
fn expect_clean(report: &mut Report) {
    if report.overlaps > 0 {
        report.problem(format!("C1: {} overlaps", report.overlaps));
    }
    if report.stale_accepted > 0 {
        report.problem(format!(
            "C3: {} stale writes accepted",
            report.stale_accepted
        ));
    }
    if report.tokens_out_of_order > 0 {
        report.problem(format!(
            "C3: {} tokens out of order",
            report.tokens_out_of_order
        ));
    }
    if report.register_exact == Some(false) {
        report.problem("C2: the register lost an update");
    }
    if report.keys_left > 0 {
        report.problem(format!("C4: {} keys left", report.keys_left));
    }
    if report.sections == 0 {
        report.problem("no section ran");
    }
}

/// Acquisitions, granted or not, returned within the callers' timeout (and a few ms of
/// scheduling): the 99th percentile, or with `every`, the longest.
fn expect_within_timeout(report: &mut Report, every: bool) {
    let slack = 100.0;
    let (what, figure) = if every {
        ("longest acquisition", report.acquire_max_ms)
    } else {
        ("acquire p99", report.acquire_p99_ms)
    };
    if let Some(ms) = figure
        && ms > report.timeout_ms + slack
    {
        report.problem(format!(
            "{what} {ms:.0} ms, beyond the {} ms timeout",
            report.timeout_ms
        ));
    }
}

/// For each kill of a holder: the time until another worker of the same name acquired.
fn recoveries(bed: &Bed) -> Vec<f64> {
    let events = bed.events();
    bed.kills
        .iter()
        .filter_map(|(victim, at)| {
            let name = &bed.spec_of(victim)?.name;
            events
                .iter()
                .filter(|(id, _)| id != victim && bed.spec_of(id).is_some_and(|s| s.name == *name))
                .filter_map(|(_, e)| match e {
                    Event::Acquired { start, .. } if *start > *at => Some(*start),
                    _ => None,
                })
                .min()
                .map(|start| (start - at) as f64 / 1e6)
        })
        .collect()
}

fn note_recovery(bed: &Bed, report: &mut Report, bound: Duration) {
    let mut times = recoveries(bed);
    report.longest_recovery_ms = times.iter().copied().reduce(f64::max);
    times.sort_by(|a, b| b.total_cmp(a));
    let longest: Vec<String> = times.iter().take(5).map(|t| format!("{t:.0}")).collect();
    let median = times.get(times.len() / 2).copied().unwrap_or_default();
    report.notes.push(format!(
        "{} recoveries, median {median:.0} ms, the longest in ms: {}",
        times.len(),
        longest.join(", ")
    ));
    let bound = bound.as_secs_f64() * 1000.0;
    if let Some(longest) = report.longest_recovery_ms
        && longest > bound
    {
        report.problem(format!(
            "recovery took {longest:.0} ms, beyond {bound:.0} ms"
        ));
    }
    if bed.kills.is_empty() {
        report.problem("no holder was killed");
    }
}

async fn baseline(row: &Row, params: &Params, report: &mut Report) -> Result<(), String> {
    let mut bed = Bed::start(params.exe.clone(), ServerOpts::default())?;
    let mut template = match row.id {
        "baseline/reenter" => params.template(Kind::Reenter),
        "baseline/fair" => params.template(Kind::Fair),
        "baseline/semaphore" => params.template(Kind::Semaphore),
        "baseline/rwlock" => params.template(Kind::Rwlock),
        _ => params.template(Kind::Mutex),
    };
    template.permits = 3;
    let g = group(&mut bed, "lock", &template, 4, |_| false).await?;
    finish(&mut bed, &[g], params, report).await?;
    expect_clean(report);
    Ok(())
}

/// Picks a live worker (the `k`-th of `ids` that lives, round robin), sets its hold flag, and
/// waits until one of its tasks holds for it (a writer, for a read-write lock): that section
/// stays held until the flag is cleared, whatever the fault does meanwhile. `None` if none came
/// to hold in time.
async fn hold_one(bed: &Bed, ids: &[String], k: usize) -> Result<Option<String>, String> {
    let live: Vec<&String> = ids.iter().filter(|id| bed.is_live(id)).collect();
    if live.is_empty() {
        return Ok(None);
    }
    let victim = live[k % live.len()].clone();
    bed.hold_flag(&victim, true).await?;
    if bed.wait_flag_holder(&victim, Duration::from_secs(30)).await {
        return Ok(Some(victim));
    }
    bed.hold_flag(&victim, false).await?;
    Ok(None)
}

/// SIGKILLs the holder `times` times; each victim is replaced by a fresh worker.
async fn kill_holders(
    bed: &mut Bed,
    g: &mut Group,
    times: usize,
    pick: impl Fn(&Spec, u32) -> bool + Copy,
) -> Result<(), String> {
    for k in 0..times {
        // Let the lock change hands after the last kill before the next.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let Some(victim) = bed.wait_holder(Duration::from_secs(30), pick).await else {
            break;
        };
        let spec = bed.spec_of(&victim).cloned().ok_or("unknown worker")?;
        let at = bed.kill(&victim);
        let id = format!("{}-r{k}", g.name);
        let fresh = Spec {
            id: id.clone(),
            ..spec
        };
        bed.spawn(fresh, false).await?;
        g.ids.push(id);
        // The victim's other tasks may still wait in a queue in Redis; each is dealt with when
        // it reaches the head (one waiter timeout for all of them). Let the queue go round
        // before the next kill, so that a recovery measures one dead process, as the guarantee
        // says, not the leftovers of the one before.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while bed.acquired_since(at) < 3 * bed.live_tasks()
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    Ok(())
}

async fn kill(row: &Row, params: &Params, report: &mut Report) -> Result<(), String> {
    let mut bed = Bed::start(params.exe.clone(), ServerOpts::default())?;
    let kind = match row.id {
        "kill/reenter" => Kind::Reenter,
        "kill/fair" => Kind::Fair,
        "kill/semaphore" => Kind::Semaphore,
        _ => Kind::Mutex,
    };
    let mut template = params.template(kind);
    template.permits = 1;
    let mut bound = params.lease() + Duration::from_millis(250);
    if matches!(kind, Kind::Fair | Kind::Semaphore) {
        // Queued in Redis: a dead client's waiter at the head holds up the queue for one
        // waiter timeout more.
        template.waiter_timeout_ms = Some(millis(params.waiter_timeout()));
        bound += params.waiter_timeout();
    }
    let mut g = group(&mut bed, "lock", &template, 4, |_| false).await?;
    kill_holders(&mut bed, &mut g, params.times(20), |_, _| true).await?;
    finish(&mut bed, &[g], params, report).await?;
    expect_clean(report);
    note_recovery(&bed, report, bound);
    Ok(())
}

/// Five workers, one candidate each, hold the leadership in turn (for 20 to 100 ms each); the
/// leader is SIGKILLed `times` times and replaced by a fresh worker. Besides the checkers of
/// every row (no overlapping leaderships, terms accepted in rising order), the next leader must
/// lead within the lease and 250 ms of the kill (no queued waiter of the dead process holds it
/// up: it had only its leadership), and every observer must have seen every leader between the
/// first and last it saw, in order.
async fn election_kill(params: &Params, report: &mut Report) -> Result<(), String> {
    let mut bed = Bed::start(params.exe.clone(), ServerOpts::default())?;
    let mut template = params.template(Kind::Election);
    template.tasks = 1;
    template.hold_min_us = 20_000;
    template.hold_max_us = 100_000;
    template.sections = if params.quick { 8 } else { 40 };
    let mut g = group(&mut bed, "lock", &template, 5, |_| false).await?;
    kill_holders(&mut bed, &mut g, params.times(20), |_, _| true).await?;
    finish(&mut bed, &[g], params, report).await?;
    expect_clean(report);
    note_recovery(&bed, report, params.lease() + Duration::from_millis(250));
    note_observers(&bed, report);
    Ok(())
}

/// Checks what each worker's observer saw: the terms of the leaders it saw rise strictly, and
/// every leadership acquired between the first and the last it saw is among them.
fn note_observers(bed: &Bed, report: &mut Report) {
    let events = bed.events();
    let terms: Vec<u64> = events
        .iter()
        .filter_map(|(_, e)| match e {
            Event::Acquired { token, .. } => Some(*token),
            _ => None,
        })
        .collect();
    // Each worker's sightings of a leader, in the order it logged them.
    let mut sightings: std::collections::BTreeMap<&String, Vec<u64>> = Default::default();
    for (id, e) in &events {
        if let Event::Observed { term, .. } = e
            && *term > 0
        {
            sightings.entry(id).or_default().push(*term);
        }
    }
    let mut observers = 0;
    let mut changes = 0;
    for (id, seen) in sightings {
        let (Some(&first), Some(&last)) = (seen.first(), seen.last()) else {
            continue;
        };
        observers += 1;
        changes += seen.len();
        if !seen.windows(2).all(|w| w[0] < w[1]) {
            report.problem(format!("{id}'s observer saw terms out of order: {seen:?}"));
        }
        let missed: Vec<u64> = terms
            .iter()
            .copied()
            .filter(|t| *t > first && *t < last && !seen.contains(t))
            .collect();
        if !missed.is_empty() {
            report.problem(format!(
                "{id}'s observer missed {} leaders, the first of term {}",
                missed.len(),
                missed[0]
            ));
        }
    }
    report.notes.push(format!(
        "{observers} observers saw {changes} leaders in all"
    ));
    if observers == 0 {
        report.problem("no observer saw a leader");
    }
}

/// SIGSTOPs the holder for twice its lease, `times` times. The holder is kept in its section
/// (between reading and writing the register) with its hold flag, so that it resumes there.
/// `control`: the register's lost update is the expected outcome (a negative control); `mutant`:
/// the workers release with a script that skips the owner check (another one).
async fn pause(
    params: &Params,
    report: &mut Report,
    kind: Kind,
    control: bool,
    mutant: bool,
) -> Result<(), String> {
    let mut bed = Bed::start(params.exe.clone(), ServerOpts::default())?;
    let mut template = params.template(kind);
    template.obey_hold_flag = true;
    template.mutant_release = mutant;
    let workers = if kind == Kind::Election {
        template.tasks = 1;
        5
    } else {
        4
    };
    let g = group(&mut bed, "lock", &template, workers, |_| false).await?;
    let pause = params.lease() * 2;
    let mut victims = Vec::new();
    // The controls only need to fail: a few pauses do.
    let times = if control {
        params.times(5)
    } else {
        params.times(20)
    };
    for k in 0..times {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let Some(victim) = hold_one(&bed, &g.ids, k).await? else {
            break;
        };
        bed.stop(&victim);
        tokio::time::sleep(pause).await;
        bed.resume(&victim);
        // It wakes past its lease, still in its section, and sees that. The holder of the
        // moment is kept in its section too, so that the paused one's writes and release land
        // while someone else holds.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let others: Vec<String> = g.ids.iter().filter(|id| **id != victim).cloned().collect();
        let current = hold_one(&bed, &others, k).await?;
        bed.hold_flag(&victim, false).await?;
        tokio::time::sleep(Duration::from_millis(300)).await;
        if let Some(current) = &current {
            bed.hold_flag(current, false).await?;
        }
        victims.push(victim);
    }
    finish(&mut bed, &[g], params, report).await?;
    // The paused sections: their guards knew the lease was lost, and their release and
    // extension were refused.
    let events = bed.events();
    let paused: Vec<_> = events
        .iter()
        .filter_map(|(id, e)| match e {
            Event::Section(s) if victims.contains(id) && s.lost_at.is_some() => Some(s),
            _ => None,
        })
        .collect();
    let refused = paused
        .iter()
        .filter(|s| s.release == "notheld" && s.extend == "notheld")
        .count();
    report.notes.push(format!(
        "{} pauses: {} sections saw lost(), {refused} had release and extend refused",
        victims.len(),
        paused.len()
    ));
    if mutant {
        // Control: a release without the owner check frees another holder's lock.
        if report.overlaps == 0 {
            report.problem("control: the mutant release made no overlap");
        }
        return Ok(());
    }
    if report.overlaps > 0 {
        report.problem(format!("C1: {} overlaps", report.overlaps));
    }
    if report.stale_accepted > 0 {
        report.problem(format!(
            "C3: {} stale writes accepted",
            report.stale_accepted
        ));
    }
    if report.stale_rejected == 0 {
        report.problem("C3: no stale write was made (the pause missed the section)");
    }
    if paused.len() < victims.len() || refused < victims.len() {
        report
            .problem("a paused holder did not see lost() or had its release or extension accepted");
    }
    // The register is not fenced: the paused holder's write lands after others' and loses
    // them. That is what the fenced store is for; the control row shows it happens.
    if control && report.register_exact != Some(false) {
        report.problem("control: the unfenced register lost no update");
    }
    if report.keys_left > 0 {
        report.problem(format!("C4: {} keys left", report.keys_left));
    }
    Ok(())
}

async fn hold_replies(row: &Row, params: &Params, report: &mut Report) -> Result<(), String> {
    let mut bed = Bed::start(params.exe.clone(), ServerOpts::default())?;
    let kind = if row.id.ends_with("fair") {
        Kind::Fair
    } else {
        Kind::Mutex
    };
    let template = params.template(kind);
    let g = group(&mut bed, "lock", &template, 4, |i| i == 0).await?;
    let held = g.ids[0].clone();
    for _ in 0..params.times(10) {
        tokio::time::sleep(Duration::from_millis(200)).await;
        if bed.all_done() {
            break;
        }
        if let Some(proxy) = bed.proxy(&held) {
            proxy.set(Mode::HoldReplies);
        }
        tokio::time::sleep(params.lease() + Duration::from_millis(250)).await;
        if let Some(proxy) = bed.proxy(&held) {
            proxy.set(Mode::Pass);
        }
    }
    finish(&mut bed, &[g], params, report).await?;
    let failed = bed
        .events()
        .iter()
        .filter(|(id, e)| *id == held && matches!(e, Event::Failed { .. }))
        .count();
    report
        .notes
        .push(format!("{failed} acquisitions of the held worker failed"));
    expect_clean(report);
    Ok(())
}

async fn jitter(params: &Params, report: &mut Report) -> Result<(), String> {
    let mut bed = Bed::start(params.exe.clone(), ServerOpts::default())?;
    let groups = all_four(&mut bed, params, |i| i == 0).await?;
    for g in &groups {
        if let Some(proxy) = bed.proxy(&g.ids[0]) {
            proxy.set(Mode::Delay {
                base: Duration::ZERO,
                jitter: Duration::from_millis(50),
            });
        }
    }
    finish(&mut bed, &groups, params, report).await?;
    expect_clean(report);
    expect_within_timeout(report, false);
    Ok(())
}

async fn blackhole(row: &Row, params: &Params, report: &mut Report) -> Result<(), String> {
    let mut bed = Bed::start(params.exe.clone(), ServerOpts::default())?;
    let semaphore = row.id.ends_with("semaphore");
    let mut template = params.template(if semaphore {
        Kind::Semaphore
    } else {
        Kind::Mutex
    });
    template.permits = 2;
    template.obey_hold_flag = true;
    let g = group(&mut bed, "lock", &template, 4, |_| true).await?;
    let cut = params.lease() * 3;
    let mut victims = Vec::new();
    for k in 0..params.times(10) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let Some(victim) = hold_one(&bed, &g.ids, k).await? else {
            break;
        };
        let cut_at = now_ns();
        if let Some(proxy) = bed.proxy(&victim) {
            proxy.set(Mode::Blackhole);
        }
        tokio::time::sleep(cut).await;
        if let Some(proxy) = bed.proxy(&victim) {
            proxy.set(Mode::Pass);
        }
        bed.hold_flag(&victim, false).await?;
        victims.push((victim, cut_at));
    }
    finish(&mut bed, &[g], params, report).await?;
    if semaphore {
        shared_holds_are_not_fenced(report);
    }
    expect_clean_but_register(report);
    // The cut holders: lost() fired no later than the deadline they knew, before anyone else
    // got their permit or lock back, and their release after the cut was refused.
    let events = bed.events();
    for (victim, cut_at) in &victims {
        let cut: Vec<_> = events
            .iter()
            .filter_map(|(id, e)| match e {
                Event::Section(s) if id == victim && s.start < *cut_at && s.lost_at.is_some() => {
                    Some(s)
                }
                _ => None,
            })
            .collect();
        let Some(s) = cut.first() else {
            report.problem(format!("{victim}: no section saw lost() during the cut"));
            continue;
        };
        let lost_at = s.lost_at.unwrap_or(u64::MAX);
        if s.release != "notheld" {
            report.problem(format!(
                "{victim}: its release after the cut answered {}",
                s.release
            ));
        }
        if !semaphore {
            // The next holder came after the cut holder knew it had lost the lock.
            let next = events
                .iter()
                .filter_map(|(id, e)| match e {
                    Event::Acquired { start, .. } if id != victim && *start > s.start => {
                        Some(*start)
                    }
                    _ => None,
                })
                .min();
            if next.is_some_and(|n| n < lost_at) {
                report.problem(format!("{victim}: another holder came before lost() fired"));
            }
        }
    }
    report.notes.push(format!("{} cuts", victims.len()));
    Ok(())
}

/// Permits of a semaphore are held at once, each with its own token: the fenced store (one
/// writer at a time) says nothing about them, so their late writes are noted, not counted.
fn shared_holds_are_not_fenced(report: &mut Report) {
    if report.stale_accepted > 0 {
        report.notes.push(format!(
            "{} late writes of permits accepted (permits are not fenced against each other)",
            report.stale_accepted
        ));
        report.stale_accepted = 0;
    }
}

/// C1, C3, C4, without C2: the rows whose cut-off holder writes the unfenced register late
/// (the register's lost update there is what the fenced store is for).
fn expect_clean_but_register(report: &mut Report) {
    let exact = report.register_exact.take();
    expect_clean(report);
    report.register_exact = exact;
}

async fn reset(params: &Params, report: &mut Report) -> Result<(), String> {
    let mut bed = Bed::start(params.exe.clone(), ServerOpts::default())?;
    let groups = all_four(&mut bed, params, |i| i == 0).await?;
    let rounds = if params.quick { 10 } else { 100 };
    for _ in 0..rounds {
        if bed.all_done() {
            break;
        }
        for g in &groups {
            if let Some(proxy) = bed.proxy(&g.ids[0]) {
                proxy.set(Mode::ResetReplies);
            }
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
        for g in &groups {
            if let Some(proxy) = bed.proxy(&g.ids[0]) {
                proxy.set(Mode::Pass);
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    finish(&mut bed, &groups, params, report).await?;
    expect_clean(report);
    Ok(())
}

async fn server_fault(row: &Row, params: &Params, report: &mut Report) -> Result<(), String> {
    let mut bed = Bed::start(
        params.exe.clone(),
        ServerOpts {
            debug: true,
            ..ServerOpts::default()
        },
    )?;
    // Timeouts shorter than the longest stop, so that some waits end in one.
    let mut groups = Vec::new();
    for g in all_four(&mut bed, params, |_| false).await? {
        groups.push(g);
    }
    report.timeout_ms = millis(params.lease() * 5) as f64;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut conn = bed.lock_conn().await?;
    match row.id {
        "server-stop/all" => {
            for stop in [500, 1000, 3000] {
                bed.lock.pause();
                tokio::time::sleep(Duration::from_millis(stop)).await;
                bed.lock.resume();
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
        "client-pause/all" => {
            for _ in 0..params.times(5) {
                let _: () = redis::cmd("CLIENT")
                    .arg("PAUSE")
                    .arg(1000)
                    .arg("WRITE")
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| e.to_string())?;
                tokio::time::sleep(Duration::from_millis(1500)).await;
            }
        }
        _ => {
            for _ in 0..params.times(5) {
                let _: redis::Value = redis::cmd("DEBUG")
                    .arg("SLEEP")
                    .arg(1)
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| e.to_string())?;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
    finish(&mut bed, &groups, params, report).await?;
    expect_clean(report);
    expect_within_timeout(report, true);
    Ok(())
}

/// Kills the lock server while a lock is held (its holder kept in its section) and restarts
/// it at once: with `persist`, from its append-only file; without, empty (a control).
async fn restart(params: &Params, report: &mut Report, persist: bool) -> Result<(), String> {
    let mut bed = Bed::start(
        params.exe.clone(),
        ServerOpts {
            persist,
            ..ServerOpts::default()
        },
    )?;
    let mut template = params.template(Kind::Mutex);
    template.obey_hold_flag = true;
    let g = group(&mut bed, "lock", &template, 4, |_| false).await?;
    let mut held = Vec::new();
    for k in 0..params.times(5) {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let Some(victim) = hold_one(&bed, &g.ids, k).await? else {
            break;
        };
        bed.lock.kill();
        bed.lock.restart();
        if persist {
            // Others try to take the lock while the holder is still in its section.
            tokio::time::sleep(params.lease() / 2).await;
        } else {
            // The empty server admits a second holder: the holder stays in its section until
            // another has finished one (or three leases pass), then makes its stale write.
            let since = now_ns();
            let limit = tokio::time::Instant::now() + params.lease() * 3;
            while tokio::time::Instant::now() < limit
                && !bed.events().iter().any(|(id, e)| {
                    *id != victim && matches!(e, Event::Section(s) if s.start > since)
                })
            {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        bed.hold_flag(&victim, false).await?;
        held.push(victim);
    }
    finish(&mut bed, &[g], params, report).await?;
    let events = bed.events();
    let survived = events
        .iter()
        .filter(|(id, e)| {
            held.contains(id)
                && matches!(e, Event::Section(s) if s.release == "ok" && s.lost_at.is_none())
        })
        .count();
    report.notes.push(format!(
        "{} restarts; {survived} held sections across them kept their lock",
        held.len()
    ));
    if persist {
        expect_clean(report);
        if survived == 0 {
            report.problem("no held lock survived a restart");
        }
    } else {
        // Control: the empty server forgets the lock, and a second holder comes.
        if report.overlaps == 0 {
            report.problem("control: no second holder after the restart without persistence");
        }
        if report.tokens_out_of_order > 0 || report.stale_accepted > 0 {
            report.problem("C3: the fenced store accepted a stale write");
        }
        if report.stale_rejected == 0 {
            // The older holder wrote after the newer one: its token is lower (tokens never go
            // below the server's clock), so the store refuses it.
            report.problem("C3: no stale write was refused");
        }
    }
    Ok(())
}

/// The library reads no wall clock: every time it uses is tokio's monotonic `Instant` or the
/// Redis server's `TIME`. A jump of the client's wall clock cannot change anything it does.
fn wall_clock(report: &mut Report) -> Result<(), String> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../src");
    let mut files = Vec::new();
    let mut dirs = vec![root];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).map_err(|e| e.to_string())? {
            let path = entry.map_err(|e| e.to_string())?.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    for file in &files {
        let text = std::fs::read_to_string(file).map_err(|e| e.to_string())?;
        for needle in [
            "SystemTime",
            "UNIX_EPOCH",
            "chrono::",
            "OffsetDateTime",
            "Utc::now",
        ] {
            if text.contains(needle) {
                report.problem(format!(
                    "{} reads the wall clock ({needle})",
                    file.display()
                ));
            }
        }
    }
    report.notes.push(format!(
        "{} source files use only monotonic time and the server's TIME",
        files.len()
    ));
    Ok(())
}

/// 8 waiters queued in a known order behind a holder; one of them SIGKILLed while queued; a
/// `CLIENT PAUSE` while they wait. The live ones get the lock in exactly their order.
async fn queue_kill(params: &Params, report: &mut Report) -> Result<(), String> {
    let mut bed = Bed::start(params.exe.clone(), ServerOpts::default())?;
    let client = observer(&bed)?;
    let holder = client
        .fair_mutex("queue")
        .map_err(|e| e.to_string())?
        .lock()
        .await
        .map_err(|e| e.to_string())?;
    let mut template = params.template(Kind::Fair);
    template.tasks = 1;
    template.sections = 1;
    template.waiter_timeout_ms = Some(millis(params.waiter_timeout()));
    let mut ids = Vec::new();
    for i in 0..8 {
        let id = format!("queue-w{i}");
        bed.spawn(bed.spec(&id, "queue", &template), false).await?;
        ids.push(id);
        // Queued before the next one starts.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let waiters = client
                .inspect("queue")
                .await
                .map_err(|e| e.to_string())?
                .waiters
                .len();
            if waiters > i || Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let dead = ids[3].clone();
    bed.kill(&dead);
    let mut conn = bed.lock_conn().await?;
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(1000)
        .arg("WRITE")
        .query_async(&mut conn)
        .await
        .map_err(|e| e.to_string())?;
    // The holder lets go during the pause: its release, a write, waits for the pause to end
    // (past redis-rs's 500 ms answer timeout: it is sent from the release queue, and runs).
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(holder);
    let group = Group {
        name: "queue".into(),
        ids: ids.clone(),
        kind: Kind::Fair,
        capacity: 1,
    };
    finish(&mut bed, &[group], params, report).await?;
    let mut order: Vec<(u64, String)> = bed
        .events()
        .into_iter()
        .filter_map(|(id, e)| match e {
            Event::Acquired { start, .. } => Some((start, id)),
            _ => None,
        })
        .collect();
    order.sort();
    let got: Vec<String> = order.into_iter().map(|(_, id)| id).collect();
    let expected: Vec<String> = ids.into_iter().filter(|id| *id != dead).collect();
    report.notes.push(format!("served {got:?}"));
    if got != expected {
        report.problem(format!("order {got:?}, queued {expected:?}"));
    }
    let waiters = client
        .inspect("queue")
        .await
        .map_err(|e| e.to_string())?
        .waiters
        .len();
    if waiters > 0 {
        report.problem(format!("{waiters} waiters left in the queue"));
    }
    expect_clean(report);
    Ok(())
}

async fn permits(params: &Params, report: &mut Report) -> Result<(), String> {
    let mut bed = Bed::start(params.exe.clone(), ServerOpts::default())?;
    let mut template = params.template(Kind::Semaphore);
    template.permits = 3;
    template.late_every = if params.quick { 4 } else { 50 };
    template.double_release = true;
    let mut g = group(&mut bed, "permits", &template, 4, |_| false).await?;
    kill_holders(&mut bed, &mut g, params.times(3), |_, _| true).await?;
    finish(&mut bed, &[g], params, report).await?;
    let events = bed.events();
    let released: Vec<&str> = events
        .iter()
        .filter_map(|(_, e)| match e {
            Event::Section(s) => Some(s.release.as_str()),
            _ => None,
        })
        .collect();
    let late = released.iter().filter(|r| r.starts_with("notheld")).count();
    let again = released.iter().filter(|r| r.contains(";again=")).count();
    let refused = released
        .iter()
        .filter(|r| r.ends_with(";again=notheld"))
        .count();
    report.notes.push(format!(
        "{late} late releases refused; {refused} of {again} second releases refused"
    ));
    if late == 0 {
        report.problem("no late release was tried");
    }
    if refused != again || again == 0 {
        report.problem(format!(
            "{} second releases were not refused",
            again - refused
        ));
    }
    if report.max_concurrent > 3 {
        report.problem(format!("{} permits out at once", report.max_concurrent));
    }
    shared_holds_are_not_fenced(report);
    expect_clean(report);
    note_recovery(&bed, report, params.lease() + Duration::from_millis(250));
    Ok(())
}

/// The workers of `ids` whose tasks include writers.
fn writers(bed: &Bed, ids: &[String]) -> Vec<String> {
    ids.iter()
        .filter(|id| bed.spec_of(id).is_some_and(|s| s.writers > 0))
        .cloned()
        .collect()
}

async fn writer(params: &Params, report: &mut Report) -> Result<(), String> {
    let mut bed = Bed::start(params.exe.clone(), ServerOpts::default())?;
    let mut template = params.template(Kind::Rwlock);
    template.writers = 1;
    template.waiter_timeout_ms = Some(millis(params.waiter_timeout()));
    template.obey_hold_flag = true;
    let mut g = group(&mut bed, "rw", &template, 4, |_| false).await?;
    let writing = |s: &Spec, task: u32| exclusive(s, task as usize);
    for k in 0..params.times(10) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if k % 2 == 0 {
            kill_holders(&mut bed, &mut g, 1, writing).await?;
        } else if let Some(victim) = hold_one(&bed, &writers(&bed, &g.ids), k).await? {
            bed.stop(&victim);
            tokio::time::sleep(params.lease() * 2).await;
            bed.resume(&victim);
            tokio::time::sleep(Duration::from_millis(200)).await;
            bed.hold_flag(&victim, false).await?;
        }
    }
    finish(&mut bed, &[g], params, report).await?;
    expect_clean_but_register(report);
    note_recovery(
        &bed,
        report,
        params.lease() + params.waiter_timeout() + Duration::from_millis(250),
    );
    Ok(())
}
