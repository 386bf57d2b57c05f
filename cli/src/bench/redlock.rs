//! The Redlock scenario: five redis-servers of the tool's own, each behind a proxy on loopback,
//! and the acquire latency (the `lock()` call alone, uncontended) of a single-server `Mutex`
//! and of Redlock clients over 3 and 5 of them, with two-round and one-round fencing, and with
//! one server blackholed. Every row goes through the proxies, so the comparison is like for
//! like; the peers' rows (rslock's Redlock) are added by `benches/contention.rs`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use deadpool_redis::{Config, Runtime};
use redlatch::{Fencing, LockClient};
use redlatch_harness::RedisServer;
use redlatch_harness::measure::{AnyResult, LUA, script_commands};
use redlatch_harness::proxy::{Mode, Proxy};
use serde_json::{Value, json};

use super::library::{Entry, Library, Primitive, Redlatch};
use super::report::{Record, ratio, show};

/// The servers of the scenario, each reached through a proxy that can blackhole it.
#[derive(Debug)]
pub struct RedlockBed {
    proxies: Vec<Proxy>,
    _servers: Vec<RedisServer>,
}

impl RedlockBed {
    /// Starts `n` servers and their proxies.
    ///
    /// # Errors
    ///
    /// When a server or a proxy cannot be started.
    pub async fn start(n: usize) -> AnyResult<Self> {
        let mut servers = Vec::with_capacity(n);
        for _ in 0..n {
            servers.push(tokio::task::spawn_blocking(RedisServer::try_start).await??);
        }
        let mut proxies = Vec::with_capacity(n);
        for server in &servers {
            proxies.push(Proxy::start(format!("127.0.0.1:{}", server.port()).parse()?).await?);
        }
        Ok(Self {
            proxies,
            _servers: servers,
        })
    }

    /// The addresses the clients use: the proxies'.
    pub fn urls(&self) -> Vec<String> {
        self.proxies.iter().map(Proxy::url).collect()
    }

    /// Cuts server `node` off (nothing passes either way) or lets it through again.
    fn blackhole(&self, node: usize, on: bool) {
        if let Some(proxy) = self.proxies.get(node) {
            proxy.set(if on { Mode::Blackhole } else { Mode::Pass });
        }
    }
}

/// One row of the scenario: an entry, and the server it blackholes while it is measured.
#[derive(Debug, Clone)]
pub struct RedlockRow {
    /// What runs.
    pub entry: Entry,
    /// The server cut off during the measurement.
    pub blackholed: Option<usize>,
}

/// The scenario: its servers and its rows.
#[derive(Debug)]
pub struct RedlockScenario {
    /// The servers.
    pub bed: RedlockBed,
    /// The rows, in the table's order.
    pub rows: Vec<RedlockRow>,
}

/// A redlatch client over `urls`: one server (`fencing` `None`), or Redlock with `fencing`.
fn redlatch_client(
    urls: &[String],
    prefix: &str,
    fencing: Option<Fencing>,
) -> AnyResult<LockClient> {
    let pool = |url: &String| Config::from_url(url.as_str()).create_pool(Some(Runtime::Tokio1));
    let client = match (fencing, urls) {
        (None, [url, ..]) => LockClient::builder(pool(url)?, url.as_str())
            .key_prefix(prefix)
            .build()?,
        (Some(fencing), urls) => {
            let mut nodes = Vec::with_capacity(urls.len());
            for url in urls {
                nodes.push((pool(url)?, url.clone()));
            }
            LockClient::redlock(nodes)
                .key_prefix(prefix)
                .fencing(fencing)
                .build()?
        }
        (None, []) => return Err("no server".into()),
    };
    Ok(client)
}

fn row(
    name: &'static str,
    urls: &[String],
    prefix: &str,
    fencing: Option<Fencing>,
    blackholed: Option<usize>,
) -> RedlockRow {
    let (urls, prefix) = (urls.to_vec(), prefix.to_owned());
    RedlockRow {
        entry: Entry {
            name,
            connect: Arc::new(move || {
                let (urls, prefix) = (urls.clone(), prefix.clone());
                Box::pin(async move {
                    let client = redlatch_client(&urls, &prefix, fencing)?;
                    Ok(Arc::new(Redlatch {
                        client,
                        primitive: Primitive::Mutex,
                    }) as Arc<dyn Library>)
                })
            }),
            script_commands: script_commands(LUA),
            namespaces: Vec::new(),
        },
        blackholed,
    }
}

