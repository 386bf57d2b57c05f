//! The `redlatch` command-line tool against a real server: inspect, force-unlock, and the quick
//! benchmark's output.

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use redlatch::LockClient;
use redlatch_harness::{TestServer as TestRedis, unique, until, within};

/// A redlatch client of the test's server, under its prefix.
fn client(redis: &TestRedis) -> LockClient {
    let pool = deadpool_redis::Config::from_url(&redis.url)
        .create_pool(Some(deadpool_redis::Runtime::Tokio1))
        .unwrap();
    LockClient::builder(pool, redis.url.as_str())
        .key_prefix(&redis.prefix)
        .build()
        .unwrap()
}

/// Runs the tool against `url` under `prefix`, feeding `stdin`; returns success and output.
fn redlatch(url: &str, prefix: &str, args: &[&str], stdin: &str) -> (bool, String) {
    let mut all = vec!["--url", url, "--prefix", prefix];
    all.extend_from_slice(args);
    tool(&all, &[], stdin)
}

/// Runs the tool with `args` and extra environment variables (`REDIS_URL` removed), feeding
/// `stdin`; returns success and stdout followed by stderr.
fn tool(args: &[&str], envs: &[(&str, &str)], stdin: &str) -> (bool, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_redlatch"))
        .args(args)
        .envs(envs.iter().copied())
        .env_remove("REDIS_URL")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run redlatch");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
        .expect("write stdin");
    let out = child.wait_with_output().expect("wait for redlatch");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

#[tokio::test]
async fn inspect_shows_the_holder_and_force_unlock_asks_first() {
    let redis = TestRedis::new();
    within(Duration::from_secs(60), async {
        let client = client(&redis);
        let guard = client.fair_mutex("nightly").unwrap().lock().await.unwrap();
        let run = |args: Vec<&'static str>, stdin: &'static str| {
            let (url, prefix) = (redis.url.clone(), redis.prefix.clone());
            // The tool blocks on its own process: keep it off the test's runtime threads.
            async move {
                tokio::task::spawn_blocking(move || redlatch(&url, &prefix, &args, stdin))
                    .await
                    .unwrap()
            }
        };
        let (ok, out) = run(vec!["inspect", "nightly"], "").await;
        assert!(ok, "{out}");
        assert!(out.contains("FairMutex"), "{out}");
        assert!(out.contains(&guard.owner().short_id()), "{out}");

        // Not confirmed: nothing happens.
        let (ok, out) = run(vec!["force-unlock", "nightly"], "n\n").await;
        assert!(!ok, "{out}");
        assert!(out.contains("left as it is"), "{out}");
        assert_eq!(client.inspect("nightly").await.unwrap().holders.len(), 1);

        let (ok, out) = run(vec!["force-unlock", "nightly", "--yes"], "").await;
        assert!(ok, "{out}");
        assert!(out.contains("removed 1 holder and 0 waiters"), "{out}");
        assert!(client.inspect("nightly").await.unwrap().kind.is_none());

        let (ok, out) = run(vec!["inspect", "nightly"], "").await;
        assert!(ok && out.contains("free"), "{out}");
        // A name that cannot be used is a clear error, not a panic.
        let (ok, out) = run(vec!["inspect", "a{b"], "").await;
        assert!(!ok && out.contains("invalid name"), "{out}");
        drop(guard);
    })
    .await;
}

/// `--sentinel` finds the master through a sentinel of the test's own: `inspect` there shows
/// the holder a client of the master took.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_through_a_sentinel() {
    let redis = TestRedis::own();
    let port: u16 = redis
        .url
        .rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches('/').parse().ok())
        .expect("port");
    let sentinels = tokio::task::spawn_blocking(move || {
        redlatch_harness::sentinel::Sentinels::start("cli", port, 1, 0)
    })
    .await
    .unwrap()
    .expect("sentinel");
    within(Duration::from_secs(60), async {
        let client = client(&redis);
        let guard = client.mutex("report").unwrap().lock().await.unwrap();
        let (address, prefix) = (sentinels.urls().join(","), redis.prefix.clone());
        let (ok, out) = tokio::task::spawn_blocking(move || {
            let args = [
                "--sentinel",
                &address,
                "--master",
                "cli",
                "--prefix",
                &prefix,
                "inspect",
                "report",
            ];
            tool(&args, &[], "")
        })
        .await
        .unwrap();
        assert!(ok, "{out}");
        assert!(out.contains(&guard.owner().short_id()), "{out}");
        guard.unlock().await.unwrap();
    })
    .await;
}

