//! The results: one [`Record`] per configuration, the median of repetitions, the table on
//! stdout, and the machine they were measured on.

use redis::aio::MultiplexedConnection;
use serde_json::{Value, json};

/// One row of the results.
#[derive(Debug, Clone, Default)]
pub struct Record {
    /// The scenario: `raw`, `uncontended`, `handoff`, `contended`, `contended-1ms`,
    /// `contended-clients`, `relay` (its floor), `remote-waiter`, `idle`,
    /// `semaphore` or `watchdog`.
    pub scenario: &'static str,
    /// The library configuration (`redlatch-mutex`, `rslock-tuned`...).
    pub library: &'static str,
    /// Tasks (waiters, guards) taking part.
    pub tasks: usize,
    /// Clients the tasks are spread over (the contended scenarios).
    pub clients: Option<f64>,
    /// The scenario's main figure per second (cycles, acquisitions, requests or renewals).
    pub ops_per_s: f64,
    /// Hand-off latency, µs: median.
    pub p50_us: Option<f64>,
    /// Hand-off latency, µs: 99th percentile.
    pub p99_us: Option<f64>,
    /// Hand-off latency, µs: the longest.
    pub max_us: Option<f64>,
    /// The longest wait for the lock, ms.
    pub max_wait_ms: Option<f64>,
    /// Jain's fairness index over the tasks' acquisitions.
    pub jain: Option<f64>,
    /// Requests per acquisition (hand-off: per sample, the release and the waiter's
    /// acquisition): as redlatch's clients count their round trips, the server's commands
    /// that no script ran for the peers.
    pub requests_per_acq: Option<f64>,
    /// Share of acquisitions by the task that held the lock just before.
    pub retake_share: Option<f64>,
    /// The critical section held, ms.
    pub critical_section_ms: Option<f64>,
    /// Client process CPU, percent of one core.
    pub cpu_pct: Option<f64>,
    /// Semaphore: the most permits out at once.
    pub most_out: Option<f64>,
    /// Hand-off: the mean latency, µs.
    pub mean_us: Option<f64>,
    /// Hand-off: the longest hold before a release, ms.
    pub hold_ms: Option<f64>,
    /// Hand-off: the latencies sampled.
    pub samples: Option<f64>,
    /// Watchdog: the guards' lease.
    pub lease_ms: Option<f64>,
    /// Uncontended: the figure over the raw scripts' at the same task count.
    pub of_raw: Option<f64>,
    /// Uncontended: the figure over the minimal lock's at the same task count.
    pub of_minimal: Option<f64>,
    /// Uncontended: commands the server ran per cycle, those scripts ran included.
    pub server_commands_per_cycle: Option<f64>,
    /// Uncontended: CPU time of the bench's process per cycle, µs (both ends of the
    /// connection run on the same vCPUs, so this and the server's time set the pace).
    pub client_cpu_us_per_cycle: Option<f64>,
    /// Uncontended: CPU time of the Redis server per cycle, µs (its I/O included).
    pub server_cpu_us_per_cycle: Option<f64>,
    /// Contended over clients: the figure over the publish relay's around as many clients.
    pub of_relay: Option<f64>,
}

impl Record {
    pub(crate) fn json(&self) -> Value {
        json!({
            "scenario": self.scenario,
            "library": self.library,
            "tasks": self.tasks,
            "clients": self.clients.map(|n| n.round() as u64),
            "ops_per_s": self.ops_per_s,
            "p50_us": self.p50_us,
            "p99_us": self.p99_us,
            "max_us": self.max_us,
            "max_wait_ms": self.max_wait_ms,
            "jain": self.jain,
            "requests_per_acq": self.requests_per_acq,
            "retake_share": self.retake_share,
            "critical_section_ms": self.critical_section_ms,
            "cpu_pct": self.cpu_pct,
            "most_out": self.most_out,
            "mean_us": self.mean_us,
            "hold_ms": self.hold_ms,
            "samples": self.samples.map(|n| n.round() as u64),
            "lease_ms": self.lease_ms,
            "of_raw": self.of_raw,
            "of_minimal": self.of_minimal,
            "server_commands_per_cycle": self.server_commands_per_cycle,
            "client_cpu_us_per_cycle": self.client_cpu_us_per_cycle,
            "server_cpu_us_per_cycle": self.server_cpu_us_per_cycle,
            "of_relay": self.of_relay,
        })
    }
}

