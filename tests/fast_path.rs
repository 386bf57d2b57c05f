//! The queued primitives' fast path: the acquire of an idle name and the release that leaves it
//! idle run a short path before the queue machinery. What they write is the state the queue
//! machinery reads: tokens keep rising across the two paths, waiters queue behind a hold taken
//! on the fast path, and nothing is left but the fencing counter.

mod support;

use std::time::Duration;

use redlatch::LockClient;
use redlatch_harness::measure::{QueueScript, commandstats, server_commands};
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
        // general path ran 15 to 17. A read-only name has no fence key: a read hold looks
        // (ZSCORE, then EXISTS) that nothing foreign stands in its place.
        for (kind, name, most) in [
            (Kind::Fair, "fair", 11),
            (Kind::Write, "write", 11),
            (Kind::Read, "read", 14),
            (Kind::Semaphore, "sem", 13),
        ] {
            // Scripts loaded, connections made; then the name in use, past the second in which
            // its new fence key runs ahead of the clock (a fresh token costs a second write).
            cycle(&client, &kind, name).await;
            tokio::time::sleep(redlatch_harness::measure::WARM_NAMES).await;
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
            .zscore(&fence, "~")
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

/// `script` (an acquire) for `owner` of client `client`, with a lease and a grace in ms (see
/// [`QueueScript::acquire_for`]); returns the reply's status, its token or wait, and the ticket.
async fn raw_acquire(
    script: QueueScript,
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
    ask: Ask,
    cap: u32,
    (owner, client): (&str, &str),
    term: (u64, u64),
) -> (i64, i64, i64) {
    let reply = raw_reply(script, conn, key, ask, cap, (owner, client), term).await;
    (reply[0], reply[1], reply.get(2).copied().unwrap_or(0))
}

/// The reply of `script` as [`raw_acquire`] calls it, as it came: empty where a fast path
/// alone passed the call on.
async fn raw_reply(
    script: QueueScript,
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
    (want, units): Ask,
    cap: u32,
    who: (&str, &str),
    term: (u64, u64),
) -> Vec<i64> {
    script
        .acquire_for(key, want, (units, cap), who, term)
        .invoke_async(conn)
        .await
        .unwrap()
}

/// A layout tag and an op: what a raw acquire asks for.
type Want = (&'static str, &'static str);

/// What a raw acquire asks for, and how many units (permits; 1 for the other ops).
type Ask = (Want, u32);

/// What a name's keys hold, with the fields that depend on the moment read apart.
#[derive(Debug, PartialEq)]
struct State {
    /// Meta hash fields that do not depend on the clock, and the names of all of them.
    fields: Vec<(String, String)>,
    names: Vec<String>,
    queue: Vec<String>,
    holders: Vec<String>,
    /// Which of the meta hash, holders, queue and fence keys exist, and whether each expires.
    keys: Vec<(bool, bool)>,
}

/// What the keys of the name whose meta key is `key` hold, and apart, the meta fields that
/// depend on the clock (tokens, tickets, lease ends and expiries, shared holders' fields).
async fn state(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
) -> (State, Vec<(String, String)>) {
    let meta: Vec<(String, String)> = redis::cmd("HGETALL")
        .arg(key)
        .query_async(conn)
        .await
        .unwrap();
    let clocked = ["~wfence", "~fence", "~wexp", "~exp", "~next", "~seq"];
    // A shared holder's field is holds/token/client: its token is the clock's.
    let mut fields: Vec<_> = meta
        .iter()
        .filter(|(f, _)| !clocked.contains(&f.as_str()))
        .map(|(f, v)| match v.split('/').collect::<Vec<_>>()[..] {
            [holds, token, client] if f.starts_with("h:") && !token.is_empty() => {
                (f.clone(), format!("{holds}/*/{client}"))
            }
            _ => (f.clone(), v.clone()),
        })
        .collect();
    fields.sort();
    let mut names: Vec<String> = meta.iter().map(|(f, _)| f.clone()).collect();
    names.sort();
    let queue: Vec<String> = redis::cmd("ZRANGE")
        .arg(format!("{key}:queue"))
        .arg(0)
        .arg(-1)
        .query_async(conn)
        .await
        .unwrap();
    // In the order of their lease ends, which are the clock's: as a set.
    let mut holders: Vec<String> = redis::cmd("ZRANGE")
        .arg(format!("{key}:holders"))
        .arg(0)
        .arg(-1)
        .query_async(conn)
        .await
        .unwrap();
    holders.sort();
    let mut keys = Vec::new();
    // The name's keys expire when `~exp` says; a sorted set holding only its `~` may expire
    // sooner (it is made again, with the name's expiry, when a member comes). The fence key
    // lives on its own.
    let exp: i64 = meta
        .iter()
        .find(|(f, _)| f == "~exp")
        .map_or(0, |(_, v)| v.parse().unwrap());
    let members = |set: &[String]| set.iter().any(|m| m != "~");
    for (k, full) in [
        ("", true),
        (":holders", members(&holders)),
        (":queue", members(&queue)),
        (":fence", false),
    ] {
        let at: i64 = redis::cmd("PEXPIRETIME")
            .arg(format!("{key}{k}"))
            .query_async(conn)
            .await
            .unwrap();
        if at > 0 && k != ":fence" {
            assert!(
                at == exp || (!full && at < exp),
                "{key}{k}: expires at {at}, the name at {exp}"
            );
        }
        keys.push((at != -2, at > 0));
    }
    let mut clocked_values: Vec<_> = meta
        .into_iter()
        .filter(|(f, _)| clocked.contains(&f.as_str()) || f.starts_with("h:"))
        .collect();
    clocked_values.sort();
    (
        State {
            fields,
            names,
            queue,
            holders,
            keys,
        },
        clocked_values,
    )
}

/// A hand-over by the release's fast path leaves the keys as the general path leaves them,
/// and says the same on the channel: the same holder, marked with its client, the same queue,
/// a new token above the last one that is the hold's and the name's last, the hold's first
/// term, and the place's ticket. So does a release that hands nothing over while others hold
/// (a head that waits for more than is free, or nobody waiting), a release that lets several
/// waiters in (a write lock's to the readers at the head of its queue, permits freed beyond
/// what the head takes), and a release the fast path passes on (a term shorter than the
/// holder's lease: it puts back what it popped for the general path).
#[tokio::test]
async fn a_hand_over_on_the_fast_path_leaves_what_the_general_path_leaves() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let mut conn = redis.conn().await;
        let mut listen = redis.listener().await;
        let fair = ("fair:1", "x");
        let rw = ("rwlock:1", "w");
        let read = ("rwlock:1", "r");
        let permit = ("semaphore:1", "s");
        let one = |want: Want| (want, 1);
        // (case, a semaphore's permits (0 for the locks), the holders (the first releases),
        // the waiters in queue order, their grace in ms: the first term of a hold handed to
        // them (the first holder's lease is 20 s, the others' 30 s), and whether anyone is
        // told and whether the release's fast path alone answers)
        let cases = [
            (
                "fair",
                0,
                vec![one(fair)],
                vec![one(fair)],
                30_000,
                [true, true],
            ),
            (
                "fair-two",
                0,
                vec![one(fair)],
                vec![one(fair), one(fair)],
                30_000,
                [true; 2],
            ),
            (
                "write",
                0,
                vec![one(rw)],
                vec![one(rw), one(read)],
                30_000,
                [true, true],
            ),
            // Readers at the head: every one up to the first writer, or to the queue's end;
            // the general path's when their term ends before the writer's lease would have.
            (
                "readers",
                0,
                vec![one(rw)],
                vec![one(read), one(read), one(rw), one(read)],
                30_000,
                [true, true],
            ),
            (
                "readers-all",
                0,
                vec![one(rw)],
                vec![one(read); 3],
                30_000,
                [true, true],
            ),
            // Their term ends with the writer's lease: the keys' expiry stays.
            (
                "readers-same-term",
                0,
                vec![one(rw)],
                vec![one(read), one(read)],
                20_000,
                [true, true],
            ),
            (
                "readers-short-grace",
                0,
                vec![one(rw)],
                vec![one(read), one(read)],
                10_000,
                [true, false],
            ),
            // A term that ends before the holder's lease would have: the queue is told, on the
            // general path.
            (
                "short-grace",
                0,
                vec![one(fair)],
                vec![one(fair), one(fair)],
                10_000,
                [true, false],
            ),
            // The last reader hands over to a writer; one of two readers leaves it waiting.
            (
                "last-reader",
                0,
                vec![one(read)],
                vec![one(rw), one(read)],
                30_000,
                [true, true],
            ),
            (
                "one-reader",
                0,
                vec![one(read), one(read)],
                vec![one(rw)],
                30_000,
                [false, true],
            ),
            // Permits: one handed over, filling the semaphore; a head that waits for more than
            // is free; nobody waiting while another holds; a short term; more freed than the
            // head takes: the waiters behind it go too while the freed permits cover them, up
            // to the queue's end or the first they do not cover (the general path's when a
            // term is short).
            (
                "permit",
                1,
                vec![one(permit)],
                vec![one(permit), one(permit)],
                30_000,
                [true; 2],
            ),
            (
                "permit-of-two",
                2,
                vec![one(permit); 2],
                vec![one(permit)],
                30_000,
                [true, true],
            ),
            (
                "permits-free",
                2,
                vec![(permit, 2)],
                vec![one(permit); 2],
                30_000,
                [true, true],
            ),
            (
                "permits-free-to-end",
                4,
                vec![(permit, 4)],
                vec![one(permit), (permit, 2)],
                30_000,
                [true, true],
            ),
            (
                "permits-free-then-too-many",
                3,
                vec![(permit, 3)],
                vec![one(permit), (permit, 3), one(permit)],
                30_000,
                [true, true],
            ),
            (
                "permits-free-among-holders",
                3,
                vec![(permit, 2), one(permit)],
                vec![one(permit), one(permit), one(permit)],
                30_000,
                [true, true],
            ),
            (
                "permits-free-short-grace",
                2,
                vec![(permit, 2)],
                vec![one(permit); 2],
                10_000,
                [true, false],
            ),
            (
                "permits-short",
                2,
                vec![one(permit); 2],
                vec![(permit, 2)],
                30_000,
                [false, true],
            ),
            (
                "permit-alone",
                2,
                vec![one(permit), one(permit)],
                vec![],
                30_000,
                [false, true],
            ),
            (
                "permit-short-grace",
                1,
                vec![one(permit)],
                vec![one(permit)],
                10_000,
                [true, false],
            ),
        ];
        for (case, cap, holders, waiters, grace, [anyone, on_fast]) in cases {
            let holder = holders[0].0;
            let mut seen = Vec::new();
            for (path, acquire, release) in [
                ("fast", QueueScript::Acquire, QueueScript::Release),
                (
                    "general",
                    QueueScript::GeneralAcquire,
                    QueueScript::GeneralRelease,
                ),
            ] {
                let key = redis.lock_key(&format!("{case}-{path}"));
                let wake = format!("{key}:wake");
                listen.psubscribe(&format!("{wake}*")).await;
                // The first holder takes the idle name as the library does, on either path,
                // with a lease that ends before what is handed over (so the keys' expiry moves).
                let (status, token, _) = raw_acquire(
                    QueueScript::Acquire,
                    &mut conn,
                    &key,
                    holders[0],
                    cap,
                    ("holder", "c0"),
                    (20_000, 0),
                )
                .await;
                assert_eq!(status, 1, "{case}: the holder");
                for (j, ask) in holders.iter().enumerate().skip(1) {
                    let (owner, client) = (format!("holder{j}"), format!("h{j}"));
                    let (status, ..) = raw_acquire(
                        acquire,
                        &mut conn,
                        &key,
                        *ask,
                        cap,
                        (&owner, &client),
                        (30_000, 0),
                    )
                    .await;
                    assert_eq!(status, 1, "{case} ({path}): holder {j}");
                }
                let mut tickets = Vec::new();
                for (i, ask) in waiters.iter().enumerate() {
                    let owner = format!("waiter{i}");
                    let client = format!("c{}", i + 1);
                    let who = (owner.as_str(), client.as_str());
                    let (status, wait, ticket) =
                        raw_acquire(acquire, &mut conn, &key, *ask, cap, who, (30_000, grace))
                            .await;
                    assert_eq!(status, 0, "{case} ({path}): waiter {i} queues");
                    // Told to look again when the holder's lease would end at the latest.
                    assert!(wait > 0 && wait <= 30_000, "{case} ({path}): wait {wait}");
                    tickets.push(ticket);
                }
                let mut freed: Vec<i64> = Vec::new();
                if path == "fast" {
                    // The fast path alone answers, or passes the call on having changed nothing.
                    freed = QueueScript::FastRelease
                        .release(&key, holder, "holder")
                        .invoke_async(&mut conn)
                        .await
                        .unwrap();
                    assert_eq!(!freed.is_empty(), on_fast, "{case}: the fast path alone");
                }
                if freed.is_empty() {
                    freed = release
                        .release(&key, holder, "holder")
                        .invoke_async(&mut conn)
                        .await
                        .unwrap();
                }
                assert_eq!(freed, vec![2], "{case} ({path})");
                // Each message names waiters of one client, on that client's channel.
                let mut messages = Vec::new();
                for (channel, message) in listen.heard().await {
                    for entry in message.split(' ') {
                        let client = entry.split('/').next().unwrap();
                        assert_eq!(channel, format!("{wake}:{client}"), "{case} ({path})");
                    }
                    messages.push(message);
                }
                let (state, clocked) = state(&mut conn, &key).await;
                let clocked: std::collections::HashMap<_, _> = clocked.into_iter().collect();
                // A hand-over names client/owner:token:term:ticket (space-separated); a
                // sooner change, client/owner alone.
                let (mut told, mut last) = (Vec::new(), None);
                for entry in messages.iter().flat_map(|m| m.split(' ')) {
                    let parts: Vec<&str> = entry.split(':').collect();
                    if let [who, handed, term, ticket] = parts[..] {
                        let (_, i) = who.split_once("/waiter").unwrap();
                        let i: usize = i.parse().unwrap();
                        assert_eq!(
                            ticket.parse::<i64>().unwrap(),
                            tickets[i],
                            "{case} ({path})"
                        );
                        let handed: i64 = handed.parse().unwrap();
                        if handed != 0 {
                            // A new token, above the holder's and any handed before it in the
                            // message: the hold's; the last one is the name's last.
                            assert!(
                                handed > last.unwrap_or(token),
                                "{case} ({path}): {handed} after {token}, {last:?}"
                            );
                            last = Some(handed);
                            let handed = handed.to_string();
                            let hold = match waiters[i].0.1 {
                                "s" => clocked[&format!("h:waiter{i}")].split('/').nth(1),
                                _ => clocked.get("~wfence").map(String::as_str),
                            };
                            assert_eq!(hold, Some(handed.as_str()), "{case} ({path})");
                        }
                        told.push(format!("{who}:{term}"));
                    } else {
                        told.push(entry.to_owned());
                    }
                }
                assert_eq!(!told.is_empty(), anyone, "{case} ({path}): told {told:?}");
                if let Some(last) = last {
                    assert_eq!(clocked["~fence"], last.to_string(), "{case} ({path})");
                }
                listen.punsubscribe(&format!("{wake}*")).await;
                seen.push((state, told, clocked));
            }
            let (general, fast) = (seen.pop().unwrap(), seen.pop().unwrap());
            assert_eq!(fast.0, general.0, "{case}: the keys");
            assert_eq!(
                fast.1, general.1,
                "{case}: who was told, and the first term"
            );
            // The lease ends, the keys' expiry and the lower bound of lease ends: the same up
            // to the moments the two calls ran.
            for f in ["~wexp", "~exp", "~next"] {
                let ms = |c: &std::collections::HashMap<String, String>| {
                    c.get(f).map(|v| v.parse::<i64>().unwrap())
                };
                match (ms(&fast.2), ms(&general.2)) {
                    (Some(a), Some(b)) => assert!((a - b).abs() < 5_000, "{case}: {f} {a} / {b}"),
                    (a, b) => assert_eq!(a, b, "{case}: {f}"),
                }
            }
        }
    })
    .await;
}

