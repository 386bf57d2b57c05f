//! [`Take`]: the acquisition of an idle name in one round trip of plain commands, without a
//! script, for every primitive: `SET <key> <string> NX PX <lease>` writes the hold as one
//! string (the plain mutex's, `mutex_lib.lua`; a queued primitive's thin form, `queue_lib.lua`),
//! and the fence key checks and records the proposed token: `ZADD <fence> XX GT CH <token> ~`
//! raises its last token only if the proposal is higher and answers 1 exactly then (`XX`: it
//! never makes the key, nor adds `~` to a sorted set that is not ours). A read hold takes no
//! token; it only looks that the fence key is absent or ours (`ZSCORE`, `EXISTS`). A queued
//! primitive's other keys (holders, queue) must be absent too (`EXISTS`): their contents mean
//! nothing without the meta hash, and anything there is for the script to look at.
//!
//! A busy name changes nothing but, at most, raises the fence key to a token nobody got, which
//! only makes later tokens higher. A hold whose token the fence key did not confirm is the
//! caller's all the same: its script, run with the same owner (claim `new`), finds it and
//! issues it a token above every one issued, or refuses foreign data and gives it back.

use redis::Value;

use super::reply::int;
use crate::backend::Commands;
use crate::error::{Error, Result};

/// What the fence key is asked.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Fence {
    /// Confirm `token` (above every token issued) and record `last`, the end of the block the
    /// hold takes (`token` itself, or more for a plain mutex's local hand-off).
    Token { token: u64, last: u64 },
    /// A read hold: no token; the key must be absent or ours.
    Read,
}

/// One acquisition of an idle name in plain commands.
#[derive(Debug)]
pub(crate) struct Take<'a> {
    /// The name's main key: the plain mutex's lock, a queued primitive's meta key.
    pub(crate) key: &'a str,
    pub(crate) fence_key: &'a str,
    /// The hold's string.
    pub(crate) value: &'a str,
    pub(crate) lease_ms: u64,
    pub(crate) fence: Fence,
    /// Keys of the name that must not exist (a queued primitive's holders and queue).
    pub(crate) absent: &'a [&'a str],
}

/// What a [`Take`] came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Taken {
    /// The hold is the caller's, and its token (if any) above every token issued.
    Granted,
    /// The hold is the caller's, but the fence key did not confirm the token (it stood at or
    /// above it, is new, or is not a sorted set of ours): the script issues one.
    Unconfirmed,
    /// The name was not idle (or not ours): the script tells which.
    Busy,
}

impl Commands for Take<'_> {
    type Reply = Taken;

    fn pipeline(&self) -> redis::Pipeline {
        let mut pipe = redis::Pipeline::with_capacity(3);
        pipe.ignore_errors();
        let mut set = redis::Cmd::with_capacity(6, 40 + self.key.len() + self.value.len());
        set.arg("SET")
            .arg(self.key)
            .arg(self.value)
            .arg("NX")
            .arg("PX")
            .arg(self.lease_ms);
        pipe.add_command(set);
        let fence = |args: &[&[u8]]| {
            let mut cmd = redis::Cmd::with_capacity(args.len() + 1, 48 + self.fence_key.len());
            cmd.arg(args[0]).arg(self.fence_key);
            for arg in &args[1..] {
                cmd.arg(*arg);
            }
            cmd
        };
        match self.fence {
            Fence::Token { token, last } => {
                let mut digits = itoa::Buffer::new();
                let first = digits.format(token).as_bytes();
                pipe.add_command(fence(&[b"ZADD", b"XX", b"GT", b"CH", first, b"~"]));
                if last > token {
                    let mut digits = itoa::Buffer::new();
                    let last = digits.format(last).as_bytes();
                    pipe.add_command(fence(&[b"ZADD", b"XX", b"GT", last, b"~"]));
                }
            }
            Fence::Read => {
                pipe.add_command(fence(&[b"ZSCORE", b"~"]));
            }
        }
        // How many of the fence key (for a read hold) and the keys that must be absent exist.
        let read = matches!(self.fence, Fence::Read);
        if read || !self.absent.is_empty() {
            let mut exists = redis::Cmd::with_capacity(self.absent.len() + 2, 128);
            exists.arg("EXISTS");
            if read {
                exists.arg(self.fence_key);
            }
            for key in self.absent {
                exists.arg(*key);
            }
            pipe.add_command(exists);
        }
        pipe
    }

    fn decode(&self, replies: Vec<Value>) -> Result<Taken> {
        match replies.first() {
            Some(Value::Okay) => {}
            Some(Value::SimpleString(ok)) if ok == "OK" => {}
            Some(Value::Nil) => return Ok(Taken::Busy),
            Some(Value::ServerError(err)) => {
                return Err(Error::Redis(redis::RedisError::from(err.clone())));
            }
            other => {
                return Err(Error::Protocol {
                    script: "take (SET NX PX)",
                    detail: format!("unexpected reply {other:?}"),
                });
            }
        }
        let last = replies.last().and_then(int);
        let confirmed = match self.fence {
            Fence::Token { .. } => {
                replies.get(1).and_then(int) == Some(1)
                    && (self.absent.is_empty() || last == Some(0))
            }
            // A score of ours (the key counted, nothing else), or no key at all.
            Fence::Read => match replies.get(1) {
                Some(Value::BulkString(_) | Value::Double(_)) => last == Some(1),
                Some(Value::Nil) => last == Some(0),
                _ => false,
            },
        };
        Ok(if confirmed {
            Taken::Granted
        } else {
            Taken::Unconfirmed
        })
    }
}
