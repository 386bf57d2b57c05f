//! Leases and the watchdog, with short leases (hundreds of ms) and generous margins.

mod support;

use std::time::Duration;

use redlatch::Error;
use redlatch_harness::proxy::Mode;
use support::{TestRedis, until, within};

const LEASE: Duration = Duration::from_millis(300);
/// The lease of the tests that need the watchdog to keep a hold: long enough that a loaded 2-core
/// machine's stall of a few hundred ms does not lose it (renewals come every third of it).
const KEPT: Duration = Duration::from_secs(1);
const LIMIT: Duration = Duration::from_secs(60);

#[tokio::test]
async fn watchdog_keeps_a_guard_held_for_five_leases() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let client = redis.builder().default_lease(KEPT).build().unwrap();
        let other = redis.client();
        let guard = client.mutex("long").unwrap().lock().await.unwrap();
        let mut lost = std::pin::pin!(guard.lost());
        // Five leases' worth of time: without renewal the lock would have expired five times.
        let five_leases = tokio::time::sleep(KEPT * 5);
        tokio::select! {
            _ = &mut lost => panic!("lease lost while the watchdog was running"),
            _ = five_leases => {}
        }
        assert!(guard.is_held());
        assert!(
            other
                .mutex("long")
                .unwrap()
                .try_lock()
                .await
                .unwrap()
                .is_none()
        );
        guard.unlock().await.unwrap();
        assert!(
            other
                .mutex("long")
                .unwrap()
                .try_lock()
                .await
                .unwrap()
                .is_some()
        );
    })
    .await;
}

/// Found by review: renewals came every third of the lease while each was counted on for the
/// lease less the drift allowance, so an allowance of two thirds of the lease or more let the
/// deadline pass before the next renewal was due: a live, renewed hold was marked lost.
#[tokio::test]
async fn a_large_drift_allowance_does_not_lose_a_renewed_hold() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        // Each renewal is counted on for 6 s - 60 ms - 4.4 s = 1.54 s; a third of the lease is
        // 2 s. (Renewals every 513 ms leave a stall of about a second to spare.)
        let client = redis
            .builder()
            .default_lease(Duration::from_secs(6))
            .drift(0.01, Duration::from_millis(4400))
            .build()
            .unwrap();
        let guard = client.mutex("drift").unwrap().lock().await.unwrap();
        let mut lost = std::pin::pin!(guard.lost());
        tokio::select! {
            () = &mut lost => panic!("a renewed hold was lost"),
            () = tokio::time::sleep(Duration::from_secs(4)) => {}
        }
        assert!(guard.is_held());
        guard.unlock().await.unwrap();
        assert!(redis.leftovers().await.is_empty());
    })
    .await;
}

#[tokio::test]
async fn lost_completes_when_the_key_is_deleted_and_never_comes_back() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let client = redis.builder().default_lease(KEPT).build().unwrap();
        let guard = client.mutex("deleted").unwrap().lock().await.unwrap();
        let mut conn = redis.conn().await;
        let _: () = redis::cmd("DEL")
            .arg(redis.lock_key("deleted"))
            .query_async(&mut conn)
            .await
            .unwrap();
        guard.lost().await;
        assert!(!guard.is_held());
        // The lock is free again and another owner takes it (its lease one the watchdog keeps on a
        // loaded machine); the lost guard stays lost.
        let next = client.mutex("deleted").unwrap().lock().await.unwrap();
        tokio::time::sleep(KEPT * 2).await;
        assert!(!guard.is_held());
        assert!(matches!(
            guard.extend(Duration::from_secs(1)).await,
            Err(Error::NotHeld { .. })
        ));
        assert!(matches!(guard.reenter().await, Err(Error::NotHeld { .. })));
        assert!(next.is_held());
    })
    .await;
}

#[tokio::test]
async fn lost_completes_when_the_server_is_killed() {
    let mut redis = TestRedis::own();
    within(LIMIT, async {
        let client = redis.builder().default_lease(LEASE).build().unwrap();
        let guard = client.mutex("killed").unwrap().lock().await.unwrap();
        redis.server().kill();
        guard.lost().await;
        assert!(!guard.is_held());
    })
    .await;
}

