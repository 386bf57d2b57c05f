//! Every primitive on a Redis Cluster of three masters started for the test, with names on
//! every master; a slot moved while a lock is held and waited for; a master failed over to its
//! replica while locks are held and waited for.
#![cfg(feature = "cluster")]

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use redis::cluster::ClusterClientBuilder;
use redlatch::{Error, LockClient};
use redlatch_harness::cluster::{RedisCluster, slot};
use redlatch_harness::proxy::{Mode, Proxy};
use support::{unique, until, within};
use tokio::sync::Mutex as LocalMutex;

const LIMIT: Duration = Duration::from_secs(120);

/// A cluster for one test and redlatch clients of it, under a prefix of the test's own.
struct TestCluster {
    cluster: RedisCluster,
    prefix: String,
}

impl TestCluster {
    fn start(replicas: usize) -> Self {
        Self {
            cluster: RedisCluster::start(3, replicas),
            prefix: unique("rl-cluster"),
        }
    }

    fn builder(&self) -> redlatch::LockClientBuilder {
        LockClient::cluster_builder(ClusterClientBuilder::new(self.cluster.urls()))
            .key_prefix(&self.prefix)
    }

    /// A client of its own: a stand-in for another process.
    fn client(&self) -> LockClient {
        self.builder().build().expect("cluster client")
    }

    fn lock_key(&self, name: &str) -> String {
        format!("{}:{{{name}}}", self.prefix)
    }

    /// One name on each master, in master order.
    fn names_on_every_master(&self, stem: &str) -> Vec<String> {
        let mut names = vec![None; self.cluster.masters()];
        for i in 0.. {
            let name = format!("{stem}-{i}");
            let owner = self
                .cluster
                .owner(slot(&self.lock_key(&name)))
                .expect("owner");
            if names[owner].is_none() {
                names[owner] = Some(name);
            }
            if names.iter().all(Option::is_some) {
                break;
            }
        }
        names.into_iter().flatten().collect()
    }

    /// A name on master 0, and a proxy through which clients reach that master (it announces
    /// the proxy's port).
    async fn behind_proxy(&self, stem: &str) -> (String, Proxy) {
        let name = self.names_on_every_master(stem).remove(0);
        let master = self
            .cluster
            .owner(slot(&self.lock_key(&name)))
            .expect("owner");
        let port = self.cluster.nodes[master].server.port();
        let proxy = Proxy::start(([127, 0, 0, 1], port).into())
            .await
            .expect("proxy");
        tokio::task::block_in_place(|| self.cluster.announce(master, proxy.addr().port()))
            .expect("announce");
        (name, proxy)
    }

    /// A connection to the master serving `key`, for the test's own reads and writes.
    async fn conn_for(&self, key: &str) -> redis::aio::MultiplexedConnection {
        let url = self.cluster.owner_url(key).expect("owner");
        redis::Client::open(url)
            .expect("client")
            .get_multiplexed_async_connection()
            .await
            .expect("connection")
    }

    /// Keys of this test left on any master, but fencing counters (which outlive locks on
    /// purpose) and request logs (which expire 10 s after they were made).
    fn leftovers(&self) -> Vec<String> {
        self.cluster
            .keys_matching(&format!("{}:*", self.prefix))
            .expect("keys")
            .into_iter()
            .filter(|k| !k.ends_with(":fence") && !k.ends_with(":once"))
            .collect()
    }
}

fn no_overlap(intervals: &mut [(Duration, Duration)]) {
    intervals.sort();
    for pair in intervals.windows(2) {
        assert!(
            pair[0].1 <= pair[1].0,
            "holder intervals overlap: {:?} and {:?}",
            pair[0],
            pair[1]
        );
    }
}

