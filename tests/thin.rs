//! The queued primitives' thin form: a name a client last saw free is taken in one round trip
//! of plain commands, its single hold kept as one string under the meta key, and let go by one
//! script call that compares and deletes it. Whatever else meets it (a second owner, a waiter,
//! a re-entry) turns it into the queue state first, so every rule of the queued primitives
//! holds across the two forms: FIFO order, permits never above capacity, tokens strictly
//! rising, nothing left but the fence key.

mod support;

use std::time::Duration;

use redlatch::{Error, LockClient, LockKind};
use redlatch_harness::measure::{WARM_NAMES, commandstats, server_commands};
use support::{TestRedis, until, within};

const LIMIT: Duration = Duration::from_secs(60);

/// What a name's meta key holds: `string` (the thin form), `hash` (the queue state), `none`.
async fn form(redis: &TestRedis, name: &str) -> String {
    let mut conn = redis.conn().await;
    redis::cmd("TYPE")
        .arg(redis.lock_key(name))
        .query_async(&mut conn)
        .await
        .unwrap()
}

/// Takes and lets go of `name` once with every primitive's first hold, so that the client
/// last saw it free.
async fn in_use(client: &LockClient, name: &str, kind: LockKind) {
    match kind {
        LockKind::FairMutex => {
            let m = client.fair_mutex(name).unwrap();
            m.lock().await.unwrap().unlock().await.unwrap();
        }
        LockKind::Semaphore => {
            let s = client.semaphore(name, 2).unwrap();
            s.acquire().await.unwrap().release().await.unwrap();
        }
        _ => {
            let l = client.rwlock(name).unwrap();
            l.write().await.unwrap().unlock().await.unwrap();
        }
    }
}

#[tokio::test]
async fn an_idle_name_in_use_is_taken_in_one_round_trip_and_let_go_by_one_script() {
    // Our own server: the figures are the server's counts of every command it ran.
    let redis = TestRedis::own();
    within(LIMIT, async {
        let client = redis.client();
        let mut conn = redis.conn().await;
        for (what, name) in [
            ("fair", "t-fair"),
            ("permit", "t-sem"),
            ("write", "t-write"),
            ("read", "t-read"),
        ] {
            let kind = match what {
                "fair" => LockKind::FairMutex,
                "permit" => LockKind::Semaphore,
                _ => LockKind::RwLock,
            };
            in_use(&client, name, kind).await;
            // Past the second in which the name's new fence key runs ahead of the clock.
            tokio::time::sleep(WARM_NAMES).await;
            let before = commandstats(&mut conn).await.unwrap();
            let sent = client.requests();
            let mut tokens = Vec::new();
            for _ in 0..20 {
                let token = match what {
                    "fair" => {
                        let g = client.fair_mutex(name).unwrap().lock().await.unwrap();
                        assert_eq!(form(&redis, name).await, "string", "{what}");
                        let t = g.fencing_token();
                        g.unlock().await.unwrap();
                        t
                    }
                    "permit" => {
                        let p = client.semaphore(name, 2).unwrap().acquire().await.unwrap();
                        let t = p.fencing_token();
                        p.release().await.unwrap();
                        t
                    }
                    "write" => {
                        let g = client.rwlock(name).unwrap().write().await.unwrap();
                        let t = g.fencing_token();
                        g.unlock().await.unwrap();
                        t
                    }
                    _ => {
                        let g = client.rwlock(name).unwrap().read().await.unwrap();
                        g.unlock().await.unwrap();
                        0
                    }
                };
                tokens.push(token);
            }
            let after = commandstats(&mut conn).await.unwrap();
            // Two round trips a cycle, as the client counts them (a semaphore's handle asks
            // nothing when it is made).
            assert_eq!(client.requests() - sent, 40, "{what}: requests");
            // Less the test's own TYPE calls.
            let typed = if what == "fair" { 20 } else { 0 };
            let commands = server_commands(&before, &after) - typed;
            let scripts = after["evalsha"] - before["evalsha"];
            // SET NX PX, ZADD XX GT CH (a read: ZSCORE), EXISTS; EVALSHA, GET, DEL.
            assert_eq!(commands, 20 * 6, "{what}: commands in all");
            assert_eq!(scripts, 20, "{what}: one script call a cycle (the release)");
            if what != "read" {
                assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{what}: {tokens:?}");
            }
        }
        assert_eq!(redis.leftovers().await, Vec::<String>::new());
    })
    .await;
}

