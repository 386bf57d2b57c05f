//! The administrator's scripts: `inspect` (reads any layout, writes nothing) and
//! `force_unlock` (ends every hold and queue place of a name), and the decoding of their replies
//! into the public [`Snapshot`] and [`ForceUnlocked`].

use std::time::Duration;

use redis::Value;

use super::reply::{Reply, int};
use super::scripts::{FORCE_UNLOCK, INSPECT};
use super::{ELECTION_LAYOUT, FAIR_LAYOUT, MUTEX_LAYOUT, RWLOCK_LAYOUT, SEMAPHORE_LAYOUT};
use crate::backend::{By, Call, Request};
use crate::error::{Error, Result, wrong_type};
use crate::inspect::{ForceUnlocked, HolderInfo, LockKind, Snapshot, WaiterInfo, Wants};
use crate::key::LockKeys;
use crate::token::SHORT_ID_LEN;

/// Reads the state of `name`, whatever primitive it is in use as.
#[derive(Debug)]
pub(crate) struct Inspect<'a> {
    pub(crate) name: &'a str,
    pub(crate) keys: &'a LockKeys,
}

impl Request for Inspect<'_> {
    type Reply = Snapshot;

    fn call(&self, by: By) -> Call {
        let mut call = INSPECT.call(by, 4);
        for key in self.keys.queued() {
            call.key(key);
        }
        call
    }

    fn decode(&self, raw: Value) -> Result<Snapshot> {
        parse(self.name, raw, self.keys)
    }
}

/// Ends every hold and queue place of a name; the fencing counter is kept.
#[derive(Debug)]
pub(crate) struct ForceUnlock<'a> {
    pub(crate) keys: &'a LockKeys,
    pub(crate) fence_ttl_ms: u64,
}

impl Request for ForceUnlock<'_> {
    type Reply = ForceUnlocked;

    fn call(&self, by: By) -> Call {
        let mut call = FORCE_UNLOCK.call(by, 4);
        for key in self.keys.queued() {
            call.key(key);
        }
        call.arg(&self.keys.wake).arg(self.fence_ttl_ms);
        call
    }

    #[cfg(feature = "cluster")]
    fn resendable(&self) -> bool {
        false
    }

    fn decode(&self, raw: Value) -> Result<ForceUnlocked> {
        let keys = self.keys.queued();
        let raw = match raw {
            // The status of a successful removal is the layout tag, not a number.
            Value::Array(items) if matches!(items.first(), Some(Value::BulkString(_))) => items,
            other => {
                let (status, reply) =
                    Reply::decode("force_unlock", other, &keys, "a layout of version 1")?;
                return Err(reply.unexpected(status));
            }
        };
        let layout = match raw.first() {
            Some(v) => text(v)?,
            None => String::new(),
        };
        let count = |i: usize| {
            raw.get(i)
                .map(count)
                .transpose()
                .map(Option::unwrap_or_default)
        };
        Ok(ForceUnlocked {
            kind: kind_of(&layout, self.keys)?,
            holders: count(1)?,
            waiters: count(2)?,
        })
    }
}

/// The layout tag a name in use as `kind` carries.
pub(crate) fn layout_of(kind: LockKind) -> &'static str {
    match kind {
        LockKind::Mutex => MUTEX_LAYOUT,
        LockKind::FairMutex => FAIR_LAYOUT,
        LockKind::Semaphore => SEMAPHORE_LAYOUT,
        LockKind::RwLock => RWLOCK_LAYOUT,
        LockKind::Election => ELECTION_LAYOUT,
    }
}

fn kind_of(layout: &str, keys: &LockKeys) -> Result<Option<LockKind>> {
    Ok(match layout {
        "" => None,
        MUTEX_LAYOUT => Some(LockKind::Mutex),
        FAIR_LAYOUT => Some(LockKind::FairMutex),
        SEMAPHORE_LAYOUT => Some(LockKind::Semaphore),
        RWLOCK_LAYOUT => Some(LockKind::RwLock),
        ELECTION_LAYOUT => Some(LockKind::Election),
        _ => {
            return Err(Error::Layout {
                key: keys.lock.clone(),
                found: layout.to_owned(),
                expected: "a layout of version 1",
            });
        }
    })
}

fn bad(detail: String) -> Error {
    Error::Protocol {
        script: "inspect",
        detail,
    }
}

fn text(v: &Value) -> Result<String> {
    crate::backend::text(v).ok_or_else(|| bad(format!("expected text, got {v:?}")))
}

fn num(v: &Value) -> Result<i64> {
    int(v).ok_or_else(|| bad(format!("expected an integer, got {v:?}")))
}

fn count(v: &Value) -> Result<u32> {
    Ok(u32::try_from(num(v)?.max(0)).unwrap_or(u32::MAX))
}

fn millis(v: &Value) -> Result<Option<Duration>> {
    Ok(u64::try_from(num(v)?).ok().map(Duration::from_millis))
}

