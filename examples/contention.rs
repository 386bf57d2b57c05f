//! The oversell demonstration and the contention figures.
//!
//! ```text
//! cargo run --release --example contention            # starts its own redis-server
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --release --example contention -- --json
//! ```
//!
//! Buyers run check-then-decrement on a stock counter, first without a lock (some stock is
//! sold twice), then under a `Mutex` (none is). Then it measures, against the same server:
//! uncontended lock+unlock cycles of 32 tasks beside the same requests sent by hand by 32 tasks (on
//! a connection of their own, without the library), the hand-off latency from a release to a
//! blocked waiter, and 16 tasks fighting over one name.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use deadpool_redis::{Config, Pool, Runtime};
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use redis::aio::MultiplexedConnection;
use redlatch::LockClient;
use redlatch_harness::{measure, server};

use measure::{
    AnyResult, BoxFut, Contend, ContendedRun, contended_run, cpu_steal, handoff_run, loop_tasks,
};

#[derive(Parser, Debug)]
#[command(about = "redlatch under contention: oversell demo and lock figures")]
struct Args {
    /// Print one JSON object with every figure as the last line.
    #[arg(long)]
    json: bool,
    /// Seconds for each throughput phase.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Hand-offs to sample.
    #[arg(long, default_value_t = 1000)]
    handoffs: u64,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match run().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("contention: {err}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run() -> AnyResult<()> {
    let args = Args::parse();
    let phase = Duration::from_secs_f64(args.seconds.max(0.5));
    // Our own server unless REDIS_URL names one; on a shared server we only touch our prefix.
    let (server, url) = server::try_named_or_own(std::env::var("REDIS_URL").ok())?;
    if server.is_none() {
        eprintln!(
            "{}",
            measure::given_server_note("contention", &url, "REDIS_URL")
        );
    }
    let prefix = format!("redlatch-demo-{}", std::process::id());
    let pool = || -> AnyResult<Pool> {
        let mut config = Config::from_url(&url);
        config.pool = Some(deadpool_redis::PoolConfig::new(64));
        Ok(config.create_pool(Some(Runtime::Tokio1))?)
    };
    let client = LockClient::builder(pool()?, url.as_str())
        .key_prefix(&prefix)
        .build()?;
    let mut conn = redis::Client::open(url.as_str())?
        .get_multiplexed_async_connection()
        .await?;

    let steal_before = cpu_steal();
    let bar = ProgressBar::new(10);
    bar.set_style(ProgressStyle::with_template(
        "{spinner} [{pos}/{len}] {msg} {elapsed}",
    )?);
    bar.enable_steady_tick(Duration::from_millis(100));

    bar.set_message("oversell without a lock");
    let stock_key = format!("{prefix}:stock");
    let oversold_unlocked = oversell(&mut conn, &stock_key, None).await?;
    bar.inc(1);
    bar.set_message("oversell under the mutex");
    let mutex = client.mutex("stock")?;
    let oversold_locked = oversell(&mut conn, &stock_key, Some(&mutex)).await?;
    bar.inc(1);

    bar.set_message(
        "uncontended cycles and the same requests by hand, 32 tasks on distinct names each",
    );
    let raw_cycles_per_s = measure::raw_cycles(&url, &prefix, 32, phase).await?;
    let cycles_per_s = cycles(&client, phase).await?;
    bar.inc(1);

    bar.set_message("hand-off latency");
    let waiter_client = LockClient::builder(pool()?, url.as_str())
        .key_prefix(&prefix)
        .build()?;
    let handoff = handoff(&client, &waiter_client, args.handoffs).await?;
    bar.inc(1);

    bar.set_message("16 tasks on one Mutex");
    let contended_plain = contended(&client, &mut conn, false, 16, phase).await?;
    let requests_plain = contended_plain.requests_per_acq;
    bar.inc(1);

    bar.set_message("16 tasks on one FairMutex");
    let contended_fair = contended(&client, &mut conn, true, 16, phase).await?;
    let requests_fair = contended_fair.requests_per_acq;
    bar.inc(1);

    bar.set_message("FairMutex order across two clients");
    let fair_order = fair_order(&client, &waiter_client).await?;
    bar.inc(1);

    bar.set_message("semaphore, 8 permits, 64 tasks");
    let sent = || client.requests() + waiter_client.requests();
    let before = sent();
    let semaphore = semaphore(&client, &waiter_client, phase).await?;
    let requests_semaphore = (sent() - before) as f64 / semaphore.acquisitions as f64;
    bar.inc(1);

    bar.set_message("readers and a writer");
    let rw = readers_and_writer(&client, &waiter_client).await?;
    bar.inc(1);
    bar.finish_and_clear();

    measure::cleanup(&mut conn, &prefix).await?;
    let steal_pct = steal_before
        .zip(cpu_steal())
        .map(|((s0, t0), (s1, t1))| 100.0 * (s1 - s0) as f64 / (t1 - t0).max(1) as f64);

    println!("oversell, 32 buyers, stock 100:");
    println!("  without a lock   {oversold_unlocked:>8} sold beyond the stock");
    println!("  under the mutex  {oversold_locked:>8} sold beyond the stock");
    println!("uncontended lock+unlock, 32 tasks on distinct names:");
    println!("  redlatch         {cycles_per_s:>10.0} cycles/s");
    println!(
        "  by hand          {raw_cycles_per_s:>10.0} cycles/s  (ratio {:.2})",
        cycles_per_s / raw_cycles_per_s
    );
    println!(
        "hand-off, release to a blocked waiter in another client ({} samples):",
        handoff.len()
    );
    println!(
        "  p50 {} µs   p99 {} µs   max {} µs",
        handoff.value_at_quantile(0.5),
        handoff.value_at_quantile(0.99),
        handoff.max()
    );
    println!("16 tasks of one client looping on one name, empty critical section:");
    println!("                         Mutex   FairMutex");
    let row = |label: &str, a: String, b: String| println!("  {label:<20} {a:>8}  {b:>10}");
    let (p, f) = (&contended_plain, &contended_fair);
    row(
        "acquisitions/s",
        format!("{:.0}", p.per_s),
        format!("{:.0}", f.per_s),
    );
    row(
        "re-taken by releaser",
        format!("{:.1}%", p.retake_share * 100.0),
        format!("{:.1}%", f.retake_share * 100.0),
    );
    row(
        "longest wait",
        format!("{:.1} ms", p.max_wait.as_secs_f64() * 1000.0),
        format!("{:.1} ms", f.max_wait.as_secs_f64() * 1000.0),
    );
    row(
        "Jain's index",
        format!("{:.4}", p.jain),
        format!("{:.4}", f.jain),
    );
    row(
        "requests/acquisition",
        format!("{requests_plain:.2}"),
        format!("{requests_fair:.2}"),
    );
    println!("FairMutex, 8 waiters queued in turn over two clients, served in the order:");
    println!("  {fair_order:?}");
    println!("semaphore, 8 permits, 64 tasks over two clients, a yield as critical section:");
    println!(
        "  {:.0} acquisitions/s (Mutex uncontended: {cycles_per_s:.0} cycles/s), {requests_semaphore:.2} requests/acquisition",
        semaphore.per_s
    );
    println!("  most permits out at once: {} of 8", semaphore.most);
    println!("read-write lock, 8 readers streaming over two clients, then a writer:");
    println!("  most readers at once: {}", rw.most_readers);
    println!(
        "  the writer got in after {:.1} ms, overlapping no reader: {}",
        rw.writer_wait.as_secs_f64() * 1000.0,
        rw.writer_alone
    );

    if let Some(pct) = steal_pct {
        println!(
            "CPU time the hypervisor took from this machine during the run (steal): {pct:.1}%"
        );
    }

    if args.json {
        let json = serde_json::json!({
            "oversold_unlocked": oversold_unlocked,
            "oversold_locked": oversold_locked,
            "cycles_per_s": cycles_per_s,
            "raw_cycles_per_s": raw_cycles_per_s,
            "cycles_ratio": cycles_per_s / raw_cycles_per_s,
            "handoff_samples": handoff.len(),
            "handoff_p50_us": handoff.value_at_quantile(0.5),
            "handoff_p99_us": handoff.value_at_quantile(0.99),
            "handoff_max_us": handoff.max(),
            "contended_tasks": 16,
            "contended_acq_per_s": contended_plain.per_s,
            "contended_retake_share": contended_plain.retake_share,
            "contended_max_wait_ms": contended_plain.max_wait.as_secs_f64() * 1000.0,
            "contended_jain": contended_plain.jain,
            "requests_per_acq": requests_plain,
            "fair_acq_per_s": contended_fair.per_s,
            "fair_retake_share": contended_fair.retake_share,
            "fair_max_wait_ms": contended_fair.max_wait.as_secs_f64() * 1000.0,
            "fair_jain": contended_fair.jain,
            "fair_requests_per_acq": requests_fair,
            "fair_order": fair_order,
            "semaphore_permits": 8,
            "semaphore_tasks": 64,
            "semaphore_acq_per_s": semaphore.per_s,
            "semaphore_most_out": semaphore.most,
            "semaphore_requests_per_acq": requests_semaphore,
            "rw_most_readers": rw.most_readers,
            "rw_writer_wait_ms": rw.writer_wait.as_secs_f64() * 1000.0,
            "rw_writer_alone": rw.writer_alone,
            "steal_pct": steal_pct,
            "server": if server.is_some() { "own" } else { "given" },
        });
        println!("{json}");
    }
    Ok(())
}

/// 32 buyers check the stock, then decrement it. Returns how many were sold beyond the stock.
async fn oversell(
    conn: &mut MultiplexedConnection,
    key: &str,
    mutex: Option<&redlatch::Mutex>,
) -> AnyResult<i64> {
    const STOCK: i64 = 100;
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg(STOCK)
        .query_async(conn)
        .await?;
    let sold = Arc::new(AtomicU64::new(0));
    let mut buyers = Vec::new();
    for _ in 0..32 {
        let mut conn = conn.clone();
        let key = key.to_owned();
        let mutex = mutex.cloned();
        let sold = Arc::clone(&sold);
        buyers.push(tokio::spawn(async move {
            loop {
                let guard = match &mutex {
                    Some(m) => Some(m.lock().await?),
                    None => None,
                };
                let left: i64 = redis::cmd("GET").arg(&key).query_async(&mut conn).await?;
                if left <= 0 {
                    break;
                }
                // The gap between check and act that a lock exists to close.
                tokio::task::yield_now().await;
                let _: i64 = redis::cmd("DECR").arg(&key).query_async(&mut conn).await?;
                sold.fetch_add(1, Ordering::Relaxed);
                if let Some(g) = guard {
                    g.unlock().await?;
                }
            }
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        }));
    }
    for b in buyers {
        b.await??;
    }
    Ok(sold.load(Ordering::Relaxed) as i64 - STOCK)
}

/// 32 tasks, each on its own name: `lock()` then `unlock()`.
async fn cycles(client: &LockClient, phase: Duration) -> AnyResult<f64> {
    let mutexes: Vec<_> = (0..32)
        .map(|i| client.mutex(&format!("cycle-{i}")))
        .collect::<Result<_, _>>()?;
    loop_tasks(32, phase, move |task| {
        let m = mutexes[task].clone();
        Box::pin(async move {
            m.lock().await?.unlock().await?;
            Ok(())
        })
    })
    .await
}

/// One holder and one waiter, in two clients, taking turns ([`handoff_run`]): the holder
/// holds 1 to 5 ms once the waiter is inside `lock()`; a sample is the time from the start of
/// its `unlock()` to the waiter's `lock()` returning.
async fn handoff(a: &LockClient, b: &LockClient, samples: u64) -> AnyResult<Histogram<u64>> {
    let contenders = [
        AnyMutex::new(a, false, "handoff")?,
        AnyMutex::new(b, false, "handoff")?,
    ];
    let deadline = Instant::now() + Duration::from_secs(60);
    // Both clients run on this runtime: the demo's processes are stand-ins in one.
    let here = tokio::runtime::Handle::current();
    handoff_run(
        contenders,
        [here.clone(), here],
        samples,
        1_000..5_000,
        deadline,
    )
    .await
}

/// The two mutexes, for the runs that compare them.
#[derive(Clone)]
enum AnyMutex {
    Plain(redlatch::Mutex),
    Fair(redlatch::FairMutex),
}

impl AnyMutex {
    fn new(client: &LockClient, fair: bool, name: &str) -> AnyResult<Self> {
        Ok(if fair {
            Self::Fair(client.fair_mutex(name)?)
        } else {
            Self::Plain(client.mutex(name)?)
        })
    }