#[tokio::test]
async fn lost_completes_when_the_server_is_paused_past_the_lease() {
    let mut redis = TestRedis::own();
    within(LIMIT, async {
        let client = redis.builder().default_lease(LEASE).build().unwrap();
        let guard = client.mutex("paused").unwrap().lock().await.unwrap();
        redis.server().pause();
        guard.lost().await;
        assert!(!guard.is_held());
        redis.server().resume();
        // Once the server answers again the guard still does not come back.
        let fresh = client.mutex("paused").unwrap().lock().await.unwrap();
        assert!(fresh.is_held());
        assert!(!guard.is_held());
    })
    .await;
}

#[tokio::test]
async fn a_fixed_lease_is_not_renewed() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let client = redis.client();
        let mutex = client.mutex("fixed").unwrap().with_lease(LEASE).unwrap();
        let guard = mutex.lock().await.unwrap();
        guard.lost().await;
        assert!(!guard.is_held());
        // The key goes from Redis too (the local deadline is counted from before the request,
        // so it may fire a round trip before the server's).
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while !redis.leftovers().await.is_empty() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the lease did not run out"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // extend() lengthens a fixed lease on request.
        let guard = mutex.lock().await.unwrap();
        guard.extend(Duration::from_secs(30)).await.unwrap();
        tokio::time::sleep(LEASE * 3).await;
        assert!(guard.is_held());
        assert!(
            client
                .mutex("fixed")
                .unwrap()
                .try_lock()
                .await
                .unwrap()
                .is_none()
        );
        guard.unlock().await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn watchdog_off_makes_the_default_lease_fixed() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let client = redis
            .builder()
            .default_lease(LEASE)
            .watchdog(false)
            .build()
            .unwrap();
        let guard = client.mutex("nowatch").unwrap().lock().await.unwrap();
        guard.lost().await;
        // Freed by expiry: a renewed lease would hold it past this 5 s wait.
        let next = client
            .mutex("nowatch")
            .unwrap()
            .lock_timeout(Duration::from_secs(5))
            .await
            .unwrap();
        assert!(next.is_held());
    })
    .await;
}

#[tokio::test]
async fn a_crashed_holder_frees_the_lock_after_its_lease() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let waiter = redis.client();
        // The holder "crashes": its client and runtime go away without releasing.
        std::thread::scope(|scope| {
            scope.spawn(|| {
                let rt = tokio::runtime::Runtime::new().unwrap();
                rt.block_on(async {
                    let client = redis.builder().default_lease(LEASE).build().unwrap();
                    let guard = client.mutex("crash").unwrap().lock().await.unwrap();
                    // Never dropped: no release is queued, as in a crash.
                    let _ = Box::leak(Box::new(guard));
                });
                // Dropping the runtime kills the watchdog without any release.
            });
        });
        let guard = waiter
            .mutex("crash")
            .unwrap()
            .lock_timeout(Duration::from_secs(20))
            .await
            .unwrap();
        assert!(guard.is_held());
    })
    .await;
}

#[tokio::test]
async fn dropped_guards_are_released_in_the_background() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let client = redis.client();
        let other = redis.client();
        let guard = client.mutex("dropped").unwrap().lock().await.unwrap();
        drop(guard);
        // Waiting with a lease-long deadline proves the release, not expiry, freed it.
        let next = other
            .mutex("dropped")
            .unwrap()
            .lock_timeout(Duration::from_secs(20))
            .await
            .unwrap();
        next.unlock().await.unwrap();
        assert!(redis.leftovers().await.is_empty());
    })
    .await;
}

