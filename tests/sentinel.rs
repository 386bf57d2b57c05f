//! Redis Sentinel: a master, a replica (its replication stream through a proxy the test can
//! cut) and three sentinels, all started for the test. A failover while locks are held and
//! waited for; the old master paused and resumed after the promotion (split brain), with and
//! without durability.
#![cfg(feature = "sentinel")]

mod support;

use std::time::{Duration, Instant};

use deadpool_redis::{Config, Runtime};
use redlatch::{Durability, Error, LockClient, LockClientBuilder};
use redlatch_harness::RedisServer;
use redlatch_harness::proxy::Mode;
use redlatch_harness::sentinel::Sentinels;
use support::replicated::Replicated;
use support::{until, within};

const LIMIT: Duration = Duration::from_secs(90);

/// A master, one replica that replicates through a proxy the test can cut, and three
/// sentinels.
struct Monitored {
    bed: Replicated,
    sentinels: Sentinels,
}

impl std::ops::Deref for Monitored {
    type Target = Replicated;

    fn deref(&self) -> &Replicated {
        &self.bed
    }
}

impl std::ops::DerefMut for Monitored {
    fn deref_mut(&mut self) -> &mut Replicated {
        &mut self.bed
    }
}

impl Monitored {
    async fn start() -> Self {
        let bed = Replicated::start().await;
        let port = bed.master.port();
        let sentinels = tokio::task::spawn_blocking(move || Sentinels::start("locks", port, 3, 1))
            .await
            .expect("join")
            .expect("sentinels");
        Self { bed, sentinels }
    }

    /// A client that finds the master through the sentinels.
    fn sentinel(&self) -> LockClientBuilder {
        LockClient::sentinel_builder(self.sentinels.urls(), self.sentinels.name())
            .key_prefix(&self.prefix)
    }

    /// Waits until `server` has the waiters of `name` subscribed: to the name's channel (a
    /// mutex's waiters) or to their client's channel of the name (a queued primitive's).
    async fn subscribed(&self, server: &RedisServer, name: &str) {
        let channels = format!("{}:{{{name}}}:wake*", self.prefix);
        let conn = self.conn(server).await;
        until(|| {
            let mut conn = conn.clone();
            let channels = channels.clone();
            async move {
                let active: Vec<String> = redis::cmd("PUBSUB")
                    .arg("CHANNELS")
                    .arg(&channels)
                    .query_async(&mut conn)
                    .await
                    .expect("PUBSUB");
                !active.is_empty()
            }
        })
        .await;
    }

    /// Waits for the sentinels to promote another server than the one on `old`: its port,
    /// and how long it took since `since`. (Blocks its runtime thread while it polls the
    /// sentinels.)
    fn failover(&self, old: u16, since: Instant) -> (u16, Duration) {
        let found = tokio::task::block_in_place(|| {
            self.sentinels
                .await_failover(old, since, Duration::from_secs(30))
        });
        found.expect("failover")
    }
}

