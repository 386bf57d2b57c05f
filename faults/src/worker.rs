//! A worker process of the fault suite (what `faults worker <spec>` runs; see [`Spec`]): tasks
//! looping over critical sections on one name, logging every acquisition and section on
//! standard output.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::MultiplexedConnection;
use redlatch::{
    Error, Leadership, LockClient, Lost, MutexGuard, RwLockReadGuard, RwLockWriteGuard,
    SemaphorePermit,
};
use redlatch_harness::measure::QueueScript;
use redlatch_harness::resource::Resource;

use crate::clock::{Clock, now_ns};
use crate::event::{Event, Section};
use crate::spec::{Kind, MORE_SECTIONS, Spec, faulting_flag};

/// A hold of any of the primitives.
enum Guard {
    Lock(MutexGuard),
    Permit(SemaphorePermit),
    Read(RwLockReadGuard),
    Write(RwLockWriteGuard),
    Leader(Leadership),
}

macro_rules! each {
    ($guard:expr, $g:ident => $body:expr) => {
        match $guard {
            Guard::Lock($g) => $body,
            Guard::Permit($g) => $body,
            Guard::Read($g) => $body,
            Guard::Write($g) => $body,
            Guard::Leader($g) => $body,
        }
    };
}

impl Guard {
    fn token(&self) -> u64 {
        match self {
            Self::Lock(g) => g.fencing_token(),
            Self::Permit(g) => g.fencing_token(),
            Self::Read(_) => 0,
            Self::Write(g) => g.fencing_token(),
            Self::Leader(g) => g.term(),
        }
    }

    fn exclusive(&self) -> bool {
        matches!(self, Self::Lock(_) | Self::Write(_) | Self::Leader(_))
    }

    fn valid_until(&self) -> std::time::Instant {
        each!(self, g => g.valid_until())
    }

    fn is_held(&self) -> bool {
        each!(self, g => g.is_held())
    }

    fn lost(&self) -> Lost {
        each!(self, g => g.lost())
    }

    /// Extends the hold; for a leadership, which the watchdog alone renews, proclaims its
    /// value again: both are refused once the hold is lost.
    async fn extend(&mut self, lease: Duration) -> redlatch::Result<()> {
        match self {
            Self::Lock(g) => g.extend(lease).await,
            Self::Permit(g) => g.extend(lease).await,
            Self::Read(g) => g.extend(lease).await,
            Self::Write(g) => g.extend(lease).await,
            Self::Leader(g) => {
                let value = g.value().to_owned();
                g.proclaim(value).await
            }
        }
    }

    async fn release(self) -> redlatch::Result<()> {
        match self {
            Self::Lock(g) => g.unlock().await,
            Self::Permit(g) => g.release().await,
            Self::Read(g) => g.unlock().await,
            Self::Write(g) => g.unlock().await,
            Self::Leader(g) => g.resign().await,
        }
    }
}

fn outcome(result: redlatch::Result<()>) -> String {
    match result {
        Ok(()) => "ok".to_owned(),
        Err(Error::NotHeld { .. }) => "notheld".to_owned(),
        Err(Error::Timeout { .. }) => "timeout".to_owned(),
        Err(other) => format!("error:{other}"),
    }
}

/// What the worker shares between its tasks.
struct Worker {
    spec: Spec,
    client: LockClient,
    resource: Resource,
    conn: MultiplexedConnection,
    clock: Clock,
    /// A task of this worker keeps holding for the hold flag: only one at a time.
    holding: AtomicBool,
}

impl Worker {
    fn lease(&self) -> Duration {
        Duration::from_millis(self.spec.lease_ms)
    }

