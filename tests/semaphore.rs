//! Semaphore: never more holders than permits, leased permits that come back from crashed
//! holders, refused double and late releases, order for large requests, typed errors.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use redlatch::{Error, LockKind, Wants};
use support::{TestRedis, crashing, until, within};
use tokio::time::Instant;

const LIMIT: Duration = Duration::from_secs(60);
/// Shorter than the 30 s lease: a lost wake-up makes a waiter sit out a whole lease (its
/// fallback timer), so a test bounded by this fails instead of passing slowly.
const NO_LOST_WAKEUPS: Duration = Duration::from_secs(25);

#[tokio::test]
async fn holders_never_exceed_the_capacity_and_reach_it() {
    let redis = TestRedis::new();
    within(NO_LOST_WAKEUPS, async {
        let clients: Vec<_> = (0..4).map(|_| redis.client()).collect();
        let inside = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for t in 0..16 {
            let sem = clients[t % 4].semaphore("three", 3).unwrap();
            let (inside, most) = (Arc::clone(&inside), Arc::clone(&most));
            tasks.push(tokio::spawn(async move {
                for _ in 0..200 {
                    let permit = sem.acquire().await.unwrap();
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    permit.release().await.unwrap();
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(most.load(Ordering::SeqCst), 3);
        let sem = clients[0].semaphore("three", 3).unwrap();
        assert_eq!(sem.available_permits().await.unwrap(), 3);
        assert!(
            redis.leftovers().await.is_empty(),
            "{:?}",
            redis.leftovers().await
        );
    })
    .await;
}

#[tokio::test]
async fn a_release_after_the_lease_is_refused_and_frees_nothing() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let client = redis.client();
        let other = redis.client();
        let short = client
            .semaphore("late", 2)
            .unwrap()
            .with_lease(Duration::from_millis(300))
            .unwrap();
        let late = short.acquire().await.unwrap();
        let lost = late.lost();
        lost.await;
        // Its permit came back; two others now hold both permits.
        let sem = other.semaphore("late", 2).unwrap();
        let a = sem.acquire().await.unwrap();
        let b = sem.acquire().await.unwrap();
        assert!(matches!(late.release().await, Err(Error::NotHeld { .. })));
        assert_eq!(sem.available_permits().await.unwrap(), 0);
        assert!(sem.try_acquire().await.unwrap().is_none());
        a.release().await.unwrap();
        b.release().await.unwrap();
        assert_eq!(sem.available_permits().await.unwrap(), 2);
        assert!(redis.leftovers().await.is_empty());
    })
    .await;
}

/// Found by review: a semaphore's keys outlive its last lease end (until their expiry, pushed
/// by the longest lease they held), and the capacity check ran before the leases that had run
/// out were purged: a name nobody held or waited on refused another capacity, against the docs
/// ("when nothing is held and nobody waits ... the next user sets the capacity").
/// A name in use as another primitive: the count of free permits is refused with the layout
/// tag that name carries (not a debug rendering of its kind), and the holder keeps its hold.
#[tokio::test]
async fn available_permits_of_a_name_in_use_as_a_fair_mutex_names_its_layout() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let client = redis.client();
        let guard = client.fair_mutex("other").unwrap().lock().await.unwrap();
        let refused = client
            .semaphore("other", 2)
            .unwrap()
            .available_permits()
            .await;
        assert!(
            matches!(&refused, Err(Error::Layout { found, .. }) if found == "fair:1"),
            "{refused:?}"
        );
        assert!(guard.is_held());
        guard.unlock().await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn an_idle_semaphore_takes_a_new_capacity_though_its_keys_linger() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let client = redis.client();
        // A fixed 10-minute lease pushes the keys' expiry 10 minutes out.
        let long = client
            .semaphore("cap", 2)
            .unwrap()
            .with_lease(Duration::from_secs(600))
            .unwrap()
            .acquire()
            .await
            .unwrap();
        // A holder that dies with a short lease.
        crashing(|| async {
            let crashed = redis
                .builder()
                .default_lease(Duration::from_millis(500))
                .build()
                .unwrap();
            let permit = crashed
                .semaphore("cap", 2)
                .unwrap()
                .acquire()
                .await
                .unwrap();
            let _ = Box::leak(Box::new(permit));
        });
        // Released while the crashed holder's permit is live: the name stays in use.
        long.release().await.unwrap();
        // The crashed holder's lease runs out: nobody holds, nobody waits.
        until(|| async { client.inspect("cap").await.unwrap().holders.is_empty() }).await;
        let wider = client.semaphore("cap", 5).unwrap();
        assert_eq!(wider.available_permits().await.unwrap(), 5);
        let permit = wider.acquire().await.unwrap();
        // In use now with 5: the old capacity is refused.
        let refused = client.semaphore("cap", 2).unwrap().try_acquire().await;
        assert!(
            matches!(
                refused,
                Err(Error::CapacityMismatch {
                    ours: 2,
                    theirs: 5,
                    ..
                })
            ),
            "{refused:?}"
        );
        permit.release().await.unwrap();
        assert!(redis.leftovers().await.is_empty());
    })
    .await;
}

