//! The library side of the `redlatch` command-line tool: the contention benchmark, which
//! `redlatch bench` runs for redlatch alone and `cargo bench -p redlatch-cli --bench contention`
//! runs with the Rust peers beside it, and the live view of `redlatch top`.

pub mod bench;
pub mod top;
