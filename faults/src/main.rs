//! `faults`: runs redlatch's fault matrix and prints a table (and JSON with `--json`), or, as
//! `faults worker <spec>`, one worker process of a row.
//!
//! ```text
//! cargo run --release -p redlatch-faults -- --json        # the full matrix, under 20 minutes
//! cargo run --release -p redlatch-faults -- --quick       # the short rows cargo test runs
//! cargo run --release -p redlatch-faults -- --only kill/  # the rows whose id starts so
//! ```

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use redlatch_faults::report::{Report, table};
use redlatch_faults::rows::{self, Params, ROWS};
use redlatch_faults::spec::Spec;

#[derive(Parser, Debug)]
#[command(name = "faults", about = "redlatch's fault-injection matrix")]
struct Args {
    /// The short rows (what `cargo test` runs) instead of the full ones.
    #[arg(long)]
    quick: bool,
    /// Only the rows whose id starts with this.
    #[arg(long)]
    only: Option<String>,
    /// Write the report as JSON to this file (default `target/faults/faults.json`) and print it
    /// as the last line.
    #[arg(long)]
    json: bool,
    #[arg(long, default_value = "target/faults")]
    out: PathBuf,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let mut argv = std::env::args();
    let program = argv.next().unwrap_or_default();
    let rest: Vec<String> = argv.collect();
    if rest.first().map(String::as_str) == Some("worker") {
        let mut line = vec![program];
        line.extend(rest.into_iter().skip(1));
        return match Spec::try_parse_from(line) {
            Ok(spec) => redlatch_faults::worker::run(spec).await,
            Err(err) => err.exit(),
        };
    }
    let args = Args::parse();
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(err) => {
            eprintln!("faults: cannot find my own binary: {err}");
            return ExitCode::FAILURE;
        }
    };
    let params = Params {
        quick: args.quick,
        exe,
    };
    let chosen: Vec<_> = ROWS
        .iter()
        .filter(|r| {
            args.only
                .as_ref()
                .is_none_or(|o| r.id.starts_with(o.as_str()))
        })
        .collect();
    if chosen.is_empty() {
        let ids: Vec<&str> = ROWS.iter().map(|r| r.id).collect();
        eprintln!("no row's id starts with that; the rows: {}", ids.join(", "));
        return ExitCode::FAILURE;
    }
    let bar = ProgressBar::new(chosen.len() as u64);
    if let Ok(style) =
        ProgressStyle::with_template("{spinner} [{bar:30}] {pos}/{len} {msg} {elapsed}")
    {
        bar.set_style(style);
    }
    bar.enable_steady_tick(Duration::from_millis(200));
    let mut reports: Vec<Report> = Vec::new();
    for row in chosen {
        bar.set_message(row.id);
        let report = rows::run(row.id, &params).await;
        if bar.is_hidden() {
            // No terminal (a log, CI): a line per row instead of the bar.
            eprintln!(
                "{} {} in {:.0} s",
                report.id,
                if report.passed() { "done" } else { "FAILED" },
                report.seconds
            );
        }
        reports.push(report);
        bar.inc(1);
    }
    bar.finish_and_clear();
    print!("{}", table(&reports));
    let failed = reports.iter().filter(|r| !r.passed()).count();
    let controls: Vec<_> = reports.iter().filter(|r| r.control).collect();
    println!(
        "{} rows, {failed} failed; negative controls: {} of {} made their checker fail",
        reports.len(),
        controls.iter().filter(|r| r.passed()).count(),
        controls.len()
    );
    if args.json {
        let json = serde_json::json!({
            "mode": if args.quick { "quick" } else { "full" },
            "rows": reports.iter().map(Report::json).collect::<Vec<_>>(),
            "failed": failed,
            "controls": controls
                .iter()
                .map(|r| serde_json::json!({"id": r.id, "failed_as_it_must": r.passed()}))
                .collect::<Vec<_>>(),
        });
        let text = json.to_string();
        if let Err(err) = std::fs::create_dir_all(&args.out)
            .and_then(|()| std::fs::write(args.out.join("faults.json"), &text))
        {
            eprintln!("faults: cannot write the JSON: {err}");
        }
        println!("{text}");
    }
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
