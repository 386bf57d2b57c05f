//! The scripts' cost inside Redis (`redlatch bench --scripts`): for each primitive, and for
//! the minimal lock, [`IN_FLIGHT`] calls at a time acquire `names` names in use, then release
//! them (the server busy, as in the uncontended scenario: a lone call on an idle server costs
//! several times as much); `INFO commandstats` before and after each of the two phases gives the time the server
//! spent per call (a script's time includes the commands it ran; an acquisition in plain
//! commands, the time of those commands) and the commands it ran per call (those the scripts
//! ran included).
//!
//! Then the queued primitives' scripts on contended names, called by hand: an attempt that
//! queues behind a holder, and the release that hands the hold over to it, first with the
//! server busy, then one call at a time after it sat idle for [`IDLE_GAP`] (what a release
//! meets between the holds of a hand-off: on a virtual machine an idle vCPU halts, and the
//! first call after it runs with cold caches); and a newcomer joining a shared holder (a
//! reader, a permit), by the acquire as clients send it and by its general path alone.
//!
//! It runs on a server of the tool's own only: the figures are the server's totals, which
//! another client's traffic would spoil.

use std::future::Future;
use std::time::Duration;

use futures_util::{StreamExt, TryStreamExt, stream};

use redis::aio::MultiplexedConnection;
use redlatch_harness::measure::{
    AnyResult, QueueScript, WARM_NAMES, command_times, minimal_acquire, minimal_cycle,
    minimal_release,
};
use serde_json::{Value, json};

use super::library::{Contender, Entry, Hold};

/// One phase's figures: µs the server spent per call, and commands it ran per call.
#[derive(Debug, Clone, Copy)]
struct Phase {
    us_per_call: f64,
    commands_per_call: f64,
}

/// Runs the profile and prints a table: per configuration, the acquire's and the release's
/// µs per call in the server and commands per call. Returns the figures as JSON.
///
/// # Errors
///
/// A failed connection, command or lock operation.
pub async fn profile_scripts(
    url: &str,
    prefix: &str,
    entries: &[Entry],
    names: u32,
) -> AnyResult<Value> {
    let mut conn = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let mut rows: Vec<(String, Phase, Phase)> = Vec::new();

    // The minimal lock: SET NX PX, then the compare-and-delete script.
    let locks: Vec<String> = (0..names)
        .map(|i| format!("{prefix}:profile-minimal-{i}"))
        .collect();
    let mut own = conn.clone();
    for lock in &locks {
        minimal_cycle(&mut own, lock).await?;
    }
    tokio::time::sleep(WARM_NAMES).await;
    let (acquire, owners) = phase(&mut conn, &["set"], names, async {
        stream::iter(&locks)
            .map(|lock| {
                let mut own = own.clone();
                async move { minimal_acquire(&mut own, lock).await }
            })
            .buffered(IN_FLIGHT)
            .try_collect::<Vec<String>>()
            .await
    })
    .await?;
    let (release, ()) = phase(&mut conn, SCRIPTS, names, async {
        stream::iter(locks.iter().zip(&owners))
            .map(|(lock, owner)| {
                let mut own = own.clone();
                async move { minimal_release(&mut own, lock, owner).await }
            })
            .buffer_unordered(IN_FLIGHT)
            .try_collect::<()>()
            .await
    })
    .await?;
    rows.push(("minimal".to_owned(), acquire, release));

    for entry in entries {
        let lib = (entry.connect)().await?;
        let mut contenders: Vec<Box<dyn Contender>> = Vec::new();
        for i in 0..names {
            contenders.push(
                lib.contender(&format!("profile-{}-{i}", entry.name), None)
                    .await?,
            );
        }
        for c in &contenders {
            c.lock().await?.release().await?;
        }
        tokio::time::sleep(WARM_NAMES).await;
        let (acquire, holds) = phase(&mut conn, TAKE, names, async {
            stream::iter(&contenders)
                .map(|c| c.lock())
                .buffer_unordered(IN_FLIGHT)
                .try_collect::<Vec<Box<dyn Hold>>>()
                .await
        })
        .await?;
        let (release, ()) = phase(&mut conn, SCRIPTS, names, async {
            stream::iter(holds)
                .map(Hold::release)
                .buffer_unordered(IN_FLIGHT)
                .try_collect::<()>()
                .await
        })
        .await?;
        rows.push((entry.name.to_owned(), acquire, release));
    }

    let contended_busy = contended(&mut conn, prefix, names, Pace::Busy).await?;
    let contended_idle = contended(
        &mut conn,
        prefix,
        names.min(IDLE_NAMES),
        Pace::Idle(IDLE_GAP),
    )
    .await?;
    let joins = joins(&mut conn, prefix, names).await?;

    outln!(
        "{:<24} {:>12} {:>12} {:>12} {:>14} {:>14}",
        "configuration",
        "acquire µs",
        "release µs",
        "cycle µs",
        "acquire cmds",
        "release cmds"
    );
    let mut out = Vec::new();
    for (name, a, r) in &rows {
        outln!(
            "{:<24} {:>12.2} {:>12.2} {:>12.2} {:>14.2} {:>14.2}",
            name,
            a.us_per_call,
            r.us_per_call,
            a.us_per_call + r.us_per_call,
            a.commands_per_call,
            r.commands_per_call
        );
        out.push(json!({
            "configuration": name,
            "acquire_us": a.us_per_call,
            "release_us": r.us_per_call,
            "cycle_us": a.us_per_call + r.us_per_call,
            "acquire_commands": a.commands_per_call,
            "release_commands": r.commands_per_call,
        }));
    }
    let busy = print_pairs(
        "contended",
        ["queue", "hand-over"],
        ["queue", "handover"],
        &contended_busy,
    );
    outln!(
        "\nthe same, one call at a time after the server sat idle {} ms (as between the holds \
         of a hand-off)",
        IDLE_GAP.as_millis()
    );
    let idle = print_pairs(
        "contended, idle",
        ["queue", "hand-over"],
        ["queue", "handover"],
        &contended_idle,
    );
    let joined = print_pairs("joining", ["fast", "general"], ["fast", "general"], &joins);
    Ok(json!({
        "names": names,
        "rows": out,
        "contended": busy,
        "contended_idle": idle,
        "idle_gap_ms": IDLE_GAP.as_millis() as u64,
        "idle_names": names.min(IDLE_NAMES),
        "joins": joined,
    }))
}