#[test]
fn bench_refuses_a_hand_off_hold_below_2_ms() {
    let (ok, out) = tool(&["bench", "--quick", "--handoff-hold-ms", "1"], &[], "");
    assert!(!ok, "{out}");
    assert!(out.contains("2 or more"), "{out}");
    assert!(!out.contains("panicked"), "{out}");
}

/// Found by review: a hold long enough that its microseconds overflow panicked (debug) or drew
/// from an empty range (release), 20 s into the run.
#[test]
fn bench_refuses_a_hand_off_hold_over_a_minute() {
    for hold in ["60001", "18446744073709552"] {
        let (ok, out) = tool(&["bench", "--quick", "--handoff-hold-ms", hold], &[], "");
        assert!(!ok, "{out}");
        assert!(out.contains("too long"), "{out}");
        assert!(!out.contains("panicked"), "{out}");
    }
}

/// Runs the tool with `args` (`REDIS_URL` removed, stdin empty) whose stdout's reader is gone
/// before it writes anything; returns success and stderr.
fn unread(args: &[&str]) -> (bool, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_redlatch"))
        .args(args)
        .env_remove("REDIS_URL")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run redlatch");
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("wait for redlatch");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Found by review: a reader gone before the unlock (`| head`, a pager quit at the question)
/// made `force-unlock` exit 0 with the name still held, the broken pipe taken for the quiet end
/// of a listing.
#[tokio::test]
async fn force_unlock_whose_output_is_not_read_says_what_it_did() {
    let redis = TestRedis::new();
    within(Duration::from_secs(60), async {
        let client = client(&redis);
        let guard = client.fair_mutex("unread").unwrap().lock().await.unwrap();
        let run = |extra: &'static [&'static str]| {
            let (url, prefix) = (redis.url.clone(), redis.prefix.clone());
            tokio::task::spawn_blocking(move || {
                let mut args = vec!["--url", &url, "--prefix", &prefix, "force-unlock", "unread"];
                args.extend_from_slice(extra);
                unread(&args)
            })
        };
        // Without `--yes` the question cannot be asked: nothing is done, and the exit says so.
        let (ok, err) = run(&[]).await.unwrap();
        assert!(!ok, "{err}");
        assert!(err.contains("left as it is"), "{err}");
        assert_eq!(client.inspect("unread").await.unwrap().holders.len(), 1);
        // With `--yes` the unlock is done, and the exit says so.
        let (ok, err) = run(&["--yes"]).await.unwrap();
        assert!(ok, "{err}");
        assert!(client.inspect("unread").await.unwrap().kind.is_none());
        assert!(!err.contains("panicked"), "{err}");
        drop(guard);
    })
    .await;
}

/// Found by review: `top` counted a name it was refused to read (an ACL user without
/// scripting: `NOPERM` on every script) as data redlatch did not write, and listed nothing
/// with a zero exit.
#[tokio::test]
async fn top_refused_by_the_server_fails_instead_of_listing_nothing() {
    let redis = TestRedis::own();
    within(Duration::from_secs(60), async {
        let client = client(&redis);
        let held = client.fair_mutex("busy").unwrap().lock().await.unwrap();
        let mut conn = redis.conn().await;
        let _: () = redis::cmd("ACL")
            .arg(&[
                "SETUSER",
                "watcher",
                "on",
                ">pw",
                "~*",
                "&*",
                "+@all",
                "-@scripting",
            ])
            .query_async(&mut conn)
            .await
            .unwrap();
        let url = redis.url.replacen("redis://", "redis://watcher:pw@", 1);
        let prefix = redis.prefix.clone();
        let (ok, out) = tokio::task::spawn_blocking(move || {
            redlatch(&url, &prefix, &["top", "--once", "--json"], "")
        })
        .await
        .unwrap();
        assert!(!ok, "{out}");
        assert!(out.contains("no permissions"), "{out}");
        held.unlock().await.unwrap();
    })
    .await;
}