/// The median, figure by figure, of repeated records of one configuration.
/// `a / b` when both are known and `b` is above zero: the summaries' ratios.
pub(crate) fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

/// A summary figure with two decimals, or `-` when unknown.
pub(crate) fn show(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.2}"))
}

pub(crate) fn median_record(runs: Vec<Record>) -> Record {
    fn med(mut v: Vec<f64>) -> f64 {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    }
    fn med_opt(runs: &[Record], f: impl Fn(&Record) -> Option<f64>) -> Option<f64> {
        let v: Vec<f64> = runs.iter().filter_map(&f).collect();
        (!v.is_empty()).then(|| med(v))
    }
    let mut out = runs[0].clone();
    out.ops_per_s = med(runs.iter().map(|r| r.ops_per_s).collect());
    out.p50_us = med_opt(&runs, |r| r.p50_us);
    out.p99_us = med_opt(&runs, |r| r.p99_us);
    out.max_us = med_opt(&runs, |r| r.max_us);
    out.max_wait_ms = med_opt(&runs, |r| r.max_wait_ms);
    out.jain = med_opt(&runs, |r| r.jain);
    out.requests_per_acq = med_opt(&runs, |r| r.requests_per_acq);
    out.retake_share = med_opt(&runs, |r| r.retake_share);
    out.cpu_pct = med_opt(&runs, |r| r.cpu_pct);
    out.most_out = med_opt(&runs, |r| r.most_out);
    out.mean_us = med_opt(&runs, |r| r.mean_us);
    out.samples = med_opt(&runs, |r| r.samples);
    out.server_commands_per_cycle = med_opt(&runs, |r| r.server_commands_per_cycle);
    out.client_cpu_us_per_cycle = med_opt(&runs, |r| r.client_cpu_us_per_cycle);
    out.server_cpu_us_per_cycle = med_opt(&runs, |r| r.server_cpu_us_per_cycle);
    out
}

/// The machine and server the figures come from.
pub(crate) async fn machine(conn: &mut MultiplexedConnection) -> Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_owned())
        })
        .unwrap_or_default();
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(conn)
        .await
        .unwrap_or_default();
    let version = info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap_or_default()
        .to_owned();
    json!({
        "cpu": cpu,
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "os": std::env::consts::OS,
        "redis": version,
    })
}

fn fmt_opt(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.digits$}"))
}

