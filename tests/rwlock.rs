//! RwLock: writers exclude everyone, readers share, a waiting writer blocks new readers, a
//! stream of readers does not starve a writer, downgrade works and upgrade is refused.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use redlatch::{Error, LockKind, Wants};
use support::{TestRedis, until, within};
use tokio::sync::{Barrier, Mutex as LocalMutex};
use tokio::time::Instant;

const LIMIT: Duration = Duration::from_secs(60);
/// Shorter than the 30 s lease: a lost wake-up makes a waiter sit out a whole lease.
const NO_LOST_WAKEUPS: Duration = Duration::from_secs(25);

#[derive(Debug, Clone, Copy)]
struct Interval {
    write: bool,
    start: Instant,
    end: Instant,
}

/// No writer's interval overlaps any other interval. Intervals are measured inside the holds
/// (after the acquire returned, before the release was sent), so they are within the real ones.
fn check_writers_exclusive(intervals: &[Interval]) {
    for (i, a) in intervals.iter().enumerate() {
        for b in &intervals[i + 1..] {
            let overlap = a.start < b.end && b.start < a.end;
            assert!(!(overlap && (a.write || b.write)), "{a:?} overlaps {b:?}");
        }
    }
}

#[tokio::test]
async fn readers_share_and_writers_exclude() {
    let redis = TestRedis::new();
    within(NO_LOST_WAKEUPS, async {
        let clients: Vec<_> = (0..4).map(|_| redis.client()).collect();
        // Readers alone hold at once: each waits, holding, for all the others.
        let barrier = Arc::new(Barrier::new(4));
        let mut tasks = Vec::new();
        for c in &clients {
            let lock = c.rwlock("rw").unwrap();
            let barrier = Arc::clone(&barrier);
            tasks.push(tokio::spawn(async move {
                let reader = lock.read().await.unwrap();
                barrier.wait().await;
                reader.unlock().await.unwrap();
            }));
        }
        for t in tasks.drain(..) {
            t.await.unwrap();
        }
        // Mixed: 8 readers and 2 writers over 4 clients.
        let intervals = Arc::new(LocalMutex::new(Vec::new()));
        for t in 0..10 {
            let lock = clients[t % 4].rwlock("rw").unwrap();
            let intervals = Arc::clone(&intervals);
            let write = t < 2;
            tasks.push(tokio::spawn(async move {
                for _ in 0..40 {
                    let (start, end) = if write {
                        let g = lock.write().await.unwrap();
                        let start = Instant::now();
                        tokio::task::yield_now().await;
                        let end = Instant::now();
                        g.unlock().await.unwrap();
                        (start, end)
                    } else {
                        let g = lock.read().await.unwrap();
                        let start = Instant::now();
                        tokio::task::yield_now().await;
                        let end = Instant::now();
                        g.unlock().await.unwrap();
                        (start, end)
                    };
                    intervals.lock().await.push(Interval { write, start, end });
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let intervals = intervals.lock().await;
        assert_eq!(intervals.len(), 400);
        check_writers_exclusive(&intervals);
        assert!(
            redis.leftovers().await.is_empty(),
            "{:?}",
            redis.leftovers().await
        );
    })
    .await;
}

#[tokio::test]
async fn readers_handed_the_lock_after_a_writer_keep_their_hold_for_its_lease() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let (r1c, wc) = (redis.client(), redis.client());
        let r2c = redis
            .builder()
            .default_lease(Duration::from_secs(3))
            .build()
            .unwrap();
        // A reader with a short lease: the holders key is made with its expiry.
        let r1 = r1c
            .rwlock("kept")
            .unwrap()
            .with_lease(Duration::from_millis(500))
            .unwrap()
            .read()
            .await
            .unwrap();
        // A writer with a long lease is handed the lock when the reader lets go.
        let writer = {
            let lock = wc
                .rwlock("kept")
                .unwrap()
                .with_lease(Duration::from_secs(10))
                .unwrap();
            tokio::spawn(async move { lock.write().await.unwrap() })
        };
        until(|| async { redis.queued(&r1c, "kept").await == 1 }).await;
        r1.unlock().await.unwrap();
        let w = writer.await.unwrap();
        // A reader queued behind the writer is handed the lock in turn.
        let reader = {
            let lock = r2c.rwlock("kept").unwrap();
            tokio::spawn(async move { lock.read().await.unwrap() })
        };
        until(|| async { redis.queued(&r1c, "kept").await == 1 }).await;
        w.unlock().await.unwrap();
        let r2 = reader.await.unwrap();
        // The holders key lives as long as the name's other keys, not the first reader's.
        let conn = redis.conn().await;
        let ttl = |key: String| {
            let mut conn = conn.clone();
            async move {
                redis::cmd("PTTL")
                    .arg(key)
                    .query_async::<i64>(&mut conn)
                    .await
                    .unwrap()
            }
        };
        let meta = ttl(redis.lock_key("kept")).await;
        let holders = ttl(format!("{}:holders", redis.lock_key("kept"))).await;
        assert!(
            holders + 100 >= meta,
            "the holders key expires in {holders} ms, the name in {meta} ms"
        );
        // Its renewals find it past the first reader's lease (the key went with it before).
        assert!(
            tokio::time::timeout(Duration::from_secs(3), r2.lost())
                .await
                .is_err(),
            "the handed read hold was lost while renewed"
        );
        assert!(r2.is_held());
        r2.unlock().await.unwrap();
        assert!(redis.leftovers().await.is_empty());
    })
    .await;
}

#[tokio::test]
async fn a_stream_of_readers_does_not_starve_a_writer() {
    let redis = TestRedis::new();
    within(NO_LOST_WAKEUPS, async {
        let (a, b) = (redis.client(), redis.client());
        let stop = Arc::new(AtomicBool::new(false));
        let reads = Arc::new(AtomicU64::new(0));
        let mut readers = Vec::new();
        for t in 0..4 {
            let lock = [&a, &b][t % 2].rwlock("stream").unwrap();
            let (stop, reads) = (Arc::clone(&stop), Arc::clone(&reads));
            readers.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let g = lock.read().await.unwrap();
                    tokio::time::sleep(Duration::from_millis(3)).await;
                    g.unlock().await.unwrap();
                    reads.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
        // Readers overlap one another, so without a queue the lock would never be free.
        until(|| async { reads.load(Ordering::Relaxed) >= 20 }).await;
        let writer = b
            .rwlock("stream")
            .unwrap()
            .write_timeout(Duration::from_secs(10))
            .await
            .unwrap();
        let during = reads.load(Ordering::Relaxed);
        let snapshot = a.inspect("stream").await.unwrap();
        assert_eq!(snapshot.holders.len(), 1);
        assert_eq!(snapshot.holders[0].exclusive_holds, 1);
        writer.unlock().await.unwrap();
        until(|| async { reads.load(Ordering::Relaxed) > during + 4 }).await;
        stop.store(true, Ordering::Relaxed);
        for r in readers {
            r.await.unwrap();
        }
        assert!(redis.leftovers().await.is_empty());
    })
    .await;
}

#[tokio::test]
async fn a_waiting_writer_blocks_new_readers_and_goes_first() {
    let redis = TestRedis::new();
    within(NO_LOST_WAKEUPS, async {
        let (a, b) = (redis.client(), redis.client());
        let lock = a.rwlock("order").unwrap();
        let first = lock.read().await.unwrap();
        let order = Arc::new(LocalMutex::new(Vec::new()));
        let writer = tokio::spawn({
            let (lock, order) = (b.rwlock("order").unwrap(), Arc::clone(&order));
            async move {
                let w = lock.write().await.unwrap();
                order.lock().await.push("writer");
                w.unlock().await.unwrap();
            }
        });
        until(|| async { redis.queued(&a, "order").await == 1 }).await;
        // A reader that could share with `first` must not pass the queued writer.
        assert!(lock.try_read().await.unwrap().is_none());
        let reader = tokio::spawn({
            let (lock, order) = (a.rwlock("order").unwrap(), Arc::clone(&order));
            async move {
                let r = lock.read().await.unwrap();
                order.lock().await.push("reader");
                r.unlock().await.unwrap();
            }
        });
        until(|| async { redis.queued(&a, "order").await == 2 }).await;
        let waiting: Vec<Wants> = a
            .inspect("order")
            .await
            .unwrap()
            .waiters
            .iter()
            .map(|w| w.wants)
            .collect();
        assert_eq!(waiting, [Wants::Write, Wants::Read]);
        first.unlock().await.unwrap();
        writer.await.unwrap();
        reader.await.unwrap();
        assert_eq!(*order.lock().await, ["writer", "reader"]);
        assert!(redis.leftovers().await.is_empty());
    })
    .await;
}

#[tokio::test]
async fn a_writer_downgrades_and_a_reader_cannot_upgrade() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let (a, b) = (redis.client(), redis.client());
        let lock = a.rwlock("grade").unwrap();
        let writer = lock.write().await.unwrap();
        let token = writer.fencing_token();
        assert!(
            b.rwlock("grade")
                .unwrap()
                .try_read()
                .await
                .unwrap()
                .is_none()
        );
        let again = writer.reenter().await.unwrap();
        assert_eq!(again.fencing_token(), token);
        again.unlock().await.unwrap();
        // Downgrade: read as the writer, then let go of the write hold.
        let kept = writer.read().await.unwrap();
        writer.unlock().await.unwrap();
        let other = b
            .rwlock("grade")
            .unwrap()
            .try_read()
            .await
            .unwrap()
            .unwrap();
        let snapshot = a.inspect("grade").await.unwrap();
        assert_eq!(snapshot.kind, Some(LockKind::RwLock));
        assert_eq!(snapshot.holders.len(), 2);
        assert!(
            snapshot
                .holders
                .iter()
                .all(|h| h.exclusive_holds == 0 && h.shared_holds == 1)
        );
        assert!(
            b.rwlock("grade")
                .unwrap()
                .try_write()
                .await
                .unwrap()
                .is_none()
        );
        // Upgrade: refused at once, nothing changed.
        let err = lock.write_as(kept.owner()).await.unwrap_err();
        assert!(matches!(err, Error::Upgrade { .. }), "{err:?}");
        assert_eq!(a.inspect("grade").await.unwrap().holders.len(), 2);
        kept.unlock().await.unwrap();
        other.unlock().await.unwrap();
        let next = lock.write().await.unwrap();
        assert!(next.fencing_token() > token);
        next.unlock().await.unwrap();
        assert!(redis.leftovers().await.is_empty());
    })
    .await;
}

#[tokio::test]
async fn queued_readers_get_in_once_a_crashed_writers_lease_runs_out() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        // Long enough for both readers to be seen queued before it runs out.
        let lease = Duration::from_secs(3);
        let taken = redis.crashed_writer("crash", lease);
        // Two readers queue while the dead writer's lease still runs; nobody will ever
        // release it, so they go in on their own timers once it has run out.
        let client = redis.client();
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let lock = client.rwlock("crash").unwrap();
                tokio::spawn(async move { lock.read().await.unwrap() })
            })
            .collect();
        support::until(|| async { redis.queued(&client, "crash").await == 2 }).await;
        assert!(
            taken.elapsed() < lease,
            "the readers queued too late to show anything"
        );
        let mut guards = Vec::new();
        for r in readers {
            guards.push(r.await.unwrap());
        }
        assert!(taken.elapsed() >= lease - Duration::from_millis(50));
        let snapshot = client.inspect("crash").await.unwrap();
        assert_eq!(snapshot.holders.len(), 2);
        assert!(snapshot.holders.iter().all(|h| h.exclusive_holds == 0));
        for g in guards {
            g.unlock().await.unwrap();
        }
        assert!(redis.leftovers().await.is_empty());
    })
    .await;
}
