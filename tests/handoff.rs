//! Local hand-off: a plain mutex's hold passes between the tasks of one client without a round
//! trip, up to its bound; tokens keep rising, other clients get their turn, a lost hold or a
//! waiter that gives up stalls nobody, and nothing is left in Redis.

mod support;

use std::sync::Arc;
use std::sync::Mutex as StdMutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use redlatch::{LocalHandoff, MutexGuard};
use redlatch_harness::proxy::Mode;
use support::{TestRedis, racy_increment, until, until_within, within};

const LIMIT: Duration = Duration::from_secs(60);

/// `tasks` tasks of `client` taking `name` `rounds` times each: inside, a racy increment of
/// `counter` and the guard's token recorded; every other round the guard is dropped instead of
/// unlocked. The tokens in the order the holds were taken.
async fn take_turns(
    redis: &TestRedis,
    client: &redlatch::LockClient,
    name: &str,
    tasks: usize,
    rounds: usize,
    counter: &str,
) -> Vec<u64> {
    let tokens = Arc::new(StdMutex::new(Vec::new()));
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let mutex = client.mutex(name).unwrap();
        let tokens = Arc::clone(&tokens);
        let mut conn = redis.conn().await;
        let counter = counter.to_owned();
        handles.push(tokio::spawn(async move {
            for round in 0..rounds {
                let guard = mutex.lock().await.unwrap();
                tokens.lock().unwrap().push(guard.fencing_token());
                racy_increment(&mut conn, &counter).await;
                if round % 2 == 0 {
                    guard.unlock().await.unwrap();
                } else {
                    drop(guard);
                }
            }
        }));
    }
    for handle in handles {
        handle.await.unwrap();
    }
    tokens.lock().unwrap().clone()
}

/// A task of this client waiting for `mutex`: on the tests' single-threaded runtime it runs up
/// to its wait before this returns.
async fn queued(mutex: &redlatch::Mutex) -> tokio::task::JoinHandle<MutexGuard> {
    let mutex = mutex.clone();
    let waiter = tokio::spawn(async move { mutex.lock().await.unwrap() });
    tokio::task::yield_now().await;
    waiter
}

/// A hold of `mutex` that reserved tokens for passes: one taken alone reserves none and goes
/// back to Redis when a waiter comes, and that waiter's hold, taken while it was wanted, does.
async fn hold_with_passes(mutex: &redlatch::Mutex) -> MutexGuard {
    let alone = mutex.lock().await.unwrap();
    let waiter = queued(mutex).await;
    alone.unlock().await.unwrap();
    waiter.await.unwrap()
}

/// A client whose holds may be passed for 10 s after their acquisition rather than 5 ms: the
/// tests that check that a hold was passed must not depend on how fast a loaded machine runs
/// what comes between.
fn patient(redis: &TestRedis) -> redlatch::LockClient {
    redis
        .builder()
        .local_handoff(LocalHandoff::new(64, Duration::from_secs(10)))
        .build()
        .unwrap()
}

