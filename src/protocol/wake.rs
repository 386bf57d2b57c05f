//! The messages releases publish on a name's channel (`<prefix>:{<name>}:wake`):
//!
//! * a number `n`: `n` waiters may go (the plain mutex: `1`; each client wakes its oldest
//!   local waiter), optionally followed by `@` and a release id (a Redlock release, which every
//!   node publishes alike: the client hears it once);
//! * space-separated waiter ids (`client/owner`), each optionally with
//!   `:<fence>:<ms>:<ticket>`: those waiters of the queued primitives, and only those, are
//!   woken. With the suffix, the release handed that waiter's place in the queue (the one with
//!   that ticket) the hold, with that fencing token, for a first term of that many ms; a bare id
//!   asks the waiter to look again.
//! * `=<term>:<seq>`, then a newline and a value: an election's leader record (version `seq` of
//!   term `term`; without the value, the leader of that term resigned). It wakes nobody; the
//!   election's observers read it.
//!
//! A message that is none of these wakes one waiter, so nothing is lost by a message we cannot
//! read.

use std::time::Duration;

/// One message, read.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Wake<'a> {
    /// This many local waiters may go.
    Count(usize),
    /// These waiters are named.
    Named(Vec<Named<'a>>),
    /// An election's leader record: `value` is `None` for a resign.
    Leader {
        term: u64,
        seq: u64,
        value: Option<&'a str>,
    },
}

/// A waiter named in a message.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Named<'a> {
    /// `client/owner`.
    pub(crate) id: &'a str,
    /// The hold a release handed it, if it did.
    pub(crate) grant: Option<Grant>,
}

/// A hold handed to a waiter: its fencing token, the first term of its lease, and the ticket of
/// the place in the queue it was handed to (`None` if the message did not say).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Grant {
    pub(crate) fence: u64,
    pub(crate) term: Duration,
    pub(crate) ticket: Option<u64>,
}

/// Reads a message's payload.
pub(crate) fn parse(payload: &[u8]) -> Wake<'_> {
    let Ok(text) = std::str::from_utf8(payload) else {
        return Wake::Count(1);
    };
    if let Ok(n) = text.parse() {
        return Wake::Count(n);
    }
    if let Some(record) = text.strip_prefix('=') {
        let (head, value) = match record.split_once('\n') {
            Some((head, value)) => (head, Some(value)),
            None => (record, None),
        };
        if let Some((term, seq)) = head
            .split_once(':')
            .and_then(|(t, s)| t.parse().ok().zip(s.parse().ok()))
        {
            return Wake::Leader { term, seq, value };
        }
        return Wake::Count(1);
    }
    // `n@<release id>`: a Redlock release, published alike by every node.
    if let Some(n) = text.split_once('@').and_then(|(n, _)| n.parse().ok()) {
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
                        let ticket = fields.next().and_then(|t| t.parse().ok());
                        fence
                            .parse()
                            .ok()
                            .zip(ms.parse().ok())
                            .map(|(fence, ms)| Grant {
                                fence,
                                term: Duration::from_millis(ms),
                                ticket,
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
        assert_eq!(parse(b"1@3f2a9c"), Wake::Count(1));
        assert_eq!(parse(b"\xff"), Wake::Count(1));
        assert_eq!(parse(b""), Wake::Count(1));
        assert_eq!(
            parse(b"=1700000000000000:2\nnode a: 10.0.0.1\n"),
            Wake::Leader {
                term: 1_700_000_000_000_000,
                seq: 2,
                value: Some("node a: 10.0.0.1\n")
            }
        );
        assert_eq!(
            parse(b"=17:3"),
            Wake::Leader {
                term: 17,
                seq: 3,
                value: None
            }
        );
        assert_eq!(parse(b"=x"), Wake::Count(1));
        assert_eq!(
            parse(b"c1/o1:42:30000:7 c2/o2 c3/o3:43:500"),
            Wake::Named(vec![
                Named {
                    id: "c1/o1",
                    grant: Some(Grant {
                        fence: 42,
                        term: Duration::from_millis(30_000),
                        ticket: Some(7),
                    })
                },
                Named {
                    id: "c2/o2",
                    grant: None
                },
                Named {
                    id: "c3/o3",
                    grant: Some(Grant {
                        fence: 43,
                        term: Duration::from_millis(500),
                        ticket: None,
                    })
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