/// Found by review: the bench's tables went out with `println!`, which panics when stdout's
/// reader went away: the run ended before its keys were removed (on the server it was given)
/// and before its file was written.
#[tokio::test]
async fn a_bench_whose_table_is_not_read_still_cleans_up_and_writes_its_file() {
    let redis = TestRedis::new();
    let out_dir = std::env::temp_dir().join(unique("redlatch-bench-unread"));
    within(Duration::from_secs(180), async {
        let (url, prefix) = (redis.url.clone(), redis.prefix.clone());
        let dir = out_dir
            .to_str()
            .expect("a UTF-8 temporary directory")
            .to_owned();
        let (ok, stderr) = tokio::task::spawn_blocking(move || {
            unread(&[
                "--url",
                &url,
                "--prefix",
                &prefix,
                "bench",
                "--metrics-cost",
                "--quick",
                "--out",
                &dir,
            ])
        })
        .await
        .unwrap();
        assert!(ok, "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        // Run against the server it was given, it says so.
        assert!(
            stderr.contains("running against the given server"),
            "{stderr}"
        );
        assert!(out_dir.join("metrics-cost.json").is_file());
        let left = keys_starting(&redis, &format!("{}-", redis.prefix)).await;
        assert!(left.is_empty(), "{left:?}");
    })
    .await;
    let _ = std::fs::remove_dir_all(&out_dir);
}

/// Found by review: options the command does not use were taken and ignored.
#[test]
fn options_a_command_does_not_use_are_refused() {
    let (ok, out) = tool(&["--sentinel", "127.0.0.1:1", "bench", "--quick"], &[], "");
    assert!(!ok && out.contains("not through Sentinel"), "{out}");
    let (ok, out) = tool(
        &[
            "--url",
            "redis://127.0.0.1:1",
            "inspect",
            "x",
            "--interval-ms",
            "500",
        ],
        &[],
        "",
    );
    assert!(!ok && out.contains("--watch"), "{out}");
}

#[test]
fn bench_without_redis_server_is_a_clear_error() {
    let missing = std::env::temp_dir().join("redlatch-no-such-dir/redis-server");
    let missing = missing.to_str().expect("a UTF-8 temporary directory");
    let (ok, out) = tool(
        &["bench", "--quick"],
        &[("REDLATCH_REDIS_SERVER", missing)],
        "",
    );
    assert!(!ok, "{out}");
    assert!(
        out.contains("cannot run") && out.contains("Install Redis"),
        "{out}"
    );
    assert!(!out.contains("panicked"), "{out}");
}

/// The keys whose names start with `prefix` (for a glob-safe test prefix).
async fn keys_starting(redis: &TestRedis, prefix: &str) -> Vec<String> {
    let mut conn = redis.conn().await;
    let mut keys = Vec::new();
    let mut cursor = 0u64;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await
            .unwrap();
        keys.extend(batch);
        if next == 0 {
            return keys;
        }
        cursor = next;
    }
}

