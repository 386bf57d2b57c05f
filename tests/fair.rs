//! FairMutex: strict FIFO across clients, eviction of dead and cancelled waiters, guard powers,
//! nothing left behind.

mod support;

use std::sync::Arc;
use std::time::Duration;

use redlatch::{Error, LockKind};
use redlatch_harness::proxy::Mode;
use support::{TestRedis, crashing, until, until_within, within};
use tokio::sync::Mutex as LocalMutex;
use tokio::time::Instant;

const LIMIT: Duration = Duration::from_secs(60);
/// Shorter than the 30 s lease: a lost wake-up makes a waiter sit out a whole lease (its
/// fallback timer), so a test bounded by this fails instead of passing slowly.
const NO_LOST_WAKEUPS: Duration = Duration::from_secs(25);

#[tokio::test]
async fn waiters_acquire_in_the_order_they_queued() {
    let redis = TestRedis::new();
    within(NO_LOST_WAKEUPS, async {
        let clients: Vec<_> = (0..4).map(|_| redis.client()).collect();
        let holder = clients[0]
            .fair_mutex("order")
            .unwrap()
            .lock()
            .await
            .unwrap();
        let order = Arc::new(LocalMutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..8 {
            // Waiters spread over four clients, queued one at a time.
            let mutex = clients[i % 4].fair_mutex("order").unwrap();
            let order = Arc::clone(&order);
            tasks.push(tokio::spawn(async move {
                let guard = mutex.lock().await.unwrap();
                order.lock().await.push(i);
                guard.unlock().await.unwrap();
            }));
            until(|| async { redis.queued(&clients[0], "order").await == i + 1 }).await;
        }
        holder.unlock().await.unwrap();
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*order.lock().await, (0..8).collect::<Vec<_>>());
        assert!(
            redis.leftovers().await.is_empty(),
            "{:?}",
            redis.leftovers().await
        );
    })
    .await;
}

#[tokio::test]
async fn a_cancelled_wait_leaves_the_queue_at_once() {
    let redis = TestRedis::new();
    within(NO_LOST_WAKEUPS, async {
        let (a, b) = (redis.client(), redis.client());
        let holder = a.fair_mutex("cancel").unwrap().lock().await.unwrap();
        let quitter = tokio::spawn({
            let m = b.fair_mutex("cancel").unwrap();
            async move { m.lock().await.map(drop) }
        });
        until(|| async { redis.queued(&a, "cancel").await == 1 }).await;
        let next = tokio::spawn({
            let m = a.fair_mutex("cancel").unwrap();
            async move { m.lock().await.unwrap() }
        });
        until(|| async { redis.queued(&a, "cancel").await == 2 }).await;
        quitter.abort();
        // Its place goes with the future, long before any eviction (30 s by default).
        until(|| async { redis.queued(&a, "cancel").await == 1 }).await;
        holder.unlock().await.unwrap();
        let guard = next.await.unwrap();
        assert!(guard.is_held());
        guard.unlock().await.unwrap();
        assert!(redis.leftovers().await.is_empty());
    })
    .await;
}

#[tokio::test]
async fn a_dead_waiter_is_evicted_after_its_timeout() {
    let redis = TestRedis::new();
    within(NO_LOST_WAKEUPS, async {
        let live = redis.client();
        let holder = live.fair_mutex("dead").unwrap().lock().await.unwrap();
        // A waiter queues from a process that then dies: nobody removes its place or answers
        // the hand-over that reaches it.
        crashing(|| async {
            let client = redis
                .builder()
                .waiter_timeout(Duration::from_millis(500))
                .build()
                .unwrap();
            let m = client.fair_mutex("dead").unwrap();
            tokio::spawn(async move { m.lock().await });
            until(|| async { redis.queued(&client, "dead").await == 1 }).await;
        });
        let next = tokio::spawn({
            let m = live.fair_mutex("dead").unwrap();
            async move { m.lock().await.unwrap() }
        });
        until(|| async { redis.queued(&live, "dead").await == 2 }).await;
        // The release wakes the dead head; the live waiter behind it gets the lock once the
        // dead one's place runs out, not after minutes and not never.
        holder.unlock().await.unwrap();
        let guard = next.await.unwrap();
        let snapshot = live.inspect("dead").await.unwrap();
        assert_eq!(snapshot.waiters.len(), 0);
        assert_eq!(snapshot.holders.len(), 1);
        guard.unlock().await.unwrap();
        assert!(redis.leftovers().await.is_empty());
    })
    .await;
}

