//! The test bed of one row: the lock server, the resource server (never faulted), a proxy per
//! worker where the row needs one, the worker processes, and everything they logged.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use redis::aio::MultiplexedConnection;
use redlatch_harness::check::Section;
use redlatch_harness::proxy::Proxy;
use redlatch_harness::resource::Resource;
use redlatch_harness::server::RedisServer;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::clock::now_ns;
use crate::event::Event;
use crate::spec::{Spec, faulting_flag, hold_flag};

/// How the lock server runs.
#[derive(Debug, Clone, Copy, Default)]
pub struct ServerOpts {
    /// Append-only file with `appendfsync always`: what it acknowledged survives a kill.
    pub persist: bool,
    /// `DEBUG` allowed (for `DEBUG SLEEP`).
    pub debug: bool,
}

/// What the workers logged, as it arrives.
#[derive(Debug, Default)]
pub struct Log {
    /// Every event, with the worker that logged it.
    pub events: Vec<(String, Event)>,
    /// Tasks holding now: (worker, task) → when they acquired.
    holding: HashMap<(String, u32), u64>,
    /// The task of each worker that holds for its hold flag now, and the flag's generation it
    /// took.
    flagged: HashMap<String, (u32, u64)>,
}

struct Proc {
    id: String,
    spec: Spec,
    child: Child,
    pid: Option<u32>,
    killed: bool,
}

/// The bed of one row.
pub struct Bed {
    /// The lock server.
    pub lock: RedisServer,
    /// The resource server: never faulted.
    pub resource: RedisServer,
    /// The prefix of every key of the row.
    pub prefix: String,
    exe: PathBuf,
    procs: Vec<Proc>,
    log: Arc<StdMutex<Log>>,
    proxies: HashMap<String, Proxy>,
    /// Workers killed while holding, and when.
    pub kills: Vec<(String, u64)>,
    /// The faulting flag is set: workers past their sections keep going.
    faulting: bool,
    /// The workers' hold flags as last set.
    flags: StdMutex<Flags>,
}

/// Each setting of a hold flag has a generation of its own (the flag's value in Redis).
#[derive(Debug, Default)]
struct Flags {
    /// The generation of each worker's flag while it is set.
    set: HashMap<String, u64>,
    /// The last generation given.
    last: u64,
}

impl std::fmt::Debug for Bed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bed")
            .field("prefix", &self.prefix)
            .field("workers", &self.procs.len())
            .finish_non_exhaustive()
    }
}

