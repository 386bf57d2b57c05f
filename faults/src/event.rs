//! What a worker process writes on its standard output, one line per event, tab-separated, and
//! how the test reads it back. Times are ns of `CLOCK_MONOTONIC`.

use std::fmt;
use std::str::FromStr;

/// One thing a worker did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The worker runs, as this process.
    Ready {
        /// Its process id.
        pid: u32,
    },
    /// A task acquired: it holds from `start`, with a lease known to run until `valid`.
    Acquired {
        /// The task (within the worker).
        task: u32,
        /// The hold's fencing token (0 for a read hold).
        token: u64,
        /// When it asked.
        ask: u64,
        /// When the acquire returned.
        start: u64,
        /// Until when the lease was known to run then.
        valid: u64,
        /// A fixed lease, which nothing renews: it ends at `valid` whatever the holder does.
        fixed: bool,
    },
    /// A task took the worker's hold flag: it stays in its section until the flag is cleared
    /// or set again.
    Holding {
        /// The task.
        task: u32,
        /// The setting of the flag it took (the flag's value).
        generation: u64,
    },
    /// A task calls release now: its section ends here (or at its lease's end, if earlier),
    /// whatever becomes of the process before the release returns.
    Releasing {
        /// The task.
        task: u32,
        /// When (the end of the section, as `Section::end`).
        at: u64,
    },
    /// A task finished a critical section.
    Section(Section),
    /// A task's acquisition failed (`what`: `timeout` or the error).
    Failed {
        /// The task.
        task: u32,
        /// `timeout`, or the error.
        what: String,
        /// When it asked.
        ask: u64,
        /// When it failed.
        at: u64,
    },
    /// The worker's observer of an election saw a change: a leader of `term` (0: nobody
    /// leads).
    Observed {
        /// The leader's term, or 0.
        term: u64,
        /// When.
        at: u64,
    },
    /// Every section is done.
    Done,
}

/// A finished critical section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Section {
    /// The task.
    pub task: u32,
    /// The hold's fencing token (0 for a read hold).
    pub token: u64,
    /// An exclusive hold (mutex, write) or a shared one (read, permit).
    pub exclusive: bool,
    /// When the acquire returned.
    pub start: u64,
    /// The earlier of the release call and the lease deadline the holder knew then.
    pub end: u64,
    /// When `lost()` fired, if it did during the section.
    pub lost_at: Option<u64>,
    /// The fenced write: when, and whether it was accepted (`None`: not made).
    pub write: Option<(u64, bool)>,
    /// What the release (and, for a lost hold, an extension) answered: `ok`, `notheld`, or
    /// another error.
    pub release: String,
    /// What an extension of a lost hold answered (`-`: not tried, the hold was live).
    pub extend: String,
}

fn opt(v: Option<u64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Ready { pid } => write!(f, "ready\t{pid}"),
            Self::Acquired {
                task,
                token,
                ask,
                start,
                valid,
                fixed,
            } => write!(
                f,
                "acq\t{task}\t{token}\t{ask}\t{start}\t{valid}\t{}",
                u8::from(*fixed)
            ),
            Self::Section(s) => write!(
                f,
                "sec\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
                s.task,
                s.token,
                u8::from(s.exclusive),
                s.start,
                s.end,
                opt(s.lost_at),
                opt(s.write.map(|w| w.0)),
                s.write.map_or("-", |w| if w.1 { "1" } else { "0" }),
                s.release,
                s.extend
            ),
            Self::Failed {
                task,
                what,
                ask,
                at,
            } => {
                write!(
                    f,
                    "fail\t{task}\t{}\t{ask}\t{at}",
                    what.replace(['\t', '\n'], " ")
                )
            }
            Self::Holding { task, generation } => write!(f, "holding\t{task}\t{generation}"),
            Self::Releasing { task, at } => write!(f, "releasing\t{task}\t{at}"),
            Self::Observed { term, at } => write!(f, "observed\t{term}\t{at}"),
            Self::Done => write!(f, "done"),
        }
    }
}

impl FromStr for Event {
    type Err = String;

    fn from_str(line: &str) -> Result<Self, String> {
        let f: Vec<&str> = line.split('\t').collect();
        let bad = || format!("unreadable event `{line}`");
        let num = |i: usize| -> Result<u64, String> {
            f.get(i).and_then(|v| v.parse().ok()).ok_or_else(bad)
        };
        let maybe = |i: usize| -> Result<Option<u64>, String> {
            match f.get(i) {
                Some(&"-") => Ok(None),
                Some(v) => v.parse().map(Some).map_err(|_| bad()),
                None => Err(bad()),
            }
        };
        let task = |i: usize| -> Result<u32, String> {
            f.get(i).and_then(|v| v.parse().ok()).ok_or_else(bad)
        };
        match f.first().copied() {
            Some("ready") => Ok(Self::Ready { pid: task(1)? }),
            Some("acq") => Ok(Self::Acquired {
                task: task(1)?,
                token: num(2)?,
                ask: num(3)?,
                start: num(4)?,
                valid: num(5)?,
                fixed: num(6)? == 1,
            }),
            Some("sec") => {
                let write = match (maybe(7)?, f.get(8).copied()) {
                    (Some(at), Some("1")) => Some((at, true)),
                    (Some(at), Some("0")) => Some((at, false)),
                    _ => None,
                };
                Ok(Self::Section(Section {
                    task: task(1)?,
                    token: num(2)?,
                    exclusive: num(3)? == 1,
                    start: num(4)?,
                    end: num(5)?,
                    lost_at: maybe(6)?,
                    write,
                    release: f.get(9).ok_or_else(bad)?.to_string(),
                    extend: f.get(10).ok_or_else(bad)?.to_string(),
                }))
            }
            Some("fail") => Ok(Self::Failed {
                task: task(1)?,
                what: f.get(2).ok_or_else(bad)?.to_string(),
                ask: num(3)?,
                at: num(4)?,
            }),
            Some("holding") => Ok(Self::Holding {
                task: task(1)?,
                generation: num(2)?,
            }),
            Some("releasing") => Ok(Self::Releasing {
                task: task(1)?,
                at: num(2)?,
            }),
            Some("observed") => Ok(Self::Observed {
                term: num(1)?,
                at: num(2)?,
            }),
            Some("done") => Ok(Self::Done),
            _ => Err(bad()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_read_back_as_written() {
        let events = [
            Event::Ready { pid: 42 },
            Event::Holding {
                task: 3,
                generation: 5,
            },
            Event::Releasing { task: 2, at: 99 },
            Event::Acquired {
                task: 1,
                token: 7,
                ask: 10,
                start: 20,
                valid: 30,
                fixed: true,
            },
            Event::Section(Section {
                task: 1,
                token: 7,
                exclusive: true,
                start: 20,
                end: 25,
                lost_at: None,
                write: Some((23, false)),
                release: "ok".into(),
                extend: "-".into(),
            }),
            Event::Failed {
                task: 2,
                what: "timeout".into(),
                ask: 1,
                at: 2,
            },
            Event::Observed { term: 12, at: 13 },
            Event::Done,
        ];
        for e in events {
            assert_eq!(e.to_string().parse::<Event>().unwrap(), e);
        }
    }
}