/// A hand-over that runs out unanswered shows its client gone, and every waiter of that client
/// goes with it at the next call: `inspect`, which changes nothing, leaves them out already.
#[tokio::test]
async fn inspect_leaves_out_the_waiters_of_a_client_whose_hand_over_ran_out() {
    let redis = TestRedis::new();
    within(NO_LOST_WAKEUPS, async {
        let live = redis.client();
        let holder = live.fair_mutex("gone").unwrap().lock().await.unwrap();
        // Two waiters queue from a process that then dies.
        crashing(|| async {
            let client = redis
                .builder()
                .waiter_timeout(Duration::from_millis(300))
                .build()
                .unwrap();
            for _ in 0..2 {
                let m = client.fair_mutex("gone").unwrap();
                tokio::spawn(async move { m.lock().await });
            }
            until(|| async { redis.queued(&client, "gone").await == 2 }).await;
        });
        // The release hands the lock to the first, which never answers: once its first term
        // runs out, it holds nothing.
        holder.unlock().await.unwrap();
        until(|| async { live.inspect("gone").await.unwrap().holders.is_empty() }).await;
        let snapshot = live.inspect("gone").await.unwrap();
        assert!(snapshot.waiters.is_empty(), "{snapshot:?}");
        // The next call clears them indeed.
        let guard = live.fair_mutex("gone").unwrap().try_lock().await.unwrap();
        assert!(guard.is_some());
        drop(guard);
        until(|| async { redis.leftovers().await.is_empty() }).await;
    })
    .await;
}

#[tokio::test]
async fn a_burst_is_exact_and_leaves_nothing_behind() {
    let redis = TestRedis::new();
    within(NO_LOST_WAKEUPS, async {
        let clients: Vec<_> = (0..4).map(|_| redis.client()).collect();
        let key = redis.lock_key("counter-fair") + ":value";
        let mut tasks = Vec::new();
        for t in 0..16 {
            let mutex = clients[t % 4].fair_mutex("burst").unwrap();
            let mut conn = redis.conn().await;
            let key = key.clone();
            tasks.push(tokio::spawn(async move {
                for _ in 0..50 {
                    let guard = mutex.lock().await.unwrap();
                    support::racy_increment(&mut conn, &key).await;
                    guard.unlock().await.unwrap();
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let mut conn = redis.conn().await;
        let v: u64 = redis::cmd("GET")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(v, 800);
        let _: () = redis::cmd("DEL")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(
            redis.leftovers().await.is_empty(),
            "{:?}",
            redis.leftovers().await
        );
        assert_eq!(clients[0].inspect("burst").await.unwrap().kind, None);
    })
    .await;
}

#[tokio::test]
async fn fair_guards_reenter_fence_and_notice_loss() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let client = redis.client();
        let other = redis.client();
        let mutex = client.fair_mutex("powers").unwrap();
        let first = mutex.lock().await.unwrap();
        let t1 = first.fencing_token();
        let inner = first.reenter().await.unwrap();
        assert_eq!(inner.fencing_token(), t1);
        let snapshot = client.inspect("powers").await.unwrap();
        assert_eq!(snapshot.kind, Some(LockKind::FairMutex));
        assert_eq!(snapshot.holders[0].exclusive_holds, 2);
        assert_eq!(snapshot.holders[0].id, first.owner().short_id());
        assert_eq!(snapshot.last_fencing_token, Some(t1));
        assert!(
            other
                .fair_mutex("powers")
                .unwrap()
                .try_lock()
                .await
                .unwrap()
                .is_none()
        );
        // Across processes, by token.
        let carried = other
            .fair_mutex("powers")
            .unwrap()
            .lock_as(first.owner())
            .await
            .unwrap();
        carried.unlock().await.unwrap();
        inner.unlock().await.unwrap();
        first.unlock().await.unwrap();
        let second = mutex.lock().await.unwrap();
        assert!(second.fencing_token() > t1);
        // The same name cannot be used as a plain mutex meanwhile.
        assert!(matches!(
            client.mutex("powers").unwrap().try_lock().await,
            Err(Error::Layout { .. })
        ));
        // Deleted behind its back: the next renewal notices.
        let lost = second.lost();
        let mut conn = redis.conn().await;
        let _: () = redis::cmd("DEL")
            .arg(redis.lock_key("powers"))
            .query_async(&mut conn)
            .await
            .unwrap();
        second.extend(Duration::from_secs(5)).await.unwrap_err();
        lost.await;
        assert!(!second.is_held());
    })
    .await;
}

#[tokio::test]
async fn a_timed_out_wait_leaves_no_place_behind() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let client = redis.client();
        let holder = client.fair_mutex("timeout").unwrap().lock().await.unwrap();
        let err = client
            .fair_mutex("timeout")
            .unwrap()
            .lock_timeout(Duration::from_millis(200))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Timeout { .. }));
        until(|| async { redis.queued(&client, "timeout").await == 0 }).await;
        holder.unlock().await.unwrap();
        assert!(redis.leftovers().await.is_empty());
    })
    .await;
}