/// Found by review: a hold marked lost at its deadline, because its renewals' answers never
/// came, may still be held in Redis (the renewals reached it). Its guard's drop sent no
/// release, so the name stayed taken for up to a lease after the guard was gone (an election's
/// leader dropped, a layer's request cancelled for a lost lease).
#[tokio::test]
async fn a_guard_lost_at_its_deadline_is_still_released_when_dropped() {
    // Our own server: the proxy holds this client's replies back.
    let redis = TestRedis::own();
    within(LIMIT, async {
        let lease = Duration::from_secs(6);
        let (proxy, builder) = redis.through_proxy().await;
        let cut = builder.default_lease(lease).build().unwrap();
        let other = redis.client();
        let plain = cut.mutex("lapsed").unwrap().lock().await.unwrap();
        let fair = cut.fair_mutex("lapsed-fair").unwrap().lock().await.unwrap();
        // Renewals (from a third of the lease) reach Redis; their answers never come back.
        proxy.set(Mode::HoldReplies);
        tokio::join!(plain.lost(), fair.lost());
        let mut conn = redis.conn().await;
        let mut left = Vec::new();
        for name in ["lapsed", "lapsed-fair"] {
            let pttl: i64 = redis::cmd("PTTL")
                .arg(redis.lock_key(name))
                .query_async(&mut conn)
                .await
                .unwrap();
            // What makes the case: the renewals that reached Redis hold the name on. (Both
            // holds are one string whose TTL is the lease: the fair mutex's uncontended form.)
            assert!(pttl > 1500, "{name}: {pttl} ms left in Redis when lost");
            left.push(Duration::from_millis(u64::try_from(pttl).unwrap()));
        }
        proxy.set(Mode::Pass);
        drop(plain);
        drop(fair);
        // Freed by the release well before the lease left in Redis would run out.
        let next = other
            .mutex("lapsed")
            .unwrap()
            .lock_timeout(left[0] - Duration::from_millis(1000))
            .await
            .unwrap();
        let next_fair = other
            .fair_mutex("lapsed-fair")
            .unwrap()
            .lock_timeout(left[1] - Duration::from_millis(1000))
            .await
            .unwrap();
        next.unlock().await.unwrap();
        next_fair.unlock().await.unwrap();
        assert!(redis.leftovers().await.is_empty());
    })
    .await;
}

/// Found by review: a background release that could not be sent (no connection) was tried
/// three times in 140 ms and then given up, so a blip of the network or the server longer than
/// that left every guard dropped meanwhile holding its name for the rest of its lease. It is
/// now tried again, with backoff, until the hold's lease would have run out anyway.
#[tokio::test]
async fn a_release_dropped_during_an_outage_goes_out_once_the_server_is_back() {
    // Our own server: the proxy cuts this client off from it.
    let redis = TestRedis::own();
    within(LIMIT, async {
        let (proxy, builder) = redis.through_proxy().await;
        let cut = builder
            .default_lease(Duration::from_secs(20))
            .build()
            .unwrap();
        let other = redis.client();
        let guard = cut.mutex("outage").unwrap().lock().await.unwrap();
        // The client's connection is lost with a reply, and no new one gets through.
        proxy.lose_next_reply_then(Mode::Refuse);
        assert!(guard.extend(Duration::from_secs(20)).await.is_err());
        drop(guard);
        // The outage (time is the point): a second, far longer than the old retries.
        tokio::time::sleep(Duration::from_secs(1)).await;
        proxy.set(Mode::Pass);
        // Freed by the release, long before the 20 s lease would run out.
        let next = other
            .mutex("outage")
            .unwrap()
            .lock_timeout(Duration::from_secs(10))
            .await
            .expect("the name is still taken: the release was given up");
        next.unlock().await.unwrap();
        assert!(redis.leftovers().await.is_empty());
    })
    .await;
}

/// Found by review: a carried owner's hold lost at its deadline was released when dropped, and
/// a release finds its hold by the owner: if that owner had taken the name again meanwhile
/// (another `lock_as`), the drop freed the new hold, whose guard still said held. Only a hold
/// whose owner token is its own is released once lost at its deadline.
#[tokio::test]
async fn a_lapsed_carried_hold_leaves_the_owners_newer_hold_alone() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let client = redis.client();
        let other = redis.client();
        let owner = redlatch::OwnerToken::new();
        let short = client
            .mutex("carried-lapse")
            .unwrap()
            .with_lease(LEASE)
            .unwrap();
        let first = short.lock_as(&owner).await.unwrap();
        // Its fixed lease runs out: lost at its deadline, and gone in Redis.
        first.lost().await;
        let key = redis.lock_key("carried-lapse");
        let conn = redis.conn().await;
        support::until(|| {
            let mut conn = conn.clone();
            let key = key.clone();
            async move {
                let n: i64 = redis::cmd("EXISTS")
                    .arg(&key)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                n == 0
            }
        })
        .await;
        let second = client
            .mutex("carried-lapse")
            .unwrap()
            .lock_as(&owner)
            .await
            .unwrap();
        // A release of the first, were one sent, would go out with this one's, just before it.
        let marker = client.mutex("marker").unwrap().lock().await.unwrap();
        drop(first);
        drop(marker);
        support::until(|| async {
            let free = other.mutex("marker").unwrap().try_lock().await.unwrap();
            free.is_some()
        })
        .await;
        assert!(second.is_held());
        let taken = other
            .mutex("carried-lapse")
            .unwrap()
            .try_lock()
            .await
            .unwrap();
        assert!(
            taken.is_none(),
            "the owner's newer hold was freed by the old one's drop"
        );
        second.unlock().await.unwrap();
        assert!(redis.leftovers().await.is_empty());
    })
    .await;
}

