//! The scenarios: each measures one configuration and returns its [`Record`].

use std::error::Error;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use deadpool_redis::{Config, Runtime};
use redis::aio::MultiplexedConnection;
use redlatch::LockClient;
use redlatch_harness::measure::{
    AnyResult, LUA, WARM_NAMES, commandstats, contended_run, handoff_run, loop_tasks, process_cpu,
    requests, script_commands,
};

use super::library::{Contender, Entry, Library, Pair, counting};
use super::plan::Plan;
use super::report::Record;

/// `tasks` tasks of one client, each on a name of its own: lock and release in a loop, on
/// names in use (taken once, [`WARM_NAMES`] before).
pub(crate) async fn uncontended(entry: &Entry, tasks: usize, phase: Duration) -> AnyResult<Record> {
    let lib = (entry.connect)().await?;
    let run = format!("u{}", fastrand::u32(..));
    let mut contenders: Vec<Arc<dyn Contender>> = Vec::new();
    for t in 0..tasks {
        contenders.push(Arc::from(lib.contender(&format!("{run}-{t}"), None).await?));
    }
    // Names in use: each taken once, then a pause of more than a second, the window in which
    // a name's new fencing counter makes a fresh token cost a second write.
    for c in &contenders {
        c.lock().await?.release().await?;
    }
    tokio::time::sleep(WARM_NAMES).await;
    let contenders = Arc::new(contenders);
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

/// One task on one name: lock and release, one after the other, for a phase; the figure is the
/// latency of a whole cycle (acquire + release), median and 99th percentile.
pub(crate) async fn latency(entry: &Entry, phase: Duration) -> AnyResult<Record> {
    let lib = (entry.connect)().await?;
    let contender = lib
        .contender(&format!("l{}", fastrand::u32(..)), None)
        .await?;
    // Warm up: connections, subscription, script caches.
    for _ in 0..20 {
        contender.lock().await?.release().await?;
    }
    let mut cycles = hdrhistogram::Histogram::<u64>::new(3)?;
    let started = Instant::now();
    while started.elapsed() < phase {
        let at = Instant::now();
        contender.lock().await?.release().await?;
        cycles.record(u64::try_from(at.elapsed().as_micros()).unwrap_or(u64::MAX))?;
    }
    let seconds = started.elapsed().as_secs_f64();
    Ok(Record {
        scenario: "latency",
        library: entry.name,
        tasks: 1,
        ops_per_s: cycles.len() as f64 / seconds,
        p50_us: Some(cycles.value_at_quantile(0.5) as f64),
        p99_us: Some(cycles.value_at_quantile(0.99) as f64),
        max_us: Some(cycles.max() as f64),
        samples: Some(cycles.len() as f64),
        ..Record::default()
    })
}

/// One holder and one waiter, in two clients on runtimes of their own ([`Pair`]), taking
/// turns. The holder waits until the other task is inside `lock()`, holds a random `hold` more
/// (1 to 5 ms by default), and releases; the sample is the time from the start of the release
/// to the waiter's `lock()` returning. The releaser asks again only after the other task has
/// the lock, so every sample is a hand-off to a different task that was already blocked.
///
/// With holds of a few ms, a waiter that polls at a fixed interval (distkit: 50 ms) is always
/// released just after its first attempt and waits almost a whole interval; holds spread over
/// more than the interval (`--handoff-hold-ms 100`) put the release at a random point of its
/// cycle instead, at the price of longer idle gaps, which on a virtual machine make every
/// wake-up slower.
pub(crate) async fn handoff(
    entry: &Entry,
    conn: &mut MultiplexedConnection,
    plan: &Plan,
) -> AnyResult<Record> {
    // Two clients: stand-ins for two processes, kept until the run ends.
    let pair = Pair::connect(entry).await?;
    let mut count = None;
    let counted = counting(entry, &pair.libs, &mut count);
    let before = counted.read(conn).await?;
    let h = handoffs(&pair, &format!("h{}", fastrand::u32(..)), plan).await?;
    let sent = counted.between(&before, &counted.read(conn).await?);
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
        // Each sample is one acquisition by a blocked waiter and one release.
        requests_per_acq: Some(sent as f64 / (h.len() as f64).max(1.0)),
        ..Record::default()
    })
}

