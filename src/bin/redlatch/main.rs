//! `redlatch`: the command-line tool (feature `cli`).
//!
//! ```text
//! redlatch bench [--quick]                       # the contention benchmark, own redis-server
//! redlatch --url redis://host:6379 inspect NAME  # holders, holds, lease left, queue, permits
//! redlatch --url redis://host:6379 force-unlock NAME [--yes]
//! ```

#[path = "../../../tests/support/server.rs"]
mod server;

mod bench;

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use redlatch::LockClient;

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
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the contention benchmark: a table on stdout, `contention.json` and `contention.svg`.
    Bench {
        /// The quick mode (under 2 minutes), for smoke runs.
        #[arg(long)]
        quick: bool,
        /// Where to write the JSON and the chart.
        #[arg(long, default_value = "target/bench")]
        out: PathBuf,
        /// In the hand-off scenario the holder holds 1 ms to this many ms (at random).
        #[arg(long, default_value_t = 5)]
        handoff_hold_ms: u64,
    },
    /// Print what is going on under a name: holders, holds, lease left, queue, permits, last
    /// fencing token.
    Inspect {
        /// The lock's name.
        name: String,
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

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(code) => code,
        Err(err) => {
            eprintln!("redlatch: {err}");
            let mut source = err.source();
            while let Some(cause) = source {
                eprintln!("  caused by: {cause}");
                source = cause.source();
            }
            ExitCode::FAILURE
        }
    }
}

fn client(url: Option<&str>, prefix: &str) -> AnyResult<LockClient> {
    let url = url.ok_or("no server: give --url or set REDIS_URL")?;
    bench::redlatch_client(url, prefix)
}

async fn run(cli: Cli) -> AnyResult<ExitCode> {
    match cli.command {
        Command::Bench {
            quick,
            out,
            handoff_hold_ms,
        } => {
            let (_server, url) = server::named_or_own(cli.url.clone());
            let prefix = format!("{}-bench-{}", cli.prefix, std::process::id());
            let plan = bench::Plan::new(quick, handoff_hold_ms);
            let entries = bench::redlatch_entries(&url, &prefix);
            let bench = bench::Bench {
                url,
                prefix,
                plan,
                entries,
                contended: vec!["redlatch-mutex", "redlatch-fair"],
                out_dir: out,
            };
            bench.run().await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Inspect { name } => {
            let client = client(cli.url.as_deref(), &cli.prefix)?;
            print!("{}", client.inspect(&name).await?);
            Ok(ExitCode::SUCCESS)
        }
        Command::ForceUnlock { name, yes } => {
            let client = client(cli.url.as_deref(), &cli.prefix)?;
            let snapshot = client.inspect(&name).await?;
            if snapshot.kind.is_none() {
                println!("{name}: nothing stored, nothing to unlock");
                return Ok(ExitCode::SUCCESS);
            }
            print!("{snapshot}");
            if !yes && !confirm(&format!("end every hold and queue place of `{name}`?"))? {
                println!("left as it is");
                return Ok(ExitCode::FAILURE);
            }
            let removed = client.force_unlock(&name).await?;
            println!(
                "{name}: removed {} holders and {} waiters; holders see their guards lost at their next renewal",
                removed.holders, removed.waiters
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Asks on the terminal; only `y` or `yes` confirms.
fn confirm(question: &str) -> AnyResult<bool> {
    print!("{question} [y/N] ");
    std::io::stdout().flush()?;
    let mut answer = String::new();
    std::io::stdin().lock().read_line(&mut answer)?;
    Ok(matches!(answer.trim().to_lowercase().as_str(), "y" | "yes"))
}
