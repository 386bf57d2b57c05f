//! Redlock over independent servers on loopback, each behind a proxy that can cut it off:
//! exclusion, re-entry, a minority down, a slow node, fencing tokens that rise across any
//! majorities, and restarts without persistence.

mod support;

use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::{Config, Runtime};
use redis::aio::MultiplexedConnection;
use redlatch::{Error, Fencing, LockClient, LockClientBuilder};
use redlatch_harness::check::{Section, overlaps};
use redlatch_harness::proxy::{Mode, Proxy};
use redlatch_harness::resource::Resource;
use support::{RedisServer, racy_increment, unique, until, until_within, within};
use tokio::time::Instant;

/// `n` servers, each reached through a proxy, and a key prefix of the test's own.
struct Nodes {
    servers: Vec<RedisServer>,
    proxies: Vec<Proxy>,
    prefix: String,
}

impl Nodes {
    async fn start(n: usize) -> Self {
        Self::start_with(n, &[]).await
    }

    async fn start_with(n: usize, extra: &[&str]) -> Self {
        let servers: Vec<RedisServer> = (0..n).map(|_| RedisServer::start_with(extra)).collect();
        let mut proxies = Vec::new();
        for server in &servers {
            let addr = format!("127.0.0.1:{}", server.port())
                .parse()
                .expect("addr");
            proxies.push(Proxy::start(addr).await.expect("proxy"));
        }
        Self {
            servers,
            proxies,
            prefix: unique("redlock"),
        }
    }

    fn builder(&self) -> LockClientBuilder {
        let nodes = self.proxies.iter().map(|p| {
            let pool = Config::from_url(p.url())
                .create_pool(Some(Runtime::Tokio1))
                .expect("pool");
            (pool, p.url())
        });
        LockClient::redlock(nodes).key_prefix(&self.prefix)
    }

    fn client(&self) -> LockClient {
        self.builder().build().expect("client")
    }

    /// Only the nodes in `reachable` answer.
    fn reach(&self, reachable: &[usize]) {
        for (i, proxy) in self.proxies.iter().enumerate() {
            proxy.set(if reachable.contains(&i) {
                Mode::Pass
            } else {
                Mode::Blackhole
            });
        }
    }

    /// A direct connection to server `i` (not through its proxy).
    async fn conn(&self, i: usize) -> MultiplexedConnection {
        redis::Client::open(self.servers[i].url())
            .expect("url")
            .get_multiplexed_async_connection()
            .await
            .expect("connect")
    }

    /// The keys of this test on server `i`.
    async fn keys(&self, i: usize) -> Vec<String> {
        let mut conn = self.conn(i).await;
        redis::cmd("KEYS")
            .arg(format!("{}:*", self.prefix))
            .query_async(&mut conn)
            .await
            .expect("KEYS")
    }

    /// How many times the lock of `name` is held on server `i` (its string's count of holds),
    /// `None` when it is not held there.
    async fn hold_count(&self, i: usize, name: &str) -> Option<u64> {
        let mut conn = self.conn(i).await;
        let lock: Option<String> = redis::cmd("GET")
            .arg(format!("{}:{{{name}}}", self.prefix))
            .query_async(&mut conn)
            .await
            .expect("GET");
        lock.and_then(|l| l.split(' ').nth(2)?.parse().ok())
    }

    /// Whether any server holds the lock of `name`.
    async fn held_anywhere(&self, name: &str) -> bool {
        for i in 0..self.servers.len() {
            if self.holds(i, name).await {
                return true;
            }
        }
        false
    }

    /// Whether server `i` holds the lock hash of `name`.
    async fn holds(&self, i: usize, name: &str) -> bool {
        let mut conn = self.conn(i).await;
        redis::cmd("EXISTS")
            .arg(format!("{}:{{{name}}}", self.prefix))
            .query_async(&mut conn)
            .await
            .expect("EXISTS")
    }
}

const ROUNDS: u64 = 25;