#[tokio::test]
async fn a_crashed_client_holds_up_the_queue_for_one_grace_however_many_waiters_it_had() {
    let redis = TestRedis::new();
    within(NO_LOST_WAKEUPS, async {
        let live = redis.client();
        let holder = live.fair_mutex("crowd").unwrap().lock().await.unwrap();
        // Ten waiters queue from a process that then dies; each would take the lock for its
        // 500 ms grace if they were passed over one at a time.
        crashing(|| async {
            let client = redis
                .builder()
                .waiter_timeout(Duration::from_millis(500))
                .build()
                .unwrap();
            for _ in 0..10 {
                let m = client.fair_mutex("crowd").unwrap();
                tokio::spawn(async move { m.lock().await });
            }
            until(|| async { redis.queued(&client, "crowd").await == 10 }).await;
        });
        let next = tokio::spawn({
            let m = live.fair_mutex("crowd").unwrap();
            async move { m.lock().await.unwrap() }
        });
        until(|| async { redis.queued(&live, "crowd").await == 11 }).await;
        let released = Instant::now();
        holder.unlock().await.unwrap();
        // The first dead waiter gets the lock and lets its grace run out; that shows its client
        // is gone, and its other nine places go with it.
        let guard = next.await.unwrap();
        let waited = released.elapsed();
        assert!(
            waited < Duration::from_millis(3_000),
            "{waited:?}: the dead waiters were passed over one grace at a time"
        );
        assert!(live.inspect("crowd").await.unwrap().waiters.is_empty());
        guard.unlock().await.unwrap();
        assert!(redis.leftovers().await.is_empty());
    })
    .await;
}

#[tokio::test]
async fn a_fixed_lease_that_runs_out_keeps_its_clients_waiters_in_line() {
    let redis = TestRedis::new();
    within(NO_LOST_WAKEUPS, async {
        // A lock taken for a fixed 300 ms and left to run out on purpose: its client is alive,
        // and its next waiter keeps its turn ahead of later arrivals from elsewhere.
        let a = redis.client();
        let b = redis.client();
        let timed = a
            .fair_mutex("timed")
            .unwrap()
            .with_lease(Duration::from_millis(300))
            .unwrap()
            .lock()
            .await
            .unwrap();
        let order = Arc::new(LocalMutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for (i, client) in [&a, &b].into_iter().enumerate() {
            let mutex = client.fair_mutex("timed").unwrap();
            let order = Arc::clone(&order);
            tasks.push(tokio::spawn(async move {
                let guard = mutex.lock().await.unwrap();
                order.lock().await.push(i);
                guard.unlock().await.unwrap();
            }));
            until(|| async { redis.queued(&a, "timed").await == i + 1 }).await;
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*order.lock().await, vec![0, 1]);
        drop(timed);
        support::until(|| async { redis.leftovers().await.is_empty() }).await;
    })
    .await;
}

#[tokio::test]
async fn tokens_keep_rising_after_a_handed_hold_runs_out_with_its_keys() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        // A counter an hour ahead of the server's clock (as after the clock stepped back):
        // every token is then the last one plus one, whatever the clock says.
        let mut conn = redis.conn().await;
        let ahead = redlatch_harness::measure::server_micros(&mut conn)
            .await
            .unwrap()
            + 3_600_000_000;
        let _: () = redis::pipe()
            .cmd("ZADD")
            .arg(format!("{}:fence", redis.lock_key("ahead")))
            .arg(ahead)
            .arg("~")
            .ignore()
            .cmd("PEXPIRE")
            .arg(format!("{}:fence", redis.lock_key("ahead")))
            .arg(120_000)
            .ignore()
            .query_async(&mut conn)
            .await
            .unwrap();
        let (a, b, c) = (redis.client(), redis.client(), redis.client());
        // Short fixed leases, so that the name's keys expire soon after the last one.
        let first = a
            .fair_mutex("ahead")
            .unwrap()
            .with_lease(Duration::from_millis(500))
            .unwrap()
            .lock()
            .await
            .unwrap();
        // A waiter handed the lock for a fixed 300 ms, kept past it: the keys expire after it.
        let stale = {
            let mutex = b
                .fair_mutex("ahead")
                .unwrap()
                .with_lease(Duration::from_millis(300))
                .unwrap();
            tokio::spawn(async move {
                let guard = mutex.lock().await.unwrap();
                guard.lost().await;
                guard
            })
        };
        until(|| async { redis.queued(&a, "ahead").await == 1 }).await;
        let token = first.fencing_token();
        assert!(token > ahead);
        first.unlock().await.unwrap();
        let stale = stale.await.unwrap();
        assert!(stale.fencing_token() > token);
        until(|| async { redis.leftovers().await.is_empty() }).await;
        // The next holder's token is above the handed one, never a repeat of it.
        let next = c.fair_mutex("ahead").unwrap().lock().await.unwrap();
        assert!(
            next.fencing_token() > stale.fencing_token(),
            "token {} after the handed hold's {}",
            next.fencing_token(),
            stale.fencing_token()
        );
        next.unlock().await.unwrap();
        drop(stale);
        until(|| async { redis.leftovers().await.is_empty() }).await;
    })
    .await;
}