/// The quick benchmark against a given server: the note on stderr, the JSON's shape, and
/// nothing left behind. About 20 s.
#[tokio::test]
async fn quick_bench_writes_its_json_and_leaves_no_keys() {
    let redis = TestRedis::new();
    let out_dir = std::env::temp_dir().join(unique("redlatch-bench-test"));
    within(Duration::from_secs(180), async {
        let (url, prefix) = (redis.url.clone(), redis.prefix.clone());
        let dir = out_dir
            .to_str()
            .expect("a UTF-8 temporary directory")
            .to_owned();
        let (ok, out) = tokio::task::spawn_blocking(move || {
            redlatch(&url, &prefix, &["bench", "--quick", "--out", &dir], "")
        })
        .await
        .unwrap();
        assert!(ok, "{out}");
        assert!(out.contains("running against the given server"), "{out}");
        let text = std::fs::read_to_string(out_dir.join("contention.json")).unwrap();
        let report: serde_json::Value = serde_json::from_str(&text).unwrap();
        for key in [
            "mode",
            "repetitions",
            "seconds",
            "server",
            "raw_cycles_per_s",
            "raw_tasks",
            "steal_pct",
            "machine",
            "records",
        ] {
            assert!(report.get(key).is_some(), "no `{key}` in {report}");
        }
        assert_eq!(report["mode"], "quick");
        assert_eq!(report["server"], "given");
        assert!(report["raw_cycles_per_s"].as_f64().unwrap() > 0.0);
        let records = report["records"].as_array().unwrap();
        assert!(!records.is_empty());
        for r in records {
            assert!(r["scenario"].is_string(), "{r}");
            assert!(r["library"].is_string(), "{r}");
            assert!(r["tasks"].is_u64(), "{r}");
            assert!(r["ops_per_s"].is_number(), "{r}");
        }
        let of = |scenario: &'static str| records.iter().filter(move |r| r["scenario"] == scenario);
        let raw_tasks: Vec<u64> = of("raw").map(|r| r["tasks"].as_u64().unwrap()).collect();
        assert!(of("uncontended").count() > 0);
        for r in of("uncontended") {
            // Compared with the raw scripts at the same task count only.
            assert!(raw_tasks.contains(&r["tasks"].as_u64().unwrap()), "{r}");
            assert!(r["of_raw"].as_f64().unwrap() > 0.0, "{r}");
        }
        assert!(of("handoff").count() > 0);
        for r in of("handoff") {
            assert!(r["samples"].as_u64().unwrap() > 0, "{r}");
        }
        let watchdog: Vec<_> = of("watchdog").collect();
        assert_eq!(watchdog.len(), 1);
        assert!(watchdog[0]["lease_ms"].as_f64().unwrap() > 0.0);
        for scenario in ["contended", "contended-1ms"] {
            for r in of(scenario) {
                assert!(r["max_wait_ms"].as_f64().unwrap() > 0.0, "{r}");
            }
        }
        // The floor of the contended scenario over clients, and each of its rows' share of it.
        let relay: Vec<_> = of("relay").collect();
        assert_eq!(relay.len(), 1, "{records:?}");
        assert_eq!(relay[0]["library"], "publish-relay");
        assert_eq!(relay[0]["clients"], 4);
        let passes = relay[0]["ops_per_s"].as_f64().unwrap();
        assert!(passes > 0.0, "{}", relay[0]);
        assert!(of("contended-clients").count() > 0);
        for r in of("contended-clients") {
            let share = r["of_relay"].as_f64().unwrap();
            assert!(
                (share - r["ops_per_s"].as_f64().unwrap() / passes).abs() < 1e-9,
                "{r}"
            );
        }
        // Everything the run wrote is gone.
        let left = keys_starting(&redis, &format!("{}-", redis.prefix)).await;
        assert!(left.is_empty(), "left behind: {left:?}");
    })
    .await;
    let _ = std::fs::remove_dir_all(&out_dir);
}