/// The master dies while one hold is replicated, another is not (its write never reached the
/// replica), and waiters of both kinds wait for it: the waiters resume on the new master within
/// the failover time and a second, the unreplicated hold reports `lost()`, the replicated one
/// is still held, and the same client takes new locks without being rebuilt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_moves_requests_and_waiters_to_the_new_master() {
    within(LIMIT, async {
        let mut bed = Monitored::start().await;
        let old = bed.master.port();
        let holder = bed
            .sentinel()
            .default_lease(Duration::from_secs(3))
            .build()
            .expect("client");
        let waiter = bed.sentinel().build().expect("client");

        let known = holder
            .mutex("known")
            .expect("mutex")
            .lock()
            .await
            .expect("lock");
        let replica = bed.replica.port();
        until(|| async { bed.exists(&bed.replica, "known").await }).await;
        bed.link.set(Mode::Blackhole);
        let unknown = holder
            .mutex("unknown")
            .expect("mutex")
            .lock()
            .await
            .expect("lock");
        let fair = holder
            .fair_mutex("fair")
            .expect("fair")
            .lock()
            .await
            .expect("lock");
        assert!(
            !bed.exists(&bed.replica, "unknown").await,
            "the replication is cut"
        );

        let wait = |name: &'static str, fair: bool| {
            let waiter = waiter.clone();
            tokio::spawn(async move {
                let held = if fair {
                    let guard = waiter.fair_mutex(name).expect("fair").lock().await;
                    guard.map(|g| (g.fencing_token(), Instant::now(), g.unlock()))
                } else {
                    let guard = waiter.mutex(name).expect("mutex").lock().await;
                    guard.map(|g| (g.fencing_token(), Instant::now(), g.unlock()))
                };
                let (token, at, unlock) = held.expect("acquired after the failover");
                unlock.await.expect("unlock");
                (token, at)
            })
        };
        let plain_waiter = wait("unknown", false);
        let fair_waiter = wait("fair", true);
        bed.subscribed(&bed.master, "unknown").await;
        bed.subscribed(&bed.master, "fair").await;
        until(|| async { waiter.inspect("fair").await.expect("inspect").waiters.len() == 1 }).await;

        let killed = Instant::now();
        bed.master.kill();
        let (new, failover) = bed.failover(old, killed);
        assert_eq!(new, replica);
        let (plain_token, plain_at) = plain_waiter.await.expect("join");
        let (fair_token, fair_at) = fair_waiter.await.expect("join");
        let bound = failover + Duration::from_secs(1);
        println!(
            "failover {failover:?}; waiters resumed after {:?} (mutex), {:?} (fair mutex)",
            plain_at.duration_since(killed),
            fair_at.duration_since(killed)
        );
        for (what, at) in [("mutex", plain_at), ("fair mutex", fair_at)] {
            let resumed = at.duration_since(killed);
            assert!(
                resumed <= bound,
                "the {what} waiter resumed {resumed:?} after the kill; failover took {failover:?}"
            );
        }
        assert!(plain_token > unknown.fencing_token());
        assert!(fair_token > fair.fencing_token());

        // The holds the new master never had are lost; the one it had is kept.
        within(Duration::from_secs(10), unknown.lost()).await;
        within(Duration::from_secs(10), fair.lost()).await;
        known
            .extend(Duration::from_secs(3))
            .await
            .expect("renewed on the new master");
        assert!(known.is_held());

        // New locks, every kind, on the same client.
        let again = holder
            .mutex("after")
            .expect("mutex")
            .lock()
            .await
            .expect("lock");
        let permit = holder
            .semaphore("after-permits", 2)
            .expect("semaphore")
            .acquire()
            .await
            .expect("permit");
        let read = holder
            .rwlock("after-rw")
            .expect("rwlock")
            .read()
            .await
            .expect("read");
        assert!(bed.exists(&bed.replica, "after").await);
        again.unlock().await.expect("unlock");
        permit.release().await.expect("release");
        read.unlock().await.expect("unlock");
        known.unlock().await.expect("unlock");
        assert!(!bed.exists(&bed.replica, "known").await);
    })
    .await;
}

/// The old master is paused, the sentinels promote the replica, a client takes locks on the
/// new master, and the old master is resumed: a client still talking to it (cut off from the
/// sentinels, so it never heard of the failover) is granted a lock the new master's holder has
/// when it asks for no acknowledgement (the negative control), gets `NotReplicated` when it
/// asks for one, and is refused by the server itself once `min-replicas-to-write` is set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_old_master_grants_nothing_that_needs_a_replica() {
    within(LIMIT, async {
        let bed = Monitored::start().await;
        let old = bed.master.port();
        let durable = Durability::Replicas {
            count: 1,
            timeout: Duration::from_millis(300),
        };
        let careless = bed.builder(&bed.master).build().expect("client");
        let careful = bed
            .builder(&bed.master)
            .durability(durable)
            .build()
            .expect("client");
        let strict = bed.builder(&bed.master).build().expect("client");
        // Their connections are open before the pause.
        for client in [&careless, &careful, &strict] {
            client
                .mutex("warm")
                .expect("mutex")
                .lock()
                .await
                .expect("lock")
                .unlock()
                .await
                .expect("unlock");
        }

        let paused = Instant::now();
        bed.master.pause();
        let (new, _) = bed.failover(old, paused);
        assert_eq!(new, bed.replica.port());
        let owner = bed.sentinel().build().expect("client");
        let mut held = Vec::new();
        for name in ["split-a", "split-b", "split-c"] {
            held.push(
                owner
                    .mutex(name)
                    .expect("mutex")
                    .lock()
                    .await
                    .expect("lock"),
            );
        }
        bed.master.resume();

        // The negative control: two holders of one lock, one per master.
        let twice = careless.mutex("split-a").expect("mutex").try_lock().await;
        let twice = twice.expect("the old master grants: split brain without durability");
        assert!(bed.exists(&bed.replica, "split-a").await);

        // With durability on, the old master's grant counts for nothing: it has no replica.
        let refused = careful.mutex("split-b").expect("mutex").try_lock().await;
        match refused {
            Err(Error::NotReplicated {
                acked: 0,
                wanted: 1,
            }) => {}
            other => panic!("expected NotReplicated, got {other:?}"),
        }

        // The server's own guard: writes refused without a replica that kept up.
        let mut conn = bed.conn(&bed.master).await;
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("min-replicas-to-write")
            .arg(1)
            .arg("min-replicas-max-lag")
            .arg(1)
            .query_async(&mut conn)
            .await
            .expect("CONFIG SET");
        let server_refused = strict.mutex("split-c").expect("mutex").try_lock().await;
        match server_refused {
            Err(Error::Redis(err)) => assert!(
                err.to_string().contains("NOREPLICAS"),
                "expected NOREPLICAS, got {err}"
            ),
            other => panic!("expected the server to refuse, got {other:?}"),
        }

        drop(twice);
        for guard in held {
            guard.unlock().await.expect("unlock");
        }
    })
    .await;
}

