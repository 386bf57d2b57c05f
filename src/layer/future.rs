//! [`ResponseFuture`], and what it does for each request: acquire, call the inner service with
//! the hold in the request's extensions, watch the lease, release.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use tower_service::Service;

use super::{HoldBody, LayerError, OnError, OnLost, Policy, RequestHold, Wait};
use crate::client::LockClient;
use crate::lease::{Held, Lost};
use crate::mutex::MutexGuard;
use crate::semaphore::SemaphorePermit;
use crate::token::OwnerToken;
use crate::wait::{Attempt, Claim};

/// The response future of the layered services. It takes the lock (or permit), calls the inner
/// service, and lets the hold go when it completes (or, with `hold_until_body_end`, hands it to
/// the body).
///
/// # Cancel safety
///
/// Dropping it (the client went away) drops the inner service's future and releases the lock
/// in the background, at once; a lock acquisition on its way is released too.
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
///     LockLayer::new(client, |req: &Request<String>| Some(req.uri().path().to_owned()))
///         .layer(handler);
/// let future: ResponseFuture<_> =
///     service.ready().await?.call(Request::new(String::new()));
/// let response: Response<HoldBody<String>> = future.await?;
/// # let _ = response;
/// # Ok(())
/// # }
/// ```
#[must_use = "futures do nothing unless polled"]
pub struct ResponseFuture<T> {
    inner: Pin<Box<dyn Future<Output = T> + Send>>,
}

impl<T> fmt::Debug for ResponseFuture<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<T> Future for ResponseFuture<T> {
    type Output = T;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        self.inner.as_mut().poll(cx)
    }
}

/// What a layer takes for each request.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Target {
    Mutex,
    FairMutex,
    /// One permit of a semaphore with this many.
    Permit(u32),
}

/// A lock or permit held for a request.
pub(crate) enum Taken {
    Lock(MutexGuard),
    Permit(SemaphorePermit),
}

impl Taken {
    fn held(&self) -> &Held {
        match self {
            Self::Lock(guard) => guard.held(),
            Self::Permit(permit) => permit.held(),
        }
    }

    pub(crate) fn name(&self) -> &str {
        &self.held().hold().name
    }

    pub(crate) fn lost(&self) -> Lost {
        self.held().lost()
    }
}

/// One request's acquisition.
pub(crate) struct Job {
    pub(crate) client: LockClient,
    pub(crate) target: Target,
    pub(crate) name: String,
    pub(crate) wait: Wait,
    /// The owner carried in the re-entry header, if any.
    pub(crate) owner: Option<OwnerToken>,
    /// Show the owner to the handler (re-entry is configured).
    pub(crate) show_owner: bool,
}

impl Job {
    async fn acquire(&self) -> Result<Taken, LayerError> {
        let failed = |source| LayerError::Acquire {
            name: self.name.clone(),
            source,
        };
        let permit = matches!(self.target, Target::Permit(_));
        match self.wait {
            Wait::FailFast => match self.attempt().await.map_err(failed)? {
                Attempt::Acquired(taken) => Ok(taken),
                Attempt::Busy(retry_after) => Err(LayerError::Busy {
                    name: self.name.clone(),
                    permit,
                    retry_after,
                }),
            },
            Wait::Timeout(limit) => match self.wait_up_to(limit).await {
                Ok(taken) => Ok(taken),
                // One more attempt tells how long the holder's lease has left (and takes the
                // lock if it has just come free).
                Err(crate::Error::Timeout { .. }) => match self.attempt().await.map_err(failed)? {
                    Attempt::Acquired(taken) => Ok(taken),
                    Attempt::Busy(retry_after) => Err(LayerError::TimedOut {
                        name: self.name.clone(),
                        permit,
                        waited: limit,
                        retry_after,
                    }),
                },
                Err(err) => Err(failed(err)),
            },
        }
    }