    async fn lock(&self) -> redlatch::Result<redlatch::MutexGuard> {
        match self {
            Self::Plain(m) => m.lock().await,
            Self::Fair(m) => m.lock().await,
        }
    }
}

/// How long the contended loops run before they are measured: the queue forms and the
/// wake-up subscription is set up, which is not the steady state the figures describe.
const WARM_UP: Duration = Duration::from_millis(300);

impl Contend for AnyMutex {
    type Guard = redlatch::MutexGuard;

    fn take(&self) -> BoxFut<'_, AnyResult<redlatch::MutexGuard>> {
        Box::pin(async move { Ok(self.lock().await?) })
    }

    fn give_back(guard: redlatch::MutexGuard) -> BoxFut<'static, AnyResult<()>> {
        Box::pin(async move { Ok(guard.unlock().await?) })
    }
}

/// `tasks` tasks of one client looping lock/unlock on one name with an empty critical section,
/// measured for `phase` after a [`WARM_UP`] ([`contended_run`]).
async fn contended(
    client: &LockClient,
    conn: &mut MultiplexedConnection,
    fair: bool,
    tasks: usize,
    phase: Duration,
) -> AnyResult<ContendedRun> {
    let name = if fair { "contended-fair" } else { "contended" };
    let contenders = (0..tasks)
        .map(|_| AnyMutex::new(client, fair, name))
        .collect::<AnyResult<Vec<_>>>()?;
    // Requests as the client counts them: its round trips, whether scripts or plain commands.
    let requests = || client.requests();
    let counting = measure::Counting::Clients(&requests);
    contended_run(conn, contenders, Duration::ZERO, WARM_UP, phase, counting).await
}