    async fn acquire(&self, task: usize, late: bool) -> redlatch::Result<Guard> {
        let timeout = Duration::from_millis(self.spec.timeout_ms);
        let name = self.spec.name.as_str();
        Ok(match self.spec.kind {
            Kind::Mutex | Kind::Reenter => {
                Guard::Lock(self.client.mutex(name)?.lock_timeout(timeout).await?)
            }
            Kind::Fair => Guard::Lock(self.client.fair_mutex(name)?.lock_timeout(timeout).await?),
            Kind::Semaphore => {
                let mut semaphore = self.client.semaphore(name, self.spec.permits)?;
                if late {
                    // Short enough to run out while held.
                    semaphore = semaphore.with_lease(self.lease() / 4)?;
                }
                Guard::Permit(semaphore.acquire_timeout(timeout).await?)
            }
            Kind::Rwlock if task < self.spec.writers => {
                Guard::Write(self.client.rwlock(name)?.write_timeout(timeout).await?)
            }
            Kind::Rwlock => Guard::Read(self.client.rwlock(name)?.read_timeout(timeout).await?),
            Kind::Election => Guard::Leader(
                self.client
                    .election(name)?
                    .campaign_timeout(self.spec.id.clone(), timeout)
                    .await?,
            ),
        })
    }

    /// Whether the row is still injecting faults (see [`faulting_flag`]).
    async fn faulting(&self) -> bool {
        let mut conn = self.conn.clone();
        redis::cmd("EXISTS")
            .arg(faulting_flag(&self.spec.prefix))
            .query_async::<u64>(&mut conn)
            .await
            .is_ok_and(|n| n > 0)
    }

    /// The generation of the hold flag if the test asks this worker to keep holding (each
    /// setting of the flag has a new one). An error says nothing about the flag: a request in
    /// flight when the process was SIGSTOPped times out (redis-rs's response timeout) as soon
    /// as it resumes.
    async fn hold_flag(&self, conn: &mut MultiplexedConnection) -> redis::RedisResult<Option<u64>> {
        redis::cmd("GET")
            .arg(self.spec.hold_flag())
            .query_async::<Option<u64>>(conn)
            .await
    }

