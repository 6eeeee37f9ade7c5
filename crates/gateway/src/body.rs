//! Body types shared by the server, the upstream client and the replies:
//! everything idemgate sends is a [`ProxyBody`], either bytes it holds or a
//! stream it passes through.

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A request or response body idemgate sends.
pub type ProxyBody = BoxBody<Bytes, BoxError>;

/// The body length a request's head declares (`Content-Length`), if any:
/// what lets a limit answer before the body is polled, and so before
/// hyper sends `100 Continue`.
pub(crate) fn declared_length(headers: &http::HeaderMap) -> Option<u64> {
    headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

/// The HTTP/2 error under `error` (hyper's, a body's), if one caused it.
pub(crate) fn h2_cause<'e>(error: &'e (dyn std::error::Error + 'static)) -> Option<&'e h2::Error> {
    std::iter::successors(Some(error), |e| e.source())
        .take(16)
        .find_map(|e| e.downcast_ref::<h2::Error>())
}

/// A body of bytes held in memory (hyper sends it with a Content-Length).
pub fn full(bytes: impl Into<Bytes>) -> ProxyBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

/// A streamed body, passed through as it arrives.
pub fn stream<B>(body: B) -> ProxyBody
where
    B: http_body::Body<Data = Bytes> + Send + Sync + 'static,
    B::Error: Into<BoxError>,
{
    body.map_err(Into::into).boxed()
}

/// A client's request body failed as it was passed through (malformed
/// framing, a stream reset before its end): the client's fault, not the
/// upstream's.
#[derive(Debug, thiserror::Error)]
#[error("the request body could not be read: {0}")]
pub struct ClientBodyError(pub(crate) BoxError);

impl ClientBodyError {
    /// The one under `error` (an upstream exchange's), if the client's
    /// body is what failed it.
    pub fn under<'e>(error: &'e (dyn std::error::Error + 'static)) -> Option<&'e ClientBodyError> {
        std::iter::successors(Some(error), |e| e.source())
            .take(16)
            .find_map(|e| e.downcast_ref::<ClientBodyError>())
    }
}

pin_project_lite::pin_project! {
    /// A client's request body passed through to the upstream: its errors
    /// are [`ClientBodyError`]s, and on HTTP/2 it fails rather than ends
    /// when its stream ended without END_STREAM — hyper hands a client's
    /// `RST_STREAM(NO_ERROR)` on as the body's end, and the upstream would
    /// otherwise take the part that came for the whole request.
    pub struct ClientBody<B> {
        #[pin]
        inner: B,
        http2: bool,
    }
}

impl<B> ClientBody<B> {
    pub fn new(inner: B, version: http::Version) -> Self {
        ClientBody {
            inner,
            http2: version == http::Version::HTTP_2,
        }
    }
}

impl<B> http_body::Body for ClientBody<B>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        let this = self.project();
        let mut inner = this.inner;
        let failed = |error: BoxError| Some(Err(Box::new(ClientBodyError(error)) as BoxError));
        std::task::Poll::Ready(match std::task::ready!(inner.as_mut().poll_frame(cx)) {
            None if *this.http2 && !inner.is_end_stream() => {
                failed("the client reset its stream before its body ended".into())
            }
            None => None,
            Some(Err(error)) => failed(error.into()),
            Some(Ok(frame)) => Some(Ok(frame)),
        })
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

pin_project_lite::pin_project! {
    /// A body whose first bytes were already read (while deciding whether the
    /// response fits the store), followed by the rest as it streams.
    pub struct Prefixed<B> {
        prefix: Option<Bytes>,
        #[pin]
        rest: B,
    }
}

impl<B> Prefixed<B> {
    pub fn new(prefix: Bytes, rest: B) -> Self {
        Prefixed {
            prefix: (!prefix.is_empty()).then_some(prefix),
            rest,
        }
    }
}

impl<B> http_body::Body for Prefixed<B>
where
    B: http_body::Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        let this = self.project();
        if let Some(prefix) = this.prefix.take() {
            return std::task::Poll::Ready(Some(Ok(http_body::Frame::data(prefix))));
        }
        this.rest.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.prefix.is_none() && self.rest.is_end_stream()
    }
}

pin_project_lite::pin_project! {
    /// A streamed body that fails ([`Stalled`]) when, while it is read, no
    /// frame comes for `idle`: an upstream that went silent mid-answer
    /// does not hold the client's connection, nor its own, for ever. The
    /// clock runs only while the reader waits on the body (not while it
    /// has not asked yet: the record before the client hears, or a client
    /// that reads slowly), and starts again at every frame, so an answer
    /// that keeps coming is never cut however long it takes in all.
    pub struct IdleTimeout<B> {
        #[pin]
        body: B,
        idle: std::time::Duration,
        #[pin]
        timer: tokio::time::Sleep,
        // The timer runs for the frame being waited for.
        armed: bool,
    }
}

impl<B> IdleTimeout<B> {
    /// `body`, failing after `idle` without a frame (made in a runtime).
    pub fn new(body: B, idle: std::time::Duration) -> Self {
        IdleTimeout {
            body,
            idle,
            timer: tokio::time::sleep(idle),
            armed: false,
        }
    }
}

/// Why an [`IdleTimeout`] body failed.
#[derive(Debug, thiserror::Error)]
#[error("the upstream sent nothing more for {}", humantime::format_duration(*idle))]
pub struct Stalled {
    idle: std::time::Duration,
}

impl<B> http_body::Body for IdleTimeout<B>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        use std::future::Future;
        use std::task::Poll;
        let mut this = self.project();
        if let Poll::Ready(frame) = this.body.poll_frame(cx) {
            *this.armed = false;
            return Poll::Ready(frame.map(|frame| frame.map_err(Into::into)));
        }
        if !*this.armed {
            let deadline = tokio::time::Instant::now() + *this.idle;
            this.timer.as_mut().reset(deadline);
            *this.armed = true;
        }
        match this.timer.poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(Stalled { idle: *this.idle }.into()))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// A body that sends one part and then fails, so hyper cuts the response
/// short of its Content-Length: the mock upstream's (and the tests')
/// truncated response. Between the two it is pending once, waking itself
/// at once: hyper's HTTP/1 server drops what it has not written yet when a
/// body fails, and it writes out what it buffered (the head, the part)
/// when the body is pending, before it polls the body again — failing at
/// the next poll would send nothing at all, a dropped connection rather
/// than a cut body.
pub struct CutShort {
    part: Option<Bytes>,
    /// Whether the body has been pending since its part.
    flushed: bool,
}

impl CutShort {
    pub fn new(part: Bytes) -> Self {
        CutShort {
            part: Some(part),
            flushed: false,
        }
    }
}

impl http_body::Body for CutShort {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        if let Some(part) = self.part.take() {
            return std::task::Poll::Ready(Some(Ok(http_body::Frame::data(part))));
        }
        if !std::mem::replace(&mut self.flushed, true) {
            cx.waker().wake_by_ref();
            return std::task::Poll::Pending;
        }
        std::task::Poll::Ready(Some(Err("cut short on purpose".into())))
    }
}
