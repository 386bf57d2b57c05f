//! redlatch's fault-injection suite: worker processes that loop over critical sections and log
//! them, a bed that starts servers, proxies and workers and injects faults, the matrix of rows,
//! and the checkers' verdicts.
//!
//! `cargo test -p redlatch-faults` runs a short version of every row; `cargo run --release -p
//! redlatch-faults -- --json` runs the full matrix (16 workers × 500 sections per row).
//!
//! Each row starts its own lock server and a resource server that is never faulted. The workers
//! are processes (`faults worker ...`), so a fault can hit one of them: SIGKILL, SIGSTOP, or a
//! proxy of its own in front of the lock server. Every critical section reads a register on the
//! resource server, holds, makes a fenced write (accepted only with a token above the highest
//! seen), writes the register back plus one, and releases; the workers log each section with
//! `CLOCK_MONOTONIC` times. The checkers then look at the whole history (see
//! `redlatch_harness::check`).

pub mod bed;
pub mod clock;
pub mod event;
pub mod report;
pub mod rows;
pub mod spec;
pub mod worker;
