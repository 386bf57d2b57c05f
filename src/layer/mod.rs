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
//! lease; `400 Bad Request` for a request whose lock name or owner header is refused, `500` for
//! what the client cannot serve or data redlatch did not write: see
//! [`LayerError::status`]), so the service never fails and axum's `Router::layer` takes it as
//! it is.
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
//! an [`OwnerToken`](crate::OwnerToken) in that header re-enters the hold of the service that
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
//!     .route("/resources/{id}", post(update))
//!     // At most 8 requests at once across every instance.
//!     .route_layer(PermitLayer::new(client.clone(), "api", 8).respond_with_status())
//!     // One request per resource at a time, fleet-wide (the layer added last runs first: a
//!     // request waits for its resource before it takes one of the 8).
//!     .route_layer(
//!         LockLayer::new(client, |req: &Request| redlatch::layer::decoded_path(req))
//!             .respond_with_status(),
//!     );
//! # }
//! ```

mod body;
mod error;
mod future;
mod lock;
mod name;
mod options;
mod permit;
mod request_hold;
mod service;

pub use body::HoldBody;
pub use error::{BoxError, Errors, LayerError, OnError, Statuses};
pub use future::ResponseFuture;
pub use lock::LockLayer;
pub use name::{FixedName, MakeLockName, decoded_path};
pub use options::OnLost;
pub use permit::PermitLayer;
pub use request_hold::RequestHold;
pub use service::HoldService;
