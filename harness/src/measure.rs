//! What the contention figures are made of, shared by the benchmark (`redlatch bench`) and the
//! demonstration (`examples/contention.rs`): task loops, the raw-script reference and the
//! minimal lock's, request and server command counts from `INFO commandstats`, and the
//! machine's CPU accounting.

use std::collections::{HashMap, HashSet};
use std::error::Error;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use deadpool_redis::{Config, Pool, Runtime};
use redis::aio::MultiplexedConnection;

/// A result whose error is any error.
pub type AnyResult<T> = Result<T, Box<dyn Error + Send + Sync>>;
/// A boxed, sendable future.
pub type BoxFut<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The commands Lua sources run (by `redis.call`, `redis.pcall` or `calls_lib.lua`'s
/// `call_all`), lowercased.
pub fn script_commands(sources: &[&str]) -> Vec<String> {
    let mut set: HashSet<String> = HashSet::new();
    for src in sources {
        for (call, quote) in ["redis.call(", "redis.pcall(", "call_all("]
            .into_iter()
            .flat_map(|call| ['\'', '"'].map(|quote| (call, quote)))
        {
            let marker = format!("{call}{quote}");
            for rest in src.split(marker.as_str()).skip(1) {
                if let Some(cmd) = rest.split(quote).next() {
                    set.insert(cmd.to_lowercase());
                }
            }
        }
        // The wake-up command is named by the script's prelude: `PUBLISH` on one server,
        // `SPUBLISH` on a cluster.
        if src.contains("redis.call(PUBLISH") {
            set.insert("publish".to_owned());
            set.insert("spublish".to_owned());
        }
    }
    set.into_iter().collect()
}

/// The prelude of the single-server form of redlatch's scripts: it names the command that
/// publishes wake-ups (see `lua/README.md`). A script file run by hand needs it first.
pub const PLAIN: &str = "local PUBLISH = 'PUBLISH'\n";

/// The plain mutex's library, which the `mutex_*` scripts run after the prelude.
pub const MUTEX_LIB: &str = include_str!("../../lua/v1/mutex_lib.lua");

/// The library the queue scripts run first, after the prelude (`call_all`).
pub const CALLS_LIB: &str = include_str!("../../lua/v1/calls_lib.lua");

/// redlatch's script files (without the prelude).
pub const LUA: &[&str] = &[
    include_str!("../../lua/v1/mutex_acquire.lua"),
    include_str!("../../lua/v1/mutex_release.lua"),
    include_str!("../../lua/v1/mutex_extend.lua"),
    include_str!("../../lua/v1/keys_lib.lua"),
    include_str!("../../lua/v1/queue_lib.lua"),
    include_str!("../../lua/v1/queue_acquire_fast.lua"),
    include_str!("../../lua/v1/queue_acquire.lua"),
    include_str!("../../lua/v1/queue_release_fast.lua"),
    include_str!("../../lua/v1/queue_release.lua"),
    include_str!("../../lua/v1/queue_extend.lua"),
    include_str!("../../lua/v1/inspect.lua"),
    include_str!("../../lua/v1/force_unlock.lua"),
    include_str!("../../lua/v1/once_lib.lua"),
    MUTEX_LIB,
    CALLS_LIB,
    include_str!("../../lua/v1/mutex_release_fast.lua"),
    include_str!("../../lua/v1/queue_release_thin.lua"),
];

/// Runs `tasks` loops of `cycle(task)` for `phase`; returns cycles per second. Only cycles
/// that finished before the stop moment count: those still in flight then are let finish (and
/// their errors reported) but not counted.
pub async fn loop_tasks<F>(tasks: usize, phase: Duration, cycle: F) -> AnyResult<f64>
where
    F: Fn(usize) -> BoxFut<'static, AnyResult<()>> + Send + Sync + 'static,
{
    let cycle = Arc::new(cycle);
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut handles = Vec::new();
    for task in 0..tasks {
        let (stop, count, cycle) = (Arc::clone(&stop), Arc::clone(&count), Arc::clone(&cycle));
        handles.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                cycle(task).await?;
                count.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<_, Box<dyn Error + Send + Sync>>(())
        }));
    }
    tokio::time::sleep(phase).await;
    stop.store(true, Ordering::Relaxed);
    let counted = count.load(Ordering::Relaxed);
    let elapsed = started.elapsed();
    for h in handles {
        h.await??;
    }
    Ok(counted as f64 / elapsed.as_secs_f64())
}