#[tokio::test]
async fn a_guard_whose_hold_is_gone_cannot_reenter() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let client = redis.client();
        let mut conn = redis.conn().await;
        // Deletes the name's keys behind the guards' backs, before any renewal notices: only
        // Redis can tell that the hold is gone.
        let mut wipe = async || {
            let keys = redis.leftovers().await;
            let _: () = redis::cmd("DEL")
                .arg(keys)
                .query_async(&mut conn)
                .await
                .unwrap();
        };
        let guard = client.mutex("gone").unwrap().lock().await.unwrap();
        wipe().await;
        assert!(matches!(guard.reenter().await, Err(Error::NotHeld { .. })));
        assert!(!guard.is_held());

        let guard = client
            .fair_mutex("gone-fair")
            .unwrap()
            .lock()
            .await
            .unwrap();
        wipe().await;
        assert!(matches!(guard.reenter().await, Err(Error::NotHeld { .. })));

        let reader = client.rwlock("gone-read").unwrap().read().await.unwrap();
        let writer = client.rwlock("gone-write").unwrap().write().await.unwrap();
        wipe().await;
        assert!(matches!(reader.reenter().await, Err(Error::NotHeld { .. })));
        assert!(matches!(writer.read().await, Err(Error::NotHeld { .. })));
        // None of those took the free lock as a new holding.
        assert!(
            redis.leftovers().await.is_empty(),
            "{:?}",
            redis.leftovers().await
        );
    })
    .await;
}