#[tokio::test]
async fn a_waiter_turns_a_thin_hold_into_the_queue_and_is_handed_it_in_order() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let a = redis.client();
        let b = redis.client();
        let name = "t-queue";
        // Listens on the name's channels: the release's hand-over message must reach the
        // channel of the waiter's client.
        let wake = format!("{}:wake", redis.lock_key(name));
        let mut listen = redis.listener().await;
        listen.psubscribe(&format!("{wake}*")).await;
        in_use(&a, name, LockKind::FairMutex).await;
        let first = a.fair_mutex(name).unwrap().lock().await.unwrap();
        assert_eq!(form(&redis, name).await, "string");
        // Two waiters in another client, in this order.
        let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut waiters = Vec::new();
        for i in 0..2 {
            let (mutex, order) = (b.fair_mutex(name).unwrap(), order.clone());
            waiters.push(tokio::spawn(async move {
                let g = mutex.lock().await.unwrap();
                order.lock().unwrap().push(i);
                let t = g.fencing_token();
                g.unlock().await.unwrap();
                t
            }));
            until(|| async { redis.queued(&a, name).await == i + 1 }).await;
        }
        assert_eq!(form(&redis, name).await, "hash");
        let snapshot = a.inspect(name).await.unwrap();
        assert_eq!(snapshot.holders.len(), 1);
        assert_eq!(snapshot.holders[0].exclusive_holds, 1);
        let token = first.fencing_token();
        // The thin hold's release (the short form: the string alone) meets the queue state
        // and hands over, telling the head on its client's channel.
        first.unlock().await.unwrap();
        let told = listen.heard().await;
        let mut tokens = vec![token];
        for w in waiters {
            tokens.push(w.await.unwrap());
        }
        // `client/owner:fence:ms:ticket`: the head, with the token it holds.
        let (channel, payload) = told.first().expect("the hand-over was told");
        let client = payload.split('/').next().unwrap();
        assert_eq!(*channel, format!("{wake}:{client}"));
        assert_eq!(
            payload.split(':').nth(1),
            Some(tokens[1].to_string().as_str())
        );
        assert_eq!(*order.lock().unwrap(), vec![0, 1]);
        assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
        assert_eq!(redis.leftovers().await, Vec::<String>::new());
    })
    .await;
}

#[tokio::test]
async fn permits_joined_to_a_thin_hold_never_exceed_capacity() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let client = redis.client();
        let name = "t-permits";
        in_use(&client, name, LockKind::Semaphore).await;
        let sem = client.semaphore(name, 2).unwrap();
        let first = sem.acquire().await.unwrap();
        assert_eq!(form(&redis, name).await, "string");
        // A client with another capacity is refused, and the thin hold stays as it was.
        let other = redis.client();
        let refused = other.semaphore(name, 3).unwrap().try_acquire().await;
        assert!(
            matches!(refused, Err(Error::CapacityMismatch { theirs: 2, .. })),
            "{refused:?}"
        );
        assert!(first.is_held());
        let second = sem.acquire().await.unwrap();
        assert_eq!(form(&redis, name).await, "hash");
        assert_eq!(sem.available_permits().await.unwrap(), 0);
        assert!(sem.try_acquire().await.unwrap().is_none());
        let third = tokio::spawn({
            let sem = sem.clone();
            async move { sem.acquire().await.unwrap() }
        });
        until(|| async { redis.queued(&client, name).await == 1 }).await;
        let tokens = [first.fencing_token(), second.fencing_token()];
        assert!(tokens[0] < tokens[1]);
        first.release().await.unwrap();
        let third = third.await.unwrap();
        assert!(third.fencing_token() > tokens[1]);
        assert_eq!(sem.available_permits().await.unwrap(), 0);
        second.release().await.unwrap();
        third.release().await.unwrap();
        assert_eq!(redis.leftovers().await, Vec::<String>::new());
    })
    .await;
}

#[tokio::test]
async fn readers_join_a_thin_read_and_a_writer_waits_for_them() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let client = redis.client();
        let name = "t-rw";
        in_use(&client, name, LockKind::RwLock).await;
        let lock = client.rwlock(name).unwrap();
        let reader = lock.read().await.unwrap();
        assert_eq!(form(&redis, name).await, "string");
        let second = lock.read().await.unwrap();
        assert_eq!(form(&redis, name).await, "hash");
        let snapshot = client.inspect(name).await.unwrap();
        assert_eq!(snapshot.holders.len(), 2);
        let writing = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = tokio::spawn({
            let (lock, writing) = (lock.clone(), writing.clone());
            async move {
                let g = lock.write().await.unwrap();
                writing.store(true, std::sync::atomic::Ordering::SeqCst);
                g
            }
        });
        until(|| async { redis.queued(&client, name).await == 1 }).await;
        reader.unlock().await.unwrap();
        assert!(!writing.load(std::sync::atomic::Ordering::SeqCst));
        second.unlock().await.unwrap();
        let w = writer.await.unwrap();
        w.unlock().await.unwrap();
        assert_eq!(redis.leftovers().await, Vec::<String>::new());
    })
    .await;
}

