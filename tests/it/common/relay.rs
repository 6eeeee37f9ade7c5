//! [`TcpRelay`]: one stable address in front of a server the test can
//! swap, as a virtual IP or a DNS name that moves to another machine:
//! each connection is forwarded to the port the relay points at when it
//! is accepted, and a move cuts the connections already open. A relay
//! may also hold every byte for a fixed time each way
//! ([`TcpRelay::start_delayed`]): a link to another zone.

use super::*;

pub struct TcpRelay {
    port: u16,
    target: watch::Sender<u16>,
    task: tokio::task::JoinHandle<()>,
}

impl TcpRelay {
    /// A relay on a free port of 127.0.0.1, forwarding to `target` there.
    pub async fn start(target: u16) -> TcpRelay {
        TcpRelay::start_delayed(target, Duration::ZERO).await
    }

    /// A relay whose every byte arrives `delay` after it was sent, each
    /// way, in order.
    pub async fn start_delayed(target: u16, delay: Duration) -> TcpRelay {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("address").port();
        let (target, moved) = watch::channel(target);
        let task = tokio::spawn(async move {
            let mut connections = JoinSet::new();
            while let Ok((inbound, _)) = listener.accept().await {
                let mut moved = moved.clone();
                let to = *moved.borrow_and_update();
                connections.spawn(async move {
                    let (inbound, Ok(outbound)) =
                        (inbound, TcpStream::connect(("127.0.0.1", to)).await)
                    else {
                        return;
                    };
                    tokio::select! {
                        _ = relay(inbound, outbound, delay) => {}
                        _ = moved.changed() => {}
                    }
                });
                while connections.try_join_next().is_some() {}
            }
        });
        TcpRelay { port, target, task }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// From now on the address leads to `target`; every connection open
    /// through it is cut.
    pub fn move_to(&self, target: u16) {
        self.target.send_replace(target);
    }
}

impl Drop for TcpRelay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Copies both ways between `a` and `b` until either side ends, each chunk
/// `delay` late.
async fn relay(a: TcpStream, b: TcpStream, delay: Duration) {
    if delay.is_zero() {
        let (mut a, mut b) = (a, b);
        let _ = tokio::io::copy_bidirectional(&mut a, &mut b).await;
        return;
    }
    let (a_read, a_write) = a.into_split();
    let (b_read, b_write) = b.into_split();
    tokio::select! {
        _ = late_copy(a_read, b_write, delay) => {}
        _ = late_copy(b_read, a_write, delay) => {}
    }
}

/// Copies `from` to `to`, each chunk written `delay` after it was read.
async fn late_copy(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay: Duration,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (queue, mut due) =
        tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
    let writer = async move {
        while let Some((at, chunk)) = due.recv().await {
            tokio::time::sleep_until(at).await;
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
    };
    let reader = async move {
        let mut buffer = vec![0; 64 * 1024];
        while let Ok(n @ 1..) = from.read(&mut buffer).await {
            if queue
                .send((tokio::time::Instant::now() + delay, buffer[..n].to_vec()))
                .is_err()
            {
                return;
            }
        }
    };
    // The writer drains what was read before the reader ended.
    tokio::join!(reader, writer);
}
