//! The short version of every row of the fault matrix (`cargo run --release -p
//! redlatch-faults` runs the full one). Rows run one at a time: each starts its own servers and
//! worker processes, and their timing bounds (recovery within a lease and 250 ms) must not
//! suffer from another row's load.

use std::path::PathBuf;

use redlatch_faults::rows::{self, Params, ROWS};

static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn row(id: &str) {
    let _turn = ONE_AT_A_TIME.lock().await;
    let params = Params {
        quick: true,
        exe: PathBuf::from(env!("CARGO_BIN_EXE_faults")),
    };
    let report = rows::run(id, &params).await;
    println!(
        "{}",
        redlatch_faults::report::table(std::slice::from_ref(&report))
    );
    assert!(
        report.passed(),
        "{id}: {:?}\nnotes: {:?}",
        report.problems,
        report.notes
    );
}

macro_rules! rows {
    ($($test:ident => $id:literal,)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $test() {
                row($id).await;
            }
        )*

        #[test]
        fn every_row_has_a_test() {
            let tested = [$($id),*];
            for r in ROWS {
                assert!(tested.contains(&r.id), "row {} has no test", r.id);
            }
            assert_eq!(tested.len(), ROWS.len());
        }
    };
}

rows! {
    baseline_mutex => "baseline/mutex",
    baseline_reenter => "baseline/reenter",
    baseline_fair => "baseline/fair",
    baseline_semaphore => "baseline/semaphore",
    baseline_rwlock => "baseline/rwlock",
    kill_mutex => "kill/mutex",
    kill_reenter => "kill/reenter",
    kill_fair => "kill/fair",
    kill_semaphore => "kill/semaphore",
    kill_election => "kill/election",
    pause_election => "pause/election",
    pause_mutex => "pause/mutex",
    hold_replies_mutex => "hold-replies/mutex",
    hold_replies_fair => "hold-replies/fair",
    jitter_all => "jitter/all",
    blackhole_mutex => "blackhole/mutex",
    blackhole_semaphore => "blackhole/semaphore",
    reset_all => "reset/all",
    server_stop_all => "server-stop/all",
    client_pause_all => "client-pause/all",
    debug_sleep_all => "debug-sleep/all",
    restart_persistent => "restart/persistent",
    wall_clock_all => "wall-clock/all",
    queue_kill_fair => "queue-kill/fair",
    permits_semaphore => "permits/semaphore",
    writer_rwlock => "writer/rwlock",
    control_unfenced_register => "control/unfenced-register",
    control_restart_empty => "control/restart-empty",
    control_mutant_release => "control/mutant-release",
}