/// When each of a set of tasks asked for a lock it does not have yet, so that the longest wait
/// also counts tasks still blocked when a measurement window ends.
#[derive(Debug)]
pub struct Waits {
    base: Instant,
    /// Per task: µs from `base` to the moment it asked, plus one; 0 while it is not waiting.
    asked: Vec<AtomicU64>,
}

impl Waits {
    /// Room for `tasks` tasks, none waiting.
    pub fn new(tasks: usize) -> Self {
        Self {
            base: Instant::now(),
            asked: (0..tasks).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// `task` asks now; returns the moment.
    pub fn asking(&self, task: usize) -> Instant {
        let now = Instant::now();
        let micros = now.duration_since(self.base).as_micros() as u64;
        self.asked[task].store(micros + 1, Ordering::SeqCst);
        now
    }

    /// `task` got what it asked for.
    pub fn got(&self, task: usize) {
        self.asked[task].store(0, Ordering::SeqCst);
    }

    /// The longest wait of the tasks still waiting at `at` (zero if none is).
    pub fn still_waiting_at(&self, at: Instant) -> Duration {
        self.asked
            .iter()
            .filter_map(|a| match a.load(Ordering::SeqCst) {
                0 => None,
                micros => Some(self.base + Duration::from_micros(micros - 1)),
            })
            .map(|asked| at.saturating_duration_since(asked))
            .max()
            .unwrap_or_default()
    }
}

/// `mutex_acquire` and `mutex_release` as this version's clients send them, for the raw loops
/// and the calls by hand below.
static ACQUIRE: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
    redis::Script::new(&format!("{PLAIN}{}{MUTEX_LIB}{}", LUA[3], LUA[0]))
});
static RELEASE: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
    redis::Script::new(&format!("{PLAIN}{}{MUTEX_LIB}{}", LUA[15], LUA[1]))
});

/// The queued primitives' scripts, called by hand on one server: how a fast path runs before
/// the queue library (`lua/README.md`), and the general path alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueScript {
    /// `queue_acquire` as a client sends it: its fast path first.
    Acquire,
    /// `queue_release` as a client sends it: its fast path first.
    Release,
    /// `queue_acquire` without its fast path.
    GeneralAcquire,
    /// `queue_release` without its fast path.
    GeneralRelease,
    /// `queue_acquire`'s fast path alone: no reply (nil) where it passes the call on to the
    /// general path, having changed nothing.
    FastAcquire,
    /// `queue_release`'s fast path alone, as [`QueueScript::FastAcquire`].
    FastRelease,
}

static QUEUE_SCRIPTS: std::sync::LazyLock<[redis::Script; 6]> = std::sync::LazyLock::new(|| {
    let (keys, queue) = (LUA[3], LUA[4]);
    let (acquire_fast, acquire, release_fast, release) = (LUA[5], LUA[6], LUA[7], LUA[8]);
    [
        format!("{PLAIN}{CALLS_LIB}{keys}{acquire_fast}{queue}{acquire}"),
        format!(
            "{PLAIN}{}{CALLS_LIB}{keys}{release_fast}{queue}{release}",
            LUA[16]
        ),
        format!("{PLAIN}{CALLS_LIB}{keys}{queue}{acquire}"),
        format!("{PLAIN}{CALLS_LIB}{keys}{queue}{release}"),
        format!("{PLAIN}{CALLS_LIB}{keys}{acquire_fast}"),
        format!("{PLAIN}{CALLS_LIB}{keys}{release_fast}"),
    ]
    .map(|code| redis::Script::new(&code))
});

