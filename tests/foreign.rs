//! Data redlatch did not write is never changed: a string, list, set, hash with unrelated
//! fields or sorted set with unrelated members under any key of any primitive's layout gives a
//! typed error (`WrongType` or `Layout`, naming the key and saying what was found) from every
//! operation, and stays exactly as it was: the same `DUMP`, the same expiry, and nothing
//! created beside it.

mod support;

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redlatch::{Error, LockClient};
use support::{TestRedis, until, within};

const LIMIT: Duration = Duration::from_secs(120);

#[derive(Debug, Clone, Copy, PartialEq)]
enum Primitive {
    Mutex,
    Fair,
    Semaphore,
    RwLock,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Key {
    /// `<prefix>:{<name>}`: the lock hash (mutex) or the meta hash.
    Main,
    Holders,
    Queue,
    Fence,
}

impl Key {
    fn of(self, redis: &TestRedis, name: &str) -> String {
        let main = redis.lock_key(name);
        match self {
            Self::Main => main,
            Self::Holders => format!("{main}:holders"),
            Self::Queue => format!("{main}:queue"),
            Self::Fence => format!("{main}:fence"),
        }
    }
}

fn layout(primitive: Primitive) -> &'static [Key] {
    match primitive {
        Primitive::Mutex => &[Key::Main, Key::Fence],
        _ => &[Key::Main, Key::Holders, Key::Queue, Key::Fence],
    }
}

#[derive(Debug, Clone, Copy)]
enum Foreign {
    String,
    List,
    Set,
    Hash,
    SortedSet,
}

const FOREIGN: [Foreign; 5] = [
    Foreign::String,
    Foreign::List,
    Foreign::Set,
    Foreign::Hash,
    Foreign::SortedSet,
];

async fn write(conn: &mut MultiplexedConnection, key: &str, what: Foreign, ttl: bool) {
    let mut cmd = match what {
        Foreign::String => redis::cmd("SET"),
        Foreign::List => redis::cmd("RPUSH"),
        Foreign::Set => redis::cmd("SADD"),
        Foreign::Hash => redis::cmd("HSET"),
        Foreign::SortedSet => redis::cmd("ZADD"),
    };
    cmd.arg(key);
    match what {
        Foreign::String => cmd.arg("user data"),
        Foreign::List | Foreign::Set => cmd.arg("a").arg("b"),
        Foreign::Hash => cmd.arg("owner").arg("someone else"),
        Foreign::SortedSet => cmd.arg(1).arg("member").arg(2).arg("other"),
    };
    let _: () = cmd.query_async(conn).await.unwrap();
    if ttl {
        let _: () = redis::cmd("PEXPIRE")
            .arg(key)
            .arg(600_000)
            .query_async(conn)
            .await
            .unwrap();
    }
}

/// What a key is, exactly: its serialized value and its absolute expiry.
async fn state(conn: &mut MultiplexedConnection, key: &str) -> (Vec<u8>, i64) {
    let dump: Vec<u8> = redis::cmd("DUMP").arg(key).query_async(conn).await.unwrap();
    let at: i64 = redis::cmd("PEXPIRETIME")
        .arg(key)
        .query_async(conn)
        .await
        .unwrap();
    (dump, at)
}

/// The refusal names the foreign key.
fn check_refusal(what: &str, key: &str, result: Result<(), Error>) {
    match result {
        Err(Error::WrongType { key: k, found }) => {
            assert_eq!(k, key, "{what}");
            assert!(!found.is_empty(), "{what}");
        }
        Err(Error::Layout { key: k, found, .. }) => {
            assert_eq!(k, key, "{what}");
            assert!(found.is_empty(), "{what}: {found}");
        }
        other => panic!("{what}: expected a refusal naming {key}, got {other:?}"),
    }
}