/// A thin hold lives past its first lease: the watchdog renews the meta key's TTL, and the
/// hold stays in its form; inspect reports it, and force_unlock ends it.
#[tokio::test]
async fn a_thin_hold_is_renewed_inspected_and_forced_open() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let client = redis
            .builder()
            .default_lease(Duration::from_millis(900))
            .build()
            .unwrap();
        let name = "t-renew";
        in_use(&client, name, LockKind::FairMutex).await;
        let guard = client.fair_mutex(name).unwrap().lock().await.unwrap();
        assert_eq!(form(&redis, name).await, "string");
        // Three leases' worth.
        tokio::time::sleep(Duration::from_millis(2_700)).await;
        assert!(guard.is_held());
        assert_eq!(form(&redis, name).await, "string");
        let snapshot = client.inspect(name).await.unwrap();
        assert_eq!(snapshot.kind, Some(LockKind::FairMutex));
        assert_eq!(snapshot.holders.len(), 1);
        assert_eq!(snapshot.holders[0].exclusive_holds, 1);
        assert!(
            snapshot.holders[0]
                .lease_left
                .is_some_and(|l| l > Duration::ZERO)
        );
        assert_eq!(snapshot.last_fencing_token, Some(guard.fencing_token()));
        let forced = client.force_unlock(name).await.unwrap();
        assert_eq!(forced.holders, 1);
        guard.lost().await;
        assert!(!guard.is_held());
        assert_eq!(redis.leftovers().await, Vec::<String>::new());
    })
    .await;
}

/// The one-round-trip acquire proposes the client's estimate of the clock as the token; a fence
/// key above it does not confirm it, and the script turns the thin hold into the queue state
/// and issues a token above the key before the caller sees any.
#[tokio::test]
async fn a_token_the_fence_key_does_not_confirm_is_issued_again() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let client = redis.client();
        let mut conn = redis.conn().await;
        for (name, kind) in [
            ("t-ahead-fair", LockKind::FairMutex),
            ("t-ahead-sem", LockKind::Semaphore),
        ] {
            in_use(&client, name, kind).await;
            let ahead = redlatch_harness::measure::server_micros(&mut conn)
                .await
                .unwrap()
                + 60_000_000;
            let _: () = redis::cmd("ZADD")
                .arg(format!("{}:fence", redis.lock_key(name)))
                .arg("GT")
                .arg(ahead)
                .arg("~")
                .query_async(&mut conn)
                .await
                .unwrap();
            let token = if kind == LockKind::FairMutex {
                let g = client.fair_mutex(name).unwrap().lock().await.unwrap();
                let t = g.fencing_token();
                g.unlock().await.unwrap();
                t
            } else {
                let p = client.semaphore(name, 2).unwrap().acquire().await.unwrap();
                let t = p.fencing_token();
                p.release().await.unwrap();
                t
            };
            assert!(token > ahead, "{name}: {token} <= {ahead}");
        }
        assert_eq!(redis.leftovers().await, Vec::<String>::new());
    })
    .await;
}

/// A name held in the thin form is one primitive's: the plain mutex and another queued
/// primitive refuse it as another layout, and change nothing.
#[tokio::test]
async fn a_thin_hold_is_another_layout_to_other_primitives() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let client = redis.client();
        let name = "t-layout";
        in_use(&client, name, LockKind::FairMutex).await;
        let guard = client.fair_mutex(name).unwrap().lock().await.unwrap();
        assert_eq!(form(&redis, name).await, "string");
        let mutex = client.mutex(name).unwrap().try_lock().await;
        assert!(
            matches!(&mutex, Err(Error::Layout { found, .. }) if found == "fair:1"),
            "{mutex:?}"
        );
        let rw = client.rwlock(name).unwrap().try_read().await;
        assert!(
            matches!(&rw, Err(Error::Layout { found, .. }) if found == "fair:1"),
            "{rw:?}"
        );
        assert_eq!(form(&redis, name).await, "string");
        guard.unlock().await.unwrap();
        assert_eq!(redis.leftovers().await, Vec::<String>::new());
    })
    .await;
}
