//! The replicas scenario: a master with one replica, both servers of the tool's own. The
//! acquire latency of a `Mutex` without durability and with one replica's acknowledgement, and
//! the latency of a client's other operations (acquire + release, not durable) alone and while
//! the same client's durable acquisitions wait on `WAIT`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use deadpool_redis::{Config, Runtime};
use redlatch::{Durability, LockClient};
use redlatch_harness::RedisServer;
use redlatch_harness::measure::AnyResult;
use serde_json::{Value, json};

use super::report::{Record, ratio, show};

/// A master and its replica.
#[derive(Debug)]
pub struct ReplicasBed {
    master: RedisServer,
    _replica: RedisServer,
}

impl ReplicasBed {
    /// Starts a master and a replica, and waits until the replica is in sync.
    ///
    /// # Errors
    ///
    /// When a server cannot be started or the replica does not catch up within 20 s.
    pub async fn start() -> AnyResult<Self> {
        let master = tokio::task::spawn_blocking(|| {
            RedisServer::try_start_with(&["--repl-diskless-sync-delay", "0"])
        })
        .await??;
        let port = master.port().to_string();
        let replica = tokio::task::spawn_blocking(move || {
            RedisServer::try_start_with(&["--replicaof", "127.0.0.1", &port])
        })
        .await??;
        redlatch_harness::replication::in_sync(&master).await?;
        Ok(Self {
            master,
            _replica: replica,
        })
    }
}

/// What one row measures.
#[derive(Debug, Clone, Copy)]
pub(crate) enum ReplicasRow {
    /// `lock()` alone, without durability.
    Plain,
    /// `lock()` alone, with one replica's acknowledgement.
    OneReplica,
    /// Another handle's acquire + release on the same client, without durable writes.
    OthersAlone,
    /// The same, while 4 tasks of the client keep durable acquisitions waiting on `WAIT`
    /// (each waits 100 ms for a second replica, which does not exist, fails, and starts again):
    /// writes in flight on the durable connection, little CPU.
    OthersBesideDurable,
}

impl ReplicasRow {
    pub(crate) const ALL: [Self; 4] = [
        Self::Plain,
        Self::OneReplica,
        Self::OthersAlone,
        Self::OthersBesideDurable,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Plain => "durability-none",
            Self::OneReplica => "durability-one-replica",
            Self::OthersAlone => "others-alone",
            Self::OthersBesideDurable => "others-beside-durable",
        }
    }
}

const ONE: Durability = Durability::Replicas {
    count: 1,
    timeout: Duration::from_secs(1),
};

/// Measures `row` for a phase on a client of its own.
pub(crate) async fn measure(
    row: ReplicasRow,
    bed: &ReplicasBed,
    prefix: &str,
    phase: Duration,
) -> AnyResult<Record> {
    let url = bed.master.url();
    let pool = Config::from_url(url.as_str()).create_pool(Some(Runtime::Tokio1))?;
    let client = LockClient::builder(pool, url.as_str())
        .key_prefix(prefix)
        .build()?;
    let run = fastrand::u32(..);
    let mutex = client.mutex(&format!("p{run}"))?;
    let mutex = match row {
        ReplicasRow::OneReplica => mutex.with_durability(ONE)?,
        _ => mutex,
    };
    // Warm up: connections (the durable one too), script caches.
    for _ in 0..20 {
        mutex.lock().await?.unlock().await?;
    }
    let busy = Arc::new(AtomicBool::new(true));
    let mut background = Vec::new();
    if let ReplicasRow::OthersBesideDurable = row {
        let waiting = Durability::Replicas {
            count: 2,
            timeout: Duration::from_millis(100),
        };
        for task in 0..4 {
            let durable = client
                .mutex(&format!("d{run}-{task}"))?
                .with_durability(waiting)?;
            let busy = Arc::clone(&busy);
            background.push(tokio::spawn(async move {
                while busy.load(Ordering::Relaxed) {
                    match durable.lock().await {
                        Ok(guard) => guard.unlock().await?,
                        Err(redlatch::Error::NotReplicated { .. }) => {}
                        Err(err) => return Err(err.into()),
                    }
                }
                AnyResult::Ok(())
            }));
        }
    }
    let timed_cycle = matches!(
        row,
        ReplicasRow::OthersAlone | ReplicasRow::OthersBesideDurable
    );
    let mut samples = hdrhistogram::Histogram::<u64>::new(3)?;
    let started = Instant::now();
    let measured = async {
        while started.elapsed() < phase {
            let at = Instant::now();
            let guard = mutex.lock().await?;
            if !timed_cycle {
                samples.record(u64::try_from(at.elapsed().as_micros()).unwrap_or(u64::MAX))?;
            }
            guard.unlock().await?;
            if timed_cycle {
                samples.record(u64::try_from(at.elapsed().as_micros()).unwrap_or(u64::MAX))?;
            }
        }
        AnyResult::Ok(())
    }
    .await;
    busy.store(false, Ordering::Relaxed);
    for task in background {
        task.await??;
    }
    measured?;
    let seconds = started.elapsed().as_secs_f64();
    Ok(Record {
        scenario: "replicas",
        library: row.name(),
        tasks: 1,
        ops_per_s: samples.len() as f64 / seconds,
        p50_us: Some(samples.value_at_quantile(0.5) as f64),
        p99_us: Some(samples.value_at_quantile(0.99) as f64),
        max_us: Some(samples.max() as f64),
        samples: Some(samples.len() as f64),
        ..Record::default()
    })
}

/// The replicas figures, as ratios in the same run.
pub(crate) fn summary(records: &[Record]) -> Option<Value> {
    let find = |row: ReplicasRow| {
        records
            .iter()
            .find(|r| r.scenario == "replicas" && r.library == row.name())
    };
    let plain = find(ReplicasRow::Plain)?;
    let durable = find(ReplicasRow::OneReplica);
    let alone = find(ReplicasRow::OthersAlone);
    let beside = find(ReplicasRow::OthersBesideDurable);
    let acquire = ratio(durable.and_then(|r| r.p50_us), plain.p50_us);
    let others_p99 = ratio(beside.and_then(|r| r.p99_us), alone.and_then(|r| r.p99_us));
    let others_p50 = ratio(beside.and_then(|r| r.p50_us), alone.and_then(|r| r.p50_us));
    outln!(
        "replicas: acquire p50 {} us without durability, {} us with one replica's acknowledgement \
         ({}x); the client's other operations beside durable ones: p99 {}x, p50 {}x alone",
        show(plain.p50_us),
        show(durable.and_then(|r| r.p50_us)),
        show(acquire),
        show(others_p99),
        show(others_p50),
    );
    Some(json!({
        "acquire_p50_us": plain.p50_us,
        "durable_acquire_p50_us": durable.and_then(|r| r.p50_us),
        "durable_over_plain_p50": acquire,
        "others_beside_over_alone_p99": others_p99,
        "others_beside_over_alone_p50": others_p50,
    }))
}