/// Every operation that reads or writes the name, each of which must be refused.
async fn operations(client: &LockClient, primitive: Primitive, name: &str, key: &str) {
    let short = Duration::from_millis(200);
    let label = |op: &str| format!("{primitive:?} {op} with foreign data at {key}");
    macro_rules! refused {
        ($op:literal, $call:expr) => {
            check_refusal(&label($op), key, $call.await.map(|_| ()));
        };
    }
    match primitive {
        Primitive::Mutex => {
            let m = client.mutex(name).unwrap();
            refused!("try_lock", m.try_lock());
            refused!("lock_timeout", m.lock_timeout(short));
        }
        Primitive::Fair => {
            let m = client.fair_mutex(name).unwrap();
            refused!("try_lock", m.try_lock());
            refused!("lock_timeout", m.lock_timeout(short));
        }
        Primitive::Semaphore => {
            let s = client.semaphore(name, 2).unwrap();
            refused!("try_acquire", s.try_acquire());
            refused!("acquire_timeout", s.acquire_timeout(short));
            refused!("available_permits", s.available_permits());
        }
        Primitive::RwLock => {
            let l = client.rwlock(name).unwrap();
            refused!("try_read", l.try_read());
            refused!("read_timeout", l.read_timeout(short));
            refused!("try_write", l.try_write());
            refused!("write_timeout", l.write_timeout(short));
        }
    }
    refused!("inspect", client.inspect(name));
    refused!("force_unlock", client.force_unlock(name));
}

#[tokio::test]
async fn foreign_data_under_every_key_of_every_layout_is_refused_and_left_alone() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let client = redis.client();
        let mut conn = redis.conn().await;
        let mut cases = 0;
        for primitive in [
            Primitive::Mutex,
            Primitive::Fair,
            Primitive::Semaphore,
            Primitive::RwLock,
        ] {
            for &slot in layout(primitive) {
                for what in FOREIGN {
                    for ttl in [false, true] {
                        let name = format!("{primitive:?}-{slot:?}-{what:?}-{ttl}");
                        let key = slot.of(&redis, &name);
                        write(&mut conn, &key, what, ttl).await;
                        let before = state(&mut conn, &key).await;
                        operations(&client, primitive, &name, &key).await;
                        assert_eq!(
                            state(&mut conn, &key).await,
                            before,
                            "{key} holding a {what:?} was changed"
                        );
                        let keys: Vec<String> = redis::cmd("KEYS")
                            .arg(format!("{}*", redis.lock_key(&name)))
                            .query_async(&mut conn)
                            .await
                            .unwrap();
                        assert_eq!(
                            keys,
                            std::slice::from_ref(&key),
                            "{primitive:?} created keys"
                        );
                        let _: () = redis::cmd("DEL")
                            .arg(&key)
                            .query_async(&mut conn)
                            .await
                            .unwrap();
                        cases += 1;
                    }
                }
            }
        }
        assert_eq!(cases, 2 * 5 * (2 + 3 * 4));
    })
    .await;
}

/// Takes and lets go of `name` once: the name is in use (its fence key made), and the client
/// last saw it free, so its next acquisition is first tried in plain commands.
async fn use_once(client: &LockClient, primitive: Primitive, name: &str) {
    match primitive {
        Primitive::Mutex => {
            client
                .mutex(name)
                .unwrap()
                .lock()
                .await
                .unwrap()
                .unlock()
                .await
        }
        Primitive::Fair => {
            let m = client.fair_mutex(name).unwrap();
            m.lock().await.unwrap().unlock().await
        }
        Primitive::Semaphore => {
            let s = client.semaphore(name, 2).unwrap();
            s.acquire().await.unwrap().release().await
        }
        Primitive::RwLock => {
            let l = client.rwlock(name).unwrap();
            l.write().await.unwrap().unlock().await
        }
    }
    .unwrap();
}

