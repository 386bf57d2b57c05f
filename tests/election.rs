//! Leader election: candidates of many clients lead in FIFO order with strictly rising terms,
//! observers see every change in order, a leader cut off from Redis learns `lost()` and its
//! term is refused by a fenced store once the next leader wrote, and nothing is left behind.

mod support;

use std::time::Duration;

use futures_util::StreamExt;
use redlatch::{Error, Leader, LeaderStream, LockKind};
use redlatch_harness::proxy::Mode;
use redlatch_harness::resource::Resource;
use support::{TestRedis, until, within};
use tokio::sync::mpsc;

const LIMIT: Duration = Duration::from_secs(60);

/// Collects an observer's items until `last` has been seen and then nobody leads.
async fn watch_until(mut stream: LeaderStream, last: String) -> Vec<Option<Leader>> {
    let mut seen = Vec::new();
    let mut done = false;
    while let Some(item) = stream.next().await {
        let item = item.expect("observer item");
        if item.as_ref().is_some_and(|l| l.value == last) {
            done = true;
        } else if done && item.is_none() {
            seen.push(item);
            break;
        }
        seen.push(item);
    }
    seen
}

#[tokio::test]
async fn candidates_lead_in_turn_and_observers_see_every_change_in_order() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let clients: Vec<_> = (0..5).map(|_| redis.client()).collect();
        let observers: Vec<_> = (0..2).map(|_| redis.client()).collect();
        let mut streams = Vec::new();
        for o in &observers {
            let mut stream = o.election("jobs").unwrap().observe().await.unwrap();
            // The first item is the present: nobody leads yet.
            assert_eq!(stream.next().await.unwrap().unwrap(), None);
            streams.push(tokio::spawn(watch_until(stream, "c4 serving".to_owned())));
        }

        // Candidate 0 leads; 1..=4 queue behind it, in this order.
        let first = clients[0]
            .election("jobs")
            .unwrap()
            .campaign("c0")
            .await
            .unwrap();
        let (done_tx, mut done_rx) = mpsc::unbounded_channel();
        let mut tasks = Vec::new();
        for (i, client) in clients.iter().enumerate().skip(1) {
            let election = client.election("jobs").unwrap();
            let done = done_tx.clone();
            tasks.push(tokio::spawn(async move {
                let mut leadership = election.campaign(format!("c{i}")).await.unwrap();
                let term = leadership.term();
                leadership.proclaim(format!("c{i} serving")).await.unwrap();
                done.send((i, term)).unwrap();
                leadership.resign().await.unwrap();
            }));
            until(|| async { redis.queued(client, "jobs").await == i }).await;
        }
        let snapshot = clients[0].inspect("jobs").await.unwrap();
        assert_eq!(snapshot.kind, Some(LockKind::Election));
        assert_eq!(snapshot.holders.len(), 1);
        assert_eq!(snapshot.waiters.len(), 4);
        let leader = clients[3].election("jobs").unwrap().leader().await.unwrap();
        assert_eq!(
            leader.map(|l| (l.term, l.value)),
            Some((first.term(), "c0".to_owned()))
        );

        let mut first = first;
        first.proclaim("c0 serving").await.unwrap();
        let first_term = first.term();
        first.resign().await.unwrap();
        drop(done_tx);
        let mut order = vec![(0, first_term)];
        while let Some(led) = done_rx.recv().await {
            order.push(led);
        }
        for t in tasks {
            t.await.unwrap();
        }
        // FIFO: the candidates led in the order they stood, with strictly rising terms.
        assert_eq!(
            order.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
            [0, 1, 2, 3, 4]
        );
        assert!(order.windows(2).all(|w| w[0].1 < w[1].1), "{order:?}");

        // Every observer saw every record, in order: each leader's first value, then its
        // second; between leaders, nobody (the resignation).
        let expected: Vec<(u64, String)> = order
            .iter()
            .flat_map(|(i, term)| [(*term, format!("c{i}")), (*term, format!("c{i} serving"))])
            .collect();
        for stream in streams {
            let seen = stream.await.unwrap();
            let records: Vec<(u64, String)> = seen
                .iter()
                .flatten()
                .map(|l| (l.term, l.value.clone()))
                .collect();
            assert_eq!(records, expected, "{seen:?}");
            assert!(seen.windows(2).all(|w| w[0] != w[1]), "{seen:?}");
            assert_eq!(seen.last(), Some(&None));
        }
        assert_eq!(
            clients[1].election("jobs").unwrap().leader().await.unwrap(),
            None
        );
        until(|| async { redis.leftovers().await.is_empty() }).await;
    })
    .await;
}