impl QueueScript {
    /// The script itself, for calls with keys and arguments of the caller's own.
    pub fn script(self) -> &'static redis::Script {
        &QUEUE_SCRIPTS[self as usize]
    }

    /// A call of the script on the name whose meta key is `key` (its four keys set).
    fn call(self, key: &str) -> redis::ScriptInvocation<'static> {
        let mut call = self.script().prepare_invoke();
        for k in ["", ":holders", ":queue", ":fence"] {
            call.key(format!("{key}{k}"));
        }
        call
    }

    /// An acquire (`Acquire` or `GeneralAcquire`) of one unit of `op` under `layout` (a
    /// semaphore of one permit) for a fresh `owner` of `client`, with a 30 s lease, queued with
    /// `grace` ms if the name is busy (0: try once). Replies `{1, fence, holds}` or
    /// `{0, wait, ticket}`.
    pub fn acquire(
        self,
        key: &str,
        (layout, op): (&str, &str),
        owner: &str,
        client: &str,
        grace: u64,
    ) -> redis::ScriptInvocation<'static> {
        self.acquire_units(
            key,
            (layout, op),
            (1, u32::from(op == "s")),
            owner,
            client,
            grace,
        )
    }

    /// An acquire as [`QueueScript::acquire`] makes, of `units` units of a semaphore of `cap`
    /// permits (for another op: 1 and 0).
    pub fn acquire_units(
        self,
        key: &str,
        want: (&str, &str),
        units: (u32, u32),
        owner: &str,
        client: &str,
        grace: u64,
    ) -> redis::ScriptInvocation<'static> {
        self.acquire_for(key, want, units, (owner, client), (30_000, grace))
    }

    /// An acquire as [`QueueScript::acquire_units`] makes, with a lease of `lease` ms.
    pub fn acquire_for(
        self,
        key: &str,
        (layout, op): (&str, &str),
        (units, cap): (u32, u32),
        (owner, client): (&str, &str),
        (lease, grace): (u64, u64),
    ) -> redis::ScriptInvocation<'static> {
        let mut call = self.call(key);
        call.arg(layout)
            .arg(op)
            .arg(owner)
            .arg(units)
            .arg(cap)
            .arg(lease)
            .arg(grace)
            .arg(60_000)
            .arg(format!("{key}:wake"))
            .arg("new")
            .arg(client);
        call
    }

    /// A release (`Release` or `GeneralRelease`) of `owner`'s hold of `op` under `layout`.
    /// Replies `{2}` when it let go of its last hold.
    pub fn release(
        self,
        key: &str,
        (layout, op): (&str, &str),
        owner: &str,
    ) -> redis::ScriptInvocation<'static> {
        let mut call = self.call(key);
        call.arg(layout)
            .arg(op)
            .arg(owner)
            .arg(format!("{key}:wake"))
            .arg(60_000);
        call
    }
}

/// The physical reference: what redlatch's `Mutex` sends on an uncontended cycle, by hand,
/// `tasks` tasks on distinct names sharing one multiplexed connection (from a pool of its own,
/// not the library's), with no library logic at all: the acquire of a free lock in one round
/// trip of plain commands (`SET NX PX` of the lock, `ZADD XX GT CH` of the fence key to the
/// proposed token, above the last one the task issued), then `mutex_release` by `EVALSHA` with
/// the string the grant wrote alone, which its fast path compares and deletes. Each name is taken
/// once by `mutex_acquire` first (its fence key made).
pub async fn raw_cycles(url: &str, prefix: &str, tasks: usize, phase: Duration) -> AnyResult<f64> {
    let pool: Pool = Config::from_url(url).create_pool(Some(Runtime::Tokio1))?;
    let mut conn = deadpool_redis::Connection::take(pool.get().await?);
    // The server's clock, read once and moved on by ours, as the library's estimate is: fresh
    // tokens start from it.
    let base = (server_micros(&mut conn).await?, Instant::now());
    let prefix = prefix.to_owned();
    let floor = move || base.0 + u64::try_from(base.1.elapsed().as_micros()).unwrap_or(0);
    // Names in use, as the library's uncontended scenario has them.
    for task in 0..tasks {
        let lock = format!("{prefix}:{{raw-{task}}}");
        let owner = uuid::Uuid::new_v4().simple().to_string();
        raw_mutex_acquire(&mut conn, &lock, &owner, floor()).await?;
        raw_mutex_release(&mut conn, &lock, &owner).await?;
    }
    tokio::time::sleep(WARM_NAMES).await;
    // Each task's last token, which the next proposal passes, as the library's does.
    let last: Arc<Vec<AtomicU64>> = Arc::new((0..tasks).map(|_| AtomicU64::new(0)).collect());
    loop_tasks(tasks, phase, move |task| {
        let mut conn = conn.clone();
        let lock = format!("{prefix}:{{raw-{task}}}");
        let last = Arc::clone(&last);
        Box::pin(async move {
            let owner = uuid::Uuid::new_v4().simple().to_string();
            let token = floor().max(last[task].load(Ordering::Relaxed) + 1);
            last[task].store(token, Ordering::Relaxed);
            let value = format!("mutex:2 {token} 1 - {owner}");
            let (set, confirmed): (Option<String>, i64) = redis::pipe()
                .cmd("SET")
                .arg(&lock)
                .arg(&value)
                .arg("NX")
                .arg("PX")
                .arg(30_000)
                .cmd("ZADD")
                .arg(format!("{lock}:fence"))
                .arg("XX")
                .arg("GT")
                .arg("CH")
                .arg(token)
                .arg("~")
                .query_async(&mut conn)
                .await?;
            if set.is_none() || confirmed != 1 {
                return Err(format!("{lock}: not taken in one round trip").into());
            }
            // The short form: the string alone (`lua/README.md`).
            let _: redis::Value = RELEASE
                .key(&lock)
                .arg(&value)
                .invoke_async(&mut conn)
                .await?;
            Ok(())
        })
    })
    .await
}

