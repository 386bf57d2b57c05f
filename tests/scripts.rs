//! Scripts against a real server: the NOSCRIPT path, and foreign data under our keys.

mod support;

use std::time::Duration;

use redlatch::Error;
use redlatch_harness::measure::{QueueScript, raw_mutex_acquire};
use support::{TestRedis, until, within};

#[tokio::test]
async fn every_operation_works_after_script_flush() {
    // Our own server: SCRIPT FLUSH would touch other users of a shared one.
    let redis = TestRedis::own();
    within(Duration::from_secs(60), async {
        let client = redis.client();
        let mutex = client.mutex("flushed").unwrap();
        let warm = mutex.lock().await.unwrap();
        warm.unlock().await.unwrap();
        let mut conn = redis.conn().await;
        let flush = || redis::cmd("SCRIPT").arg("FLUSH").to_owned();
        let _: () = flush().query_async(&mut conn).await.unwrap();
        let guard = mutex.lock().await.unwrap();
        let _: () = flush().query_async(&mut conn).await.unwrap();
        guard.extend(Duration::from_secs(40)).await.unwrap();
        let _: () = flush().query_async(&mut conn).await.unwrap();
        let inner = guard.reenter().await.unwrap();
        let _: () = flush().query_async(&mut conn).await.unwrap();
        inner.unlock().await.unwrap();
        let _: () = flush().query_async(&mut conn).await.unwrap();
        guard.unlock().await.unwrap();
        // The watchdog's batched renewal after a flush: the lease left in Redis goes up again.
        let short = redis
            .builder()
            .default_lease(Duration::from_secs(1))
            .build()
            .unwrap();
        let g = short.mutex("flushed").unwrap().lock().await.unwrap();
        let _: () = flush().query_async(&mut conn).await.unwrap();
        let key = format!("{}:{{flushed}}", redis.prefix);
        let pttl = || {
            let (mut conn, key) = (conn.clone(), key.clone());
            async move {
                redis::cmd("PTTL")
                    .arg(&key)
                    .query_async::<i64>(&mut conn)
                    .await
                    .unwrap()
            }
        };
        // Down by a fifth of the lease since the last renewal, then up again: a renewal after the
        // flush. (A bare "higher than just after the flush" never comes when that first read
        // lands in the same millisecond as the renewal that set the full lease.)
        until(|| async { (0..800).contains(&pttl().await) }).await;
        until(|| async { pttl().await > 800 }).await;
        assert!(g.is_held());
        g.unlock().await.unwrap();
        assert!(redis.leftovers().await.is_empty());
    })
    .await;
}

/// The script cache flushed every 2 ms (as a restart or a failover to a replica would empty
/// it) while 8 tasks over 2 clients take and release every primitive on shared names, so that
/// most acquisitions wait and are woken by a release: not one operation fails. A flush that
/// lands between loading a script and running it again must not reach the caller.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_script_cache_flush_never_reaches_a_caller() {
    const ROUNDS: usize = 100;
    let redis = TestRedis::own();
    within(Duration::from_secs(120), async {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flusher = {
            let stop = std::sync::Arc::clone(&stop);
            let mut conn = redis.conn().await;
            tokio::spawn(async move {
                let mut flushes = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let _: () = redis::cmd("SCRIPT")
                        .arg("FLUSH")
                        .query_async(&mut conn)
                        .await
                        .unwrap();
                    flushes += 1;
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                flushes
            })
        };
        // A failed release would keep its lock for a whole lease: keep leases short.
        let client = || {
            redis
                .builder()
                .default_lease(Duration::from_secs(1))
                .build()
                .unwrap()
        };
        let clients = [client(), client()];
        let mut tasks = Vec::new();
        for t in 0..8 {
            let client = clients[t % 2].clone();
            tasks.push(tokio::spawn(async move {
                let round = async || -> Result<(), Error> {
                    client.mutex("m")?.lock().await?.unlock().await?;
                    let fair = client.fair_mutex("f")?.lock().await?;
                    fair.reenter().await?.unlock().await?;
                    fair.unlock().await?;
                    client.semaphore("s", 2)?.acquire().await?.release().await?;
                    let rw = client.rwlock("rw")?;
                    rw.write().await?.unlock().await?;
                    rw.read().await?.unlock().await
                };
                let mut failures = Vec::new();
                for _ in 0..ROUNDS {
                    if let Err(err) = round().await {
                        failures.push(format!("{err:?}"));
                    }
                }
                failures
            }));
        }
        let mut failures = Vec::new();
        for task in tasks {
            failures.extend(task.await.unwrap());
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let flushes = flusher.await.unwrap();
        assert!(flushes > 10, "only {flushes} flushes");
        assert!(
            failures.is_empty(),
            "{} of {} rounds failed: {failures:?}",
            failures.len(),
            8 * ROUNDS
        );
    })
    .await;
}

