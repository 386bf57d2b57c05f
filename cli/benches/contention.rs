//! The contention benchmark with the Rust peers beside redlatch, on one redis-server that it
//! starts itself (or the one `REDIS_URL` names):
//!
//! ```text
//! cargo bench -p redlatch-cli --bench contention            # full mode, about 15 minutes
//! cargo bench -p redlatch-cli --bench contention -- --quick # under 2 minutes
//! cargo bench -p redlatch-cli --bench contention -- --handoff-hold-ms 100
//! cargo bench -p redlatch-cli --bench contention -- --redlock # and Redlock over 5 servers
//! cargo bench -p redlatch-cli --bench contention -- --replicas # and durable acquisitions
//! ```
//!
//! It writes `target/bench/contention.json` and `target/bench/contention.svg`. The peers run at
//! their documented defaults and, as `*-tuned`, at the shortest retry delay their APIs take:
//! 1 ms for both (distkit treats 0 as "one attempt, no waiting"). distkit then polls every
//! millisecond (a `tokio::time::interval`). rslock draws its pause from `0..delay` in whole
//! milliseconds, which at 1 ms is always 0 (and at 0 an empty range): its tuned waiter tries
//! again as soon as an attempt fails, a `SET NX` and its unlock script each time, a spin at the
//! pace of the round trip.

use std::sync::Arc;
use std::time::Duration;

use redlatch_cli::bench::{self, AnyResult, BoxFut, Connect, Contender, Entry, Hold, Library};
use redlatch_harness::server;

/// rslock: Redlock over one server (the contention scenarios) or five (the Redlock scenario);
/// `acquire` loops over `lock`, which makes 3 tries with a random pause of up to `retry_delay`
/// (default 200 ms) between them, and waits for every server's answer.
struct Rslock {
    manager: rslock::LockManager,
    prefix: String,
}

struct RslockContender {
    manager: rslock::LockManager,
    resource: Vec<u8>,
    ttl: Duration,
}

struct RslockHold(rslock::Lock);

fn rslock_entry(name: &'static str, urls: &[String], prefix: &str, tuned: bool) -> Entry {
    let (urls, prefix) = (urls.to_vec(), prefix.to_owned());
    let connect: Connect = Arc::new(move || {
        let (urls, prefix) = (urls.clone(), prefix.clone());
        Box::pin(async move {
            let mut manager = rslock::LockManager::new(urls);
            if tuned {
                manager.set_retry(3, Duration::from_millis(1));
            }
            Ok(Arc::new(Rslock { manager, prefix }) as Arc<dyn Library>)
        })
    });
    Entry {
        name,
        connect,
        // Its unlock script's commands; it locks with a plain SET NX PX.
        script_commands: vec!["get".into(), "del".into()],
        // Its keys are `{prefix}:rslock:{name}`, under the bench's own prefix.
        namespaces: Vec::new(),
    }
}

impl Library for Rslock {
    fn contender<'a>(
        &'a self,
        name: &'a str,
        lease: Option<Duration>,
    ) -> BoxFut<'a, AnyResult<Box<dyn Contender>>> {
        Box::pin(async move {
            Ok(Box::new(RslockContender {
                manager: self.manager.clone(),
                resource: format!("{}:rslock:{name}", self.prefix).into_bytes(),
                ttl: lease.unwrap_or(Duration::from_secs(30)),
            }) as Box<dyn Contender>)
        })
    }
}

impl Contender for RslockContender {
    fn lock(&self) -> BoxFut<'_, AnyResult<Box<dyn Hold>>> {
        Box::pin(async move {
            let lock = self
                .manager
                .acquire_no_guard(&self.resource, self.ttl)
                .await
                .map_err(|e| format!("rslock: {e}"))?;
            Ok(Box::new(RslockHold(lock)) as Box<dyn Hold>)
        })
    }
}

impl Hold for RslockHold {
    fn release(self: Box<Self>) -> BoxFut<'static, AnyResult<()>> {
        Box::pin(async move {
            self.0.release().await;
            Ok(())
        })
    }
}

/// distkit: a lock per owner over a `ConnectionManager`, polling every `retry_interval`
/// (default 50 ms), renewing every third of its 30 s lease.
struct Distkit {
    connection: redis::aio::ConnectionManager,
    prefix: String,
    retry: Option<Duration>,
}

struct DistkitContender(Arc<distkit::lock::Mutex>);

struct DistkitHold(distkit::lock::MutexGuard);

/// distkit's key namespace for the bench: its keys are `{namespace}:{name}`, outside the bench's
/// `{prefix}:` (a namespace may not contain `:`).
fn distkit_namespace(prefix: &str) -> String {
    format!("{prefix}-distkit")
}

