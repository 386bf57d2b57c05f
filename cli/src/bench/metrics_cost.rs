//! What the metrics cost (`redlatch bench --metrics-cost`): the uncontended scenario at 32 tasks
//! for the `Mutex` and the `FairMutex`, with redlatch's metrics recorded by
//! `metrics-exporter-prometheus` and without, alternating in every round of one run. The
//! recorder is installed once, behind a switch: while it is off, every metric is a no-op handle,
//! as with no recorder at all.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusRecorder};
use redlatch_harness::measure::AnyResult;
use serde_json::{Value, json};

use super::library::Entry;
use super::plan::Plan;
use super::scenarios::uncontended;

/// A recorder that records only while switched on.
struct Switched {
    on: Arc<AtomicBool>,
    inner: PrometheusRecorder,
}

impl Recorder for Switched {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_counter(key, unit, description);
    }

    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_gauge(key, unit, description);
    }

    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_histogram(key, unit, description);
    }

    fn register_counter(&self, key: &Key, metadata: &Metadata<'_>) -> Counter {
        if self.on.load(Ordering::Relaxed) {
            self.inner.register_counter(key, metadata)
        } else {
            Counter::noop()
        }
    }

    fn register_gauge(&self, key: &Key, metadata: &Metadata<'_>) -> Gauge {
        if self.on.load(Ordering::Relaxed) {
            self.inner.register_gauge(key, metadata)
        } else {
            Gauge::noop()
        }
    }

    fn register_histogram(&self, key: &Key, metadata: &Metadata<'_>) -> Histogram {
        if self.on.load(Ordering::Relaxed) {
            self.inner.register_histogram(key, metadata)
        } else {
            Histogram::noop()
        }
    }
}

/// Tasks of the uncontended scenario here.
const TASKS: usize = 32;

/// Runs the comparison and prints it; returns it as JSON.
///
/// # Errors
///
/// A failed scenario, or a metrics recorder already installed in this process.
pub async fn metrics_cost(entries: &[Entry], plan: &Plan) -> AnyResult<Value> {
    let inner = PrometheusBuilder::new().build_recorder();
    let handle = inner.handle();
    let on = Arc::new(AtomicBool::new(false));
    metrics::set_global_recorder(Switched {
        on: Arc::clone(&on),
        inner,
    })
    .map_err(|_| "a metrics recorder is installed already")?;
    // What an exporter does between scrapes.
    let upkeep = tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            handle.run_upkeep();
        }
    });
    let picked: Vec<&Entry> = entries
        .iter()
        .filter(|e| e.name == "redlatch-mutex" || e.name == "redlatch-fair")
        .collect();
    let mut runs: HashMap<(&'static str, bool), Vec<f64>> = HashMap::new();
    for _ in 0..plan.repetitions {
        for entry in &picked {
            for recording in [false, true] {
                on.store(recording, Ordering::Relaxed);
                let record = uncontended(entry, TASKS, plan.phase).await?;
                runs.entry((entry.name, recording))
                    .or_default()
                    .push(record.ops_per_s);
            }
        }
    }
    on.store(false, Ordering::Relaxed);
    upkeep.abort();
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    };
    outln!(
        "{:<20} {:>6} {:>14} {:>14} {:>8}",
        "library",
        "tasks",
        "off cycles/s",
        "on cycles/s",
        "on/off"
    );
    let mut out = Vec::new();
    for entry in &picked {
        let off = median(runs.remove(&(entry.name, false)).unwrap_or_default());
        let with = median(runs.remove(&(entry.name, true)).unwrap_or_default());
        let ratio = if off > 0.0 { with / off } else { 0.0 };
        outln!(
            "{:<20} {:>6} {:>14.0} {:>14.0} {:>7.1}%",
            entry.name,
            TASKS,
            off,
            with,
            ratio * 100.0
        );
        out.push(json!({
            "library": entry.name,
            "tasks": TASKS,
            "off_ops_per_s": off,
            "on_ops_per_s": with,
            "on_over_off": ratio,
        }));
    }
    Ok(json!({ "repetitions": plan.repetitions, "rows": out }))
}