async fn counted(redis: &TestRedis, key: &str) -> u64 {
    let mut conn = redis.conn().await;
    redis::cmd("GET")
        .arg(key)
        .query_async::<Option<u64>>(&mut conn)
        .await
        .unwrap()
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_waiters_take_turns_without_a_round_trip() {
    let redis = TestRedis::own();
    within(LIMIT, async {
        let client = patient(&redis);
        let counter = format!("{}:counter", redis.prefix);
        let before = redis.calls("evalsha").await;
        let tokens = take_turns(&redis, &client, "turns", 8, 100, &counter).await;
        let scripts = redis.settle().await - before;
        // Exclusion: every increment counted.
        assert_eq!(counted(&redis, &counter).await, 800);
        // Tokens rise with every acquisition, passed or not.
        assert_eq!(tokens.len(), 800);
        assert!(
            tokens.windows(2).all(|w| w[0] < w[1]),
            "tokens not strictly rising"
        );
        // Without hand-off every acquisition is released in Redis by a script call at least
        // (and taken there by one, or by plain commands).
        assert!(
            scripts < 400,
            "{scripts} script calls for 800 acquisitions: holds were not passed"
        );
        let passed = tokens.windows(2).filter(|w| w[1] == w[0] + 1).count();
        assert!(passed > 400, "only {passed} of 800 holds were passed");
        assert_eq!(redis.leftovers().await, vec![counter.clone()]);
    })
    .await;
}

#[tokio::test]
async fn a_pass_keeps_the_owner_in_redis_and_a_read_owner_is_not_passed() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let client = patient(&redis);
        let mutex = client.mutex("owner").unwrap();
        // A hold taken while nobody else of the client waits reserves no tokens for passes:
        // it goes back to Redis, and the next hold reserves them.
        let alone = mutex.lock().await.unwrap();
        let waiter = queued(&mutex).await;
        let holder = |s: redlatch::Snapshot| s.holders[0].id.clone();
        let before = holder(client.inspect("owner").await.unwrap());
        alone.unlock().await.unwrap();
        let first = waiter.await.unwrap();
        let after = holder(client.inspect("owner").await.unwrap());
        assert_ne!(
            before, after,
            "passed without tokens: the owner in Redis stayed"
        );
        let waiter = queued(&mutex).await;
        let fence = first.fencing_token();
        first.unlock().await.unwrap();
        let second = waiter.await.unwrap();
        assert_eq!(second.fencing_token(), fence + 1, "the hold was not passed");
        // inspect names the owner the passed guard reports.
        let snapshot = client.inspect("owner").await.unwrap();
        assert_eq!(snapshot.holders.len(), 1);
        assert_eq!(snapshot.holders[0].id, second.owner().short_id());
        // Its owner was read: the next waiter takes the lock in Redis, as a new owner.
        let read = *second.owner();
        let waiter = queued(&mutex).await;
        let fence = second.fencing_token();
        second.unlock().await.unwrap();
        let third = waiter.await.unwrap();
        assert_ne!(*third.owner(), read);
        assert!(third.fencing_token() > fence + 1);
        third.unlock().await.unwrap();
        assert!(redis.leftovers().await.is_empty());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bound_sends_the_lock_back_to_redis() {
    let redis = TestRedis::own();
    within(LIMIT, async {
        let client = redis
            .builder()
            .local_handoff(LocalHandoff::new(3, Duration::from_secs(10)))
            .build()
            .unwrap();
        let counter = format!("{}:counter", redis.prefix);
        let before = redis.calls("del").await;
        let tokens = take_turns(&redis, &client, "bound", 4, 50, &counter).await;
        redis.settle().await;
        // Each hold taken in Redis is released there by one `DEL` of the lock.
        let in_redis = redis.calls("del").await - before;
        assert_eq!(counted(&redis, &counter).await, 200);
        assert!(tokens.windows(2).all(|w| w[0] < w[1]));
        // At most 3 passes per acquisition in Redis: at least 50 of them.
        assert!(
            in_redis >= 50,
            "{in_redis} holds in Redis: more than 3 passes per acquisition"
        );
        assert!(
            in_redis < 200,
            "{in_redis} holds in Redis: nothing was passed"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_in_another_client_gets_its_turn() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let busy = redis.client();
        let other = redis.client();
        let counter = format!("{}:counter", redis.prefix);
        let stop = Arc::new(AtomicBool::new(false));
        let mut loops = Vec::new();
        for _ in 0..4 {
            let mutex = busy.mutex("shared").unwrap();
            let stop = Arc::clone(&stop);
            let mut conn = redis.conn().await;
            let counter = counter.clone();
            loops.push(tokio::spawn(async move {
                let mut rounds = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let guard = mutex.lock().await.unwrap();
                    racy_increment(&mut conn, &counter).await;
                    guard.unlock().await.unwrap();
                    rounds += 1;
                }
                rounds
            }));
        }
        // The busy client keeps the lock passing between its tasks; the other client's waiter
        // gets it at the bound all the same, several times over.
        let mutex = other.mutex("shared").unwrap();
        let mut conn = redis.conn().await;
        for _ in 0..5 {
            let guard = mutex
                .lock_timeout(Duration::from_secs(10))
                .await
                .expect("the other client's waiter got the lock");
            racy_increment(&mut conn, &counter).await;
            guard.unlock().await.unwrap();
        }
        stop.store(true, Ordering::Relaxed);
        let mut rounds = 0;
        for handle in loops {
            rounds += handle.await.unwrap();
        }
        assert_eq!(counted(&redis, &counter).await, rounds + 5);
        redis.settle().await;
        assert!(redis.leftovers().await.iter().all(|k| k == &counter));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_that_give_up_stall_nobody() {
    // Enough rounds that a turn sent to a waiter just as it gives up happens in most runs.
    const ROUNDS: u64 = 400;
    let redis = TestRedis::new();
    within(LIMIT, async {
        let client = redis.client();
        let counter = format!("{}:counter", redis.prefix);
        let mut handles = Vec::new();
        for task in 0..8 {
            let mutex = client.mutex("impatient").unwrap();
            let mut conn = redis.conn().await;
            let counter = counter.clone();
            handles.push(tokio::spawn(async move {
                let mut done = 0u64;
                for _ in 0..ROUNDS {
                    // Half the tasks give up at once, often while queued behind the others.
                    let got: Option<MutexGuard> = if task % 2 == 0 {
                        mutex.lock_timeout(Duration::from_micros(200)).await.ok()
                    } else {
                        Some(mutex.lock().await.unwrap())
                    };
                    if let Some(guard) = got {
                        racy_increment(&mut conn, &counter).await;
                        guard.unlock().await.unwrap();
                        done += 1;
                    }
                }
                done
            }));
        }
        let mut done = 0;
        for handle in handles {
            done += handle.await.unwrap();
        }
        assert!(done >= 4 * ROUNDS, "the patient tasks all got their turns");
        assert_eq!(counted(&redis, &counter).await, done);
        assert_eq!(redis.leftovers().await, vec![counter.clone()]);
    })
    .await;
}

#[tokio::test]
async fn an_unlock_dropped_while_its_successor_gives_up_leaves_the_name_free() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let client = redis
            .builder()
            .default_lease(Duration::from_millis(600))
            .build()
            .unwrap();
        let mutex = client.mutex("cancelled").unwrap();
        // Taken alone, the hold reserved no tokens to pass: letting it go releases it in Redis,
        // and the waiter is chosen to take the lock there next.
        let holder = mutex.lock().await.unwrap();
        let waiter = queued(&mutex).await;
        let mut unlock = Box::pin(holder.unlock());
        tokio::select! {
            biased;
            _ = &mut unlock => panic!("the release answered before the runtime ran again"),
            () = std::future::ready(()) => {}
        }
        // The chosen waiter gives up, then the unlock is dropped while its release is out.
        waiter.abort();
        assert!(waiter.await.unwrap_err().is_cancelled());
        drop(unlock);
        // The name is not stuck in this client: a new call takes it (at once if the release
        // reached Redis, else once its 600 ms lease runs out).
        let next = mutex.lock_timeout(Duration::from_secs(10)).await.unwrap();
        assert!(next.is_held());
        next.unlock().await.unwrap();
        assert!(redis.leftovers().await.is_empty());
    })
    .await;
}

/// A hold re-entered (two holds of one owner) is let go by its first guard while a task of
/// the client waits: that task releases the one hold in Redis before it takes the lock. If it
/// is cancelled while the release is out, the release still happens once: the second guard
/// keeps its hold, and nobody else gets the name.
#[tokio::test]
async fn a_leader_cancelled_during_its_release_releases_one_hold_once() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let (proxy, builder) = redis.through_proxy().await;
        let client = builder.build().unwrap();
        let mutex = client.mutex("twice").unwrap();
        let first = mutex.lock().await.unwrap();
        let second = first.reenter().await.unwrap();
        let key = redis.lock_key("twice");
        let holds = || async {
            let mut conn = redis.conn().await;
            let value: Option<String> = redis::cmd("GET")
                .arg(&key)
                .query_async(&mut conn)
                .await
                .unwrap();
            value.and_then(|v| v.split(' ').nth(2)?.parse::<u32>().ok())
        };
        assert_eq!(holds().await, Some(2));
        let waiter = queued(&mutex).await;
        // The release reaches Redis; its answer does not come back.
        proxy.set(Mode::HoldReplies);
        drop(first);
        until(|| async { holds().await == Some(1) }).await;
        waiter.abort();
        assert!(waiter.await.unwrap_err().is_cancelled());
        // A second release would take the count to 0 (and free the name) at once.
        let released_twice = until_within(Duration::from_secs(1), || async {
            holds().await != Some(1)
        });
        assert!(!released_twice.await, "the hold was released a second time");
        proxy.set(Mode::Pass);
        assert!(second.is_held());
        let other = redis.client();
        assert!(
            other
                .mutex("twice")
                .unwrap()
                .try_lock()
                .await
                .unwrap()
                .is_none()
        );
        second.unlock().await.unwrap();
        until(|| async { redis.leftovers().await.is_empty() }).await;
    })
    .await;
}

