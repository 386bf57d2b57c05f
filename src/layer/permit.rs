//! [`PermitLayer`]: a fleet-wide concurrency limit, one semaphore permit per request.

use std::fmt;
use std::marker::PhantomData;
use std::time::Duration;

use tower_layer::Layer;

use super::future::Target;
use super::{Errors, FixedName, HoldService, OnLost, Policy, Statuses, Wait};
use crate::client::LockClient;

/// Serves each request holding one permit of a distributed [`Semaphore`](crate::Semaphore):
/// at most `permits` requests at once across every process that shares the name. The name is
/// fixed ([`new`](Self::new)) or made from the request ([`per_request`](Self::per_request), for
/// per-tenant limits). See the [module docs](super) for errors, lease loss and bodies.
///
/// Defaults: the client's lease and watchdog, waiting up to 10 s (in FIFO order), cancelling
/// the handler if the lease is lost, holding until the response head, failing with a
/// [`BoxError`](super::BoxError).
///
/// ```no_run
/// use axum::{Router, extract::Request, routing::get};
/// use redlatch::layer::PermitLayer;
///
/// # fn demo(client: redlatch::LockClient) {
/// // At most 4 reports at once per tenant, across the fleet.
/// let app: Router = Router::new()
///     .route("/reports", get(|| async { "report" }))
///     .layer(
///         PermitLayer::per_request(client, 4, |req: &Request| {
///             let tenant = req.headers().get("x-tenant")?.to_str().ok()?;
///             Some(format!("reports:{tenant}"))
///         })
///         .respond_with_status(),
///     );
/// # }
/// ```
pub struct PermitLayer<M, R = Errors> {
    client: LockClient,
    make_name: M,
    permits: u32,
    policy: Policy,
    respond: PhantomData<fn() -> R>,
}

impl PermitLayer<FixedName> {
    /// One semaphore, `name`, with `permits` permits, for every request. A capacity of 0 makes
    /// every request fail with [`LayerError::Acquire`](super::LayerError::Acquire).
    ///
    /// ```no_run
    /// # fn demo(client: redlatch::LockClient) {
    /// let layer = redlatch::layer::PermitLayer::new(client, "api", 64);
    /// # }
    /// ```
    pub fn new(client: LockClient, name: &str, permits: u32) -> Self {
        Self::per_request(client, permits, FixedName::new(name))
    }
}

impl<M> PermitLayer<M> {
    /// A semaphore of `permits` permits per name that `make_name` gives a request; a request
    /// for which it gives none is not limited.
    ///
    /// ```no_run
    /// # fn demo(client: redlatch::LockClient) {
    /// let layer = redlatch::layer::PermitLayer::per_request(client, 2, |req: &http::Request<()>| {
    ///     req.headers().get("x-tenant")?.to_str().ok().map(|t| format!("tenant:{t}"))
    /// });
    /// # }
    /// ```
    pub fn per_request(client: LockClient, permits: u32, make_name: M) -> Self {
        Self {
            client,
            make_name,
            permits,
            policy: Policy::default(),
            respond: PhantomData,
        }
    }
}

impl<M, R> PermitLayer<M, R> {
    /// Do not wait: a request that finds no permit free fails at once with
    /// [`LayerError::Busy`](super::LayerError::Busy).
    ///
    /// ```no_run
    /// # fn demo(client: redlatch::LockClient) {
    /// let layer = redlatch::layer::PermitLayer::new(client, "api", 64)
    ///     .fail_fast();
    /// # }
    /// ```
    #[must_use]
    pub fn fail_fast(mut self) -> Self {
        self.policy.wait = Wait::FailFast;
        self
    }

    /// Wait up to `limit` for a permit, then fail with
    /// [`LayerError::TimedOut`](super::LayerError::TimedOut). Default: 10 s.
    ///
    /// ```no_run
    /// # fn demo(client: redlatch::LockClient) {
    /// let layer = redlatch::layer::PermitLayer::new(client, "api", 64)
    ///     .wait_timeout(std::time::Duration::from_millis(500));
    /// # }
    /// ```
    #[must_use]
    pub fn wait_timeout(mut self, limit: Duration) -> Self {
        self.policy.wait = Wait::Timeout(limit);
        self
    }

    /// What to do if the permit's lease is lost while the handler runs. Default:
    /// [`OnLost::Cancel`].
    ///
    /// ```no_run
    /// # fn demo(client: redlatch::LockClient) {
    /// let layer = redlatch::layer::PermitLayer::new(client, "api", 64)
    ///     .on_lease_lost(redlatch::layer::OnLost::Flag);
    /// # }
    /// ```
    #[must_use]
    pub fn on_lease_lost(mut self, on_lost: OnLost) -> Self {
        self.policy.on_lost = on_lost;
        self
    }

    /// Hold the permit until the response body has been read to its end (or dropped).
    /// Default: off.
    ///
    /// ```no_run
    /// # fn demo(client: redlatch::LockClient) {
    /// let layer = redlatch::layer::PermitLayer::new(client, "api", 64)
    ///     .hold_until_body_end();
    /// # }
    /// ```
    #[must_use]
    pub fn hold_until_body_end(mut self) -> Self {
        self.policy.hold_body = true;
        self
    }

    /// Answer requests that get no permit with a status instead of failing (`503` with
    /// `Retry-After`); see [`LockLayer::respond_with_status`](super::LockLayer::respond_with_status).
    ///
    /// ```no_run
    /// # fn demo(client: redlatch::LockClient) {
    /// let layer = redlatch::layer::PermitLayer::new(client, "api", 64)
    ///     .respond_with_status();
    /// # }
    /// ```
    #[must_use]
    pub fn respond_with_status(self) -> PermitLayer<M, Statuses> {
        PermitLayer {
            client: self.client,
            make_name: self.make_name,
            permits: self.permits,
            policy: self.policy,
            respond: PhantomData,
        }
    }
}

impl<M: Clone, R> Clone for PermitLayer<M, R> {
    fn clone(&self) -> Self {
        Self {
            client: self.client.clone(),
            make_name: self.make_name.clone(),
            permits: self.permits,
            policy: self.policy,
            respond: PhantomData,
        }
    }
}

impl<M, R> fmt::Debug for PermitLayer<M, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PermitLayer")
            .field("permits", &self.permits)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl<S, M: Clone, R> Layer<S> for PermitLayer<M, R> {
    type Service = HoldService<S, M, R>;

    fn layer(&self, inner: S) -> Self::Service {
        HoldService::new(
            inner,
            self.client.clone(),
            self.make_name.clone(),
            Target::Permit(self.permits),
            self.policy,
            None,
        )
    }
}
