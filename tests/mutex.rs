//! The reentrant mutex: exclusion, reentrancy, owner checks, fencing, input errors.

mod support;

use std::time::Duration;

use redlatch::{Error, OwnerToken};
use support::{TestRedis, until, within};

const LIMIT: Duration = Duration::from_secs(60);

#[tokio::test]
async fn lock_excludes_and_unlock_frees() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let a = redis.client();
        let b = redis.client();
        let guard = a.mutex("m").unwrap().lock().await.unwrap();
        assert!(guard.is_held());
        assert!(b.mutex("m").unwrap().try_lock().await.unwrap().is_none());
        // Another owner in the same client is refused too: ownership is per acquisition.
        assert!(a.mutex("m").unwrap().try_lock().await.unwrap().is_none());
        guard.unlock().await.unwrap();
        let again = b
            .mutex("m")
            .unwrap()
            .try_lock()
            .await
            .unwrap()
            .expect("free");
        again.unlock().await.unwrap();
        assert!(redis.leftovers().await.is_empty());
    })
    .await;
}

#[tokio::test]
async fn reenter_counts_holds_and_frees_only_at_zero() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let a = redis.client();
        let other = redis.client();
        let mutex = a.mutex("re").unwrap();
        let outer = mutex.lock().await.unwrap();
        let middle = outer.reenter().await.unwrap();
        let inner = middle.reenter().await.unwrap();
        assert_eq!(outer.fencing_token(), inner.fencing_token());
        let snapshot = a.inspect("re").await.unwrap();
        assert_eq!(snapshot.holders.len(), 1);
        assert_eq!(snapshot.holders[0].exclusive_holds, 3);
        // Released out of order: the lock stays held until the last one.
        outer.unlock().await.unwrap();
        assert!(
            other
                .mutex("re")
                .unwrap()
                .try_lock()
                .await
                .unwrap()
                .is_none()
        );
        inner.unlock().await.unwrap();
        assert!(
            other
                .mutex("re")
                .unwrap()
                .try_lock()
                .await
                .unwrap()
                .is_none()
        );
        middle.unlock().await.unwrap();
        let free = other.mutex("re").unwrap().try_lock().await.unwrap();
        assert!(free.is_some());
    })
    .await;
}

#[tokio::test]
async fn lock_as_reenters_across_processes() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let here = redis.client();
        let there = redis.client();
        let guard = here.mutex("carried").unwrap().lock().await.unwrap();
        // The token travels as a string, as it would in a header.
        let header = guard.owner().to_string();
        let owner: OwnerToken = header.parse().unwrap();
        let remote = there
            .mutex("carried")
            .unwrap()
            .lock_as(&owner)
            .await
            .unwrap();
        assert_eq!(remote.fencing_token(), guard.fencing_token());
        guard.unlock().await.unwrap();
        // Still held through the remote hold.
        assert!(
            there
                .mutex("carried")
                .unwrap()
                .try_lock()
                .await
                .unwrap()
                .is_none()
        );
        remote.unlock().await.unwrap();
        assert!(redis.leftovers().await.is_empty());
        // A token that holds nothing simply acquires as that owner.
        let fresh = OwnerToken::new();
        let g = there
            .mutex("carried")
            .unwrap()
            .try_lock_as(&fresh)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(g.owner(), &fresh);
    })
    .await;
}

