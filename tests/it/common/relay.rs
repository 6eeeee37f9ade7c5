//! [`TcpRelay`]: one stable address in front of a server the test can
//! swap, as a virtual IP or a DNS name that moves to another machine:
//! each connection is forwarded to the port the relay points at when it
//! is accepted, and a move cuts the connections already open.

use super::*;

pub struct TcpRelay {
    port: u16,
    target: watch::Sender<u16>,
    task: tokio::task::JoinHandle<()>,
}

impl TcpRelay {
    /// A relay on a free port of 127.0.0.1, forwarding to `target` there.
    pub async fn start(target: u16) -> TcpRelay {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("address").port();
        let (target, moved) = watch::channel(target);
        let task = tokio::spawn(async move {
            let mut connections = JoinSet::new();
            while let Ok((inbound, _)) = listener.accept().await {
                let mut moved = moved.clone();
                let to = *moved.borrow_and_update();
                connections.spawn(async move {
                    let (mut inbound, Ok(mut outbound)) =
                        (inbound, TcpStream::connect(("127.0.0.1", to)).await)
                    else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
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