fn distkit_entry(name: &'static str, url: &str, prefix: &str, tuned: bool) -> Entry {
    let namespaces = vec![distkit_namespace(prefix)];
    let (url, prefix) = (url.to_owned(), prefix.to_owned());
    let connect: Connect = Arc::new(move || {
        let (url, prefix) = (url.clone(), prefix.clone());
        Box::pin(async move {
            let connection = redis::Client::open(url.as_str())?
                .get_connection_manager()
                .await?;
            let retry = tuned.then_some(Duration::from_millis(1));
            Ok(Arc::new(Distkit {
                connection,
                prefix,
                retry,
            }) as Arc<dyn Library>)
        })
    });
    Entry {
        name,
        connect,
        // Its release and renewal scripts' commands; it locks with a plain SET NX PX.
        script_commands: vec!["get".into(), "del".into(), "pexpire".into()],
        namespaces,
    }
}

impl Library for Distkit {
    fn contender<'a>(
        &'a self,
        name: &'a str,
        lease: Option<Duration>,
    ) -> BoxFut<'a, AnyResult<Box<dyn Contender>>> {
        Box::pin(async move {
            let key = distkit::DistkitRedisKey::try_from(name.replace(':', "-"))?;
            let namespace = distkit::DistkitRedisKey::try_from(distkit_namespace(&self.prefix))?;
            let mut options = distkit::lock::LockOptions::builder(key, self.connection.clone())
                .namespace(namespace);
            if let Some(ttl) = lease {
                options = options.ttl(ttl);
            }
            if let Some(retry) = self.retry {
                options = options.retry_interval(retry);
            }
            Ok(
                Box::new(DistkitContender(distkit::lock::Mutex::new(options.build())))
                    as Box<dyn Contender>,
            )
        })
    }
}

impl Contender for DistkitContender {
    fn lock(&self) -> BoxFut<'_, AnyResult<Box<dyn Hold>>> {
        Box::pin(async move {
            let guard = self.0.lock().await.map_err(|e| format!("distkit: {e}"))?;
            Ok(Box::new(DistkitHold(guard)) as Box<dyn Hold>)
        })
    }
}

impl Hold for DistkitHold {
    fn release(self: Box<Self>) -> BoxFut<'static, AnyResult<()>> {
        Box::pin(async move {
            self.0
                .release()
                .await
                .map_err(|e| format!("distkit: {e}"))?;
            Ok(())
        })
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match run().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("contention: {err}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run() -> AnyResult<()> {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let hold_ms = match args.iter().position(|a| a == "--handoff-hold-ms") {
        None => bench::Plan::full().handoff_hold_ms,
        Some(i) => {
            let value = args.get(i + 1).ok_or("--handoff-hold-ms needs a value")?;
            bench::parse_hold_ms(value).map_err(|e| format!("--handoff-hold-ms: {e}"))?
        }
    };
    let (server, url) = server::try_named_or_own(std::env::var("REDIS_URL").ok())?;
    let own_server = server.is_some();
    if !own_server {
        eprintln!(
            "{}",
            bench::given_server_note("contention", &url, "REDIS_URL")
        );
    }
    let prefix = format!("redlatch-bench-{}", std::process::id());
    let mut entries = bench::redlatch_entries(&url, &prefix);
    entries.extend([
        rslock_entry("rslock", std::slice::from_ref(&url), &prefix, false),
        rslock_entry("rslock-tuned", std::slice::from_ref(&url), &prefix, true),
        distkit_entry("distkit", &url, &prefix, false),
        distkit_entry("distkit-tuned", &url, &prefix, true),
    ]);
    let plan = bench::Plan::new(quick, hold_ms);
    // `--redlock`: the Redlock scenario on five servers of its own, with rslock's Redlock (which
    // waits for every server) over the same five.
    let redlock = if args.iter().any(|a| a == "--redlock") {
        let bed = bench::RedlockBed::start(5).await?;
        let urls = bed.urls();
        let mut rows = bench::redlatch_redlock_rows(&urls, &prefix);
        rows.push(bench::redlock_peer_row(rslock_entry(
            "rslock-redlock-5",
            &urls,
            &prefix,
            false,
        )));
        Some(bench::RedlockScenario { bed, rows })
    } else {
        None
    };
    let bench = bench::Bench {
        url,
        prefix,
        plan,
        entries,
        contended: vec![
            "redlatch-mutex",
            "redlatch-fair",
            "rslock",
            "rslock-tuned",
            "distkit",
            "distkit-tuned",
        ],
        // The workspace's target directory: `cargo bench` runs this from the package's own.
        out_dir: std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench"),
        own_server,
        cluster: None,
        redlock,
        replicas: if args.iter().any(|a| a == "--replicas") {
            Some(bench::ReplicasBed::start().await?)
        } else {
            None
        },
    };
    bench.run().await?;
    drop(server);
    Ok(())
}
