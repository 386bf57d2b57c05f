//! [`HoldService`]: the service both layers make.

use std::fmt;
use std::marker::PhantomData;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use super::future::{Job, Plan, respond};
use super::options::Options;
use super::{Errors, HoldBody, LayerError, MakeLockName, OnError, ResponseFuture};
use crate::{LockClient, OwnerToken};

/// The service made by [`LockLayer`](super::LockLayer) and [`PermitLayer`](super::PermitLayer):
/// serves each request under a lock or permit named by `M`.
///
/// `poll_ready` asks the inner service only. `call` moves the readied inner service into the
/// response future (and keeps a clone for the next request), because the inner service is
/// called only once the lock is held: the inner service must be `Clone`, and its readiness is
/// held while the request waits for the lock.
///
/// ```no_run
/// use std::convert::Infallible;
/// use http::{Request, Response};
/// use redlatch::layer::{HoldBody, HoldService, LockLayer, ResponseFuture};
/// use tower::{Layer, Service, ServiceExt, service_fn};
///
/// # async fn demo(client: redlatch::LockClient) -> Result<(), redlatch::layer::BoxError> {
/// let handler = service_fn(|_req: Request<String>| async {
///     Ok::<_, Infallible>(Response::new(String::from("done")))
/// });
/// let mut service: HoldService<_, _> =
///     LockLayer::new(client, |req: &Request<String>| redlatch::layer::decoded_path(req))
///         .layer(handler);
/// let future: ResponseFuture<_> =
///     service.ready().await?.call(Request::new(String::new()));
/// let response: Response<HoldBody<String>> = future.await?;
/// # let _ = response;
/// # Ok(())
/// # }
/// ```
pub struct HoldService<S, M, R = Errors> {
    inner: S,
    client: LockClient,
    make_name: M,
    options: Options,
    respond: PhantomData<fn() -> R>,
}

impl<S, M, R> HoldService<S, M, R> {
    pub(crate) fn new(inner: S, client: LockClient, make_name: M, options: Options) -> Self {
        Self {
            inner,
            client,
            make_name,
            options,
            respond: PhantomData,
        }
    }

    /// The inner service.
    ///
    /// ```no_run
    /// # fn demo<S, M>(service: redlatch::layer::HoldService<S, M>) {
    /// let inner: &S = service.get_ref();
    /// # }
    /// ```
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    ///
    /// ```no_run
    /// # fn demo<S, M>(mut service: redlatch::layer::HoldService<S, M>) {
    /// let inner: &mut S = service.get_mut();
    /// # }
    /// ```
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, without the layer.
    ///
    /// ```no_run
    /// # fn demo<S, M>(service: redlatch::layer::HoldService<S, M>) {
    /// let inner: S = service.into_inner();
    /// # }
    /// ```
    pub fn into_inner(self) -> S {
        self.inner
    }

    fn plan<B>(&mut self, request: &Request<B>) -> Plan
    where
        M: MakeLockName<B>,
    {
        let Some(name) = self.make_name.make_lock_name(request) else {
            return Ok(None);
        };
        let owner = match &self.options.reentry {
            Some(header) => match request.headers().get(header) {
                Some(value) => Some(
                    value
                        .to_str()
                        .ok()
                        .and_then(|v| v.parse::<OwnerToken>().ok())
                        .ok_or_else(|| LayerError::BadOwner {
                            header: header.to_string(),
                        })?,
                ),
                None => None,
            },
            None => None,
        };
        Ok(Some(Job {
            client: self.client.clone(),
            target: self.options.target,
            name,
            wait: self.options.wait,
            owner,
            show_owner: self.options.reentry.is_some(),
            fixed_name: self.options.fixed_name,
        }))
    }
}

impl<S: Clone, M: Clone, R> Clone for HoldService<S, M, R> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            client: self.client.clone(),
            make_name: self.make_name.clone(),
            options: self.options.clone(),
            respond: PhantomData,
        }
    }
}

impl<S: fmt::Debug, M, R> fmt::Debug for HoldService<S, M, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HoldService")
            .field("inner", &self.inner)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl<S, M, R, ReqB, ResB> Service<Request<ReqB>> for HoldService<S, M, R>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    M: MakeLockName<ReqB>,
    ReqB: Send + 'static,
    ResB: Send + 'static,
    R: OnError<S::Error, ResB>,
{
    type Response = Response<HoldBody<ResB>>;
    type Error = R::Error;
    type Future = ResponseFuture<Result<Self::Response, R::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(R::inner_error)
    }

    fn call(&mut self, request: Request<ReqB>) -> Self::Future {
        let plan = self.plan(&request);
        // The readied service goes with the request; this one keeps a fresh clone.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        respond::<S, ReqB, ResB, R>(inner, request, plan, &self.options)
    }
}
