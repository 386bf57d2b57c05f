//! [`LockLayer`]: each request under a distributed mutex named from the request.

use std::fmt;
use std::marker::PhantomData;
use std::time::Duration;

use http::HeaderName;
use tower_layer::Layer;

use super::future::Target;
use super::{Errors, HoldService, OnLost, Policy, Statuses, Wait};
use crate::client::LockClient;

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
///     .layer(
///         LockLayer::new(client, |req: &Request| Some(format!("doc:{}", req.uri().path())))
///             .fair()
///             .wait_timeout(Duration::from_secs(2))
///             .respond_with_status(),
///     );
/// # }
/// ```
pub struct LockLayer<M, R = Errors> {
    client: LockClient,
    make_name: M,
    fair: bool,
    policy: Policy,
    reentry: Option<HeaderName>,
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
    ///     req.uri().path().strip_prefix("/accounts/").map(|id| format!("account:{id}"))
    /// });
    /// # }
    /// ```
    pub fn new(client: LockClient, make_name: M) -> Self {
        Self {
            client,
            make_name,
            fair: false,
            policy: Policy::default(),
            reentry: None,
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
    /// let layer = redlatch::layer::LockLayer::new(client, |req: &http::Request<()>| Some(req.uri().path().to_owned()))
    ///     .fair();
    /// # }
    /// ```
    #[must_use]
    pub fn fair(mut self) -> Self {
        self.fair = true;
        self
    }

    /// Do not wait: a request whose lock is held fails at once with
    /// [`LayerError::Busy`](super::LayerError::Busy).
    ///
    /// ```no_run
    /// # fn demo(client: redlatch::LockClient) {
    /// let layer = redlatch::layer::LockLayer::new(client, |req: &http::Request<()>| Some(req.uri().path().to_owned()))
    ///     .fail_fast();
    /// # }
    /// ```
    #[must_use]
    pub fn fail_fast(mut self) -> Self {
        self.policy.wait = Wait::FailFast;
        self
    }

    /// Wait up to `limit` for the lock, then fail with
    /// [`LayerError::TimedOut`](super::LayerError::TimedOut). Default: 10 s.
    ///
    /// ```no_run
    /// # fn demo(client: redlatch::LockClient) {
    /// let layer = redlatch::layer::LockLayer::new(client, |req: &http::Request<()>| Some(req.uri().path().to_owned()))
    ///     .wait_timeout(std::time::Duration::from_millis(500));
    /// # }
    /// ```
    #[must_use]
    pub fn wait_timeout(mut self, limit: Duration) -> Self {
        self.policy.wait = Wait::Timeout(limit);
        self
    }

    /// What to do if the lease is lost while the handler runs. Default: [`OnLost::Cancel`].
    ///
    /// ```no_run
    /// # fn demo(client: redlatch::LockClient) {
    /// let layer = redlatch::layer::LockLayer::new(client, |req: &http::Request<()>| Some(req.uri().path().to_owned()))
    ///     .on_lease_lost(redlatch::layer::OnLost::Flag);
    /// # }
    /// ```
    #[must_use]
    pub fn on_lease_lost(mut self, on_lost: OnLost) -> Self {
        self.policy.on_lost = on_lost;
        self
    }

    /// Hold the lock until the response body has been read to its end (or dropped), not just
    /// until the response head. Default: off.
    ///
    /// ```no_run
    /// # fn demo(client: redlatch::LockClient) {
    /// let layer = redlatch::layer::LockLayer::new(client, |req: &http::Request<()>| Some(req.uri().path().to_owned()))
    ///     .hold_until_body_end();
    /// # }
    /// ```
    #[must_use]
    pub fn hold_until_body_end(mut self) -> Self {
        self.policy.hold_body = true;
        self
    }

    /// Re-enter the hold of the caller whose [`OwnerToken`](crate::OwnerToken) a request carries
    /// in `header`, and show the token to the handler ([`RequestHold::owner`](super::RequestHold::owner))
    /// so it can pass it on. Off by default. The token is a capability: accept the header only
    /// from services you trust, and strip it from requests that come from outside.
    ///
    /// ```no_run
    /// # fn demo(client: redlatch::LockClient) {
    /// let layer = redlatch::layer::LockLayer::new(client, |req: &http::Request<()>| Some(req.uri().path().to_owned()))
    ///     .reentry_header(http::HeaderName::from_static("x-lock-owner"));
    /// # }
    /// ```
    #[must_use]
    pub fn reentry_header(mut self, header: HeaderName) -> Self {
        self.reentry = Some(header);
        self
    }

    /// Answer busy, timed-out and failed requests with a status
    /// ([`LayerError::status`](super::LayerError::status)) instead of failing: the service's
    /// error becomes the inner service's, so axum's `Router::layer` accepts it.
    ///
    /// ```no_run
    /// # fn demo(client: redlatch::LockClient) {
    /// let layer = redlatch::layer::LockLayer::new(client, |req: &http::Request<()>| Some(req.uri().path().to_owned()))
    ///     .respond_with_status();
    /// # }
    /// ```
    #[must_use]
    pub fn respond_with_status(self) -> LockLayer<M, Statuses> {
        LockLayer {
            client: self.client,
            make_name: self.make_name,
            fair: self.fair,
            policy: self.policy,
            reentry: self.reentry,
            respond: PhantomData,
        }
    }
}

impl<M: Clone, R> Clone for LockLayer<M, R> {
    fn clone(&self) -> Self {
        Self {
            client: self.client.clone(),
            make_name: self.make_name.clone(),
            fair: self.fair,
            policy: self.policy,
            reentry: self.reentry.clone(),
            respond: PhantomData,
        }
    }
}

impl<M, R> fmt::Debug for LockLayer<M, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockLayer")
            .field("fair", &self.fair)
            .field("policy", &self.policy)
            .field("reentry", &self.reentry)
            .finish_non_exhaustive()
    }
}

impl<S, M: Clone, R> Layer<S> for LockLayer<M, R> {
    type Service = HoldService<S, M, R>;

    fn layer(&self, inner: S) -> Self::Service {
        let target = if self.fair {
            Target::FairMutex
        } else {
            Target::Mutex
        };
        HoldService::new(
            inner,
            self.client.clone(),
            self.make_name.clone(),
            target,
            self.policy,
            self.reentry.clone(),
        )
    }
}
