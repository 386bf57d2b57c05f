//! Tower layers that hold a distributed lock or a semaphore permit for each request.
//!
//! * [`LockLayer`]: a name is made from each request (by a closure or a [`MakeLockName`]); the
//!   request is served under a [`Mutex`](crate::Mutex) (or a [`FairMutex`](crate::FairMutex))
//!   of that name, so two requests for the same resource never run at once, anywhere in the
//!   fleet. A request for which no name is made passes through unlocked.
//! * [`PermitLayer`]: a fleet-wide concurrency limit: each request holds a permit of a
//!   [`Semaphore`](crate::Semaphore), of one fixed name or of a name made from the request
//!   (per-tenant limits).
//!
//! Both serve HTTP services (`http::Request` in, `http::Response` out), which covers axum,
//! hyper and tonic. `poll_ready` only asks the inner service; the lock is taken in the response
//! future, and released when that future completes or is dropped (a client that goes away
//! frees the lock at once). The handler finds the hold's name and fencing token in the request
//! extensions, as a [`RequestHold`].
//!
//! # Errors
//!
//! By default the services fail with a [`BoxError`] that downcasts to [`LayerError`]: busy (fail
//! fast), timed out, lease lost, or Redis unreachable. With
//! [`respond_with_status`](LockLayer::respond_with_status) they answer with a status instead
//! (`423 Locked` or `503 Service Unavailable`, with `Retry-After` from the holder's remaining
//! lease), so the service never fails and axum's `Router::layer` takes it as it is.
//!
//! # Lease loss
//!
//! The watchdog keeps the lock while the handler runs. If the lease is lost anyway (Redis
//! unreachable for a whole lease, the key deleted behind our back), the default is to drop the
//! handler's future and answer with [`LayerError::LeaseLost`]: the handler must not go on
//! believing it is alone. [`OnLost::Flag`] lets it run and only marks the [`RequestHold`].
//!
//! # Bodies
//!
//! A response future completes when the response head is ready; a streamed body may still be
//! running. The hold ends with the head unless
//! [`hold_until_body_end`](LockLayer::hold_until_body_end) is set: then the response body
//! ([`HoldBody`]) keeps it until its last frame has been read, or until it is dropped.
//!
//! # Re-entry across services
//!
//! Off by default. With [`reentry_header`](LockLayer::reentry_header), a request that carries
//! an [`OwnerToken`] in that header re-enters the hold of the service that
//! called it instead of waiting for it (which would deadlock), and the handler can read the
//! token from [`RequestHold::owner`] to pass it on. The token is a capability: whoever has it
//! acts as the holder. Use it only between services you trust, and strip the header from
//! requests that come from outside.
//!
//! # Example
//!
//! ```no_run
//! use axum::{Router, extract::Request, routing::post};
//! use redlatch::layer::{LockLayer, PermitLayer, RequestHold};
//!
//! async fn update(hold: axum::Extension<RequestHold>) -> String {
//!     format!("updated under fencing token {}", hold.fencing_token())
//! }
//!
//! # async fn demo(client: redlatch::LockClient) {
//! let app: Router = Router::new()
//!     // One request per resource at a time, fleet-wide.
//!     .route("/resources/{id}", post(update))
//!     .layer(
//!         LockLayer::new(client.clone(), |req: &Request| {
//!             Some(req.uri().path().to_owned())
//!         })
//!         .respond_with_status(),
//!     )
//!     // At most 8 requests at once across every instance.
//!     .layer(PermitLayer::new(client, "api", 8).respond_with_status());
//! # }
//! ```

mod body;
mod error;
mod future;
mod lock;
mod permit;
mod service;

use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

pub use body::HoldBody;
pub use error::{Errors, LayerError, OnError, Statuses};
pub use future::ResponseFuture;
pub use lock::LockLayer;
pub use permit::PermitLayer;
pub use service::HoldService;

use crate::lease::{Held, Hold, Lost};
use crate::token::OwnerToken;

/// The error type of the services: a [`LayerError`] or the inner service's error, boxed.
///
/// ```
/// use redlatch::layer::{BoxError, LayerError};
///
/// fn is_busy(err: &BoxError) -> bool {
///     matches!(err.downcast_ref::<LayerError>(), Some(LayerError::Busy { .. }))
/// }
/// assert!(!is_busy(&BoxError::from("inner failure")));
/// ```
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Makes the name of the lock (or semaphore) a request is served under; `None` lets the request
/// through without one. Implemented for closures `FnMut(&http::Request<B>) -> Option<N>` where
/// `N: Into<String>`.
///
/// ```
/// use http::Request;
/// use redlatch::layer::MakeLockName;
///
/// /// One lock per tenant, from a header; requests without one are not limited.
/// #[derive(Clone)]
/// struct ByTenant;
///
/// impl<B> MakeLockName<B> for ByTenant {
///     fn make_lock_name(&mut self, request: &Request<B>) -> Option<String> {
///         let tenant = request.headers().get("x-tenant")?.to_str().ok()?;
///         Some(format!("tenant:{tenant}"))
///     }
/// }
///
/// let request = Request::builder().header("x-tenant", "acme").body(()).unwrap();
/// assert_eq!(ByTenant.make_lock_name(&request).as_deref(), Some("tenant:acme"));
/// ```
pub trait MakeLockName<B> {
    /// The name for `request`, or `None` to serve it without a lock.
    fn make_lock_name(&mut self, request: &http::Request<B>) -> Option<String>;
}

