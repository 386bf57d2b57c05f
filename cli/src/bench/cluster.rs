//! The cluster scenario: redlatch on a Redis Cluster of three masters, measured in the same run
//! as on the single server and set beside it: acquire + release latency, push hand-off, and 16
//! tasks on one fair mutex.

use std::sync::Arc;

use redis::cluster::ClusterClientBuilder;
use redlatch::LockClient;
use redlatch_harness::measure::{AnyResult, LUA, contended_run, script_commands};
use serde_json::{Value, json};

use super::library::{Entry, Library, Primitive, Redlatch, counting};
use super::plan::Plan;
use super::report::{Record, ratio, show};

/// A redlatch client of the cluster that `seeds` reach.
pub fn redlatch_cluster_client(seeds: &[String], prefix: &str) -> AnyResult<LockClient> {
    Ok(
        LockClient::cluster_builder(ClusterClientBuilder::new(seeds.to_vec()))
            .key_prefix(prefix)
            .build()?,
    )
}

/// A redlatch primitive on a cluster as a benchmark entry.
pub fn redlatch_cluster_entry(
    name: &'static str,
    seeds: &[String],
    prefix: &str,
    primitive: Primitive,
) -> Entry {
    let (seeds, prefix) = (seeds.to_vec(), prefix.to_owned());
    Entry {
        name,
        connect: Arc::new(move || {
            let (seeds, prefix) = (seeds.clone(), prefix.clone());
            Box::pin(async move {
                let client = redlatch_cluster_client(&seeds, &prefix)?;
                Ok(Arc::new(Redlatch { client, primitive }) as Arc<dyn Library>)
            })
        }),
        script_commands: script_commands(LUA),
        namespaces: Vec::new(),
    }
}

/// The cluster entries: the mutex and the fair mutex.
pub fn redlatch_cluster_entries(seeds: &[String], prefix: &str) -> Vec<Entry> {
    vec![
        redlatch_cluster_entry("redlatch-mutex-cluster", seeds, prefix, Primitive::Mutex),
        redlatch_cluster_entry("redlatch-fair-cluster", seeds, prefix, Primitive::Fair),
    ]
}

/// The address of the master that serves `key` now, asked of the first seed that answers.
async fn owner_url(seeds: &[String], key: &str) -> AnyResult<String> {
    use redis::Value as V;
    for seed in seeds {
        let Ok(client) = redis::Client::open(seed.as_str()) else {
            continue;
        };
        let Ok(mut conn) = client.get_multiplexed_async_connection().await else {
            continue;
        };
        let slot: i64 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query_async(&mut conn)
            .await?;
        let ranges: Vec<V> = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async(&mut conn)
            .await?;
        for range in ranges {
            // [first, last, [host, port, id, ...], replicas...]
            if let V::Array(items) = range
                && let [V::Int(first), V::Int(last), V::Array(master), ..] = items.as_slice()
                && (*first..=*last).contains(&slot)
                && let [V::BulkString(host), V::Int(port), ..] = master.as_slice()
            {
                return Ok(format!("redis://{}:{port}", String::from_utf8_lossy(host)));
            }
        }
    }
    Err(format!("no seed of {seeds:?} says who serves {key}").into())
}

/// `tasks` tasks of one client looping on one name of the cluster; requests are counted on
/// the master that serves the name (every request of the name goes there, the sharded
/// subscription too).
pub(crate) async fn contended(
    entry: &Entry,
    seeds: &[String],
    prefix: &str,
    tasks: usize,
    plan: &Plan,
) -> AnyResult<Record> {
    let lib = (entry.connect)().await?;
    let name = format!("c{}", fastrand::u32(..));
    let owner = owner_url(seeds, &format!("{prefix}:{{{name}}}")).await?;
    let mut conn = redis::Client::open(owner)?
        .get_multiplexed_async_connection()
        .await?;
    let mut contenders = Vec::new();
    for _ in 0..tasks {
        contenders.push(lib.contender(&name, None).await?);
    }
    let libs = [Arc::clone(&lib)];
    let mut count = None;
    let counted = counting(entry, &libs, &mut count);
    let run = contended_run(
        &mut conn,
        contenders,
        std::time::Duration::ZERO,
        plan.warm_up,
        plan.phase,
        counted,
    )
    .await?;
    drop(libs);
    drop(lib);
    Ok(Record {
        scenario: "contended",
        library: entry.name,
        tasks,
        ops_per_s: run.per_s,
        max_wait_ms: Some(run.max_wait.as_secs_f64() * 1000.0),
        jain: Some(run.jain),
        requests_per_acq: Some(run.requests_per_acq),
        retake_share: Some(run.retake_share),
        ..Record::default()
    })
}

/// The cluster figures beside the single server's of the same run: latency and hand-off
/// ratios, and the fair mutex under 16 tasks.
pub(crate) fn summary(records: &[Record]) -> Option<Value> {
    let find = |scenario: &str, library: &str| {
        records
            .iter()
            .find(|r| r.scenario == scenario && r.library == library)
    };
    let latency = ratio(
        find("latency", "redlatch-mutex-cluster").and_then(|r| r.p50_us),
        find("latency", "redlatch-mutex").and_then(|r| r.p50_us),
    );
    let handoff = ratio(
        find("handoff", "redlatch-mutex-cluster").and_then(|r| r.p50_us),
        find("handoff", "redlatch-mutex").and_then(|r| r.p50_us),
    );
    let fair_handoff = ratio(
        find("handoff", "redlatch-fair-cluster").and_then(|r| r.p50_us),
        find("handoff", "redlatch-fair").and_then(|r| r.p50_us),
    );
    let fair = records.iter().find(|r| {
        r.scenario == "contended" && r.library == "redlatch-fair-cluster" && r.tasks == 16
    });
    latency.or(handoff)?;
    let summary = json!({
        "latency_p50_cluster_over_single": latency,
        "handoff_p50_cluster_over_single": handoff,
        "fair_handoff_p50_cluster_over_single": fair_handoff,
        "fair_16_jain": fair.and_then(|r| r.jain),
        "fair_16_requests_per_acq": fair.and_then(|r| r.requests_per_acq),
    });
    outln!(
        "cluster over single server: acquire+release p50 {}x, hand-off p50 {}x (fair {}x); \
         fair mutex, 16 tasks: Jain {}, {} requests per acquisition",
        show(latency),
        show(handoff),
        show(fair_handoff),
        show(fair.and_then(|r| r.jain)),
        show(fair.and_then(|r| r.requests_per_acq)),
    );
    Some(summary)
}
