//! What the layers fail with, and the two ways of reporting it: as an error, or as a status.

use std::time::Duration;

use http::{HeaderValue, StatusCode, header};

use super::HoldBody;

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

/// Why a request was not served under its lock or permit. The services' errors downcast to it
/// (`err.downcast_ref::<LayerError>()`); with `respond_with_status` it becomes a response
/// instead ([`status`](Self::status), [`retry_after`](Self::retry_after)).
///
/// ```
/// use std::time::Duration;
/// use http::StatusCode;
/// use redlatch::layer::LayerError;
///
/// let err = LayerError::Busy {
///     name: "orders:7".into(),
///     permit: false,
///     retry_after: Some(Duration::from_millis(1500)),
/// };
/// assert_eq!(err.status(), StatusCode::LOCKED);
/// assert_eq!(err.retry_after(), Some(2));
/// let boxed: redlatch::layer::BoxError = Box::new(err);
/// assert!(boxed.downcast_ref::<LayerError>().is_some());
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LayerError {
    /// Fail-fast mode found the lock held, or no permit free.
    #[error("`{name}` is busy")]
    Busy {
        /// The lock's (or semaphore's) name.
        name: String,
        /// A semaphore permit was asked for, not a lock.
        permit: bool,
        /// How long until the holder's lease could run out, if known.
        retry_after: Option<Duration>,
    },
    /// The wait for the lock or a permit ran out.
    #[error("timed out after {waited:?} waiting for `{name}`")]
    TimedOut {
        /// The lock's (or semaphore's) name.
        name: String,
        /// A semaphore permit was asked for, not a lock.
        permit: bool,
        /// How long the request waited.
        waited: Duration,
        /// How long until the holder's lease could run out, if known.
        retry_after: Option<Duration>,
    },
    /// The lease was lost while the handler ran, and the handler was stopped
    /// ([`OnLost::Cancel`](super::OnLost::Cancel)).
    #[error("the lease on `{name}` was lost while the request ran")]
    LeaseLost {
        /// The lock's (or semaphore's) name.
        name: String,
    },
    /// The re-entry header did not hold an owner token.
    #[error("header `{header}` does not hold an owner token")]
    BadOwner {
        /// The header's name.
        header: String,
    },
    /// Acquiring failed: Redis unreachable, an unusable name, foreign data under the key, ...
    #[error("could not acquire `{name}`")]
    Acquire {
        /// The lock's (or semaphore's) name.
        name: String,
        /// What went wrong.
        #[source]
        source: crate::Error,
    },
}

impl LayerError {
    /// The status a response for this error carries: `423 Locked` for a busy or timed-out lock,
    /// `503 Service Unavailable` for a semaphore with no permit free, a lost lease or Redis
    /// out of reach, `400 Bad Request` for a bad owner header or a name made from the request
    /// that cannot be used, and `500 Internal Server Error` for what the request cannot
    /// change: the layer's own settings refused (a semaphore of 0 permits, a fixed name of
    /// [`PermitLayer::new`](super::PermitLayer::new) that cannot be used, reported as an
    /// invalid `layer name`, a lease the client cannot use, a fair lock or permits on a Redlock
    /// client), foreign data
    /// or another layout under the key, a semaphore in use with another capacity, an
    /// unexpected reply.
    ///
    /// ```
    /// use redlatch::layer::LayerError;
    ///
    /// let lost = LayerError::LeaseLost { name: "a".into() };
    /// assert_eq!(lost.status(), http::StatusCode::SERVICE_UNAVAILABLE);
    /// let mismatch = LayerError::Acquire {
    ///     name: "a".into(),
    ///     source: redlatch::Error::CapacityMismatch { name: "a".into(), ours: 2, theirs: 3 },
    /// };
    /// assert_eq!(mismatch.status(), http::StatusCode::INTERNAL_SERVER_ERROR);
    /// ```
    pub fn status(&self) -> StatusCode {
        match self {
            Self::Busy { permit: false, .. } | Self::TimedOut { permit: false, .. } => {
                StatusCode::LOCKED
            }
            Self::BadOwner { .. }
            | Self::Acquire {
                source: crate::Error::InvalidArgument { what: "name", .. },
                ..
            } => StatusCode::BAD_REQUEST,
            Self::Acquire {
                source:
                    crate::Error::InvalidArgument { .. }
                    | crate::Error::Unsupported { .. }
                    | crate::Error::CapacityMismatch { .. }
                    | crate::Error::WrongType { .. }
                    | crate::Error::Layout { .. }
                    | crate::Error::Upgrade { .. }
                    | crate::Error::Protocol { .. },
                ..
            } => StatusCode::INTERNAL_SERVER_ERROR,
            _ => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// Whole seconds for a `Retry-After` header (at least 1): how long until the holder's lease
    /// could run out, for busy and timed-out requests.
    ///
    /// ```
    /// use std::time::Duration;
    /// use redlatch::layer::LayerError;
    ///
    /// let err = LayerError::TimedOut {
    ///     name: "a".into(),
    ///     permit: true,
    ///     waited: Duration::from_secs(2),
    ///     retry_after: Some(Duration::from_millis(200)),
    /// };
    /// assert_eq!(err.retry_after(), Some(1));
    /// ```
    pub fn retry_after(&self) -> Option<u64> {
        match self {
            Self::Busy { retry_after, .. } | Self::TimedOut { retry_after, .. } => retry_after
                .map(|d| (d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0))).max(1)),
            _ => None,
        }
    }