#[tokio::test]
async fn foreign_data_gives_typed_errors_and_is_left_alone() {
    let redis = TestRedis::new();
    within(Duration::from_secs(60), async {
        let client = redis.client();
        let mut conn = redis.conn().await;
        // A string where the lock hash belongs.
        let key = redis.lock_key("foreign");
        let _: () = redis::cmd("SET")
            .arg(&key)
            .arg("someone else's")
            .query_async(&mut conn)
            .await
            .unwrap();
        let err = client
            .mutex("foreign")
            .unwrap()
            .try_lock()
            .await
            .unwrap_err();
        assert!(
            matches!(&err, Error::WrongType { key: k, found } if *k == key && found == "a string"),
            "{err:?}"
        );
        let err = client
            .mutex("foreign")
            .unwrap()
            .lock_timeout(Duration::from_secs(1))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::WrongType { .. }), "{err:?}");
        let value: String = redis::cmd("GET")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(value, "someone else's");

        // A hash without our layout tag (another library's lock, say).
        let key = redis.lock_key("otherhash");
        let _: () = redis::cmd("HSET")
            .arg(&key)
            .arg("x")
            .arg("1")
            .query_async(&mut conn)
            .await
            .unwrap();
        let err = client
            .mutex("otherhash")
            .unwrap()
            .try_lock()
            .await
            .unwrap_err();
        assert!(
            matches!(&err, Error::Layout { found, expected: "mutex:2", .. } if found.is_empty()),
            "{err:?}"
        );

        // A layout from a future version, and the one before this (a hash), both refused.
        let key = redis.lock_key("future");
        let _: () = redis::cmd("SET")
            .arg(&key)
            .arg("mutex:3 7 1 - someone")
            .query_async(&mut conn)
            .await
            .unwrap();
        let err = client
            .mutex("future")
            .unwrap()
            .try_lock()
            .await
            .unwrap_err();
        assert!(
            matches!(&err, Error::Layout { found, .. } if found == "mutex:3"),
            "{err:?}"
        );
        let key = redis.lock_key("past");
        let _: () = redis::cmd("HSET")
            .arg(&key)
            .arg("~layout")
            .arg("mutex:1")
            .arg("owner")
            .arg("1")
            .query_async(&mut conn)
            .await
            .unwrap();
        let err = client.mutex("past").unwrap().try_lock().await.unwrap_err();
        assert!(
            matches!(&err, Error::Layout { found, .. } if found == "mutex:1"),
            "{err:?}"
        );

        // A fencing counter that is not a number.
        let fence = format!("{}:fence", redis.lock_key("badfence"));
        let _: () = redis::cmd("SET")
            .arg(&fence)
            .arg("abc")
            .query_async(&mut conn)
            .await
            .unwrap();
        let err = client
            .mutex("badfence")
            .unwrap()
            .try_lock()
            .await
            .unwrap_err();
        assert!(
            matches!(&err, Error::WrongType { key, .. } if *key == fence),
            "{err:?}"
        );
        // Nothing was created by the refused attempt.
        let exists: u64 = redis::cmd("EXISTS")
            .arg(redis.lock_key("badfence"))
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(exists, 0);
    })
    .await;
}

