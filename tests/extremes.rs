//! No setting, lease, timeout or count a caller can pass makes redlatch panic: every builder
//! setting, handle lease, timeout and extension over extreme values, for every primitive, under
//! contention. Each value is either refused with `InvalidArgument` or works.
//!
//! The settings are drawn from a grid of extreme durations by a seeded generator
//! (`REDLATCH_EXTREMES_SEED` picks another sample); a panic anywhere, in the caller's task or
//! in a background task, fails the test.

mod support;

use std::sync::Once;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use redlatch::{Error, LockClient, LockClientBuilder, MAX_LEASE, MIN_LEASE};
use support::{TestRedis, within};

const LIMIT: Duration = Duration::from_secs(120);
/// How long one acquisition may wait before the test stops waiting (cancelling it).
const PATIENCE: Duration = Duration::from_millis(400);
/// The lease the contending holder keeps: waits end either way.
const HOLDER_LEASE: Duration = Duration::from_millis(150);

static PANICS: AtomicUsize = AtomicUsize::new(0);

/// Counts every panic of the process, in any task, from here on.
fn count_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.fetch_add(1, Ordering::SeqCst);
            previous(info);
        }));
    });
}

fn extremes() -> Vec<Duration> {
    vec![
        Duration::ZERO,
        Duration::from_nanos(1),
        Duration::from_micros(999),
        Duration::from_millis(1),
        MIN_LEASE - Duration::from_nanos(1),
        MIN_LEASE,
        Duration::from_millis(20),
        Duration::from_secs(1),
        MAX_LEASE,
        MAX_LEASE + Duration::from_nanos(1),
        Duration::from_secs(u64::MAX / 1000),
        Duration::from_secs(u64::MAX),
        Duration::MAX,
    ]
}

type Setting = Box<dyn Fn(LockClientBuilder) -> LockClientBuilder>;

/// Every builder setting that takes a duration, at every extreme (backoff bounds in pairs).
fn settings() -> Vec<(String, Setting)> {
    let mut out: Vec<(String, Setting)> = Vec::new();
    for d in extremes() {
        out.push((
            format!("default_lease({d:?})"),
            Box::new(move |b| b.default_lease(d)),
        ));
        out.push((
            format!("waiter_timeout({d:?})"),
            Box::new(move |b| b.waiter_timeout(d)),
        ));
        out.push((
            format!("default_lease({d:?}) without watchdog"),
            Box::new(move |b| b.default_lease(d).watchdog(false)),
        ));
        for e in extremes() {
            out.push((
                format!("wait_backoff({d:?}, {e:?})"),
                Box::new(move |b| b.wait_backoff(d, e)),
            ));
        }
    }
    out
}

#[derive(Debug, Clone, Copy)]
enum Primitive {
    Mutex,
    Fair,
    Semaphore,
    Read,
    Write,
}

const PRIMITIVES: [Primitive; 5] = [
    Primitive::Mutex,
    Primitive::Fair,
    Primitive::Semaphore,
    Primitive::Read,
    Primitive::Write,
];

/// A holder of `name` in another client, for `HOLDER_LEASE`, so that the acquisition under
/// test waits (and may get it once the lease runs out). The guard is returned to be kept.
async fn hold(holder: &LockClient, primitive: Primitive, name: &str) -> Box<dyn Send> {
    macro_rules! keep {
        ($handle:expr, $acquire:ident) => {
            Box::new(
                $handle
                    .with_lease(HOLDER_LEASE)
                    .unwrap()
                    .$acquire()
                    .await
                    .unwrap(),
            )
        };
    }
    match primitive {
        Primitive::Mutex => keep!(holder.mutex(name).unwrap(), lock),
        Primitive::Fair => keep!(holder.fair_mutex(name).unwrap(), lock),
        Primitive::Semaphore => keep!(holder.semaphore(name, 1).unwrap(), acquire),
        Primitive::Read | Primitive::Write => keep!(holder.rwlock(name).unwrap(), write),
    }
}