#[tokio::test]
async fn a_crashed_holder_loses_its_permit_after_the_lease() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let lease = Duration::from_millis(500);
        let mut taken = None;
        crashing(|| async {
            let client = redis.builder().default_lease(lease).build().unwrap();
            // Before the request: its lease cannot start earlier.
            taken = Some(Instant::now());
            let permit = client
                .semaphore("crash", 1)
                .unwrap()
                .acquire()
                .await
                .unwrap();
            // Never released and, once the runtime is gone, never renewed.
            let _ = Box::leak(Box::new(permit));
        });
        let taken = taken.unwrap();
        let client = redis.client();
        let permit = client
            .semaphore("crash", 1)
            .unwrap()
            .acquire()
            .await
            .unwrap();
        // Exclusive: not before the crashed holder's lease ran out.
        assert!(taken.elapsed() >= lease - Duration::from_millis(50));
        assert!(permit.is_held());
        permit.release().await.unwrap();
        assert!(redis.leftovers().await.is_empty());
    })
    .await;
}

#[tokio::test]
async fn a_large_request_is_not_starved_by_single_permits() {
    let redis = TestRedis::new();
    within(NO_LOST_WAKEUPS, async {
        let (a, b) = (redis.client(), redis.client());
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut singles = Vec::new();
        for t in 0..6 {
            let sem = [&a, &b][t % 2].semaphore("big", 4).unwrap();
            let done = Arc::clone(&done);
            singles.push(tokio::spawn(async move {
                let mut n = 0u64;
                while !done.load(Ordering::Relaxed) {
                    let permit = sem.acquire().await.unwrap();
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    permit.release().await.unwrap();
                    n += 1;
                }
                n
            }));
        }
        // The singles keep all four permits busy; the request for four queues behind them and
        // must still get its turn.
        until(|| async { a.inspect("big").await.unwrap().waiters.len() >= 2 }).await;
        let all = b
            .semaphore("big", 4)
            .unwrap()
            .acquire_many(4)
            .await
            .unwrap();
        assert_eq!(all.permits(), 4);
        let snapshot = a.inspect("big").await.unwrap();
        assert_eq!(snapshot.permits_in_use, Some(4));
        assert_eq!(snapshot.holders.len(), 1);
        done.store(true, Ordering::Relaxed);
        all.release().await.unwrap();
        let mut total = 0;
        for s in singles {
            total += s.await.unwrap();
        }
        assert!(total > 0);
        assert!(redis.leftovers().await.is_empty());
    })
    .await;
}