/// How long the uncontended scenarios wait after taking each name once: more than the second
/// in which a name's new fencing counter runs ahead of the server clock (a fresh token then
/// costs a second write), so that they measure names in use.
pub const WARM_NAMES: Duration = Duration::from_millis(1_100);

/// The server's clock (`TIME`) in µs.
pub async fn server_micros(conn: &mut MultiplexedConnection) -> redis::RedisResult<u64> {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(conn).await?;
    Ok(secs.saturating_mul(1_000_000).saturating_add(micros))
}

/// One call of `mutex_acquire` by hand, as a client of this version would send it: a fresh
/// claim for `owner` on `lock`, tokens from at least `floor` (0: the server clock). The reply,
/// as strings.
pub async fn raw_mutex_acquire(
    conn: &mut MultiplexedConnection,
    lock: &str,
    owner: &str,
    floor: u64,
) -> redis::RedisResult<Vec<String>> {
    ACQUIRE
        .key(lock)
        .key(format!("{lock}:fence"))
        .arg(owner)
        .arg(30_000)
        .arg(60_000)
        .arg("new")
        .arg("-")
        .arg(floor)
        .invoke_async(conn)
        .await
}

/// One call of `mutex_release` by hand: releases one hold of `owner` on `lock`. The reply's
/// status (`1` still held, `2` freed, `0` not held).
pub async fn raw_mutex_release(
    conn: &mut MultiplexedConnection,
    lock: &str,
    owner: &str,
) -> redis::RedisResult<i64> {
    let reply: Vec<i64> = RELEASE
        .key(lock)
        .arg(owner)
        .arg(format!("{lock}:wake"))
        .invoke_async(conn)
        .await?;
    Ok(reply.first().copied().unwrap_or_default())
}

/// The floor of a chain of hand-overs through Redis, the reference of the contended scenario
/// over clients: a message relayed around `clients` clients in a ring, each passing it on the
/// moment it hears it (a `PUBLISH` on a connection of its own to the next client's channel,
/// heard on a RESP3 subscription whose reader wakes a waiting task, as redlatch's clients hear
/// releases). No lock, no script: what a queued hand-over costs at the least on this machine
/// (a release that names the next holder in another client, who releases in turn), with one
/// message in flight. Passes per second, counted over `phase` after `warm_up`.
pub async fn relay_passes(
    url: &str,
    prefix: &str,
    clients: usize,
    warm_up: Duration,
    phase: Duration,
) -> AnyResult<f64> {
    let clients = clients.max(2);
    let plain = redis::Client::open(url)?;
    let info = plain.get_connection_info().clone();
    let settings = info
        .redis_settings()
        .clone()
        .set_protocol(redis::ProtocolVersion::RESP3);
    let resp3 = redis::Client::open(info.set_redis_settings(settings))?;
    let channels: Vec<String> = (0..clients)
        .map(|i| format!("{prefix}:relay:{i}"))
        .collect();
    // Per client: its subscription (kept until the end), what it hears, its own connection.
    let mut ends = Vec::new();
    for channel in &channels {
        let heard = Arc::new(tokio::sync::Notify::new());
        let config = redis::AsyncConnectionConfig::new().set_push_sender(Heard(Arc::clone(&heard)));
        let mut subscription = resp3
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        subscription.subscribe(channel).await?;
        let own = plain.get_multiplexed_async_connection().await?;
        ends.push((subscription, heard, own));
    }
    let passes = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for (i, (_, heard, own)) in ends.iter().enumerate() {
        let (heard, mut own) = (Arc::clone(heard), own.clone());
        let next = channels[(i + 1) % clients].clone();
        let (passes, stop) = (Arc::clone(&passes), Arc::clone(&stop));
        tasks.push(tokio::spawn(async move {
            loop {
                heard.notified().await;
                if stop.load(Ordering::Relaxed) {
                    return Ok::<_, Box<dyn Error + Send + Sync>>(());
                }
                passes.fetch_add(1, Ordering::Relaxed);
                let _: i64 = redis::cmd("PUBLISH")
                    .arg(&next)
                    .arg("x")
                    .query_async(&mut own)
                    .await?;
            }
        }));
    }
    let mut first = ends[0].2.clone();
    let _: i64 = redis::cmd("PUBLISH")
        .arg(&channels[0])
        .arg("x")
        .query_async(&mut first)
        .await?;
    tokio::time::sleep(warm_up).await;
    let (before, started) = (passes.load(Ordering::Relaxed), Instant::now());
    tokio::time::sleep(phase).await;
    let counted = passes.load(Ordering::Relaxed).saturating_sub(before);
    let elapsed = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    // A task waiting to hear is let go (a task still publishing finds the permit next).
    for (_, heard, _) in &ends {
        heard.notify_one();
    }
    for task in tasks {
        task.await??;
    }
    if counted == 0 {
        return Err("the relay's message was never passed on".into());
    }
    Ok(counted as f64 / elapsed.as_secs_f64())
}

