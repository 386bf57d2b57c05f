//! The contention benchmark, shared by `redlatch bench` and `cargo bench -p redlatch-cli --bench
//! contention` (which adds the Rust peers): the scenarios, the libraries they run, the figures they take,
//! and the table, JSON and chart they write.
//!
//! Every figure is the median of the repetitions (3 in full mode), taken figure by figure. The
//! repetitions are rounds over every configuration, so a drift of the machine's speed over
//! minutes falls on every library alike. The raw reference (redlatch's two mutex scripts by
//! `EVALSHA`, no library logic) and the minimal lock (`SET NX PX`, then a Lua compare-and-delete:
//! no re-entry, no fencing, no wake-up) are measured at every task count of the uncontended
//! scenario, and each uncontended figure is compared with both at the same task count, with the
//! commands the server ran per cycle (those scripts ran included). The contended scenario over
//! clients has a floor of its own, the publish relay (a message passed around as many clients
//! by `PUBLISH` and push, no lock), and each of its figures is compared with it.
//! Requests are counted with `INFO commandstats`: every command clients sent, leaving out the
//! commands a library's scripts run inside Redis and the measurement's own `INFO`.

/// `println!` that does not panic when stdout's reader went away (`| head`): the run goes on,
/// its keys are removed and its files written; the table is only a view of them.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

mod chart;
mod cluster;
mod library;
mod metrics_cost;
mod plan;
mod profile;
mod redlock;
mod replicas;
mod report;
mod scenarios;
mod timeline;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use redis::aio::MultiplexedConnection;
pub use redlatch_harness::measure::{AnyResult, BoxFut, given_server_note};
use redlatch_harness::measure::{
    cleanup, commandstats, cpu_steal, minimal_cycles, process_cpu, raw_cycles, relay_passes,
    server_commands, server_cpu,
};
use serde_json::{Value, json};

pub use cluster::{redlatch_cluster_client, redlatch_cluster_entries, redlatch_cluster_entry};
pub use library::{
    Connect, Contender, Entry, Hold, Library, Primitive, redlatch_client, redlatch_entries,
    redlatch_entry,
};
pub use metrics_cost::metrics_cost;
pub use plan::{Plan, parse_hold_ms};
pub use profile::profile_scripts;
pub use redlock::{
    RedlockBed, RedlockRow, RedlockScenario, redlatch_redlock_rows, redlock_peer_row,
};
pub use replicas::ReplicasBed;
pub use report::Record;
pub use timeline::timeline;

use chart::chart;
use plan::Job;
use report::{machine, median_record, print_table};
use scenarios::{
    contended, handoff, idle, latency, remote_waiter, semaphore, uncontended, watchdog,
};

/// Everything a run needs.
#[derive(Debug)]
pub struct Bench {
    /// The server.
    pub url: String,
    /// The run's key prefix: everything under it is deleted at the end.
    pub prefix: String,
    /// How long and how much.
    pub plan: Plan,
    /// Entries that run scenarios 2 to 5.
    pub entries: Vec<Entry>,
    /// Entries that take part in the contended scenarios (the mutexes and the peers).
    pub contended: Vec<&'static str>,
    /// The directory for `contention.json` and `contention.svg`.
    pub out_dir: PathBuf,
    /// Whether the server is one the tool started for this run (`"server": "own"` in the JSON)
    /// or one it was given (`"given"`).
    pub own_server: bool,
    /// The cluster scenario's seeds and entries, when it runs: the same figures on a Redis
    /// Cluster, in the same run.
    pub cluster: Option<(Vec<String>, Vec<Entry>)>,
    /// The Redlock scenario, when it runs: acquire latency over independent servers of the
    /// tool's own, beside one of them alone, in the same run.
    pub redlock: Option<RedlockScenario>,
    /// The replicas scenario, when it runs: a master and a replica of the tool's own, durable
    /// acquisitions beside plain ones.
    pub replicas: Option<ReplicasBed>,
}