#[tokio::test]
async fn non_owner_release_and_extend_are_refused_and_change_nothing() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let a = redis.client();
        let b = redis.client();
        let stale = a.mutex("stolen").unwrap().lock().await.unwrap();
        // The key disappears behind the holder's back and someone else takes the lock.
        let mut conn = redis.conn().await;
        let _: () = redis::cmd("DEL")
            .arg(redis.lock_key("stolen"))
            .query_async(&mut conn)
            .await
            .unwrap();
        let current = b.mutex("stolen").unwrap().lock().await.unwrap();
        let before: String = redis::cmd("GET")
            .arg(redis.lock_key("stolen"))
            .query_async(&mut conn)
            .await
            .unwrap();
        let err = stale.extend(Duration::from_secs(100)).await.unwrap_err();
        assert!(matches!(err, Error::NotHeld { .. }), "{err:?}");
        assert!(!stale.is_held());
        let err = stale.unlock().await.unwrap_err();
        assert!(matches!(err, Error::NotHeld { .. }), "{err:?}");
        let after: String = redis::cmd("GET")
            .arg(redis.lock_key("stolen"))
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(before, after);
        let pttl: i64 = redis::cmd("PTTL")
            .arg(redis.lock_key("stolen"))
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(
            pttl <= 30_000,
            "a refused extend must not lengthen the lease ({pttl})"
        );
        assert!(current.is_held());
        current.unlock().await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn fencing_tokens_rise_across_acquisitions_and_expiry() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let client = redis.client();
        let mutex = client.mutex("fence").unwrap();
        let mut last = 0;
        for _ in 0..20 {
            let g = mutex.lock().await.unwrap();
            assert!(g.fencing_token() > last);
            last = g.fencing_token();
            g.unlock().await.unwrap();
        }
        // A lease that runs out (no unlock) still leaves the next token higher.
        let short = mutex.clone().with_lease(Duration::from_millis(50)).unwrap();
        let g = short.lock().await.unwrap();
        assert!(g.fencing_token() > last);
        last = g.fencing_token();
        g.lost().await;
        let after = mutex.lock().await.unwrap();
        assert!(after.fencing_token() > last);
        last = after.fencing_token();
        after.unlock().await.unwrap();
        // Even if the counter itself is gone, tokens keep rising (server clock floor).
        let mut conn = redis.conn().await;
        let _: () = redis::cmd("DEL")
            .arg(format!("{}:fence", redis.lock_key("fence")))
            .query_async(&mut conn)
            .await
            .unwrap();
        let g = mutex.lock().await.unwrap();
        assert!(g.fencing_token() > last);
        g.unlock().await.unwrap();
        // A client whose estimate of the server clock runs half a second ahead issues a token
        // from it; the counter is lost; the next token, from a client with a true estimate,
        // is still higher (a new counter starts a second ahead of the server clock).
        let ahead = redlatch_harness::measure::server_micros(&mut conn)
            .await
            .unwrap()
            + 500_000;
        let owner = redlatch::OwnerToken::new().to_string();
        let lock = redis.lock_key("fence");
        let granted = redlatch_harness::measure::raw_mutex_acquire(&mut conn, &lock, &owner, ahead)
            .await
            .unwrap();
        let issued: u64 = granted[1].parse().unwrap();
        assert!(issued >= ahead);
        let _: () = redis::cmd("DEL")
            .arg(&lock)
            .arg(format!("{lock}:fence"))
            .query_async(&mut conn)
            .await
            .unwrap();
        let g = mutex.lock().await.unwrap();
        assert!(
            g.fencing_token() > issued,
            "{} <= {issued}",
            g.fencing_token()
        );
        // The counter carries a TTL: nothing stays for ever.
        let ttl: i64 = redis::cmd("PTTL")
            .arg(format!("{}:fence", redis.lock_key("fence")))
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(
            ttl > 0 && ttl <= redlatch::FENCE_TTL.as_millis() as i64,
            "{ttl}"
        );
    })
    .await;
}