#[tokio::test]
async fn an_observer_sees_a_silent_leader_go_when_its_own_lease_ends() {
    let redis = TestRedis::own();
    within(LIMIT, async {
        // The observer's handle has the default lease (30 s); the leader's is 1 s.
        let (proxy, builder) = redis.through_proxy().await;
        let cut = builder.build().unwrap();
        let watcher = redis.client();
        let mut changes = watcher.election("quiet").unwrap().observe().await.unwrap();
        assert_eq!(changes.next().await.unwrap().unwrap(), None);
        let leader = cut
            .election("quiet")
            .unwrap()
            .with_lease(Duration::from_secs(1))
            .unwrap()
            .campaign("here")
            .await
            .unwrap();
        let shown = changes.next().await.unwrap().unwrap().unwrap();
        assert_eq!(shown.value, "here");
        // Cut off, it renews nothing and publishes nothing: its lease runs out in Redis.
        proxy.set(Mode::Blackhole);
        let gone = tokio::time::timeout(Duration::from_secs(10), changes.next())
            .await
            .expect("the observer still shows the leader 10 s after its 1 s lease stopped being renewed");
        assert_eq!(gone.unwrap().unwrap(), None);
        drop(leader);
        until(|| async { redis.leftovers().await.is_empty() }).await;
    })
    .await;
}

/// A leader steps down (`step_down`) after its open connections stopped carrying anything (new
/// ones pass): an observer must be told within 15 s, not at the end of the default 30 s lease
/// (from which it learns nothing here).
async fn steps_down_through_a_stranded_connection<F, Fut>(name: &str, step_down: F)
where
    F: FnOnce(redlatch::Leadership) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let redis = TestRedis::own();
    within(LIMIT, async {
        let (proxy, builder) = redis.through_proxy().await;
        let cut = builder.build().unwrap();
        let watcher = redis.client();
        let mut changes = watcher.election(name).unwrap().observe().await.unwrap();
        assert_eq!(changes.next().await.unwrap().unwrap(), None);
        let leader = cut.election(name).unwrap().campaign("here").await.unwrap();
        let shown = changes.next().await.unwrap().unwrap().unwrap();
        assert_eq!(shown.value, "here");
        proxy.set(Mode::Strand);
        step_down(leader).await;
        let gone = tokio::time::timeout(Duration::from_secs(15), changes.next())
            .await
            .expect("the observer still shows the leader 15 s later");
        assert_eq!(gone.unwrap().unwrap(), None);
        until(|| async { redis.leftovers().await.is_empty() }).await;
    })
    .await;
}

/// Found by review: a dropped leadership wrote its resignation once, and a connection that
/// failed then (the leader's own network) lost it for good: observers went on showing the old
/// leader until its lease ran out, though the hold was released soon after.
#[tokio::test]
async fn a_dropped_leaders_resignation_gets_through_a_stranded_connection() {
    steps_down_through_a_stranded_connection("stranded", |leader| async move { drop(leader) })
        .await;
}

/// As a dropped leadership's: a resignation whose connection carries nothing is told again on a
/// new one, and `resign` succeeds.
#[tokio::test]
async fn a_resignation_gets_through_a_stranded_connection() {
    steps_down_through_a_stranded_connection("resigned", |leader| async move {
        leader.resign().await.expect("resigned on a new connection");
    })
    .await;
}