/// The hand-offs of `plan` between the two clients of `pair` on the lock `name`
/// ([`handoff_run`]).
pub(crate) async fn handoffs(
    pair: &Pair,
    name: &str,
    plan: &Plan,
) -> AnyResult<hdrhistogram::Histogram<u64>> {
    let hold_us = 1_000..plan.handoff_hold_ms.max(2) * 1_000;
    let deadline = Instant::now() + plan.handoff_limit;
    handoff_run(
        pair.contenders(name).await?,
        pair.handles.clone(),
        plan.handoff_samples,
        hold_us,
        deadline,
    )
    .await
}

/// `tasks` tasks spread over `clients` clients (round robin) looping on one name, measured for
/// a phase after a warm-up ([`contended_run`]). One client: scenario `contended` (or
/// `contended-1ms` with a critical section); more: `contended-clients`.
pub(crate) async fn contended(
    entry: &Entry,
    conn: &mut MultiplexedConnection,
    tasks: usize,
    clients: usize,
    critical: Duration,
    plan: &Plan,
) -> AnyResult<Record> {
    let mut libs: Vec<Arc<dyn Library>> = Vec::new();
    for _ in 0..clients.max(1) {
        libs.push((entry.connect)().await?);
    }
    let name = format!("c{}", fastrand::u32(..));
    let mut contenders = Vec::new();
    for t in 0..tasks {
        contenders.push(libs[t % libs.len()].contender(&name, None).await?);
    }
    let mut count = None;
    let counted = counting(entry, &libs, &mut count);
    let run = contended_run(
        conn,
        contenders,
        critical,
        plan.warm_up,
        plan.phase,
        counted,
    )
    .await?;
    drop(libs);
    Ok(Record {
        scenario: match (clients > 1, critical.is_zero()) {
            (true, _) => "contended-clients",
            (false, true) => "contended",
            (false, false) => "contended-1ms",
        },
        library: entry.name,
        tasks,
        clients: Some(clients as f64),
        ops_per_s: run.per_s,
        max_wait_ms: Some(run.max_wait.as_secs_f64() * 1000.0),
        jain: Some(run.jain),
        requests_per_acq: Some(run.requests_per_acq),
        retake_share: Some(run.retake_share),
        critical_section_ms: Some(critical.as_secs_f64() * 1000.0),
        ..Record::default()
    })
}

