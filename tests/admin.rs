//! `LockClient::force_unlock`: an administrator ends every hold and queue place of a name.

mod support;

use std::time::Duration;

use redlatch::{Error, LockKind};
use support::{TestRedis, within};

const LIMIT: Duration = Duration::from_secs(60);

/// How many clients listen on the wake-up channel of the mutex `name`.
async fn listeners(redis: &TestRedis, name: &str) -> u64 {
    let mut conn = redis.conn().await;
    let (_, n): (String, u64) = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(format!("{}:wake", redis.lock_key(name)))
        .query_async(&mut conn)
        .await
        .unwrap();
    n
}

#[tokio::test]
async fn force_unlock_frees_a_held_mutex_and_wakes_its_waiter() {
    // Our own server: the test counts every script call on it.
    let redis = TestRedis::own();
    within(LIMIT, async {
        // A long fixed lease, never renewed: a waiter that is not woken would wait for its end
        // (its fallback timer), long past its own 10 s timeout.
        let stuck = redis.client();
        let guard = stuck
            .mutex("job")
            .unwrap()
            .with_lease(Duration::from_secs(30))
            .unwrap()
            .lock()
            .await
            .unwrap();
        let lost = guard.lost();
        let calls = redis.calls("evalsha").await;
        let other = redis.client();
        let waiter = tokio::spawn({
            let mutex = other.mutex("job").unwrap();
            async move { mutex.lock_timeout(Duration::from_secs(10)).await }
        });
        // Blocked for sure: it listens for wake-ups, and both its attempts (before and after
        // subscribing) were refused. A plain mutex's waiters queue in their client, so
        // `inspect` does not show them.
        support::until(|| async {
            listeners(&redis, "job").await > 0 && redis.calls("evalsha").await >= calls + 2
        })
        .await;
        assert!(!waiter.is_finished(), "the waiter got a held lock");
        let admin = redis.client();
        let removed = admin.force_unlock("job").await.unwrap();
        assert_eq!(removed.kind, Some(LockKind::Mutex));
        assert_eq!((removed.holders, removed.waiters), (1, 0));
        // The waiter was told and took the lock, with a later token.
        let next = waiter
            .await
            .unwrap()
            .expect("force_unlock woke the waiter long before the holder's lease would end");
        assert!(next.fencing_token() > guard.fencing_token());
        // The old holder finds out at its next contact with Redis.
        assert!(matches!(
            guard.extend(Duration::from_secs(30)).await,
            Err(Error::NotHeld { .. })
        ));
        lost.await;
        assert!(!guard.is_held());
        next.unlock().await.unwrap();
        drop(guard);
        support::until(|| async { redis.leftovers().await.is_empty() }).await;
        // Nothing stored: nothing removed.
        let removed = admin.force_unlock("job").await.unwrap();
        assert_eq!(
            (removed.kind, removed.holders, removed.waiters),
            (None, 0, 0)
        );
    })
    .await;
}

#[tokio::test]
async fn force_unlock_empties_a_fair_queue_and_its_waiters_queue_again() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let stuck = redis
            .builder()
            .default_lease(Duration::from_millis(300))
            .build()
            .unwrap();
        let guard = stuck.fair_mutex("queue").unwrap().lock().await.unwrap();
        let token = guard.fencing_token();
        let client = redis.client();
        let mut waiters = Vec::new();
        for _ in 0..2 {
            let mutex = client.fair_mutex("queue").unwrap();
            waiters.push(tokio::spawn(async move {
                let g = mutex.lock().await.unwrap();
                let token = g.fencing_token();
                g.unlock().await.unwrap();
                token
            }));
        }
        support::until(|| async { redis.queued(&client, "queue").await == 2 }).await;
        let wake = format!("{}:wake", redis.lock_key("queue"));
        let mut listen = redis.listener().await;
        listen.psubscribe(&format!("{wake}*")).await;
        let removed = client.force_unlock("queue").await.unwrap();
        assert_eq!(removed.kind, Some(LockKind::FairMutex));
        assert_eq!((removed.holders, removed.waiters), (1, 2));
        // Both waiters are asked to look again, as `client/owner`, on their client's channel
        // (the waiters may queue again and be told more after it).
        let heard = listen.heard().await;
        let (channel, told) = heard.first().expect("the waiters were told");
        let entries: Vec<&str> = told.split(' ').collect();
        assert_eq!(entries.len(), 2, "{told}");
        for entry in entries {
            let (waiter_client, owner) = entry.split_once('/').expect("client/owner");
            assert_eq!(*channel, format!("{wake}:{waiter_client}"));
            assert!(!owner.is_empty() && !owner.contains(':'), "{entry}");
        }
        for w in waiters {
            // Tokens keep rising across the removal: the counter survived it.
            assert!(w.await.unwrap() > token);
        }
        guard.lost().await;
        drop(guard);
        support::until(|| async { redis.leftovers().await.is_empty() }).await;
    })
    .await;
}