    /// One attempt without waiting.
    async fn attempt(&self) -> crate::Result<Attempt<Taken>> {
        let (owner, claim) = match self.owner {
            Some(owner) => (owner, Claim::As),
            None => (OwnerToken::new(), Claim::New),
        };
        Ok(match self.target {
            Target::Mutex => self
                .client
                .mutex(&self.name)?
                .try_attempt(owner, claim)
                .await?
                .map(Taken::Lock),
            Target::FairMutex => self
                .client
                .fair_mutex(&self.name)?
                .try_attempt(owner, claim)
                .await?
                .map(Taken::Lock),
            Target::Permit(permits) => self
                .client
                .semaphore(&self.name, permits)?
                .try_attempt(1)
                .await?
                .map(Taken::Permit),
        })
    }

    async fn wait_up_to(&self, limit: Duration) -> crate::Result<Taken> {
        let timed_out = |_| crate::Error::Timeout { waited: limit };
        match (self.target, &self.owner) {
            (Target::Mutex, None) => Ok(Taken::Lock(
                self.client.mutex(&self.name)?.lock_timeout(limit).await?,
            )),
            (Target::Mutex, Some(owner)) => {
                let mutex = self.client.mutex(&self.name)?;
                let guard = tokio::time::timeout(limit, mutex.lock_as(owner)).await;
                Ok(Taken::Lock(guard.map_err(timed_out)??))
            }
            (Target::FairMutex, None) => Ok(Taken::Lock(
                self.client
                    .fair_mutex(&self.name)?
                    .lock_timeout(limit)
                    .await?,
            )),
            (Target::FairMutex, Some(owner)) => {
                let mutex = self.client.fair_mutex(&self.name)?;
                let guard = tokio::time::timeout(limit, mutex.lock_as(owner)).await;
                Ok(Taken::Lock(guard.map_err(timed_out)??))
            }
            (Target::Permit(permits), _) => Ok(Taken::Permit(
                self.client
                    .semaphore(&self.name, permits)?
                    .acquire_timeout(limit)
                    .await?,
            )),
        }
    }
}

/// What to do for one request: `Ok(None)` to pass it through, `Ok(Some(job))` to serve it under
/// a hold, `Err` to refuse it.
pub(crate) type Plan = Result<Option<Job>, LayerError>;

/// The response future for one request: runs the plan, then the inner service.
pub(crate) fn respond<S, ReqB, ResB, R>(
    mut inner: S,
    mut request: Request<ReqB>,
    plan: Plan,
    policy: Policy,
) -> ResponseFuture<Result<Response<HoldBody<ResB>>, R::Error>>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Send + 'static,
    S::Future: Send + 'static,
    ReqB: Send + 'static,
    ResB: Send + 'static,
    R: OnError<S::Error, ResB>,
{
    let cancel = policy.on_lost == OnLost::Cancel;
    let future = async move {
        let job = match plan {
            Ok(Some(job)) => job,
            Ok(None) => {
                let response = inner.call(request).await.map_err(R::inner_error)?;
                return Ok(response.map(|body| HoldBody::new(body, None, false)));
            }
            Err(err) => return R::layer_error(err),
        };
        let taken = match job.acquire().await {
            Ok(taken) => taken,
            Err(err) => return R::layer_error(err),
        };
        let owner = match &taken {
            Taken::Lock(guard) if job.show_owner => Some(*guard.owner()),
            _ => None,
        };
        request
            .extensions_mut()
            .insert(RequestHold::new(taken.held(), owner));
        let call = inner.call(request);
        let response = if cancel {
            let lost = taken.lost();
            tokio::select! {
                biased;
                response = call => response,
                () = lost => {
                    tracing::warn!(lock = %job.name, "lease lost while serving a request: cancelled");
                    return R::layer_error(LayerError::LeaseLost { name: job.name });
                }
            }
        } else {
            call.await
        };
        let response = response.map_err(R::inner_error)?;
        // Without `hold_until_body_end`, `taken` is dropped here and released in the
        // background: the hold ends with the response head.
        let hold = policy.hold_body.then_some(taken);
        Ok(response.map(|body| HoldBody::new(body, hold, cancel)))
    };
    ResponseFuture {
        inner: Box::pin(future),
    }
}