#[tokio::test]
async fn a_slow_first_answer_does_not_set_tokens_ahead_of_the_server_clock() {
    use redlatch_harness::measure::server_micros;
    use redlatch_harness::proxy::Mode;
    let redis = TestRedis::new();
    within(LIMIT, async {
        let mut conn = redis.conn().await;
        // A name in use: its counter, which starts a second ahead of the server's clock, is
        // behind it again after the pause.
        let other = redis.client();
        let name = other.mutex("slow").unwrap();
        name.lock().await.unwrap().unlock().await.unwrap();
        tokio::time::sleep(redlatch_harness::measure::WARM_NAMES).await;
        // A new client's first acquisition reads the server's clock; its connection and its
        // request take 150 ms each way.
        let (proxy, builder) = redis.through_proxy().await;
        let client = builder.build().unwrap();
        proxy.set(Mode::Delay {
            base: Duration::from_millis(150),
            jitter: Duration::ZERO,
        });
        let first = client.mutex("first").unwrap().lock().await.unwrap();
        proxy.set(Mode::Pass);
        first.unlock().await.unwrap();
        // Its next fresh token, on the name in use, is no further ahead of the server's clock
        // than a round trip: a reading dated from its request's start while the answer took
        // most of a second would put it that far ahead.
        let guard = client.mutex("slow").unwrap().lock().await.unwrap();
        let now = server_micros(&mut conn).await.unwrap();
        assert!(
            guard.fencing_token() <= now + 100_000,
            "token {} is {} µs ahead of the server's clock",
            guard.fencing_token(),
            guard.fencing_token().saturating_sub(now)
        );
        guard.unlock().await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn lock_timeout_gives_up_with_a_typed_error() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let client = redis.client();
        let held = client.mutex("busy").unwrap().lock().await.unwrap();
        let err = client
            .mutex("busy")
            .unwrap()
            .lock_timeout(Duration::from_millis(100))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Timeout { .. }), "{err:?}");
        assert!(held.is_held());
    })
    .await;
}

#[tokio::test]
async fn a_lease_the_drift_allowance_leaves_nothing_of_is_refused() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        // 50 ms of every lease is not counted on: a 40 ms lease would leave no time to hold,
        // and every grant would come too late to be used (the acquisition retried for ever).
        let client = redis
            .builder()
            .drift(0.0, Duration::from_millis(50))
            .build()
            .unwrap();
        let short = Duration::from_millis(40);
        let refused = |r: redlatch::Result<()>| {
            assert!(
                matches!(r, Err(Error::InvalidArgument { what: "lease", .. })),
                "{r:?}"
            );
        };
        refused(client.mutex("m").unwrap().with_lease(short).map(drop));
        refused(client.fair_mutex("f").unwrap().with_lease(short).map(drop));
        refused(
            client
                .semaphore("s", 2)
                .unwrap()
                .with_lease(short)
                .map(drop),
        );
        refused(client.rwlock("r").unwrap().with_lease(short).map(drop));
        refused(client.election("e").unwrap().with_lease(short).map(drop));
        // A lease with time left after the allowance works, and leaves nothing behind.
        let fair = client
            .fair_mutex("f")
            .unwrap()
            .with_lease(Duration::from_millis(500))
            .unwrap();
        let guard = fair.lock_timeout(Duration::from_secs(5)).await.unwrap();
        guard.unlock().await.unwrap();
        until(|| async { redis.leftovers().await.is_empty() }).await;
    })
    .await;
}

#[tokio::test]
async fn a_durability_timeout_under_a_millisecond_is_refused() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        // `WAIT` counts in whole milliseconds, and `WAIT n 0` waits for ever.
        let short = redlatch::Durability::Replicas {
            count: 1,
            timeout: Duration::from_micros(500),
        };
        assert!(matches!(
            redis.builder().durability(short).build(),
            Err(Error::InvalidArgument {
                what: "durability",
                ..
            })
        ));
        let client = redis.client();
        assert!(matches!(
            client.mutex("m").unwrap().with_durability(short),
            Err(Error::InvalidArgument {
                what: "durability",
                ..
            })
        ));
        let all = redlatch::Durability::AllReplicas {
            timeout: Duration::from_micros(999),
        };
        assert!(matches!(
            client.fair_mutex("f").unwrap().with_durability(all),
            Err(Error::InvalidArgument {
                what: "durability",
                ..
            })
        ));
        let one_ms = redlatch::Durability::Replicas {
            count: 1,
            timeout: Duration::from_millis(1),
        };
        assert!(client.mutex("m").unwrap().with_durability(one_ms).is_ok());
    })
    .await;
}