/// A relay client's subscription reader: each message wakes the client's task.
struct Heard(Arc<tokio::sync::Notify>);

impl redis::aio::AsyncPushSender for Heard {
    fn send(&self, info: redis::PushInfo) -> Result<(), redis::aio::SendError> {
        if info.kind == redis::PushKind::Message {
            self.0.notify_one();
        }
        Ok(())
    }
}

/// The minimal correct lock, the floor every library is measured against: `SET key token NX PX`
/// to acquire, a Lua compare-and-delete by `EVALSHA` to release (no re-entry, no fencing, no
/// wake-up), `tasks` tasks on distinct names sharing one multiplexed connection (from a pool of
/// its own).
pub async fn minimal_cycles(
    url: &str,
    prefix: &str,
    tasks: usize,
    phase: Duration,
) -> AnyResult<f64> {
    let pool: Pool = Config::from_url(url).create_pool(Some(Runtime::Tokio1))?;
    let conn = deadpool_redis::Connection::take(pool.get().await?);
    let prefix = prefix.to_owned();
    loop_tasks(tasks, phase, move |task| {
        let mut conn = conn.clone();
        let lock = format!("{prefix}:minimal-{task}");
        Box::pin(async move { minimal_cycle(&mut conn, &lock).await })
    })
    .await
}

/// One cycle of the minimal lock on `lock`: [`minimal_acquire`], then [`minimal_release`].
pub async fn minimal_cycle(conn: &mut MultiplexedConnection, lock: &str) -> AnyResult<()> {
    let owner = minimal_acquire(conn, lock).await?;
    minimal_release(conn, lock, &owner).await
}

/// The minimal lock's acquire: `SET lock token NX PX 30000`; returns the token. An error if
/// the lock was not free.
pub async fn minimal_acquire(conn: &mut MultiplexedConnection, lock: &str) -> AnyResult<String> {
    let owner = uuid::Uuid::new_v4().simple().to_string();
    let set: Option<String> = redis::cmd("SET")
        .arg(lock)
        .arg(&owner)
        .arg("NX")
        .arg("PX")
        .arg(30_000)
        .query_async(conn)
        .await?;
    if set.is_none() {
        return Err(format!("{lock} was not free").into());
    }
    Ok(owner)
}

/// The minimal lock's release: a Lua compare-and-delete of `owner`'s hold. An error if it did
/// not hold the lock.
pub async fn minimal_release(
    conn: &mut MultiplexedConnection,
    lock: &str,
    owner: &str,
) -> AnyResult<()> {
    static COMPARE_AND_DELETE: std::sync::LazyLock<redis::Script> =
        std::sync::LazyLock::new(|| {
            redis::Script::new(
                "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) \
             else return 0 end",
            )
        });
    let released: i64 = COMPARE_AND_DELETE
        .key(lock)
        .arg(owner)
        .invoke_async(conn)
        .await?;
    if released != 1 {
        return Err(format!("{lock} was not released").into());
    }
    Ok(())
}

/// Commands the server ran between two snapshots, those scripts ran included (a script call
/// counts once, and each command it ran once more), leaving out the measurement's `INFO`.
pub fn server_commands(before: &HashMap<String, u64>, after: &HashMap<String, u64>) -> u64 {
    requests(before, after, &[])
}

/// `INFO commandstats` as command → calls.
pub async fn commandstats(conn: &mut MultiplexedConnection) -> AnyResult<HashMap<String, u64>> {
    Ok(command_times(conn)
        .await?
        .into_iter()
        .map(|(name, (calls, _))| (name, calls))
        .collect())
}