#[tokio::test]
async fn a_retried_permit_release_is_refused_and_frees_nothing() {
    let redis = TestRedis::new();
    within(Duration::from_secs(30), async {
        let client = redis.client();
        let sem = client.semaphore("retried", 2).unwrap();
        let permit = sem.acquire().await.unwrap();
        let other = sem.acquire().await.unwrap();
        // The release a network retry would send twice, run by hand.
        let script = QueueScript::Release.script();
        let key = redis.lock_key("retried");
        let mut release = script.prepare_invoke();
        for k in ["", ":holders", ":queue", ":fence"] {
            release.key(format!("{key}{k}"));
        }
        release
            .arg("semaphore:1")
            .arg("s")
            .arg(permit.id().to_string())
            .arg(format!("{key}:wake"))
            .arg(60_000);
        let mut conn = redis.conn().await;
        let first: Vec<i64> = release.invoke_async(&mut conn).await.unwrap();
        let second: Vec<i64> = release.invoke_async(&mut conn).await.unwrap();
        assert_eq!((first, second), (vec![2], vec![0]));
        assert_eq!(sem.available_permits().await.unwrap(), 1);
        assert!(matches!(permit.release().await, Err(Error::NotHeld { .. })));
        assert_eq!(sem.available_permits().await.unwrap(), 1);
        other.release().await.unwrap();
        assert_eq!(sem.available_permits().await.unwrap(), 2);
    })
    .await;
}

#[tokio::test]
async fn a_retried_acquire_returns_the_hold_it_got_and_adds_nothing() {
    let redis = TestRedis::new();
    within(Duration::from_secs(30), async {
        let client = redis.client();
        let mut conn = redis.conn().await;
        // A permit granted twice to one new owner (the first answer "lost").
        let acquire = QueueScript::Acquire.script();
        let key = redis.lock_key("retry");
        let owner = redlatch::OwnerToken::new().to_string();
        let mut call = acquire.prepare_invoke();
        for k in ["", ":holders", ":queue", ":fence"] {
            call.key(format!("{key}{k}"));
        }
        call.arg("semaphore:1")
            .arg("s")
            .arg(&owner)
            .arg(2)
            .arg(3)
            .arg(30_000)
            .arg(30_000)
            .arg(60_000)
            .arg(format!("{key}:wake"))
            .arg("new")
            .arg("testclient");
        // Asked again, the permit is found (not taken twice), with a new token.
        let first: (i64, u64, i64, u64) = call.invoke_async(&mut conn).await.unwrap();
        let again: (i64, u64, i64, u64) = call.invoke_async(&mut conn).await.unwrap();
        assert_eq!((first.0, first.2), (again.0, again.2));
        assert!(again.1 > first.1, "{} then {}", first.1, again.1);
        assert_eq!(first.2, 2);
        let sem = client.semaphore("retry", 3).unwrap();
        assert_eq!(sem.available_permits().await.unwrap(), 1);

        // The same for the mutex: one hold, not two. The hold asked for again gets a new token
        // (the client may not have been able to confirm the first one: its one-round-trip
        // acquire), above the first and the one the lock now carries.
        let lock = redis.lock_key("retry-mutex");
        let first = raw_mutex_acquire(&mut conn, &lock, &owner, 1)
            .await
            .unwrap();
        let again = raw_mutex_acquire(&mut conn, &lock, &owner, 1)
            .await
            .unwrap();
        assert_eq!((&first[0], &first[2]), (&again[0], &again[2]));
        assert_eq!(first[0], "1");
        let (token, retried): (u64, u64) = (first[1].parse().unwrap(), again[1].parse().unwrap());
        assert!(retried > token, "{token} then {retried}");
        let snapshot = client.inspect("retry-mutex").await.unwrap();
        assert_eq!(snapshot.holders[0].exclusive_holds, 1);
        assert_eq!(snapshot.last_fencing_token, Some(retried));
    })
    .await;
}