#[tokio::test]
async fn a_handed_fixed_lease_that_runs_out_keeps_its_clients_waiters_in_line() {
    let redis = TestRedis::new();
    within(NO_LOST_WAKEUPS, async {
        // As above, but the fixed lease reaches its waiter by a hand-over, for a first term as
        // long as the lease: its one renewal answers for the client, which stays in line.
        let (holder, a, b) = (redis.client(), redis.client(), redis.client());
        let first = holder.fair_mutex("handed").unwrap().lock().await.unwrap();
        let order = Arc::new(LocalMutex::new(Vec::new()));
        let timed = {
            let mutex = a
                .fair_mutex("handed")
                .unwrap()
                .with_lease(Duration::from_millis(300))
                .unwrap();
            let order = Arc::clone(&order);
            tokio::spawn(async move {
                let guard = mutex.lock().await.unwrap();
                order.lock().await.push("a-timed");
                // Kept past its lease on purpose.
                guard.lost().await;
                guard
            })
        };
        until(|| async { redis.queued(&holder, "handed").await == 1 }).await;
        let mut tasks = Vec::new();
        for (i, (client, label)) in [(&a, "a"), (&b, "b")].into_iter().enumerate() {
            let mutex = client.fair_mutex("handed").unwrap();
            let order = Arc::clone(&order);
            tasks.push(tokio::spawn(async move {
                let guard = mutex.lock().await.unwrap();
                order.lock().await.push(label);
                guard.unlock().await.unwrap();
            }));
            until(|| async { redis.queued(&holder, "handed").await == i + 2 }).await;
        }
        first.unlock().await.unwrap();
        let timed = timed.await.unwrap();
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*order.lock().await, vec!["a-timed", "a", "b"]);
        drop(timed);
        until(|| async { redis.leftovers().await.is_empty() }).await;
    })
    .await;
}

