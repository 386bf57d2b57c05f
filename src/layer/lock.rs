//! [`LockLayer`]: each request under a distributed mutex named from the request.

use std::marker::PhantomData;

use http::HeaderName;

use super::Errors;
use super::options::{Options, Target, shared_options};
use crate::LockClient;

/// Serves each request under a distributed lock whose name is made from the request: two
/// requests for the same name never run at once, in any process; requests for different
/// names run in parallel; a request for which no name is made passes through unlocked. See
/// the [module docs](super) for errors, lease loss, bodies and re-entry.
///
/// Defaults: a [`Mutex`](crate::Mutex) with the client's lease and watchdog, waiting up to
/// 10 s, cancelling the handler if the lease is lost, holding until the response head,
/// failing with a [`BoxError`](super::BoxError), no re-entry header.
///
/// ```no_run
/// use std::time::Duration;
/// use axum::{Router, extract::Request, routing::put};
/// use redlatch::layer::LockLayer;
///
/// # fn demo(client: redlatch::LockClient) {
/// let app: Router = Router::new()
///     .route("/documents/{id}", put(|| async { "saved" }))
///     .route_layer(
///         LockLayer::new(client, |req: &Request| {
///             redlatch::layer::decoded_path(req).map(|path| format!("doc:{path}"))
///         })
///             .fair()
///             .wait_timeout(Duration::from_secs(2))
///             .respond_with_status(),
///     );
/// # }
/// ```
pub struct LockLayer<M, R = Errors> {
    client: LockClient,
    make_name: M,
    options: Options,
    respond: PhantomData<fn() -> R>,
}

impl<M> LockLayer<M> {
    /// Locks the name `make_name` gives each request (a closure
    /// `FnMut(&http::Request<B>) -> Option<impl Into<String>>`, or a
    /// [`MakeLockName`](super::MakeLockName)), with the defaults above.
    ///
    /// ```no_run
    /// # fn demo(client: redlatch::LockClient) {
    /// let layer = redlatch::layer::LockLayer::new(client, |req: &http::Request<()>| {
    ///     // Decoded, as the router hands the id to the handler: one lock per account, however
    ///     // its path is spelled.
    ///     let path = redlatch::layer::decoded_path(req)?;
    ///     path.strip_prefix("/accounts/").map(|id| format!("account:{id}"))
    /// });
    /// # }
    /// ```
    pub fn new(client: LockClient, make_name: M) -> Self {
        Self {
            client,
            make_name,
            options: Options::new(Target::Mutex),
            respond: PhantomData,
        }
    }
}

impl<M, R> LockLayer<M, R> {
    /// Serve waiting requests strictly first come, first served across the fleet, with a
    /// [`FairMutex`](crate::FairMutex).
    ///
    /// ```no_run
    /// # fn demo(client: redlatch::LockClient) {
    /// let layer = redlatch::layer::LockLayer::new(client, |req: &http::Request<()>| redlatch::layer::decoded_path(req))
    ///     .fair();
    /// # }
    /// ```
    #[must_use]
    pub fn fair(mut self) -> Self {
        self.options.target = Target::FairMutex;
        self
    }

    /// Re-enter the hold of the caller whose [`OwnerToken`](crate::OwnerToken) a request carries
    /// in `header`, and show the token to the handler ([`RequestHold::owner`](super::RequestHold::owner))
    /// so it can pass it on. Off by default. The token is a capability: accept the header only
    /// from services you trust, and strip it from requests that come from outside.
    ///
    /// ```no_run
    /// # fn demo(client: redlatch::LockClient) {
    /// let layer = redlatch::layer::LockLayer::new(client, |req: &http::Request<()>| redlatch::layer::decoded_path(req))
    ///     .reentry_header(http::HeaderName::from_static("x-lock-owner"));
    /// # }
    /// ```
    #[must_use]
    pub fn reentry_header(mut self, header: HeaderName) -> Self {
        self.options.reentry = Some(header);
        self
    }
}

shared_options!(
    LockLayer,
    "redlatch::layer::LockLayer::new(client, |req: &http::Request<()>| redlatch::layer::decoded_path(req))"
);