#[tokio::test]
async fn a_release_wakes_only_the_waiters_it_can_satisfy() {
    let redis = TestRedis::own();
    within(LIMIT, async {
        let holder = redis.client();
        let sem = holder.semaphore("wake", 2).unwrap();
        // Loads the release script, so the count below has no NOSCRIPT retry in it.
        sem.acquire().await.unwrap().release().await.unwrap();
        let (p1, p2) = (sem.acquire().await.unwrap(), sem.acquire().await.unwrap());
        let waiters = redis.client();
        let acquired = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for i in 0..5 {
            let sem = waiters.semaphore("wake", 2).unwrap();
            let acquired = Arc::clone(&acquired);
            tasks.push(tokio::spawn(async move {
                let permit = sem.acquire().await.unwrap();
                acquired.fetch_add(1, Ordering::SeqCst);
                permit
            }));
            until(|| async { redis.queued(&holder, "wake").await == i + 1 }).await;
        }
        // Once the waiters' client listens, and they are quiet: one that queued before its
        // client's subscription was up asks once more when it is.
        until(|| redis.listened("wake")).await;
        let before = redis.settle().await;
        p1.release().await.unwrap();
        until(|| async { acquired.load(Ordering::SeqCst) == 1 }).await;
        // One script call in all: the release handed the permit to the one waiter it could
        // satisfy; nobody else tried, and the waiter needed no request of its own.
        let after = redis.settle().await;
        assert_eq!(after - before, 1, "{before} -> {after}");
        let snapshot = holder.inspect("wake").await.unwrap();
        assert_eq!(snapshot.waiters.len(), 4);
        assert!(
            snapshot
                .waiters
                .iter()
                .all(|w| w.wants == Wants::Permits(1))
        );
        p2.release().await.unwrap();
        until(|| async { acquired.load(Ordering::SeqCst) == 2 }).await;
        for t in tasks.drain(..2) {
            drop(t.await.unwrap());
        }
        for t in &tasks {
            t.abort();
        }
    })
    .await;
}

#[tokio::test]
async fn bad_requests_get_typed_errors() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let client = redis.client();
        assert!(matches!(
            client.semaphore("bad", 0),
            Err(Error::InvalidArgument {
                what: "permits",
                ..
            })
        ));
        let sem = client.semaphore("bad", 3).unwrap();
        for n in [0, 4] {
            assert!(matches!(
                sem.acquire_many(n).await,
                Err(Error::InvalidArgument {
                    what: "permits",
                    ..
                })
            ));
        }
        let held = sem.acquire_many(2).await.unwrap();
        let other = redis.client().semaphore("bad", 5).unwrap();
        let err = other.acquire().await.unwrap_err();
        assert!(
            matches!(
                err,
                Error::CapacityMismatch {
                    ours: 5,
                    theirs: 3,
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(matches!(
            other.available_permits().await,
            Err(Error::CapacityMismatch { .. })
        ));
        // Nothing changed: still one holder of two permits.
        let snapshot = client.inspect("bad").await.unwrap();
        assert_eq!(snapshot.kind, Some(LockKind::Semaphore));
        assert_eq!(
            (snapshot.permits_in_use, snapshot.capacity),
            (Some(2), Some(3))
        );
        assert!(snapshot.waiters.is_empty());
        assert!(held.fencing_token() > 0);
        held.release().await.unwrap();
        assert!(matches!(
            client.mutex("bad").unwrap().lock().await.map(drop),
            Ok(())
        ));
    })
    .await;
}

