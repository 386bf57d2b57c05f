//! The messages releases publish on a name's channel (`<prefix>:{<name>}:wake`):
//!
//! * a number `n`: `n` waiters may go (the plain mutex: `1`; each client wakes its oldest
//!   local waiter);
//! * space-separated waiter ids (`client/owner`), each optionally with `:<fence>:<ms>`: those
//!   waiters of the queued primitives, and only those, are woken. With the suffix, the release
//!   handed that waiter the hold, with that fencing token, for a first term of that many ms; a
//!   bare id asks the waiter to look again.
//!
//! A message that is neither wakes one waiter, so nothing is lost by a message we cannot read.

use std::time::Duration;

/// One message, read.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Wake<'a> {
    /// This many local waiters may go.
    Count(usize),
    /// These waiters are named.
    Named(Vec<Named<'a>>),
}

/// A waiter named in a message.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Named<'a> {
    /// `client/owner`.
    pub(crate) id: &'a str,
    /// The hold a release handed it, if it did.
    pub(crate) grant: Option<Grant>,
}

/// A hold handed to a waiter: its fencing token and the first term of its lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Grant {
    pub(crate) fence: u64,
    pub(crate) term: Duration,
}

/// Reads a message's payload.
pub(crate) fn parse(payload: &[u8]) -> Wake<'_> {
    let Ok(text) = std::str::from_utf8(payload) else {
        return Wake::Count(1);
    };
    if let Ok(n) = text.parse() {
        return Wake::Count(n);
    }
    if text.is_empty() {
        return Wake::Count(1);
    }
    Wake::Named(
        text.split(' ')
            .map(|part| {
                let mut fields = part.split(':');
                let id = fields.next().unwrap_or_default();
                let grant = match (fields.next(), fields.next()) {
                    (Some(fence), Some(ms)) => {
                        fence
                            .parse()
                            .ok()
                            .zip(ms.parse().ok())
                            .map(|(fence, ms)| Grant {
                                fence,
                                term: Duration::from_millis(ms),
                            })
                    }
                    _ => None,
                };
                Named { id, grant }
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_read_as_the_scripts_write_them() {
        assert_eq!(parse(b"1"), Wake::Count(1));
        assert_eq!(parse(b"\xff"), Wake::Count(1));
        assert_eq!(parse(b""), Wake::Count(1));
        assert_eq!(
            parse(b"c1/o1:42:30000 c2/o2"),
            Wake::Named(vec![
                Named {
                    id: "c1/o1",
                    grant: Some(Grant {
                        fence: 42,
                        term: Duration::from_millis(30_000)
                    })
                },
                Named {
                    id: "c2/o2",
                    grant: None
                },
            ])
        );
        // A suffix we cannot read still wakes the waiter, without a grant.
        assert_eq!(
            parse(b"c/o:x:1"),
            Wake::Named(vec![Named {
                id: "c/o",
                grant: None
            }])
        );
    }
}