/// An observer that fell behind a leadership (its buffer full) reads the name idle once the
/// leader resigned: the messages of that leadership still buffered are past, and never shown
/// after "nobody leads".
#[tokio::test]
async fn an_observer_that_fell_behind_never_shows_an_ended_leadership_after_nobody() {
    let redis = TestRedis::own();
    within(LIMIT, async {
        let client = redis.client();
        let election = client.election("behind").unwrap();
        let mut changes = election.observe().await.unwrap();
        assert_eq!(changes.next().await.unwrap().unwrap(), None);
        let mut leadership = election.campaign("v0").await.unwrap();
        let term = leadership.term();
        assert_eq!(changes.next().await.unwrap().unwrap().unwrap().value, "v0");
        // More messages than the observer keeps, none of them read yet.
        for i in 1..=300 {
            leadership.proclaim(&format!("v{i}")).await.unwrap();
        }
        leadership.resign().await.unwrap();
        let mut shown = Vec::new();
        loop {
            let change = changes.next().await.unwrap().unwrap();
            let nobody = change.is_none();
            shown.push(change);
            if nobody {
                break;
            }
        }
        assert!(
            shown.iter().flatten().all(|leader| leader.term == term),
            "{shown:?}"
        );
        let next = election.campaign("after").await.unwrap();
        // The next change is the new leader: nothing of the leadership that ended.
        match changes.next().await.unwrap().unwrap() {
            Some(leader) if leader.value == "after" => assert!(leader.term > term),
            other => panic!("shown after nobody led: {other:?}"),
        }
        next.resign().await.unwrap();
        drop(changes);
        until(|| async { redis.leftovers().await.is_empty() }).await;
    })
    .await;
}

#[tokio::test]
async fn a_cut_off_leader_learns_lost_and_its_term_is_refused_by_a_fenced_store() {
    let redis = TestRedis::own();
    within(LIMIT, async {
        let lease = Duration::from_secs(1);
        let (proxy, builder) = redis.through_proxy().await;
        let cut = builder.build().unwrap();
        let other = redis.client();
        let watcher = redis.client();
        let store = Resource::new(&redis.prefix, "store");
        let mut conn = redis.conn().await;

        let mut changes = watcher
            .election("svc")
            .unwrap()
            .with_lease(lease)
            .unwrap()
            .observe()
            .await
            .unwrap();
        assert_eq!(changes.next().await.unwrap().unwrap(), None);

        let old = cut
            .election("svc")
            .unwrap()
            .with_lease(lease)
            .unwrap()
            .campaign("old")
            .await
            .unwrap();
        assert!(store.fenced_write(&mut conn, old.term()).await.unwrap());
        let next = {
            let election = other.election("svc").unwrap().with_lease(lease).unwrap();
            tokio::spawn(async move { election.campaign("new").await })
        };
        until(|| async { redis.queued(&other, "svc").await == 1 }).await;

        // The old leader is cut off (as a paused process would be): it cannot renew, learns
        // that its lease is lost, and the queued candidate leads once the lease ran out.
        proxy.set(Mode::Blackhole);
        old.lost().await;
        assert!(!old.is_held());
        let new = next.await.unwrap().unwrap();
        assert!(new.term() > old.term());
        assert!(store.fenced_write(&mut conn, new.term()).await.unwrap());
        // The old leader's late write carries its old term: refused.
        assert!(!store.fenced_write(&mut conn, old.term()).await.unwrap());

        // The observer saw the old leader, then the new one (maybe nobody between).
        let mut records = Vec::new();
        while records.len() < 2 {
            if let Some(l) = changes.next().await.unwrap().unwrap() {
                records.push((l.term, l.value));
            }
        }
        assert_eq!(
            records,
            [
                (old.term(), "old".to_owned()),
                (new.term(), "new".to_owned())
            ]
        );

        // Healed, the old leader's proclaim and resign are refused: it does not lead.
        proxy.set(Mode::Pass);
        let mut old = old;
        assert!(matches!(
            old.proclaim("still me?").await,
            Err(Error::NotHeld { .. })
        ));
        assert!(old.resign().await.is_err());
        let leader = other.election("svc").unwrap().leader().await.unwrap();
        assert_eq!(leader.map(|l| l.value), Some("new".to_owned()));
        new.resign().await.unwrap();
        assert_eq!(changes.next().await.unwrap().unwrap(), None);
        until(|| async {
            redis
                .leftovers()
                .await
                .iter()
                .all(|k| k.contains(":resource:"))
        })
        .await;
    })
    .await;
}