/// `INFO commandstats` as command → (calls, µs spent in them). A script's time includes the
/// commands it ran, which are counted on their own too.
pub async fn command_times(
    conn: &mut MultiplexedConnection,
) -> AnyResult<HashMap<String, (u64, u64)>> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await?;
    Ok(info
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("cmdstat_")?;
            let (name, stats) = rest.split_once(':')?;
            let field = |key: &str| -> Option<u64> {
                stats
                    .split(',')
                    .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))?
                    .parse()
                    .ok()
            };
            Some((name.to_owned(), (field("calls")?, field("usec")?)))
        })
        .collect())
}

/// Requests clients sent between two snapshots: every command but those in `inside` (run by
/// scripts) and the measurement's `INFO`.
pub fn requests(
    before: &HashMap<String, u64>,
    after: &HashMap<String, u64>,
    inside: &[String],
) -> u64 {
    after
        .iter()
        .filter(|(name, _)| name.as_str() != "info" && !inside.iter().any(|i| i == *name))
        .map(|(name, calls)| calls.saturating_sub(before.get(name).copied().unwrap_or(0)))
        .sum()
}

/// Stolen and total CPU ticks so far (`/proc/stat`, Linux only).
pub fn cpu_steal() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let ticks: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .take(8)
        .filter_map(|t| t.parse().ok())
        .collect();
    (ticks.len() == 8).then(|| (ticks[7], ticks.iter().sum()))
}

/// CPU seconds this process has used (`/proc/self/stat`, Linux only; 100 ticks a second).
pub fn process_cpu() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let after_name = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0)
}

/// CPU seconds the Redis server's process has used (`INFO cpu`: user and system time of all
/// its threads).
pub async fn server_cpu(conn: &mut MultiplexedConnection) -> AnyResult<f64> {
    let info: String = redis::cmd("INFO").arg("cpu").query_async(conn).await?;
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.trim().parse::<f64>().ok())
    };
    match (field("used_cpu_user"), field("used_cpu_sys")) {
        (Some(user), Some(sys)) => Ok(user + sys),
        _ => Err("INFO cpu has no used_cpu_user and used_cpu_sys".into()),
    }
}

/// `text` with the glob characters of Redis patterns (`*?[]\`) escaped, for `MATCH`.
pub fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Deletes every key in the namespace `prefix`: the keys named `{prefix}:...`, found with
/// `SCAN` (never `KEYS`, which blocks the server), so another process's prefix that merely
/// starts the same is left alone.
pub async fn cleanup(conn: &mut MultiplexedConnection, prefix: &str) -> AnyResult<()> {
    let pattern = format!("{}:*", glob_escape(prefix));
    let mut keys: Vec<String> = Vec::new();
    let mut cursor: u64 = 0;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await?;
        keys.extend(batch);
        if next == 0 {
            break;
        }
        cursor = next;
    }
    keys.sort_unstable();
    keys.dedup();
    for chunk in keys.chunks(1000) {
        let _: () = redis::cmd("DEL").arg(chunk).query_async(conn).await?;
    }
    Ok(())
}

/// A one-line note for stderr when a tool runs against a server it was given rather than one
/// of its own (`source`: where the URL came from). A password in the URL is not shown.
pub fn given_server_note(tool: &str, url: &str, source: &str) -> String {
    format!(
        "{tool}: running against the given server {} (from {source}), not a server of its own",
        redact(url)
    )
}

/// `url` with the password (if any) replaced by `***`: the one before `@`, and a `pass=` or
/// `password=` in the query, where redis-rs reads a Unix socket URL's
/// (`redis+unix:///run/redis.sock?pass=...`).
pub fn redact(url: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let mut out = redact_authority(base);
    if let Some(query) = query {
        let pairs: Vec<String> = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((key, _)) if key == "pass" || key == "password" => format!("{key}=***"),
                _ => pair.to_owned(),
            })
            .collect();
        out.push('?');
        out.push_str(&pairs.join("&"));
    }
    out
}

/// `url` (without its query) with the password before `@` (if any) replaced by `***`.
fn redact_authority(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return url.to_owned();
    };
    let host = &rest[at + 1..];
    match rest[..at].split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
        // `redis://password@host` is how some clients give a password alone.
        None if at > 0 => format!("{scheme}://***@{host}"),
        None => url.to_owned(),
    }
}

/// One task's hold on the lock of a contended run: how to take it and give it back.
pub trait Contend: Send + Sync + 'static {
    /// What holding the lock looks like.
    type Guard: Send + 'static;
    /// Waits for the lock as the library waits by default.
    fn take(&self) -> BoxFut<'_, AnyResult<Self::Guard>>;
    /// Gives it back and waits for the answer.
    fn give_back(guard: Self::Guard) -> BoxFut<'static, AnyResult<()>>;
}

