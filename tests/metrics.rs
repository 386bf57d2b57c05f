//! Metrics (feature `metrics`): a known workload, recorded through a test recorder, gives
//! exact counts per primitive kind.
#![cfg(feature = "metrics")]

mod support;

use std::collections::HashMap;
use std::sync::Mutex as StdMutex;
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use redlatch::Error;
use support::{TestRedis, until, within};

const LIMIT: Duration = Duration::from_secs(60);

/// What the recorder has seen so far. A snapshot of the debugging recorder takes each metric's
/// value out of it (counters and gauges are reset to zero, histograms emptied), so the
/// snapshots are added up here: counters and gauges summed, histograms counted.
struct Seen {
    snapshotter: Snapshotter,
    sums: HashMap<String, f64>,
    samples: HashMap<String, usize>,
}

/// A metric's name with its labels, in a stable order.
fn id(name: &str, labels: &[(&str, &str)]) -> String {
    let mut labels = labels.to_vec();
    labels.sort_unstable();
    format!("{name}{labels:?}")
}

impl Seen {
    fn read(&mut self) {
        for (key, _, _, value) in self.snapshotter.snapshot().into_vec() {
            let key = key.key();
            let labels: Vec<(&str, &str)> = key.labels().map(|l| (l.key(), l.value())).collect();
            let id = id(key.name(), &labels);
            match value {
                DebugValue::Counter(n) => *self.sums.entry(id).or_default() += n as f64,
                DebugValue::Gauge(v) => *self.sums.entry(id).or_default() += v.into_inner(),
                DebugValue::Histogram(v) => *self.samples.entry(id).or_default() += v.len(),
            }
        }
    }

    fn counter(&mut self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.read();
        self.sums.get(&id(name, labels)).copied().unwrap_or(0.0) as u64
    }

    fn samples(&mut self, name: &str, labels: &[(&str, &str)]) -> usize {
        self.read();
        self.samples.get(&id(name, labels)).copied().unwrap_or(0)
    }

    fn gauge(&mut self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.read();
        self.sums.get(&id(name, labels)).copied().unwrap_or(0.0)
    }
}