/// `top --once --json` lists the names held or queued now, most queued first, with their
/// holders, queue and permits; a name only used before (its counter left) is not listed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_lists_held_and_queued_names_most_queued_first() {
    let redis = TestRedis::new();
    within(Duration::from_secs(60), async {
        let (a, b) = (client(&redis), client(&redis));
        let held = a.fair_mutex("busy").unwrap().lock().await.unwrap();
        // Each waiter lets go as soon as it holds: which of the two Redis queues first is a race
        // between their attempts, not the order they were spawned in, so the test must not
        // wait for one of them before the other has let go.
        let waiters: Vec<_> = (0..2)
            .map(|_| {
                let mutex = b.fair_mutex("busy").unwrap();
                tokio::spawn(async move { mutex.lock().await.unwrap().unlock().await.unwrap() })
            })
            .collect();
        until(|| async { a.inspect("busy").await.unwrap().waiters.len() == 2 }).await;
        let permit = a.semaphore("pool", 3).unwrap().acquire().await.unwrap();
        a.mutex("done")
            .unwrap()
            .lock()
            .await
            .unwrap()
            .unlock()
            .await
            .unwrap();
        // Data redlatch did not write, under the prefix: left out, counted, left alone.
        let foreign = format!("{}:{{users}}", redis.prefix);
        let mut conn = redis.conn().await;
        let _: () = redis::cmd("SADD")
            .arg(&foreign)
            .arg("alice")
            .query_async(&mut conn)
            .await
            .unwrap();
        // And a key that is not text.
        let mut binary = format!("{}:{{", redis.prefix).into_bytes();
        binary.extend_from_slice(b"\xff\xfe}");
        let _: () = redis::cmd("SET")
            .arg(&binary)
            .arg("x")
            .query_async(&mut conn)
            .await
            .unwrap();

        let run = |args: Vec<&'static str>| {
            let (url, prefix) = (redis.url.clone(), redis.prefix.clone());
            tokio::task::spawn_blocking(move || redlatch(&url, &prefix, &args, ""))
        };
        let (ok, out) = run(vec!["top", "--once", "--json"]).await.unwrap();
        assert!(ok, "{out}");
        let view: serde_json::Value = serde_json::from_str(&out).expect("JSON");
        let names = view["names"].as_array().expect("names");
        assert_eq!(names.len(), 2, "{out}");
        assert_eq!(names[0]["name"], "busy");
        assert_eq!(names[0]["kind"], "fair");
        assert_eq!(names[0]["queue"], 2);
        assert_eq!(
            names[0]["holders"][0]["id"],
            held.owner().short_id().as_str()
        );
        assert_eq!(names[1]["name"], "pool");
        assert_eq!(names[1]["kind"], "semaphore");
        assert_eq!(
            (&names[1]["permits_in_use"], &names[1]["capacity"]),
            (&serde_json::json!(1), &serde_json::json!(3))
        );
        assert_eq!(view["left_out"], 0);
        assert_eq!(view["unreadable"], 2);
        let members: Vec<String> = redis::cmd("SMEMBERS")
            .arg(&foreign)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(members, vec!["alice".to_owned()]);
        let kept: Option<String> = redis::cmd("GET")
            .arg(&binary)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(kept.as_deref(), Some("x"));

        let (ok, out) = run(vec!["top", "--once"]).await.unwrap();
        assert!(ok, "{out}");
        let busy = out.find("busy").expect("busy listed");
        let pool = out.find("pool").expect("pool listed");
        assert!(busy < pool && !out.contains("done"), "{out}");

        // Only one server's keys can be scanned.
        let (ok, out) = tokio::task::spawn_blocking(|| {
            tool(
                &["--cluster", "--url", "redis://127.0.0.1:1", "top", "--once"],
                &[],
                "",
            )
        })
        .await
        .unwrap();
        assert!(!ok && out.contains("top reads one server"), "{out}");

        held.unlock().await.unwrap();
        for waiter in waiters {
            waiter.await.unwrap();
        }
        permit.release().await.unwrap();
        assert_eq!(a.inspect("busy").await.unwrap().kind, None);
    })
    .await;
}

