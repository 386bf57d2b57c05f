//! The queued primitives' scripts (fair mutex, semaphore, read-write lock): `queue_acquire`,
//! `queue_release` and `queue_extend`, each prefixed with `keys_lib` and `queue_lib`; and the
//! names a waiter goes by (see `lua/README.md`).

use redis::Value;

use super::reply::{Reply, statuses};
use super::scripts::{QUEUE_ACQUIRE, QUEUE_EXTEND, QUEUE_RELEASE};
use super::{Answer, Claim, Family, Op, ms};
use crate::backend::{By, Call, Request};
use crate::config::{FENCE_TTL, millis};
use crate::error::{Error, Result};
use crate::key::LockKeys;

/// How a release names a waiter it lets through (in its message): `client/owner`.
pub(crate) fn waiter_id(client: &str, owner: &str) -> String {
    format!("{client}/{owner}")
}

/// The channel on which the scripts name `client`'s waiters of the name whose channel is
/// `wake`: `<wake>:<client>` (`calls_lib.lua`'s `tell`), so that a hand-over wakes the
/// process of the waiter it names and no other.
pub(crate) fn client_channel(wake: &str, client: &str) -> String {
    let mut channel = String::with_capacity(wake.len() + 1 + client.len());
    channel.push_str(wake);
    channel.push(':');
    channel.push_str(client);
    channel
}

/// The thin form's string of a single hold (`queue_lib.lua`): `<layout> <op> <units> <cap>
/// <token> <owner>`, written under the meta key by the one-round-trip acquire of an idle name
/// (`super::take`). `token` is 0 for a read hold.
pub(crate) fn thin(
    family: Family,
    op: Op,
    units: u32,
    cap: u32,
    token: u64,
    owner: &str,
) -> String {
    let layout = family.layout();
    let mut digits = itoa::Buffer::new();
    let mut value = String::with_capacity(layout.len() + owner.len() + 48);
    value.push_str(layout);
    value.push(' ');
    value.push_str(op.code());
    for n in [u64::from(units), u64::from(cap), token] {
        value.push(' ');
        value.push_str(digits.format(n));
    }
    value.push(' ');
    value.push_str(owner);
    value
}

/// A waiter's member in the queue: `client/owner/<op><units>/<lease ms>/<grace ms>`, which is
/// everything a release needs to hand it the lock.
pub(crate) fn member(
    client: &str,
    owner: &str,
    op: Op,
    units: u32,
    lease_ms: u64,
    grace_ms: u64,
) -> String {
    format!(
        "{client}/{owner}/{}{units}/{lease_ms}/{grace_ms}",
        op.code()
    )
}

/// One acquisition attempt: `units` of `op` for `owner`. With a `grace`, a busy attempt queues
/// the owner (or keeps its place); without, it only tries.
#[derive(Debug)]
pub(crate) struct Acquire<'a> {
    pub(crate) name: &'a str,
    pub(crate) keys: &'a LockKeys,
    pub(crate) family: Family,
    pub(crate) op: Op,
    pub(crate) owner: &'a str,
    pub(crate) units: u32,
    /// The semaphore's capacity (0 for the locks).
    pub(crate) capacity: u32,
    pub(crate) lease_ms: u64,
    /// The first term of a hold handed to this waiter; 0: do not queue.
    pub(crate) grace_ms: u64,
    pub(crate) fence_ttl_ms: u64,
    pub(crate) claim: Claim,
    /// The client id, which the waiter's queue member starts with.
    pub(crate) client: &'a str,
    /// The call's request id where it runs once per request (`None`: a new one).
    pub(crate) request: Option<u128>,
}