impl Bench {
    /// Every configuration, in the order of the table.
    fn jobs(&self) -> Vec<Job<'_>> {
        let plan = &self.plan;
        let mut jobs: Vec<Job<'_>> = plan
            .uncontended_tasks
            .iter()
            .map(|&t| Job::Raw(t))
            .collect();
        jobs.extend(plan.uncontended_tasks.iter().map(|&t| Job::Minimal(t)));
        for entry in &self.entries {
            jobs.extend(
                plan.uncontended_tasks
                    .iter()
                    .map(|&t| Job::Uncontended(entry, t)),
            );
        }
        // Read holds share: a reader never waits for a reader, so there is no hand-off to time.
        jobs.extend(
            self.entries
                .iter()
                .filter(|e| e.name != "redlatch-rwlock-read")
                .map(Job::Handoff),
        );
        for entry in self
            .entries
            .iter()
            .filter(|e| self.contended.contains(&e.name))
        {
            for &tasks in &plan.contended_tasks {
                for cs in [Duration::ZERO, Duration::from_millis(1)] {
                    jobs.push(Job::Contended(entry, tasks, 1, cs));
                }
            }
            jobs.push(Job::Contended(entry, 16, 4, Duration::ZERO));
        }
        // The floor of the contended scenario over clients: a message relayed around as many
        // clients, no lock.
        jobs.push(Job::Relay(4));
        jobs.extend(
            self.entries
                .iter()
                .filter(|e| e.name == "redlatch-mutex")
                .map(|e| Job::RemoteWaiter(e, 16)),
        );
        jobs.extend(
            self.entries
                .iter()
                .filter(|e| !e.name.starts_with("redlatch-rwlock"))
                .map(Job::Idle),
        );
        jobs.extend([Job::Semaphore, Job::Watchdog]);
        if let Some((_, cluster)) = &self.cluster {
            jobs.extend(self.entries.iter().take(1).map(Job::Latency));
            jobs.extend(cluster.iter().take(1).map(Job::Latency));
            jobs.extend(cluster.iter().map(Job::Handoff));
            jobs.extend(
                cluster
                    .iter()
                    .filter(|e| e.name == "redlatch-fair-cluster")
                    .map(|e| Job::ClusterContended(e, 16)),
            );
        }
        if let Some(redlock) = &self.redlock {
            jobs.extend(redlock.rows.iter().map(Job::Redlock));
        }
        if self.replicas.is_some() {
            jobs.extend(replicas::ReplicasRow::ALL.map(Job::Replicas));
        }
        jobs
    }

    /// Runs every scenario, prints the table and writes the JSON and the chart. The bench's keys
    /// are deleted at the end, also when a scenario failed.
    pub async fn run(&self) -> AnyResult<Value> {
        let mut conn = redis::Client::open(self.url.as_str())?
            .get_multiplexed_async_connection()
            .await?;
        let plan = &self.plan;
        let steal_before = cpu_steal();
        let started = Instant::now();
        let measured = self.measure_all(&mut conn).await;
        if let Err(err) = self.cleanup(&mut conn).await {
            eprintln!("warning: could not delete the bench's keys: {err}");
        }
        let mut records = measured?;

        // Uncontended figures over the raw ones and the minimal lock's of the same task count
        // (the raw scripts over the minimal lock too); contended figures over clients over the
        // relay's passes around as many clients.
        let reference = |r: &Record, scenario: &str| {
            records
                .iter()
                .find(|o| {
                    o.scenario == scenario
                        && match scenario {
                            "relay" => o.clients == r.clients,
                            _ => o.tasks == r.tasks,
                        }
                })
                .map(|o| o.ops_per_s)
                .filter(|ops| *ops > 0.0)
                .map(|ops| r.ops_per_s / ops)
        };
        let ratios: Vec<[Option<f64>; 3]> = records
            .iter()
            .map(|r| match r.scenario {
                "uncontended" => [reference(r, "raw"), reference(r, "minimal"), None],
                "raw" => [None, reference(r, "minimal"), None],
                "contended-clients" => [None, None, reference(r, "relay")],
                _ => [None; 3],
            })
            .collect();
        for (r, [of_raw, of_minimal, of_relay]) in records.iter_mut().zip(ratios) {
            r.of_raw = of_raw;
            r.of_minimal = of_minimal;
            r.of_relay = of_relay;
        }
        // The headline raw figure: at 32 tasks, or the most tasks measured.
        let headline = records
            .iter()
            .filter(|r| r.scenario == "raw")
            .max_by_key(|r| (r.tasks == 32, r.tasks));
        let (raw_tasks, raw_cycles_per_s) = headline.map_or((0, 0.0), |r| (r.tasks, r.ops_per_s));

        let steal_pct = steal_before
            .zip(cpu_steal())
            .map(|((s0, t0), (s1, t1))| 100.0 * (s1 - s0) as f64 / (t1 - t0).max(1) as f64);
        let machine = machine(&mut conn).await;
        print_table(&records);
        let cluster = cluster::summary(&records);
        let redlock = redlock::summary(&records);
        let replicas = replicas::summary(&records);
        outln!(
            "{} mode, {:.0} s, {} server; the mutex's requests by hand (raw-evalsha), \
             {raw_tasks} tasks: {raw_cycles_per_s:.0} cycles/s",
            plan.mode,
            started.elapsed().as_secs_f64(),
            if self.own_server { "own" } else { "given" },
        );
        if let Some(pct) = steal_pct {
            outln!("CPU time the hypervisor took during the run (steal): {pct:.1}%");
        }
        let report = json!({
            "mode": plan.mode,
            "repetitions": plan.repetitions,
            "seconds": started.elapsed().as_secs_f64(),
            "server": if self.own_server { "own" } else { "given" },
            "raw_cycles_per_s": raw_cycles_per_s,
            "raw_tasks": raw_tasks,
            "steal_pct": steal_pct,
            "machine": machine,
            "cluster": cluster,
            "redlock": redlock,
            "replicas": replicas,
            "records": records.iter().map(Record::json).collect::<Vec<_>>(),
        });
        std::fs::create_dir_all(&self.out_dir)?;
        let json_path = self.out_dir.join("contention.json");
        std::fs::write(&json_path, serde_json::to_string_pretty(&report)?)?;
        let svg_path = self.out_dir.join("contention.svg");
        chart(&records, &svg_path)?;
        outln!("wrote {} and {}", json_path.display(), svg_path.display());
        Ok(report)
    }

    /// Every job, repetition by repetition; the median record of each configuration.
    async fn measure_all(&self, conn: &mut MultiplexedConnection) -> AnyResult<Vec<Record>> {
        let plan = &self.plan;
        let jobs = self.jobs();
        let bar = ProgressBar::new((plan.repetitions * jobs.len()) as u64);
        bar.set_style(ProgressStyle::with_template(
            "{spinner} [{bar:30}] {pos}/{len} {msg} {elapsed}",
        )?);
        bar.enable_steady_tick(Duration::from_millis(200));
        let semaphore_entry = redlatch_entry(
            "redlatch-semaphore",
            &self.url,
            &self.prefix,
            Primitive::Semaphore(8),
        );
        // Repetition by repetition over every job, so that a machine whose speed drifts over
        // minutes (a shared virtual machine) slows every library alike.
        let mut runs: Vec<Vec<Record>> = vec![Vec::new(); jobs.len()];
        for _ in 0..plan.repetitions {
            for (job, out) in jobs.iter().zip(&mut runs) {
                bar.set_message(job.label(plan));
                let counted = matches!(job, Job::Raw(_) | Job::Minimal(_) | Job::Uncontended(..));
                // The server's commands, and both processes' CPU time, around the job: its
                // set-up (a connection, each name taken once, a pause) costs well under a
                // hundredth of the phase's.
                let before = if counted {
                    Some((
                        commandstats(conn).await?,
                        process_cpu(),
                        server_cpu(conn).await?,
                    ))
                } else {
                    None
                };
                let record = match *job {
                    Job::Raw(tasks) => raw_cycles(&self.url, &self.prefix, tasks, plan.phase)
                        .await
                        .map(|ops_per_s| Record {
                            scenario: "raw",
                            library: "raw-evalsha",
                            tasks,
                            ops_per_s,
                            ..Record::default()
                        }),
                    Job::Minimal(tasks) => {
                        minimal_cycles(&self.url, &self.prefix, tasks, plan.phase)
                            .await
                            .map(|ops_per_s| Record {
                                scenario: "minimal",
                                library: "set-nx-px",
                                tasks,
                                ops_per_s,
                                ..Record::default()
                            })
                    }
                    Job::Uncontended(entry, tasks) => uncontended(entry, tasks, plan.phase).await,
                    Job::Relay(clients) => {
                        relay_passes(&self.url, &self.prefix, clients, plan.warm_up, plan.phase)
                            .await
                            .map(|ops_per_s| Record {
                                scenario: "relay",
                                library: "publish-relay",
                                tasks: clients,
                                clients: Some(clients as f64),
                                ops_per_s,
                                ..Record::default()
                            })
                    }
                    Job::Handoff(entry) => handoff(entry, conn, plan).await,
                    Job::Contended(entry, tasks, clients, cs) => {
                        contended(entry, conn, tasks, clients, cs, plan).await
                    }
                    Job::RemoteWaiter(entry, tasks) => {
                        remote_waiter(entry, conn, tasks, plan).await
                    }
                    Job::Idle(entry) => idle(entry, conn, plan).await,
                    Job::Semaphore => semaphore(&semaphore_entry, conn, 64, plan).await,
                    Job::Watchdog => watchdog(&self.url, &self.prefix, conn, plan).await,
                    Job::Latency(entry) => latency(entry, plan.phase).await,
                    Job::ClusterContended(entry, tasks) => match &self.cluster {
                        Some((seeds, _)) => {
                            cluster::contended(entry, seeds, &self.prefix, tasks, plan).await
                        }
                        None => Err("no cluster".into()),
                    },
                    Job::Redlock(row) => match &self.redlock {
                        Some(scenario) => redlock::acquire(row, &scenario.bed, plan.phase).await,
                        None => Err("no Redlock servers".into()),
                    },
                    Job::Replicas(row) => match &self.replicas {
                        Some(bed) => replicas::measure(row, bed, &self.prefix, plan.phase).await,
                        None => Err("no replicated servers".into()),
                    },
                };
                let mut record = match record {
                    Ok(record) => record,
                    Err(err) => {
                        bar.finish_and_clear();
                        return Err(format!("{}: {err}", job.label(plan)).into());
                    }
                };
                if let Some((commands, client_cpu, server_cpu_before)) = before {
                    let after = commandstats(conn).await?;
                    let server_cpu_after = server_cpu(conn).await?;
                    let cycles = record.ops_per_s * plan.phase.as_secs_f64();
                    let per_cycle_us = |seconds: f64| Some(1e6 * seconds / cycles.max(1.0));
                    record.server_commands_per_cycle =
                        Some(server_commands(&commands, &after) as f64 / cycles.max(1.0));
                    record.client_cpu_us_per_cycle = client_cpu
                        .zip(process_cpu())
                        .and_then(|(before, after)| per_cycle_us(after - before));
                    record.server_cpu_us_per_cycle =
                        per_cycle_us(server_cpu_after - server_cpu_before);
                }
                out.push(record);
                bar.inc(1);
            }
        }
        bar.finish_and_clear();
        Ok(runs
            .into_iter()
            .filter(|r| !r.is_empty())
            .map(median_record)
            .collect())
    }

    /// Deletes every key of the run: the bench's prefix and the entries' other namespaces.
    async fn cleanup(&self, conn: &mut MultiplexedConnection) -> AnyResult<()> {
        cleanup(conn, &self.prefix).await?;
        let mut namespaces: Vec<&String> =
            self.entries.iter().flat_map(|e| &e.namespaces).collect();
        namespaces.sort();
        namespaces.dedup();
        for namespace in namespaces {
            cleanup(conn, namespace).await?;
        }
        Ok(())
    }
}