/// 4 clients × 4 tasks × `sections` non-atomic increments of a counter beside `name` (same
/// hash tag), under a mutex (re-entered `depth` deep) or a fair mutex.
async fn count_under(
    t: &TestCluster,
    clients: &[LockClient],
    name: &str,
    fair: bool,
    depth: usize,
) {
    const SECTIONS: usize = 40;
    let counter = format!("{}:{{{name}}}:counter", t.prefix);
    let intervals = Arc::new(std::sync::Mutex::new(Vec::new()));
    let epoch = Instant::now();
    let mut tasks = Vec::new();
    for client in clients {
        for _ in 0..4 {
            let mutex = client.mutex(name).unwrap();
            let fair_mutex = client.fair_mutex(name).unwrap();
            let mut conn = t.conn_for(&counter).await;
            let counter = counter.clone();
            let intervals = Arc::clone(&intervals);
            tasks.push(tokio::spawn(async move {
                for _ in 0..SECTIONS {
                    let outer = if fair {
                        fair_mutex.lock().await.unwrap()
                    } else {
                        mutex.lock().await.unwrap()
                    };
                    let mut nested = Vec::new();
                    for _ in 1..depth {
                        let last = nested.last().unwrap_or(&outer);
                        let g = last.reenter().await.unwrap();
                        nested.push(g);
                    }
                    let start = epoch.elapsed();
                    support::racy_increment(&mut conn, &counter).await;
                    intervals.lock().unwrap().push((start, epoch.elapsed()));
                    while let Some(g) = nested.pop() {
                        g.unlock().await.unwrap();
                    }
                    outer.unlock().await.unwrap();
                }
            }));
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    let mut conn = t.conn_for(&counter).await;
    let total: u64 = redis::cmd("GET")
        .arg(&counter)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(total, (clients.len() * 4 * SECTIONS) as u64, "{name}");
    let _: () = redis::cmd("DEL")
        .arg(&counter)
        .query_async(&mut conn)
        .await
        .unwrap();
    no_overlap(&mut intervals.lock().unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutexes_count_exactly_on_every_master() {
    let t = TestCluster::start(0);
    within(LIMIT, async {
        let clients: Vec<_> = (0..4).map(|_| t.client()).collect();
        let names = t.names_on_every_master("count");
        assert_eq!(names.len(), 3);
        let owners: Vec<usize> = names
            .iter()
            .map(|n| t.cluster.owner(slot(&t.lock_key(n))).unwrap())
            .collect();
        assert_eq!(owners, vec![0, 1, 2], "one name per master");
        let runs = names.iter().enumerate().map(|(i, name)| {
            let (t, clients) = (&t, &clients);
            async move {
                // Master 0: a plain mutex; 1: re-entered twice more; 2: the fair mutex.
                count_under(t, clients, name, i == 2, if i == 1 { 3 } else { 1 }).await;
                // The name's request log expires on its own, within 10 s (read at once: the
                // runs end at different times).
                let log = format!("{}:once", t.lock_key(name));
                let mut conn = t.conn_for(&log).await;
                let ttl: i64 = redis::cmd("PTTL")
                    .arg(&log)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                assert!((1..=10_000).contains(&ttl), "{log}: {ttl} ms");
            }
        });
        futures_util::future::join_all(runs).await;
        assert!(t.leftovers().is_empty(), "{:?}", t.leftovers());
        // No other request log: one per name at most (an early one may have expired).
        let logs: Vec<String> = t
            .cluster
            .keys_matching(&format!("{}:*:once", t.prefix))
            .unwrap();
        let expected: Vec<String> = names
            .iter()
            .map(|n| format!("{}:once", t.lock_key(n)))
            .collect();
        assert!(logs.iter().all(|l| expected.contains(l)), "{logs:?}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_waiters_are_served_in_order_on_every_master() {
    let t = TestCluster::start(0);
    within(LIMIT, async {
        let clients: Vec<_> = (0..4).map(|_| t.client()).collect();
        for name in t.names_on_every_master("order") {
            let holder = clients[0].fair_mutex(&name).unwrap().lock().await.unwrap();
            let order = Arc::new(LocalMutex::new(Vec::new()));
            let mut tasks = Vec::new();
            for i in 0..8 {
                let mutex = clients[i % 4].fair_mutex(&name).unwrap();
                let order = Arc::clone(&order);
                tasks.push(tokio::spawn(async move {
                    let guard = mutex.lock().await.unwrap();
                    order.lock().await.push(i);
                    guard.unlock().await.unwrap();
                }));
                until(|| async { clients[0].inspect(&name).await.unwrap().waiters.len() == i + 1 })
                    .await;
            }
            holder.unlock().await.unwrap();
            for task in tasks {
                task.await.unwrap();
            }
            assert_eq!(*order.lock().await, (0..8).collect::<Vec<_>>(), "{name}");
        }
        assert!(t.leftovers().is_empty(), "{:?}", t.leftovers());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elections_lead_in_turn_and_are_observed_on_every_master() {
    use futures_util::StreamExt;

    let t = TestCluster::start(0);
    within(LIMIT, async {
        let clients: Vec<_> = (0..4).map(|_| t.client()).collect();
        for name in t.names_on_every_master("elect") {
            // The observer hears the records by sharded pub/sub, from the name's master.
            let mut changes = clients[3].election(&name).unwrap().observe().await.unwrap();
            assert_eq!(changes.next().await.unwrap().unwrap(), None);
            let first = clients[0]
                .election(&name)
                .unwrap()
                .campaign("c0")
                .await
                .unwrap();
            let mut tasks = Vec::new();
            for i in 1..3 {
                let election = clients[i].election(&name).unwrap();
                tasks.push(tokio::spawn(async move {
                    let leadership = election.campaign(format!("c{i}")).await.unwrap();
                    let term = leadership.term();
                    leadership.resign().await.unwrap();
                    term
                }));
                until(|| async { clients[0].inspect(&name).await.unwrap().waiters.len() == i })
                    .await;
            }
            let mut terms = vec![first.term()];
            first.resign().await.unwrap();
            for task in tasks {
                terms.push(task.await.unwrap());
            }
            assert!(terms.windows(2).all(|w| w[0] < w[1]), "{terms:?}");
            let mut seen = Vec::new();
            while seen.len() < 3 {
                if let Some(leader) = changes.next().await.unwrap().unwrap() {
                    seen.push((leader.term, leader.value));
                }
            }
            let expected: Vec<(u64, String)> = terms
                .iter()
                .enumerate()
                .map(|(i, term)| (*term, format!("c{i}")))
                .collect();
            assert_eq!(seen, expected, "{name}");
            assert_eq!(changes.next().await.unwrap().unwrap(), None);
        }
        until(|| async { t.leftovers().is_empty() }).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphores_and_rwlocks_keep_their_bounds_on_every_master() {
    let t = TestCluster::start(0);
    within(LIMIT, async {
        let clients: Vec<_> = (0..4).map(|_| t.client()).collect();
        for name in t.names_on_every_master("bounds") {
            // A semaphore of 3 under 16 tasks: never more than 3 holders, and 3 reached.
            let inside = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let most = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let mut tasks = Vec::new();
            for (c, client) in clients.iter().enumerate() {
                for _ in 0..4 {
                    let sem = client.semaphore(&format!("{name}-sem"), 3).unwrap();
                    let (inside, most) = (Arc::clone(&inside), Arc::clone(&most));
                    tasks.push(tokio::spawn(async move {
                        for _ in 0..15 {
                            let permit = sem.acquire().await.unwrap();
                            let now = inside.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                            most.fetch_max(now, std::sync::atomic::Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(1 + c as u64)).await;
                            inside.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                            permit.release().await.unwrap();
                        }
                    }));
                }
            }
            for task in tasks {
                task.await.unwrap();
            }
            assert_eq!(most.load(std::sync::atomic::Ordering::SeqCst), 3, "{name}");
            let sem = clients[0].semaphore(&format!("{name}-sem"), 3).unwrap();
            assert_eq!(sem.available_permits().await.unwrap(), 3);

            // An RwLock: writers overlap nobody.
            let epoch = Instant::now();
            let log = Arc::new(std::sync::Mutex::new(Vec::new()));
            let mut tasks = Vec::new();
            for (c, client) in clients.iter().enumerate() {
                for k in 0..3 {
                    let lock = client.rwlock(&format!("{name}-rw")).unwrap();
                    let log = Arc::clone(&log);
                    let writer = k == 0;
                    tasks.push(tokio::spawn(async move {
                        for _ in 0..10 {
                            if writer {
                                let g = lock.write().await.unwrap();
                                let start = epoch.elapsed();
                                tokio::time::sleep(Duration::from_millis(1)).await;
                                log.lock().unwrap().push((true, start, epoch.elapsed()));
                                g.unlock().await.unwrap();
                            } else {
                                let g = lock.read().await.unwrap();
                                let start = epoch.elapsed();
                                tokio::time::sleep(Duration::from_millis(1 + c as u64)).await;
                                log.lock().unwrap().push((false, start, epoch.elapsed()));
                                g.unlock().await.unwrap();
                            }
                        }
                    }));
                }
            }
            for task in tasks {
                task.await.unwrap();
            }
            let log = log.lock().unwrap().clone();
            for (i, a) in log.iter().enumerate() {
                for b in log.iter().skip(i + 1) {
                    if a.0 || b.0 {
                        assert!(a.2 <= b.1 || b.2 <= a.1, "writer overlap: {a:?} {b:?}");
                    }
                }
            }
        }
        assert!(t.leftovers().is_empty(), "{:?}", t.leftovers());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_and_force_unlock_work_on_a_cluster() {
    let t = TestCluster::start(0);
    within(LIMIT, async {
        let client = t.client();
        for name in t.names_on_every_master("admin") {
            let guard = client.fair_mutex(&name).unwrap().lock().await.unwrap();
            let snapshot = client.inspect(&name).await.unwrap();
            assert_eq!(snapshot.holders.len(), 1);
            assert_eq!(snapshot.last_fencing_token, Some(guard.fencing_token()));
            let forced = client.force_unlock(&name).await.unwrap();
            assert_eq!(forced.holders, 1);
            tokio::time::timeout(Duration::from_secs(15), guard.lost())
                .await
                .expect("the forced guard learns it lost the lock");
            assert!(client.inspect(&name).await.unwrap().holders.is_empty());
        }
        // A handle on a name with braces is refused before anything is sent.
        assert!(matches!(
            client.mutex("a{b}"),
            Err(Error::InvalidArgument { .. })
        ));
        // Waiting for replicas is a single master's setting: a handle refuses it at once.
        let durable = client
            .semaphore("admin-durable", 2)
            .unwrap()
            .with_durability(redlatch::Durability::Replicas {
                count: 1,
                timeout: Duration::from_millis(100),
            });
        assert!(
            matches!(durable, Err(Error::Unsupported { .. })),
            "{durable:?}"
        );
        assert!(t.leftovers().is_empty(), "{:?}", t.leftovers());
    })
    .await;
}

/// A slot holding a held lock and queued waiters moves to another master: the holder keeps
/// its lease (renewed on the new owner), the waiters are woken and acquire there, one at a
/// time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_moved_slot_keeps_its_holder_and_wakes_its_waiters() {
    let t = TestCluster::start(0);
    let lease = Duration::from_millis(1500);
    let clients: Vec<_> = (0..3)
        .map(|_| t.builder().default_lease(lease).build().unwrap())
        .collect();
    let name = t.names_on_every_master("moving").remove(0);
    let key = t.lock_key(&name);
    let runtime = tokio::runtime::Handle::current();
    within(LIMIT, async {
        let holder = clients[0].fair_mutex(&name).unwrap().lock().await.unwrap();
        let plain_holder = clients[0]
            .mutex(&format!("{name}:plain"))
            .unwrap()
            .lock()
            .await
            .unwrap();
        let epoch = Instant::now();
        let log = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..4 {
            let fair = clients[1 + i % 2].fair_mutex(&name).unwrap();
            let plain = clients[1 + i % 2].mutex(&format!("{name}:plain")).unwrap();
            let log = Arc::clone(&log);
            tasks.push(tokio::spawn(async move {
                let g = fair.lock().await.unwrap();
                let start = epoch.elapsed();
                tokio::time::sleep(Duration::from_millis(5)).await;
                log.lock().unwrap().push((start, epoch.elapsed()));
                g.unlock().await.unwrap();
                let g = plain.lock().await.unwrap();
                g.unlock().await.unwrap();
            }));
        }
        until(|| async { clients[0].inspect(&name).await.unwrap().waiters.len() == 4 }).await;
        // The whole move runs on a blocking thread. The slot stays marked migrating for a
        // third of the lease before its keys move, so renewals fall into the move: a script
        // whose keys do not all exist there is answered `TRYAGAIN` until the keys have moved
        // (redis-rs retries it), then `MOVED`.
        let cluster = &t.cluster;
        let target = (cluster.owner(slot(&key)).unwrap() + 1) % 3;
        tokio::task::block_in_place(|| {
            cluster
                .migrate(slot(&key), target, || {
                    runtime.block_on(tokio::time::sleep(lease / 3));
                })
                .unwrap();
        });
        assert_eq!(cluster.owner(slot(&key)).unwrap(), target);
        // A lease after the move, the holds are still held: renewed on the new owner.
        tokio::time::sleep(lease).await;
        assert!(
            holder.is_held(),
            "the fair holder kept its hold through the move"
        );
        assert!(
            plain_holder.is_held(),
            "the mutex holder kept its hold through the move"
        );
        let holder_end = epoch.elapsed();
        holder.unlock().await.unwrap();
        plain_holder.unlock().await.unwrap();
        for task in tasks {
            task.await.unwrap();
        }
        let mut log = log.lock().unwrap().clone();
        assert_eq!(log.len(), 4);
        assert!(log.iter().all(|(start, _)| *start >= holder_end));
        no_overlap(&mut log);
        assert!(t.leftovers().is_empty(), "{:?}", t.leftovers());
    })
    .await;
}

/// A master fails over to its replica while locks are held and waited for: the waiters go on
/// within the failover and a second, holders whose hold did not survive learn it, and new locks
/// work without a new client. No redirect error reaches a caller.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_to_a_replica_keeps_waiters_going() {
    let mut t = TestCluster::start(1);
    // Longer than a failover (about 2 to 3 s here), so renewals that cannot reach the failed
    // master in the meantime do not give the holds up.
    let lease = Duration::from_secs(10);
    let clients: Vec<_> = (0..2)
        .map(|_| t.builder().default_lease(lease).build().unwrap())
        .collect();
    let name = t.names_on_every_master("failing").remove(0);
    let key = t.lock_key(&name);
    let master = t.cluster.owner(slot(&key)).unwrap();
    // A hold and its waiter on the master that fails, and a hold on another master.
    let holder = clients[0].fair_mutex(&name).unwrap().lock().await.unwrap();
    let other = t.names_on_every_master("elsewhere").remove(1);
    let other_holder = clients[0].mutex(&other).unwrap().lock().await.unwrap();
    // A second hold on the failing master, which the test takes from the new master after the
    // failover: the state a write that never reached the replica leaves behind.
    let forgotten_name = t.names_on_every_master("forgotten").remove(master);
    let forgotten = clients[1]
        .mutex(&forgotten_name)
        .unwrap()
        .lock()
        .await
        .unwrap();
    let waiter = {
        let fair = clients[1].fair_mutex(&name).unwrap();
        tokio::spawn(async move {
            let g = fair.lock_timeout(Duration::from_secs(60)).await?;
            let at = Instant::now();
            g.unlock().await?;
            Ok::<_, Error>(at)
        })
    };
    until(|| async { clients[0].inspect(&name).await.unwrap().waiters.len() == 1 }).await;
    // Replication is asynchronous, but the hold and the queue place were written well before
    // the kill: the replica has them.
    let (promoted, took) = tokio::task::block_in_place(|| t.cluster.fail_over(master)).unwrap();
    assert_ne!(promoted, master);
    let settled = Instant::now();
    within(LIMIT, async {
        // The hold and the queue place were written well before the kill and replicated: the
        // holder still holds on the new master, and its release hands the lock to the waiter.
        assert!(holder.is_held(), "the hold survived the failover");
        holder.unlock().await.unwrap();
        let acquired = waiter
            .await
            .unwrap()
            .expect("the waiter acquires after the failover");
        let resumed = acquired.saturating_duration_since(settled);
        assert!(
            resumed <= Duration::from_secs(1),
            "the waiter resumed {resumed:?} after the failover ended (it took {took:?})"
        );
        // The hold on the other master never noticed anything.
        assert!(other_holder.is_held());
        // The hold the new master does not have: its holder learns it at its next renewal,
        // within the lease.
        let forgotten_key = t.lock_key(&forgotten_name);
        let removed: i64 = t
            .cluster
            .on_owner(&forgotten_key, |c| {
                redis::cmd("DEL").arg(&forgotten_key).query(c)
            })
            .unwrap();
        assert_eq!(removed, 1, "the new master had the hold");
        tokio::time::timeout(lease, forgotten.lost())
            .await
            .expect("a hold the new master does not have is lost within the lease");
        assert!(!forgotten.is_held());
        // New locks on the promoted master and elsewhere, from the same clients.
        for client in &clients {
            let g = client.mutex(&name).unwrap().lock().await.unwrap();
            g.unlock().await.unwrap();
            let g = client
                .semaphore(&format!("{name}-sem"), 2)
                .unwrap()
                .acquire()
                .await
                .unwrap();
            g.release().await.unwrap();
        }
        other_holder.unlock().await.unwrap();
        assert!(t.leftovers().is_empty(), "{:?}", t.leftovers());
    })
    .await;
}

/// A client over a deadpool-redis cluster pool works as one over a builder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadpool_cluster_pool_serves_a_client() {
    let t = TestCluster::start(0);
    within(LIMIT, async {
        let pool = deadpool_redis::cluster::Config::from_urls(t.cluster.urls())
            .create_pool(Some(deadpool_redis::Runtime::Tokio1))
            .unwrap();
        let pooled = LockClient::cluster_pool_builder(pool, t.cluster.urls())
            .key_prefix(&t.prefix)
            .build()
            .unwrap();
        let other = t.client();
        for name in t.names_on_every_master("pooled") {
            let guard = pooled.fair_mutex(&name).unwrap().lock().await.unwrap();
            let waiting = {
                let fair = other.fair_mutex(&name).unwrap();
                tokio::spawn(async move { fair.lock().await.map(|g| g.fencing_token()) })
            };
            until(|| async { pooled.inspect(&name).await.unwrap().waiters.len() == 1 }).await;
            let token = guard.fencing_token();
            guard.unlock().await.unwrap();
            let next = waiting.await.unwrap().unwrap();
            assert!(next > token);
        }
        let empty: Vec<String> = Vec::new();
        let pool = deadpool_redis::cluster::Config::from_urls(t.cluster.urls())
            .create_pool(Some(deadpool_redis::Runtime::Tokio1))
            .unwrap();
        assert!(matches!(
            LockClient::cluster_pool(pool, empty),
            Err(Error::InvalidArgument { .. })
        ));
    })
    .await;
}

/// The hold count of the one holder of `name`.
async fn holds(client: &LockClient, name: &str) -> u32 {
    let snapshot = client.inspect(name).await.unwrap();
    assert_eq!(snapshot.holders.len(), 1, "{snapshot:?}");
    snapshot.holders[0].exclusive_holds
}

/// A re-entry and a release whose replies are lost (the connection reset after the request
/// ran) are re-sent by the cluster client, and their scripts run a second time: the hold count
/// changes once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_runs_twice_changes_the_hold_count_once() {
    let t = TestCluster::start(0);
    let (name, proxy) = t.behind_proxy("twice").await;
    // No renewals: the only replies through the proxy are the test's.
    let client = t.builder().watchdog(false).build().unwrap();
    let observer = t.client();
    within(LIMIT, async {
        for fair in [false, true] {
            let first = if fair {
                client.fair_mutex(&name).unwrap().lock().await.unwrap()
            } else {
                client.mutex(&name).unwrap().lock().await.unwrap()
            };
            let second = first.reenter().await.unwrap();
            assert_eq!(holds(&observer, &name).await, 2);

            let before = proxy.replies_lost();
            proxy.lose_next_reply();
            let third = second.reenter().await.unwrap();
            assert_eq!(
                proxy.replies_lost(),
                before + 1,
                "the re-entry's reply was lost"
            );
            assert_eq!(holds(&observer, &name).await, 3, "fair: {fair}");

            let resets = proxy.replies_lost();
            proxy.lose_next_reply();
            third.unlock().await.unwrap();
            assert_eq!(
                proxy.replies_lost(),
                resets + 1,
                "the release's reply was lost"
            );
            assert_eq!(holds(&observer, &name).await, 2, "fair: {fair}");
            second.unlock().await.unwrap();
            first.unlock().await.unwrap();
            assert!(observer.inspect(&name).await.unwrap().holders.is_empty());
        }
    })
    .await;
}

/// A connection to a master that stays open and says nothing (a half-open connection, as when
/// a NAT or a load balancer forgets it; the master itself is fine) was kept: redis-rs keeps a
/// connection whose request timed out and connects again only when one breaks, so every
/// request to that master timed out, a hold's renewals with them, and the hold was lost. (The
/// straight way to a master, which would make a connection of its own, is off here: the
/// cluster asks for a password that only the cluster client has.) A deadpool pool's cluster
/// client has no response timeout at all: its requests waited for ever. After a request times
/// out (redlatch's own 2 s limit on a pool's), the next one now goes on a new connection: the
/// hold is renewed, late, and kept, and the lock is released and taken again, with a client of
/// each kind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_connection_to_a_master_is_replaced() {
    const PASSWORD: &str = "silent-pw";
    let t = TestCluster::start(0);
    let (name, proxy) = t.behind_proxy("silent").await;
    let key = t.lock_key(&name);
    let port = t.cluster.nodes[t.cluster.owner(slot(&key)).unwrap()]
        .server
        .port();
    let password = async |url: String, from: &str, to: &str| {
        let url = if from.is_empty() {
            url
        } else {
            url.replacen("redis://", &format!("redis://:{from}@"), 1)
        };
        let mut conn = redis::Client::open(url)
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("requirepass")
            .arg(to)
            .query_async(&mut conn)
            .await
            .unwrap();
        conn
    };
    let mut direct = None;
    for node in &t.cluster.nodes {
        let conn = password(node.server.url(), "", PASSWORD).await;
        if node.server.port() == port {
            direct = Some(conn);
        }
    }
    let direct = direct.unwrap();
    // Renewed every 5 s: renewals stuck for a whole lease lose it.
    let lease = Duration::from_secs(15);
    let built = || {
        LockClient::cluster_builder(ClusterClientBuilder::new(t.cluster.urls()).password(PASSWORD))
            .key_prefix(&t.prefix)
            .default_lease(lease)
            .build()
            .unwrap()
    };
    // The pool has the password, the seeds (for the straight way and the subscription) not.
    let pooled = || {
        let urls = t
            .cluster
            .urls()
            .into_iter()
            .map(|url| url.replacen("redis://", &format!("redis://:{PASSWORD}@"), 1));
        let pool = deadpool_redis::cluster::Config::from_urls(urls.collect::<Vec<_>>())
            .create_pool(Some(deadpool_redis::Runtime::Tokio1))
            .unwrap();
        LockClient::cluster_pool_builder(pool, t.cluster.urls())
            .key_prefix(&t.prefix)
            .default_lease(lease)
            .build()
            .unwrap()
    };
    within(LIMIT, async {
        for (kind, client) in [("builder", built()), ("pool", pooled())] {
            let pttl = || {
                let (mut conn, key) = (direct.clone(), key.clone());
                async move {
                    redis::cmd("PTTL")
                        .arg(&key)
                        .query_async::<i64>(&mut conn)
                        .await
                        .unwrap()
                }
            };
            let guard = client.mutex(&name).unwrap().lock().await.unwrap();
            // Every connection open now goes silent (the builder's client's, left over, too).
            proxy.set(Mode::Strand);
            // A renewal gets through the strand (the lease in Redis goes up again) before the lease
            // is over: the lowest PTTL seen so far, and the last one read.
            let (low, last) = (AtomicI64::new(i64::MAX), AtomicI64::new(0));
            until(|| async {
                let left = pttl().await;
                last.store(left, Ordering::Relaxed);
                let low = low.fetch_min(left, Ordering::Relaxed).min(left);
                left < 0 || left > low + 1_000
            })
            .await;
            let (low, last) = (low.into_inner(), last.into_inner());
            assert!(
                last > 0,
                "{kind}: the lease ran out unrenewed (lowest PTTL {low} ms)"
            );
            // The renewal was late: the silent connection held it up.
            assert!(
                low < 9_000,
                "{kind}: no renewal was held up (lowest PTTL {low} ms)"
            );
            assert!(guard.is_held());
            guard.unlock().await.unwrap();
            client
                .mutex(&name)
                .unwrap()
                .lock()
                .await
                .unwrap()
                .unlock()
                .await
                .unwrap();
            assert_eq!(pttl().await, -2, "{kind}: the lock key is left");
        }
    })
    .await;
    for node in &t.cluster.nodes {
        password(node.server.url(), PASSWORD, "").await;
    }
    assert!(t.leftovers().is_empty(), "{:?}", t.leftovers());
}

/// A client's subscription connection to a master that stays open and says nothing (the
/// master itself fine) kept its waiters deaf: a release there was never heard, and a waiter
/// waited for the holder's lease (60 s here). The subscription now asks every master for a
/// `PING` every 10 s and, unanswered, moves to a new connection, its waiters trying meanwhile:
/// the waiter gets the lock well within the holder's lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_subscription_goes_silent_still_gets_the_lock() {
    let t = TestCluster::start(0);
    let (name, proxy) = t.behind_proxy("deaf").await;
    let lease = Duration::from_secs(60);
    let holding = t.builder().default_lease(lease).build().unwrap();
    let waiting = t.client();
    let observer = t.client();
    within(LIMIT, async {
        let holder = holding.fair_mutex(&name).unwrap().lock().await.unwrap();
        let fair = waiting.fair_mutex(&name).unwrap();
        let waiter = tokio::spawn(async move { fair.lock_timeout(lease / 2).await });
        // Queued, and listening (its channel subscribed through the proxy).
        until(|| async { observer.inspect(&name).await.unwrap().waiters.len() == 1 }).await;
        let direct = t.conn_for(&t.lock_key(&name)).await;
        until(|| async {
            let channels: Vec<String> = redis::cmd("PUBSUB")
                .arg("SHARDCHANNELS")
                .arg(format!("{}:wake*", t.lock_key(&name)))
                .query_async(&mut direct.clone())
                .await
                .unwrap();
            !channels.is_empty()
        })
        .await;
        proxy.set(Mode::Strand);
        holder.unlock().await.unwrap();
        let got = waiter
            .await
            .unwrap()
            .expect("the waiter gets the lock within half the holder's lease");
        got.unlock().await.unwrap();
    })
    .await;
    assert!(t.leftovers().is_empty(), "{:?}", t.leftovers());
}

/// Found by review: a forced unlock sent straight to its master whose reply was lost (it ran)
/// was sent again through the cluster connection, and its second run ended the hold another
/// client had taken in between. It is now never sent again by redlatch: its caller gets the
/// connection error, and the new hold stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_unlock_whose_reply_is_lost_is_not_sent_again() {
    let t = TestCluster::start(0);
    let (name, proxy) = t.behind_proxy("forced").await;
    let key = t.lock_key(&name);
    let admin = t.client();
    within(LIMIT, async {
        let stuck = admin.mutex(&name).unwrap().lock().await.unwrap();
        // The admin's straight connection to the master is made: a RESP2 one (its cluster
        // connections speak RESP3), other than this test's own; and its cluster connection's
        // script loads are over (none more while it makes a request). Then the next reply
        // through the proxy is the forced unlock's.
        let mut direct = t.conn_for(&key).await;
        let mine: i64 = redis::cmd("CLIENT")
            .arg("ID")
            .query_async(&mut direct)
            .await
            .unwrap();
        let loads = || {
            let mut direct = direct.clone();
            async move {
                let stats: String = redis::cmd("INFO")
                    .arg("commandstats")
                    .query_async(&mut direct)
                    .await
                    .unwrap();
                stats
                    .lines()
                    .find_map(|l| l.strip_prefix("cmdstat_script|load:calls="))
                    .and_then(|rest| rest.split(',').next()?.parse::<u64>().ok())
                    .unwrap_or(0)
            }
        };
        until(|| async {
            let before = loads().await;
            admin.inspect(&name).await.unwrap();
            let clients: String = redis::cmd("CLIENT")
                .arg("LIST")
                .query_async(&mut direct.clone())
                .await
                .unwrap();
            let straight = clients
                .lines()
                .any(|l| l.contains(" resp=2") && !l.starts_with(&format!("id={mine} ")));
            straight && before > 0 && loads().await == before
        })
        .await;
        // Another process, straight to the master, takes the name as soon as it is free.
        let url = t.cluster.owner_url(&key).unwrap();
        let pool = deadpool_redis::Config::from_url(url.as_str())
            .create_pool(Some(deadpool_redis::Runtime::Tokio1))
            .unwrap();
        let other = LockClient::builder(pool, url.as_str())
            .key_prefix(&t.prefix)
            .build()
            .unwrap();
        proxy.lose_next_reply_then(Mode::Blackhole);
        let forced = {
            let (admin, name) = (admin.clone(), name.clone());
            tokio::spawn(async move { admin.force_unlock(&name).await })
        };
        let taken = {
            let mutex = other.mutex(&name).unwrap();
            let taken = std::sync::Mutex::new(None);
            until(|| async {
                let got = mutex.try_lock().await.unwrap();
                let found = got.is_some();
                *taken.lock().unwrap() = got;
                found
            })
            .await;
            taken.into_inner().unwrap().unwrap()
        };
        proxy.set(Mode::Pass);
        let forced = forced.await.unwrap();
        assert!(forced.is_err(), "the lost reply was sent again: {forced:?}");
        let holders = other.inspect(&name).await.unwrap().holders;
        assert_eq!(holders.len(), 1, "the new hold was ended: {holders:?}");
        assert!(taken.is_held());
        taken.unlock().await.unwrap();
        drop(stuck);
    })
    .await;
    assert!(t.leftovers().is_empty(), "{:?}", t.leftovers());
}

/// A master that hangs (its connections stay open and silent, as on a host that froze) is
/// failed over to its replica. A client that listened to the cluster before still serves a new
/// waiter there: the subscription the hung node cannot confirm leaves the waiter polling, not
/// waiting for a message that cannot come, and it gets the lock once it is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_waiter_on_a_hung_masters_slots_gets_the_lock_after_the_failover() {
    let mut t = TestCluster::start(1);
    let waiting = t.client();
    let names = t.names_on_every_master("hung");
    let master = t.cluster.owner(slot(&t.lock_key(&names[0]))).unwrap();
    within(LIMIT, async {
        // The waiting client's subscription is made, by a wait on another master.
        let other = t.client();
        let warm = other.fair_mutex(&names[1]).unwrap().lock().await.unwrap();
        let fair = waiting.fair_mutex(&names[1]).unwrap();
        let warmed = tokio::spawn(async move { fair.lock().await });
        until(|| async { other.inspect(&names[1]).await.unwrap().waiters.len() == 1 }).await;
        warm.unlock().await.unwrap();
        warmed.await.unwrap().unwrap().unlock().await.unwrap();
    })
    .await;
    let promoted = tokio::task::block_in_place(|| t.cluster.fail_over_frozen(master)).unwrap();
    assert_ne!(promoted, master);
    within(LIMIT, async {
        let fresh = t.client();
        let holder = fresh.fair_mutex(&names[0]).unwrap().lock().await.unwrap();
        let fair = waiting.fair_mutex(&names[0]).unwrap();
        let waiter = tokio::spawn(async move { fair.lock_timeout(Duration::from_secs(20)).await });
        until(|| async { fresh.inspect(&names[0]).await.unwrap().waiters.len() == 1 }).await;
        holder.unlock().await.unwrap();
        let got = waiter
            .await
            .unwrap()
            .expect("the waiter gets the lock after its release");
        got.unlock().await.unwrap();
    })
    .await;
    t.cluster.thaw(master);
}

/// A master down for good (no replica takes its slots over, and the others serve theirs): the
/// channels of its names cannot be subscribed again, and the waiters on the other masters must
/// still be woken by their releases' messages, not left to poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_on_the_other_masters_are_woken_by_push_while_one_master_is_down() {
    let mut t = TestCluster::start(0);
    tokio::task::block_in_place(|| {
        for url in t.cluster.urls() {
            let mut conn = redis::Client::open(url)
                .and_then(|c| c.get_connection())
                .expect("node");
            let () = redis::cmd("CONFIG")
                .arg("SET")
                .arg("cluster-require-full-coverage")
                .arg("no")
                .query(&mut conn)
                .expect("CONFIG SET");
        }
    });
    let names = t.names_on_every_master("down");
    // Waiters that look on their own only every 60 s: one that gets the lock sooner was told.
    let waiting = t
        .builder()
        .wait_backoff(Duration::from_secs(60), Duration::from_secs(60))
        .build()
        .unwrap();
    let holder = t.client();
    let (on_dead, on_live, dead_waiter, live_waiter) = within(LIMIT, async {
        let on_dead = holder.fair_mutex(&names[0]).unwrap().lock().await.unwrap();
        let on_live = holder.fair_mutex(&names[1]).unwrap().lock().await.unwrap();
        let dead = waiting.fair_mutex(&names[0]).unwrap();
        let dead_waiter =
            tokio::spawn(async move { dead.lock_timeout(Duration::from_secs(60)).await });
        let live = waiting.fair_mutex(&names[1]).unwrap();
        let live_waiter = tokio::spawn(async move { live.lock().await });
        for name in &names[..2] {
            until(|| async { holder.inspect(name).await.unwrap().waiters.len() == 1 }).await;
        }
        (on_dead, on_live, dead_waiter, live_waiter)
    })
    .await;
    // Master 0 (the first node) goes, and with it the channel of the waiter on it.
    tokio::task::block_in_place(|| t.cluster.nodes[0].server.kill());
    within(LIMIT, async {
        // The client loses its connection to it at once, and subscribes again to what it can.
        tokio::time::sleep(Duration::from_secs(2)).await;
        on_live.unlock().await.unwrap();
        let got = tokio::time::timeout(Duration::from_secs(20), live_waiter)
            .await
            .expect("the waiter on a live master was not woken by the release")
            .unwrap()
            .unwrap();
        got.unlock().await.unwrap();
        dead_waiter.abort();
        drop(on_dead);
    })
    .await;
}

/// A server that closes idle clients (`timeout`) closes the client's request connection to a
/// node between requests; the wake-up subscription (a subscribed client, exempt) goes on. Its
/// waiters must not be told the subscription was lost each time, nor their channels
/// subscribed again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_request_connection_closed_by_the_server_leaves_the_subscription_alone() {
    let t = TestCluster::start(0);
    let names = t.names_on_every_master("idle");
    let holder = t.client();
    let waiting = t.client();
    // A waiter on every master: the subscription has a channel on each of its node links.
    let (guards, waiters) = within(LIMIT, async {
        let mut guards = Vec::new();
        let mut waiters = Vec::new();
        for name in &names {
            guards.push(holder.fair_mutex(name).unwrap().lock().await.unwrap());
            let fair = waiting.fair_mutex(name).unwrap();
            waiters.push(tokio::spawn(async move { fair.lock().await }));
            until(|| async { holder.inspect(name).await.unwrap().waiters.len() == 1 }).await;
        }
        (guards, waiters)
    })
    .await;
    let subscribes = || {
        tokio::task::block_in_place(|| {
            let mut calls = 0;
            for url in t.cluster.urls() {
                let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
                let info: String = redis::cmd("INFO")
                    .arg("commandstats")
                    .query(&mut conn)
                    .unwrap();
                calls += info
                    .lines()
                    .find_map(|l| l.strip_prefix("cmdstat_ssubscribe:calls="))
                    .and_then(|rest| rest.split(',').next()?.parse::<u64>().ok())
                    .unwrap_or(0);
            }
            calls
        })
    };
    tokio::task::block_in_place(|| {
        for url in t.cluster.urls() {
            let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
            let () = redis::cmd("CONFIG")
                .arg("SET")
                .arg("timeout")
                .arg("1")
                .query(&mut conn)
                .unwrap();
        }
    });
    let before = subscribes();
    within(LIMIT, async {
        // Long enough for the server to close the idle request connections a few times.
        tokio::time::sleep(Duration::from_secs(5)).await;
    })
    .await;
    let after = subscribes();
    assert_eq!(after, before, "the channels were subscribed again");
    within(LIMIT, async {
        for (guard, waiter) in guards.into_iter().zip(waiters) {
            guard.unlock().await.unwrap();
            waiter.await.unwrap().unwrap().unlock().await.unwrap();
        }
    })
    .await;
}
