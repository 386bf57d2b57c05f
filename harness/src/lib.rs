//! What redlatch's tests, benchmarks, examples and command-line tool share, without depending on
//! redlatch itself:
//!
//! * [`server`]: a `redis-server` process on a free loopback port, killed on drop, that a test
//!   can kill, pause and restart;
//! * [`TestServer`]: a server for one test (or the one `REDIS_URL` names) with a key prefix no
//!   other test uses, and helpers to look at what is left in Redis;
//! * [`cluster`]: a Redis Cluster of such processes (masters and replicas), whose slots a test
//!   can move and whose masters it can fail over;
//! * [`measure`]: the loops the contention figures are made of (task loops, contended runs,
//!   hand-offs, the raw-script reference, request counts and CPU accounting);
//! * [`replication`]: a master and a replica whose replication stream a proxy can cut;
//! * [`sentinel`]: sentinels monitoring a master a test started, and waits for their failover;
//! * [`proxy`]: a TCP proxy that delays, holds, blackholes, resets or refuses traffic, for
//!   fault injection;
//! * [`resource`]: what critical sections write to in a fault test (a register updated without
//!   atomicity, a fenced store), and [`check`]: the checkers over what the holders did.

pub mod check;
pub mod cluster;
pub mod measure;
pub mod proxy;
pub mod replication;
pub mod resource;
pub mod sentinel;
pub mod server;
mod test_server;

pub use cluster::RedisCluster;
pub use server::RedisServer;
pub use test_server::{
    Listener, TestServer, crashing, racy_increment, unique, until, until_within, within,
};
