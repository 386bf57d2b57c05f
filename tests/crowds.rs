//! Thousands on one name: a release that lets thousands of waiters in at once (readers behind a
//! writer, permit waiters behind the holder of every permit), a crashed writer's lease running
//! out before thousands of queued readers, and thousands of leases running out together. Each
//! makes one script gather more arguments for one command than Lua's `unpack` takes in one go
//! (about 8,000); `calls_lib.lua` sends them in parts.

mod support;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use redlatch::LockClient;
use support::{TestRedis, crashing, until, within};
use tokio::task::JoinHandle;

const LIMIT: Duration = Duration::from_secs(180);
/// Waiters let in by one release: their `h:<owner>` fields and values, in one `HSET`, are
/// 9,000 arguments and more.
const CROWD: usize = 4_500;
/// Holders whose leases run out together: one `ZREM` of them all, one `HDEL` of their fields.
const HOLDERS: usize = 9_000;
/// The crowds run one at a time: each keeps one server and the client busy for seconds, and
/// side by side on a 2-core machine the scripts that let a crowd in outlast the response
/// timeout (an answer lost, not a wrong one).
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// `n` tasks that each wait for a read hold of `name`, once every one of them is queued.
async fn queued_readers(
    redis: &TestRedis,
    client: &LockClient,
    name: &str,
    n: usize,
) -> Vec<JoinHandle<redlatch::Result<redlatch::RwLockReadGuard>>> {
    let readers = (0..n)
        .map(|_| {
            let lock = client.rwlock(name).unwrap();
            tokio::spawn(async move { lock.read().await })
        })
        .collect();
    until(|| async { redis.queued(client, name).await == n }).await;
    readers
}

/// Every reader's hold, and the name held by exactly `n` readers and nothing else.
async fn all_in(
    client: &LockClient,
    name: &str,
    readers: Vec<JoinHandle<redlatch::Result<redlatch::RwLockReadGuard>>>,
) -> Vec<redlatch::RwLockReadGuard> {
    let n = readers.len();
    let mut guards = Vec::with_capacity(n);
    for r in readers {
        guards.push(r.await.unwrap().expect("every queued reader gets in"));
    }
    let snapshot = client.inspect(name).await.unwrap();
    assert_eq!(snapshot.holders.len(), n);
    assert!(snapshot.holders.iter().all(|h| h.exclusive_holds == 0));
    assert!(snapshot.waiters.is_empty());
    guards
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writers_unlock_lets_thousands_of_queued_readers_in() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let redis = TestRedis::new();
    within(LIMIT, async {
        let client = redis.client();
        let writer = client.rwlock("crowd").unwrap().write().await.unwrap();
        let readers = queued_readers(&redis, &client, "crowd", CROWD).await;
        // One release lets every reader in (the release's fast path).
        writer.unlock().await.expect("the writer's unlock");
        for guard in all_in(&client, "crowd", readers).await {
            guard.unlock().await.unwrap();
        }
        assert!(redis.leftovers().await.is_empty());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_of_every_permit_lets_thousands_of_waiters_in() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let redis = TestRedis::new();
    within(LIMIT, async {
        let client = redis.client();
        let cap = u32::try_from(CROWD).unwrap();
        let all = client
            .semaphore("crowd", cap)
            .unwrap()
            .acquire_many(cap)
            .await
            .unwrap();
        let waiters: Vec<_> = (0..CROWD)
            .map(|_| {
                let semaphore = client.semaphore("crowd", cap).unwrap();
                tokio::spawn(async move { semaphore.acquire().await })
            })
            .collect();
        until(|| async { redis.queued(&client, "crowd").await == CROWD }).await;
        let before = all.fencing_token();
        all.release().await.expect("the release of every permit");
        let mut permits = Vec::with_capacity(CROWD);
        for w in waiters {
            permits.push(w.await.unwrap().expect("every waiter gets a permit"));
        }
        let tokens: HashSet<u64> = permits.iter().map(|p| p.fencing_token()).collect();
        assert_eq!(tokens.len(), CROWD, "every permit has a token of its own");
        assert!(tokens.iter().all(|t| *t > before));
        let snapshot = client.inspect("crowd").await.unwrap();
        assert_eq!(snapshot.permits_in_use, Some(cap));
        assert_eq!(snapshot.holders.len(), CROWD);
        assert!(snapshot.waiters.is_empty());
        for permit in permits {
            permit.release().await.unwrap();
        }
        assert!(redis.leftovers().await.is_empty());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_readers_get_in_once_a_crashed_writers_lease_runs_out() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let redis = TestRedis::new();
    within(LIMIT, async {
        // Long enough for every reader to be seen queued before it runs out.
        let lease = Duration::from_secs(20);
        let taken = redis.crashed_writer("crash", lease);
        let client = redis.client();
        let readers = queued_readers(&redis, &client, "crash", CROWD).await;
        assert!(
            taken.elapsed() < lease,
            "the readers queued too late to show anything"
        );
        // Nobody releases: the first reader to look once the lease has run out lets them all
        // in (the general path).
        let guards = all_in(&client, "crash", readers).await;
        assert!(taken.elapsed() >= lease - Duration::from_millis(50));
        for guard in guards {
            guard.unlock().await.unwrap();
        }
        assert!(redis.leftovers().await.is_empty());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_reader_leaves_after_thousands_of_read_leases_ran_out_together() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let redis = TestRedis::new();
    within(LIMIT, async {
        // A live reader keeps the keys from expiring with the others' leases.
        let client = redis.client();
        let keeper = client.rwlock("leases").unwrap().read().await.unwrap();
        // Long enough for every reader to be seen holding before they run out.
        let lease = Duration::from_secs(10);
        let mut taken = None;
        crashing(|| async {
            let client = redis.builder().default_lease(lease).build().unwrap();
            let readers: Vec<_> = (0..HOLDERS)
                .map(|_| {
                    let lock = client.rwlock("leases").unwrap();
                    tokio::spawn(async move { lock.read().await.unwrap() })
                })
                .collect();
            for r in readers {
                // Never released and, once the runtime is gone, never renewed.
                let _ = Box::leak(Box::new(r.await.unwrap()));
            }
            taken = Some(Instant::now());
        });
        let taken = taken.unwrap();
        let snapshot = client.inspect("leases").await.unwrap();
        assert!(
            taken.elapsed() < lease,
            "the readers took too long to show anything"
        );
        assert_eq!(snapshot.holders.len(), HOLDERS + 1);
        // Once every crashed reader's lease has run out, the keeper's unlock drops them all
        // in one call, and with them the name.
        tokio::time::sleep_until((taken + lease + Duration::from_millis(500)).into()).await;
        keeper.unlock().await.expect("the keeper's unlock");
        assert!(redis.leftovers().await.is_empty());
        let writer = client
            .rwlock("leases")
            .unwrap()
            .try_write()
            .await
            .unwrap()
            .expect("nobody holds");
        writer.unlock().await.unwrap();
        assert!(redis.leftovers().await.is_empty());
    })
    .await;
}
