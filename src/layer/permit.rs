//! [`PermitLayer`]: a fleet-wide concurrency limit, one semaphore permit per request.

use std::marker::PhantomData;

use super::options::{Options, Target, shared_options};
use super::{Errors, FixedName};
use crate::LockClient;

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
    options: Options,
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
        let mut layer = Self::per_request(client, permits, FixedName::new(name));
        layer.options.fixed_name = true;
        layer
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
            options: Options::new(Target::Permit(permits)),
            respond: PhantomData,
        }
    }
}

shared_options!(
    PermitLayer,
    "redlatch::layer::PermitLayer::new(client, \"api\", 64)"
);
