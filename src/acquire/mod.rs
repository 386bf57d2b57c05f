//! Acquisition, written once for every primitive: one attempt, cancel safe; giving back what an
//! attempt whose answer was lost may have got; and the wait, woken by push. The plain mutex and
//! the queued primitives (fair mutex, semaphore, read-write lock) differ only in which protocol
//! operation an attempt runs and in where waiters queue (in the client, or in Redis), which
//! [`Engine`] hides from the primitives.

mod cohort;
mod engine;
mod queued;
mod quorum;
mod wait;

pub(crate) use engine::{Ask, Engine};

/// The answer to one attempt.
#[derive(Debug)]
pub(crate) enum Attempt<T> {
    Acquired(T),
    /// Held by another owner, whose lease has this much left (`None`: unknown or no expiry).
    Busy(Option<std::time::Duration>),
    /// Held by others, and the owner waits in the queue in Redis, in the place with this
    /// ticket; `wait` as for [`Attempt::Busy`].
    Queued {
        wait: Option<std::time::Duration>,
        ticket: u64,
    },
}

impl<T> Attempt<T> {
    /// The value, if acquired; `None` when busy.
    pub(crate) fn acquired(self) -> Option<T> {
        match self {
            Self::Acquired(value) => Some(value),
            Self::Busy(_) | Self::Queued { .. } => None,
        }
    }
}