    async fn section(&self, task: usize, i: usize) {
        let mut conn = self.conn.clone();
        let late = self.spec.late_every > 0 && i % self.spec.late_every == self.spec.late_every - 1;
        let ask = now_ns();
        let mut guard = match self.acquire(task, late).await {
            Ok(guard) => guard,
            Err(err) => {
                let what = match err {
                    Error::Timeout { .. } => "timeout".to_owned(),
                    other => format!("{other}: {:?}", std::error::Error::source(&other)),
                };
                println!(
                    "{}",
                    Event::Failed {
                        task: task as u32,
                        what,
                        ask,
                        at: now_ns(),
                    }
                );
                // Do not spin on an error that does not wait.
                tokio::time::sleep(Duration::from_millis(20)).await;
                return;
            }
        };
        let start = now_ns();
        let token = guard.token();
        println!(
            "{}",
            Event::Acquired {
                task: task as u32,
                token,
                ask,
                start,
                valid: self.clock.ns(guard.valid_until()),
                fixed: late,
            }
        );
        let inner = match (&guard, self.spec.kind) {
            (Guard::Lock(g), Kind::Reenter) => g.reenter().await.ok(),
            _ => None,
        };
        let exclusive = guard.exclusive();
        let read = if exclusive {
            self.resource.read(&mut conn).await.ok()
        } else {
            None
        };
        let lost = guard.lost();
        tokio::pin!(lost);
        let mut lost_at = None;
        let hold = Duration::from_micros(fastrand::u64(
            self.spec.hold_min_us..=self.spec.hold_max_us.max(self.spec.hold_min_us),
        ));
        tokio::select! {
            _ = tokio::time::sleep(hold) => {}
            _ = &mut lost => lost_at = Some(now_ns()),
        }
        // The hold flag keeps one section held: the first of the worker's tasks to see it (a
        // writer, for a read-write lock), until that setting of the flag ends (it is cleared, or
        // set again: a new setting is claimed afresh, and logged with its generation, so the test
        // never mistakes a section that is ending for one held for its new setting).
        let claimed = if self.spec.obey_hold_flag
            && (self.spec.kind != Kind::Rwlock || task < self.spec.writers)
        {
            match self.hold_flag(&mut conn).await {
                Ok(Some(generation)) => self
                    .holding
                    .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                    .then_some(generation),
                _ => None,
            }
        } else {
            None
        };
        if let Some(generation) = claimed {
            println!(
                "{}",
                Event::Holding {
                    task: task as u32,
                    generation
                }
            );
            // Held until the flag is seen cleared or set again; a poll that failed is asked
            // again (it is no sign of either).
            while self
                .hold_flag(&mut conn)
                .await
                .map_or(true, |flag| flag == Some(generation))
            {
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(20)) => {}
                    _ = &mut lost, if lost_at.is_none() => lost_at = Some(now_ns()),
                }
            }
            self.holding.store(false, Ordering::Release);
        }
        if late {
            // Past the fixed lease: the release below must be refused.
            let past = guard.valid_until() + Duration::from_millis(50);
            tokio::select! {
                _ = tokio::time::sleep_until(past.into()) => {}
                _ = &mut lost, if lost_at.is_none() => lost_at = Some(now_ns()),
            }
            tokio::time::sleep_until(past.into()).await;
        }
        // A naive holder: it writes whatever happened meanwhile. The fenced store refuses a
        // stale token; the register has no such protection.
        let write = if token > 0 {
            match self.resource.fenced_write(&mut conn, token).await {
                Ok(accepted) => Some((now_ns(), accepted)),
                Err(_) => None,
            }
        } else {
            None
        };
        if let Some(value) = read {
            let id = format!("{}:{task}:{i}", self.spec.id);
            let _ = self.resource.write(&mut conn, value, &id).await;
        }
        let release_call = now_ns();
        let valid = self.clock.ns(guard.valid_until());
        println!(
            "{}",
            Event::Releasing {
                task: task as u32,
                at: release_call.min(valid),
            }
        );
        if lost_at.is_none() && !guard.is_held() {
            lost_at = Some(release_call.min(valid));
        }
        let extend = if guard.is_held() {
            "-".to_owned()
        } else {
            outcome(guard.extend(self.lease()).await)
        };
        if let Some(inner) = inner {
            let _ = inner.unlock().await;
        }
        let permit = match &guard {
            Guard::Permit(p) => Some(p.id().to_string()),
            _ => None,
        };
        let owner = match &guard {
            Guard::Lock(g) => Some(g.owner().to_string()),
            _ => None,
        };
        let release = match (self.spec.mutant_release, owner) {
            (true, Some(owner)) => {
                let done = self.mutant_release(&owner).await;
                // The guard's own release, in the background, is then refused.
                drop(guard);
                done
            }
            _ => outcome(guard.release().await),
        };
        let release = match (self.spec.double_release, permit) {
            (true, Some(permit)) => {
                // A re-sent release of a permit already given back frees nothing.
                let again = self.release_permit_again(&permit).await;
                format!("{release};again={again}")
            }
            _ => release,
        };
        println!(
            "{}",
            Event::Section(Section {
                task: task as u32,
                token,
                exclusive,
                start,
                end: release_call.min(valid),
                lost_at,
                write,
                release,
                extend,
            })
        );
    }

    /// The release of a test-only build of `mutex_release` that skips the owner check: any
    /// owner frees the lock.
    async fn mutant_release(&self, owner: &str) -> String {
        let real = concat!(
            "local PUBLISH = 'PUBLISH'\n",
            include_str!("../../lua/v1/mutex_lib.lua"),
            include_str!("../../lua/v1/mutex_release.lua")
        );
        let check = "if not held or held.owner ~= owner then return {0} end";
        if !real.contains(check) {
            return "error:mutex_release no longer has the owner check the mutant removes".into();
        }
        let source = real.replace(check, "if not held then return {0} end");
        let lock = format!("{}:{{{}}}", self.spec.prefix, self.spec.name);
        let mut conn = match lock_connection(&self.spec.url).await {
            Ok(conn) => conn,
            Err(err) => return format!("error:{err}"),
        };
        let reply: redis::RedisResult<redis::Value> = redis::Script::new(&source)
            .key(&lock)
            .arg(owner)
            .arg(format!("{lock}:wake"))
            .invoke_async(&mut conn)
            .await;
        match reply {
            Ok(_) => "ok".to_owned(),
            Err(err) => format!("error:{err}"),
        }
    }

    /// Sends `queue_release` for a permit by hand, as a network retry would.
    async fn release_permit_again(&self, permit: &str) -> String {
        let script = QueueScript::Release.script();
        let main = format!("{}:{{{}}}", self.spec.prefix, self.spec.name);
        let mut conn = match lock_connection(&self.spec.url).await {
            Ok(conn) => conn,
            Err(err) => return format!("error:{err}"),
        };
        let reply: redis::RedisResult<Vec<i64>> = script
            .key(&main)
            .key(format!("{main}:holders"))
            .key(format!("{main}:queue"))
            .key(format!("{main}:fence"))
            .arg("semaphore:1")
            .arg("s")
            .arg(permit)
            .arg(format!("{main}:wake"))
            .arg(7 * 24 * 3600 * 1000)
            .invoke_async(&mut conn)
            .await;
        match reply.as_deref() {
            Ok([0]) => "notheld".to_owned(),
            Ok(other) => format!("freed:{other:?}"),
            Err(err) => format!("error:{err}"),
        }
    }
}

