//! The election's own scripts, beside the queue scripts that take and hand over its hold:
//! `elect_proclaim` (the leader writes, or on resign removes, its record and publishes it) and
//! `elect_leader` (reads who leads now). The record's message is part of the wake grammar
//! ([`wake::Wake::Leader`](super::wake::Wake::Leader)).

use std::time::Duration;

use redis::Value;

use super::reply::Reply;
use super::scripts::{ELECT_LEADER, ELECT_PROCLAIM};
use super::{ELECTION_LAYOUT, ms};
use crate::backend::{By, Call, Request};
use crate::error::{Error, Result};
use crate::key::LockKeys;

/// The version of what an election shows: its term, then the record's sequence within the
/// term. Versions rise with every proclaim and resign, and with every new leader.
pub(crate) type Version = (u64, u64);

/// The leader writes its record (`value: Some`), or removes its value on resign (`None`).
#[derive(Debug)]
pub(crate) struct Proclaim<'a> {
    pub(crate) keys: &'a LockKeys,
    pub(crate) owner: &'a str,
    pub(crate) term: u64,
    pub(crate) value: Option<&'a str>,
}

impl Request for Proclaim<'_> {
    /// The record's version within the term, or `None` if this owner does not lead with
    /// this term any more.
    type Reply = Option<u64>;

    fn call(&self, by: By) -> Call {
        let mut call = ELECT_PROCLAIM.call(by, 1);
        call.key(&self.keys.lock)
            .arg(ELECTION_LAYOUT)
            .arg(self.owner)
            .arg(self.term)
            .arg(if self.value.is_some() { "p" } else { "r" })
            .arg(&self.keys.wake);
        if let Some(value) = self.value {
            call.arg(value);
        }
        call
    }

    fn decode(&self, raw: Value) -> Result<Option<u64>> {
        let (status, reply) =
            Reply::decode("elect_proclaim", raw, &[&self.keys.lock], ELECTION_LAYOUT)?;
        match status {
            1 => Ok(u64::try_from(reply.int(1)?).ok()),
            0 => Ok(None),
            other => Err(reply.unexpected(other)),
        }
    }
}

/// What `elect_leader` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reading {
    pub(crate) version: Version,
    /// The leader's value and what is left of its lease, if someone leads.
    pub(crate) leader: Option<(String, Duration)>,
}

/// Reads who leads now.
#[derive(Debug)]
pub(crate) struct ReadLeader<'a> {
    pub(crate) keys: &'a LockKeys,
}

impl Request for ReadLeader<'_> {
    type Reply = Reading;

    fn call(&self, by: By) -> Call {
        let mut call = ELECT_LEADER.call(by, 2);
        call.key(&self.keys.lock)
            .key(&self.keys.fence)
            .arg(ELECTION_LAYOUT);
        call
    }

    fn decode(&self, raw: Value) -> Result<Reading> {
        let (status, reply) =
            Reply::decode("elect_leader", raw, &[&self.keys.lock], ELECTION_LAYOUT)?;
        // A sequence of -1: every record of the term (an idle name's last token) is past.
        let seq = reply.int(2)?;
        let version = (
            u64::try_from(reply.int(1)?).unwrap_or_default(),
            if seq < 0 {
                u64::MAX
            } else {
                u64::try_from(seq).unwrap_or_default()
            },
        );
        match status {
            1 => {
                let left = ms(reply.int(3)?).unwrap_or_default();
                let value = reply.text(4).ok_or_else(|| Error::Protocol {
                    script: "elect_leader",
                    detail: "the leader's value is not UTF-8 text".to_owned(),
                })?;
                Ok(Reading {
                    version,
                    leader: Some((value, left)),
                })
            }
            0 => Ok(Reading {
                version,
                leader: None,
            }),
            other => Err(reply.unexpected(other)),
        }
    }
}