#[tokio::test]
async fn a_resign_cancelled_before_its_request_was_sent_still_tells_observers() {
    let redis = TestRedis::own();
    within(LIMIT, async {
        // The leader's handle keeps the default lease (30 s): an observer not told of the
        // resignation would show it for that long.
        let (proxy, builder) = redis.through_proxy().await;
        let cut = builder.build().unwrap();
        let watcher = redis.client();
        let mut changes = watcher.election("gone").unwrap().observe().await.unwrap();
        assert_eq!(changes.next().await.unwrap().unwrap(), None);
        let election = cut.election("gone").unwrap();
        let leadership = election.campaign("here").await.unwrap();
        let shown = changes.next().await.unwrap().unwrap().unwrap();
        assert_eq!(shown.value, "here");
        // The leader's client gives up its connection (a reply lost), and its next one cannot
        // get through: the resignation is cancelled while it waits for a connection, before
        // its request was sent.
        proxy.lose_next_reply();
        assert!(election.leader().await.is_err());
        assert_eq!(proxy.replies_lost(), 1);
        proxy.set(Mode::Blackhole);
        let cancelled = tokio::time::timeout(Duration::from_millis(300), leadership.resign()).await;
        assert!(
            cancelled.is_err(),
            "the resignation got through the blackhole"
        );
        proxy.set(Mode::Pass);
        let told = tokio::time::timeout(Duration::from_secs(10), changes.next())
            .await
            .expect("the observer still shows the leader 10 s after its resignation was cancelled");
        assert_eq!(told.unwrap().unwrap(), None);
        assert_eq!(election.leader().await.unwrap(), None);
        until(|| async { redis.leftovers().await.is_empty() }).await;
    })
    .await;
}

/// Found by review: a resignation whose record was written but whose release was cancelled
/// before it was sent (the connection was being made again) released nothing: observers were
/// told nobody leads, while the name stayed taken, and no candidate could lead, for the rest of
/// the lease.
#[tokio::test]
async fn a_resign_cancelled_before_its_release_was_sent_still_releases() {
    let redis = TestRedis::own();
    within(LIMIT, async {
        // The leader's handle keeps the default lease (30 s): a release never sent would keep
        // the next candidate out for that long.
        let (proxy, builder) = redis.through_proxy().await;
        let cut = builder.build().unwrap();
        let other = redis.client();
        let leadership = cut
            .election("left")
            .unwrap()
            .campaign("here")
            .await
            .unwrap();
        // The record is written and its answer lost; the connection made again for the release
        // cannot get through: the resignation is cancelled while it waits for it.
        proxy.lose_next_reply_then(Mode::Blackhole);
        let cancelled = tokio::time::timeout(Duration::from_millis(300), leadership.resign()).await;
        assert!(cancelled.is_err(), "the release got through the blackhole");
        assert_eq!(proxy.replies_lost(), 1);
        proxy.set(Mode::Pass);
        let next = other
            .election("left")
            .unwrap()
            .campaign_timeout("next", Duration::from_secs(10))
            .await
            .expect("the name still taken 10 s after the resignation was cancelled");
        next.resign().await.unwrap();
        until(|| async { redis.leftovers().await.is_empty() }).await;
    })
    .await;
}