/// Calls `queue_acquire` for `owner` by hand (a client that is not there to hear messages).
async fn raw_queue_acquire(
    redis: &TestRedis,
    conn: &mut redis::aio::MultiplexedConnection,
    name: &str,
    owner: &str,
    claim: &str,
) -> redis::Value {
    let key = redis.lock_key(name);
    fair_call(conn, &key, (owner, "testclient"), claim, (30_000, 30_000)).await
}

/// `queue_acquire` (its fast path first, as a client sends it) of the fair mutex at `key` for
/// `owner` of `client`, with `claim`, a lease and a grace (the first term of a hold handed
/// over; 0: do not queue) in ms: its reply as it came.
async fn fair_call(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
    (owner, client): (&str, &str),
    claim: &str,
    (lease, grace): (u64, u64),
) -> redis::Value {
    let mut call = QueueScript::Acquire.script().prepare_invoke();
    for k in ["", ":holders", ":queue", ":fence"] {
        call.key(format!("{key}{k}"));
    }
    call.arg("fair:1")
        .arg("x")
        .arg(owner)
        .arg(1)
        .arg(0)
        .arg(lease)
        .arg(grace)
        .arg(60_000)
        .arg(format!("{key}:wake"))
        .arg(claim)
        .arg(client);
    call.invoke_async(conn).await.unwrap()
}

#[tokio::test]
async fn a_handed_over_hold_is_found_again_or_given_back() {
    let redis = TestRedis::new();
    within(Duration::from_secs(30), async {
        let client = redis.client();
        let mut conn = redis.conn().await;
        let mutex = client.fair_mutex("handed").unwrap();
        let holder = mutex.lock().await.unwrap();
        // A waiter that never hears its message: queued by hand.
        let owner = redlatch::OwnerToken::new().to_string();
        let queued = raw_queue_acquire(&redis, &mut conn, "handed", &owner, "new").await;
        assert!(
            matches!(&queued, redis::Value::Array(v) if v.first() == Some(&redis::Value::Int(0)))
        );
        holder.unlock().await.unwrap();
        // The release gave it the lock; its next attempt (a fresh claim) finds that hold, still
        // held once, with a new token above every one issued.
        let snapshot = client.inspect("handed").await.unwrap();
        assert_eq!(snapshot.holders.len(), 1);
        assert_eq!(snapshot.holders[0].id, &owner[..8]);
        assert!(snapshot.waiters.is_empty());
        let fence = snapshot.last_fencing_token.unwrap();
        let again = raw_queue_acquire(&redis, &mut conn, "handed", &owner, "new").await;
        let (status, token, holds, _clock): (i64, u64, i64, u64) =
            redis::FromRedisValue::from_redis_value(again).unwrap();
        assert_eq!((status, holds), (1, 1));
        assert!(token > fence, "{fence} then {token}");
        let snapshot = client.inspect("handed").await.unwrap();
        assert_eq!(snapshot.last_fencing_token, Some(token));

        // Queued behind it, a waiter that gives up just as the lock is handed to it: leaving
        // with `Q` gives the hold back and passes it on.
        let quitter = redlatch::OwnerToken::new().to_string();
        raw_queue_acquire(&redis, &mut conn, "handed", &quitter, "new").await;
        let next = tokio::spawn({
            let mutex = mutex.clone();
            async move { mutex.lock().await.unwrap() }
        });
        support::until(|| async { redis.queued(&client, "handed").await == 2 }).await;
        let release = QueueScript::Release.script();
        let key = redis.lock_key("handed");
        let mut call = release.prepare_invoke();
        for k in ["", ":holders", ":queue", ":fence"] {
            call.key(format!("{key}{k}"));
        }
        call.arg("fair:1")
            .arg("x")
            .arg(&owner)
            .arg(format!("{key}:wake"))
            .arg(60_000);
        let freed: Vec<i64> = call.invoke_async(&mut conn).await.unwrap();
        assert_eq!(freed, vec![2]);
        let held_by = client.inspect("handed").await.unwrap().holders[0]
            .id
            .clone();
        assert_eq!(held_by, &quitter[..8]);
        let mut leave = release.prepare_invoke();
        for k in ["", ":holders", ":queue", ":fence"] {
            leave.key(format!("{key}{k}"));
        }
        leave
            .arg("fair:1")
            .arg("Q")
            // A waiter leaves by its queue member: client/owner/want.
            .arg(format!("testclient/{quitter}/x1/30000/30000"))
            .arg(format!("{key}:wake"))
            .arg(60_000);
        let left: Vec<i64> = leave.invoke_async(&mut conn).await.unwrap();
        assert_eq!(left, vec![2]);
        let guard = next.await.unwrap();
        assert!(guard.fencing_token() > fence);
        guard.unlock().await.unwrap();
        assert!(redis.leftovers().await.is_empty());
    })
    .await;
}