/// A client whose sentinels name no master, or none at all, fails with a typed error and
/// does not panic; a Sentinel setting on another client is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_sentinel_settings_are_typed_errors() {
    within(LIMIT, async {
        let none: [&str; 0] = [];
        assert!(matches!(
            LockClient::sentinel(none, "locks"),
            Err(Error::Redis(_))
        ));
        let pool = Config::from_url("redis://127.0.0.1:1")
            .create_pool(Some(Runtime::Tokio1))
            .expect("pool");
        let refused = LockClient::builder(pool, "redis://127.0.0.1:1")
            .sentinel_node(redis::sentinel::SentinelNodeConnectionInfo::default())
            .build();
        assert!(matches!(refused, Err(Error::Unsupported { .. })));

        // A sentinel that does not know the name.
        let bed = Monitored::start().await;
        let stranger =
            LockClient::sentinel(bed.sentinels.urls(), "no-such-master").expect("client");
        let err = stranger
            .mutex("x")
            .expect("mutex")
            .try_lock()
            .await
            .expect_err("no master by that name");
        assert!(matches!(err, Error::Redis(_)), "{err:?}");
    })
    .await;
}

/// The sentinel a client listens to for failover announcements goes silent, its connection
/// open (its host gone, a partition): the client notices within a heartbeat and listens to
/// the next sentinel, rather than staying deaf to failovers for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_sentinel_is_left_for_the_next_one() {
    within(LIMIT, async {
        let bed = Monitored::start().await;
        let urls = bed.sentinels.urls();
        let first = urls[0]
            .trim_start_matches("redis://")
            .parse()
            .expect("addr");
        let proxy = redlatch_harness::proxy::Proxy::start(first)
            .await
            .expect("proxy");
        let client = LockClient::sentinel_builder(
            [proxy.url(), urls[1].clone(), urls[2].clone()],
            bed.sentinels.name(),
        )
        .key_prefix(&bed.prefix)
        .build()
        .expect("client");
        let guard = client
            .mutex("m")
            .expect("mutex")
            .lock()
            .await
            .expect("lock");
        // The client listens to the first sentinel, and to it alone.
        until(|| async { listeners(&urls[0]).await == 1 }).await;
        assert_eq!(listeners(&urls[1]).await, 0);
        proxy.set(Mode::Blackhole);
        // A heartbeat (10 s) and its answer's limit (2 s) later, with a wide margin.
        let moved = support::until_within(Duration::from_secs(40), || async {
            listeners(&urls[1]).await == 1
        });
        assert!(
            moved.await,
            "the client still listens to the silent sentinel"
        );
        // Listening again after a gap, every connection asked the sentinels for the master
        // (an announcement may have been missed): the client works on, the first sentinel
        // still silent.
        let next = tokio::time::timeout(Duration::from_secs(20), async {
            client.mutex("n").expect("mutex").lock().await
        })
        .await
        .expect("a lock while the first sentinel is silent")
        .expect("lock");
        next.unlock().await.expect("unlock");
        guard.unlock().await.expect("unlock");
        proxy.set(Mode::Pass);
    })
    .await;
}

/// A sentinel that names an older master than the others (one that monitors another server
/// under the same name and never saw a failover, listed first) does not win: the client takes
/// the master of the newest configuration, which a failover raised to epoch 1, and nothing is
/// written to the other server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_naming_an_older_master_loses_to_the_newest_epoch() {
    within(LIMIT, async {
        let bed = Monitored::start().await;
        let old = bed.master.port();
        let since = Instant::now();
        tokio::task::block_in_place(|| bed.sentinels.force_failover()).expect("failover asked");
        let (new, _) = bed.failover(old, since);
        assert_eq!(new, bed.replica.port());
        let other = RedisServer::start();
        let port = other.port();
        let stale = tokio::task::spawn_blocking(move || Sentinels::start("locks", port, 1, 0))
            .await
            .expect("join")
            .expect("a sentinel of its own");
        let mut urls = stale.urls();
        urls.extend(bed.sentinels.urls());
        let client = LockClient::sentinel_builder(urls, "locks")
            .key_prefix(&bed.prefix)
            .build()
            .expect("client");
        let guard = client
            .mutex("newest")
            .expect("mutex")
            .lock()
            .await
            .expect("lock");
        assert!(bed.exists(&bed.replica, "newest").await);
        assert!(!bed.exists(&other, "newest").await);
        guard.unlock().await.expect("unlock");
        assert!(!bed.exists(&bed.replica, "newest").await);
    })
    .await;
}

/// How many clients of the sentinel at `url` are subscribed to a channel (`CLIENT LIST`).
async fn listeners(url: &str) -> usize {
    let mut conn = redis::Client::open(url)
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(&mut conn)
        .await
        .expect("CLIENT LIST");
    list.lines().filter(|l| l.contains(" sub=1 ")).count()
}