/// The queued primitives' scripts on a contended name, called by hand as the library sends
/// them (no client logic, no wake-up): on each of `names` names one owner holds (not counted),
/// then a second owner's attempt queues behind it (the `queue` phase), then the holder's
/// release hands the hold over to it (the `hand-over` phase, its message published to
/// nobody); the new holders then let go. A semaphore has one permit here. In the last two rows
/// two waiters queue (the `queue` phase per attempt) and the release lets both in: two readers
/// behind a writer, and two waiters of one permit each behind the holder of both permits of a
/// semaphore of two.
async fn contended(
    conn: &mut MultiplexedConnection,
    prefix: &str,
    names: u32,
    pace: Pace,
) -> AnyResult<Vec<(String, Phase, Phase)>> {
    let mut rows = Vec::new();
    // (label, layout, the holder's op and units, the capacity (0: not a semaphore), the
    // waiters' ops, one unit each)
    for (label, layout, (op, units), cap, waiting) in [
        ("redlatch-fair", "fair:1", ("x", 1), 0, ["x"].as_slice()),
        ("redlatch-semaphore", "semaphore:1", ("s", 1), 1, &["s"]),
        ("redlatch-rwlock-write", "rwlock:1", ("w", 1), 0, &["w"]),
        (
            "redlatch-rwlock-readers",
            "rwlock:1",
            ("w", 1),
            0,
            &["r", "r"],
        ),
        (
            "redlatch-semaphore-two",
            "semaphore:1",
            ("s", 2),
            2,
            &["s", "s"],
        ),
    ] {
        let keys: Vec<String> = (0..names)
            .map(|i| format!("{prefix}:{{profile-contended-{label}-{i}}}"))
            .collect();
        let take_units = |key: &str, (op, units): (&str, u32), owner: &str, grace: u64| {
            QueueScript::Acquire.acquire_units(key, (layout, op), (units, cap), owner, owner, grace)
        };
        let take =
            |key: &str, op: &str, owner: &str, grace: u64| take_units(key, (op, 1), owner, grace);
        let give = |key: &str, op: &str, owner: &str| {
            QueueScript::Release.release(key, (layout, op), owner)
        };
        let held = run_all(
            conn,
            Pace::Busy,
            keys.iter()
                .map(|k| take_units(k, (op, units), "holder", 0))
                .collect(),
        )
        .await?;
        if held.iter().any(|r| r.first() != Some(&1)) {
            return Err(format!("{label}: a holder was refused").into());
        }
        // Waiter i is `waiter<i>`, of op `waiting[i]`.
        let waiters: Vec<(String, &str)> = waiting
            .iter()
            .enumerate()
            .map(|(i, op)| (format!("waiter{i}"), *op))
            .collect();
        let attempts = names * waiters.len() as u32;
        let mut own = conn.clone();
        let (queue, queued) = phase(&mut own, SCRIPTS, attempts, async {
            let calls = waiters
                .iter()
                .flat_map(|(owner, op)| keys.iter().map(move |k| take(k, op, owner, 30_000)));
            run_all(conn, pace, calls.collect()).await
        })
        .await?;
        if queued.iter().any(|r| r.first() != Some(&0)) {
            return Err(format!("{label}: a waiter did not queue").into());
        }
        let (handover, handed) = phase(&mut own, SCRIPTS, names, async {
            run_all(
                conn,
                pace,
                keys.iter().map(|k| give(k, op, "holder")).collect(),
            )
            .await
        })
        .await?;
        if handed.iter().any(|r| r.first() != Some(&2)) {
            return Err(format!("{label}: a release did not let go").into());
        }
        for (owner, op) in &waiters {
            run_all(
                conn,
                Pace::Busy,
                keys.iter().map(|k| give(k, op, owner)).collect(),
            )
            .await?;
        }
        rows.push((label.to_owned(), queue, handover));
    }
    Ok(rows)
}

