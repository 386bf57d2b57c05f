//! [`RequestHold`]: what the handler sees of the hold it is served under.

use std::fmt;
use std::sync::{OnceLock, Weak};

use crate::{HoldView, Lost, MutexGuard, OwnerToken};

/// What the handler of a request served under a lock or permit can see of the hold: found in
/// the request's extensions (`axum::Extension<RequestHold>` in axum).
///
/// ```no_run
/// use redlatch::layer::RequestHold;
///
/// async fn handler(request: http::Request<()>) {
///     if let Some(hold) = request.extensions().get::<RequestHold>() {
///         println!("holding `{}` with token {}", hold.name(), hold.fencing_token());
///     }
/// }
/// ```
#[derive(Clone)]
pub struct RequestHold {
    view: HoldView,
    /// The lock's guard, held by the layer, whose owner token is read on the handler's first
    /// ask; the token once read.
    owner: Option<(Weak<MutexGuard>, OnceLock<OwnerToken>)>,
}

impl fmt::Debug for RequestHold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RequestHold")
            .field("name", &self.name())
            .field("fencing_token", &self.fencing_token())
            .field("held", &self.is_held())
            .finish_non_exhaustive()
    }
}

impl RequestHold {
    pub(crate) fn new(view: HoldView, guard: Option<Weak<MutexGuard>>) -> Self {
        Self {
            view,
            owner: guard.map(|guard| (guard, OnceLock::new())),
        }
    }

    /// The lock's (or semaphore's) name.
    ///
    /// ```no_run
    /// # fn demo(hold: redlatch::layer::RequestHold) {
    /// println!("{}", hold.name());
    /// # }
    /// ```
    pub fn name(&self) -> &str {
        self.view.name()
    }

    /// The hold's fencing token: hand it to the storage the handler writes to.
    ///
    /// ```no_run
    /// # fn demo(hold: redlatch::layer::RequestHold) {
    /// let token: u64 = hold.fencing_token();
    /// # }
    /// ```
    pub fn fencing_token(&self) -> u64 {
        self.view.fencing_token()
    }

    /// The owner token, to carry to a downstream service in the re-entry header; `None` unless
    /// the layer was given a [`reentry_header`](super::LockLayer::reentry_header). It is a
    /// capability: send it only to services you trust. Once read, the hold is treated as in
    /// use elsewhere, as [`MutexGuard::owner`](crate::MutexGuard::owner) says: it is not passed
    /// to another task of this client, nor released once lost at its deadline. A request whose
    /// handler never reads it keeps both. Also `None` when first asked for after the layer let
    /// the hold go (the token would re-enter nothing).
    ///
    /// ```no_run
    /// # fn demo(hold: redlatch::layer::RequestHold) {
    /// if let Some(owner) = hold.owner() {
    ///     let header_value = owner.to_string(); // for the downstream request
    /// }
    /// # }
    /// ```
    pub fn owner(&self) -> Option<&OwnerToken> {
        let (guard, token) = self.owner.as_ref()?;
        if let Some(token) = token.get() {
            return Some(token);
        }
        // Released already: its token re-enters nothing.
        let guard = guard.upgrade()?;
        Some(token.get_or_init(|| *guard.owner()))
    }

    /// True while the request holds the lock or permit: until the layer releases it (when the
    /// response is ready, or at the end of its body with
    /// [`hold_until_body_end`](super::LockLayer::hold_until_body_end)), unless the lease is lost
    /// or runs out first.
    ///
    /// ```no_run
    /// # fn demo(hold: redlatch::layer::RequestHold) {
    /// assert!(hold.is_held());
    /// # }
    /// ```
    pub fn is_held(&self) -> bool {
        self.view.is_held()
    }

    /// A future that completes when the lease is known lost.
    ///
    /// ```no_run
    /// # async fn demo(hold: redlatch::layer::RequestHold) {
    /// tokio::select! {
    ///     _ = hold.lost() => eprintln!("lost the lock, stopping"),
    ///     _ = async { /* the work */ } => {}
    /// }
    /// # }
    /// ```
    pub fn lost(&self) -> Lost {
        self.view.lost()
    }

    /// The hold as a [`HoldView`].
    ///
    /// ```no_run
    /// # fn demo(hold: redlatch::layer::RequestHold) {
    /// let view: redlatch::HoldView = hold.view().clone();
    /// # }
    /// ```
    pub fn view(&self) -> &HoldView {
        &self.view
    }
}