/// Every key under the prefix expires; `what` says which step left one that would not.
async fn assert_all_expire(redis: &TestRedis, what: &str) {
    for (key, ttl) in redis.ttls().await {
        assert!(ttl > 0, "after {what}: {key} has no expiry ({ttl})");
    }
}

#[tokio::test]
async fn keys_made_again_while_a_name_is_in_use_get_an_expiry() {
    let redis = TestRedis::new();
    within(Duration::from_secs(30), async {
        // Places that last less than the leases, so a queue made while a lock is held does not
        // push the keys' expiry (the path where only the new key needs one).
        let client = redis
            .builder()
            .waiter_timeout(Duration::from_secs(2))
            .build()
            .unwrap();
        let lock = client.rwlock("again").unwrap();
        let writer = lock.write().await.unwrap();
        assert_all_expire(&redis, "a write hold").await;
        let reader = tokio::spawn({
            let lock = lock.clone();
            async move { lock.read().await.unwrap() }
        });
        support::until(|| async { redis.queued(&client, "again").await == 1 }).await;
        assert_all_expire(&redis, "a reader queued behind a writer").await;
        writer.unlock().await.unwrap();
        let reader = reader.await.unwrap();
        // The holders set was empty under the writer: the hand-over made it again.
        assert_all_expire(&redis, "a read hold handed over").await;
        let second = lock.read().await.unwrap();
        let writer = tokio::spawn({
            let lock = lock.clone();
            async move { lock.write().await.unwrap() }
        });
        support::until(|| async { redis.queued(&client, "again").await == 1 }).await;
        assert_all_expire(&redis, "a writer queued behind readers").await;
        reader.unlock().await.unwrap();
        second.unlock().await.unwrap();
        let writer = writer.await.unwrap();
        assert_all_expire(&redis, "a write hold handed over").await;
        writer.unlock().await.unwrap();
        assert!(redis.leftovers().await.is_empty());

        let sem = client.semaphore("again-sem", 1).unwrap();
        let mut permit = sem.acquire().await.unwrap();
        for round in 0..3 {
            let next = tokio::spawn({
                let sem = sem.clone();
                async move { sem.acquire().await.unwrap() }
            });
            support::until(|| async { redis.queued(&client, "again-sem").await == 1 }).await;
            assert_all_expire(&redis, &format!("round {round}: a permit queued for")).await;
            permit.release().await.unwrap();
            let handed = next.await.unwrap();
            assert_all_expire(&redis, &format!("round {round}: a permit handed over")).await;
            permit = handed;
        }
        permit.release().await.unwrap();
        assert!(redis.leftovers().await.is_empty());
    })
    .await;
}