#[tokio::test]
async fn a_view_of_a_passed_hold_says_not_held() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let client = patient(&redis);
        let mutex = client.mutex("viewed").unwrap();
        let first = hold_with_passes(&mutex).await;
        let waiter = queued(&mutex).await;
        let view = first.view();
        let lost = first.lost();
        assert!(view.is_held());
        let fence = first.fencing_token();
        first.unlock().await.unwrap();
        let second = waiter.await.unwrap();
        assert_eq!(second.fencing_token(), fence + 1, "the hold was not passed");
        // The view of the guard that let go says so, and its loss futures complete; the new
        // guard's view is held.
        assert!(!view.is_held(), "a view of a passed hold still says held");
        tokio::time::timeout(Duration::from_secs(10), view.lost())
            .await
            .expect("the view's lost() did not complete when its hold passed on");
        tokio::time::timeout(Duration::from_secs(10), lost)
            .await
            .expect("the guard's lost() did not complete when its hold passed on");
        let current = second.view();
        assert!(current.is_held());
        assert!(second.is_held());
        second.unlock().await.unwrap();
        assert!(!current.is_held());
        assert!(redis.leftovers().await.is_empty());
    })
    .await;
}

#[tokio::test]
async fn blocks_of_tokens_never_carry_the_counter_past_a_new_counters_start() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        // Passes enough for a second of tokens and more in every hold taken in Redis.
        let client = redis
            .builder()
            .local_handoff(LocalHandoff::new(
                LocalHandoff::MAX_PASSES,
                Duration::from_secs(10),
            ))
            .build()
            .unwrap();
        let mutex = client.mutex("block").unwrap();
        let fence = format!("{}:fence", redis.lock_key("block"));
        let mut conn = redis.conn().await;
        let mut last_token = 0;
        for _ in 0..3 {
            // A hold that reserved tokens passes one.
            let held = hold_with_passes(&mutex).await;
            let waiter = queued(&mutex).await;
            let token = held.fencing_token();
            assert!(token > last_token);
            held.unlock().await.unwrap();
            let passed = waiter.await.unwrap();
            assert_eq!(passed.fencing_token(), token + 1, "the hold was not passed");
            last_token = passed.fencing_token();
            passed.unlock().await.unwrap();
            // The counter stands at most a second (and the client's lead on the clock, far
            // under 200 ms here) ahead of the server's clock: where a new counter would start.
            let counter: f64 = redis::cmd("ZSCORE")
                .arg(&fence)
                .arg("~")
                .query_async(&mut conn)
                .await
                .unwrap();
            let now = redlatch_harness::measure::server_micros(&mut conn)
                .await
                .unwrap();
            assert!(
                (counter as u64) < now + 1_200_000,
                "the counter stands {} ms ahead of the clock",
                (counter as u64).saturating_sub(now) / 1000
            );
        }
        assert!(redis.leftovers().await.is_empty());
    })
    .await;
}