/// Found by the fault matrix's row `blackhole/semaphore`: a waiter cut off from Redis was handed
/// a permit it never heard of, lost it (its first term ran out) and with it its place; when the
/// link came back it queued again, and then took the old hand-over message, arriving late, for a
/// grant to its new place, while another client held the permit. Hand-over messages now name
/// the place (its ticket), and an attempt that got no answer no longer counts as having seen
/// the waiter waiting.
#[tokio::test]
async fn a_late_hand_over_message_for_a_lost_place_grants_nothing() {
    use redlatch_harness::proxy::Mode;
    use std::sync::atomic::AtomicBool;

    let redis = TestRedis::own();
    within(LIMIT, async {
        let lease = Duration::from_secs(1);
        let (proxy, builder) = redis.through_proxy().await;
        // The cut-off client: short first terms, and retries that keep an attempt in flight.
        let cut = builder
            .default_lease(lease)
            .waiter_timeout(lease)
            .wait_backoff(Duration::from_millis(1), Duration::from_millis(5))
            .build()
            .unwrap();
        let other = redis.builder().default_lease(lease).build().unwrap();
        let sem = other.semaphore("late", 1).unwrap();
        let first = sem.acquire().await.unwrap();

        let other_holds = Arc::new(AtomicBool::new(false));
        let waiter = {
            let sem = cut.semaphore("late", 1).unwrap();
            let other_holds = Arc::clone(&other_holds);
            tokio::spawn(async move {
                let permit = sem.acquire_timeout(Duration::from_secs(30)).await;
                (permit, other_holds.load(Ordering::SeqCst))
            })
        };
        until(|| async { redis.queued(&other, "late").await == 1 }).await;
        proxy.set(Mode::Blackhole);
        // The release hands the permit to the cut-off waiter, which never answers: its first
        // term runs out, it loses its place, and the other client gets the permit.
        first.release().await.unwrap();
        let second = sem.acquire_timeout(Duration::from_secs(10)).await.unwrap();
        other_holds.store(true, Ordering::SeqCst);
        proxy.set(Mode::Pass);
        // The healed waiter hears the old hand-over now; it must not take it for a grant. The
        // other client holds on for a margin in which it would.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        other_holds.store(false, Ordering::SeqCst);
        second.release().await.unwrap();
        let (permit, while_other_held) = waiter.await.unwrap();
        assert!(!while_other_held, "the waiter took a permit it had lost");
        permit.unwrap().release().await.unwrap();
        until(|| async { redis.leftovers().await.is_empty() }).await;
    })
    .await;
}

/// A release that hands a permit over with a lease shorter than the queue was told tells the
/// first waiter of each client, by name, to look again. If that waiter then leaves without the
/// permit, the next waiter of its client looks again in its place: when the short lease runs
/// out (its holder gone), that waiter takes the permit then, not at the time it learned before
/// (the first holder's 30 s lease end).
#[tokio::test]
async fn a_told_waiter_that_leaves_passes_the_look_on_to_its_clients_next_waiter() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let (first_holder, short, waiting) = (redis.client(), redis.client(), redis.client());
        let held = first_holder
            .semaphore("told", 1)
            .unwrap()
            .acquire()
            .await
            .unwrap();
        let brief = {
            let semaphore = short
                .semaphore("told", 1)
                .unwrap()
                .with_lease(Duration::from_secs(2))
                .unwrap();
            tokio::spawn(async move { semaphore.acquire().await.unwrap() })
        };
        until(|| async { redis.queued(&first_holder, "told").await == 1 }).await;
        let semaphore = waiting.semaphore("told", 1).unwrap();
        let leaving = {
            let semaphore = semaphore.clone();
            tokio::spawn(async move { semaphore.acquire().await })
        };
        until(|| async { redis.queued(&first_holder, "told").await == 2 }).await;
        let staying = tokio::spawn(async move { semaphore.acquire().await.unwrap() });
        until(|| async { redis.queued(&first_holder, "told").await == 3 }).await;
        // The permit is handed over after this, for 2 s.
        let freed = Instant::now() + Duration::from_secs(2);
        held.release().await.unwrap();
        // The 2 s holder never lets the permit go (as if its process died): its lease runs out
        // in Redis.
        let _dead = std::mem::ManuallyDrop::new(brief.await.unwrap());
        leaving.abort();
        let got = tokio::time::timeout(Duration::from_secs(15), staying)
            .await
            .expect("the staying waiter looked only at the time it learned first")
            .unwrap();
        assert!(
            Instant::now() >= freed,
            "taken before the short lease ran out"
        );
        got.release().await.unwrap();
    })
    .await;
}
