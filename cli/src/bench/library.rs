//! The libraries under test, as the scenarios see them: a client ([`Library`]) makes a handle
//! per task ([`Contender`]) that takes a lock ([`Hold`]). redlatch's primitives are here; the
//! Rust peers are added by `benches/contention.rs`.

use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::{Config, Runtime};
use redlatch::LockClient;
use redlatch_harness::measure::{AnyResult, BoxFut, Contend, LUA, script_commands};

/// A lock library, as one client (a stand-in for one process) sees it.
pub trait Library: Send + Sync {
    /// A handle on the lock `name` for one task. `lease` overrides the library's default (and
    /// its renewal, where it has one) for holders that must stay quiet.
    fn contender<'a>(
        &'a self,
        name: &'a str,
        lease: Option<Duration>,
    ) -> BoxFut<'a, AnyResult<Box<dyn Contender>>>;

    /// The requests this client has sent, when the library counts them itself (redlatch:
    /// `LockClient::requests`, a round trip of plain commands once); `None` to read the
    /// server's command statistics instead.
    fn requests(&self) -> Option<u64> {
        None
    }
}

/// How to count the requests of these clients: their own count when every one keeps it, else
/// the server's statistics less the commands `entry`'s scripts run inside Redis.
pub(super) fn counting<'a>(
    entry: &'a Entry,
    libs: &'a [Arc<dyn Library>],
    count: &'a mut Option<Box<dyn Fn() -> u64 + Send + Sync>>,
) -> redlatch_harness::measure::Counting<'a> {
    use redlatch_harness::measure::Counting;
    if libs.iter().all(|lib| lib.requests().is_some()) {
        let libs: Vec<Arc<dyn Library>> = libs.to_vec();
        let sum = count.insert(Box::new(move || {
            libs.iter().map(|lib| lib.requests().unwrap_or(0)).sum()
        }));
        Counting::Clients(&**sum)
    } else {
        Counting::Server(&entry.script_commands)
    }
}

/// Two clients of a library, each on a runtime of its own with one worker thread: stand-ins
/// for two processes, which share no scheduler and no timer. (On one runtime, a release that
/// wakes the runtime also fires the other client's timers that are due, so a waiter that polls
/// every millisecond tries right after each release, which it would not in another process.)
pub(super) struct Pair {
    /// Stopped when the pair is dropped.
    runtimes: Vec<tokio::runtime::Runtime>,
    /// The runtimes' handles, to run each client's tasks on.
    pub(super) handles: [tokio::runtime::Handle; 2],
    /// The clients, in the order of `handles`.
    pub(super) libs: [Arc<dyn Library>; 2],
}

impl Pair {
    /// Connects two clients of `entry`, each on its own runtime.
    pub(super) async fn connect(entry: &Entry) -> AnyResult<Self> {
        let mut runtimes = Vec::new();
        let mut libs = Vec::new();
        for i in 0..2 {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name(format!("client-{i}"))
                .enable_all()
                .build()?;
            let connect = Arc::clone(&entry.connect);
            let lib = runtime
                .spawn(async move { connect().await.map_err(|e| e.to_string()) })
                .await??;
            runtimes.push(runtime);
            libs.push(lib);
        }
        let handles = [runtimes[0].handle().clone(), runtimes[1].handle().clone()];
        let Ok(libs) = libs.try_into() else {
            return Err("two clients".into());
        };
        Ok(Self {
            runtimes,
            handles,
            libs,
        })
    }

    /// A contender on `name` for each client, made on its runtime.
    pub(super) async fn contenders(&self, name: &str) -> AnyResult<[Box<dyn Contender>; 2]> {
        let mut out = Vec::new();
        for (lib, handle) in self.libs.iter().zip(&self.handles) {
            let (lib, name) = (Arc::clone(lib), name.to_owned());
            let contender = handle
                .spawn(async move { lib.contender(&name, None).await.map_err(|e| e.to_string()) })
                .await??;
            out.push(contender);
        }
        out.try_into().map_err(|_| "two contenders".into())
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        // Dropped inside the main runtime: its own runtimes stop without blocking it.
        for runtime in self.runtimes.drain(..) {
            runtime.shutdown_background();
        }
    }
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
    /// Makes a new client of it.
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
    /// `Mutex`.
    Mutex,
    /// `FairMutex`.
    Fair,
    /// A semaphore of this many permits; each acquisition takes one.
    Semaphore(u32),
    /// `RwLock`, read holds.
    Read,
    /// `RwLock`, write holds.
    Write,
}

impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entry")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// A redlatch client running one primitive.
pub(crate) struct Redlatch {
    pub(crate) client: LockClient,
    pub(crate) primitive: Primitive,
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

/// redlatch's entries: the mutex, the fair mutex, a semaphore of one permit, and the
/// read-write lock's write and read holds.
pub fn redlatch_entries(url: &str, prefix: &str) -> Vec<Entry> {
    vec![
        redlatch_entry("redlatch-mutex", url, prefix, Primitive::Mutex),
        redlatch_entry("redlatch-fair", url, prefix, Primitive::Fair),
        redlatch_entry("redlatch-semaphore", url, prefix, Primitive::Semaphore(1)),
        redlatch_entry("redlatch-rwlock-write", url, prefix, Primitive::Write),
        redlatch_entry("redlatch-rwlock-read", url, prefix, Primitive::Read),
    ]
}

enum RedlatchHandle {
    Mutex(redlatch::Mutex),
    Fair(redlatch::FairMutex),
    Semaphore(redlatch::Semaphore),
    Read(redlatch::RwLock),
    Write(redlatch::RwLock),
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
                (Primitive::Read, None) => RedlatchHandle::Read(self.client.rwlock(name)?),
                (Primitive::Read, Some(l)) => {
                    RedlatchHandle::Read(self.client.rwlock(name)?.with_lease(l)?)
                }
                (Primitive::Write, None) => RedlatchHandle::Write(self.client.rwlock(name)?),
                (Primitive::Write, Some(l)) => {
                    RedlatchHandle::Write(self.client.rwlock(name)?.with_lease(l)?)
                }
            };
            Ok(Box::new(handle) as Box<dyn Contender>)
        })
    }

    fn requests(&self) -> Option<u64> {
        Some(self.client.requests())
    }
}

impl Contender for RedlatchHandle {
    fn lock(&self) -> BoxFut<'_, AnyResult<Box<dyn Hold>>> {
        Box::pin(async move {
            Ok(match self {
                Self::Mutex(m) => Box::new(m.lock().await?) as Box<dyn Hold>,
                Self::Fair(m) => Box::new(m.lock().await?) as Box<dyn Hold>,
                Self::Semaphore(s) => Box::new(s.acquire().await?) as Box<dyn Hold>,
                Self::Read(l) => Box::new(l.read().await?) as Box<dyn Hold>,
                Self::Write(l) => Box::new(l.write().await?) as Box<dyn Hold>,
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

impl Hold for redlatch::RwLockReadGuard {
    fn release(self: Box<Self>) -> BoxFut<'static, AnyResult<()>> {
        Box::pin(async move { Ok(redlatch::RwLockReadGuard::unlock(*self).await?) })
    }
}

impl Hold for redlatch::RwLockWriteGuard {
    fn release(self: Box<Self>) -> BoxFut<'static, AnyResult<()>> {
        Box::pin(async move { Ok(redlatch::RwLockWriteGuard::unlock(*self).await?) })
    }
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