    /// The status, `Retry-After` and text of a response for this error.
    fn parts(&self) -> (StatusCode, Option<HeaderValue>, String) {
        (
            self.status(),
            self.retry_after().map(HeaderValue::from),
            self.to_string(),
        )
    }

    /// This error as a response with a plain-text body.
    pub(crate) fn into_http<B>(self) -> http::Response<HoldBody<B>> {
        let (status, retry_after, text) = self.parts();
        let mut response = http::Response::new(HoldBody::message(text));
        *response.status_mut() = status;
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        if let Some(value) = retry_after {
            headers.insert(header::RETRY_AFTER, value);
        }
        response
    }
}

/// The response [`status`](LayerError::status), with `Retry-After` when known and the error's
/// text as the body: a handler may return a `LayerError` itself.
///
/// ```
/// use axum::response::IntoResponse;
/// use redlatch::layer::LayerError;
///
/// let response = LayerError::LeaseLost { name: "a".into() }.into_response();
/// assert_eq!(response.status(), http::StatusCode::SERVICE_UNAVAILABLE);
/// ```
#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
impl axum_core::response::IntoResponse for LayerError {
    /// The status, `Retry-After` and message of [`status`](Self::status) and
    /// [`retry_after`](Self::retry_after), for axum's `HandleErrorLayer` and handlers.
    fn into_response(self) -> axum_core::response::Response {
        let (status, retry_after, text) = self.parts();
        let mut response = (status, text).into_response();
        if let Some(value) = retry_after {
            response.headers_mut().insert(header::RETRY_AFTER, value);
        }
        response
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::Errors {}
    impl Sealed for super::Statuses {}
}

/// How a layer reports a [`LayerError`]: [`Errors`] (the default) or [`Statuses`]. Sealed.
///
/// ```
/// use redlatch::layer::{Errors, LayerError, OnError};
///
/// let err = LayerError::LeaseLost { name: "a".into() };
/// let reported = <Errors as OnError<std::convert::Infallible, ()>>::layer_error(err);
/// assert!(reported.is_err());
/// ```
pub trait OnError<E, B>: sealed::Sealed {
    /// The service's error type.
    type Error;
    /// A layer error, as the service reports it.
    fn layer_error(err: LayerError) -> Result<http::Response<HoldBody<B>>, Self::Error>;
    /// An error of the inner service, as the service reports it.
    fn inner_error(err: E) -> Self::Error;
}

/// Report layer errors as errors: the service's error is a [`BoxError`] that downcasts to
/// [`LayerError`] (or is the inner service's error).
///
/// ```no_run
/// use redlatch::layer::{Errors, LockLayer};
///
/// # fn demo(client: redlatch::LockClient) {
/// // The default: `LockLayer<_, Errors>`.
/// let layer: LockLayer<_, Errors> =
///     LockLayer::new(client, |req: &http::Request<()>| redlatch::layer::decoded_path(req));
/// # }
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct Errors;

/// Report layer errors as responses with a status ([`LayerError::status`]): the service fails
/// only when the inner service does, so axum takes it with a plain `.layer(...)`.
///
/// ```no_run
/// use redlatch::layer::{LockLayer, Statuses};
///
/// # fn demo(client: redlatch::LockClient) {
/// let layer: LockLayer<_, Statuses> =
///     LockLayer::new(client, |req: &http::Request<()>| redlatch::layer::decoded_path(req))
///         .respond_with_status();
/// # }
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct Statuses;

impl<E: Into<BoxError>, B> OnError<E, B> for Errors {
    type Error = BoxError;

    fn layer_error(err: LayerError) -> Result<http::Response<HoldBody<B>>, BoxError> {
        Err(Box::new(err))
    }

    fn inner_error(err: E) -> BoxError {
        err.into()
    }
}

impl<E, B> OnError<E, B> for Statuses {
    type Error = E;

    fn layer_error(err: LayerError) -> Result<http::Response<HoldBody<B>>, E> {
        Ok(err.into_http())
    }

    fn inner_error(err: E) -> E {
        err
    }
}