/// The script profile, on a server of its own: every configuration's figures on names in use,
/// the queued primitives' queueing attempt and hand-over on contended names (also a write
/// lock's to two readers, and two permits' to two waiters), the server busy and then idle
/// before each call, and a reader's and a permit's join of a holder on either path, in
/// `scripts.json`.
#[test]
fn script_profile_covers_names_in_use_and_contended_names() {
    let out_dir = std::env::temp_dir().join(unique("redlatch-scripts-test"));
    let dir = out_dir.to_string_lossy().into_owned();
    let (ok, out) = tool(&["bench", "--scripts", "--quick", "--out", &dir], &[], "");
    assert!(ok, "{out}");
    let text = std::fs::read_to_string(out_dir.join("scripts.json")).expect("scripts.json");
    let report: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    let names = |rows: &serde_json::Value| -> Vec<String> {
        rows.as_array()
            .expect("rows")
            .iter()
            .map(|r| r["configuration"].as_str().expect("name").to_owned())
            .collect()
    };
    assert_eq!(
        names(&report["rows"]),
        [
            "minimal",
            "redlatch-mutex",
            "redlatch-fair",
            "redlatch-semaphore",
            "redlatch-rwlock-write",
            "redlatch-rwlock-read"
        ],
        "{text}"
    );
    assert_eq!(
        names(&report["contended"]),
        [
            "redlatch-fair",
            "redlatch-semaphore",
            "redlatch-rwlock-write",
            "redlatch-rwlock-readers",
            "redlatch-semaphore-two"
        ],
        "{text}"
    );
    assert_eq!(
        names(&report["contended_idle"]),
        names(&report["contended"]),
        "{text}"
    );
    assert_eq!(report["idle_gap_ms"], 3, "{text}");
    for section in ["contended", "contended_idle"] {
        for row in report[section].as_array().expect(section) {
            for field in ["queue_us", "handover_us"] {
                assert!(row[field].as_f64().expect(field) > 0.0, "{text}");
            }
            // The script call and at least the reads and writes a queue place and a hand-over
            // need.
            for field in ["queue_commands", "handover_commands"] {
                assert!(row[field].as_f64().expect(field) >= 5.0, "{text}");
            }
        }
    }
    assert_eq!(
        names(&report["joins"]),
        ["redlatch-rwlock-read", "redlatch-semaphore"],
        "{text}"
    );
    for row in report["joins"].as_array().expect("joins") {
        for field in ["fast_us", "general_us"] {
            assert!(row[field].as_f64().expect(field) > 0.0, "{text}");
        }
        // The script call, a read of the state, the clock, and the holders' and state's writes.
        for field in ["fast_commands", "general_commands"] {
            assert!(row[field].as_f64().expect(field) >= 5.0, "{text}");
        }
    }
    std::fs::remove_dir_all(&out_dir).expect("remove the output");
}

/// A reader that goes away (`redlatch inspect --watch | head`) ends the command quietly, with
/// success, not with a panic at the next write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_goes_away_ends_a_watch_quietly() {
    let redis = TestRedis::new();
    within(Duration::from_secs(60), async {
        let (url, prefix) = (redis.url.clone(), redis.prefix.clone());
        let (status, stderr) = tokio::task::spawn_blocking(move || {
            let mut child = Command::new(env!("CARGO_BIN_EXE_redlatch"))
                .args(["--url", &url, "--prefix", &prefix])
                .args(["inspect", "watched", "--watch", "--interval-ms", "100"])
                .env_remove("REDIS_URL")
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("run redlatch");
            let mut stdout = child.stdout.take().expect("stdout");
            // It has begun to print; then the reader goes.
            let mut first = [0u8; 16];
            stdout.read_exact(&mut first).expect("first output");
            drop(stdout);
            let out = child.wait_with_output().expect("wait for redlatch");
            (
                out.status,
                String::from_utf8_lossy(&out.stderr).into_owned(),
            )
        })
        .await
        .expect("task");
        assert!(status.success(), "{status:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    })
    .await;
}

#[test]
fn an_error_says_each_cause_once() {
    // A loopback port nobody listens on: the pool's error quotes the Redis error, which
    // quotes the refused connection.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let url = format!("redis://127.0.0.1:{port}");
    let (ok, out) = redlatch(&url, "redlatch-test", &["inspect", "a"], "");
    assert!(!ok, "{out}");
    assert!(out.contains("refused"), "{out}");
    let lines: Vec<&str> = out.lines().filter(|l| l.contains("caused by")).collect();
    assert!(!lines.is_empty(), "{out}");
    for (i, line) in lines.iter().enumerate() {
        let text = line.trim_start().trim_start_matches("caused by: ");
        assert!(
            lines[..i].iter().all(|before| !before.contains(text)),
            "a cause said twice: {out}"
        );
    }
}