/// One acquisition under test: the handle (with `lease`, if it is accepted), a wait of
/// `timeout` (`None`: the untimed verb), then an extension by `extend` and the release. Every
/// outcome but a panic or an unexpected error kind is fine.
async fn exercise(
    client: &LockClient,
    primitive: Primitive,
    name: &str,
    lease: Duration,
    timeout: Option<Duration>,
    extend: Duration,
) {
    macro_rules! run {
        ($handle:expr, $timed:ident, $untimed:ident, $release:ident) => {{
            let handle = match $handle.with_lease(lease) {
                Ok(h) => h,
                Err(Error::InvalidArgument { .. }) => $handle,
                Err(other) => panic!("with_lease({lease:?}): {other:?}"),
            };
            let acquire = async {
                match timeout {
                    Some(t) => handle.$timed(t).await,
                    None => handle.$untimed().await,
                }
            };
            match tokio::time::timeout(PATIENCE, acquire).await {
                Err(_) | Ok(Err(Error::Timeout { .. })) => {}
                Ok(Ok(guard)) => {
                    match guard.extend(extend).await {
                        Ok(()) | Err(Error::InvalidArgument { .. } | Error::NotHeld { .. }) => {}
                        Err(other) => panic!("extend({extend:?}): {other:?}"),
                    }
                    match guard.$release().await {
                        Ok(()) | Err(Error::NotHeld { .. }) => {}
                        Err(other) => panic!("release: {other:?}"),
                    }
                }
                Ok(Err(other)) => panic!("{primitive:?} with {timeout:?}: {other:?}"),
            }
        }};
    }
    match primitive {
        Primitive::Mutex => run!(client.mutex(name).unwrap(), lock_timeout, lock, unlock),
        Primitive::Fair => run!(client.fair_mutex(name).unwrap(), lock_timeout, lock, unlock),
        Primitive::Semaphore => run!(
            client.semaphore(name, 1).unwrap(),
            acquire_timeout,
            acquire,
            release
        ),
        Primitive::Read => run!(client.rwlock(name).unwrap(), read_timeout, read, unlock),
        Primitive::Write => run!(client.rwlock(name).unwrap(), write_timeout, write, unlock),
    }
}

fn seed() -> u64 {
    std::env::var("REDLATCH_EXTREMES_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_2026_1123)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_setting_or_duration_panics_under_contention() {
    count_panics();
    let redis = TestRedis::new();
    let seed = seed();
    println!("seed {seed} (set REDLATCH_EXTREMES_SEED to draw another sample)");
    let mut rng = fastrand::Rng::with_seed(seed);
    within(LIMIT, async {
        let holder = redis.client();
        // Every setting is either refused or builds a client.
        let mut accepted = Vec::new();
        for (what, setting) in settings() {
            match setting(redis.builder()).build() {
                Ok(client) => accepted.push((what, client)),
                Err(Error::InvalidArgument { .. }) => {}
                Err(other) => panic!("{what}: {other:?}"),
            }
        }
        assert!(accepted.len() >= 20, "too few settings accepted to test");
        // The widest accepted backoff, and a sample of the rest.
        let widest = accepted
            .iter()
            .position(|(what, _)| *what == format!("wait_backoff({MAX_LEASE:?}, {MAX_LEASE:?})"))
            .expect("the longest backoff is accepted");
        let mut sample = vec![accepted.swap_remove(widest)];
        while sample.len() < 12 && !accepted.is_empty() {
            let i = rng.usize(..accepted.len());
            sample.push(accepted.swap_remove(i));
        }
        let durations = extremes();
        let mut timeouts: Vec<Option<Duration>> = durations.iter().copied().map(Some).collect();
        timeouts.push(None);
        for (n, (what, client)) in sample.iter().enumerate() {
            println!("{what}");
            let mut runs = Vec::new();
            let mut held = Vec::new();
            for primitive in PRIMITIVES {
                for (t, timeout) in timeouts.iter().enumerate() {
                    let name = format!("x{n}-{primitive:?}-{t}");
                    held.push(hold(&holder, primitive, &name).await);
                    let lease = durations[rng.usize(..durations.len())];
                    let extend = durations[rng.usize(..durations.len())];
                    let timeout = *timeout;
                    let client = client.clone();
                    runs.push(tokio::spawn(async move {
                        exercise(&client, primitive, &name, lease, timeout, extend).await;
                    }));
                }
            }
            for run in runs {
                run.await.unwrap();
            }
        }
    })
    .await;
    assert_eq!(PANICS.load(Ordering::SeqCst), 0, "something panicked");
}

#[tokio::test]
async fn extreme_counts_are_refused_or_work() {
    count_panics();
    let redis = TestRedis::new();
    within(LIMIT, async {
        let client = redis.client();
        assert!(matches!(
            client.semaphore("zero", 0),
            Err(Error::InvalidArgument { .. })
        ));
        let small = client.semaphore("small", 2).unwrap();
        for n in [0, 3, u32::MAX] {
            assert!(matches!(
                small.acquire_many_timeout(n, Duration::MAX).await,
                Err(Error::InvalidArgument { .. })
            ));
            assert!(matches!(
                small.try_acquire_many(n).await,
                Err(Error::InvalidArgument { .. })
            ));
        }
        let huge = client.semaphore("huge", u32::MAX).unwrap();
        let all = huge.acquire_many(u32::MAX).await.unwrap();
        assert_eq!(all.permits(), u32::MAX);
        assert!(huge.try_acquire().await.unwrap().is_none());
        assert_eq!(huge.available_permits().await.unwrap(), 0);
        all.release().await.unwrap();
        assert_eq!(huge.available_permits().await.unwrap(), u32::MAX);
        assert!(redis.leftovers().await.is_empty());
    })
    .await;
    assert_eq!(PANICS.load(Ordering::SeqCst), 0, "something panicked");
}
