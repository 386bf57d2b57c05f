//! The wake path, hop by hop (`redlatch bench --timeline`): the hand-off scenario (two clients
//! taking turns on one name, each release to a waiter already blocked) with a trace subscriber
//! that timestamps redlatch's `redlatch::timeline` events. Each hand-off is cut at its hops, from
//! the release's start to the waiter's acquire returning, and each hop's median and 99th
//! percentile are reported.

use std::sync::{Arc, Mutex as StdMutex};
use std::time::Instant;

use redlatch_harness::measure::AnyResult;
use serde_json::{Value, json};
use tracing::field::{Field, Visit};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::{Context, SubscriberExt};

use super::library::{Entry, Pair};
use super::plan::Plan;
use super::scenarios::handoffs;

/// The events' target (see redlatch's `timeline` module).
const TARGET: &str = "redlatch::timeline";

/// The hops in the order a hand-off passes them.
const HOPS: [&str; 6] = [
    "release.sent",
    "wake.received",
    "waiter.woken",
    "attempt.sent",
    "attempt.answered",
    "acquired",
];

/// Every timeline event of the run, in the order they came.
type Events = Arc<StdMutex<Vec<(Instant, &'static str)>>>;

/// Records the timeline events.
struct Recorder(Events);

struct HopName(Option<&'static str>);

impl Visit for HopName {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "hop" {
            self.0 = HOPS
                .iter()
                .chain(["release.answered"].iter())
                .find(|h| **h == value)
                .copied();
        }
    }

    fn record_debug(&mut self, _: &Field, _: &dyn std::fmt::Debug) {}
}

impl<S: tracing::Subscriber> Layer<S> for Recorder {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        if event.metadata().target() != TARGET {
            return;
        }
        let at = Instant::now();
        let mut hop = HopName(None);
        event.record(&mut hop);
        if let (Some(hop), Ok(mut events)) = (hop.0, self.0.lock()) {
            events.push((at, hop));
        }
    }
}

/// One hand-off: when it passed each hop (µs from the release's start), `None` where it did
/// not pass.
type Cut = Vec<Option<f64>>;

/// Cuts the events into hand-offs: from each `release.sent` to the next `acquired` after a
/// wake-up; the first passage of each hop in between.
fn cuts(events: &[(Instant, &'static str)]) -> Vec<(Cut, Option<f64>)> {
    let mut out = Vec::new();
    let mut open: Option<(Instant, Cut, Option<f64>)> = None;
    for &(at, hop) in events {
        if hop == "release.sent" {
            open = Some((at, vec![None; HOPS.len()], None));
            continue;
        }
        let Some((start, cut, answered)) = open.as_mut() else {
            continue;
        };
        let us = (at - *start).as_secs_f64() * 1e6;
        if hop == "release.answered" {
            answered.get_or_insert(us);
            continue;
        }
        if let Some(i) = HOPS.iter().position(|h| *h == hop)
            && cut[i].is_none()
        {
            cut[i] = Some(us);
        }
        // An acquire ends the hand-off; one without a wake-up was not a hand-off.
        if hop == "acquired"
            && let Some((_, cut, answered)) = open.take()
            && cut[1].is_some()
        {
            out.push((cut, answered));
        }
    }
    out
}

/// The median and the 99th percentile of `values`.
fn quantiles(mut values: Vec<f64>) -> Option<(f64, f64)> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let at = |q: f64| values[((values.len() - 1) as f64 * q).round() as usize];
    Some((at(0.5), at(0.99)))
}

/// Runs the hand-off scenario of each entry with the timeline recorded, and prints each hop's
/// time (from the hop before it) per library. Returns the figures as JSON.
///
/// # Errors
///
/// A failed connection or lock operation, or a trace subscriber already set in this process.
pub async fn timeline(entries: &[Entry], plan: &Plan) -> AnyResult<Value> {
    let events: Events = Arc::default();
    tracing::subscriber::set_global_default(
        tracing_subscriber::registry().with(Recorder(Arc::clone(&events))),
    )?;
    let mut out = Vec::new();
    outln!(
        "{:<24} {:>8}  hop: p50 / p99 µs from the hop before (release.answered: from release.sent)",
        "library",
        "samples"
    );
    for entry in entries.iter().filter(|e| e.name != "redlatch-rwlock-read") {
        let name = format!("t{}", fastrand::u32(..));
        let pair = Pair::connect(entry).await?;
        if let Ok(mut e) = events.lock() {
            e.clear();
        }
        handoffs(&pair, &name, plan).await?;
        drop(pair);
        let recorded = events.lock().map(|e| e.clone()).unwrap_or_default();
        let cuts = cuts(&recorded);
        let mut hops = Vec::new();
        let mut line = String::new();
        for (i, hop) in HOPS.iter().enumerate().skip(1) {
            // From the last hop before it that this hand-off passed.
            let deltas: Vec<f64> = cuts
                .iter()
                .filter_map(|(cut, _)| {
                    let at = cut[i]?;
                    let before = cut[..i].iter().rev().find_map(|c| *c).unwrap_or(0.0);
                    Some(at - before)
                })
                .collect();
            let passed = deltas.len();
            if let Some((p50, p99)) = quantiles(deltas) {
                // A hop most hand-offs skip (a queued waiter's attempt) shows how many passed it.
                let share = if passed < cuts.len() {
                    format!(" ({passed} of {})", cuts.len())
                } else {
                    String::new()
                };
                line.push_str(&format!("  {hop} {p50:.0}/{p99:.0}{share}"));
                hops.push(json!({ "hop": hop, "p50_us": p50, "p99_us": p99, "samples": passed }));
            }
        }
        let answered = quantiles(cuts.iter().filter_map(|(_, a)| *a).collect());
        if let Some((p50, p99)) = answered {
            line.push_str(&format!("  release.answered {p50:.0}/{p99:.0}"));
        }
        let total = quantiles(
            cuts.iter()
                .filter_map(|(cut, _)| cut[HOPS.len() - 1])
                .collect(),
        );
        if let Some((p50, p99)) = total {
            line.push_str(&format!("  total {p50:.0}/{p99:.0}"));
        }
        outln!("{:<24} {:>8}{line}", entry.name, cuts.len());
        out.push(json!({
            "library": entry.name,
            "samples": cuts.len(),
            "hops": hops,
            "release_answered": answered.map(|(p50, p99)| json!({ "p50_us": p50, "p99_us": p99 })),
            "total": total.map(|(p50, p99)| json!({ "p50_us": p50, "p99_us": p99 })),
        }));
    }
    Ok(json!({ "libraries": out }))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_hand_off_is_cut_at_its_hops_and_others_are_left_out() {
        let t0 = Instant::now();
        let at = |us: u64| t0 + Duration::from_micros(us);
        let events = vec![
            // The first acquisition: no release before it.
            (at(0), "attempt.sent"),
            (at(5), "acquired"),
            // A hand-off to a queued waiter.
            (at(100), "release.sent"),
            (at(140), "wake.received"),
            (at(150), "release.answered"),
            (at(160), "waiter.woken"),
            (at(165), "acquired"),
            // A release nobody waited for, then an acquire without a wake-up.
            (at(300), "release.sent"),
            (at(310), "attempt.sent"),
            (at(320), "acquired"),
        ];
        let cuts = cuts(&events);
        assert_eq!(cuts.len(), 1);
        let (cut, answered) = &cuts[0];
        assert_eq!(
            cut,
            &vec![None, Some(40.0), Some(60.0), None, None, Some(65.0)]
        );
        assert_eq!(*answered, Some(50.0));
    }
}