fn locked<T>(mutex: &StdMutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

impl Bed {
    /// Starts the two servers. `exe` is the binary that runs a worker as `exe worker <spec>`.
    pub fn start(exe: PathBuf, opts: ServerOpts) -> Result<Self, String> {
        let mut args: Vec<&str> = Vec::new();
        if opts.persist {
            args.extend(["--appendonly", "yes", "--appendfsync", "always"]);
        }
        if opts.debug {
            args.extend(["--enable-debug-command", "local"]);
        }
        Ok(Self {
            lock: RedisServer::try_start_with(&args)?,
            resource: RedisServer::try_start()?,
            prefix: redlatch_harness::unique("rlfault"),
            exe,
            procs: Vec::new(),
            log: Arc::default(),
            proxies: HashMap::new(),
            kills: Vec::new(),
            faulting: false,
            flags: StdMutex::default(),
        })
    }

    /// A spec for worker `id` on `name`, with the servers and prefix filled in.
    pub fn spec(&self, id: &str, name: &str, template: &Spec) -> Spec {
        Spec {
            id: id.to_owned(),
            url: self.lock.url(),
            resource: self.resource.url(),
            prefix: self.prefix.clone(),
            name: name.to_owned(),
            ..template.clone()
        }
    }

    /// Starts a worker; with `proxied`, through a proxy of its own (see [`Bed::proxy`]).
    pub async fn spawn(&mut self, mut spec: Spec, proxied: bool) -> Result<(), String> {
        if !self.faulting {
            let mut conn = self.resource_conn().await?;
            redis::cmd("SET")
                .arg(faulting_flag(&self.prefix))
                .arg(1)
                .arg("PX")
                .arg(900_000)
                .query_async::<()>(&mut conn)
                .await
                .map_err(|e| format!("faulting flag: {e}"))?;
            self.faulting = true;
        }
        if proxied {
            let upstream = format!("127.0.0.1:{}", self.lock.port())
                .parse()
                .map_err(|e| format!("{e}"))?;
            let proxy = Proxy::start(upstream)
                .await
                .map_err(|e| format!("proxy: {e}"))?;
            spec.url = proxy.url();
            self.proxies.insert(spec.id.clone(), proxy);
        }
        let verbose = std::env::var_os("REDLATCH_FAULTS_VERBOSE").is_some();
        let mut child = Command::new(&self.exe)
            .arg("worker")
            .args(spec.args())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(if verbose {
                Stdio::inherit()
            } else {
                Stdio::null()
            })
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", self.exe.display()))?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let (log, id) = (Arc::clone(&self.log), spec.id.clone());
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if verbose {
                    use std::io::Write;
                    let _ = std::io::stderr().write_all(format!("{id}\t{line}\n").as_bytes());
                }
                let Ok(event) = line.parse::<Event>() else {
                    continue;
                };
                let mut log = locked(&log);
                match &event {
                    Event::Acquired { task, start, .. } => {
                        log.holding.insert((id.clone(), *task), *start);
                    }
                    Event::Section(s) => {
                        log.holding.remove(&(id.clone(), s.task));
                        if log
                            .flagged
                            .get(&id)
                            .is_some_and(|(task, _)| *task == s.task)
                        {
                            log.flagged.remove(&id);
                        }
                    }
                    Event::Holding { task, generation } => {
                        log.flagged.insert(id.clone(), (*task, *generation));
                    }
                    // Releasing: no longer a holder worth a fault.
                    Event::Releasing { task, .. } => {
                        log.holding.remove(&(id.clone(), *task));
                    }
                    _ => {}
                }
                log.events.push((id.clone(), event));
            }
        });
        let pid = child.id();
        self.procs.push(Proc {
            id: spec.id.clone(),
            spec,
            child,
            pid,
            killed: false,
        });
        Ok(())
    }

    /// The proxy in front of worker `id`, if it has one.
    pub fn proxy(&self, id: &str) -> Option<&Proxy> {
        self.proxies.get(id)
    }

    /// How many sections were acquired after `at` (ns of the monotonic clock). Counted under
    /// the log's lock without copying it: the readers of the workers' output must not wait.
    pub fn acquired_since(&self, at: u64) -> usize {
        locked(&self.log)
            .events
            .iter()
            .filter(|(_, e)| matches!(e, Event::Acquired { start, .. } if *start > at))
            .count()
    }

    /// The tasks of every worker that runs.
    pub fn live_tasks(&self) -> usize {
        self.procs
            .iter()
            .filter(|p| self.is_live(&p.id))
            .map(|p| p.spec.tasks)
            .sum()
    }

    /// Whether worker `id` runs: started, not killed, not finished.
    pub fn is_live(&self, id: &str) -> bool {
        let done = locked(&self.log)
            .events
            .iter()
            .any(|(w, e)| w == id && matches!(e, Event::Done));
        self.procs.iter().any(|p| p.id == id && !p.killed) && !done
    }

    /// The spec worker `id` was started with.
    pub fn spec_of(&self, id: &str) -> Option<&Spec> {
        self.procs.iter().find(|p| p.id == id).map(|p| &p.spec)
    }

    /// A live worker with a task holding now that `pick` accepts (given the worker's spec
    /// and the task), the longest holding first.
    pub fn holder(&self, pick: impl Fn(&Spec, u32) -> bool) -> Option<String> {
        let log = locked(&self.log);
        let mut holding: Vec<(&(String, u32), &u64)> = log.holding.iter().collect();
        holding.sort_by_key(|(_, start)| **start);
        holding
            .into_iter()
            .find(|((id, task), _)| {
                self.procs
                    .iter()
                    .any(|p| p.id == *id && !p.killed && pick(&p.spec, *task))
            })
            .map(|((id, _), _)| id.clone())
    }

    /// Waits up to `limit` for a task of worker `id` to hold for its hold flag as last set;
    /// true once one does. A section held for an earlier setting does not count: it is ending,
    /// though its end may not be logged yet.
    pub async fn wait_flag_holder(&self, id: &str, limit: Duration) -> bool {
        let Some(generation) = locked(&self.flags).set.get(id).copied() else {
            return false;
        };
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if locked(&self.log).flagged.get(id).map(|(_, g)| *g) == Some(generation) {
                return true;
            }
            if tokio::time::Instant::now() >= deadline || !self.is_live(id) {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Waits up to `limit` for a holder (see [`Bed::holder`]).
    pub async fn wait_holder(
        &self,
        limit: Duration,
        pick: impl Fn(&Spec, u32) -> bool,
    ) -> Option<String> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if let Some(id) = self.holder(&pick) {
                return Some(id);
            }
            if tokio::time::Instant::now() >= deadline || self.all_done() {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    fn pid(&self, id: &str) -> Option<Pid> {
        self.procs
            .iter()
            .find(|p| p.id == id)
            .and_then(|p| p.pid)
            .and_then(|pid| i32::try_from(pid).ok())
            .map(Pid::from_raw)
    }

    /// SIGKILLs worker `id` (noting when, if it held) and returns the time.
    pub fn kill(&mut self, id: &str) -> u64 {
        let at = now_ns();
        if let Some(pid) = self.pid(id) {
            let _ = kill(pid, Signal::SIGKILL);
        }
        let held = locked(&self.log).holding.keys().any(|(w, _)| w == id);
        if held {
            self.kills.push((id.to_owned(), at));
        }
        if let Some(p) = self.procs.iter_mut().find(|p| p.id == id) {
            p.killed = true;
        }
        locked(&self.log).holding.retain(|(w, _), _| w != id);
        at
    }

    /// SIGSTOPs worker `id`.
    pub fn stop(&self, id: &str) {
        if let Some(pid) = self.pid(id) {
            let _ = kill(pid, Signal::SIGSTOP);
        }
    }

    /// SIGCONTs worker `id`.
    pub fn resume(&self, id: &str) {
        if let Some(pid) = self.pid(id) {
            let _ = kill(pid, Signal::SIGCONT);
        }
    }

    /// A connection to the resource server.
    pub async fn resource_conn(&self) -> Result<MultiplexedConnection, String> {
        connect(&self.resource.url()).await
    }

    /// A connection to the lock server (not through any proxy), without a response timeout
    /// (for `DEBUG SLEEP` and `CLIENT PAUSE`).
    pub async fn lock_conn(&self) -> Result<MultiplexedConnection, String> {
        redis::Client::open(self.lock.url())
            .map_err(|e| format!("{e}"))?
            .get_multiplexed_async_connection_with_config(
                &redis::AsyncConnectionConfig::new().set_response_timeout(None),
            )
            .await
            .map_err(|e| format!("connect: {e}"))
    }

    /// Sets (to a new generation) or clears worker `id`'s hold flag: while that setting lasts,
    /// the task that took it keeps holding.
    pub async fn hold_flag(&self, id: &str, on: bool) -> Result<(), String> {
        let mut conn = self.resource_conn().await?;
        let key = hold_flag(&self.prefix, id);
        let generation = {
            let mut flags = locked(&self.flags);
            if on {
                flags.last += 1;
                let generation = flags.last;
                flags.set.insert(id.to_owned(), generation);
                generation
            } else {
                flags.set.remove(id);
                0
            }
        };
        let result: redis::RedisResult<()> = if on {
            redis::cmd("SET")
                .arg(&key)
                .arg(generation)
                .arg("PX")
                .arg(120_000)
                .query_async(&mut conn)
                .await
        } else {
            redis::cmd("DEL").arg(&key).query_async(&mut conn).await
        };
        result.map_err(|e| format!("hold flag: {e}"))
    }

    /// Clears the faulting flag: the workers end once past their sections. Until then they keep
    /// going, so that no fault meets a finished row.
    pub async fn calm(&mut self) -> Result<(), String> {
        let mut conn = self.resource_conn().await?;
        redis::cmd("DEL")
            .arg(faulting_flag(&self.prefix))
            .query_async::<()>(&mut conn)
            .await
            .map_err(|e| format!("faulting flag: {e}"))?;
        self.faulting = false;
        Ok(())
    }

    /// True when every worker has exited (or was killed).
    pub fn all_done(&self) -> bool {
        let done = locked(&self.log)
            .events
            .iter()
            .filter(|(_, e)| matches!(e, Event::Done))
            .count();
        done + self.procs.iter().filter(|p| p.killed).count() >= self.procs.len()
    }

    /// Waits up to `limit` for every worker to exit; kills what is left.
    pub async fn wait_done(&mut self, limit: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        let mut all = true;
        for p in &mut self.procs {
            if p.killed {
                let _ = p.child.wait().await;
                continue;
            }
            match tokio::time::timeout_at(deadline, p.child.wait()).await {
                Ok(_) => {}
                Err(_) => {
                    all = false;
                    let _ = p.child.kill().await;
                }
            }
        }
        // The readers see the end of every stream.
        tokio::time::sleep(Duration::from_millis(50)).await;
        all
    }

    /// Every event so far.
    pub fn events(&self) -> Vec<(String, Event)> {
        locked(&self.log).events.clone()
    }

    /// The critical sections on the lock, for the checkers: every finished one, and the ones
    /// whose worker was killed while holding (their interval ends at the kill).
    pub fn sections(&self) -> Vec<Section> {
        let log = locked(&self.log);
        let mut out = Vec::new();
        let mut open: HashMap<(String, u32), (u64, u64, Option<u64>)> = HashMap::new();
        for (id, event) in &log.events {
            match event {
                Event::Acquired {
                    task,
                    token,
                    start,
                    valid,
                    fixed,
                    ..
                } => {
                    // A fixed lease ends at its deadline; a renewed one lasts while its holder
                    // lives.
                    let ends = fixed.then_some(*valid);
                    open.insert((id.clone(), *task), (*token, *start, ends));
                }
                // The release was called: a kill from now on cuts nothing more.
                Event::Releasing { task, at } => {
                    if let Some(section) = open.get_mut(&(id.clone(), *task)) {
                        section.2 = Some(section.2.map_or(*at, |e| e.min(*at)));
                    }
                }
                Event::Section(s) => {
                    open.remove(&(id.clone(), s.task));
                    out.push(Section {
                        worker: format!("{id}/{}", s.task),
                        token: s.token,
                        exclusive: s.exclusive,
                        start: s.start,
                        end: s.end,
                        write: s.write,
                    });
                }
                _ => {}
            }
        }
        for ((id, task), (token, start, ends)) in open {
            let Some(&(_, killed_at)) = self.kills.iter().find(|(w, _)| *w == id) else {
                continue;
            };
            let exclusive = self
                .spec_of(&id)
                .is_some_and(|s| crate::rows::exclusive(s, task as usize));
            out.push(Section {
                worker: format!("{id}/{task}"),
                token,
                exclusive,
                start,
                end: ends.map_or(killed_at, |e| e.min(killed_at)),
                write: None,
            });
        }
        out
    }

    /// Keys of the library left on the lock server. Fencing counters outlive locks on purpose;
    /// a name's request log (`:once`, written by re-entries and carried owners' acquisitions)
    /// expires 10 s after its last write, and counts only if it would stay longer.
    pub async fn leftovers(&self) -> Result<Vec<String>, String> {
        let mut conn = self.lock_conn().await?;
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{}:*", self.prefix))
            .query_async(&mut conn)
            .await
            .map_err(|e| format!("KEYS: {e}"))?;
        let mut left = Vec::new();
        for key in keys {
            if key.ends_with(":fence") {
                continue;
            }
            if key.ends_with(":once") {
                let ttl: i64 = redis::cmd("PTTL")
                    .arg(&key)
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| format!("PTTL: {e}"))?;
                // Gone since (-2), or expiring within its window: not left.
                if ttl == -2 || (0..=10_000).contains(&ttl) {
                    continue;
                }
            }
            left.push(key);
        }
        left.sort();
        Ok(left)
    }

    /// Script calls the lock server has run, from `INFO commandstats`.
    pub async fn script_calls(&self) -> Result<u64, String> {
        let mut conn = self.lock_conn().await?;
        let stats = redlatch_harness::measure::commandstats(&mut conn)
            .await
            .map_err(|e| format!("INFO: {e}"))?;
        Ok(["evalsha", "eval"]
            .iter()
            .map(|c| stats.get(*c).copied().unwrap_or(0))
            .sum())
    }

    /// The resource of lock `name`.
    pub fn resource_of(&self, name: &str) -> Resource {
        Resource::new(&self.prefix, name)
    }
}

async fn connect(url: &str) -> Result<MultiplexedConnection, String> {
    redis::Client::open(url)
        .map_err(|e| format!("{e}"))?
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| format!("connect {url}: {e}"))
}
