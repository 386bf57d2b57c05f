//! What one worker process does: its command line, shared by the worker binary (which parses
//! it) and the test bed (which writes it).

use clap::{Parser, ValueEnum};

/// The primitive a worker's tasks take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Kind {
    /// `Mutex`.
    Mutex,
    /// `Mutex`, re-entered once inside each section.
    Reenter,
    /// `FairMutex`.
    Fair,
    /// `Semaphore` of `--permits`.
    Semaphore,
    /// `RwLock`: the first `--writers` tasks write, the others read.
    Rwlock,
    /// `Election`: each section is a leadership (campaign with the worker's id, resign); the
    /// worker also observes the election and logs every change it sees.
    Election,
}

impl Kind {
    /// The name on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Mutex => "mutex",
            Self::Reenter => "reenter",
            Self::Fair => "fair",
            Self::Semaphore => "semaphore",
            Self::Rwlock => "rwlock",
            Self::Election => "election",
        }
    }
}

/// A worker process: `--tasks` tasks, each looping `--sections` times (or more, while the row
/// is faulting) over a critical section on one name (acquire; read the register; hold; fenced
/// write; write the register back; release), logging each on standard output.
#[derive(Debug, Clone, PartialEq, Eq, Parser)]
#[command(
    name = "fault-worker",
    about = "A worker process of redlatch's fault suite"
)]
pub struct Spec {
    /// Its id in the logs.
    #[arg(long)]
    pub id: String,
    /// The lock server (or a proxy in front of it).
    #[arg(long)]
    pub url: String,
    /// The resource server.
    #[arg(long)]
    pub resource: String,
    /// The key prefix of the locks and the resource.
    #[arg(long)]
    pub prefix: String,
    /// The lock's name.
    #[arg(long)]
    pub name: String,
    /// The primitive.
    #[arg(long, value_enum)]
    pub kind: Kind,
    /// Permits of the semaphore.
    #[arg(long, default_value_t = 1)]
    pub permits: u32,
    /// Read-write lock: how many of the tasks write.
    #[arg(long, default_value_t = 1)]
    pub writers: usize,
    /// Tasks of the worker.
    #[arg(long, default_value_t = 4)]
    pub tasks: usize,
    /// Sections per task (at least: more while the row is still faulting).
    #[arg(long)]
    pub sections: usize,
    /// The lease.
    #[arg(long)]
    pub lease_ms: u64,
    /// The queued primitives' waiter timeout (default: the lease).
    #[arg(long)]
    pub waiter_timeout_ms: Option<u64>,
    /// Each section holds at least this many µs...
    #[arg(long, default_value_t = 200)]
    pub hold_min_us: u64,
    /// ...and at most this many (drawn at random in between).
    #[arg(long, default_value_t = 1000)]
    pub hold_max_us: u64,
    /// The acquisition timeout.
    #[arg(long)]
    pub timeout_ms: u64,
    /// Keep holding while the test sets this worker's hold flag on the resource server.
    #[arg(long)]
    pub obey_hold_flag: bool,
    /// Release with a test-only script that skips the owner check (a negative control).
    #[arg(long)]
    pub mutant_release: bool,
    /// Semaphore: every n-th section takes a fixed-lease permit and holds it past its lease
    /// before releasing (a late release, which must be refused). 0: never.
    #[arg(long, default_value_t = 0)]
    pub late_every: usize,
    /// Semaphore: release every permit a second time by hand (which must be refused).
    #[arg(long)]
    pub double_release: bool,
}

impl Spec {
    /// The command line that [`Spec::parse`] reads back.
    pub fn args(&self) -> Vec<String> {
        let mut a: Vec<String> = [
            ("--id", self.id.clone()),
            ("--url", self.url.clone()),
            ("--resource", self.resource.clone()),
            ("--prefix", self.prefix.clone()),
            ("--name", self.name.clone()),
            ("--kind", self.kind.as_str().to_owned()),
            ("--permits", self.permits.to_string()),
            ("--writers", self.writers.to_string()),
            ("--tasks", self.tasks.to_string()),
            ("--sections", self.sections.to_string()),
            ("--lease-ms", self.lease_ms.to_string()),
            ("--hold-min-us", self.hold_min_us.to_string()),
            ("--hold-max-us", self.hold_max_us.to_string()),
            ("--timeout-ms", self.timeout_ms.to_string()),
            ("--late-every", self.late_every.to_string()),
        ]
        .into_iter()
        .flat_map(|(k, v)| [k.to_owned(), v])
        .collect();
        if let Some(ms) = self.waiter_timeout_ms {
            a.extend(["--waiter-timeout-ms".to_owned(), ms.to_string()]);
        }
        for (on, flag) in [
            (self.obey_hold_flag, "--obey-hold-flag"),
            (self.mutant_release, "--mutant-release"),
            (self.double_release, "--double-release"),
        ] {
            if on {
                a.push(flag.to_owned());
            }
        }
        a
    }

    /// The key of this worker's hold flag on the resource server.
    pub fn hold_flag(&self) -> String {
        hold_flag(&self.prefix, &self.id)
    }
}

/// The key of the row's faulting flag under `prefix`: while it is set, workers past their
/// sections keep going (up to [`MORE_SECTIONS`] times as many).
pub fn faulting_flag(prefix: &str) -> String {
    format!("{prefix}:faulting")
}

/// The bound on the sections a task runs while a row is still faulting, as a multiple of its
/// sections.
pub const MORE_SECTIONS: usize = 100;

/// The key of worker `id`'s hold flag under `prefix`.
pub fn hold_flag(prefix: &str, id: &str) -> String {
    format!("{prefix}:hold-flag:{id}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_reads_back() {
        let spec = Spec {
            id: "w1".into(),
            url: "redis://127.0.0.1:1".into(),
            resource: "redis://127.0.0.1:2".into(),
            prefix: "p".into(),
            name: "n".into(),
            kind: Kind::Semaphore,
            permits: 3,
            writers: 2,
            tasks: 4,
            sections: 10,
            lease_ms: 2000,
            waiter_timeout_ms: Some(500),
            hold_min_us: 10,
            hold_max_us: 20,
            timeout_ms: 5000,
            obey_hold_flag: true,
            mutant_release: false,
            late_every: 7,
            double_release: true,
        };
        let mut line = vec!["fault-worker".to_owned()];
        line.extend(spec.args());
        assert_eq!(Spec::parse_from(line), spec);
    }
}
