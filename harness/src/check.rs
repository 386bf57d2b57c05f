//! Checkers over what the holders of a lock did, as their processes logged it with
//! `CLOCK_MONOTONIC` (one host: every process reads the same clock):
//!
//! * C1 [`overlaps`]: no two holders' intervals overlap (for a semaphore, at most its capacity at
//!   once). A holder's interval runs from its acquire returning to the earlier of its release
//!   call and the lease deadline it knew of, so an interval is within the true holding and an
//!   overlap is a real violation.
//! * C3 [`fence_audit`]: the fenced store accepted strictly rising tokens, tokens rise with the
//!   order of acquisitions, and every stale write (one that reached the store after a newer
//!   holder's write) was refused.
//!
//! C2 (the register against its count of updates) and C4 (nothing left in Redis) read Redis
//! and live with the resource and the test.

use std::collections::HashMap;

/// One critical section as its worker logged it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Section {
    /// Who held: the worker process and task.
    pub worker: String,
    /// The hold's fencing token (0 for read holds).
    pub token: u64,
    /// An exclusive hold (mutex, fair mutex, write lock) or a shared one (read hold, permit).
    pub exclusive: bool,
    /// When the acquire returned, ns of `CLOCK_MONOTONIC`.
    pub start: u64,
    /// The earlier of the release call and the lease deadline the holder knew of, ns.
    pub end: u64,
    /// The section's fenced write, if it made one: when, and whether the store accepted it.
    pub write: Option<(u64, bool)>,
}

/// What C1 found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overlaps {
    /// Sections that started while the lock could not admit them.
    pub count: usize,
    /// The most sections held at once.
    pub max_concurrent: usize,
    /// The first violation, described.
    pub first: Option<String>,
}

/// C1: sweeps the intervals in time order. An exclusive section may overlap nothing; shared
/// sections may overlap each other, `capacity` at most (use `usize::MAX` for read holds).
/// Sections whose interval is empty (a lease that had run out before the acquire returned)
/// held nothing and are skipped.
pub fn overlaps(sections: &[Section], capacity: usize) -> Overlaps {
    // (time, is start, index); ends sort before starts at the same instant.
    let mut events: Vec<(u64, bool, usize)> = Vec::new();
    for (i, s) in sections.iter().enumerate() {
        if s.end > s.start {
            events.push((s.start, true, i));
            events.push((s.end, false, i));
        }
    }
    events.sort();
    let mut active: Vec<usize> = Vec::new();
    let mut out = Overlaps::default();
    for (_, is_start, i) in events {
        if !is_start {
            active.retain(|&a| a != i);
            continue;
        }
        let s = &sections[i];
        let clash = active.iter().copied().find(|&a| {
            let other = &sections[a];
            s.exclusive || other.exclusive
        });
        let over_capacity = !s.exclusive && active.len() >= capacity;
        if clash.is_some() || over_capacity {
            out.count += 1;
            if out.first.is_none() {
                let held: Vec<&Section> = active.iter().map(|&a| &sections[a]).collect();
                out.first = Some(format!("{s:?} started while these held: {held:?}"));
            }
        }
        active.push(i);
        out.max_concurrent = out.max_concurrent.max(active.len());
    }
    out
}

/// What C3 found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FenceAudit {
    /// Fenced write attempts the store accepted.
    pub accepted: usize,
    /// Fenced write attempts the store rejected.
    pub rejected: usize,
    /// Accepted tokens that were not above every token accepted before them (the store's own
    /// invariant: always 0 unless it is broken).
    pub accepted_not_rising: usize,
    /// Exclusive sections whose token is not above every token of the sections that started
    /// before them.
    pub tokens_not_rising: usize,
    /// Stale writes the store accepted: exclusive holders' writes that reached it after a newer
    /// holder's write had been accepted (a newer holder: one whose acquire returned later; shared
    /// holds are left out, as they write side by side). Fencing exists to
    /// make this 0; it is not 0 when the lock hands out tokens out of order.
    pub stale_accepted: usize,
    /// Stale writes the store refused.
    pub stale_rejected: usize,
    /// Writes made after the writer's lease had ended but before any newer holder had written:
    /// not stale (the store orders them before every newer write), and accepted.
    pub late_unchallenged: usize,
}