/// A newcomer that joins the shared holders (a reader joining readers, permits that fit) while
/// nobody waits is answered by the acquire's fast path alone, which leaves the keys as the
/// general path leaves them, with the same reply and, for permits, a new token above the
/// holders' that is the name's last. When someone waits (a writer queued before the reader)
/// the fast path passes the call on, changing nothing, and both paths queue it alike; permits
/// that do not fit queue on either path alike.
#[tokio::test]
async fn a_join_on_the_fast_path_leaves_what_the_general_path_leaves() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let mut conn = redis.conn().await;
        let (rw, read, permit) = (("rwlock:1", "w"), ("rwlock:1", "r"), ("semaphore:1", "s"));
        let one = |want: Want| (want, 1);
        // (case, a semaphore's permits (0 for the lock), the holders, the waiters queued after
        // them, whether the first holder then releases (handing over to the waiters; a queue
        // of only its `~` is left), the newcomer, whether it holds at once, and whether the
        // fast path alone answers)
        let cases = [
            (
                "reader",
                0,
                vec![one(read)],
                vec![],
                false,
                one(read),
                [true; 2],
            ),
            (
                "third-reader",
                0,
                vec![one(read); 2],
                vec![],
                false,
                one(read),
                [true; 2],
            ),
            (
                "after-hand-over",
                0,
                vec![one(rw)],
                vec![one(read)],
                true,
                one(read),
                [true; 2],
            ),
            (
                "writer-waits",
                0,
                vec![one(read)],
                vec![one(rw)],
                false,
                one(read),
                [false; 2],
            ),
            (
                "permit",
                2,
                vec![one(permit)],
                vec![],
                false,
                one(permit),
                [true; 2],
            ),
            (
                "permits",
                3,
                vec![one(permit)],
                vec![],
                false,
                (permit, 2),
                [true; 2],
            ),
            (
                "too-many",
                2,
                vec![one(permit)],
                vec![],
                false,
                (permit, 2),
                [false, true],
            ),
        ];
        for (case, cap, holders, waiters, hand_over, newcomer, [holds, on_fast]) in cases {
            let mut seen = Vec::new();
            for path in ["fast", "general"] {
                let key = redis.lock_key(&format!("join-{case}-{path}"));
                let mut tokens = Vec::new();
                for (j, ask) in holders.iter().enumerate() {
                    let who = (format!("holder{j}"), format!("h{j}"));
                    let (status, token, _) = raw_acquire(
                        QueueScript::GeneralAcquire,
                        &mut conn,
                        &key,
                        *ask,
                        cap,
                        (&who.0, &who.1),
                        (30_000, 0),
                    )
                    .await;
                    assert_eq!(status, 1, "{case} ({path}): holder {j}");
                    tokens.push(token);
                }
                for (i, ask) in waiters.iter().enumerate() {
                    let who = (format!("waiter{i}"), format!("c{i}"));
                    let (status, ..) = raw_acquire(
                        QueueScript::GeneralAcquire,
                        &mut conn,
                        &key,
                        *ask,
                        cap,
                        (&who.0, &who.1),
                        (30_000, 30_000),
                    )
                    .await;
                    assert_eq!(status, 0, "{case} ({path}): waiter {i} queues");
                }
                if hand_over {
                    let freed: Vec<i64> = QueueScript::GeneralRelease
                        .release(&key, holders[0].0, "holder0")
                        .invoke_async(&mut conn)
                        .await
                        .unwrap();
                    assert_eq!(freed, vec![2], "{case} ({path})");
                }
                let who = ("newcomer", "n");
                let mut reply = Vec::new();
                if path == "fast" {
                    // The fast path alone answers, or passes the call on having changed nothing.
                    let script = QueueScript::FastAcquire;
                    reply = raw_reply(
                        script,
                        &mut conn,
                        &key,
                        newcomer,
                        cap,
                        who,
                        (30_000, 30_000),
                    )
                    .await;
                    assert_eq!(!reply.is_empty(), on_fast, "{case}: the fast path alone");
                }
                if reply.is_empty() {
                    let script = QueueScript::GeneralAcquire;
                    reply = raw_reply(
                        script,
                        &mut conn,
                        &key,
                        newcomer,
                        cap,
                        who,
                        (30_000, 30_000),
                    )
                    .await;
                }
                let (status, token, units) = (reply[0], reply[1], reply[2]);
                assert_eq!(status == 1, holds, "{case} ({path}): {status}");
                let (state, clocked) = state(&mut conn, &key).await;
                let clocked: std::collections::HashMap<_, _> = clocked.into_iter().collect();
                if holds {
                    assert_eq!(units, i64::from(newcomer.1), "{case} ({path})");
                    if newcomer.0.1 == "s" {
                        // A new token, above the holders': the hold's and the name's last.
                        assert!(
                            tokens.iter().all(|t| token > *t),
                            "{case} ({path}): {token} after {tokens:?}"
                        );
                        assert_eq!(clocked["~fence"], token.to_string(), "{case} ({path})");
                        let hold = clocked["h:newcomer"].split('/').nth(1).map(str::to_owned);
                        assert_eq!(hold, Some(token.to_string()), "{case} ({path})");
                    } else {
                        assert_eq!(token, 0, "{case} ({path}): a read hold has no token");
                    }
                }
                // A queued newcomer's wait and ticket depend on the moment: its status only; a
                // grant's last item is the server clock it read.
                let reply = if holds {
                    reply.into_iter().take(3).collect()
                } else {
                    vec![status]
                };
                seen.push((state, reply));
            }
            let (general, fast) = (seen.pop().unwrap(), seen.pop().unwrap());
            assert_eq!(fast.0, general.0, "{case}: the keys");
            if holds && newcomer.0.1 == "s" {
                // The tokens differ (the clock's); the rest of the reply does not.
                assert_eq!(
                    (fast.1[0], fast.1[2]),
                    (general.1[0], general.1[2]),
                    "{case}"
                );
            } else {
                assert_eq!(fast.1, general.1, "{case}: the reply");
            }
        }
    })
    .await;
}