#[tokio::test]
async fn two_waits_of_one_carried_owner_share_its_hold_and_nobody_else_gets_in() {
    let redis = TestRedis::new();
    within(NO_LOST_WAKEUPS, async {
        let (holder, a, b) = (redis.client(), redis.client(), redis.client());
        let mutex = a.fair_mutex("carried").unwrap();
        let first = holder.fair_mutex("carried").unwrap().lock().await.unwrap();
        let owner = redlatch::OwnerToken::new();
        let waits: Vec<_> = (0..2)
            .map(|_| {
                let mutex = mutex.clone();
                tokio::spawn(async move { mutex.lock_as(&owner).await.unwrap() })
            })
            .collect();
        // One place in the queue (the other wait takes its turn in the client), then a
        // stranger behind it.
        until(|| async { redis.queued(&holder, "carried").await == 1 }).await;
        let stranger = {
            let mutex = b.fair_mutex("carried").unwrap();
            tokio::spawn(async move { mutex.lock().await.unwrap() })
        };
        until(|| async { redis.queued(&holder, "carried").await == 2 }).await;
        first.unlock().await.unwrap();
        let mut guards = Vec::new();
        for w in waits {
            guards.push(w.await.unwrap());
        }
        // Both waits hold, as one owner with two holds; the stranger still waits.
        let snapshot = holder.inspect("carried").await.unwrap();
        assert_eq!(snapshot.holders.len(), 1, "{snapshot:?}");
        assert_eq!(snapshot.holders[0].exclusive_holds, 2, "{snapshot:?}");
        assert_eq!(guards[0].fencing_token(), guards[1].fencing_token());
        guards.pop().unwrap().unlock().await.unwrap();
        assert!(!stranger.is_finished());
        assert_eq!(redis.queued(&holder, "carried").await, 1);
        guards.pop().unwrap().unlock().await.unwrap();
        stranger.await.unwrap().unlock().await.unwrap();
        until(|| async { redis.leftovers().await.is_empty() }).await;
    })
    .await;
}

/// Waits of one carried owner in two clients, whose places go without a hand-over (an
/// administrator frees the name): the first to ask again takes the name, and the second joins
/// that hold (two holds) rather than take it for one handed to itself.
#[tokio::test]
async fn carried_waits_in_two_clients_whose_places_went_join_rather_than_share_one_hold() {
    let redis = TestRedis::new();
    within(NO_LOST_WAKEUPS, async {
        let (holder, a, b, c) = (
            redis.client(),
            redis.client(),
            redis.client(),
            redis.client(),
        );
        let first = holder.fair_mutex("freed").unwrap().lock().await.unwrap();
        let owner = redlatch::OwnerToken::new();
        let waits: Vec<_> = [&a, &b]
            .into_iter()
            .map(|client| {
                let mutex = client.fair_mutex("freed").unwrap();
                tokio::spawn(async move { mutex.lock_as(&owner).await.unwrap() })
            })
            .collect();
        until(|| async { redis.queued(&holder, "freed").await == 2 }).await;
        assert_eq!(holder.force_unlock("freed").await.unwrap().waiters, 2);
        let mut guards = Vec::new();
        for w in waits {
            guards.push(w.await.unwrap());
        }
        let snapshot = holder.inspect("freed").await.unwrap();
        assert_eq!(snapshot.holders.len(), 1, "{snapshot:?}");
        assert_eq!(snapshot.holders[0].exclusive_holds, 2, "{snapshot:?}");
        guards.pop().unwrap().unlock().await.unwrap();
        let stranger = c.fair_mutex("freed").unwrap();
        assert!(
            stranger.try_lock().await.unwrap().is_none(),
            "the other guard of the owner still holds"
        );
        guards.pop().unwrap().unlock().await.unwrap();
        stranger
            .try_lock()
            .await
            .unwrap()
            .expect("free")
            .unlock()
            .await
            .unwrap();
        drop(first);
        until(|| async { redis.leftovers().await.is_empty() }).await;
    })
    .await;
}