/// What a contended run measured.
#[derive(Debug, Clone, Copy)]
pub struct ContendedRun {
    /// Acquisitions per second.
    pub per_s: f64,
    /// Requests per acquisition.
    pub requests_per_acq: f64,
    /// Share of acquisitions by the task that held the lock before.
    pub retake_share: f64,
    /// The longest wait for the lock.
    pub max_wait: Duration,
    /// Jain's fairness index over the tasks' acquisition counts.
    pub jain: f64,
}

/// How a measurement counts the requests its clients send.
#[derive(Clone, Copy)]
pub enum Counting<'a> {
    /// From the server's command statistics: every command that is not one of these, which
    /// the clients' scripts run inside Redis.
    Server(&'a [String]),
    /// From the clients themselves (redlatch's `LockClient::requests`, summed): a round trip
    /// of several plain commands counts once, which the server's statistics cannot tell from
    /// the same commands run inside a script.
    Clients(&'a (dyn Fn() -> u64 + Send + Sync)),
}

impl std::fmt::Debug for Counting<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Server(inside) => f.debug_tuple("Server").field(inside).finish(),
            Self::Clients(_) => f.write_str("Clients"),
        }
    }
}

/// One reading of a [`Counting`], to take the difference of two.
#[derive(Debug)]
pub enum Tally {
    /// The server's command statistics.
    Server(HashMap<String, u64>),
    /// The clients' own count.
    Clients(u64),
}

impl Counting<'_> {
    /// Reads the count now (the server's statistics over `conn`).
    pub async fn read(&self, conn: &mut MultiplexedConnection) -> AnyResult<Tally> {
        Ok(match self {
            Self::Server(_) => Tally::Server(commandstats(conn).await?),
            Self::Clients(count) => Tally::Clients(count()),
        })
    }

    /// The requests sent between two readings.
    pub fn between(&self, before: &Tally, after: &Tally) -> u64 {
        match (self, before, after) {
            (Self::Server(inside), Tally::Server(b), Tally::Server(a)) => requests(b, a, inside),
            (_, Tally::Clients(b), Tally::Clients(a)) => a.saturating_sub(*b),
            _ => 0,
        }
    }
}

/// One task per contender looping on one lock (holding it for `critical`, if not zero),
/// measured for `phase` after `warm_up`. Requests are counted over the window as `counting`
/// says. The longest wait counts the acquisitions of the window and, at its end, the tasks
/// still waiting then (their wait so far).
pub async fn contended_run<C: Contend>(
    conn: &mut MultiplexedConnection,
    contenders: Vec<C>,
    critical: Duration,
    warm_up: Duration,
    phase: Duration,
    counting: Counting<'_>,
) -> AnyResult<ContendedRun> {
    let stop = Arc::new(AtomicBool::new(false));
    let measuring = Arc::new(AtomicBool::new(false));
    let last = Arc::new(std::sync::Mutex::new(usize::MAX));
    let retakes = Arc::new(AtomicU64::new(0));
    let waits = Arc::new(Waits::new(contenders.len()));
    let mut handles = Vec::new();
    for (id, contender) in contenders.into_iter().enumerate() {
        let (stop, measuring, last, retakes, waits) = (
            Arc::clone(&stop),
            Arc::clone(&measuring),
            Arc::clone(&last),
            Arc::clone(&retakes),
            Arc::clone(&waits),
        );
        handles.push(tokio::spawn(async move {
            let (mut count, mut max_wait) = (0u64, Duration::ZERO);
            while !stop.load(Ordering::Relaxed) {
                let asked = waits.asking(id);
                let guard = contender.take().await?;
                waits.got(id);
                if measuring.load(Ordering::SeqCst) {
                    max_wait = max_wait.max(asked.elapsed());
                    count += 1;
                    let mut last = last.lock().map_err(|_| "poisoned")?;
                    if *last == id {
                        retakes.fetch_add(1, Ordering::Relaxed);
                    }
                    *last = id;
                }
                if !critical.is_zero() {
                    tokio::time::sleep(critical).await;
                }
                C::give_back(guard).await?;
            }
            Ok::<_, Box<dyn Error + Send + Sync>>((count, max_wait))
        }));
    }
    tokio::time::sleep(warm_up).await;
    let before = counting.read(conn).await?;
    measuring.store(true, Ordering::SeqCst);
    let started = Instant::now();
    tokio::time::sleep(phase).await;
    // Tasks still waiting at the stop count with their wait so far; one that gets the lock
    // between this look and the end of `measuring` counts its whole wait itself.
    let stopped = Instant::now();
    let mut max_wait = waits.still_waiting_at(stopped);
    measuring.store(false, Ordering::SeqCst);
    let elapsed = stopped - started;
    let after = counting.read(conn).await?;
    stop.store(true, Ordering::Relaxed);
    let mut counts = Vec::new();
    for h in handles {
        let (count, wait) = h.await??;
        counts.push(count as f64);
        max_wait = max_wait.max(wait);
    }
    let total: f64 = counts.iter().sum();
    let squares: f64 = counts.iter().map(|c| c * c).sum();
    Ok(ContendedRun {
        per_s: total / elapsed.as_secs_f64(),
        requests_per_acq: counting.between(&before, &after) as f64 / total.max(1.0),
        retake_share: retakes.load(Ordering::Relaxed) as f64 / total.max(1.0),
        max_wait,
        jain: total * total / (counts.len() as f64 * squares.max(1.0)),
    })
}