#[tokio::test]
async fn a_dropped_leadership_resigns_and_the_next_candidate_leads() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let a = redis.client();
        let b = redis.client();
        let mut changes = b.election("e").unwrap().observe().await.unwrap();
        assert_eq!(changes.next().await.unwrap().unwrap(), None);
        let first = a.election("e").unwrap().campaign("a").await.unwrap();
        let term = first.term();
        let next = {
            let election = b.election("e").unwrap();
            tokio::spawn(async move { election.campaign("b").await })
        };
        until(|| async { redis.queued(&b, "e").await == 1 }).await;
        drop(first);
        let second = next.await.unwrap().unwrap();
        assert!(second.term() > term);
        let mut seen = Vec::new();
        while seen.len() < 3 {
            seen.push(changes.next().await.unwrap().unwrap());
        }
        assert_eq!(
            seen.iter()
                .map(|l| l.as_ref().map(|l| l.value.as_str()))
                .collect::<Vec<_>>(),
            [Some("a"), None, Some("b")]
        );
        drop(second);
        assert_eq!(changes.next().await.unwrap().unwrap(), None);
        until(|| async { redis.leftovers().await.is_empty() }).await;
    })
    .await;
}

#[tokio::test]
async fn an_observer_ends_with_a_typed_error_when_its_subscription_is_lost() {
    let redis = TestRedis::own();
    within(LIMIT, async {
        let client = redis.client();
        let mut changes = client.election("e").unwrap().observe().await.unwrap();
        assert_eq!(changes.next().await.unwrap().unwrap(), None);
        let mut conn = redis.conn().await;
        let killed: i64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("pubsub")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(killed >= 1);
        assert!(matches!(
            changes.next().await,
            Some(Err(Error::Unsubscribed { ref name })) if name == "e"
        ));
        assert!(changes.next().await.is_none());
    })
    .await;
}

#[tokio::test]
async fn bad_values_and_foreign_data_are_refused_and_left_unchanged() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let client = redis.client();
        let election = client.election("e").unwrap();
        let too_long = "x".repeat(redlatch::MAX_LEADER_VALUE + 1);
        assert!(matches!(
            election.campaign(too_long.clone()).await,
            Err(Error::InvalidArgument { .. })
        ));
        let mut leadership = election.campaign("v1").await.unwrap();
        assert!(matches!(
            leadership.proclaim(too_long).await,
            Err(Error::InvalidArgument { .. })
        ));
        assert_eq!(leadership.value(), "v1");
        assert_eq!(
            election.leader().await.unwrap().map(|l| l.value),
            Some("v1".to_owned())
        );
        // The name is an election: the fair mutex of the same name is refused, and the other
        // way round.
        assert!(matches!(
            client.fair_mutex("e").unwrap().try_lock().await,
            Err(Error::Layout { .. })
        ));
        leadership.resign().await.unwrap();
        let fair = client.fair_mutex("f").unwrap().lock().await.unwrap();
        assert!(matches!(
            client.election("f").unwrap().leader().await,
            Err(Error::Layout { .. })
        ));
        assert!(matches!(
            client.election("f").unwrap().campaign("x").await,
            Err(Error::Layout { .. })
        ));
        fair.unlock().await.unwrap();
        // The same for a name held as a plain mutex (a string under the name's key) and for a
        // fair mutex taken in plain commands (its thin form, a string too): another primitive,
        // not foreign data.
        let plain = client.mutex("m").unwrap().lock().await.unwrap();
        assert!(matches!(
            client.election("m").unwrap().leader().await,
            Err(Error::Layout { found, .. }) if found == "mutex:2"
        ));
        plain.unlock().await.unwrap();
        let thin = client.fair_mutex("t").unwrap();
        // Seen free once: the next acquisition takes it in plain commands.
        thin.lock().await.unwrap().unlock().await.unwrap();
        let held = thin.lock().await.unwrap();
        let mut conn = redis.conn().await;
        let kind: String = redis::cmd("TYPE")
            .arg(format!("{}:{{t}}", redis.prefix))
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(kind, "string", "the fair mutex's thin form");
        assert!(matches!(
            client.election("t").unwrap().leader().await,
            Err(Error::Layout { found, .. }) if found == "fair:1"
        ));
        held.unlock().await.unwrap();
        // A leader whose name an administrator freed, and a plain mutex then took: its
        // proclaim finds another primitive's string, so it no longer leads.
        let mut ousted = client.election("o").unwrap().campaign("v").await.unwrap();
        client.force_unlock("o").await.unwrap();
        let taker = client.mutex("o").unwrap().lock().await.unwrap();
        assert!(matches!(
            ousted.proclaim("w").await,
            Err(Error::NotHeld { .. })
        ));
        assert_eq!(ousted.value(), "v");
        taker.unlock().await.unwrap();
        drop(ousted);
        // The same when a queued primitive's state took the name (a semaphore's hash).
        let mut ousted = client.election("q").unwrap().campaign("v").await.unwrap();
        client.force_unlock("q").await.unwrap();
        let sem = client.semaphore("q", 2).unwrap();
        let permit = sem.acquire().await.unwrap();
        let kind: String = redis::cmd("TYPE")
            .arg(format!("{}:{{q}}", redis.prefix))
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(kind, "hash", "the semaphore's state");
        assert!(matches!(
            ousted.proclaim("w").await,
            Err(Error::NotHeld { .. })
        ));
        assert!(!ousted.is_held());
        permit.release().await.unwrap();
        drop(ousted);

        // Data redlatch did not write: refused, and left exactly as it was.
        let key = format!("{}:{{users}}", redis.prefix);
        let _: () = redis::cmd("SET")
            .arg(&key)
            .arg("alice")
            .query_async(&mut conn)
            .await
            .unwrap();
        let users = client.election("users").unwrap();
        assert!(matches!(users.leader().await, Err(Error::WrongType { .. })));
        assert!(matches!(
            users.campaign("x").await,
            Err(Error::WrongType { .. })
        ));
        let value: String = redis::cmd("GET")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(value, "alice");
        let _: () = redis::cmd("DEL")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
        until(|| async { redis.leftovers().await.is_empty() }).await;
    })
    .await;
}