/// C3 over the sections and the store's log of attempts (in the order it saw them).
pub fn fence_audit(sections: &[Section], store_log: &[(u64, bool)]) -> FenceAudit {
    let mut audit = FenceAudit::default();
    let mut top = 0;
    for &(token, accepted) in store_log {
        if accepted {
            audit.accepted += 1;
            if token <= top {
                audit.accepted_not_rising += 1;
            }
            top = top.max(token);
        } else {
            audit.rejected += 1;
        }
    }
    let mut exclusive: Vec<&Section> = sections.iter().filter(|s| s.exclusive).collect();
    exclusive.sort_by_key(|s| s.start);
    let mut highest = 0;
    for s in exclusive {
        if s.token <= highest {
            audit.tokens_not_rising += 1;
        }
        highest = highest.max(s.token);
    }
    // Where each section's write sits in the store's log (by its token), and the latest start
    // of a holder whose write the store had accepted before each position.
    let mut by_token: HashMap<u64, Vec<&Section>> = HashMap::new();
    // Only exclusive holds: shared ones (permits) write side by side, their tokens in the
    // order Redis granted them, not the order their acquires returned.
    for s in sections
        .iter()
        .filter(|s| s.exclusive && s.write.is_some() && s.token > 0)
    {
        by_token.entry(s.token).or_default().push(s);
    }
    let mut newest_accepted: Option<u64> = None;
    for &(token, accepted) in store_log {
        let Some(writer) = by_token.get_mut(&token).and_then(Vec::pop) else {
            continue;
        };
        let stale = newest_accepted.is_some_and(|newest| newest > writer.start);
        let late = writer.write.is_some_and(|(at, _)| at > writer.end);
        match (stale, accepted) {
            (true, true) => audit.stale_accepted += 1,
            (true, false) => audit.stale_rejected += 1,
            (false, true) if late => audit.late_unchallenged += 1,
            _ => {}
        }
        if accepted {
            newest_accepted = Some(newest_accepted.map_or(writer.start, |n| n.max(writer.start)));
        }
    }
    audit
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(start: u64, end: u64, token: u64, exclusive: bool) -> Section {
        Section {
            worker: format!("w{token}"),
            token,
            exclusive,
            start,
            end,
            write: None,
        }
    }

    #[test]
    fn overlaps_are_found_and_touching_intervals_are_not() {
        let clean = [section(0, 10, 1, true), section(10, 20, 2, true)];
        assert_eq!(overlaps(&clean, 1).count, 0);
        let bad = [section(0, 10, 1, true), section(5, 20, 2, true)];
        let found = overlaps(&bad, 1);
        assert_eq!((found.count, found.max_concurrent), (1, 2));
        assert!(found.first.is_some());
        // Readers share; a writer excludes them.
        let readers = [section(0, 10, 0, false), section(5, 20, 0, false)];
        assert_eq!(overlaps(&readers, usize::MAX).count, 0);
        let writer = [section(0, 10, 0, false), section(5, 20, 3, true)];
        assert_eq!(overlaps(&writer, usize::MAX).count, 1);
        // A semaphore of 2: the third at once is one too many.
        let permits = [
            section(0, 10, 1, false),
            section(1, 10, 2, false),
            section(2, 10, 3, false),
        ];
        assert_eq!(overlaps(&permits, 2).count, 1);
        assert_eq!(overlaps(&permits, 3).count, 0);
        // An empty interval held nothing.
        let late = [section(0, 10, 1, true), section(5, 4, 2, true)];
        assert_eq!(overlaps(&late, 1).count, 0);
    }

    #[test]
    fn the_fence_audit_counts_what_it_says() {
        let mut stale = section(0, 10, 5, true);
        stale.write = Some((30, false));
        let mut fresh = section(12, 20, 6, true);
        fresh.write = Some((15, true));
        let audit = fence_audit(&[stale, fresh], &[(6, true), (5, false)]);
        assert_eq!(
            audit,
            FenceAudit {
                accepted: 1,
                rejected: 1,
                accepted_not_rising: 0,
                tokens_not_rising: 0,
                stale_accepted: 0,
                stale_rejected: 1,
                late_unchallenged: 0,
            }
        );
        // Written after its lease, but before any newer holder wrote: accepted, not stale.
        let mut late = section(0, 10, 5, true);
        late.write = Some((30, true));
        let mut next = section(12, 40, 6, true);
        next.write = Some((35, true));
        let audit = fence_audit(&[late, next], &[(5, true), (6, true)]);
        assert_eq!((audit.stale_accepted, audit.late_unchallenged), (0, 1));
        // Tokens out of order: the newer holder got the lower token, so the older holder's
        // write after it is accepted. That is what C3 exists to catch.
        let mut old = section(0, 10, 9, true);
        old.write = Some((30, true));
        let mut newer = section(12, 40, 4, true);
        newer.write = Some((20, true));
        let audit = fence_audit(&[old, newer], &[(4, true), (9, true)]);
        assert_eq!((audit.stale_accepted, audit.tokens_not_rising), (1, 1));
        let regressed = [section(0, 1, 9, true), section(2, 3, 4, true)];
        assert_eq!(fence_audit(&regressed, &[]).tokens_not_rising, 1);
    }
}