/// The fence key of the layout before (a string holding the last token) is carried over to
/// the sorted set by the first acquisition that issues a token, for every primitive: the
/// token rises above it, and the key keeps its expiry (the plain mutex's script then sets it
/// to `FENCE_TTL` again, as for every token it issues).
#[tokio::test]
async fn a_fence_counter_of_the_layout_before_is_carried_over() {
    let redis = TestRedis::new();
    within(Duration::from_secs(60), async {
        let client = redis.client();
        let mut conn = redis.conn().await;
        for name in ["old-mutex", "old-fair", "old-sem", "old-write"] {
            let fence = format!("{}:fence", redis.lock_key(name));
            // Ten seconds ahead of the server clock, as if its tokens had run ahead of it.
            let ahead = redlatch_harness::measure::server_micros(&mut conn)
                .await
                .unwrap()
                + 10_000_000;
            let _: () = redis::cmd("SET")
                .arg(&fence)
                .arg(ahead)
                .arg("PX")
                .arg(600_000)
                .query_async(&mut conn)
                .await
                .unwrap();
            let token = match name {
                "old-mutex" => {
                    let g = client.mutex(name).unwrap().lock().await.unwrap();
                    let t = g.fencing_token();
                    g.unlock().await.unwrap();
                    t
                }
                "old-fair" => {
                    let g = client.fair_mutex(name).unwrap().lock().await.unwrap();
                    let t = g.fencing_token();
                    g.unlock().await.unwrap();
                    t
                }
                "old-sem" => {
                    let p = client.semaphore(name, 2).unwrap().acquire().await.unwrap();
                    let t = p.fencing_token();
                    p.release().await.unwrap();
                    t
                }
                _ => {
                    let g = client.rwlock(name).unwrap().write().await.unwrap();
                    let t = g.fencing_token();
                    g.unlock().await.unwrap();
                    t
                }
            };
            assert!(token > ahead, "{name}: {token} <= {ahead}");
            let (kind, last, ttl): (String, u64, i64) = redis::pipe()
                .cmd("TYPE")
                .arg(&fence)
                .zscore(&fence, "~")
                .pttl(&fence)
                .query_async(&mut conn)
                .await
                .unwrap();
            // The key stands at the last token issued: for the mutex, the end of the block it
            // took for local hand-off.
            assert_eq!(kind, "zset", "{name}");
            assert!(
                last >= token && last <= token + 64,
                "{name}: {token}, key at {last}"
            );
            // It keeps its expiry, but `mutex_acquire` sets a week again on every token it
            // issues from a key that was there.
            if name == "old-mutex" {
                let week = i64::try_from(redlatch::FENCE_TTL.as_millis()).unwrap();
                assert!(ttl > week - 60_000, "{name}: {ttl}");
            } else {
                assert!(ttl > 0 && ttl <= 600_000, "{name}: {ttl}");
            }
        }
        assert_eq!(redis.leftovers().await, Vec::<String>::new());
    })
    .await;
}

/// `mutex_acquire` as this version sends it to one server: run once per request id through
/// the name's request log (`once_lib.lua`).
fn logged_mutex_acquire() -> redis::Script {
    redis::Script::new(concat!(
        "local PUBLISH = 'PUBLISH'\nlocal function main()\n",
        include_str!("../lua/v1/keys_lib.lua"),
        include_str!("../lua/v1/mutex_lib.lua"),
        include_str!("../lua/v1/mutex_acquire.lua"),
        "end\n",
        include_str!("../lua/v1/once_lib.lua"),
    ))
}

/// A carried owner's acquisition (`as`, which adds a hold) with request id `id`: the status
/// and the owner's hold count after it.
async fn logged_join(
    conn: &mut redis::aio::MultiplexedConnection,
    lock: &str,
    owner: &str,
    id: &str,
) -> (i64, i64) {
    let reply: Vec<redis::Value> = logged_mutex_acquire()
        .key(lock)
        .key(format!("{lock}:fence"))
        .key(format!("{lock}:once"))
        .arg(owner)
        .arg(30_000)
        .arg(60_000)
        .arg("as")
        .arg("-")
        .arg(0)
        .arg(id)
        .invoke_async(conn)
        .await
        .unwrap();
    let int = |v: &redis::Value| redis::from_redis_value::<i64>(v.clone()).unwrap();
    (int(&reply[0]), reply.get(2).map_or(0, int))
}

