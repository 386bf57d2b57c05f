//! [`HoldView`]: a cheap view of one hold, for code that must watch a hold it does not own.

use std::fmt;
use std::sync::{Arc, Weak};

use tokio::sync::watch;

use super::{Hold, Lost, Status};

/// A cheap, cloneable view of one hold: its name, fencing token, whether it is still held, and
/// a [`Lost`] future. Made by a guard's `view()`; it does not keep the hold: once the guard is
/// released (or dropped), [`is_held`](Self::is_held) is false. What a middleware hands to the
/// handler it serves under a hold (the tower layer's `RequestHold` wraps one).
///
/// ```no_run
/// # async fn demo(client: redlatch::LockClient) -> redlatch::Result<()> {
/// let guard = client.mutex("orders:42")?.lock().await?;
/// let view: redlatch::HoldView = guard.view();
/// assert!(view.is_held());
/// assert_eq!(view.fencing_token(), guard.fencing_token());
/// guard.unlock().await?;
/// assert!(!view.is_held());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct HoldView {
    name: Arc<str>,
    fencing_token: u64,
    hold: Weak<Hold>,
    /// The turn of the guard it was made from (a hold passed between local guards is another
    /// guard's later).
    turn: u64,
    lost: watch::Receiver<Status>,
}

impl fmt::Debug for HoldView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HoldView")
            .field("name", &self.name)
            .field("fencing_token", &self.fencing_token)
            .field("held", &self.is_held())
            .finish()
    }
}

impl HoldView {
    pub(super) fn new(hold: &Arc<Hold>, fencing_token: u64) -> Self {
        Self {
            name: Arc::clone(&hold.name),
            fencing_token,
            hold: Arc::downgrade(hold),
            turn: hold.turn(),
            lost: hold.lost_signal(),
        }
    }

    /// The name of the lock (or semaphore) held.
    ///
    /// ```no_run
    /// # fn demo(view: redlatch::HoldView) {
    /// println!("holding {}", view.name());
    /// # }
    /// ```
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The hold's fencing token (0 for a read hold, which carries none).
    ///
    /// ```no_run
    /// # fn demo(view: redlatch::HoldView) {
    /// let token: u64 = view.fencing_token();
    /// # }
    /// ```
    pub fn fencing_token(&self) -> u64 {
        self.fencing_token
    }

    /// True while the hold lives: until its guard is released or dropped (or passes the hold
    /// to another task of the client: that task's guard has its own view), unless the lease
    /// is known lost or has run out first.
    ///
    /// ```no_run
    /// # fn demo(view: redlatch::HoldView) {
    /// if !view.is_held() {
    ///     eprintln!("stop writing");
    /// }
    /// # }
    /// ```
    pub fn is_held(&self) -> bool {
        self.hold
            .upgrade()
            .is_some_and(|h| h.is_live() && h.turn() == self.turn)
    }

    /// A future that completes when the lease is known lost, or once the guard it was made
    /// from let go of the hold: at once when the hold passed to another task of the client
    /// (local hand-off), after a release once the client's background tasks forget it.
    ///
    /// ```no_run
    /// # async fn demo(view: redlatch::HoldView) {
    /// tokio::select! {
    ///     _ = view.lost() => eprintln!("lost the lock, stopping"),
    ///     _ = async { /* the work */ } => {}
    /// }
    /// # }
    /// ```
    pub fn lost(&self) -> Lost {
        Lost::from_signal(self.lost.clone(), self.turn)
    }
}
