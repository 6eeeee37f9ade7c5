//! Taking connections off a listening socket, the process out of file
//! descriptors included.
//!
//! An accept(2) that fails for want of a descriptor (EMFILE; ENFILE when
//! the whole system is out) leaves the connection in the kernel's backlog:
//! its client connected (the kernel completed the handshake) and waits
//! unanswered until a descriptor frees or it gives up, and a loop that
//! tries again would log every try. So each listener's [`Acceptor`] keeps
//! one descriptor spare: out of descriptors, it closes the spare, takes the
//! waiting connection with the descriptor that freed, resets it at once
//! and takes the spare again. The client is refused as soon as it
//! connects, and nothing of it was read, so its retry is safe. Each
//! refusal is counted (`idemgate_refused_connections_total`).
//!
//! Invariants:
//! - a connection [`Acceptor::accept`] returns is one to serve; one it
//!   refuses is reset unread;
//! - a run of failures is logged twice, not once a try: a warning at the
//!   first, and a line with how many connections were refused once a
//!   connection is accepted after [`QUIET`] without a failure (a listener
//!   at its limit, refusing and serving in turn, stays in one run).

use std::io;
use std::net::SocketAddr;
use std::os::unix::net::UnixDatagram;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

use crate::metrics::Metrics;

/// How long accepting must work before a run of failures is over.
const QUIET: Duration = Duration::from_secs(1);

/// The wait before trying again when a failure has no connection to
/// refuse (no spare to give up, or another error): what ends it is a
/// descriptor coming free, and trying sooner only spins.
const BACKOFF: Duration = Duration::from_millis(50);

/// A listener, its spare descriptor, and the run of failures it is in.
pub(crate) struct Acceptor {
    listener: TcpListener,
    /// `proxy` or `admin`, for logs and metrics.
    name: &'static str,
    /// Where each connection refused is counted.
    metrics: Arc<Metrics>,
    spare: Spare,
    trouble: Option<Trouble>,
}

/// The descriptor an [`Acceptor`] gives up to refuse a connection when
/// there is no other.
enum Spare {
    /// An unbound Unix datagram socket: it holds no file, port or address.
    Held { _descriptor: UnixDatagram },
    /// Closed for the next connection accepted, which is refused.
    GivenUp,
    /// Could not be taken again: the process is still out of descriptors.
    Missing,
}

impl Spare {
    fn take() -> Spare {
        UnixDatagram::unbound().map_or(Spare::Missing, |descriptor| Spare::Held {
            _descriptor: descriptor,
        })
    }
}

/// A run of failed accepts.
struct Trouble {
    since: Instant,
    last: Instant,
    failures: u64,
    refused: u64,
}

impl Acceptor {
    pub(crate) fn new(
        listener: TcpListener,
        name: &'static str,
        metrics: Arc<Metrics>,
    ) -> Acceptor {
        Acceptor {
            listener,
            name,
            metrics,
            spare: Spare::take(),
            trouble: None,
        }
    }

    /// The next connection to serve. Cancel-safe: a connection not
    /// returned is still in the backlog, or was refused.
    pub(crate) async fn accept(&mut self) -> (TcpStream, SocketAddr) {
        loop {
            match self.listener.accept().await {
                Ok((stream, _)) if matches!(self.spare, Spare::GivenUp) => {
                    self.refuse(stream);
                    self.spare = Spare::take();
                }
                Ok(accepted) => {
                    self.accepted();
                    return accepted;
                }
                Err(error) => self.failed(error).await,
            }
        }
    }

    /// Resets `stream` unread: the client sees its connection refused
    /// at once rather than closed after a wait.
    fn refuse(&mut self, stream: TcpStream) {
        // Dropped either way; without SO_LINGER 0 the client gets a FIN,
        // which reads as an empty answer.
        let _ = stream.set_zero_linger();
        self.metrics.refused_connection(self.name);
        if let Some(trouble) = &mut self.trouble {
            trouble.refused += 1;
        }
    }

    fn accepted(&mut self) {
        if matches!(self.spare, Spare::Missing) {
            self.spare = Spare::take();
        }
        let Some(trouble) = self.trouble.take_if(|t| t.last.elapsed() >= QUIET) else {
            return;
        };
        tracing::warn!(
            listener = self.name,
            refused = trouble.refused,
            failures = trouble.failures,
            lasted = %humantime::format_duration(round_to_ms(trouble.last - trouble.since)),
            "file descriptors free: accepting connections again"
        );
    }

    async fn failed(&mut self, error: io::Error) {
        let now = Instant::now();
        let trouble = self.trouble.get_or_insert_with(|| {
            if out_of_descriptors(&error) {
                tracing::warn!(listener = self.name, %error, "out of file descriptors: new connections are refused until some close (docs/deploying.md, \"File descriptors\")");
            } else {
                tracing::warn!(listener = self.name, %error, "accept failed; trying again");
            }
            Trouble {
                since: now,
                last: now,
                failures: 0,
                refused: 0,
            }
        });
        trouble.failures += 1;
        trouble.last = now;
        match std::mem::replace(&mut self.spare, Spare::GivenUp) {
            // Closed: the next accept takes its descriptor.
            Spare::Held { .. } if out_of_descriptors(&error) => {}
            held @ Spare::Held { .. } => {
                self.spare = held;
                tokio::time::sleep(BACKOFF).await;
            }
            // Another thread took the descriptor the spare freed, or it
            // could not be taken again.
            Spare::GivenUp | Spare::Missing => {
                tokio::time::sleep(BACKOFF).await;
                self.spare = Spare::take();
            }
        }
    }
}

/// Whether accept failed for want of a file descriptor: EMFILE (this
/// process's limit) or ENFILE (the system's), 24 and 23 on Linux and the
/// BSDs; std names neither as an `ErrorKind`.
fn out_of_descriptors(error: &io::Error) -> bool {
    matches!(error.raw_os_error(), Some(23 | 24))
}

fn round_to_ms(duration: Duration) -> Duration {
    Duration::from_millis(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX))
}
