//! The `redlatch` command-line tool against a real server: inspect and force-unlock.
#![cfg(feature = "cli")]

mod support;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use support::{TestRedis, within};

/// Runs the tool against `url` under `prefix`, feeding `stdin`; returns success and output.
fn redlatch(url: &str, prefix: &str, args: &[&str], stdin: &str) -> (bool, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_redlatch"))
        .args(["--url", url, "--prefix", prefix])
        .args(args)
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
        let client = redis.client();
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
        assert!(out.contains("removed 1 holders and 0 waiters"), "{out}");
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
