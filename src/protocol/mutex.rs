//! The plain mutex's scripts: `mutex_acquire`, `mutex_release`, `mutex_extend`,
//! `mutex_confirm` (the second round of a Redlock acquisition's fencing) and `mutex_revoke`
//! (what undoes a Redlock carried owner's failed acquisition; see `lua/README.md` for their
//! contracts); and [`value`], the string of a held mutex, which the one-round-trip
//! acquire (`super::take`) writes.

use redis::Value;

use super::reply::{Reply, statuses};
use super::scripts::{MUTEX_ACQUIRE, MUTEX_CONFIRM, MUTEX_EXTEND, MUTEX_RELEASE, MUTEX_REVOKE};
use super::{Answer, Claim, MUTEX_LAYOUT, ms};
use crate::backend::{By, Call, Request};
use crate::error::{Error, Result};
use crate::key::LockKeys;

/// How far past its floor (the server clock, or the client's estimate of it) a block of fencing
/// tokens may end, in tokens (µs): the second ahead of the clock where a new counter starts. A
/// counter that runs that far ahead takes no block, so blocks never carry it further, however
/// many passes a hold reserves (`mutex_acquire.lua`'s `SPAN`).
pub(crate) const BLOCK_SPAN: u64 = 1_000_000;

/// The last token of a block of at most `tokens` from `token` on, for a floor of `floor`
/// ([`BLOCK_SPAN`]; the script's rule, for the block the client proposes in plain commands).
pub(crate) fn block_end(token: u64, tokens: u32, floor: u64) -> u64 {
    let most = token.saturating_add(u64::from(tokens.saturating_sub(1)));
    most.min(floor.saturating_add(BLOCK_SPAN)).max(token)
}

/// The string of a mutex held once by `owner` with fencing token `token`, marked `w` when a
/// waiter found it busy (`mutex_value` of `lua/v1/mutex_lib.lua`).
pub(crate) fn value(token: u64, waited: bool, owner: &str) -> String {
    let mut digits = itoa::Buffer::new();
    let token = digits.format(token);
    let mut value = String::with_capacity(MUTEX_LAYOUT.len() + token.len() + owner.len() + 6);
    value.push_str(MUTEX_LAYOUT);
    value.push(' ');
    value.push_str(token);
    value.push_str(if waited { " 1 w " } else { " 1 - " });
    value.push_str(owner);
    value
}

/// One acquisition attempt for `owner`.
#[derive(Debug)]
pub(crate) struct Acquire<'a> {
    pub(crate) keys: &'a LockKeys,
    pub(crate) owner: &'a str,
    pub(crate) lease_ms: u64,
    /// The fencing counter's lifetime.
    pub(crate) fence_ttl_ms: u64,
    pub(crate) claim: Claim,
    /// The least fresh token to issue: the client's estimate of the server clock in µs (a
    /// Redlock client's proposal, the same to every node), 0 for the server's own `TIME`.
    pub(crate) floor: u64,
    /// Other waiters of this client wait for the name: the grant is marked so that its
    /// release publishes a wake-up.
    pub(crate) waiters: bool,
    /// How many fencing tokens a fresh grant takes at most (1, or more for a hold this client
    /// may pass to its own waiters): the grant's token and the ones after it, up to
    /// [`BLOCK_SPAN`] past the floor (the answer says where the block ends).
    pub(crate) tokens: u32,
    /// The call's request id where it runs once per request (`None`: a new one).
    pub(crate) request: Option<u128>,
}

impl Request for Acquire<'_> {
    type Reply = Answer;

    fn call(&self, by: By) -> Call {
        let mut call = MUTEX_ACQUIRE.call(by, 2);
        call.key(&self.keys.lock)
            .key(&self.keys.fence)
            .arg(self.owner)
            .arg(self.lease_ms)
            .arg(self.fence_ttl_ms)
            .arg(self.claim.code())
            .arg(if self.waiters { "w" } else { "-" })
            .arg(self.floor);
        if self.tokens > 1 {
            call.arg(self.tokens);
        }
        if self.claim.repeats_safely() {
            call.repeatable();
        }
        call.request_id(self.request);
        call
    }

    fn hold(&self) -> Option<(&str, &str)> {
        Some((&self.keys.lock, self.owner))
    }

    fn decode(&self, raw: Value) -> Result<Answer> {
        let keys = [self.keys.lock.as_str(), self.keys.fence.as_str()];
        let (status, reply) = Reply::decode("mutex_acquire", raw, &keys, MUTEX_LAYOUT)?;
        match status {
            1 => {
                let fence = u64::try_from(reply.int(1)?).unwrap_or_default();
                Ok(Answer::Granted {
                    fence,
                    clock: reply.int(3).ok().and_then(|now| u64::try_from(now).ok()),
                    last: reply
                        .int(4)
                        .ok()
                        .and_then(|last| u64::try_from(last).ok())
                        .map_or(fence, |last| last.max(fence)),
                })
            }
            0 => Ok(Answer::Busy {
                wait: ms(reply.int(1)?),
                ticket: None,
                last: reply.int(2).ok().and_then(|last| u64::try_from(last).ok()),
            }),
            other => Err(reply.unexpected(other)),
        }
    }
}

