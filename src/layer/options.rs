//! What a layer is configured with, and the builder methods [`LockLayer`](super::LockLayer) and
//! [`PermitLayer`](super::PermitLayer) share, written once (the `shared_options!` macro).

use std::time::Duration;

use http::HeaderName;

/// What a layer takes for each request.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Target {
    Mutex,
    FairMutex,
    /// One permit of a semaphore with this many.
    Permit(u32),
}

/// How long a request waits for its lock or permit (set with `fail_fast` and `wait_timeout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wait {
    /// One attempt: if it is busy, fail at once with [`LayerError::Busy`](super::LayerError::Busy).
    FailFast,
    /// Wait up to this long, then fail with
    /// [`LayerError::TimedOut`](super::LayerError::TimedOut).
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
    /// Drop the handler's future (and a held body) and fail with
    /// [`LayerError::LeaseLost`](super::LayerError::LeaseLost).
    #[default]
    Cancel,
    /// Let the handler finish; [`RequestHold::is_held`](super::RequestHold::is_held) turns
    /// false and [`RequestHold::lost`](super::RequestHold::lost) completes, for the handler to
    /// look at.
    Flag,
}

/// Everything a layer is configured with.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    pub(crate) target: Target,
    pub(crate) wait: Wait,
    pub(crate) on_lost: OnLost,
    pub(crate) hold_body: bool,
    /// The header that carries an owner token to re-enter (locks only).
    pub(crate) reentry: Option<HeaderName>,
    /// The name is the layer's own setting ([`PermitLayer::new`](super::PermitLayer::new)), not
    /// the request's: a name the client refuses is the server's error.
    pub(crate) fixed_name: bool,
}

impl Options {
    pub(crate) fn new(target: Target) -> Self {
        Self {
            target,
            wait: Wait::default(),
            on_lost: OnLost::default(),
            hold_body: false,
            reentry: None,
            fixed_name: false,
        }
    }
}

/// The builder methods, `Clone`, `Debug` and `Layer` of a layer type with the fields `client`,
/// `make_name`, `options` and `respond`. `$new` is an expression that makes one, for the
/// examples.
macro_rules! shared_options {
    ($layer:ident, $new:literal) => {
        impl<M, R> $layer<M, R> {
            /// Do not wait: a request whose lock is held, or that finds no permit free, fails
            /// at once with [`LayerError::Busy`](super::LayerError::Busy) (one attempt, which
            /// does not queue).
            ///
            /// ```no_run
            /// # fn demo(client: redlatch::LockClient) {
            #[doc = concat!("let layer = ", $new, ".fail_fast();")]
            /// # }
            /// ```
            #[must_use]
            pub fn fail_fast(mut self) -> Self {
                self.options.wait = $crate::layer::options::Wait::FailFast;
                self
            }

            /// Wait up to `limit` for the lock or permit, then fail with
            /// [`LayerError::TimedOut`](super::LayerError::TimedOut). Default: 10 s.
            ///
            /// ```no_run
            /// # fn demo(client: redlatch::LockClient) {
            #[doc = concat!("let layer = ", $new, ".wait_timeout(std::time::Duration::from_millis(500));")]
            /// # }
            /// ```
            #[must_use]
            pub fn wait_timeout(mut self, limit: std::time::Duration) -> Self {
                self.options.wait = $crate::layer::options::Wait::Timeout(limit);
                self
            }

            /// What to do if the lease is lost while the handler runs. Default:
            /// [`OnLost::Cancel`](super::OnLost::Cancel).
            ///
            /// ```no_run
            /// # fn demo(client: redlatch::LockClient) {
            #[doc = concat!("let layer = ", $new, ".on_lease_lost(redlatch::layer::OnLost::Flag);")]
            /// # }
            /// ```
            #[must_use]
            pub fn on_lease_lost(mut self, on_lost: super::OnLost) -> Self {
                self.options.on_lost = on_lost;
                self
            }

            /// Hold the lock or permit until the response body has been read to its end (or
            /// dropped), not just until the response head. Default: off.
            ///
            /// The hold then lasts as long as the client takes to read the body, and the
            /// watchdog renews it meanwhile: a client that stops reading without closing the
            /// connection keeps the name taken until the server drops the body. Serve such
            /// routes with a write or idle timeout (hyper and `axum::serve` have none by
            /// default), for instance `tower_http::timeout`'s body timeout.
            ///
            /// ```no_run
            /// # fn demo(client: redlatch::LockClient) {
            #[doc = concat!("let layer = ", $new, ".hold_until_body_end();")]
            /// # }
            /// ```
            #[must_use]
            pub fn hold_until_body_end(mut self) -> Self {
                self.options.hold_body = true;
                self
            }

            /// Answer busy, timed-out and failed requests with a status
            /// ([`LayerError::status`](super::LayerError::status), with `Retry-After` where it
            /// is known) instead of failing: the service's error becomes the inner service's,
            /// so axum's `Router::layer` accepts it.
            ///
            /// ```no_run
            /// # fn demo(client: redlatch::LockClient) {
            #[doc = concat!("let layer = ", $new, ".respond_with_status();")]
            /// # }
            /// ```
            #[must_use]
            pub fn respond_with_status(self) -> $layer<M, super::Statuses> {
                $layer {
                    client: self.client,
                    make_name: self.make_name,
                    options: self.options,
                    respond: std::marker::PhantomData,
                }
            }
        }

        impl<M: Clone, R> Clone for $layer<M, R> {
            fn clone(&self) -> Self {
                Self {
                    client: self.client.clone(),
                    make_name: self.make_name.clone(),
                    options: self.options.clone(),
                    respond: std::marker::PhantomData,
                }
            }
        }

        impl<M, R> std::fmt::Debug for $layer<M, R> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($layer))
                    .field("options", &self.options)
                    .finish_non_exhaustive()
            }
        }

        impl<S, M: Clone, R> tower_layer::Layer<S> for $layer<M, R> {
            type Service = super::HoldService<S, M, R>;

            fn layer(&self, inner: S) -> Self::Service {
                super::HoldService::new(
                    inner,
                    self.client.clone(),
                    self.make_name.clone(),
                    self.options.clone(),
                )
            }
        }
    };
}

pub(crate) use shared_options;