#[tokio::test]
async fn bad_input_is_a_typed_error() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let client = redis.client();
        for name in ["", "a{b}", "x\ny"] {
            assert!(matches!(
                client.mutex(name),
                Err(Error::InvalidArgument { what: "name", .. })
            ));
        }
        let long = "n".repeat(redlatch::MAX_NAME_LEN + 1);
        assert!(matches!(
            client.mutex(&long),
            Err(Error::InvalidArgument { .. })
        ));
        let m = client.mutex("ok").unwrap();
        for lease in [Duration::ZERO, Duration::from_millis(1)] {
            assert!(matches!(
                m.clone().with_lease(lease),
                Err(Error::InvalidArgument { what: "lease", .. })
            ));
        }
        let g = m.lock().await.unwrap();
        assert!(matches!(
            g.extend(Duration::ZERO).await,
            Err(Error::InvalidArgument { .. })
        ));
        assert!(g.is_held(), "a refused extend loses nothing");
        let bad_builders = [
            redis.builder().key_prefix(""),
            redis.builder().key_prefix("{x}"),
            redis.builder().default_lease(Duration::ZERO),
            redis
                .builder()
                .wait_backoff(Duration::from_secs(2), Duration::from_secs(1)),
        ];
        for b in bad_builders {
            assert!(matches!(b.build(), Err(Error::InvalidArgument { .. })));
        }
        assert!("zz".parse::<OwnerToken>().is_err());
    })
    .await;
}

#[test]
fn building_outside_a_runtime_is_an_error_not_a_panic() {
    let pool = deadpool_redis::Config::from_url("redis://127.0.0.1:1")
        .builder()
        .unwrap()
        .runtime(deadpool_redis::Runtime::Tokio1)
        .build()
        .unwrap();
    let err = redlatch::LockClient::new(pool, "redis://127.0.0.1:1").unwrap_err();
    assert!(matches!(
        err,
        Error::InvalidArgument {
            what: "runtime",
            ..
        }
    ));
}

/// A name the client last saw free is taken in one round trip of plain commands and let go
/// by one script call whose fast path compares and deletes: no script on the way in, five
/// commands in all per cycle (`SET`, `ZADD`; `EVALSHA`, `GET`, `DEL`: no block of tokens for
/// local hand-off while no other task of the client waits), tokens strictly rising, nothing
/// left but the fence key.
#[tokio::test]
async fn an_uncontended_cycle_runs_one_script_and_five_commands() {
    // Our own server: the figures are the server's counts of every command it ran.
    let redis = TestRedis::own();
    within(LIMIT, async {
        let client = redis.client();
        let mut conn = redis.conn().await;
        let mutex = client.mutex("plain").unwrap();
        // The name in use, past the second in which its new fence key runs ahead of the clock.
        mutex.lock().await.unwrap().unlock().await.unwrap();
        tokio::time::sleep(redlatch_harness::measure::WARM_NAMES).await;
        let calls = |stats: &std::collections::HashMap<String, u64>, name: &str| {
            stats.get(name).copied().unwrap_or(0)
        };
        let before = redlatch_harness::measure::commandstats(&mut conn)
            .await
            .unwrap();
        let sent = client.requests();
        let mut tokens = Vec::new();
        for _ in 0..20 {
            let guard = mutex.lock().await.unwrap();
            tokens.push(guard.fencing_token());
            guard.unlock().await.unwrap();
        }
        // Two round trips a cycle, as the client counts them.
        assert_eq!(client.requests() - sent, 40);
        let after = redlatch_harness::measure::commandstats(&mut conn)
            .await
            .unwrap();
        let scripts = calls(&after, "evalsha") - calls(&before, "evalsha");
        let commands = redlatch_harness::measure::server_commands(&before, &after);
        assert_eq!(scripts, 20, "one script call a cycle (the release)");
        assert_eq!(commands, 20 * 5, "commands in all");
        assert_eq!(calls(&after, "set") - calls(&before, "set"), 20);
        assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
        assert!(redis.leftovers().await.is_empty());
    })
    .await;
}