/// Holds two locks, the second taken half a second after the first, each with a 6 s lease,
/// and checks at 2.6 s after each acquisition that its lease was renewed (a renewal is due at a
/// third of the lease, 2 s; the margin is for a loaded machine): the due time counts from the acquisition, not from whenever the
/// watchdog next looks at its new holds (here, when the first lock's renewal wakes it). With
/// `busy`, other tasks keep the runtime's threads busy meanwhile.
async fn first_renewals_come_a_third_of_the_lease_after_acquisition(busy: bool) {
    const LEASE: Duration = Duration::from_secs(6);
    const CHECK_AT: Duration = Duration::from_millis(2600);
    let redis = TestRedis::new();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let spinners: Vec<_> = (0..if busy { 4 } else { 0 })
        .map(|_| {
            let stop = std::sync::Arc::clone(&stop);
            tokio::spawn(async move {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    // A millisecond of work between yields, as a busy service's tasks do.
                    let until = std::time::Instant::now() + Duration::from_millis(1);
                    while std::time::Instant::now() < until {
                        std::hint::spin_loop();
                    }
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    within(LIMIT, async {
        let client = redis.builder().default_lease(LEASE).build().unwrap();
        let lease_left = async |name: &str| {
            client.inspect(name).await.unwrap().holders[0]
                .lease_left
                .unwrap()
        };
        let first = client.mutex("first").unwrap().lock().await.unwrap();
        let first_at = tokio::time::Instant::now();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let second = client.mutex("second").unwrap().lock().await.unwrap();
        let fair = client.fair_mutex("fair").unwrap().lock().await.unwrap();
        let second_at = tokio::time::Instant::now();
        tokio::time::sleep_until(first_at + CHECK_AT).await;
        // Unrenewed, 3.4 s would be left at most; renewed at 2 s, about 5.4 s.
        let left = lease_left("first").await;
        assert!(left > Duration::from_secs(4), "first: {left:?} left");
        tokio::time::sleep_until(second_at + CHECK_AT).await;
        for name in ["second", "fair"] {
            let left = lease_left(name).await;
            assert!(left > Duration::from_secs(4), "{name}: {left:?} left");
        }
        first.unlock().await.unwrap();
        second.unlock().await.unwrap();
        fair.unlock().await.unwrap();
    })
    .await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for s in spinners {
        s.await.unwrap();
    }
}

#[tokio::test]
async fn the_first_renewal_counts_from_the_acquisition() {
    first_renewals_come_a_third_of_the_lease_after_acquisition(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_renewal_comes_on_time_on_a_busy_runtime() {
    first_renewals_come_a_third_of_the_lease_after_acquisition(true).await;
}

/// Found by the fault matrix's row `queue-kill/fair`: a release held up by a `CLIENT PAUSE`
/// past redis-rs's 500 ms answer timeout was lost (the connection was dropped with it, or the
/// server, which had not run the release script yet, answered `NOSCRIPT` once the pause ended,
/// when nobody was left to send the source), and the lock stayed for its whole lease.
#[tokio::test]
async fn a_release_held_up_by_a_pause_still_happens() {
    // Our own server: CLIENT PAUSE would hold up other users of a shared one.
    let redis = TestRedis::own();
    within(LIMIT, async {
        let client = redis.client();
        let mut conn = redis.conn().await;
        for fair in [false, true] {
            let name = if fair { "pause-fair" } else { "pause" };
            let guard = if fair {
                client.fair_mutex(name).unwrap().lock().await.unwrap()
            } else {
                client.mutex(name).unwrap().lock().await.unwrap()
            };
            let _: () = redis::cmd("CLIENT")
                .arg("PAUSE")
                .arg(1000)
                .arg("WRITE")
                .query_async(&mut conn)
                .await
                .unwrap();
            // The release waits for the pause and times out; it still runs after it.
            assert!(guard.unlock().await.is_err());
            let other = redis.client();
            let next = other
                .mutex(name)
                .ok()
                .filter(|_| !fair)
                .map(|m| async move { m.lock_timeout(Duration::from_secs(5)).await });
            match next {
                Some(next) => drop(next.await.unwrap()),
                None => drop(
                    other
                        .fair_mutex(name)
                        .unwrap()
                        .lock_timeout(Duration::from_secs(5))
                        .await
                        .unwrap(),
                ),
            }
        }
    })
    .await;
}

/// A guard whose owner token was read out (it may be in use elsewhere) and whose hold was lost:
/// its unlock must not release the hold another process has since taken as that owner (a drop
/// already did not).
#[tokio::test]
async fn unlocking_a_lost_guard_whose_owner_was_read_leaves_that_owners_new_hold_alone() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let (a, b) = (redis.client(), redis.client());
        let guard = a
            .mutex("carried")
            .unwrap()
            .with_lease(Duration::from_millis(300))
            .unwrap()
            .lock()
            .await
            .unwrap();
        let owner = *guard.owner();
        assert_eq!(a.force_unlock("carried").await.unwrap().holders, 1);
        guard.lost().await;
        let taken = b.mutex("carried").unwrap().lock_as(&owner).await.unwrap();
        assert!(
            matches!(guard.unlock().await, Err(Error::NotHeld { .. })),
            "the lost guard's unlock"
        );
        assert!(taken.is_held());
        assert!(
            a.mutex("carried")
                .unwrap()
                .try_lock()
                .await
                .unwrap()
                .is_none(),
            "the owner's new hold was released"
        );
        taken.unlock().await.unwrap();
        assert!(redis.leftovers().await.is_empty());
    })
    .await;
}

/// The watchdog renews the holds of many names in one call. Data redlatch did not write, put
/// under one name's holders key while that name is in use, loses that name's permit (its
/// renewal is refused) and no other: the other names' permits in the same call are renewed.
#[tokio::test]
async fn foreign_data_under_one_names_key_costs_the_other_holds_in_its_renewal_nothing() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        // Renewed by the watchdog every third of it.
        let lease = KEPT;
        let client = redis.builder().default_lease(lease).build().unwrap();
        let other = redis.client();
        let mut mine = Vec::new();
        for i in 0..4 {
            let semaphore = client.semaphore(&format!("kept-{i}"), 2).unwrap();
            mine.push(semaphore.acquire().await.unwrap());
        }
        // Two owners: the semaphore's state with its holders key.
        let victim = client
            .semaphore("spoiled", 2)
            .unwrap()
            .acquire()
            .await
            .unwrap();
        let beside = other
            .semaphore("spoiled", 2)
            .unwrap()
            .acquire()
            .await
            .unwrap();
        let started = tokio::time::Instant::now();
        let holders = format!("{}:holders", redis.lock_key("spoiled"));
        let mut conn = redis.conn().await;
        let _: () = redis::cmd("DEL")
            .arg(&holders)
            .query_async(&mut conn)
            .await
            .unwrap();
        let _: () = redis::cmd("SET")
            .arg(&holders)
            .arg("not ours")
            .query_async(&mut conn)
            .await
            .unwrap();
        victim.lost().await;
        // Past the lease the others were taken with: only renewals kept them.
        tokio::time::sleep_until(started + lease * 2).await;
        for (i, permit) in mine.iter().enumerate() {
            assert!(permit.is_held(), "kept-{i} was not renewed");
        }
        let value: String = redis::cmd("GET")
            .arg(&holders)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(value, "not ours");
        for permit in mine {
            permit.release().await.unwrap();
        }
        drop((victim, beside));
        let _: () = redis::cmd("DEL")
            .arg(&holders)
            .query_async(&mut conn)
            .await
            .unwrap();
    })
    .await;
}