#[tokio::test]
async fn force_unlock_deposes_a_leader() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let client = redis.client();
        let leadership = client.election("e").unwrap().campaign("v").await.unwrap();
        let removed = client.force_unlock("e").await.unwrap();
        assert_eq!(removed.kind, Some(LockKind::Election));
        assert_eq!(removed.holders, 1);
        assert_eq!(client.election("e").unwrap().leader().await.unwrap(), None);
        // The deposed leader finds out at its next renewal, or when it speaks.
        let mut leadership = leadership;
        assert!(matches!(
            leadership.proclaim("w").await,
            Err(Error::NotHeld { .. })
        ));
        assert!(!leadership.is_held());
        tokio::time::timeout(Duration::from_secs(5), leadership.lost())
            .await
            .expect("a leader told it was deposed is lost at once, not at its next renewal");
        drop(leadership);
        until(|| async { redis.leftovers().await.is_empty() }).await;
    })
    .await;
}

/// Found by review: on a client built with `watchdog(false)` a leadership was never renewed:
/// the leader was deposed at the end of every lease, and has no `extend` to keep it.
#[tokio::test]
async fn a_leadership_is_renewed_with_the_watchdog_off() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let client = redis
            .builder()
            .default_lease(Duration::from_secs(2))
            .watchdog(false)
            .build()
            .unwrap();
        let leadership = client
            .election("kept")
            .unwrap()
            .campaign("me")
            .await
            .unwrap();
        let mut lost = std::pin::pin!(leadership.lost());
        tokio::select! {
            () = &mut lost => panic!("the leadership was not renewed"),
            () = tokio::time::sleep(Duration::from_secs(5)) => {}
        }
        let seen = redis
            .client()
            .election("kept")
            .unwrap()
            .leader()
            .await
            .unwrap();
        assert_eq!(seen.map(|l| l.value).as_deref(), Some("me"));
        leadership.resign().await.unwrap();
        until(|| async { redis.leftovers().await.is_empty() }).await;
    })
    .await;
}

