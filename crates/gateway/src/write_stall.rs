//! A client connection that takes nothing of what the gateway writes to it
//! is cut off.
//!
//! hyper stops reading a streamed answer's body while the client does not
//! read (its socket is full), and the upstream connection streaming that
//! answer waits with it: a few clients that stop reading would hold the
//! route's `max_upstream_connections` for as long as they liked.
//!
//! Invariant: a write to the client that stays pending for `bound` (no
//! byte of it taken) fails the connection with `TimedOut`, so hyper drops
//! it and every body it was sending, the upstream's included; a write that
//! makes progress starts the bound again, so a slow reader that keeps
//! reading is never cut. The timer is armed only while a write is pending.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use hyper::rt::{Read, ReadBufCursor, Write};

pin_project_lite::pin_project! {
    /// `io`, whose writes fail after `bound` without progress.
    pub struct WriteStall<I> {
        #[pin]
        io: I,
        bound: Duration,
        // Armed while a write is pending: when it fails.
        timer: Option<Pin<Box<tokio::time::Sleep>>>,
    }
}

impl<I> WriteStall<I> {
    pub fn new(io: I, bound: Duration) -> Self {
        WriteStall {
            io,
            bound,
            timer: None,
        }
    }
}

/// How a write that made no progress for `bound` fails.
fn stalled(bound: Duration) -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        format!(
            "the client took nothing the gateway wrote to it for {}",
            humantime::format_duration(bound)
        ),
    )
}

impl<I> WriteStall<I> {
    /// `polled`, a write's outcome: disarms on progress, arms on a first
    /// `Pending`, and fails once the armed timer runs out.
    fn bounded<T>(
        timer: &mut Option<Pin<Box<tokio::time::Sleep>>>,
        bound: Duration,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if polled.is_ready() {
            *timer = None;
            return polled;
        }
        let timer = timer.get_or_insert_with(|| Box::pin(tokio::time::sleep(bound)));
        ready!(timer.as_mut().poll(cx));
        Poll::Ready(Err(stalled(bound)))
    }
}

impl<I: Read> Read for WriteStall<I> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        self.project().io.poll_read(cx, buf)
    }
}

impl<I: Write> Write for WriteStall<I> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.project();
        let polled = this.io.poll_write(cx, buf);
        Self::bounded(this.timer, *this.bound, cx, polled)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.project();
        let polled = this.io.poll_write_vectored(cx, bufs);
        Self::bounded(this.timer, *this.bound, cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.project();
        let polled = this.io.poll_flush(cx);
        Self::bounded(this.timer, *this.bound, cx, polled)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().io.poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper_util::rt::TokioIo;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Writes `bytes` through `stall` with hyper's write trait.
    async fn write_all<I: Write + Unpin>(io: &mut WriteStall<I>, bytes: &[u8]) -> io::Result<()> {
        let mut written = 0;
        while written < bytes.len() {
            let n = std::future::poll_fn(|cx| Pin::new(&mut *io).poll_write(cx, &bytes[written..]))
                .await?;
            written += n;
        }
        Ok(())
    }

    #[tokio::test(start_paused = true)]
    async fn a_reader_that_takes_nothing_is_cut_and_a_slow_one_is_not() {
        let (near, mut far) = tokio::io::duplex(1024);
        let mut io = WriteStall::new(TokioIo::new(near), Duration::from_secs(10));
        // The pipe takes 1 KiB; the reader takes 512 bytes every 9 s, so
        // each pending write makes progress within the bound.
        let reader = tokio::spawn(async move {
            let mut chunk = [0u8; 512];
            for _ in 0..6 {
                tokio::time::sleep(Duration::from_secs(9)).await;
                far.read_exact(&mut chunk).await.unwrap();
            }
            // Then it stops reading, keeping its end open.
            tokio::time::sleep(Duration::from_secs(3600)).await;
            drop(far);
        });
        write_all(&mut io, &[1u8; 1024 + 6 * 512]).await.unwrap();
        let stalled = write_all(&mut io, &[1u8; 1]).await.unwrap_err();
        assert_eq!(stalled.kind(), io::ErrorKind::TimedOut);
        reader.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn reads_pass_through() {
        let (near, mut far) = tokio::io::duplex(64);
        let io = WriteStall::new(TokioIo::new(near), Duration::from_secs(1));
        far.write_all(b"ping").await.unwrap();
        let mut io = TokioIo::new(io);
        let mut got = [0u8; 4];
        io.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"ping");
    }
}