fn short(id: &str) -> String {
    id.chars().take(SHORT_ID_LEN).collect()
}

fn parse(name: &str, raw: Value, keys: &LockKeys) -> Result<Snapshot> {
    let Value::Array(items) = raw else {
        return Err(bad(format!("expected an array, got {raw:?}")));
    };
    match items.first() {
        Some(Value::Int(-1)) => {
            let key = match items.get(2).and_then(int) {
                Some(2) => &keys.holders,
                Some(3) => &keys.queue,
                Some(4) => &keys.fence,
                _ => &keys.lock,
            };
            let found = items.get(1).map(text).transpose()?.unwrap_or_default();
            return Err(wrong_type(key, &found));
        }
        Some(Value::Int(-2)) => {
            return Err(Error::Layout {
                key: keys.lock.clone(),
                found: items.get(1).map(text).transpose()?.unwrap_or_default(),
                expected: "a layout of version 1",
            });
        }
        _ => {}
    }
    let [
        layout,
        _used,
        cap,
        last,
        Value::Array(holders),
        Value::Array(waiters),
    ] = &items[..]
    else {
        return Err(bad(format!("unexpected reply {items:?}")));
    };
    let kind = kind_of(&text(layout)?, keys)?;
    let holders = holders
        .chunks(4)
        .map(|h| match h {
            [id, x, n, left] => Ok(HolderInfo {
                id: short(&text(id)?),
                exclusive_holds: count(x)?,
                shared_holds: count(n)?,
                lease_left: millis(left)?,
            }),
            _ => Err(bad(format!("truncated holder {h:?}"))),
        })
        .collect::<Result<Vec<_>>>()?;
    let waiters = waiters
        .chunks(3)
        .map(|w| match w {
            [id, want, client] => {
                let want = text(want)?;
                // op, units, then `/` and the lease it asked for
                let units = want
                    .get(1..)
                    .and_then(|rest| rest.split('/').next())
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(1);
                let wants = match want.chars().next() {
                    Some('r') => Wants::Read,
                    Some('w') => Wants::Write,
                    Some('s') => Wants::Permits(units),
                    _ => Wants::Exclusive,
                };
                Ok(WaiterInfo {
                    id: short(&text(id)?),
                    wants,
                    client: text(client)?,
                })
            }
            _ => Err(bad(format!("truncated waiter {w:?}"))),
        })
        .collect::<Result<Vec<_>>>()?;
    let semaphore = kind == Some(LockKind::Semaphore);
    let last = num(last)?;
    Ok(Snapshot {
        name: name.to_owned(),
        permits_in_use: semaphore.then(|| holders.iter().map(|h| h.shared_holds).sum()),
        capacity: if semaphore { Some(count(cap)?) } else { None },
        last_fencing_token: u64::try_from(last).ok().filter(|t| *t > 0),
        kind,
        holders,
        waiters,
    })
}

/// What a Redlock client's servers say of a name, as one snapshot: one whose holders (by id)
/// the most servers report (the first such, in the order the answers came), with the highest
/// fencing token that `majority` servers have reached (a node that granted late may be ahead
/// of the holder's token; no later acquisition can be granted a token below this one). An
/// empty list gives an empty snapshot.
pub(crate) fn agreed(answers: Vec<Snapshot>, majority: usize) -> Snapshot {
    let ids = |s: &Snapshot| -> Vec<String> { s.holders.iter().map(|h| h.id.clone()).collect() };
    let mut tokens: Vec<u64> = answers
        .iter()
        .filter_map(|s| s.last_fencing_token)
        .collect();
    tokens.sort_unstable_by(|a, b| b.cmp(a));
    let last_token = tokens
        .get(majority.saturating_sub(1))
        .or(tokens.last())
        .copied();
    let mut best: Option<(usize, Snapshot)> = None;
    for answer in &answers {
        let agreeing = answers.iter().filter(|a| ids(a) == ids(answer)).count();
        if best.as_ref().is_none_or(|(most, _)| agreeing > *most) {
            best = Some((agreeing, answer.clone()));
        }
    }
    let mut snapshot = best.map(|(_, s)| s).unwrap_or_else(|| Snapshot {
        name: String::new(),
        kind: None,
        holders: Vec::new(),
        waiters: Vec::new(),
        permits_in_use: None,
        capacity: None,
        last_fencing_token: None,
    });
    snapshot.last_fencing_token = last_token;
    snapshot
}

/// What a Redlock client's `force_unlock` removed: the most holders and waiters any server
/// removed, and the kind any server found.
pub(crate) fn most(answers: Vec<ForceUnlocked>) -> ForceUnlocked {
    ForceUnlocked {
        kind: answers.iter().find_map(|a| a.kind),
        holders: answers.iter().map(|a| a.holders).max().unwrap_or_default(),
        waiters: answers.iter().map(|a| a.waiters).max().unwrap_or_default(),
    }
}