/// Hand-offs between two tasks taking turns on one lock, each with its own contender (in its
/// own client) and run on its client's runtime (`runtimes`). The holder waits until the other
/// task is inside its acquire call, holds a random `hold_us` more, and releases; a sample is the
/// time from the start of the release to the waiter's acquire returning. The releaser asks
/// again only after the other task has the lock, so every sample is a hand-off to a different
/// task that was already blocked. Ends at `samples` samples, or at `deadline` with what it has.
pub async fn handoff_run<C: Contend>(
    contenders: [C; 2],
    runtimes: [tokio::runtime::Handle; 2],
    samples: u64,
    hold_us: std::ops::Range<u64>,
    deadline: Instant,
) -> AnyResult<hdrhistogram::Histogram<u64>> {
    let hist = Arc::new(std::sync::Mutex::new(hdrhistogram::Histogram::<u64>::new(
        3,
    )?));
    let waiting = Arc::new([AtomicBool::new(false), AtomicBool::new(false)]);
    let released = Arc::new(std::sync::Mutex::new(None::<(usize, Instant)>));
    let done = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for (id, (contender, runtime)) in contenders.into_iter().zip(runtimes).enumerate() {
        let (hist, waiting, released, done, hold_us) = (
            Arc::clone(&hist),
            Arc::clone(&waiting),
            Arc::clone(&released),
            Arc::clone(&done),
            hold_us.clone(),
        );
        tasks.push(runtime.spawn(async move {
            loop {
                waiting[id].store(true, Ordering::SeqCst);
                let guard = contender.take().await?;
                let acquired = Instant::now();
                waiting[id].store(false, Ordering::SeqCst);
                let previous = released.lock().map_err(|_| "poisoned")?.take();
                if let Some((by, at)) = previous
                    && by != id
                {
                    let mut h = hist.lock().map_err(|_| "poisoned")?;
                    h.record((acquired - at).as_micros() as u64)?;
                    if h.len() >= samples || Instant::now() >= deadline {
                        done.store(true, Ordering::SeqCst);
                    }
                }
                if done.load(Ordering::SeqCst) {
                    C::give_back(guard).await?;
                    return Ok::<_, Box<dyn Error + Send + Sync>>(());
                }
                while !waiting[1 - id].load(Ordering::SeqCst) && !done.load(Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_micros(200)).await;
                }
                tokio::time::sleep(Duration::from_micros(fastrand::u64(hold_us.clone()))).await;
                *released.lock().map_err(|_| "poisoned")? = Some((id, Instant::now()));
                C::give_back(guard).await?;
                while released.lock().map_err(|_| "poisoned")?.is_some()
                    && !done.load(Ordering::SeqCst)
                {
                    tokio::time::sleep(Duration::from_micros(100)).await;
                }
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    let h = hist.lock().map_err(|_| "poisoned")?.clone();
    Ok(h)
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn redact_hides_every_password_a_redis_url_can_carry() {
        for (url, shown) in [
            ("redis://u:secret@h:6379/0", "redis://u:***@h:6379/0"),
            ("redis://secret@h", "redis://***@h"),
            ("redis://h:6379", "redis://h:6379"),
            (
                "redis+unix:///run/r.sock?db=1&pass=secret&user=u",
                "redis+unix:///run/r.sock?db=1&pass=***&user=u",
            ),
            (
                "unix:///run/r.sock?password=secret",
                "unix:///run/r.sock?password=***",
            ),
            (
                "rediss://u:secret@h/?protocol=resp3",
                "rediss://u:***@h/?protocol=resp3",
            ),
        ] {
            assert_eq!(redact(url), shown);
        }
    }
}