/// The same refusals at a name the client has used and last saw free (the first attempt is
/// then made in plain commands, which must change nothing that is not ours either): foreign
/// data written under a key afterwards (the fence key replaced) is refused and left exactly
/// as it was, and the refused attempts leave nothing beside it but the name's fence key.
#[tokio::test]
async fn foreign_data_at_a_name_in_use_is_refused_and_left_alone() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let client = redis.client();
        let mut conn = redis.conn().await;
        let mut cases = 0;
        for primitive in [
            Primitive::Mutex,
            Primitive::Fair,
            Primitive::Semaphore,
            Primitive::RwLock,
        ] {
            for &slot in layout(primitive) {
                for what in FOREIGN {
                    let name = format!("used-{primitive:?}-{slot:?}-{what:?}");
                    use_once(&client, primitive, &name).await;
                    let key = slot.of(&redis, &name);
                    let fence = Key::Fence.of(&redis, &name);
                    let _: () = redis::cmd("DEL")
                        .arg(&key)
                        .query_async(&mut conn)
                        .await
                        .unwrap();
                    write(&mut conn, &key, what, false).await;
                    let before = state(&mut conn, &key).await;
                    operations(&client, primitive, &name, &key).await;
                    assert_eq!(
                        state(&mut conn, &key).await,
                        before,
                        "{key} holding a {what:?} was changed"
                    );
                    let mut keys: Vec<String> = redis::cmd("KEYS")
                        .arg(format!("{}*", redis.lock_key(&name)))
                        .query_async(&mut conn)
                        .await
                        .unwrap();
                    keys.sort();
                    let mut expected = vec![key.clone(), fence.clone()];
                    expected.sort();
                    expected.dedup();
                    assert_eq!(keys, expected, "{primitive:?} left keys");
                    let _: () = redis::cmd("DEL")
                        .arg(&key)
                        .arg(&fence)
                        .query_async(&mut conn)
                        .await
                        .unwrap();
                    cases += 1;
                }
            }
        }
        assert_eq!(cases, 5 * (2 + 3 * 4));
    })
    .await;
}

/// A queued primitive in use keeps its last token in its meta hash, and raises the fence key to
/// it without reading it first: a sorted set of someone else's put there meanwhile is left
/// exactly as it was (members and expiry), through acquisitions, releases and the name going
/// idle.
#[tokio::test]
async fn a_fence_key_replaced_while_the_name_is_in_use_is_left_alone() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let (a, b, c) = (redis.client(), redis.client(), redis.client());
        let mut conn = redis.conn().await;
        let name = "replaced";
        let first = a.semaphore(name, 3).unwrap().acquire().await.unwrap();
        let second = b.semaphore(name, 3).unwrap().acquire().await.unwrap();
        let fence = Key::Fence.of(&redis, name);
        let _: () = redis::cmd("DEL")
            .arg(&fence)
            .query_async(&mut conn)
            .await
            .unwrap();
        write(&mut conn, &fence, Foreign::SortedSet, false).await;
        let before = state(&mut conn, &fence).await;
        let third = c.semaphore(name, 3).unwrap().acquire().await.unwrap();
        assert_eq!(
            state(&mut conn, &fence).await,
            before,
            "changed by an acquisition"
        );
        for permit in [first, second, third] {
            permit.release().await.unwrap();
        }
        assert_eq!(
            state(&mut conn, &fence).await,
            before,
            "changed by the releases"
        );
        let _: () = redis::cmd("DEL")
            .arg(&fence)
            .query_async(&mut conn)
            .await
            .unwrap();
        until(|| async { redis.leftovers().await.is_empty() }).await;
    })
    .await;
}

#[tokio::test]
async fn refusals_say_what_was_found() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let client = redis.client();
        let mut conn = redis.conn().await;
        let fence = Key::Fence.of(&redis, "words");
        write(&mut conn, &fence, Foreign::String, false).await;
        let err = client.mutex("words").unwrap().try_lock().await.unwrap_err();
        assert!(
            matches!(&err, Error::WrongType { found, .. } if found == "a string that is not a number"),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            format!("key `{fence}` holds a string that is not a number, not redlatch data; it was left unchanged")
        );
        let queue = Key::Queue.of(&redis, "zset");
        write(&mut conn, &queue, Foreign::SortedSet, false).await;
        let err = client.fair_mutex("zset").unwrap().try_lock().await.unwrap_err();
        assert!(
            matches!(&err, Error::WrongType { found, .. } if found == "a sorted set without redlatch's `~` member"),
            "{err:?}"
        );
        let main = Key::Main.of(&redis, "hash");
        write(&mut conn, &main, Foreign::Hash, false).await;
        let err = client.inspect("hash").await.unwrap_err();
        assert!(matches!(&err, Error::Layout { found, .. } if found.is_empty()), "{err:?}");
        assert_eq!(
            err.to_string(),
            format!("key `{main}` holds a hash without redlatch's `~layout` field, not redlatch data; it was left unchanged")
        );
        let list = Key::Holders.of(&redis, "list");
        write(&mut conn, &list, Foreign::List, false).await;
        let err = client.semaphore("list", 1).unwrap().try_acquire().await.unwrap_err();
        assert!(matches!(&err, Error::WrongType { found, .. } if found == "a list"), "{err:?}");
    })
    .await;
}
