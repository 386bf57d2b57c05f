//! What a row of the matrix found, and how it is printed and written.

use serde_json::{Value, json};

/// The findings of one row.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// The row's id (`kill/mutex`...).
    pub id: String,
    /// The fault injected.
    pub fault: String,
    /// The primitives it ran.
    pub primitives: String,
    /// A negative control: it must make a checker fail.
    pub control: bool,
    /// Critical sections finished (and held sections cut by a kill).
    pub sections: usize,
    /// Acquisitions that failed (timeouts and errors).
    pub failed: usize,
    /// C1: sections that started while the lock could not admit them; the most held at once.
    pub overlaps: usize,
    /// C1: the most sections held at once.
    pub max_concurrent: usize,
    /// C3: stale writes (that reached the fenced store after a newer holder's write) the store
    /// accepted.
    pub stale_accepted: usize,
    /// C3: stale writes refused.
    pub stale_rejected: usize,
    /// C3: writes made after the writer's lease had ended, before any newer holder wrote
    /// (accepted, and ordered before every newer write: not stale).
    pub late_unchallenged: usize,
    /// C3: tokens out of order.
    pub tokens_out_of_order: usize,
    /// C2: the register equals its count of updates (`None`: no register, as for shared holds).
    pub register_exact: Option<bool>,
    /// C4: keys of the library left after the workers and one lease.
    pub keys_left: usize,
    /// The longest time from a fault to the next acquisition by another worker.
    pub longest_recovery_ms: Option<f64>,
    /// The 99th percentile of the time an acquisition took (granted or not), and the timeout
    /// the callers gave.
    pub acquire_p99_ms: Option<f64>,
    /// The longest an acquisition took.
    pub acquire_max_ms: Option<f64>,
    /// The acquisition timeout the workers gave.
    pub timeout_ms: f64,
    /// What else the row saw.
    pub notes: Vec<String>,
    /// Expectations not met.
    pub problems: Vec<String>,
    /// How long the row took.
    pub seconds: f64,
}

impl Report {
    /// Every expectation met (for a control: the checker it targets failed).
    pub fn passed(&self) -> bool {
        self.problems.is_empty()
    }

    /// Notes an expectation not met.
    pub fn problem(&mut self, text: impl Into<String>) {
        self.problems.push(text.into());
    }

    /// The report as JSON.
    pub fn json(&self) -> Value {
        json!({
            "id": self.id,
            "fault": self.fault,
            "primitives": self.primitives,
            "control": self.control,
            "passed": self.passed(),
            "sections": self.sections,
            "failed_acquisitions": self.failed,
            "overlaps": self.overlaps,
            "max_concurrent": self.max_concurrent,
            "stale_writes_accepted": self.stale_accepted,
            "stale_writes_rejected": self.stale_rejected,
            "late_writes_unchallenged": self.late_unchallenged,
            "tokens_out_of_order": self.tokens_out_of_order,
            "register_exact": self.register_exact,
            "keys_left": self.keys_left,
            "longest_recovery_ms": self.longest_recovery_ms,
            "acquire_p99_ms": self.acquire_p99_ms,
            "acquire_max_ms": self.acquire_max_ms,
            "timeout_ms": self.timeout_ms,
            "notes": self.notes,
            "problems": self.problems,
            "seconds": self.seconds,
        })
    }
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.digits$}"))
}

/// The table of a run.
pub fn table(reports: &[Report]) -> String {
    let mut out = format!(
        "{:<26} {:>8} {:>6} {:>5} {:>9} {:>8} {:>6} {:>5} {:>10} {:>8}  {}\n",
        "row",
        "sections",
        "failed",
        "overl",
        "stale acc",
        "stale rej",
        "reg",
        "left",
        "recover ms",
        "p99 ms",
        "result"
    );
    for r in reports {
        let reg = match r.register_exact {
            Some(true) => "exact",
            Some(false) => "LOST",
            None => "-",
        };
        let result = match (r.passed(), r.control) {
            (true, false) => "pass".to_owned(),
            (true, true) => "control failed as it must".to_owned(),
            (false, _) => format!("FAIL: {}", r.problems.join("; ")),
        };
        out.push_str(&format!(
            "{:<26} {:>8} {:>6} {:>5} {:>9} {:>8} {:>6} {:>5} {:>10} {:>8}  {}\n",
            r.id,
            r.sections,
            r.failed,
            r.overlaps,
            r.stale_accepted,
            r.stale_rejected,
            reg,
            r.keys_left,
            opt(r.longest_recovery_ms, 0),
            opt(r.acquire_p99_ms, 1),
            result
        ));
    }
    out
}
