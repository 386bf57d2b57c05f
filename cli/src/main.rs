//! `redlatch`: the command-line tool (package `redlatch-cli`; `cargo install --path cli`).
//!
//! ```text
//! redlatch bench [--quick] [--cluster] [--redlock] [--replicas] # the benchmark, own redis-server
//! redlatch bench --scripts [--quick]   # µs per script call inside Redis, own redis-server
//! redlatch bench --timeline [--quick]  # the wake path of a hand-off, hop by hop
//! redlatch bench --metrics-cost [--quick] # uncontended cycles with metrics recorded and without
//! redlatch --url redis://host:6379 inspect NAME  # holders, holds, lease left, queue, permits
//! redlatch --url redis://host:6379 force-unlock NAME [--yes]
//! redlatch --url redis://host:6379 top [--once [--json]] # the names held or queued now, live
//! redlatch --url redis://host:6379 inspect NAME --watch  # follow one name
//! redlatch --cluster --url redis://a:7000,redis://b:7001 inspect NAME   # on a Redis Cluster
//! redlatch --sentinel redis://s1:26379,redis://s2:26379 --master mymaster inspect NAME
//! ```

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use redlatch::LockClient;
use redlatch_cli::{bench, top};
use redlatch_harness::{RedisCluster, server};

#[derive(Parser, Debug)]
#[command(
    name = "redlatch",
    version,
    about = "Distributed locks over Redis: benchmark, inspect, force-unlock"
)]
struct Cli {
    /// The Redis server (also from `REDIS_URL`). `bench` starts its own server when none is given.
    #[arg(long, env = "REDIS_URL", global = true)]
    url: Option<String>,
    /// The key prefix the locks were made with (`LockClientBuilder::key_prefix`).
    #[arg(long, default_value = "redlatch", global = true)]
    prefix: String,
    /// The server is a Redis Cluster: `--url` lists seed nodes, separated by commas. With
    /// `bench`: also run the cluster scenario on a 3-master cluster of the tool's own.
    #[arg(long, global = true)]
    cluster: bool,
    /// Reach the master through Redis Sentinel: the sentinels' addresses, separated by commas
    /// (`--url` is then not needed).
    #[arg(long, global = true, conflicts_with = "cluster")]
    sentinel: Option<String>,
    /// With `--sentinel`: the name the sentinels know the master by.
    #[arg(long, default_value = "mymaster", global = true)]
    master: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug, Clone)]
enum Command {
    /// Run the contention benchmark: a table on stdout, `contention.json` and `contention.svg`.
    Bench {
        /// The quick mode (under 2 minutes), for smoke runs.
        #[arg(long)]
        quick: bool,
        /// Where to write the JSON and the chart.
        #[arg(long, default_value = "target/bench")]
        out: PathBuf,
        /// In the hand-off scenario the holder holds 1 ms to this many ms (at random); 2 to 60000.
        #[arg(long, default_value_t = 5, value_parser = bench::parse_hold_ms)]
        handoff_hold_ms: u64,
        /// Also run the Redlock scenario on five servers of the tool's own.
        #[arg(long)]
        redlock: bool,
        /// Also run the replicas scenario (durable acquisitions) on a master and a replica of
        /// the tool's own.
        #[arg(long)]
        replicas: bool,
        /// Profile the scripts instead: each primitive's acquire and release script on names
        /// in use, then the queued primitives' queueing attempt and hand-over on contended
        /// names and a newcomer's join of a shared holder (by the fast and the general path),
        /// µs per call inside Redis (`INFO commandstats`), on a server of the tool's own;
        /// writes `scripts.json`.
        #[arg(long, conflicts_with_all = ["redlock", "replicas", "cluster"])]
        scripts: bool,
        /// Time the wake path instead: the hand-off scenario, cut at each hop from a release to
        /// the woken waiter's acquire returning (redlatch's `redlatch::timeline` trace
        /// events); writes `timeline.json`.
        #[arg(long, conflicts_with_all = ["redlock", "replicas", "cluster", "scripts"])]
        timeline: bool,
        /// Measure what the metrics cost instead: the uncontended scenario with redlatch's
        /// metrics recorded (by `metrics-exporter-prometheus`) and without, in alternation.
        #[arg(long, conflicts_with_all = ["redlock", "replicas", "cluster", "scripts", "timeline"])]
        metrics_cost: bool,
    },
    /// Print what is going on under a name: holders, holds, lease left, queue, permits, last
    /// fencing token.
    Inspect {
        /// The lock's name.
        name: String,
        /// Follow it: print it again every `--interval-ms` until interrupted.
        #[arg(long)]
        watch: bool,
        /// With `--watch`: the refresh period.
        #[arg(
            long,
            default_value_t = 1000,
            requires = "watch",
            value_parser = clap::value_parser!(u64).range(100..)
        )]
        interval_ms: u64,
    },
    /// A live view of the names under the prefix that are held or queued now, most queued
    /// first: kind, queue length, holders, holds, lease left, permits, last fencing token.
    /// Found with `SCAN` in batches of 500 and read with one `inspect` each; read-only. Needs
    /// `--url` (one server, or the master).
    Top {
        /// Print one view and exit.
        #[arg(long)]
        once: bool,
        /// With `--once`: the view as JSON.
        #[arg(long, requires = "once")]
        json: bool,
        /// The refresh period.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(100..))]
        interval_ms: u64,
        /// Show at most this many names.
        #[arg(long, default_value_t = 40)]
        limit: usize,
    },
    /// End every hold and queue place of a name at once (holders see their guards lost at
    /// their next renewal).
    ForceUnlock {
        /// The lock's name.
        name: String,
        /// Do not ask for confirmation.
        #[arg(long)]
        yes: bool,
    },
}

type AnyResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Clears the terminal and moves the cursor home (ANSI), before each refresh of a live view.
const CLEAR: &str = "\x1b[2J\x1b[H";

/// `n` and `word`, with an `s` unless `n` is 1.
fn count(n: u64, word: &str) -> String {
    if n == 1 {
        format!("{n} {word}")
    } else {
        format!("{n} {word}s")
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    let url_from_env = matches.value_source("url") == Some(ValueSource::EnvVariable);
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    match run(cli, url_from_env).await {
        Ok(code) => code,
        // The reader of the output went away (`| head`): nothing more to say, as for any tool.
        Err(err)
            if err
                .downcast_ref::<std::io::Error>()
                .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe) =>
        {
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("redlatch: {err}");
            for cause in causes(err.as_ref()) {
                eprintln!("  caused by: {cause}");
            }
            ExitCode::FAILURE
        }
    }
}

/// The messages of `err`'s causes, outermost first, each said once: a cause whose message the
/// one before already includes (the pool's error quotes the Redis error, which quotes the I/O
/// error) is left out.
fn causes(err: &(dyn std::error::Error + 'static)) -> Vec<String> {
    let mut said = err.to_string();
    let mut causes = Vec::new();
    let mut source = err.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !said.contains(&text) {
            causes.push(text.clone());
            said = text;
        }
        source = cause.source();
    }
    causes
}

fn client(cli: &Cli) -> AnyResult<LockClient> {
    let prefix = cli.prefix.as_str();
    if let Some(sentinels) = &cli.sentinel {
        let sentinels: Vec<&str> = sentinels.split(',').map(str::trim).collect();
        return Ok(LockClient::sentinel_builder(sentinels, &cli.master)
            .key_prefix(prefix)
            .build()?);
    }
    let url = cli
        .url
        .as_deref()
        .ok_or("no server: give --url (or --sentinel) or set REDIS_URL")?;
    let cluster = cli.cluster;
    if cluster {
        let seeds: Vec<String> = url.split(',').map(|s| s.trim().to_owned()).collect();
        return bench::redlatch_cluster_client(&seeds, prefix);
    }
    bench::redlatch_client(url, prefix)
}