/// redlatch's rows over the first servers of `urls` (five of them): one server, Redlock over 3
/// and 5 with two-round and one-round fencing, and over 5 with the last one blackholed.
pub fn redlatch_redlock_rows(urls: &[String], prefix: &str) -> Vec<RedlockRow> {
    let (three, five) = (&urls[..3.min(urls.len())], urls);
    let last = urls.len().checked_sub(1);
    vec![
        row("redlatch-single", urls, prefix, None, None),
        row("redlock-3", three, prefix, Some(Fencing::Quorum), None),
        row(
            "redlock-3-one-round",
            three,
            prefix,
            Some(Fencing::Clock),
            None,
        ),
        row("redlock-5", five, prefix, Some(Fencing::Quorum), None),
        row(
            "redlock-5-one-round",
            five,
            prefix,
            Some(Fencing::Clock),
            None,
        ),
        row(
            "redlock-5-blackholed",
            five,
            prefix,
            Some(Fencing::Quorum),
            last,
        ),
    ]
}

/// Another library's row over `urls` (the peers' Redlock).
pub fn redlock_peer_row(entry: Entry) -> RedlockRow {
    RedlockRow {
        entry,
        blackholed: None,
    }
}

/// One task on one name: the latency of `lock()` alone (the release is not timed), median and
/// 99th percentile, over a phase; with the row's server blackholed after the warm-up.
pub(crate) async fn acquire(
    row: &RedlockRow,
    bed: &RedlockBed,
    phase: Duration,
) -> AnyResult<Record> {
    let lib = (row.entry.connect)().await?;
    let contender = lib
        .contender(&format!("r{}", fastrand::u32(..)), None)
        .await?;
    // Warm up with every server reachable: connections, subscriptions, script caches.
    for _ in 0..20 {
        contender.lock().await?.release().await?;
    }
    if let Some(node) = row.blackholed {
        bed.blackhole(node, true);
    }
    let mut acquires = hdrhistogram::Histogram::<u64>::new(3)?;
    let started = Instant::now();
    let measured = async {
        while started.elapsed() < phase {
            let at = Instant::now();
            let guard = contender.lock().await?;
            acquires.record(u64::try_from(at.elapsed().as_micros()).unwrap_or(u64::MAX))?;
            guard.release().await?;
        }
        AnyResult::Ok(())
    }
    .await;
    if let Some(node) = row.blackholed {
        bed.blackhole(node, false);
    }
    measured?;
    let seconds = started.elapsed().as_secs_f64();
    Ok(Record {
        scenario: "redlock",
        library: row.entry.name,
        tasks: 1,
        ops_per_s: acquires.len() as f64 / seconds,
        p50_us: Some(acquires.value_at_quantile(0.5) as f64),
        p99_us: Some(acquires.value_at_quantile(0.99) as f64),
        max_us: Some(acquires.max() as f64),
        samples: Some(acquires.len() as f64),
        ..Record::default()
    })
}

/// The Redlock figures, as ratios of acquire medians in the same run.
pub(crate) fn summary(records: &[Record]) -> Option<Value> {
    let p50 = |library: &str| {
        records
            .iter()
            .find(|r| r.scenario == "redlock" && r.library == library)
            .and_then(|r| r.p50_us)
    };
    let ratio = |a: &str, b: &str| ratio(p50(a), p50(b));
    let single = p50("redlatch-single")?;
    let figures = [
        ("n3_over_single", ratio("redlock-3", "redlatch-single")),
        ("n5_over_single", ratio("redlock-5", "redlatch-single")),
        (
            "n3_two_rounds_over_one",
            ratio("redlock-3", "redlock-3-one-round"),
        ),
        (
            "n5_two_rounds_over_one",
            ratio("redlock-5", "redlock-5-one-round"),
        ),
        (
            "n5_blackholed_over_healthy",
            ratio("redlock-5-blackholed", "redlock-5"),
        ),
        (
            "rslock_n5_over_redlock_5",
            ratio("rslock-redlock-5", "redlock-5"),
        ),
    ];
    outln!(
        "redlock acquire p50 (single server {single:.0} us): N=3 {}x, N=5 {}x the single server; \
         two rounds over one: N=3 {}x, N=5 {}x; one of 5 blackholed {}x healthy; rslock N=5 {}x ours",
        show(figures[0].1),
        show(figures[1].1),
        show(figures[2].1),
        show(figures[3].1),
        show(figures[4].1),
        show(figures[5].1),
    );
    let mut out = serde_json::Map::new();
    out.insert("single_p50_us".into(), json!(single));
    for (name, value) in figures {
        out.insert(name.into(), json!(value));
    }
    Some(Value::Object(out))
}
