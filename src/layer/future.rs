//! [`ResponseFuture`], and what it does for each request: acquire, call the inner service with
//! the hold in the request's extensions, watch the lease, release.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use tower_service::Service;

use super::options::{Options, Target, Wait};
use super::{HoldBody, LayerError, OnError, OnLost, RequestHold};
use crate::{HoldView, LockClient, Lost, MutexGuard, OwnerToken, SemaphorePermit};

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
///     LockLayer::new(client, |req: &Request<String>| redlatch::layer::decoded_path(req))
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

/// A lock or permit held for a request. The lock's guard is shared with the request's
/// [`RequestHold`] only weakly, so that the handler can read its owner token when it needs it
/// (and only then mark the hold as in use elsewhere) without keeping it past the request.
pub(crate) enum Taken {
    Lock(Arc<MutexGuard>),
    Permit(SemaphorePermit),
}

impl Taken {
    fn view(&self) -> HoldView {
        match self {
            Self::Lock(guard) => guard.view(),
            Self::Permit(permit) => permit.view(),
        }
    }

    pub(crate) fn name(&self) -> &str {
        match self {
            Self::Lock(guard) => guard.name(),
            Self::Permit(permit) => permit.name(),
        }
    }

    pub(crate) fn lost(&self) -> Lost {
        match self {
            Self::Lock(guard) => guard.lost(),
            Self::Permit(permit) => permit.lost(),
        }
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
    /// The name is the layer's own setting, not the request's.
    pub(crate) fixed_name: bool,
}

impl Job {
    /// Takes the lock or permit with the timed verbs of the public API: fail-fast is a zero
    /// timeout (one attempt, no queueing), and a timeout says how long the holder's lease had
    /// left, for `Retry-After`.
    async fn acquire(&self) -> Result<Taken, LayerError> {
        let limit = match self.wait {
            Wait::FailFast => Duration::ZERO,
            Wait::Timeout(limit) => limit,
        };
        let client = &self.client;
        let name = self.name.as_str();
        let result: crate::Result<Taken> = async {
            Ok(match (self.target, &self.owner) {
                (Target::Mutex, None) => {
                    Taken::Lock(Arc::new(client.mutex(name)?.lock_timeout(limit).await?))
                }
                (Target::Mutex, Some(owner)) => Taken::Lock(Arc::new(
                    client.mutex(name)?.lock_as_timeout(owner, limit).await?,
                )),
                (Target::FairMutex, None) => Taken::Lock(Arc::new(
                    client.fair_mutex(name)?.lock_timeout(limit).await?,
                )),
                (Target::FairMutex, Some(owner)) => Taken::Lock(Arc::new(
                    client
                        .fair_mutex(name)?
                        .lock_as_timeout(owner, limit)
                        .await?,
                )),
                (Target::Permit(permits), _) => Taken::Permit(
                    client
                        .semaphore(name, permits)?
                        .acquire_timeout(limit)
                        .await?,
                ),
            })
        }
        .await;
        let permit = matches!(self.target, Target::Permit(_));
        match result {
            Ok(taken) => Ok(taken),
            Err(crate::Error::Timeout { lease_left, .. }) => Err(match self.wait {
                Wait::FailFast => LayerError::Busy {
                    name: self.name.clone(),
                    permit,
                    retry_after: lease_left,
                },
                Wait::Timeout(waited) => LayerError::TimedOut {
                    name: self.name.clone(),
                    permit,
                    waited,
                    retry_after: lease_left,
                },
            }),
            Err(source) => Err(LayerError::Acquire {
                name: self.name.clone(),
                source: match source {
                    // The layer's own name, refused: the server's configuration, not the
                    // request, is at fault (a 500, not a 400).
                    crate::Error::InvalidArgument {
                        what: "name",
                        reason,
                    } if self.fixed_name => crate::Error::InvalidArgument {
                        what: "layer name",
                        reason,
                    },
                    source => source,
                },
            }),
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
    options: &Options,
) -> ResponseFuture<Result<Response<HoldBody<ResB>>, R::Error>>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Send + 'static,
    S::Future: Send + 'static,
    ReqB: Send + 'static,
    ResB: Send + 'static,
    R: OnError<S::Error, ResB>,
{
    let cancel = options.on_lost == OnLost::Cancel;
    let hold_body = options.hold_body;
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
            // Read (and the hold marked as in use elsewhere) only if the handler asks for it
            // (`RequestHold::owner`): a hold whose token never left keeps local hand-off and
            // its release once lost at its deadline.
            Taken::Lock(guard) if job.show_owner => Some(Arc::downgrade(guard)),
            _ => None,
        };
        request
            .extensions_mut()
            .insert(RequestHold::new(taken.view(), owner));
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
        let hold = hold_body.then_some(taken);
        Ok(response.map(|body| HoldBody::new(body, hold, cancel)))
    };
    ResponseFuture {
        inner: Box::pin(future),
    }
}