#[tokio::test]
async fn a_known_workload_is_counted_per_kind() {
    let recorder = DebuggingRecorder::new();
    let seen = StdMutex::new(Seen {
        snapshotter: recorder.snapshotter(),
        sums: HashMap::new(),
        samples: HashMap::new(),
    });
    if recorder.install().is_err() {
        panic!("a recorder was installed already: this test must be alone in its binary");
    }
    let redis = TestRedis::new();
    within(LIMIT, async {
        // A short lease: the watchdog renews within the test.
        let build = || {
            redis
                .builder()
                .default_lease(Duration::from_millis(900))
                .build()
                .unwrap()
        };
        let (a, b) = (build(), build());
        let mutex = [("kind", "mutex")];
        let fair = [("kind", "fair_mutex")];

        for _ in 0..3 {
            a.mutex("m")
                .unwrap()
                .lock()
                .await
                .unwrap()
                .unlock()
                .await
                .unwrap();
        }
        assert_eq!(
            seen.lock()
                .unwrap()
                .counter("redlatch_acquisitions_total", &mutex),
            3
        );
        assert_eq!(
            seen.lock()
                .unwrap()
                .samples("redlatch_wait_seconds", &mutex),
            3
        );
        assert_eq!(
            seen.lock()
                .unwrap()
                .samples("redlatch_hold_seconds", &mutex),
            3
        );

        // A fair mutex handed to a waiter of another client by its release.
        let held = a.fair_mutex("f").unwrap().lock().await.unwrap();
        let waiter = tokio::spawn({
            let m = b.fair_mutex("f").unwrap();
            async move { m.lock().await.unwrap() }
        });
        until(|| async { redis.queued(&a, "f").await == 1 }).await;
        assert_eq!(seen.lock().unwrap().gauge("redlatch_waiters", &fair), 1.0);
        // A wait that gives up.
        let late = b
            .fair_mutex("f")
            .unwrap()
            .lock_timeout(Duration::from_millis(50))
            .await;
        assert!(matches!(late, Err(Error::Timeout { .. })), "{late:?}");
        assert_eq!(
            seen.lock()
                .unwrap()
                .counter("redlatch_timeouts_total", &fair),
            1
        );
        // Held across a renewal.
        until(|| async {
            seen.lock()
                .unwrap()
                .counter("redlatch_renewals_total", &fair)
                >= 1
        })
        .await;
        assert!(
            seen.lock()
                .unwrap()
                .samples("redlatch_renewal_seconds", &[])
                >= 1
        );
        held.unlock().await.unwrap();
        waiter.await.unwrap().unlock().await.unwrap();
        assert_eq!(
            seen.lock()
                .unwrap()
                .counter("redlatch_acquisitions_total", &fair),
            2
        );
        assert_eq!(
            seen.lock().unwrap().counter(
                "redlatch_handovers_total",
                &[("kind", "fair_mutex"), ("via", "redis")]
            ),
            1
        );
        assert_eq!(
            seen.lock().unwrap().samples("redlatch_hold_seconds", &fair),
            2
        );
        assert_eq!(seen.lock().unwrap().gauge("redlatch_waiters", &fair), 0.0);

        // A hold ended from outside: its guard learns it at the next renewal.
        let lost = a.mutex("lost").unwrap().lock().await.unwrap();
        a.force_unlock("lost").await.unwrap();
        lost.lost().await;
        drop(lost);
        assert_eq!(
            seen.lock()
                .unwrap()
                .counter("redlatch_leases_lost_total", &mutex),
            1
        );
        assert_eq!(
            seen.lock()
                .unwrap()
                .counter("redlatch_acquisitions_total", &mutex),
            4
        );
        assert_eq!(
            seen.lock()
                .unwrap()
                .samples("redlatch_hold_seconds", &mutex),
            4
        );
        // Nothing failed.
        for error in [
            "connection",
            "timeout",
            "pool",
            "redis",
            "protocol",
            "refused",
        ] {
            for kind in ["mutex", "fair_mutex"] {
                assert_eq!(
                    seen.lock()
                        .unwrap()
                        .counter("redlatch_errors_total", &[("kind", kind), ("error", error)]),
                    0
                );
            }
        }

        // A durable acquisition that no replica acknowledged (this server has none): an error,
        // and no hold, so no hold time.
        let durable = redis
            .builder()
            .durability(redlatch::Durability::Replicas {
                count: 1,
                timeout: Duration::from_millis(50),
            })
            .build()
            .unwrap();
        let refused = durable.mutex("d").unwrap().lock().await;
        assert!(
            matches!(refused, Err(Error::NotReplicated { .. })),
            "{refused:?}"
        );
        assert_eq!(
            seen.lock().unwrap().counter(
                "redlatch_errors_total",
                &[("kind", "mutex"), ("error", "not_replicated")]
            ),
            1
        );
        assert_eq!(
            seen.lock()
                .unwrap()
                .counter("redlatch_acquisitions_total", &mutex),
            4
        );
        assert_eq!(
            seen.lock()
                .unwrap()
                .samples("redlatch_hold_seconds", &mutex),
            4,
            "a hold no guard had was counted in the hold time"
        );

        // Found by review: a hold passed to a local waiter that gave up before it read it was
        // counted as handed over, and in the hold time, though no guard ever had it.
        let local = redis
            .builder()
            .local_handoff(redlatch::LocalHandoff::new(64, Duration::from_secs(10)))
            .build()
            .unwrap();
        let m = local.mutex("passed").unwrap();
        let local_handovers = [("kind", "mutex"), ("via", "local")];
        let handed_before = seen
            .lock()
            .unwrap()
            .counter("redlatch_handovers_total", &local_handovers);
        let first = m.lock().await.unwrap();
        // The second queues behind the first in this client, then leads (the first's hold,
        // taken alone, reserved no passes and goes back to Redis), reserving passes.
        let mut second = Box::pin(m.lock());
        entered(&mut second).await;
        drop(first);
        let second = second.await.unwrap();
        // The third queues behind the second, is passed its hold, and gives up unread.
        let mut third = Box::pin(m.lock());
        entered(&mut third).await;
        drop(second);
        drop(third);
        until(|| async { redis.leftovers().await.is_empty() }).await;
        let mut seen = seen.lock().unwrap();
        assert_eq!(seen.counter("redlatch_acquisitions_total", &mutex), 6);
        assert_eq!(
            seen.samples("redlatch_hold_seconds", &mutex),
            6,
            "a passed hold no guard had was counted in the hold time"
        );
        assert_eq!(
            seen.counter("redlatch_handovers_total", &local_handovers),
            handed_before,
            "a hold passed to a waiter that gave up was counted as handed over"
        );
    })
    .await;
}

/// Polls `acquire` once: it has entered its wait (it must not be ready yet).
async fn entered<F: std::future::Future + Unpin>(acquire: &mut F) {
    tokio::select! {
        biased;
        _ = acquire => panic!("acquired while the name was held"),
        () = std::future::ready(()) => {}
    }
}