/// Releases one hold of `owner`: `Ok(true)` when that freed the lock and woke waiters that had
/// found it busy, `Ok(false)` when released without a wake-up, [`Error::NotHeld`] when the
/// owner held nothing (nothing changed).
#[derive(Debug)]
pub(crate) struct Release<'a> {
    pub(crate) name: &'a str,
    pub(crate) keys: &'a LockKeys,
    pub(crate) owner: &'a str,
    /// What to publish when the lock becomes free, instead of `1` (a Redlock release's
    /// `1@<release id>`, the same on every node).
    pub(crate) message: Option<&'a str>,
    /// The lock's string as the grant left it ([`value`]): when Redis holds exactly that, the
    /// release is a compare-and-delete before the mutex library loads.
    pub(crate) expected: Option<&'a str>,
}

impl Request for Release<'_> {
    type Reply = bool;

    fn call(&self, by: By) -> Call {
        let mut call = MUTEX_RELEASE.call(by, 1);
        call.key(&self.keys.lock);
        match (self.expected, self.message) {
            // The short form: the string alone, the rest derived from it and the key.
            (Some(expected), None) => {
                call.arg(expected);
            }
            (expected, message) => {
                call.arg(self.owner)
                    .arg(&self.keys.wake)
                    .arg(message.unwrap_or("1"));
                if let Some(expected) = expected {
                    call.arg(expected);
                }
            }
        }
        call
    }

    fn hold(&self) -> Option<(&str, &str)> {
        Some((&self.keys.lock, self.owner))
    }

    fn decode(&self, raw: Value) -> Result<bool> {
        // The fast path's compare-and-delete: released, nobody told.
        if raw == Value::Int(2) {
            return Ok(false);
        }
        let (status, reply) =
            Reply::decode("mutex_release", raw, &[&self.keys.lock], MUTEX_LAYOUT)?;
        match status {
            1 => Ok(false),
            2 => Ok(reply.int(1).is_ok_and(|told| told == 1)),
            0 => Err(Error::NotHeld {
                name: self.name.to_owned(),
            }),
            other => Err(reply.unexpected(other)),
        }
    }
}

/// One hold to renew: its lock key, owner and the lease in ms it must have at least.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Renewal<'a> {
    pub(crate) lock: &'a str,
    pub(crate) owner: &'a str,
    pub(crate) ms: u64,
}

/// Renews holds of many names in one call: one status per item, `1` renewed, `0` not held
/// any more, `-1` foreign data, `-2` foreign layout.
#[derive(Debug)]
pub(crate) struct Extend<'a> {
    pub(crate) items: &'a [Renewal<'a>],
}

impl Request for Extend<'_> {
    type Reply = Vec<i64>;

    fn call(&self, by: By) -> Call {
        let mut call = MUTEX_EXTEND.call(by, self.items.len());
        for item in self.items {
            call.key(item.lock);
        }
        for item in self.items {
            call.arg(item.owner).arg(item.ms);
        }
        call
    }

    fn decode(&self, raw: Value) -> Result<Vec<i64>> {
        statuses("mutex_extend", raw, self.items.len())
    }
}

/// The second round of a Redlock acquisition: raises the node's fencing counter to `fence`
/// where `owner` still holds the lock. `true` when confirmed, `false` when the owner does not
/// hold it there.
#[derive(Debug)]
pub(crate) struct Confirm<'a> {
    pub(crate) keys: &'a LockKeys,
    pub(crate) owner: &'a str,
    pub(crate) fence: u64,
    pub(crate) fence_ttl_ms: u64,
}

impl Request for Confirm<'_> {
    type Reply = bool;

    fn call(&self, by: By) -> Call {
        let mut call = MUTEX_CONFIRM.call(by, 2);
        call.key(&self.keys.lock)
            .key(&self.keys.fence)
            .arg(self.owner)
            .arg(self.fence)
            .arg(self.fence_ttl_ms);
        call
    }

    fn hold(&self) -> Option<(&str, &str)> {
        Some((&self.keys.lock, self.owner))
    }

    fn decode(&self, raw: Value) -> Result<bool> {
        let keys = [self.keys.lock.as_str(), self.keys.fence.as_str()];
        yes_or_no("mutex_confirm", raw, &keys)
    }
}

/// Undoes, on one Redlock node, the hold a carried owner's failed acquisition (`request`, its
/// request id) added there, if it ran and granted; one still on its way then changes nothing.
#[derive(Debug)]
pub(crate) struct Revoke<'a> {
    pub(crate) keys: &'a LockKeys,
    pub(crate) owner: &'a str,
    pub(crate) request: u128,
}

impl Request for Revoke<'_> {
    /// Whether a hold was released.
    type Reply = bool;

    fn call(&self, by: By) -> Call {
        let mut call = MUTEX_REVOKE.call(by, 2);
        call.key(&self.keys.lock)
            .key(format!("{}:once", self.keys.lock))
            .arg(self.owner)
            .arg(format!("{:032x}", self.request));
        call
    }

    fn hold(&self) -> Option<(&str, &str)> {
        Some((&self.keys.lock, self.owner))
    }

    fn decode(&self, raw: Value) -> Result<bool> {
        yes_or_no("mutex_revoke", raw, &[&self.keys.lock])
    }
}

/// The reply of a script that answers `1` or `0` (`true`, `false`), or an error reply about
/// `keys`: foreign data, another layout.
fn yes_or_no(script: &'static str, raw: Value, keys: &[&str]) -> Result<bool> {
    if let Value::Int(status) = raw {
        return match status {
            1 => Ok(true),
            0 => Ok(false),
            other => Err(Error::Protocol {
                script,
                detail: format!("status {other}"),
            }),
        };
    }
    let (status, reply) = Reply::decode(script, raw, keys, MUTEX_LAYOUT)?;
    Err(reply.unexpected(status))
}
