//! The wake path's timeline: a trace event (target `redlatch::timeline`, level `TRACE`, field
//! `hop`) at each step from a release to the woken waiter's acquire returning, so that a
//! subscriber can time each hop in one run (`redlatch bench --timeline` does). The hops, in the
//! order a hand-off passes them:
//!
//! * `release.sent`, `release.answered`: the releaser's script call, in the releaser's task;
//! * `wake.received`: the wake-up message handed to the waiter registry, on the subscription
//!   connection's reader;
//! * `waiter.woken`: the waiting task runs again;
//! * `attempt.sent`, `attempt.answered`: an attempt of a waiter (a plain mutex's waiter makes
//!   one after its wake-up; a queued waiter is handed the hold in the message and makes none);
//! * `acquired`: the acquire returns the hold.
//!
//! With no subscriber interested in the target, each event costs one check of a cached flag.

/// The events' target.
pub(crate) const TARGET: &str = "redlatch::timeline";

/// Marks one hop of the wake path.
#[inline]
pub(crate) fn hop(name: &'static str) {
    tracing::trace!(target: TARGET, hop = name);
}