/// The one-round-trip acquire proposes the client's estimate of the server clock as its token;
/// a fence key that stands above it (tokens issued from a clock far ahead) does not confirm it,
/// and the script then issues the hold a token above the key, before the caller sees any.
#[tokio::test]
async fn a_token_the_fence_key_does_not_confirm_is_issued_again() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let client = redis.client();
        let mut conn = redis.conn().await;
        let mutex = client.mutex("ahead").unwrap();
        mutex.lock().await.unwrap().unlock().await.unwrap();
        let lock = redis.lock_key("ahead");
        let fence = format!("{lock}:fence");
        let ahead = redlatch_harness::measure::server_micros(&mut conn)
            .await
            .unwrap()
            + 60_000_000;
        let _: () = redis::cmd("ZADD")
            .arg(&fence)
            .arg("GT")
            .arg(ahead)
            .arg("~")
            .query_async(&mut conn)
            .await
            .unwrap();
        let guard = mutex.lock().await.unwrap();
        let token = guard.fencing_token();
        assert!(token > ahead, "{token} <= {ahead}");
        let stored: String = redis::cmd("GET")
            .arg(&lock)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(
            stored.starts_with(&format!("mutex:2 {token} 1 ")),
            "{stored}"
        );
        let last: u64 = redis::cmd("ZSCORE")
            .arg(&fence)
            .arg("~")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(last >= token, "{last} < {token}");
        guard.unlock().await.unwrap();
        // The next one rises above it again.
        let next = mutex.lock().await.unwrap();
        assert!(next.fencing_token() > last);
        next.unlock().await.unwrap();
        assert!(redis.leftovers().await.is_empty());
    })
    .await;
}

/// A name the client last saw free but that another client took meanwhile: the one-round-trip
/// attempt finds it busy and changes nothing, the script marks the lock, and the waiter gets it
/// when the other lets go, never before.
#[tokio::test]
async fn a_name_taken_meanwhile_elsewhere_is_waited_for() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let a = redis.client();
        let b = redis.client();
        a.mutex("meanwhile")
            .unwrap()
            .lock()
            .await
            .unwrap()
            .unlock()
            .await
            .unwrap();
        let held = b.mutex("meanwhile").unwrap().lock().await.unwrap();
        let released = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let waiter = tokio::spawn({
            let (mutex, released) = (a.mutex("meanwhile").unwrap(), released.clone());
            async move {
                let guard = mutex.lock().await.unwrap();
                assert!(
                    released.load(std::sync::atomic::Ordering::SeqCst),
                    "taken while held"
                );
                guard
            }
        });
        // The waiter's attempt has marked the lock: its holder's release will publish.
        redis.marked("meanwhile").await;
        let token = held.fencing_token();
        released.store(true, std::sync::atomic::Ordering::SeqCst);
        held.unlock().await.unwrap();
        let guard = waiter.await.unwrap();
        assert!(guard.fencing_token() > token);
        guard.unlock().await.unwrap();
        assert!(redis.leftovers().await.is_empty());
    })
    .await;
}

/// A carried owner that holds the lock joins its hold at once, even with other tasks of the
/// client waiting for the lock (they wait for that very hold: behind them, it would wait for
/// ever).
#[tokio::test]
async fn lock_as_an_owner_that_holds_joins_at_once_behind_local_waiters() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let client = redis.client();
        let mutex = client.mutex("joined").unwrap();
        let first = mutex.lock().await.unwrap();
        let stranger = {
            let mutex = mutex.clone();
            tokio::spawn(async move { mutex.lock_as(&OwnerToken::new()).await.unwrap() })
        };
        // The stranger found the lock busy (its mark is on the lock) and waits in this client.
        let key = redis.lock_key("joined");
        until(|| async {
            let mut conn = redis.conn().await;
            let value: Option<String> = redis::cmd("GET")
                .arg(&key)
                .query_async(&mut conn)
                .await
                .unwrap();
            value.is_some_and(|v| v.split(' ').nth(3) == Some("w"))
        })
        .await;
        let second = tokio::time::timeout(Duration::from_secs(10), mutex.lock_as(first.owner()))
            .await
            .expect("the owner's lock_as waited behind the stranger")
            .unwrap();
        assert_eq!(second.fencing_token(), first.fencing_token());
        second.unlock().await.unwrap();
        first.unlock().await.unwrap();
        stranger.await.unwrap().unlock().await.unwrap();
        assert!(redis.leftovers().await.is_empty());
    })
    .await;
}