#[tokio::test]
async fn a_lost_hold_lets_local_waiters_take_the_lock_in_redis() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let client = redis
            .builder()
            .default_lease(Duration::from_millis(600))
            .build()
            .unwrap();
        let mutex = client.mutex("lost").unwrap();
        let holder = mutex.lock().await.unwrap();
        let waiter = queued(&mutex).await;
        // The hold disappears from Redis; the holder keeps its guard.
        let mut conn = redis.conn().await;
        let _: () = redis::cmd("DEL")
            .arg(redis.lock_key("lost"))
            .query_async(&mut conn)
            .await
            .unwrap();
        holder.lost().await;
        let next = waiter.await.unwrap();
        assert!(next.is_held());
        assert!(!holder.is_held());
        assert!(next.fencing_token() > holder.fencing_token());
        drop(holder);
        next.unlock().await.unwrap();
        assert!(redis.leftovers().await.is_empty());
    })
    .await;
}

#[tokio::test]
async fn a_local_waiter_whose_turn_comes_while_the_server_is_down_waits_it_out() {
    let mut redis = TestRedis::own();
    within(LIMIT, async {
        let client = redis.client();
        let mutex = client.mutex("down").unwrap();
        // Taken alone, the hold reserved no tokens to pass: letting it go sends it back to
        // Redis, and the local waiter takes the lock there in its turn.
        let holder = mutex.lock().await.unwrap();
        let waiter = queued(&mutex).await;
        redis.server().kill();
        let token = holder.fencing_token();
        let sent = client.requests();
        drop(holder);
        // The waiter's turn comes while nothing answers: it releases the hold let go, then
        // makes its own attempt, both refused.
        until(|| async { client.requests() >= sent + 2 }).await;
        assert!(
            !waiter.is_finished(),
            "the waiter gave up while the server was down"
        );
        redis.server().restart();
        let next = waiter.await.unwrap();
        assert!(next.is_held());
        // The restarted server is empty: a new counter starts ahead of its clock.
        assert!(next.fencing_token() > token);
        next.unlock().await.unwrap();
        assert!(redis.leftovers().await.is_empty());
    })
    .await;
}