impl Request for Acquire<'_> {
    type Reply = Answer;

    fn call(&self, by: By) -> Call {
        let mut call = QUEUE_ACQUIRE.call(by, 4);
        for key in self.keys.queued() {
            call.key(key);
        }
        call.arg(self.family.layout())
            .arg(self.op.code())
            .arg(self.owner)
            .arg(self.units)
            .arg(self.capacity)
            .arg(self.lease_ms)
            .arg(self.grace_ms)
            .arg(self.fence_ttl_ms)
            .arg(&self.keys.wake)
            .arg(self.claim.code())
            .arg(self.client);
        if self.claim.repeats_safely() {
            call.repeatable();
        }
        call.request_id(self.request);
        call
    }

    fn decode(&self, raw: Value) -> Result<Answer> {
        let keys = self.keys.queued();
        let (status, reply) = Reply::decode("queue_acquire", raw, &keys, self.family.layout())?;
        match status {
            1 => {
                let fence = u64::try_from(reply.int(1)?).unwrap_or_default();
                Ok(Answer::Granted {
                    fence,
                    clock: reply.int(3).ok().and_then(|now| u64::try_from(now).ok()),
                    last: fence,
                })
            }
            0 => Ok(Answer::Busy {
                wait: ms(reply.int(1)?),
                ticket: u64::try_from(reply.int(2)?).ok().filter(|t| *t > 0),
                last: None,
            }),
            -3 => Err(Error::CapacityMismatch {
                name: self.name.to_owned(),
                ours: self.capacity,
                theirs: u32::try_from(reply.int(1)?).unwrap_or_default(),
            }),
            -4 => Err(Error::Upgrade {
                name: self.name.to_owned(),
            }),
            other => Err(reply.unexpected(other)),
        }
    }
}

/// Releases one hold of `owner` of `op`, or leaves the queue (`op` [`Op::Waiting`], `owner`
/// the queue member). `Ok(true)` when the name is still held or waited for, `Ok(false)` when
/// it went idle, [`Error::NotHeld`] when there was nothing to release.
#[derive(Debug)]
pub(crate) struct Release<'a> {
    pub(crate) name: &'a str,
    pub(crate) keys: &'a LockKeys,
    pub(crate) family: Family,
    pub(crate) op: Op,
    pub(crate) owner: &'a str,
    pub(crate) fence_ttl_ms: u64,
    /// The thin form's string as the grant wrote it ([`thin`]): when the meta key holds exactly
    /// that, the release is a compare-and-delete before any library loads.
    pub(crate) expected: Option<&'a str>,
}

impl Request for Release<'_> {
    type Reply = bool;

    fn call(&self, by: By) -> Call {
        // The short form: the meta key and the string alone, the rest derived from them (the
        // other keys and the channel by their suffixes, the fence key's lifetime the default).
        if let Some(expected) = self.expected
            && self.fence_ttl_ms == millis(FENCE_TTL)
        {
            let mut call = QUEUE_RELEASE.call(by, 1);
            call.key(&self.keys.lock).arg(expected);
            return call;
        }
        let mut call = QUEUE_RELEASE.call(by, 4);
        for key in self.keys.queued() {
            call.key(key);
        }
        call.arg(self.family.layout())
            .arg(self.op.code())
            .arg(self.owner)
            .arg(&self.keys.wake)
            .arg(self.fence_ttl_ms);
        if let Some(expected) = self.expected {
            call.arg(expected);
        }
        call
    }

    fn decode(&self, raw: Value) -> Result<bool> {
        // The short form's compare-and-delete: the name went idle.
        if raw == Value::Int(2) {
            return Ok(false);
        }
        let keys = self.keys.queued();
        let (status, reply) = Reply::decode("queue_release", raw, &keys, self.family.layout())?;
        match status {
            1 | 3 => Ok(true),
            2 => Ok(reply.int(1).ok() != Some(1)),
            0 => Err(Error::NotHeld {
                name: self.name.to_owned(),
            }),
            other => Err(reply.unexpected(other)),
        }
    }
}

/// One hold to renew: the exclusive hold of its name, or an owner's shared holds (read holds,
/// a permit), to at least `ms` from now.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Renewal<'a> {
    pub(crate) keys: &'a LockKeys,
    pub(crate) family: Family,
    pub(crate) exclusive: bool,
    pub(crate) owner: &'a str,
    pub(crate) ms: u64,
}

/// Renews holds of many names in one call: one status per item, `1` renewed, `0` not held
/// any more, `-1` foreign data, `-2` foreign layout. Waiters' places are never renewed: they
/// have no deadline.
#[derive(Debug)]
pub(crate) struct Extend<'a> {
    pub(crate) items: &'a [Renewal<'a>],
}

impl Request for Extend<'_> {
    type Reply = Vec<i64>;

    fn call(&self, by: By) -> Call {
        let mut call = QUEUE_EXTEND.call(by, 3 * self.items.len());
        for item in self.items {
            for key in &item.keys.queued()[..3] {
                call.key(*key);
            }
        }
        for item in self.items {
            call.arg(item.family.layout())
                .arg(if item.exclusive { "w" } else { "h" })
                .arg(item.owner)
                .arg(item.ms);
        }
        call
    }

    fn decode(&self, raw: Value) -> Result<Vec<i64>> {
        statuses("queue_extend", raw, self.items.len())
    }
}