fn ns(epoch: Instant) -> u64 {
    u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_tasks_over_four_clients_keep_exclusion_and_count_exactly() {
    within(Duration::from_secs(120), async {
        let nodes = Nodes::start(5).await;
        let name = "counter";
        let counter = format!("{}:data", nodes.prefix);
        let epoch = Instant::now();
        let sections = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for c in 0..4 {
            let client = nodes.client();
            for t in 0..4 {
                let (client, counter, sections) =
                    (client.clone(), counter.clone(), Arc::clone(&sections));
                let mut data = nodes.conn(0).await;
                tasks.push(tokio::spawn(async move {
                    let mutex = client.mutex(name).expect("mutex");
                    for _ in 0..ROUNDS {
                        let guard = mutex.lock().await.expect("lock");
                        let start = ns(epoch);
                        racy_increment(&mut data, &counter).await;
                        let end = ns(epoch);
                        sections.lock().expect("sections").push(Section {
                            worker: format!("{c}/{t}"),
                            token: guard.fencing_token(),
                            exclusive: true,
                            start,
                            end,
                            write: None,
                        });
                        guard.unlock().await.expect("unlock");
                    }
                }));
            }
        }
        for task in tasks {
            task.await.expect("task");
        }
        let mut data = nodes.conn(0).await;
        let total: u64 = redis::cmd("GET")
            .arg(&counter)
            .query_async(&mut data)
            .await
            .expect("GET");
        assert_eq!(total, 16 * ROUNDS, "every increment counted");
        let mut sections = sections.lock().expect("sections").clone();
        let found = overlaps(&sections, 1);
        assert_eq!(found.count, 0, "overlapping holders: {:?}", found.first);
        // In the order they held it, tokens rise.
        sections.sort_by_key(|s| s.start);
        for pair in sections.windows(2) {
            assert!(
                pair[1].token > pair[0].token,
                "token {} after {}",
                pair[1].token,
                pair[0].token
            );
        }
        // `unlock` returns once a majority released; the other nodes' releases may still be
        // on their way, and must arrive (well within the 30 s lease that would otherwise end
        // the hold): nothing but the counters and the data is left.
        let left_alone = |keys: &[String]| {
            keys.iter()
                .all(|k| k.ends_with(":fence") || k.ends_with(":data"))
        };
        for i in 0..5 {
            let released = until_within(Duration::from_secs(5), || async {
                left_alone(&nodes.keys(i).await)
            });
            assert!(released.await, "node {i} keeps {:?}", nodes.keys(i).await);
        }
    })
    .await;
}

/// A failed attempt gives back what it may have taken, on every node and in the background. A
/// client's first calls to a node wait for its connection, and a give-back that finds the
/// connection made goes out at once, possibly ahead of the acquisition it undoes: that node
/// then granted the name after its release and kept it for a lease. A give-back now follows
/// the attempt's call on each node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_give_back_never_overtakes_the_acquisition_it_undoes() {
    const TASKS: usize = 16;
    const CLIENTS: usize = 80;
    within(Duration::from_secs(120), async {
        let nodes = Nodes::start(3).await;
        // Nodes 0 and 1 hold every name for owners of their own (a client of one server each);
        // node 2 holds none: every attempt below is refused by two nodes and gives back.
        let holders: Vec<LockClient> = [0, 1]
            .iter()
            .map(|&i| {
                let url = nodes.servers[i].url();
                let pool = Config::from_url(url.clone())
                    .create_pool(Some(Runtime::Tokio1))
                    .expect("pool");
                LockClient::builder(pool, url)
                    .key_prefix(&nodes.prefix)
                    .build()
                    .expect("client")
            })
            .collect();
        let names: Vec<String> = (0..TASKS).map(|t| format!("g{t}")).collect();
        let mut guards = Vec::new();
        for holder in &holders {
            for name in &names {
                guards.push(
                    holder
                        .mutex(name)
                        .expect("mutex")
                        .lock()
                        .await
                        .expect("lock"),
                );
            }
        }
        for _ in 0..CLIENTS {
            // A new client each time: its first calls to every node wait for a connection.
            let client = nodes.client();
            let tasks: Vec<_> = names
                .iter()
                .map(|name| {
                    let mutex = client.mutex(name).expect("mutex");
                    tokio::spawn(async move { mutex.try_lock().await.map(|g| g.is_some()) })
                })
                .collect();
            for task in tasks {
                assert!(
                    !task.await.expect("task").expect("try_lock"),
                    "a majority holds it"
                );
            }
            for name in &names {
                let gone = until_within(Duration::from_secs(5), || async {
                    !nodes.holds(2, name).await
                });
                assert!(gone.await, "node 2 keeps {name} after its give-back");
            }
        }
        for guard in guards {
            guard.unlock().await.expect("unlock");
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reentry_three_deep_is_one_hold_with_one_token() {
    within(Duration::from_secs(60), async {
        let nodes = Nodes::start(5).await;
        let (client, other) = (nodes.client(), nodes.client());
        let mutex = client.mutex("re").expect("mutex");
        let outer = mutex.lock().await.expect("lock");
        let middle = outer.reenter().await.expect("reenter");
        let inner = middle.reenter().await.expect("reenter");
        assert_eq!(inner.fencing_token(), outer.fencing_token());
        let snapshot = client.inspect("re").await.expect("inspect");
        assert_eq!(snapshot.holders.len(), 1);
        assert_eq!(snapshot.holders[0].exclusive_holds, 3);
        assert_eq!(snapshot.last_fencing_token, Some(outer.fencing_token()));
        inner.unlock().await.expect("unlock");
        middle.unlock().await.expect("unlock");
        assert!(
            other
                .mutex("re")
                .expect("mutex")
                .try_lock()
                .await
                .expect("try")
                .is_none(),
            "still held once"
        );
        outer.unlock().await.expect("unlock");
        let next = other
            .mutex("re")
            .expect("mutex")
            .lock()
            .await
            .expect("lock");
        assert!(next.fencing_token() > outer_token(&snapshot));
        next.unlock().await.expect("unlock");
        // The release reached a majority before it returned; the rest follow at once.
        for i in 0..5 {
            until(|| async { !nodes.holds(i, "re").await }).await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_release_that_may_have_reached_a_node_is_not_sent_again() {
    within(Duration::from_secs(60), async {
        let nodes = Nodes::start(3).await;
        // Node 0 refuses every connection: each call to it fails before it is sent.
        nodes.proxies[0].set(Mode::Refuse);
        let client = nodes
            .builder()
            .node_timeout(Duration::from_millis(100))
            .build()
            .expect("client");
        let other = nodes.client();
        let outer = client
            .mutex("r")
            .expect("mutex")
            .lock()
            .await
            .expect("lock");
        let inner = outer.reenter().await.expect("reenter");
        for i in [1, 2] {
            assert_eq!(nodes.hold_count(i, "r").await, Some(2), "node {i}");
        }
        // Nodes 1 and 2 run the inner hold's release, but their answers come too late: the
        // release reached them, and must not be sent again (it would take the outer hold too).
        nodes.proxies[1].set(Mode::HoldReplies);
        nodes.proxies[2].set(Mode::HoldReplies);
        drop(inner);
        for i in [1, 2] {
            until(|| async { nodes.hold_count(i, "r").await == Some(1) }).await;
        }
        // Past the node timeouts (100 ms each) and the first retries (from 20 ms, doubling) that
        // a release reported as reaching no node would make, which the held replies let reach
        // nodes 1 and 2, with a wide margin for a loaded machine: the absence of a second
        // release is the point, and no signal marks it.
        tokio::time::sleep(Duration::from_secs(3)).await;
        nodes.proxies[1].set(Mode::Pass);
        nodes.proxies[2].set(Mode::Pass);
        for i in [1, 2] {
            assert_eq!(
                nodes.hold_count(i, "r").await,
                Some(1),
                "node {i}: the outer hold is still there"
            );
        }
        assert!(outer.is_held());
        assert!(
            other
                .mutex("r")
                .expect("mutex")
                .try_lock()
                .await
                .expect("try")
                .is_none(),
            "another client took a name the outer guard holds"
        );
        outer.unlock().await.expect("unlock");
        for i in 0..3 {
            until(|| async { !nodes.holds(i, "r").await }).await;
        }
    })
    .await;
}

fn outer_token(snapshot: &redlatch::Snapshot) -> u64 {
    snapshot.last_fencing_token.unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_primitives_are_unsupported() {
    let nodes = Nodes::start(3).await;
    let client = nodes.client();
    for result in [
        client.fair_mutex("a").map(|_| ()),
        client.semaphore("a", 2).map(|_| ()),
        client.rwlock("a").map(|_| ()),
    ] {
        assert!(
            matches!(result, Err(Error::Unsupported { .. })),
            "{result:?}"
        );
    }
    // Durability is a replicated master's setting: a Redlock handle refuses it at once.
    let refused =
        client
            .mutex("a")
            .expect("mutex")
            .with_durability(redlatch::Durability::AllReplicas {
                timeout: Duration::from_secs(1),
            });
    assert!(
        matches!(refused, Err(Error::Unsupported { .. })),
        "{refused:?}"
    );
    // Redlock settings on another client are refused, not lost.
    let single = RedisServer::start();
    let pool = Config::from_url(single.url())
        .create_pool(Some(Runtime::Tokio1))
        .expect("pool");
    let built = LockClient::builder(pool, single.url().as_str())
        .fencing(Fencing::Clock)
        .build();
    assert!(matches!(built, Err(Error::Unsupported { .. })), "{built:?}");
    for i in 0..3 {
        assert!(nodes.keys(i).await.is_empty(), "nothing written");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_of_five_down_still_lock_three_down_fail_and_leave_nothing() {
    within(Duration::from_secs(60), async {
        let mut nodes = Nodes::start(5).await;
        let client = nodes
            .builder()
            .default_lease(Duration::from_secs(5))
            .build()
            .expect("client");
        let mutex = client.mutex("minority").expect("mutex");
        nodes.servers[3].kill();
        nodes.servers[4].kill();
        for _ in 0..3 {
            let guard = mutex.lock().await.expect("lock with 3 of 5");
            assert!(guard.is_held());
            guard.unlock().await.expect("unlock");
        }
        nodes.servers[2].kill();
        let started = Instant::now();
        let failed = mutex.lock_timeout(Duration::from_secs(1)).await;
        assert!(
            matches!(&failed, Err(err) if err.is_connection()),
            "no majority, no lock: {failed:?}"
        );
        let took = started.elapsed();
        assert!(
            took < Duration::from_secs(3),
            "gave up within its budget: {took:?}"
        );
        // What the failed attempts took on the live servers is given back, not left to its
        // 5 s lease.
        let gone = until_within(Duration::from_secs(2), || async {
            !nodes.holds(0, "minority").await && !nodes.holds(1, "minority").await
        });
        assert!(
            gone.await,
            "the failed attempts' grants were left to their lease"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_node_does_not_hold_up_the_acquire() {
    within(Duration::from_secs(60), async {
        let nodes = Nodes::start(5).await;
        let lease = Duration::from_secs(5);
        let node_timeout = Duration::from_millis(100);
        let client = nodes
            .builder()
            .default_lease(lease)
            .node_timeout(node_timeout)
            .build()
            .expect("client");
        let mutex = client.mutex("slow").expect("mutex");
        // Connect first, then slow one node far past the node timeout.
        mutex
            .lock()
            .await
            .expect("lock")
            .unlock()
            .await
            .expect("unlock");
        nodes.proxies[0].set(Mode::Delay {
            base: Duration::from_secs(2),
            jitter: Duration::ZERO,
        });
        for i in 0..5 {
            let before = Instant::now();
            let guard = mutex.lock().await.expect("lock");
            let took = before.elapsed();
            // Four fast nodes decide: the slow one is not waited for.
            assert!(
                took < node_timeout + Duration::from_secs(1),
                "attempt {i} took {took:?}"
            );
            // Counted from a moment within the call (before the first send), not from an
            // answer: what is left at return is the lease, less the drift allowance, less the
            // time since then.
            let validity = lease - (lease / 100 + Duration::from_millis(2));
            let until = guard.valid_until();
            assert!(until >= before.into_std() + validity, "attempt {i}");
            assert!(
                until <= (before + took).into_std() + validity,
                "attempt {i}"
            );
            guard.unlock().await.expect("unlock");
        }
        // Two more nodes gone: the slow node's vote is needed, and the attempt gives up on it
        // after the node timeout instead of waiting for its answer.
        nodes.proxies[3].set(Mode::Blackhole);
        nodes.proxies[4].set(Mode::Blackhole);
        let before = Instant::now();
        let attempt = mutex.try_lock().await;
        let took = before.elapsed();
        assert!(
            matches!(&attempt, Err(err) if err.is_connection()),
            "no majority: {attempt:?}"
        );
        assert!(
            took >= node_timeout && took < node_timeout + Duration::from_secs(1),
            "gave up after {took:?}"
        );
        nodes.reach(&[0, 1, 2, 3, 4]);
    })
    .await;
}

/// One node grants and the others do not answer: nobody said the name is held, so the caller
/// is told the servers could not be reached (as on one server), not that the name is busy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_without_a_majority_answering_is_a_connection_error_not_busy() {
    within(Duration::from_secs(60), async {
        let nodes = Nodes::start(3).await;
        let client = nodes
            .builder()
            .node_timeout(Duration::from_millis(100))
            .default_lease(Duration::from_secs(3))
            .build()
            .expect("client");
        let mutex = client.mutex("unheard").expect("mutex");
        mutex
            .lock()
            .await
            .expect("lock")
            .unlock()
            .await
            .expect("unlock");
        nodes.reach(&[0]);
        let attempt = mutex.try_lock().await;
        assert!(
            matches!(&attempt, Err(err) if err.is_connection()),
            "{attempt:?}"
        );
        // Node 0's grants were given back.
        until(|| async { !nodes.holds(0, "unheard").await }).await;
        nodes.reach(&[0, 1, 2]);
        let guard = mutex.try_lock().await.expect("try_lock").expect("free");
        guard.unlock().await.expect("unlock");
    })
    .await;
}

/// Kleppmann's counterexample, for real: node 0's counter far ahead of the others. A is
/// granted by {0, 1, 2}, B later by {2, 3, 4}. The two-round token rises; the one-round token,
/// which trusts the nodes' clocks and counters alone, does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_counterexample_gives_rising_tokens_with_two_rounds_only() {
    within(Duration::from_secs(60), async {
        for (fencing, rises) in [(Fencing::Quorum, true), (Fencing::Clock, false)] {
            let nodes = Nodes::start(5).await;
            let client = nodes.builder().fencing(fencing).build().expect("client");
            let mutex = client.mutex("k").expect("mutex");
            // Node 0 has issued far more tokens than the clock says (as if its clock once ran
            // far ahead).
            let ahead: u64 = 1u64 << 52;
            let mut conn = nodes.conn(0).await;
            let _: () = redis::cmd("SET")
                .arg(format!("{}:{{k}}:fence", nodes.prefix))
                .arg(ahead)
                .query_async(&mut conn)
                .await
                .expect("SET");
            nodes.reach(&[0, 1, 2]);
            let a = mutex.lock().await.expect("A");
            let token_a = a.fencing_token();
            assert!(token_a > ahead);
            a.unlock().await.expect("unlock A");
            nodes.reach(&[2, 3, 4]);
            let b = mutex.lock().await.expect("B");
            let token_b = b.fencing_token();
            b.unlock().await.expect("unlock B");
            nodes.reach(&[0, 1, 2, 3, 4]);
            assert_eq!(
                token_b > token_a,
                rises,
                "{fencing:?}: A {token_a}, B {token_b}"
            );
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_rise_across_two_thousand_random_majorities() {
    within(Duration::from_secs(240), async {
        let nodes = Nodes::start(5).await;
        let client = nodes
            .builder()
            .default_lease(Duration::from_secs(2))
            // Short, so that the nodes cut off cost little; long enough that a loaded machine
            // does not make the reachable ones miss it.
            .node_timeout(Duration::from_millis(250))
            .build()
            .expect("client");
        let mutex = client.mutex("random").expect("mutex");
        let mut last = 0;
        // Now and then a node's counter runs ahead of the others (as after a clock that ran
        // fast): acquisitions that it grants need the second round, the others do not.
        let fence_key = format!("{}:{{random}}:fence", nodes.prefix);
        for i in 0..2000 {
            if fastrand::u8(..4) == 0 {
                let ahead = last + fastrand::u64(1..2_000_000);
                let mut conn = nodes.conn(fastrand::usize(..5)).await;
                // Raised, never lowered: a node keeps its counter.
                let _: () = redis::Script::new("redis.call('ZADD', KEYS[1], 'GT', ARGV[1], '~')")
                    .key(&fence_key)
                    .arg(ahead)
                    .invoke_async(&mut conn)
                    .await
                    .expect("raise the counter");
            }
            let mut reachable: Vec<usize> = (0..5).collect();
            fastrand::shuffle(&mut reachable);
            reachable.truncate(fastrand::usize(3..=5));
            nodes.reach(&reachable);
            let guard = mutex.lock().await.expect("lock");
            let token = guard.fencing_token();
            assert!(
                token > last,
                "acquisition {i} on {reachable:?}: {token} after {last}"
            );
            last = token;
            guard.unlock().await.expect("unlock");
        }
        nodes.reach(&[0, 1, 2, 3, 4]);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_paused_past_its_validity_is_refused_by_the_fenced_store() {
    within(Duration::from_secs(60), async {
        let nodes = Nodes::start(5).await;
        let store = RedisServer::start();
        let mut data = redis::Client::open(store.url())
            .expect("url")
            .get_multiplexed_async_connection()
            .await
            .expect("connect");
        let resource = Resource::new(&nodes.prefix, "fenced");
        let (a, b) = (nodes.client(), nodes.client());
        let lease = Duration::from_millis(300);
        let held = a
            .mutex("fenced")
            .expect("mutex")
            .with_lease(lease)
            .expect("lease")
            .lock()
            .await
            .expect("A");
        // A "pauses": it does nothing until its lease is lost.
        held.lost().await;
        let next = b.mutex("fenced").expect("mutex").lock().await.expect("B");
        assert!(next.fencing_token() > held.fencing_token());
        assert!(
            resource
                .fenced_write(&mut data, next.fencing_token())
                .await
                .expect("write")
        );
        // A wakes up and writes with its old token.
        assert!(
            !resource
                .fenced_write(&mut data, held.fencing_token())
                .await
                .expect("write"),
            "the stale holder's write is refused"
        );
        next.unlock().await.expect("unlock");
    })
    .await;
}

/// A server restarted empty while a lock is held forgets its grant. Unsafe: it rejoins at once,
/// and another client takes the lock while the first still holds it. Safe: it rejoins only
/// after the longest lease (the first holder learns it lost the lock first), or it keeps its
/// data (`appendfsync always`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_without_persistence_is_safe_only_when_delayed_or_fsynced() {
    within(Duration::from_secs(90), async {
        for setting in [
            "rejoin at once",
            "rejoin after the lease",
            "appendfsync always",
        ] {
            // Short where the test waits the lease out; else long enough that no renewal of
            // A's comes before B's attempt, however slow the restart.
            let lease = Duration::from_secs(if setting == "rejoin after the lease" {
                3
            } else {
                30
            });
            let extra: &[&str] = if setting == "appendfsync always" {
                &["--appendonly", "yes", "--appendfsync", "always"]
            } else {
                &[]
            };
            let mut nodes = Nodes::start_with(3, extra).await;
            let (a, b) = (
                nodes
                    .builder()
                    .default_lease(lease)
                    .build()
                    .expect("client"),
                nodes
                    .builder()
                    .default_lease(lease)
                    .build()
                    .expect("client"),
            );
            // A is granted by nodes 0 and 1: A's client cannot connect to node 2 then.
            nodes.proxies[2].set(Mode::Refuse);
            let held = a.mutex("r").expect("mutex").lock().await.expect("A");
            nodes.proxies[2].set(Mode::Pass);
            assert!(!nodes.holds(2, "r").await);
            nodes.servers[0].restart();
            if setting == "rejoin after the lease" {
                nodes.proxies[0].set(Mode::Refuse);
                // Node 0 stays out for the longest lease: by then A's renewals, which only
                // node 1 can grant, have failed, and A knows it lost the lock.
                within(lease * 2, held.lost()).await;
                let out_since = Instant::now();
                until(|| async { out_since.elapsed() >= lease }).await;
                nodes.proxies[0].set(Mode::Pass);
            }
            let taken = b
                .mutex("r")
                .expect("mutex")
                .lock_timeout(Duration::from_secs(5))
                .await;
            match setting {
                "rejoin at once" => {
                    let next = taken.expect("B is granted by the restarted node and node 2");
                    assert!(
                        held.is_held() && next.is_held(),
                        "two holders at once: unsafe"
                    );
                }
                "rejoin after the lease" => {
                    let next = taken.expect("B after A's lease");
                    assert!(
                        !held.is_held(),
                        "A knew it had lost the lock before B took it"
                    );
                    drop(next);
                }
                _ => {
                    assert!(taken.is_err(), "the fsynced node still holds A's grant");
                    assert!(held.is_held());
                }
            }
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_keeps_a_hold_a_majority_renews_and_loses_one_it_cannot() {
    within(Duration::from_secs(60), async {
        let nodes = Nodes::start(5).await;
        // The node timeout is a twentieth of the lease: 100 ms, so a hiccup of this machine
        // does not make the reachable nodes miss renewals too.
        let lease = Duration::from_millis(2_000);
        let (a, b) = (
            nodes
                .builder()
                .default_lease(lease)
                .build()
                .expect("client"),
            nodes
                .builder()
                .default_lease(lease)
                .build()
                .expect("client"),
        );
        let held = a.mutex("w").expect("mutex").lock().await.expect("lock");
        let first_validity = held.valid_until();
        // Two nodes cut off: three still renew, for several leases.
        nodes.reach(&[0, 1, 2]);
        let since = Instant::now();
        until(|| async { since.elapsed() >= lease * 3 }).await;
        assert!(held.is_held(), "a majority renewed it");
        assert!(
            held.valid_until() > first_validity,
            "renewals moved its validity on"
        );
        let other = b.mutex("w").expect("mutex");
        assert!(other.try_lock().await.expect("try").is_none());
        // Three cut off: no majority renews, and the hold is lost by its validity.
        nodes.reach(&[0, 1]);
        let deadline = held.valid_until();
        held.lost().await;
        assert!(!held.is_held());
        let late = Instant::now()
            .into_std()
            .saturating_duration_since(deadline);
        assert!(
            late < Duration::from_millis(500),
            "lost {late:?} after its validity"
        );
        nodes.reach(&[0, 1, 2, 3, 4]);
        // Once the keys run out everywhere, another client takes it.
        let next = other.lock().await.expect("lock after the lease");
        assert!(next.fencing_token() > held.fencing_token());
        next.unlock().await.expect("unlock");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_no_majority_decides_does_not_take_down_the_holds_renewed_beside_it() {
    within(Duration::from_secs(60), async {
        let nodes = Nodes::start(3).await;
        let lease = Duration::from_millis(2_000);
        let client = nodes
            .builder()
            .default_lease(lease)
            .build()
            .expect("client");
        // Taken back to back, renewed together.
        let a = client
            .mutex("a")
            .expect("mutex")
            .lock()
            .await
            .expect("lock");
        let b = client
            .mutex("b")
            .expect("mutex")
            .lock()
            .await
            .expect("lock");
        // Node 1 has lost `b` (as a node that restarted empty would), and node 2 stops
        // answering: a majority renews `a`, while for `b` one node renews, one says gone and
        // one is silent, which decides nothing.
        // (The acquisition returned on a majority: node 1's grant may still be on its way.)
        until(|| async { nodes.holds(1, "b").await }).await;
        let mut conn = nodes.conn(1).await;
        let _: () = redis::cmd("DEL")
            .arg(format!("{}:{{b}}", nodes.prefix))
            .query_async(&mut conn)
            .await
            .expect("DEL");
        nodes.proxies[2].set(Mode::Blackhole);
        let since = Instant::now();
        until(|| async { since.elapsed() >= lease * 3 }).await;
        assert!(a.is_held(), "a majority renewed `a` all along");
        assert!(!b.is_held(), "no majority renewed `b`");
        nodes.proxies[2].set(Mode::Pass);
        a.unlock().await.expect("unlock");
        drop(b);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reentry_no_majority_answers_is_an_error_and_keeps_the_hold() {
    within(Duration::from_secs(60), async {
        let nodes = Nodes::start(3).await;
        // The default lease (30 s): what the silent nodes ran late must not be left to it.
        let client = nodes
            .builder()
            .node_timeout(Duration::from_millis(100))
            .build()
            .expect("client");
        let guard = client
            .mutex("re")
            .expect("mutex")
            .lock()
            .await
            .expect("lock");
        // Only node 0 answers: the re-entry is granted there, and nothing is known elsewhere.
        nodes.reach(&[0]);
        let again = guard.reenter().await;
        assert!(
            matches!(&again, Err(err) if err.is_connection()),
            "{again:?}"
        );
        assert!(
            guard.is_held(),
            "an undecided re-entry says nothing against the hold"
        );
        nodes.reach(&[0, 1, 2]);
        guard.unlock().await.expect("unlock");
        // The re-entry the silent nodes ran late is undone behind it there, and the unlock
        // leaves nothing: the lock is free on every node long before its lease would end.
        let gone = until_within(Duration::from_secs(5), || async {
            !nodes.held_anywhere("re").await
        });
        assert!(gone.await, "the late re-entries were left to the lease");
    })
    .await;
}

/// A carried owner's acquisition that keeps failing (two nodes far slower than the node
/// timeout) leaves nothing behind: each attempt's late grants on the slow nodes are undone
/// there, and the name is free once they have answered, not held for a lease by nobody.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_carried_owners_failed_acquisition_leaves_no_late_grants() {
    within(Duration::from_secs(60), async {
        let nodes = Nodes::start(3).await;
        let client = nodes
            .builder()
            .node_timeout(Duration::from_millis(100))
            .build()
            .expect("client");
        let mutex = client.mutex("late").expect("mutex");
        mutex
            .lock()
            .await
            .expect("connect")
            .unlock()
            .await
            .expect("unlock");
        let slow = Mode::Delay {
            base: Duration::from_millis(300),
            jitter: Duration::ZERO,
        };
        nodes.proxies[1].set(slow);
        nodes.proxies[2].set(slow);
        let owner = redlatch::OwnerToken::new();
        let failed = mutex
            .lock_as_timeout(&owner, Duration::from_millis(500))
            .await;
        assert!(failed.is_err(), "{failed:?}");
        nodes.reach(&[0, 1, 2]);
        let gone = until_within(Duration::from_secs(5), || async {
            !nodes.held_anywhere("late").await
        });
        assert!(gone.await, "late grants were left to the 30 s lease");
        let other = nodes.client().mutex("late").expect("mutex");
        let guard = other.try_lock().await.expect("try_lock").expect("free");
        guard.unlock().await.expect("unlock");
    })
    .await;
}

/// Each node's fencing counter lives `FENCE_TTL` from the last token it issued, so a name in
/// use never loses its counters together (a new counter starts from its own server's clock,
/// which may be behind another server's by more than its head start).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_counter_in_use_keeps_its_lifetime_on_every_node() {
    within(Duration::from_secs(60), async {
        let nodes = Nodes::start(3).await;
        let client = nodes.client();
        let mutex = client.mutex("kept").expect("mutex");
        mutex
            .lock()
            .await
            .expect("lock")
            .unlock()
            .await
            .expect("unlock");
        let fence = format!("{}:{{kept}}:fence", nodes.prefix);
        let pttl = |i: usize| {
            let fence = fence.clone();
            let nodes = &nodes;
            async move {
                let mut conn = nodes.conn(i).await;
                redis::cmd("PTTL")
                    .arg(&fence)
                    .query_async::<i64>(&mut conn)
                    .await
                    .expect("PTTL")
            }
        };
        // Six days and a half after the counters were made: half a day left on each.
        for i in 0..3 {
            let mut conn = nodes.conn(i).await;
            let _: () = redis::cmd("PEXPIRE")
                .arg(&fence)
                .arg(12 * 3600 * 1000)
                .query_async(&mut conn)
                .await
                .expect("PEXPIRE");
        }
        let guard = mutex.lock().await.expect("lock");
        for i in 0..3 {
            until(|| async { nodes.holds(i, "kept").await }).await;
        }
        let week = i64::try_from(redlatch::FENCE_TTL.as_millis()).expect("ms");
        for i in 0..3 {
            let left = pttl(i).await;
            assert!(
                left > week - 60_000,
                "node {i}: the counter has {left} ms left after issuing a token"
            );
        }
        guard.unlock().await.expect("unlock");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_as_joins_the_owners_hold_and_inspect_and_force_unlock_see_every_node() {
    within(Duration::from_secs(60), async {
        let nodes = Nodes::start(3).await;
        let client = nodes.client();
        let mutex = client.mutex("as").expect("mutex");
        let owner = redlatch::OwnerToken::new();
        let first = mutex.lock_as(&owner).await.expect("lock_as");
        let second = mutex.lock_as(&owner).await.expect("lock_as again");
        assert_eq!(first.owner(), second.owner());
        let snapshot = client.inspect("as").await.expect("inspect");
        assert_eq!(snapshot.holders.len(), 1);
        assert_eq!(snapshot.holders[0].exclusive_holds, 2);
        assert_eq!(snapshot.holders[0].id, owner.short_id());
        let removed = client.force_unlock("as").await.expect("force");
        assert_eq!(removed.holders, 1);
        for i in 0..3 {
            assert!(!nodes.holds(i, "as").await, "node {i} still holds");
        }
        drop((first, second));
    })
    .await;
}

/// Found by review: a busy answer's wait was cut to the backoff maximum (1 s) before it was
/// known how it would be used, so a timeout's `lease_left` (a layer's `Retry-After`) said 1 s
/// at most while the holder had most of its 30 s lease left.
#[tokio::test]
async fn a_timeout_reports_the_holders_lease_left_not_the_recheck_interval() {
    let nodes = Nodes::start(3).await;
    within(Duration::from_secs(60), async {
        let holder = nodes.client();
        let other = nodes.client();
        let held = holder.mutex("busy").unwrap().lock().await.unwrap();
        let mutex = other.mutex("busy").unwrap();
        for timeout in [Duration::ZERO, Duration::from_millis(1500)] {
            match mutex.lock_timeout(timeout).await {
                Err(Error::Timeout {
                    lease_left: Some(left),
                    ..
                }) => assert!(left > Duration::from_secs(20), "{timeout:?}: {left:?} left"),
                other => panic!("{timeout:?}: {other:?}"),
            }
        }
        held.unlock().await.unwrap();
        // Free again: the waiter takes it at once.
        mutex
            .lock_timeout(Duration::from_secs(5))
            .await
            .unwrap()
            .unlock()
            .await
            .unwrap();
    })
    .await;
}

/// The other side of the test above: the nodes' holds a waiter finds may be other contenders'
/// grants, given back without a word, so whatever lease they report, a waiter looks again
/// within the backoff maximum.
#[tokio::test]
async fn a_waiter_looks_again_soon_at_holds_given_back_without_a_word() {
    let nodes = Nodes::start(3).await;
    within(Duration::from_secs(60), async {
        // Two contenders, each with the grant of one node, 30 s leases.
        let mut grants = Vec::new();
        for i in 0..2 {
            let pool = Config::from_url(nodes.servers[i].url())
                .create_pool(Some(Runtime::Tokio1))
                .unwrap();
            let one = LockClient::builder(pool, nodes.servers[i].url().as_str())
                .key_prefix(&nodes.prefix)
                .build()
                .unwrap();
            grants.push(one.mutex("split").unwrap().lock().await.unwrap());
        }
        let waiter = nodes.client();
        let mutex = waiter.mutex("split").unwrap();
        let waiting =
            tokio::spawn(async move { mutex.lock_timeout(Duration::from_secs(10)).await });
        // Both busy answers were given (each marks its node's lock), then the grants go
        // without a release's message.
        let lock = format!("{}:{{split}}", nodes.prefix);
        for i in 0..2 {
            support::marked(nodes.conn(i).await, &lock).await;
        }
        for i in 0..2 {
            let _: () = redis::cmd("DEL")
                .arg(&lock)
                .query_async(&mut nodes.conn(i).await)
                .await
                .unwrap();
        }
        let got = waiting
            .await
            .unwrap()
            .expect("the waiter looked again in time");
        got.unlock().await.unwrap();
        drop(grants);
    })
    .await;
}