#[tokio::test]
async fn off_every_acquisition_goes_to_redis() {
    let redis = TestRedis::own();
    within(LIMIT, async {
        let client = redis
            .builder()
            .local_handoff(LocalHandoff::off())
            .build()
            .unwrap();
        let mutex = client.mutex("off").unwrap();
        let first = mutex.lock().await.unwrap();
        let waiter = queued(&mutex).await;
        let before = client.requests();
        first.unlock().await.unwrap();
        let second = waiter.await.unwrap();
        // The release and the waiter's acquisition, at least, each a round trip: nothing was
        // passed. (Counted by the client: the woken waiter's attempt may go in plain commands,
        // which the server's script count would miss.)
        let requests = client.requests() - before;
        assert!(requests >= 2, "{requests} requests");
        second.unlock().await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn bad_settings_are_refused_at_build() {
    let redis = TestRedis::new();
    let refused = redis
        .builder()
        .local_handoff(LocalHandoff::new(
            LocalHandoff::MAX_PASSES + 1,
            Duration::from_millis(5),
        ))
        .build();
    assert!(matches!(
        refused,
        Err(redlatch::Error::InvalidArgument { .. })
    ));
    let refused = redis
        .builder()
        .local_handoff(LocalHandoff::default().with_head_start(Duration::from_secs(2)))
        .build();
    assert!(matches!(
        refused,
        Err(redlatch::Error::InvalidArgument { .. })
    ));
}
