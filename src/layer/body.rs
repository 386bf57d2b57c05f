//! [`HoldBody`]: the response body of a layered service.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::future::Taken;
use super::{BoxError, LayerError};
use crate::Lost;

pin_project! {
    /// The response body of a layered service: the inner service's body, which also keeps the
    /// hold when the layer holds it until the body ends
    /// ([`hold_until_body_end`](super::LockLayer::hold_until_body_end)), or the text of a
    /// [`LayerError`] answered with a status.
    ///
    /// # Drop
    ///
    /// A held lock or permit is released when the last frame has been read, or when the body
    /// is dropped unread (the client went away), in the background.
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
    pub struct HoldBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner {
            #[pin]
            body: B,
            hold: Option<Taken>,
            // Set when a lost lease ends the body (OnLost::Cancel).
            lost: Option<Lost>,
            // The body was ended early (lost lease): nothing more is read.
            ended: bool,
        },
        Message {
            text: Option<Bytes>,
        },
    }
}

impl<B> std::fmt::Debug for HoldBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let holding = matches!(&self.kind, Kind::Inner { hold: Some(_), .. });
        f.debug_struct("HoldBody")
            .field("holding", &holding)
            .finish_non_exhaustive()
    }
}

impl<B> HoldBody<B> {
    /// The inner body, keeping `hold` until it ends; with `cancel`, a lost lease ends the body
    /// with [`LayerError::LeaseLost`].
    pub(crate) fn new(body: B, hold: Option<Taken>, cancel: bool) -> Self {
        let lost = hold.as_ref().filter(|_| cancel).map(Taken::lost);
        Self {
            kind: Kind::Inner {
                body,
                hold,
                lost,
                ended: false,
            },
        }
    }

    /// A body of one frame of text.
    pub(crate) fn message(text: String) -> Self {
        Self {
            kind: Kind::Message {
                text: Some(Bytes::from(text)),
            },
        }
    }
}

impl<B> Body for HoldBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.project().kind.project() {
            KindProj::Message { text } => Poll::Ready(text.take().map(|t| Ok(Frame::data(t)))),
            KindProj::Inner {
                mut body,
                hold,
                lost,
                ended,
            } => {
                if *ended {
                    return Poll::Ready(None);
                }
                if let Some(signal) = lost
                    && Pin::new(signal).poll(cx).is_ready()
                {
                    *lost = None;
                    *ended = true;
                    let name = hold.take().map(|h| h.name().to_owned()).unwrap_or_default();
                    return Poll::Ready(Some(Err(Box::new(LayerError::LeaseLost { name }))));
                }
                let frame = std::task::ready!(body.as_mut().poll_frame(cx));
                let end = match &frame {
                    None | Some(Err(_)) => true,
                    Some(Ok(_)) => body.is_end_stream(),
                };
                if end {
                    // The body is done: let the hold go now, not when the body is dropped.
                    *hold = None;
                    *lost = None;
                }
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body, ended, .. } => *ended || body.is_end_stream(),
            Kind::Message { text } => text.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { ended: true, .. } => SizeHint::with_exact(0),
            Kind::Inner { body, .. } => body.size_hint(),
            Kind::Message { text } => {
                SizeHint::with_exact(text.as_ref().map_or(0, |t| t.len() as u64))
            }
        }
    }
}