/// A carried owner's wait that times out leaves the queue in the background; the owner's next
/// wait in the client (which waited for its turn) must not take over that place, for the late
/// release to remove it (or the hold handed to it) after: it queues behind whoever queued
/// meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_wait_of_a_carried_owner_never_takes_over_the_place_of_one_that_timed_out() {
    let redis = TestRedis::new();
    within(NO_LOST_WAKEUPS, async {
        let (holder, a, b) = (redis.client(), redis.client(), redis.client());
        let owner = redlatch::OwnerToken::new();
        for round in 0..20 {
            let name = format!("turns-{round}");
            let first = holder.fair_mutex(&name).unwrap().lock().await.unwrap();
            let mutex = a.fair_mutex(&name).unwrap();
            let timed = {
                let mutex = mutex.clone();
                tokio::spawn(async move {
                    mutex
                        .lock_as_timeout(&owner, Duration::from_millis(200))
                        .await
                })
            };
            until(|| async { redis.queued(&holder, &name).await == 1 }).await;
            let stranger = {
                let mutex = b.fair_mutex(&name).unwrap();
                tokio::spawn(async move { mutex.lock().await.unwrap() })
            };
            until(|| async { redis.queued(&holder, &name).await == 2 }).await;
            // Waits for its turn behind the timed wait, then queues.
            let next = {
                let mutex = mutex.clone();
                tokio::spawn(async move { mutex.lock_as(&owner).await.unwrap() })
            };
            assert!(matches!(
                timed.await.unwrap(),
                Err(redlatch::Error::Timeout { .. })
            ));
            // The stranger first, then the owner's next wait, each in a place of its own (the
            // timed-out wait's place, of the same owner, may still be there for a moment).
            let queued = until_within(Duration::from_secs(10), || async {
                let waiters = holder.inspect(&name).await.unwrap().waiters;
                waiters.len() == 2 && waiters[1].id == owner.short_id()
            });
            assert!(
                queued.await,
                "round {round}: the owner's next wait took over the place of the one that timed \
                 out, or lost its own to that place's late release"
            );
            first.unlock().await.unwrap();
            stranger.await.unwrap().unlock().await.unwrap();
            next.await.unwrap().unlock().await.unwrap();
        }
        until(|| async { redis.leftovers().await.is_empty() }).await;
    })
    .await;
}

#[tokio::test]
async fn an_endless_timeout_is_no_deadline() {
    let redis = TestRedis::new();
    within(NO_LOST_WAKEUPS, async {
        let client = redis.client();
        let mutex = client.fair_mutex("endless").unwrap();
        let first = mutex.lock_timeout(Duration::MAX).await.unwrap();
        let waiter = {
            let mutex = mutex.clone();
            tokio::spawn(async move { mutex.lock_timeout(Duration::MAX).await })
        };
        until(|| async { redis.queued(&client, "endless").await == 1 }).await;
        first.unlock().await.unwrap();
        waiter.await.unwrap().unwrap().unlock().await.unwrap();
        until(|| async { redis.leftovers().await.is_empty() }).await;
    })
    .await;
}

/// Found by review: a waiter whose first attempt queued it in Redis but whose answer came too
/// late (the response timed out) asked again as a fresh owner, and that attempt queued it again
/// with a new ticket: behind every waiter that had queued meanwhile, against "waiters queue in
/// the order they first asked".
#[tokio::test]
async fn a_waiter_whose_answer_came_late_keeps_its_place() {
    // Our own server: the proxy holds this client's traffic back, and the script calls are
    // counted.
    let redis = TestRedis::own();
    within(LIMIT, async {
        let (proxy, builder) = redis.through_proxy().await;
        let slow = builder.build().unwrap();
        let (holder, other) = (redis.client(), redis.client());
        let held = holder
            .fair_mutex("order")
            .unwrap()
            .with_lease(Duration::from_secs(60))
            .unwrap()
            .lock()
            .await
            .unwrap();
        // Connected, its scripts loaded.
        let warm = slow.fair_mutex("warm").unwrap().lock().await.unwrap();
        warm.unlock().await.unwrap();
        // The first waiter's attempt queues it; its answer is held back.
        proxy.set(Mode::HoldReplies);
        let sent = slow.requests();
        let first = slow.fair_mutex("order").unwrap();
        let first = tokio::spawn(async move { first.lock().await });
        until(|| async { redis.queued(&holder, "order").await == 1 }).await;
        // Its next attempts wait in the proxy.
        proxy.set(Mode::Blackhole);
        let second = other.fair_mutex("order").unwrap();
        let second = tokio::spawn(async move { second.lock().await });
        until(|| async { redis.queued(&holder, "order").await == 2 }).await;
        // The first waiter's answer timed out, and it asked again.
        until(|| async { slow.requests() >= sent + 2 }).await;
        let scripts = redis.calls("evalsha").await;
        proxy.set(Mode::Pass);
        until(|| async { redis.calls("evalsha").await > scripts }).await;
        held.unlock().await.unwrap();
        let (mut first, mut second) = (first, second);
        let got = tokio::select! {
            got = &mut first => got.unwrap().unwrap(),
            _ = &mut second => panic!("the second waiter overtook the first"),
        };
        got.unlock().await.unwrap();
        second.await.unwrap().unwrap().unlock().await.unwrap();
        assert!(redis.leftovers().await.is_empty());
    })
    .await;
}