pub(crate) fn print_table(records: &[Record]) {
    let scenarios = [
        (
            "uncontended",
            "uncontended lock+release, each task on its own name (ops/s); \"of raw\": over the \
             mutex's own requests sent by hand (raw-evalsha) at the same task count",
        ),
        (
            "handoff",
            "hand-off from a release to a waiter blocked in another client",
        ),
        (
            "contended",
            "tasks of one client looping on one name, empty critical section",
        ),
        ("contended-1ms", "the same with a 1 ms critical section"),
        (
            "contended-clients",
            "tasks over 4 clients looping on one name, empty critical section",
        ),
        (
            "remote-waiter",
            "tasks of one client looping on one name, and a waiter in another client taking it \
             1 ms after each of its releases: its waits",
        ),
        (
            "idle",
            "waiters blocked on a held name: Redis requests/s they cause",
        ),
        (
            "semaphore",
            "semaphore of 8 permits, tasks over two clients",
        ),
        (
            "watchdog",
            "guards held on one client: renewal requests/s and client CPU",
        ),
    ];
    for (scenario, title) in scenarios {
        let rows: Vec<&Record> = records
            .iter()
            .filter(|r| {
                r.scenario == scenario
                    || (scenario == "uncontended" && matches!(r.scenario, "raw" | "minimal"))
                    || (scenario == "contended-clients" && r.scenario == "relay")
            })
            .collect();
        if rows.is_empty() {
            continue;
        }
        outln!("\n{title}");
        match scenario {
            "uncontended" => {
                outln!(
                    "  {:<20} {:>6} {:>10} {:>8} {:>10} {:>12} {:>10} {:>10}",
                    "library",
                    "tasks",
                    "ops/s",
                    "of raw",
                    "of minimal",
                    "cmds/cycle",
                    "client µs",
                    "server µs"
                );
                let share = |v: Option<f64>| {
                    v.map_or_else(|| "-".to_owned(), |v| format!("{:.0}%", 100.0 * v))
                };
                for r in rows {
                    outln!(
                        "  {:<20} {:>6} {:>10.0} {:>8} {:>10} {:>12} {:>10} {:>10}",
                        r.library,
                        r.tasks,
                        r.ops_per_s,
                        share(r.of_raw),
                        share(r.of_minimal),
                        fmt_opt(r.server_commands_per_cycle, 1),
                        fmt_opt(r.client_cpu_us_per_cycle, 1),
                        fmt_opt(r.server_cpu_us_per_cycle, 1)
                    );
                }
            }
            "handoff" => {
                outln!(
                    "  {:<20} {:>10} {:>10} {:>10} {:>8} {:>9}",
                    "library",
                    "p50 µs",
                    "p99 µs",
                    "max µs",
                    "samples",
                    "req/hand"
                );
                for r in rows {
                    outln!(
                        "  {:<20} {:>10} {:>10} {:>10} {:>8} {:>9}",
                        r.library,
                        fmt_opt(r.p50_us, 0),
                        fmt_opt(r.p99_us, 0),
                        fmt_opt(r.max_us, 0),
                        fmt_opt(r.samples, 0),
                        fmt_opt(r.requests_per_acq, 2)
                    );
                }
            }
            "contended" | "contended-1ms" | "contended-clients" => {
                let clients = scenario == "contended-clients";
                outln!(
                    "  {:<20} {:>6} {:>10} {:>8} {:>12} {:>7} {:>9}{}",
                    "library",
                    "tasks",
                    "acq/s",
                    "re-take",
                    "longest ms",
                    "Jain",
                    "req/acq",
                    if clients { "  of relay" } else { "" }
                );
                for r in rows {
                    if r.scenario == "relay" {
                        outln!(
                            "  {:<20} {:>6} {:>10.0}   (passes/s of a message relayed around \
                             {} clients: the floor)",
                            r.library,
                            r.tasks,
                            r.ops_per_s,
                            r.tasks
                        );
                        continue;
                    }
                    let of_relay = r
                        .of_relay
                        .map_or_else(|| "-".to_owned(), |v| format!("{:.0}%", 100.0 * v));
                    outln!(
                        "  {:<20} {:>6} {:>10.0} {:>7.1}% {:>12} {:>7} {:>9}{}",
                        r.library,
                        r.tasks,
                        r.ops_per_s,
                        100.0 * r.retake_share.unwrap_or_default(),
                        fmt_opt(r.max_wait_ms, 1),
                        fmt_opt(r.jain, 3),
                        fmt_opt(r.requests_per_acq, 2),
                        if clients {
                            format!(" {of_relay:>9}")
                        } else {
                            String::new()
                        }
                    );
                }
            }
            "remote-waiter" => {
                outln!(
                    "  {:<20} {:>6} {:>10} {:>9} {:>10} {:>10} {:>10} {:>8}",
                    "library",
                    "tasks",
                    "acq/s",
                    "req/acq",
                    "wait p50",
                    "p99 µs",
                    "max µs",
                    "samples"
                );
                for r in rows {
                    outln!(
                        "  {:<20} {:>6} {:>10.0} {:>9} {:>10} {:>10} {:>10} {:>8}",
                        r.library,
                        r.tasks,
                        r.ops_per_s,
                        fmt_opt(r.requests_per_acq, 2),
                        fmt_opt(r.p50_us, 0),
                        fmt_opt(r.p99_us, 0),
                        fmt_opt(r.max_us, 0),
                        fmt_opt(r.samples, 0)
                    );
                }
            }
            "idle" => {
                outln!("  {:<20} {:>8} {:>12}", "library", "waiters", "requests/s");
                for r in rows {
                    outln!("  {:<20} {:>8} {:>12.2}", r.library, r.tasks, r.ops_per_s);
                }
            }
            "semaphore" => {
                for r in rows {
                    outln!(
                        "  {:<20} {:>4} tasks {:>10.0} acq/s, {} req/acq, at most {} permits out",
                        r.library,
                        r.tasks,
                        r.ops_per_s,
                        fmt_opt(r.requests_per_acq, 2),
                        fmt_opt(r.most_out, 0)
                    );
                }
            }
            _ => {
                for r in rows {
                    outln!(
                        "  {:<20} {:>6} guards, {} ms lease: {:>8.1} renewal requests/s, client \
                         CPU {}%",
                        r.library,
                        r.tasks,
                        fmt_opt(r.lease_ms, 0),
                        r.ops_per_s,
                        fmt_opt(r.cpu_pct, 1)
                    );
                }
            }
        }
    }
    outln!();
}
