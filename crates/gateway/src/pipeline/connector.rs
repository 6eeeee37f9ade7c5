//! The upstream connector: TCP, then TLS for `https://` (hyper-rustls), and
//! a connection that reads nothing before its first write.
//!
//! Invariant: a new connection's read side is not polled until the first
//! request bytes were written to it. hyper's HTTP/1 client reads an idle
//! connection to notice a close; when a new connection fails just as the
//! first request is handed to it (an upstream refusing the client
//! certificate after a TLS 1.3 handshake, which closes the connection at
//! that moment), that read could end the connection while the request was
//! being queued, and the request was then neither sent nor answered until
//! `upstream_timeout`, which recorded it `unknown` (seen in stress runs of
//! a few thousand refused handshakes). Reading after the first write
//! instead, the failure reaches the request itself, with its cause.
//!
//! A connector for claimed writes also carries the store's [`Fence`]: a
//! connection that came up after the fence stopped holding, or after it
//! lapsed while connecting (a connect that took long while the replica's
//! lease ran low), is dropped before anything is written to it, with
//! [`FenceDown`] as the connect error.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use http::Uri;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_rustls::{HttpsConnector, MaybeHttpsStream};
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use idemgate_store::Fence;

/// [`HttpsConnector`] whose connections are [`WriteFirst`], checked
/// against `fence` once up, if it has one.
#[derive(Clone)]
pub struct UpstreamConnector {
    pub(crate) https: HttpsConnector<HttpConnector>,
    pub(crate) fence: Option<Fence>,
}

/// The connect error of a connection refused by the fence: nothing was
/// written to it.
#[derive(Debug, thiserror::Error)]
#[error("this gateway can no longer prove its claim on the operation (its store lease ran low)")]
pub struct FenceDown;

type Inner = MaybeHttpsStream<TokioIo<TcpStream>>;
type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl tower_service::Service<Uri> for UpstreamConnector {
    type Response = WriteFirst;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<WriteFirst, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.https.poll_ready(cx)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connecting = self.https.call(uri);
        let permit = self.fence.as_ref().map(Fence::permit);
        Box::pin(async move {
            let inner = connecting.await?;
            if permit.is_some_and(|permit| !permit.holds()) {
                return Err(FenceDown.into());
            }
            Ok(WriteFirst {
                inner,
                written: false,
                reader: None,
            })
        })
    }
}

/// A connection whose reads wait for its first write (module doc).
pub struct WriteFirst {
    inner: Inner,
    written: bool,
    /// The read that waits, woken by the first write.
    reader: Option<Waker>,
}

impl WriteFirst {
    fn wrote(&mut self, result: &Poll<io::Result<usize>>) {
        if !self.written && matches!(result, Poll::Ready(Ok(n)) if *n > 0) {
            self.written = true;
            if let Some(reader) = self.reader.take() {
                reader.wake();
            }
        }
    }
}

impl Read for WriteFirst {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.written {
            self.reader = Some(cx.waker().clone());
            return Poll::Pending;
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl Write for WriteFirst {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.wrote(&result);
        result
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.wrote(&result);
        result
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl Connection for WriteFirst {
    fn connected(&self) -> Connected {
        self.inner.connected()
    }
}
