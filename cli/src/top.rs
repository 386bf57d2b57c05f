//! `redlatch top`: the names under a prefix that are held or queued now, found with `SCAN` in
//! bounded batches (never `KEYS`) and read with `inspect` (one script call each), sorted by
//! queue length. Read-only.

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redlatch::{Error, LockClient, LockKind, Snapshot};
use redlatch_harness::measure::{AnyResult, glob_escape};
use serde_json::{Value, json};

/// Keys asked for per `SCAN` call.
pub const SCAN_BATCH: u64 = 500;

/// One refresh: the names in use, most queued first, and what it cost the server.
#[derive(Debug)]
pub struct View {
    /// The names' snapshots, sorted by queue length, then holders, then name.
    pub rows: Vec<Snapshot>,
    /// Names found beyond `limit`, left out.
    pub left_out: usize,
    /// Names whose keys could not be read as a lock (data redlatch did not write under the
    /// prefix, a name redlatch would refuse): left out, and counted here.
    pub unreadable: usize,
    /// Commands sent to the server for this refresh (`SCAN` calls and one `inspect` each).
    pub commands: u64,
}

/// The names with keys under `prefix` (the main key of a name is `<prefix>:{<name>}`), how
/// many keys there are not text (no name redlatch writes, left alone), and how many `SCAN`
/// calls it took.
///
/// # Errors
///
/// A failed `SCAN`.
pub async fn names(
    conn: &mut MultiplexedConnection,
    prefix: &str,
) -> AnyResult<(Vec<String>, usize, u64)> {
    let pattern = format!("{}:{{*}}", glob_escape(prefix));
    let head = format!("{prefix}:{{");
    let mut names = Vec::new();
    let (mut cursor, mut calls, mut binary) = (0u64, 0u64, 0usize);
    loop {
        let (next, batch): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(SCAN_BATCH)
            .query_async(conn)
            .await?;
        calls += 1;
        for key in batch {
            let Ok(key) = String::from_utf8(key) else {
                binary += 1;
                continue;
            };
            if let Some(name) = key
                .strip_prefix(&head)
                .and_then(|rest| rest.strip_suffix('}'))
                .filter(|name| !name.contains(['{', '}']))
            {
                names.push(name.to_owned());
            }
        }
        if next == 0 {
            break;
        }
        cursor = next;
    }
    names.sort_unstable();
    names.dedup();
    Ok((names, binary, calls))
}

/// One refresh: every name in use under the client's prefix, inspected, at most `limit` kept.
///
/// # Errors
///
/// A failed `SCAN` or `inspect`, other than a name whose keys are not redlatch's locks (counted in
/// [`View::unreadable`]); a name that is free by the time it is read is left out.
pub async fn view(
    conn: &mut MultiplexedConnection,
    client: &LockClient,
    prefix: &str,
    limit: usize,
) -> AnyResult<View> {
    let (names, binary, scans) = names(conn, prefix).await?;
    let (mut rows, mut unreadable) = (Vec::new(), binary);
    for name in &names {
        let snapshot = match client.inspect(name).await {
            Ok(snapshot) => snapshot,
            // Data redlatch did not write, or a name it would refuse: left out, counted.
            Err(Error::WrongType { .. } | Error::Layout { .. } | Error::InvalidArgument { .. }) => {
                unreadable += 1;
                continue;
            }
            // Anything else (the server out of reach, a refused command such as `NOPERM`, a
            // busy script): the view cannot be made, and saying the names are not locks would
            // be wrong.
            Err(err) => return Err(err.into()),
        };
        if snapshot.kind.is_some() && !(snapshot.holders.is_empty() && snapshot.waiters.is_empty())
        {
            rows.push(snapshot);
        }
    }
    rows.sort_by(|a, b| {
        b.waiters
            .len()
            .cmp(&a.waiters.len())
            .then(b.holders.len().cmp(&a.holders.len()))
            .then(a.name.cmp(&b.name))
    });
    let left_out = rows.len().saturating_sub(limit);
    rows.truncate(limit);
    Ok(View {
        rows,
        left_out,
        unreadable,
        commands: scans + names.len() as u64,
    })
}

fn kind(kind: Option<LockKind>) -> &'static str {
    match kind {
        Some(LockKind::Mutex) => "mutex",
        Some(LockKind::FairMutex) => "fair",
        Some(LockKind::Semaphore) => "semaphore",
        Some(LockKind::RwLock) => "rwlock",
        Some(LockKind::Election) => "election",
        Some(_) => "other",
        None => "free",
    }
}

/// The shortest lease left among the holders.
fn lease_left(s: &Snapshot) -> Option<Duration> {
    s.holders.iter().filter_map(|h| h.lease_left).min()
}

/// The view as a table.
pub fn table(view: &View) -> String {
    let mut out = format!(
        "{:<32} {:<9} {:>6} {:<26} {:>5} {:>10} {:>9} {:>18}\n",
        "name", "kind", "queue", "holders", "holds", "lease left", "permits", "last token"
    );
    for s in &view.rows {
        let mut holders: Vec<String> = s.holders.iter().take(3).map(|h| h.id.clone()).collect();
        if s.holders.len() > 3 {
            holders.push(format!("+{}", s.holders.len() - 3));
        }
        let holds: u32 = s
            .holders
            .iter()
            .map(|h| h.exclusive_holds.saturating_add(h.shared_holds))
            .sum();
        let lease =
            lease_left(s).map_or_else(|| "-".to_owned(), |d| format!("{:.1} s", d.as_secs_f64()));
        let permits = match (s.permits_in_use, s.capacity) {
            (Some(used), Some(cap)) => format!("{used}/{cap}"),
            _ => "-".to_owned(),
        };
        let token = s
            .last_fencing_token
            .map_or_else(|| "-".to_owned(), |t| t.to_string());
        out.push_str(&format!(
            "{:<32} {:<9} {:>6} {:<26} {:>5} {:>10} {:>9} {:>18}\n",
            s.name,
            kind(s.kind),
            s.waiters.len(),
            holders.join(","),
            holds,
            lease,
            permits,
            token
        ));
    }
    if view.left_out > 0 {
        out.push_str(&format!("... and {} more names in use\n", view.left_out));
    }
    if view.unreadable > 0 {
        out.push_str(&format!(
            "{} keys under the prefix are not redlatch's locks (left alone)\n",
            view.unreadable
        ));
    }
    out
}

/// The view as JSON: one object per name.
pub fn json(view: &View) -> Value {
    let rows: Vec<Value> = view
        .rows
        .iter()
        .map(|s| {
            json!({
                "name": s.name,
                "kind": kind(s.kind),
                "queue": s.waiters.len(),
                "holders": s.holders.iter().map(|h| json!({
                    "id": h.id,
                    "exclusive_holds": h.exclusive_holds,
                    "shared_holds": h.shared_holds,
                    "lease_left_ms": h.lease_left.map(|d| d.as_millis() as u64),
                })).collect::<Vec<_>>(),
                "waiters": s.waiters.iter().map(|w| json!({
                    "id": w.id,
                    "wants": format!("{:?}", w.wants),
                    "client": w.client,
                })).collect::<Vec<_>>(),
                "permits_in_use": s.permits_in_use,
                "capacity": s.capacity,
                "last_fencing_token": s.last_fencing_token,
            })
        })
        .collect();
    json!({
        "names": rows,
        "left_out": view.left_out,
        "unreadable": view.unreadable,
        "commands": view.commands,
    })
}