/// Found by review: the request log lived 10 s from when it was made, whatever was written to
/// it since, so a request logged near the end of that life was protected for almost nothing: sent
/// again (a lost answer), it ran again and added a hold. Every entry is now kept 10 s at least,
/// entries older than that are dropped as the log is written, and a hash that the library did
/// not write is left alone.
#[tokio::test]
async fn every_logged_request_is_kept_for_the_whole_window() {
    let redis = TestRedis::own();
    within(Duration::from_secs(60), async {
        let mut conn = redis.conn().await;
        let lock = redis.lock_key("logged");
        let log = format!("{lock}:once");
        assert_eq!(logged_join(&mut conn, &lock, "o", "first").await, (1, 1));
        // A refusal changed no hold count: it is not logged, and a repeat runs again.
        assert_eq!(logged_join(&mut conn, &lock, "p", "busy").await.0, 0);
        let logged: bool = redis::cmd("HEXISTS")
            .arg(&log)
            .arg("busy")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(!logged, "a busy answer was logged");
        // The log near the end of its first window, as if made 9.9 s ago.
        let _: () = redis::cmd("PEXPIRE")
            .arg(&log)
            .arg(100)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(logged_join(&mut conn, &lock, "o", "second").await, (1, 2));
        let pttl: i64 = redis::cmd("PTTL")
            .arg(&log)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(pttl > 9_000, "the log's TTL after a write: {pttl} ms");
        // Past the old window's end (time is the point: the log's expiry).
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            logged_join(&mut conn, &lock, "o", "second").await,
            (1, 2),
            "a request sent again is answered from the log, not run again"
        );
        // Entries older than the window go as the log is written: these two, with the mark,
        // are every field a write draws.
        let _: () = redis::cmd("DEL")
            .arg(&log)
            .query_async(&mut conn)
            .await
            .unwrap();
        let packed = "1000:x";
        let _: () = redis::cmd("HSET")
            .arg(&log)
            .arg("~")
            .arg("once:2")
            .arg("old1")
            .arg(packed)
            .arg("old2")
            .arg(packed)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(logged_join(&mut conn, &lock, "o", "third").await, (1, 3));
        let mut fields: Vec<String> = redis::cmd("HKEYS")
            .arg(&log)
            .query_async(&mut conn)
            .await
            .unwrap();
        fields.sort();
        assert_eq!(fields, ["third", "~"]);
        // A hash the library did not write under the log's key is neither used nor changed.
        let _: () = redis::cmd("DEL")
            .arg(&log)
            .query_async(&mut conn)
            .await
            .unwrap();
        let _: () = redis::cmd("HSET")
            .arg(&log)
            .arg("theirs")
            .arg("1")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(logged_join(&mut conn, &lock, "o", "fourth").await, (1, 4));
        let theirs: std::collections::HashMap<String, String> = redis::cmd("HGETALL")
            .arg(&log)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(theirs.len(), 1);
        assert_eq!(theirs["theirs"], "1");
        let ttl: i64 = redis::cmd("PTTL")
            .arg(&log)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(ttl, -1, "their hash was given an expiry");
        let _: () = redis::cmd("DEL")
            .arg(&log)
            .arg(&lock)
            .arg(format!("{lock}:fence"))
            .query_async(&mut conn)
            .await
            .unwrap();
    })
    .await;
}

/// [`fair_call`]'s reply: its status and its second field.
async fn fair_acquire(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
    who: (&str, &str),
    claim: &str,
    term: (u64, u64),
) -> (i64, i64) {
    let reply: Vec<redis::Value> =
        redis::from_redis_value(fair_call(conn, key, who, claim, term).await).unwrap();
    let int = |v: &redis::Value| redis::from_redis_value::<i64>(v.clone()).unwrap_or(0);
    (int(&reply[0]), reply.get(1).map_or(0, int))
}

