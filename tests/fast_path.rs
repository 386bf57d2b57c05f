//! The queued primitives' fast path: the acquire of an idle name and the release that leaves it
//! idle run a short path before the queue machinery. What they write is the state the queue
//! machinery reads: tokens keep rising across the two paths, waiters queue behind a hold taken
//! on the fast path, and nothing is left but the fencing counter.

mod support;

use std::time::Duration;

use redlatch::LockClient;
use redlatch_harness::measure::{commandstats, server_commands};
use support::{TestRedis, until, within};

const LIMIT: Duration = Duration::from_secs(60);

/// One primitive's hold, whatever its kind, for the loops below.
enum Kind {
    Fair,
    Semaphore,
    Read,
    Write,
}

/// One cycle (acquire, release) of `kind` on `name`; the hold's fencing token (0 for a read).
async fn cycle(client: &LockClient, kind: &Kind, name: &str) -> u64 {
    match kind {
        Kind::Fair => {
            let guard = client.fair_mutex(name).unwrap().lock().await.unwrap();
            let token = guard.fencing_token();
            guard.unlock().await.unwrap();
            token
        }
        Kind::Semaphore => {
            let permit = client.semaphore(name, 2).unwrap().acquire().await.unwrap();
            let token = permit.fencing_token();
            permit.release().await.unwrap();
            token
        }
        Kind::Read => {
            let guard = client.rwlock(name).unwrap().read().await.unwrap();
            guard.unlock().await.unwrap();
            0
        }
        Kind::Write => {
            let guard = client.rwlock(name).unwrap().write().await.unwrap();
            let token = guard.fencing_token();
            guard.unlock().await.unwrap();
            token
        }
    }
}

#[tokio::test]
async fn an_idle_name_is_taken_and_let_go_in_few_server_commands() {
    // Our own server: the figure is the server's count of every command it ran.
    let redis = TestRedis::own();
    within(LIMIT, async {
        let client = redis.client();
        let mut conn = redis.conn().await;
        // Commands the server runs per cycle (the two script calls and what they run): the
        // general path ran 15 to 17.
        for (kind, name, most) in [
            (Kind::Fair, "fair", 11),
            (Kind::Write, "write", 11),
            (Kind::Read, "read", 13),
            (Kind::Semaphore, "sem", 13),
        ] {
            // Scripts loaded, connections made.
            cycle(&client, &kind, name).await;
            let before = commandstats(&mut conn).await.unwrap();
            let mut tokens = Vec::new();
            for _ in 0..20 {
                tokens.push(cycle(&client, &kind, name).await);
            }
            let after = commandstats(&mut conn).await.unwrap();
            let per_cycle = server_commands(&before, &after) / 20;
            assert!(
                per_cycle <= most,
                "{name}: {per_cycle} commands a cycle, over {most}"
            );
            if !matches!(kind, Kind::Read) {
                assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{name}: {tokens:?}");
            }
        }
        assert_eq!(redis.leftovers().await, Vec::<String>::new());
    })
    .await;
}

#[tokio::test]
async fn tokens_rise_across_the_fast_path_and_the_queue() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let (a, b) = (redis.client(), redis.client());
        let name = "mixed";
        // Taken on the fast path (the name is idle).
        let first = a.fair_mutex(name).unwrap().lock().await.unwrap();
        let t1 = first.fencing_token();
        assert_eq!(a.inspect(name).await.unwrap().last_fencing_token, Some(t1));
        // A waiter queues behind it (the general path) and is handed the lock by its release.
        let waiter = tokio::spawn({
            let mutex = b.fair_mutex(name).unwrap();
            async move { mutex.lock().await.unwrap() }
        });
        until(|| async { redis.queued(&a, name).await == 1 }).await;
        first.unlock().await.unwrap();
        let second = waiter.await.unwrap();
        let t2 = second.fencing_token();
        assert!(t2 > t1, "{t1} then {t2}");
        second.unlock().await.unwrap();
        assert_eq!(redis.leftovers().await, Vec::<String>::new());
        // Idle again: the fast path reads the token the hand-over issued.
        let third = a.fair_mutex(name).unwrap().lock().await.unwrap();
        let t3 = third.fencing_token();
        assert!(t3 > t2, "{t2} then {t3}");
        assert_eq!(a.inspect(name).await.unwrap().last_fencing_token, Some(t3));
        third.unlock().await.unwrap();
        assert_eq!(redis.leftovers().await, Vec::<String>::new());
        // The counter is all that is left, with the last token, and it expires.
        let mut conn = redis.conn().await;
        let fence = format!("{}:fence", redis.lock_key(name));
        let (last, ttl): (u64, i64) = redis::pipe()
            .get(&fence)
            .pttl(&fence)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(last, t3);
        assert!(ttl > 0, "the counter's TTL: {ttl}");
    })
    .await;
}

#[tokio::test]
async fn permits_and_readers_taken_on_the_fast_path_count_with_the_rest() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let client = redis.client();
        let sem = client.semaphore("permits", 2).unwrap();
        // The first permit on the fast path, the second on the general path.
        let p1 = sem.acquire().await.unwrap();
        let p2 = sem.acquire().await.unwrap();
        assert!(p2.fencing_token() > p1.fencing_token());
        assert_eq!(sem.available_permits().await.unwrap(), 0);
        assert!(sem.try_acquire().await.unwrap().is_none());
        // The last holder's release goes through the general path (another holds), then the
        // fast path (the last one).
        p1.release().await.unwrap();
        assert_eq!(sem.available_permits().await.unwrap(), 1);
        p2.release().await.unwrap();
        assert_eq!(sem.available_permits().await.unwrap(), 2);
        assert_eq!(redis.leftovers().await, Vec::<String>::new());

        // A reader on the fast path keeps a writer out; a second reader joins it.
        let rw = client.rwlock("rw").unwrap();
        let r1 = rw.read().await.unwrap();
        assert!(rw.try_write().await.unwrap().is_none());
        let r2 = rw.read().await.unwrap();
        r1.unlock().await.unwrap();
        assert!(rw.try_write().await.unwrap().is_none());
        r2.unlock().await.unwrap();
        let w = rw
            .try_write()
            .await
            .unwrap()
            .expect("free after both readers");
        w.unlock().await.unwrap();
        assert_eq!(redis.leftovers().await, Vec::<String>::new());
    })
    .await;
}