/// Starts observing election `name`: every change it sees, the present first, is logged.
async fn observe(client: &LockClient, name: &str) -> redlatch::Result<tokio::task::JoinHandle<()>> {
    let mut changes = client.election(name)?.observe().await?;
    Ok(tokio::spawn(async move {
        while let Some(change) = changes.next().await {
            match change {
                Ok(leader) => println!(
                    "{}",
                    Event::Observed {
                        term: leader.map_or(0, |l| l.term),
                        at: now_ns(),
                    }
                ),
                Err(err) => {
                    eprintln!("observer: {err}");
                    break;
                }
            }
        }
    }))
}

async fn lock_connection(url: &str) -> redis::RedisResult<MultiplexedConnection> {
    redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await
}

/// Runs the worker `spec` describes, to the end of its sections.
pub async fn run(spec: Spec) -> ExitCode {
    println!(
        "{}",
        Event::Ready {
            pid: std::process::id()
        }
    );
    let pool = match deadpool_redis::Config::from_url(&spec.url)
        .create_pool(Some(deadpool_redis::Runtime::Tokio1))
    {
        Ok(pool) => pool,
        Err(err) => {
            eprintln!("pool: {err}");
            return ExitCode::FAILURE;
        }
    };
    let mut builder = LockClient::builder(pool, spec.url.as_str())
        .key_prefix(&spec.prefix)
        .default_lease(Duration::from_millis(spec.lease_ms));
    if let Some(ms) = spec.waiter_timeout_ms {
        builder = builder.waiter_timeout(Duration::from_millis(ms));
    }
    let client = match builder.build() {
        Ok(client) => client,
        Err(err) => {
            eprintln!("client: {err}");
            return ExitCode::FAILURE;
        }
    };
    let conn = match lock_connection(&spec.resource).await {
        Ok(conn) => conn,
        Err(err) => {
            eprintln!("resource: {err}");
            return ExitCode::FAILURE;
        }
    };
    let worker = std::sync::Arc::new(Worker {
        resource: Resource::new(&spec.prefix, &spec.name),
        spec,
        client,
        conn,
        clock: Clock::new(),
        holding: AtomicBool::new(false),
    });
    // An election's worker observes it from before its first campaign, logging every change.
    let observer = if worker.spec.kind == Kind::Election {
        match observe(&worker.client, &worker.spec.name).await {
            Ok(task) => Some(task),
            Err(err) => {
                eprintln!("observe: {err}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        None
    };
    let mut tasks = Vec::new();
    for task in 0..worker.spec.tasks {
        let worker = std::sync::Arc::clone(&worker);
        tasks.push(tokio::spawn(async move {
            let most = worker.spec.sections.saturating_mul(MORE_SECTIONS).max(1);
            for i in 0..most {
                if i >= worker.spec.sections && !worker.faulting().await {
                    break;
                }
                worker.section(task, i).await;
            }
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
    // Let background releases of dropped guards go out before the runtime ends.
    tokio::time::sleep(Duration::from_millis(50)).await;
    if let Some(observer) = observer {
        observer.abort();
    }
    println!("{}", Event::Done);
    ExitCode::SUCCESS
}
