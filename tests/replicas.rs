//! A master with a replica on loopback, the replication link through a proxy that can cut it:
//! the durability setting's `WAIT` (never sent when off, failing an acquisition whose write no
//! replica has, one `WAIT` for many writes), and the negative control: without it, a failover to
//! the replica forgets a granted lock.

mod support;

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redlatch::{Durability, Error};
use redlatch_harness::proxy::Mode;
use redlatch_harness::resource::Resource;
use support::replicated::Replicated;
use support::{RedisServer, until, until_within, within};
use tokio::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_setting_off_no_wait_is_ever_sent() {
    within(Duration::from_secs(60), async {
        let bed = Replicated::start().await;
        // The harness's own check that the replica acknowledges sent some.
        let before = bed.calls("wait").await;
        let client = bed.builder(&bed.master).build().expect("client");
        for name in ["a", "b", "c"] {
            client
                .mutex(name)
                .expect("mutex")
                .lock()
                .await
                .expect("lock")
                .unlock()
                .await
                .expect("unlock");
            client
                .fair_mutex(name)
                .expect("fair")
                .lock()
                .await
                .expect("lock")
                .unlock()
                .await
                .expect("unlock");
        }
        assert_eq!(
            bed.calls("wait").await,
            before,
            "no WAIT without durability"
        );
        let durable = bed
            .builder(&bed.master)
            .durability(Durability::AllReplicas {
                timeout: Duration::from_secs(1),
            })
            .build()
            .expect("client");
        let guard = durable
            .mutex("d")
            .expect("mutex")
            .lock()
            .await
            .expect("lock");
        guard.unlock().await.expect("unlock");
        assert!(bed.calls("wait").await > before, "WAIT with durability");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_replication_fails_a_durable_acquire_and_leaves_nothing() {
    within(Duration::from_secs(60), async {
        let bed = Replicated::start().await;
        let timeout = Duration::from_millis(300);
        let client = bed
            .builder(&bed.master)
            .durability(Durability::Replicas { count: 1, timeout })
            .build()
            .expect("client");
        // Replicated: acknowledged (a handle of its own with a generous timeout, so that a
        // busy machine does not make the replica look absent).
        let generous = Durability::Replicas {
            count: 1,
            timeout: Duration::from_secs(10),
        };
        let guard = client
            .mutex("cut")
            .expect("mutex")
            .with_durability(generous)
            .expect("durability")
            .lock()
            .await
            .expect("lock");
        guard.unlock().await.expect("unlock");
        bed.link.set(Mode::Blackhole);
        for handle in ["mutex", "fair"] {
            let started = Instant::now();
            let result = match handle {
                "mutex" => client.mutex("cut").expect("mutex").lock().await.map(drop),
                _ => client
                    .fair_mutex("cut")
                    .expect("fair")
                    .lock()
                    .await
                    .map(drop),
            };
            let took = started.elapsed();
            assert!(
                matches!(
                    result,
                    Err(Error::NotReplicated {
                        acked: 0,
                        wanted: 1
                    })
                ),
                "{handle}: {result:?}"
            );
            assert!(took >= timeout, "{handle}: waited {took:?}");
            // What it took is released at once.
            until(|| async { !bed.exists(&bed.master, "cut").await }).await;
        }
        bed.link.set(Mode::Pass);
    })
    .await;
}

/// `ROLE` is `@dangerous`: a user without that category (a common hardening) cannot ask how
/// many replicas are connected, and an acquisition that must reach every one of them cannot
/// know it did. It fails, and gives back what it took, rather than count as replicated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_replicas_is_never_taken_as_acknowledged_when_role_is_refused() {
    within(Duration::from_secs(60), async {
        let bed = Replicated::start().await;
        let mut admin = bed.conn(&bed.master).await;
        let _: () = redis::cmd("ACL")
            .arg(&["SETUSER", "hardened", "on", ">secret", "~*", "&*"][..])
            .arg(&["+@all", "-@dangerous"][..])
            .query_async(&mut admin)
            .await
            .expect("ACL SETUSER");
        let url = format!("redis://hardened:secret@127.0.0.1:{}", bed.master.port());
        let pool = deadpool_redis::Config::from_url(url.as_str())
            .create_pool(Some(deadpool_redis::Runtime::Tokio1))
            .expect("pool");
        let client = redlatch::LockClient::builder(pool, url.as_str())
            .key_prefix(&bed.prefix)
            .durability(Durability::AllReplicas {
                timeout: Duration::from_millis(300),
            })
            .build()
            .expect("client");
        // The replica is connected but acknowledges nothing.
        bed.link.set(Mode::Blackhole);
        for handle in ["mutex", "fair"] {
            let result = match handle {
                "mutex" => client.mutex("hard").expect("mutex").lock().await.map(drop),
                _ => client
                    .fair_mutex("hard")
                    .expect("fair")
                    .lock()
                    .await
                    .map(drop),
            };
            assert!(
                matches!(result, Err(Error::NotReplicated { acked: 0, .. })),
                "{handle}: {result:?}"
            );
            until(|| async { !bed.exists(&bed.master, "hard").await }).await;
        }
        bed.link.set(Mode::Pass);
    })
    .await;
}

/// A durable hold whose renewals no replica acknowledges is at risk: its deadline stays where
/// the last acknowledged renewal put it, `lost()` fires there (while the master, which renewed
/// it, still has it), and a manual extension fails with `NotReplicated`. A hold whose
/// replication comes back before its deadline is kept, its deadline moved by the next renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unacknowledged_renewal_does_not_extend_a_durable_hold() {
    within(Duration::from_secs(60), async {
        let bed = Replicated::start().await;
        let client = bed
            .builder(&bed.master)
            .default_lease(Duration::from_secs(3))
            .durability(Durability::Replicas {
                count: 1,
                timeout: Duration::from_millis(500),
            })
            .build()
            .expect("client");
        let at_risk = client
            .mutex("at-risk")
            .expect("mutex")
            .lock()
            .await
            .expect("lock");
        bed.link.set(Mode::Blackhole);
        let refused = at_risk.extend(Duration::from_secs(3)).await;
        assert!(
            matches!(
                refused,
                Err(Error::NotReplicated {
                    acked: 0,
                    wanted: 1
                })
            ),
            "{refused:?}"
        );
        let deadline = at_risk.valid_until();
        at_risk.lost().await;
        assert!(
            std::time::Instant::now() >= deadline,
            "lost at its deadline, not before"
        );
        assert_eq!(at_risk.valid_until(), deadline, "no renewal counted");
        assert!(
            bed.exists(&bed.master, "at-risk").await,
            "the master renewed it; no replica has the renewal"
        );
        drop(at_risk);

        bed.link.set(Mode::Pass);
        let kept = client
            .mutex("kept")
            .expect("mutex")
            .lock()
            .await
            .expect("lock");
        bed.link.set(Mode::Blackhole);
        let refused = kept.extend(Duration::from_secs(3)).await;
        assert!(
            matches!(refused, Err(Error::NotReplicated { .. })),
            "{refused:?}"
        );
        let deadline = kept.valid_until();
        bed.link.set(Mode::Pass);
        until(|| async { kept.valid_until() > deadline }).await;
        assert!(kept.is_held());
        kept.unlock().await.expect("unlock");
        assert!(!bed.exists(&bed.master, "kept").await);
    })
    .await;
}

/// `Durability::Fsynced` asks the server once whether it has `WAITAOF`. Redis 7.0 (this test's
/// server) does not: the acquisition fails with `Unsupported` before any script runs, nothing
/// is left, and a handle without it goes on working over the same durable connection.
/// Found by review: the server was asked whether it has `WAITAOF` with `COMMAND INFO`, which a
/// user without `COMMAND` may not run: every fsynced acquisition then failed with a connection
/// error, asking again each time, instead of the documented `Unsupported`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fsynced_durability_is_refused_for_a_user_who_may_not_ask_about_commands() {
    within(Duration::from_secs(60), async {
        let bed = Replicated::start().await;
        let mut conn = bed.conn(&bed.master).await;
        let _: () = redis::cmd("ACL")
            .arg(&[
                "SETUSER", "locker", "on", ">pw", "~*", "&*", "+@all", "-command",
            ])
            .query_async(&mut conn)
            .await
            .expect("ACL SETUSER");
        let url = bed
            .master
            .url()
            .replacen("redis://", "redis://locker:pw@", 1);
        let pool = deadpool_redis::Config::from_url(url.as_str())
            .create_pool(Some(deadpool_redis::Runtime::Tokio1))
            .expect("pool");
        let client = redlatch::LockClient::builder(pool, url.as_str())
            .key_prefix(&bed.prefix)
            .durability(Durability::Fsynced {
                local: false,
                replicas: 1,
                timeout: Duration::from_millis(300),
            })
            .build()
            .expect("client");
        for _ in 0..2 {
            let refused = client.mutex("aof").expect("mutex").lock().await;
            assert!(
                matches!(refused, Err(Error::Unsupported { .. })),
                "{refused:?}"
            );
        }
        assert!(!bed.exists(&bed.master, "aof").await);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fsynced_durability_is_refused_by_a_server_without_waitaof() {
    within(Duration::from_secs(60), async {
        let bed = Replicated::start().await;
        let mut conn = bed.conn(&bed.master).await;
        let info: redis::Value = redis::cmd("COMMAND")
            .arg("INFO")
            .arg("WAITAOF")
            .query_async(&mut conn)
            .await
            .expect("COMMAND INFO");
        if info != redis::Value::Array(vec![redis::Value::Nil]) {
            panic!("this server has WAITAOF ({info:?}): the test expects Redis 7.0 or 7.1");
        }
        let fsynced = Durability::Fsynced {
            local: false,
            replicas: 1,
            timeout: Duration::from_millis(300),
        };
        let client = bed
            .builder(&bed.master)
            .durability(fsynced)
            .build()
            .expect("client");
        let scripts = bed.calls("evalsha").await + bed.calls("eval").await;
        for _ in 0..2 {
            let refused = client.mutex("aof").expect("mutex").lock().await;
            assert!(
                matches!(refused, Err(Error::Unsupported { .. })),
                "{refused:?}"
            );
        }
        assert_eq!(
            bed.calls("evalsha").await + bed.calls("eval").await,
            scripts,
            "no script ran"
        );
        assert!(!bed.exists(&bed.master, "aof").await);
        let received = client
            .mutex("aof")
            .expect("mutex")
            .with_durability(Durability::Replicas {
                count: 1,
                timeout: Duration::from_secs(10),
            })
            .expect("durability")
            .lock()
            .await
            .expect("lock");
        received.unlock().await.expect("unlock");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_durable_acquisitions_share_a_wait() {
    within(Duration::from_secs(60), async {
        let bed = Replicated::start().await;
        let client = bed
            .builder(&bed.master)
            .durability(Durability::AllReplicas {
                timeout: Duration::from_secs(1),
            })
            .build()
            .expect("client");
        let before = bed.calls("wait").await;
        let tasks: Vec<_> = (0..64)
            .map(|i| {
                let client = client.clone();
                tokio::spawn(async move {
                    let guard = client
                        .mutex(&format!("g{i}"))
                        .expect("mutex")
                        .lock()
                        .await
                        .expect("lock");
                    guard.unlock().await.expect("unlock");
                })
            })
            .collect();
        for task in tasks {
            task.await.expect("task");
        }
        let waits = bed.calls("wait").await - before;
        assert!(
            (1..64).contains(&waits),
            "{waits} WAITs for 64 acquisitions"
        );
    })
    .await;
}

/// The negative control: without durability, the master grants, dies before its replica has
/// the grant, the replica is promoted, and another client takes the same lock. The older
/// holder's writes are refused by a fenced store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_it_a_failover_forgets_a_lock_and_only_fencing_saves_the_store() {
    within(Duration::from_secs(60), async {
        let mut bed = Replicated::start().await;
        let store = RedisServer::start();
        let mut data = bed.conn(&store).await;
        let resource = Resource::new(&bed.prefix, "store");
        let a = bed.builder(&bed.master).build().expect("client");
        bed.link.set(Mode::Blackhole);
        let held = a
            .mutex("lost")
            .expect("mutex")
            .lock()
            .await
            .expect("granted, not replicated");
        assert!(
            resource
                .fenced_write(&mut data, held.fencing_token())
                .await
                .expect("write")
        );
        bed.master.kill();
        let mut replica = bed.conn(&bed.replica).await;
        let _: () = redis::cmd("REPLICAOF")
            .arg("NO")
            .arg("ONE")
            .query_async(&mut replica)
            .await
            .expect("promote");
        assert!(
            !bed.exists(&bed.replica, "lost").await,
            "the promoted replica never had it"
        );
        let b = bed.builder(&bed.replica).build().expect("client");
        let second = b
            .mutex("lost")
            .expect("mutex")
            .lock()
            .await
            .expect("granted again");
        assert!(second.fencing_token() > held.fencing_token());
        assert!(
            resource
                .fenced_write(&mut data, second.fencing_token())
                .await
                .expect("write")
        );
        assert!(
            !resource
                .fenced_write(&mut data, held.fencing_token())
                .await
                .expect("write"),
            "the older holder's write is refused"
        );
        second.unlock().await.expect("unlock");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_wait_does_not_hold_up_the_clients_other_operations() {
    within(Duration::from_secs(60), async {
        let bed = Replicated::start().await;
        let client = bed.builder(&bed.master).build().expect("client");
        let durable = client
            .mutex("slow")
            .expect("mutex")
            .with_durability(Durability::Replicas {
                count: 1,
                timeout: Duration::from_secs(5),
            })
            .expect("durability");
        bed.link.set(Mode::Blackhole);
        let waiting = tokio::spawn(async move { durable.lock().await.map(drop) });
        // Once its write is on the master, the durable acquisition waits for an
        // acknowledgement that cannot come; the same client's other operations go on
        // meanwhile.
        until(|| bed.exists(&bed.master, "slow")).await;
        for name in ["x", "y", "z"] {
            let guard = client
                .mutex(name)
                .expect("mutex")
                .lock()
                .await
                .expect("lock");
            guard.unlock().await.expect("unlock");
        }
        assert!(!waiting.is_finished(), "the durable wait is still going");
        let result = waiting.await.expect("task");
        assert!(
            matches!(
                result,
                Err(Error::NotReplicated {
                    acked: 0,
                    wanted: 1
                })
            ),
            "{result:?}"
        );
        bed.link.set(Mode::Pass);
    })
    .await;
}

/// Found by review: every durable call of a client went over one connection, whose task ran
/// one round at a time with one `WAIT` for the most replicas and the longest timeout any call
/// of the round wanted: a handle asking for more replicas than there are held up every other
/// durable call, the watchdog's renewals with them, and healthy holds were lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_wait_of_one_setting_does_not_hold_up_another_settings_renewals() {
    within(Duration::from_secs(60), async {
        let bed = Replicated::start().await;
        let client = bed
            .builder(&bed.master)
            .default_lease(Duration::from_secs(3))
            .build()
            .expect("client");
        let quick = client
            .mutex("quick")
            .expect("mutex")
            .with_durability(Durability::Replicas {
                count: 1,
                timeout: Duration::from_millis(500),
            })
            .expect("durability");
        let held = quick.lock().await.expect("the one replica acknowledges");
        // More replicas than there are: each attempt's `WAIT` lasts its whole 2 s, one after
        // another.
        let greedy = client
            .mutex("greedy")
            .expect("mutex")
            .with_durability(Durability::Replicas {
                count: 2,
                timeout: Duration::from_secs(2),
            })
            .expect("durability");
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let attempts = tokio::spawn(async move {
            let mut refused = 0;
            while stopped.try_recv().is_err() {
                match greedy.try_lock().await {
                    Err(Error::NotReplicated {
                        acked: 1,
                        wanted: 2,
                    }) => refused += 1,
                    // The last attempt's grant is being given back.
                    Ok(None) => tokio::task::yield_now().await,
                    other => panic!("{other:?}"),
                }
            }
            refused
        });
        // Two leases: renewed (each acknowledged by the replica) all along.
        let mut lost = std::pin::pin!(held.lost());
        tokio::select! {
            () = &mut lost => panic!("a hold lost behind another setting's WAIT"),
            () = tokio::time::sleep(Duration::from_secs(6)) => {}
        }
        held.unlock().await.expect("unlock");
        let _ = stop.send(());
        let refused = attempts.await.expect("task");
        assert!(refused >= 2, "{refused} long waits");
        assert!(!bed.exists(&bed.master, "greedy").await);
        assert!(!bed.exists(&bed.master, "quick").await);
    })
    .await;
}

/// Found by review: the watchdog sent every due renewal in one batch and waited for all of
/// them before anything else, so a durable renewal whose `WAIT` could not be satisfied (the
/// replica cut off) held up the plain holds renewed beside it until the batch timed out, and
/// they were lost with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_renewal_nobody_acknowledges_does_not_hold_up_plain_renewals() {
    within(Duration::from_secs(60), async {
        let bed = Replicated::start().await;
        let client = bed
            .builder(&bed.master)
            .default_lease(Duration::from_secs(3))
            .build()
            .expect("client");
        // The plain hold first: its lease ends first, and a batch of both was given until then.
        let plain = client
            .mutex("plain")
            .expect("mutex")
            .lock()
            .await
            .expect("lock");
        let durable = client
            .mutex("durable")
            .expect("mutex")
            .with_durability(Durability::Replicas {
                count: 1,
                timeout: Duration::from_millis(2500),
            })
            .expect("durability")
            .lock()
            .await
            .expect("the replica acknowledges");
        // The replica is cut off: the durable hold's renewals wait out their `WAIT`, unacknowledged.
        bed.link.set(Mode::Blackhole);
        let mut lost = std::pin::pin!(plain.lost());
        tokio::select! {
            () = &mut lost => panic!("a plain hold lost behind a durable renewal"),
            () = tokio::time::sleep(Duration::from_secs(5)) => {}
        }
        // The durable hold, whose renewals no replica acknowledged, is lost at its deadline.
        assert!(!durable.is_held());
        plain.unlock().await.expect("unlock");
        bed.link.set(Mode::Pass);
        drop(durable);
    })
    .await;
}

/// The ids of the server's connections whose last command was `EVALSHA`.
async fn script_connections(conn: &mut MultiplexedConnection) -> Vec<String> {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(conn)
        .await
        .expect("CLIENT LIST");
    list.lines()
        .filter(|line| line.contains("cmd=evalsha"))
        .filter_map(|line| line.split(' ').find_map(|f| f.strip_prefix("id=")))
        .map(str::to_owned)
        .collect()
}

/// A master demoted to a replica still answers, with `READONLY` to writes: the client drops
/// that connection at once and takes a new one for the next request (from a Sentinel-aware
/// pool, one to the new master).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_readonly_reply_drops_the_connection_it_came_on() {
    within(Duration::from_secs(60), async {
        let bed = Replicated::start().await;
        let mut admin = bed.conn(&bed.replica).await;
        let commands = admin.clone();
        let replicaof = |args: Vec<String>| {
            let mut admin = commands.clone();
            async move {
                let _: () = redis::cmd("REPLICAOF")
                    .arg(args)
                    .query_async(&mut admin)
                    .await
                    .expect("REPLICAOF");
            }
        };
        let link = bed.link.addr().port().to_string();
        // A master for a start: the client's connection takes writes.
        replicaof(vec!["NO".into(), "ONE".into()]).await;
        let client = bed.builder(&bed.replica).build().expect("client");
        let mutex = client.mutex("ro").expect("mutex");
        mutex
            .lock()
            .await
            .expect("lock")
            .unlock()
            .await
            .expect("unlock");
        let first = script_connections(&mut admin).await;
        assert_eq!(first.len(), 1, "{first:?}");
        // Demoted: it refuses the write with READONLY.
        replicaof(vec!["127.0.0.1".into(), link]).await;
        let refused = mutex.try_lock().await;
        assert!(
            matches!(&refused, Err(err) if err.is_connection()),
            "{refused:?}"
        );
        // Promoted again: the next request comes on a new connection, the old one is closed.
        replicaof(vec!["NO".into(), "ONE".into()]).await;
        mutex
            .lock()
            .await
            .expect("lock")
            .unlock()
            .await
            .expect("unlock");
        until(|| {
            let (mut admin, first) = (admin.clone(), first.clone());
            async move {
                let now = script_connections(&mut admin).await;
                now.len() == 1 && now != first
            }
        })
        .await;
    })
    .await;
}

/// A durable acquisition waits in the durable connection's queue behind a round that waits for
/// replicas; dropped there, what it gives back must reach Redis after it ran, not before (it
/// would find nothing, and the acquisition would then take a permit nobody has).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_acquisition_dropped_in_the_queue_gives_back_what_it_took() {
    let redis = support::TestRedis::own();
    within(Duration::from_secs(60), async {
        // No replica: every durable round waits its whole timeout.
        let client = redis
            .builder()
            .durability(Durability::Replicas {
                count: 1,
                timeout: Duration::from_secs(2),
            })
            .build()
            .expect("client");
        let plain = redis.client();
        let first = client.semaphore("first", 1).expect("semaphore");
        let waiting = tokio::spawn(async move { first.acquire().await.map(drop) });
        // Its script ran: its round now waits for the replica that is not there.
        until(|| async { !redis.leftovers().await.is_empty() }).await;
        let second = client.semaphore("second", 1).expect("semaphore");
        let dropped = tokio::time::timeout(Duration::from_millis(300), second.acquire()).await;
        assert!(dropped.is_err(), "queued behind a 2 s round: {dropped:?}");
        assert!(matches!(
            waiting.await.expect("task"),
            Err(Error::NotReplicated {
                acked: 0,
                wanted: 1
            })
        ));
        // The second acquisition's script ran in the next round; what it took is given back.
        let free = until_within(Duration::from_secs(10), || async {
            plain
                .semaphore("second", 1)
                .expect("semaphore")
                .try_acquire()
                .await
                .expect("try")
                .is_some()
        })
        .await;
        assert!(free, "the dropped acquisition's permit is still taken");
        until(|| async { redis.leftovers().await.is_empty() }).await;
    })
    .await;
}

/// A durable acquisition whose connection cannot be made (the server refuses the password)
/// fails with the error a plain one gets (the pool's, naming the refusal), not a generic I/O
/// error in its place.
#[tokio::test]
async fn a_durable_acquisition_that_cannot_connect_fails_as_a_plain_one_does() {
    let server = RedisServer::start();
    within(Duration::from_secs(30), async {
        let mut admin = redis::Client::open(server.url())
            .expect("url")
            .get_multiplexed_async_connection()
            .await
            .expect("connect");
        let () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("requirepass")
            .arg("right")
            .query_async(&mut admin)
            .await
            .expect("CONFIG SET");
        let url = server.url().replacen("redis://", "redis://:wrong@", 1);
        let pool = deadpool_redis::Config::from_url(url.as_str())
            .create_pool(Some(deadpool_redis::Runtime::Tokio1))
            .expect("pool");
        let client = redlatch::LockClient::builder(pool, url.as_str())
            .key_prefix("refused")
            .build()
            .expect("client");
        let mutex = client.mutex("a").expect("mutex");
        let plain = mutex.try_lock().await.expect_err("the password is refused");
        let durable = mutex
            .with_durability(Durability::Replicas {
                count: 1,
                timeout: Duration::from_millis(100),
            })
            .expect("durability")
            .try_lock()
            .await
            .expect_err("the password is refused");
        let causes = |err: &Error| {
            let mut said = vec![err.to_string()];
            let mut source = std::error::Error::source(err);
            while let Some(cause) = source {
                said.push(cause.to_string());
                source = cause.source();
            }
            said
        };
        assert!(matches!(plain, Error::Pool(_)), "{plain:?}");
        assert!(matches!(durable, Error::Pool(_)), "{durable:?}");
        assert_eq!(causes(&durable), causes(&plain));
        assert_eq!(durable.is_connection(), plain.is_connection());
    })
    .await;
}