#[tokio::test]
async fn force_unlock_leaves_data_it_does_not_own_alone() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let client = redis.client();
        let mut conn = redis.conn().await;
        let key = redis.lock_key("theirs");
        let _: () = redis::cmd("SET")
            .arg(&key)
            .arg("x")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(matches!(
            client.force_unlock("theirs").await,
            Err(Error::WrongType { .. })
        ));
        let other = redis.lock_key("hash");
        let _: () = redis::cmd("HSET")
            .arg(&other)
            .arg("field")
            .arg("1")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(matches!(
            client.force_unlock("hash").await,
            Err(Error::Layout { .. })
        ));
        let kept: u64 = redis::cmd("EXISTS")
            .arg(&key)
            .arg(&other)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(kept, 2);
    })
    .await;
}

/// A string of the thin form's shape under another layout (a newer version's hold, or another
/// program's data) is refused and left as it was.
#[tokio::test]
async fn force_unlock_leaves_a_thin_string_of_an_unknown_layout_alone() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let client = redis.client();
        let mut conn = redis.conn().await;
        let key = redis.lock_key("next");
        let value = "fair:2 x 1 0 1795804146565348 ownerZ";
        let _: () = redis::cmd("SET")
            .arg(&key)
            .arg(value)
            .arg("PX")
            .arg(60_000)
            .query_async(&mut conn)
            .await
            .unwrap();
        let refused = client.force_unlock("next").await;
        assert!(matches!(refused, Err(Error::Layout { .. })), "{refused:?}");
        let kept: Option<String> = redis::cmd("GET")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(kept.as_deref(), Some(value));
        let _: () = redis::cmd("DEL")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
    })
    .await;
}

/// A writer that also holds the lock for reading is one owner: one holder removed.
#[tokio::test]
async fn force_unlock_counts_each_owner_once() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let client = redis.client();
        let rw = client.rwlock("both").unwrap();
        let write = rw.write().await.unwrap();
        let read = rw.read_as(write.owner()).await.unwrap();
        let removed = client.force_unlock("both").await.unwrap();
        assert_eq!(removed.kind, Some(LockKind::RwLock));
        assert_eq!((removed.holders, removed.waiters), (1, 0));
        drop((read, write));
        support::until(|| async { redis.leftovers().await.is_empty() }).await;
    })
    .await;
}

/// An election's observers are told when `force_unlock` deposes its leader, at once, not when
/// the leader's lease would have run out.
#[tokio::test]
async fn force_unlock_tells_an_elections_observers() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        use futures_util::StreamExt;
        let leader_client = redis.client();
        let watcher = redis.client();
        let mut changes = watcher.election("led").unwrap().observe().await.unwrap();
        assert_eq!(changes.next().await.unwrap().unwrap(), None);
        // The default lease, 30 s: an observer not told would show the leader that long.
        let leadership = leader_client
            .election("led")
            .unwrap()
            .campaign("here")
            .await
            .unwrap();
        let shown = changes.next().await.unwrap().unwrap().unwrap();
        assert_eq!(shown.value, "here");
        // The observer reads the election once, 5 ms after a new leader's record, to learn its
        // lease: that read (made while the stream is polled) must be behind us, or it would see
        // the name freed on its own. Time is the point here.
        let quiet = tokio::time::timeout(Duration::from_millis(500), changes.next()).await;
        assert!(quiet.is_err(), "nothing changed: {quiet:?}");
        let removed = watcher.force_unlock("led").await.unwrap();
        assert_eq!(removed.kind, Some(LockKind::Election));
        let told = tokio::time::timeout(Duration::from_secs(10), changes.next())
            .await
            .expect("the observer still shows the deposed leader 10 s later");
        assert_eq!(told.unwrap().unwrap(), None);
        drop(leadership);
    })
    .await;
}