/// A leader of `lapsed` through a proxy with a lease of `lease`, lost at its deadline: its
/// renewals reached Redis, their answers held back (the proxy still holds them), so Redis holds
/// the name on for more than 1.5 s.
async fn lapsed_leader(
    redis: &TestRedis,
    lease: Duration,
) -> (
    redlatch_harness::proxy::Proxy,
    redlatch::LockClient,
    redlatch::Leadership,
) {
    let (proxy, builder) = redis.through_proxy().await;
    let cut = builder.default_lease(lease).build().unwrap();
    let leadership = cut
        .election("lapsed")
        .unwrap()
        .campaign("here")
        .await
        .unwrap();
    proxy.set(Mode::HoldReplies);
    leadership.lost().await;
    // What makes the case: the renewals that reached Redis hold the name on.
    let left = redis.exclusive_lease_left("lapsed").await;
    assert!(
        left > Duration::from_millis(1500),
        "{left:?} left in Redis when lost"
    );
    (proxy, cut, leadership)
}

/// Found by review: a leadership marked lost at its deadline (its renewals' answers never came)
/// may still be held in Redis, and `proclaim` went to Redis without looking: it wrote the lost
/// leader's new value for every observer to see, and `resign` said it stepped down.
#[tokio::test]
async fn a_lost_leader_can_neither_proclaim_nor_resign() {
    let redis = TestRedis::own();
    within(LIMIT, async {
        let (proxy, _cut, mut leadership) = lapsed_leader(&redis, Duration::from_secs(9)).await;
        let other = redis.client();
        proxy.set(Mode::Pass);
        let proclaimed = loop {
            match leadership.proclaim("after lost").await {
                Err(err) if err.is_connection() => continue,
                other => break other,
            }
        };
        assert!(
            matches!(proclaimed, Err(Error::NotHeld { .. })),
            "{proclaimed:?}"
        );
        let seen = other.election("lapsed").unwrap().leader().await.unwrap();
        assert_eq!(seen.map(|l| l.value).as_deref(), Some("here"));
        // Resigning still lets the name go (it may be held in Redis), and says it was lost.
        let left = redis.exclusive_lease_left("lapsed").await;
        assert!(left > Duration::from_millis(1500), "{left:?} left");
        let resigned = leadership.resign().await;
        assert!(
            matches!(resigned, Err(Error::NotHeld { .. })),
            "{resigned:?}"
        );
        let next = other
            .election("lapsed")
            .unwrap()
            .campaign_timeout("next", left - Duration::from_millis(1000))
            .await
            .expect("the name still taken: the lost leader's resignation let nothing go");
        next.resign().await.unwrap();
        until(|| async { redis.leftovers().await.is_empty() }).await;
    })
    .await;
}

/// Found by review: a leader lost at its deadline (renewals that reached Redis, their answers
/// lost) was not released when its leadership was dropped: the hold's owner counted as shared,
/// having been read for the leader's own record. Nobody could lead until the lease the
/// renewals set ran out.
#[tokio::test]
async fn a_leader_lost_at_its_deadline_is_released_when_dropped() {
    let redis = TestRedis::own();
    within(LIMIT, async {
        let (proxy, _cut, leadership) = lapsed_leader(&redis, Duration::from_secs(6)).await;
        let other = redis.client();
        let left = redis.exclusive_lease_left("lapsed").await;
        proxy.set(Mode::Pass);
        drop(leadership);
        let next = other
            .election("lapsed")
            .unwrap()
            .campaign_timeout("next", left - Duration::from_millis(1000))
            .await
            .expect("the name still taken: the lost leader was not released");
        next.resign().await.unwrap();
        until(|| async { redis.leftovers().await.is_empty() }).await;
    })
    .await;
}