/// Eight tasks over two clients queue on a held `FairMutex` one after another; returns the
/// order in which they got it.
async fn fair_order(a: &LockClient, b: &LockClient) -> AnyResult<Vec<usize>> {
    let holder = a.fair_mutex("order")?.lock().await?;
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..8 {
        let mutex = [a, b][i % 2].fair_mutex("order")?;
        let order = Arc::clone(&order);
        tasks.push(tokio::spawn(async move {
            let guard = mutex.lock().await?;
            order.lock().map_err(|_| "poisoned")?.push(i);
            guard.unlock().await?;
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        }));
        // Queued in turn: wait until Redis shows this waiter in the queue.
        while a.inspect("order").await?.waiters.len() < i + 1 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    holder.unlock().await?;
    for t in tasks {
        t.await??;
    }
    let order = order.lock().map_err(|_| "poisoned")?.clone();
    Ok(order)
}

struct SemaphoreRun {
    acquisitions: u64,
    per_s: f64,
    most: usize,
}

/// 64 tasks over two clients loop acquire/release on one semaphore of 8 permits, yielding
/// once while they hold it.
async fn semaphore(a: &LockClient, b: &LockClient, phase: Duration) -> AnyResult<SemaphoreRun> {
    let out = Arc::new(AtomicU64::new(0));
    let most = Arc::new(AtomicU64::new(0));
    let sems = [a.semaphore("permits", 8)?, b.semaphore("permits", 8)?];
    let count = Arc::new(AtomicU64::new(0));
    let (cycle_count, cycle_most) = (Arc::clone(&count), Arc::clone(&most));
    let per_s = loop_tasks(64, phase, move |task| {
        let (sem, out, most, count) = (
            sems[task % 2].clone(),
            Arc::clone(&out),
            Arc::clone(&cycle_most),
            Arc::clone(&cycle_count),
        );
        Box::pin(async move {
            let permit = sem.acquire().await?;
            let now = out.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            // The critical section: one yield, so holders can overlap.
            tokio::task::yield_now().await;
            out.fetch_sub(1, Ordering::SeqCst);
            permit.release().await?;
            count.fetch_add(1, Ordering::Relaxed);
            Ok(())
        })
    })
    .await?;
    Ok(SemaphoreRun {
        acquisitions: count.load(Ordering::Relaxed),
        per_s,
        most: most_of(&most),
    })
}

fn most_of(a: &AtomicU64) -> usize {
    a.load(Ordering::SeqCst) as usize
}

struct RwRun {
    most_readers: usize,
    writer_wait: Duration,
    writer_alone: bool,
}

/// Eight readers over two clients keep the lock read-held (each holds 2 ms, in a loop); then a
/// writer asks. It gets in once the readers ahead of it are done, and new readers wait.
async fn readers_and_writer(a: &LockClient, b: &LockClient) -> AnyResult<RwRun> {
    let stop = Arc::new(AtomicBool::new(false));
    let inside = Arc::new(AtomicU64::new(0));
    let most = Arc::new(AtomicU64::new(0));
    let mut readers = Vec::new();
    for t in 0..8 {
        let lock = [a, b][t % 2].rwlock("rw")?;
        let (stop, inside, most) = (Arc::clone(&stop), Arc::clone(&inside), Arc::clone(&most));
        readers.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let guard = lock.read().await?;
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(2)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                guard.unlock().await?;
            }
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        }));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let asked = Instant::now();
    let writer = b.rwlock("rw")?.write().await?;
    let writer_wait = asked.elapsed();
    let writer_alone = inside.load(Ordering::SeqCst) == 0;
    writer.unlock().await?;
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        r.await??;
    }
    Ok(RwRun {
        most_readers: most_of(&most),
        writer_wait,
        writer_alone,
    })
}