/// An extension whose answer comes after the hold's deadline passed (the hold was lost then,
/// and `lost()` fired) says the hold is lost, as the guard does, rather than `Ok`.
#[tokio::test]
async fn an_extension_answered_after_the_hold_was_lost_says_so() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let (proxy, builder) = redis.through_proxy().await;
        // Lost well before the extension's request times out (redis-rs's 500 ms).
        let client = builder
            .default_lease(Duration::from_millis(250))
            .build()
            .unwrap();
        let guard = client.mutex("late").unwrap().lock().await.unwrap();
        let lost = guard.lost();
        // Every answer from now on is held back: the renewals' and the extension's.
        proxy.set(Mode::HoldReplies);
        let extension = tokio::spawn(async move {
            let extended = guard.extend(Duration::from_secs(10)).await;
            (guard, extended)
        });
        lost.await;
        proxy.set(Mode::Pass);
        let (guard, extended) = extension.await.unwrap();
        assert!(
            matches!(extended, Err(Error::NotHeld { .. })),
            "{extended:?}"
        );
        assert!(!guard.is_held());
        drop(guard);
        until(|| async { redis.leftovers().await.is_empty() }).await;
    })
    .await;
}

/// Redis keeps a lease in whole milliseconds: a lease with a fraction of one is cut to them, and
/// the guard's own estimate of its end must not run past Redis's by the fraction (with no drift
/// allowance, nothing else hides it).
#[tokio::test]
async fn a_lease_with_a_fraction_of_a_millisecond_ends_no_later_than_redis_says() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let lease = Duration::from_micros(10_990);
        let client = redis
            .builder()
            .drift(0.0, Duration::ZERO)
            .default_lease(lease)
            .build()
            .unwrap();
        // Connected first: the acquisitions below take one round trip.
        drop(client.mutex("warm").unwrap().lock().await.unwrap());
        let guard = client.mutex("fraction").unwrap().lock().await.unwrap();
        let answered = std::time::Instant::now();
        assert!(
            guard.valid_until() <= answered + Duration::from_millis(10),
            "the default lease's fraction counted"
        );
        drop(guard);
        let fixed = client
            .mutex("fixed")
            .unwrap()
            .with_lease(lease)
            .unwrap()
            .lock()
            .await
            .unwrap();
        let answered = std::time::Instant::now();
        assert!(
            fixed.valid_until() <= answered + Duration::from_millis(10),
            "the handle's lease's fraction counted"
        );
    })
    .await;
}