/// A newcomer joining a shared holder, called by hand: on each of `names` names one owner
/// holds (not counted), then a second owner joins it (the phase), by the acquire as clients
/// send it (its fast path first) and, on other names, by the general path alone; then both let
/// go. A reader joins a reader; a permit joins a permit of a semaphore of two. Per row: the
/// fast and the general figures.
async fn joins(
    conn: &mut MultiplexedConnection,
    prefix: &str,
    names: u32,
) -> AnyResult<Vec<(String, Phase, Phase)>> {
    let mut rows = Vec::new();
    for (label, want, cap) in [
        ("redlatch-rwlock-read", ("rwlock:1", "r"), 0),
        ("redlatch-semaphore", ("semaphore:1", "s"), 2),
    ] {
        let mut phases = Vec::new();
        for (path, script) in [
            ("fast", QueueScript::Acquire),
            ("general", QueueScript::GeneralAcquire),
        ] {
            let keys: Vec<String> = (0..names)
                .map(|i| format!("{prefix}:{{profile-join-{label}-{path}-{i}}}"))
                .collect();
            let take = |key: &str, owner: &str, script: QueueScript| {
                script.acquire_units(key, want, (1, cap), owner, owner, 0)
            };
            let held = run_all(
                conn,
                Pace::Busy,
                keys.iter()
                    .map(|k| take(k, "holder", QueueScript::Acquire))
                    .collect(),
            )
            .await?;
            let mut own = conn.clone();
            let (join, joined) = phase(&mut own, SCRIPTS, names, async {
                run_all(
                    conn,
                    Pace::Busy,
                    keys.iter().map(|k| take(k, "joiner", script)).collect(),
                )
                .await
            })
            .await?;
            if held.iter().chain(&joined).any(|r| r.first() != Some(&1)) {
                return Err(format!("{label} ({path}): a holder was refused").into());
            }
            for owner in ["joiner", "holder"] {
                let give = |k: &String| QueueScript::Release.release(k, want, owner);
                run_all(conn, Pace::Busy, keys.iter().map(give).collect()).await?;
            }
            phases.push(join);
        }
        rows.push((label.to_owned(), phases[0], phases[1]));
    }
    Ok(rows)
}