/// `tasks` tasks of one client loop on one name (empty critical section; with local hand-off
/// the hold passes between them) while one task of a second client takes the same name over
/// and over, 1 ms apart: the busy client's acquisitions per second and Redis requests per
/// acquisition, and the other client's waits (p50, p99, longest), against the bound local
/// hand-off documents.
pub(crate) async fn remote_waiter(
    entry: &Entry,
    conn: &mut MultiplexedConnection,
    tasks: usize,
    plan: &Plan,
) -> AnyResult<Record> {
    let (busy, other) = ((entry.connect)().await?, (entry.connect)().await?);
    let name = format!("r{}", fastrand::u32(..));
    let stop = Arc::new(AtomicBool::new(false));
    let measuring = Arc::new(AtomicBool::new(false));
    let counted = Arc::new(AtomicU64::new(0));
    let mut loops = Vec::new();
    for _ in 0..tasks {
        let contender = busy.contender(&name, None).await?;
        let (stop, measuring, counted) = (
            Arc::clone(&stop),
            Arc::clone(&measuring),
            Arc::clone(&counted),
        );
        loops.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                contender.lock().await?.release().await?;
                if measuring.load(Ordering::Relaxed) {
                    counted.fetch_add(1, Ordering::Relaxed);
                }
            }
            Ok::<_, Box<dyn Error + Send + Sync>>(())
        }));
    }
    let remote = other.contender(&name, None).await?;
    let libs = [Arc::clone(&busy), Arc::clone(&other)];
    let mut count = None;
    let counted_requests = counting(entry, &libs, &mut count);
    tokio::time::sleep(plan.warm_up).await;
    let before = counted_requests.read(conn).await?;
    measuring.store(true, Ordering::Relaxed);
    let started = Instant::now();
    let mut waits = hdrhistogram::Histogram::<u64>::new(3)?;
    while started.elapsed() < plan.phase {
        tokio::time::sleep(Duration::from_millis(1)).await;
        let asked = Instant::now();
        let hold = remote.lock().await?;
        waits.record(u64::try_from(asked.elapsed().as_micros()).unwrap_or(u64::MAX))?;
        hold.release().await?;
    }
    measuring.store(false, Ordering::Relaxed);
    let elapsed = started.elapsed().as_secs_f64();
    let after = counted_requests.read(conn).await?;
    stop.store(true, Ordering::Relaxed);
    for handle in loops {
        handle.await??;
    }
    let sent = counted_requests.between(&before, &after);
    drop(libs);
    drop((busy, other));
    let acquisitions = counted.load(Ordering::Relaxed) as f64 + waits.len() as f64;
    Ok(Record {
        scenario: "remote-waiter",
        library: entry.name,
        tasks,
        ops_per_s: counted.load(Ordering::Relaxed) as f64 / elapsed,
        requests_per_acq: Some(sent as f64 / acquisitions.max(1.0)),
        p50_us: Some(waits.value_at_quantile(0.5) as f64),
        p99_us: Some(waits.value_at_quantile(0.99) as f64),
        max_us: Some(waits.max() as f64),
        max_wait_ms: Some(waits.max() as f64 / 1000.0),
        samples: Some(waits.len() as f64),
        ..Record::default()
    })
}

/// `waiters` tasks of one client blocked on a name another client holds (with a long fixed
/// lease, so the holder sends nothing): the requests per second they cause.
pub(crate) async fn idle(
    entry: &Entry,
    conn: &mut MultiplexedConnection,
    plan: &Plan,
) -> AnyResult<Record> {
    let name = format!("i{}", fastrand::u32(..));
    let holder_lib = (entry.connect)().await?;
    let holder = holder_lib
        .contender(&name, Some(Duration::from_secs(300)))
        .await?
        .lock()
        .await?;
    let lib = (entry.connect)().await?;
    let libs = [Arc::clone(&holder_lib), Arc::clone(&lib)];
    let mut count = None;
    let counted = counting(entry, &libs, &mut count);
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
    let before = counted.read(conn).await?;
    let started = Instant::now();
    tokio::time::sleep(plan.idle_window).await;
    let after = counted.read(conn).await?;
    let elapsed = started.elapsed();
    let sent = counted.between(&before, &after);
    for w in &waiters {
        w.abort();
    }
    holder.release().await?;
    drop(libs);
    drop((lib, holder_lib));
    Ok(Record {
        scenario: "idle",
        library: entry.name,
        tasks: plan.idle_waiters,
        ops_per_s: sent as f64 / elapsed.as_secs_f64(),
        ..Record::default()
    })
}

/// `tasks` tasks over two clients looping on one semaphore (one yield while holding).
pub(crate) async fn semaphore(
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
    let mut count = None;
    let counted_requests = counting(entry, &libs, &mut count);
    let before = counted_requests.read(conn).await?;
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
    let after = counted_requests.read(conn).await?;
    let acquisitions = counted.load(Ordering::Relaxed) as f64;
    Ok(Record {
        scenario: "semaphore",
        library: entry.name,
        tasks,
        ops_per_s: ops,
        requests_per_acq: Some(
            counted_requests.between(&before, &after) as f64 / acquisitions.max(1.0),
        ),
        most_out: Some(most.load(Ordering::SeqCst) as f64),
        ..Record::default()
    })
}

/// Many guards held at once on one client: the renewal requests per second, and the client
/// process's CPU while it does nothing else. The guards are released (and the releases
/// awaited) after the window, so that none of their work falls into the next job.
pub(crate) async fn watchdog(
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