impl<B, F, N> MakeLockName<B> for F
where
    F: FnMut(&http::Request<B>) -> Option<N>,
    N: Into<String>,
{
    fn make_lock_name(&mut self, request: &http::Request<B>) -> Option<String> {
        self(request).map(Into::into)
    }
}

/// One name for every request: what [`PermitLayer::new`] uses.
///
/// ```
/// use redlatch::layer::{FixedName, MakeLockName};
///
/// let request = http::Request::new(());
/// assert_eq!(FixedName::new("api").make_lock_name(&request).as_deref(), Some("api"));
/// ```
#[derive(Debug, Clone)]
pub struct FixedName(Arc<str>);

impl FixedName {
    /// Every request gets `name`.
    ///
    /// ```
    /// let name = redlatch::layer::FixedName::new("reports");
    /// # let _ = name;
    /// ```
    pub fn new(name: impl Into<Arc<str>>) -> Self {
        Self(name.into())
    }
}

impl<B> MakeLockName<B> for FixedName {
    fn make_lock_name(&mut self, _request: &http::Request<B>) -> Option<String> {
        Some(self.0.to_string())
    }
}

/// How long a request waits for its lock or permit (set with `fail_fast` and `wait_timeout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wait {
    /// One attempt: if it is busy, fail at once with [`LayerError::Busy`].
    FailFast,
    /// Wait up to this long, then fail with [`LayerError::TimedOut`].
    Timeout(Duration),
}

impl Default for Wait {
    /// Wait up to 10 s.
    fn default() -> Self {
        Self::Timeout(Duration::from_secs(10))
    }
}

/// What happens when the lease is lost while the handler runs.
///
/// ```
/// use redlatch::layer::OnLost;
///
/// assert_eq!(OnLost::default(), OnLost::Cancel);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OnLost {
    /// Drop the handler's future (and a held body) and fail with [`LayerError::LeaseLost`].
    #[default]
    Cancel,
    /// Let the handler finish; [`RequestHold::is_held`] turns false and
    /// [`RequestHold::lost`] completes, for the handler to look at.
    Flag,
}

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
    name: Arc<str>,
    fencing_token: u64,
    owner: Option<OwnerToken>,
    /// Gone once the hold is released: a `RequestHold` kept past the request does not keep it.
    hold: Weak<Hold>,
    lost: watch::Receiver<bool>,
}

impl std::fmt::Debug for RequestHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestHold")
            .field("name", &self.name)
            .field("fencing_token", &self.fencing_token)
            .field("held", &self.is_held())
            .finish_non_exhaustive()
    }
}

impl RequestHold {
    pub(crate) fn new(held: &Held, owner: Option<OwnerToken>) -> Self {
        let hold = held.hold();
        Self {
            name: Arc::clone(&hold.name),
            fencing_token: held.fence,
            owner,
            hold: Arc::downgrade(hold),
            lost: hold.lost_signal(),
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
        &self.name
    }

    /// The hold's fencing token: hand it to the storage the handler writes to. For a read-write
    /// lock's read hold it would be 0, but the layers take mutexes and permits only.
    ///
    /// ```no_run
    /// # fn demo(hold: redlatch::layer::RequestHold) {
    /// let token: u64 = hold.fencing_token();
    /// # }
    /// ```
    pub fn fencing_token(&self) -> u64 {
        self.fencing_token
    }

    /// The owner token, to carry to a downstream service in the re-entry header; `None` unless
    /// the layer was given a [`reentry_header`](LockLayer::reentry_header). It is a capability:
    /// send it only to services you trust.
    ///
    /// ```no_run
    /// # fn demo(hold: redlatch::layer::RequestHold) {
    /// if let Some(owner) = hold.owner() {
    ///     let header_value = owner.to_string(); // for the downstream request
    /// }
    /// # }
    /// ```
    pub fn owner(&self) -> Option<&OwnerToken> {
        self.owner.as_ref()
    }

    /// True while the request holds the lock or permit: until the layer releases it (when the
    /// response is ready, or at the end of its body with
    /// [`hold_until_body_end`](LockLayer::hold_until_body_end)), unless the lease is lost or
    /// runs out first.
    ///
    /// ```no_run
    /// # fn demo(hold: redlatch::layer::RequestHold) {
    /// assert!(hold.is_held());
    /// # }
    /// ```
    pub fn is_held(&self) -> bool {
        self.hold
            .upgrade()
            .is_some_and(|h| !h.is_ended() && !h.is_lost() && Instant::now() < h.expires_at())
    }

    /// A future that completes when the lease is known lost, or once the layer has released
    /// the hold.
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
        Lost::from_signal(self.lost.clone())
    }
}

/// The options both layers share.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Policy {
    pub(crate) wait: Wait,
    pub(crate) on_lost: OnLost,
    pub(crate) hold_body: bool,
}
