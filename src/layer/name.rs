//! Where a request's lock name comes from: [`MakeLockName`], [`FixedName`] for one name for
//! every request, and [`decoded_path`] for a name of a request's path.

use std::sync::Arc;

/// Makes the name of the lock (or semaphore) a request is served under; `None` lets the request
/// through without one. Implemented for closures `FnMut(&http::Request<B>) -> Option<N>` where
/// `N: Into<String>`.
///
/// ```
/// use http::Request;
/// use redlatch::layer::MakeLockName;
///
/// /// One lock per tenant, from a header; requests without one are not limited.
/// #[derive(Clone)]
/// struct ByTenant;
///
/// impl<B> MakeLockName<B> for ByTenant {
///     fn make_lock_name(&mut self, request: &Request<B>) -> Option<String> {
///         let tenant = request.headers().get("x-tenant")?.to_str().ok()?;
///         Some(format!("tenant:{tenant}"))
///     }
/// }
///
/// let request = Request::builder().header("x-tenant", "acme").body(()).unwrap();
/// assert_eq!(ByTenant.make_lock_name(&request).as_deref(), Some("tenant:acme"));
/// ```
pub trait MakeLockName<B> {
    /// The name for `request`, or `None` to serve it without a lock.
    fn make_lock_name(&mut self, request: &http::Request<B>) -> Option<String>;
}

impl<B, F, N> MakeLockName<B> for F
where
    F: FnMut(&http::Request<B>) -> Option<N>,
    N: Into<String>,
{
    fn make_lock_name(&mut self, request: &http::Request<B>) -> Option<String> {
        self(request).map(Into::into)
    }
}

/// One name for every request: what [`PermitLayer::new`](super::PermitLayer::new) uses.
///
/// ```
/// use redlatch::layer::{FixedName, MakeLockName};
///
/// let request = http::Request::new(());
/// assert_eq!(FixedName::new("api").make_lock_name(&request).as_deref(), Some("api"));
/// ```
#[derive(Debug, Clone)]
pub struct FixedName(Arc<str>);

impl FixedName {
    /// Every request gets `name`.
    ///
    /// ```
    /// let name = redlatch::layer::FixedName::new("reports");
    /// # let _ = name;
    /// ```
    pub fn new(name: impl Into<Arc<str>>) -> Self {
        Self(name.into())
    }
}

impl<B> MakeLockName<B> for FixedName {
    fn make_lock_name(&mut self, _request: &http::Request<B>) -> Option<String> {
        Some(self.0.to_string())
    }
}

/// The request's path, percent-decoded, as a router decodes the path parameters it hands a
/// handler: `None` when it does not decode to UTF-8. A lock name made from it is the same for
/// every spelling of one path (`/items/42`, `/items/%34%32`, `%c3%a9` or `%C3%A9`), where
/// `uri().path()` would give each spelling a lock of its own, and let two requests for one
/// resource in at once.
///
/// ```
/// use redlatch::layer::decoded_path;
///
/// let plain = http::Request::get("/items/42").body(()).unwrap();
/// let encoded = http::Request::get("/items/%34%32").body(()).unwrap();
/// assert_eq!(decoded_path(&plain).as_deref(), Some("/items/42"));
/// assert_eq!(decoded_path(&encoded).as_deref(), Some("/items/42"));
/// let not_text = http::Request::get("/items/%ff").body(()).unwrap();
/// assert_eq!(decoded_path(&not_text), None);
/// ```
pub fn decoded_path<B>(request: &http::Request<B>) -> Option<String> {
    percent_encoding::percent_decode_str(request.uri().path())
        .decode_utf8()
        .ok()
        .map(std::borrow::Cow::into_owned)
}
