//! The library side of the `redlatch` command-line tool: the contention benchmark, which
//! `redlatch bench` runs for redlatch alone and `cargo bench -p redlatch-cli --bench contention`
//! runs with the Rust peers beside it.

pub mod bench;