/// Prints a table of two phases per configuration (titled `title`, the phases headed `heads`),
/// after a blank line: µs and commands per call of each. Returns its rows as JSON, the
/// phases' fields named `<key>_us` and `<key>_commands` for `keys`.
fn print_pairs(
    title: &str,
    heads: [&str; 2],
    keys: [&str; 2],
    rows: &[(String, Phase, Phase)],
) -> Vec<Value> {
    outln!();
    outln!(
        "{:<24} {:>12} {:>12} {:>14} {:>14}",
        title,
        format!("{} µs", heads[0]),
        format!("{} µs", heads[1]),
        format!("{} cmds", heads[0]),
        format!("{} cmds", heads[1])
    );
    let mut out = Vec::new();
    for (name, a, b) in rows {
        outln!(
            "{:<24} {:>12.2} {:>12.2} {:>14.2} {:>14.2}",
            name,
            a.us_per_call,
            b.us_per_call,
            a.commands_per_call,
            b.commands_per_call
        );
        let mut row = serde_json::Map::new();
        row.insert("configuration".to_owned(), json!(name));
        for (key, phase) in keys.iter().zip([a, b]) {
            row.insert(format!("{key}_us"), json!(phase.us_per_call));
            row.insert(format!("{key}_commands"), json!(phase.commands_per_call));
        }
        out.push(Value::Object(row));
    }
    out
}

/// How the calls of a phase are sent.
#[derive(Debug, Clone, Copy)]
enum Pace {
    /// [`IN_FLIGHT`] at a time: the server busy.
    Busy,
    /// One at a time, each after the server sat idle this long, as a release meets it
    /// between the holds of a hand-off.
    Idle(Duration),
}

/// The idle time before each call of the idle phases: a hold of the hand-off scenario's.
const IDLE_GAP: Duration = Duration::from_millis(3);

/// Names of the idle phases (each call waits [`IDLE_GAP`] first).
const IDLE_NAMES: u32 = 200;

/// Runs `calls` at `pace`; their replies.
async fn run_all(
    conn: &MultiplexedConnection,
    pace: Pace,
    calls: Vec<redis::ScriptInvocation<'static>>,
) -> AnyResult<Vec<Vec<i64>>> {
    if let Pace::Idle(gap) = pace {
        let mut replies = Vec::with_capacity(calls.len());
        for call in calls {
            tokio::time::sleep(gap).await;
            let mut conn = conn.clone();
            replies.push(call.invoke_async::<Vec<i64>>(&mut conn).await?);
        }
        return Ok(replies);
    }
    Ok(stream::iter(calls)
        .map(|call| {
            let mut conn = conn.clone();
            async move { call.invoke_async::<Vec<i64>>(&mut conn).await }
        })
        .buffer_unordered(IN_FLIGHT)
        .try_collect()
        .await?)
}

/// Calls in flight at once in each phase.
pub(super) const IN_FLIGHT: usize = 32;

/// The commands a script call is sent as.
const SCRIPTS: &[&str] = &["evalsha", "eval"];

/// What redlatch's acquisition of a name in use sends: one round trip of plain commands (the
/// client last saw the name free), or a script. A script's time includes the commands it
/// runs, which are counted on their own too: a phase where some acquisitions fell back to the
/// script counts those commands twice (names in use, in the steady state, send none).
const TAKE: &[&str] = &["evalsha", "eval", "set", "zadd", "exists", "zscore"];

/// Runs `work`, `calls` calls of `sent` (the commands the client sends, whose time is the
/// figure); returns the phase's figures and the work's output.
async fn phase<T>(
    conn: &mut MultiplexedConnection,
    sent: &[&str],
    calls: u32,
    work: impl Future<Output = AnyResult<T>>,
) -> AnyResult<(Phase, T)> {
    let before = command_times(conn).await?;
    let out = work.await?;
    let after = command_times(conn).await?;
    let delta = |name: &str| -> (u64, u64) {
        let (c1, u1) = after.get(name).copied().unwrap_or_default();
        let (c0, u0) = before.get(name).copied().unwrap_or_default();
        (c1.saturating_sub(c0), u1.saturating_sub(u0))
    };
    let us: u64 = sent.iter().map(|name| delta(name).1).sum();
    let commands: u64 = after
        .keys()
        .filter(|name| name.as_str() != "info")
        .map(|name| delta(name).0)
        .sum();
    let calls = f64::from(calls.max(1));
    Ok((
        Phase {
            us_per_call: us as f64 / calls,
            commands_per_call: commands as f64 / calls,
        },
        out,
    ))
}