/// Found by review: a queued primitive's keys expired at the latest lease end rounded up to the
/// next second, so when a holder died with its lease ending just before a whole second, the
/// queue went with it 1 ms later; a waiter whose timer fired after that (by its jitter) found
/// nothing, and took the name ahead of the waiters queued before it. The keys now outlive the
/// last lease by 2 s before the rounding.
#[tokio::test]
async fn a_dead_holders_waiters_keep_their_order_after_its_lease() {
    let redis = TestRedis::new();
    within(Duration::from_secs(30), async {
        let mut conn = redis.conn().await;
        let key = redis.lock_key("linger");
        // A holder whose lease ends just before a whole second of the server's clock (tried
        // again until it does: the call may take a while on a loaded machine), and which then
        // dies (never releases).
        let keys = ["", ":holders", ":queue", ":fence"].map(|k| format!("{key}{k}"));
        loop {
            let now = redlatch_harness::measure::server_micros(&mut conn)
                .await
                .unwrap();
            let lease = 1_000 + (1_990 - (now / 1000 + 1_000) % 1_000) % 1_000;
            let (status, _) = fair_acquire(&mut conn, &key, ("h", "dead"), "new", (lease, 0)).await;
            assert_eq!(status, 1);
            let ends: u64 = redis::cmd("HGET")
                .arg(&key)
                .arg("~next")
                .query_async(&mut conn)
                .await
                .unwrap();
            if ends % 1_000 >= 950 {
                break;
            }
            let _: () = redis::cmd("DEL")
                .arg(&keys)
                .query_async(&mut conn)
                .await
                .unwrap();
        }
        let queue = |owner| (owner, owner);
        let (first, wait) =
            fair_acquire(&mut conn, &key, queue("w1"), "new", (30_000, 30_000)).await;
        assert_eq!(first, 0, "queued behind the holder");
        let (second, _) = fair_acquire(&mut conn, &key, queue("w2"), "new", (30_000, 30_000)).await;
        assert_eq!(second, 0);
        // The second waiter asks again first, 150 ms after the lease ended (time is the point:
        // the keys' expiry).
        tokio::time::sleep(Duration::from_millis(u64::try_from(wait).unwrap() + 150)).await;
        let (late, _) =
            fair_acquire(&mut conn, &key, queue("w2"), "queued", (30_000, 30_000)).await;
        assert_eq!(
            late, 0,
            "the second waiter took the name ahead of the first"
        );
        let (head, _) =
            fair_acquire(&mut conn, &key, queue("w1"), "queued", (30_000, 30_000)).await;
        assert_eq!(
            head, 1,
            "the first waiter holds: the dead holder's lease went to it"
        );
        let _: () = redis::cmd("DEL")
            .arg(&keys)
            .query_async(&mut conn)
            .await
            .unwrap();
    })
    .await;
}

/// Found by review: the request log logged only table replies, so the compare-and-delete
/// release, whose reply is the bare integer 2, went unlogged in the cluster form; sent again
/// after a lost reply, it ran again, found nothing and answered "not held" for a release that
/// happened (or, had the owner taken the name again meanwhile, released that newer hold).
#[tokio::test]
async fn a_compare_and_delete_release_is_logged_and_answered_again() {
    let redis = TestRedis::new();
    within(Duration::from_secs(30), async {
        let mut conn = redis.conn().await;
        let lock = redis.lock_key("logged-release");
        let log = format!("{lock}:once");
        let release = redis::Script::new(concat!(
            "local PUBLISH = 'SPUBLISH'\nlocal function main()\n",
            include_str!("../lua/v1/mutex_release_fast.lua"),
            include_str!("../lua/v1/mutex_lib.lua"),
            include_str!("../lua/v1/mutex_release.lua"),
            "end\n",
            include_str!("../lua/v1/once_lib.lua"),
        ));
        let value = "mutex:2 7 1 - owner";
        let _: () = redis::cmd("SET")
            .arg(&lock)
            .arg(value)
            .arg("PX")
            .arg(30_000)
            .query_async(&mut conn)
            .await
            .unwrap();
        for round in ["first", "sent again"] {
            let reply: redis::Value = release
                .key(&lock)
                .key(&log)
                .arg(value)
                .arg("r1")
                .invoke_async(&mut conn)
                .await
                .unwrap();
            assert_eq!(reply, redis::Value::Int(2), "{round}");
        }
        let exists: i64 = redis::cmd("EXISTS")
            .arg(&lock)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(exists, 0);
        let _: () = redis::cmd("DEL")
            .arg(&log)
            .query_async(&mut conn)
            .await
            .unwrap();
    })
    .await;
}