async fn run(cli: Cli, url_from_env: bool) -> AnyResult<ExitCode> {
    match cli.command.clone() {
        Command::Bench {
            quick,
            out,
            handoff_hold_ms,
            redlock,
            replicas,
            scripts,
            timeline,
            metrics_cost,
        } => {
            if cli.sentinel.is_some() {
                return Err(
                    "bench runs on one server (`--url`, or one of its own), not through \
                            Sentinel: leave out --sentinel"
                        .into(),
                );
            }
            if metrics_cost {
                let (server, url) = server::try_named_or_own(cli.url.clone())?;
                note_given(&server, &url, url_from_env);
                let prefix = format!("{}-bench-{}", cli.prefix, std::process::id());
                let entries = bench::redlatch_entries(&url, &prefix);
                let plan = bench::Plan::new(quick, handoff_hold_ms);
                let report = bench::metrics_cost(&entries, &plan).await;
                // The run's keys go, also after a failure.
                let mut conn = redis::Client::open(url.as_str())?
                    .get_multiplexed_async_connection()
                    .await?;
                redlatch_harness::measure::cleanup(&mut conn, &prefix).await?;
                let report = report?;
                std::fs::create_dir_all(&out)?;
                std::fs::write(
                    out.join("metrics-cost.json"),
                    serde_json::to_string_pretty(&report)?,
                )?;
                drop(server);
                return Ok(ExitCode::SUCCESS);
            }
            if timeline {
                let (server, url) = server::try_named_or_own(cli.url.clone())?;
                note_given(&server, &url, url_from_env);
                let prefix = format!("{}-bench-{}", cli.prefix, std::process::id());
                let entries = bench::redlatch_entries(&url, &prefix);
                let plan = bench::Plan::new(quick, handoff_hold_ms);
                let report = bench::timeline(&entries, &plan).await;
                // The run's keys go, also after a failure.
                let mut conn = redis::Client::open(url.as_str())?
                    .get_multiplexed_async_connection()
                    .await?;
                redlatch_harness::measure::cleanup(&mut conn, &prefix).await?;
                let report = report?;
                std::fs::create_dir_all(&out)?;
                std::fs::write(
                    out.join("timeline.json"),
                    serde_json::to_string_pretty(&report)?,
                )?;
                drop(server);
                return Ok(ExitCode::SUCCESS);
            }
            if scripts {
                if cli.url.is_some() {
                    return Err(
                        "--scripts reads the server's command totals, which other clients \
                         would spoil: it runs on a server of its own (leave out --url and \
                         REDIS_URL)"
                            .into(),
                    );
                }
                let (server, url) = server::try_named_or_own(None)?;
                let prefix = format!("{}-bench-{}", cli.prefix, std::process::id());
                let entries = bench::redlatch_entries(&url, &prefix);
                let names = if quick { 500 } else { 3_000 };
                let report = bench::profile_scripts(&url, &prefix, &entries, names).await?;
                std::fs::create_dir_all(&out)?;
                std::fs::write(
                    out.join("scripts.json"),
                    serde_json::to_string_pretty(&report)?,
                )?;
                drop(server);
                return Ok(ExitCode::SUCCESS);
            }
            let (server, url) = server::try_named_or_own(cli.url.clone())?;
            let own_server = server.is_some();
            note_given(&server, &url, url_from_env);
            let prefix = format!("{}-bench-{}", cli.prefix, std::process::id());
            let plan = bench::Plan::new(quick, handoff_hold_ms);
            let entries = bench::redlatch_entries(&url, &prefix);
            // The cluster scenario runs on a cluster of the tool's own, always: it is compared
            // with the single server on the same machine.
            let own_cluster = if cli.cluster {
                Some(tokio::task::spawn_blocking(|| RedisCluster::try_start(3, 0)).await??)
            } else {
                None
            };
            let cluster = own_cluster.as_ref().map(|c| {
                let seeds = c.urls();
                let entries = bench::redlatch_cluster_entries(&seeds, &prefix);
                (seeds, entries)
            });
            // The Redlock scenario runs on servers of the tool's own, beside one of them alone.
            let redlock = if redlock {
                let bed = bench::RedlockBed::start(5).await?;
                let rows = bench::redlatch_redlock_rows(&bed.urls(), &prefix);
                Some(bench::RedlockScenario { bed, rows })
            } else {
                None
            };
            let bench = bench::Bench {
                url,
                prefix,
                plan,
                entries,
                contended: vec!["redlatch-mutex", "redlatch-fair"],
                out_dir: out,
                own_server,
                cluster,
                redlock,
                replicas: if replicas {
                    Some(bench::ReplicasBed::start().await?)
                } else {
                    None
                },
            };
            bench.run().await?;
            drop((server, own_cluster));
            Ok(ExitCode::SUCCESS)
        }
        Command::Inspect {
            name,
            watch,
            interval_ms,
        } => {
            let client = client(&cli)?;
            if !watch {
                say(format_args!("{}", client.inspect(&name).await?))?;
                return Ok(ExitCode::SUCCESS);
            }
            let period = std::time::Duration::from_millis(interval_ms);
            loop {
                let at = tokio::time::Instant::now();
                let snapshot = client.inspect(&name).await?;
                say(format_args!("{CLEAR}{snapshot}"))?;
                tokio::time::sleep_until(at + period).await;
            }
        }
        Command::Top {
            once,
            json,
            interval_ms,
            limit,
        } => {
            let url = match (&cli.url, cli.cluster || cli.sentinel.is_some()) {
                (Some(url), false) => url.clone(),
                _ => {
                    return Err("top reads one server: give --url (the master's address; \
                                not --cluster or --sentinel)"
                        .into());
                }
            };
            let client = client(&cli)?;
            let mut conn = redis::Client::open(url.as_str())?
                .get_multiplexed_async_connection()
                .await?;
            let period = std::time::Duration::from_millis(interval_ms);
            loop {
                let at = tokio::time::Instant::now();
                let view = top::view(&mut conn, &client, &cli.prefix, limit).await?;
                if once {
                    if json {
                        say(format_args!(
                            "{}\n",
                            serde_json::to_string_pretty(&top::json(&view))?
                        ))?;
                    } else {
                        say(format_args!("{}", top::table(&view)))?;
                    }
                    return Ok(ExitCode::SUCCESS);
                }
                say(format_args!(
                    "{CLEAR}redlatch top: {} held or queued under {}:*, {} commands for this view \
                     ({:.0}/s), every {} ms; Ctrl-C to quit\n\n{}",
                    view.rows.len() + view.left_out,
                    cli.prefix,
                    view.commands,
                    view.commands as f64 / period.as_secs_f64(),
                    interval_ms,
                    top::table(&view)
                ))?;
                tokio::time::sleep_until(at + period).await;
            }
        }
        Command::ForceUnlock { name, yes } => {
            let client = client(&cli)?;
            let snapshot = client.inspect(&name).await?;
            if snapshot.kind.is_none() {
                say(format_args!("{name}: nothing stored, nothing to unlock\n"))?;
                return Ok(ExitCode::SUCCESS);
            }
            // A reader that went away before the unlock (`| head`, a pager quit at the
            // question) must not pass for a done unlock: with `--yes` the unlock goes ahead, and
            // without it a question that cannot be asked is a no, with a failed exit.
            let shown = say(format_args!("{snapshot}"));
            if !yes {
                let question = format!("end every hold and queue place of `{name}`?");
                match shown.map_err(Into::into).and_then(|()| confirm(&question)) {
                    Ok(true) => {}
                    Ok(false) => {
                        let _ = say(format_args!("left as it is\n"));
                        return Ok(ExitCode::FAILURE);
                    }
                    Err(err) => {
                        eprintln!("redlatch: could not ask to go ahead ({err}); left as it is");
                        return Ok(ExitCode::FAILURE);
                    }
                }
            }
            let removed = client.force_unlock(&name).await?;
            say(format_args!(
                "{name}: removed {} and {}; holders see their guards lost at their next renewal\n",
                count(removed.holders.into(), "holder"),
                count(removed.waiters.into(), "waiter")
            ))?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Says on stderr that the benchmark runs against the server it was given (`url`), when it
/// started none of its own (`server`).
fn note_given<T>(server: &Option<T>, url: &str, url_from_env: bool) {
    if server.is_none() {
        let source = if url_from_env { "REDIS_URL" } else { "--url" };
        eprintln!(
            "{}",
            bench::given_server_note("redlatch bench", url, source)
        );
    }
}

/// Writes `text` to stdout, at once: an error (a reader that went away) is returned, never a
/// panic as `print!`'s.
fn say(text: std::fmt::Arguments<'_>) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_fmt(text)?;
    out.flush()
}

/// Asks on the terminal; only `y` or `yes` confirms.
fn confirm(question: &str) -> AnyResult<bool> {
    say(format_args!("{question} [y/N] "))?;
    let mut answer = String::new();
    std::io::stdin().lock().read_line(&mut answer)?;
    Ok(matches!(answer.trim().to_lowercase().as_str(), "y" | "yes"))
}
