//! The threads that serve proxy connections: one single-threaded tokio
//! runtime per thread, each connection living on one of them from accept
//! to close (`StartOptions::workers`, `server.rs`).
//!
//! Measured against tokio's work-stealing scheduler on 2 CPUs (callgrind
//! and wrk, `benches/README.md`): with every task of a connection — its
//! HTTP/1 state machine, its upstream connection (`pipeline::pool`),
//! its write's attempt — on one thread and one I/O driver, a request's
//! wake-ups stay on that thread (no work stealing, no cross-thread wakes
//! between a connection and its upstream), which is how nginx's workers
//! run too. Whatever must be shared (the store's writer, the in-flight map,
//! the replay cache) already is, behind `Arc`s and channels.
//!
//! Invariant: [`Workers`] owns its threads. Dropping it stops every
//! runtime (tasks still on them are dropped, as at the end of `main`) and
//! joins the threads, so nothing outlives it.

use std::thread::JoinHandle;

use tokio::runtime::{Builder, Handle};
use tokio::sync::oneshot;

/// Runtimes on threads of their own, for a gateway's proxy connections.
pub struct Workers {
    handles: Vec<Handle>,
    /// Each thread's stop signal and the thread.
    threads: Vec<(oneshot::Sender<()>, JoinHandle<()>)>,
}

impl Workers {
    /// `count` threads named `idemgate-worker-N`, each running a
    /// single-threaded runtime with I/O and timers.
    pub fn start(count: usize) -> std::io::Result<Workers> {
        let mut workers = Workers {
            handles: Vec::with_capacity(count),
            threads: Vec::with_capacity(count),
        };
        for n in 0..count {
            let runtime = Builder::new_current_thread().enable_all().build()?;
            let (stop, stopped) = oneshot::channel::<()>();
            workers.handles.push(runtime.handle().clone());
            let thread = std::thread::Builder::new()
                .name(format!("idemgate-worker-{n}"))
                .spawn(move || {
                    // Sender dropped or fired: either way, stop.
                    let _ = runtime.block_on(stopped);
                })?;
            workers.threads.push((stop, thread));
        }
        Ok(workers)
    }

    /// The runtimes, to spread connections over.
    pub fn handles(&self) -> &[Handle] {
        &self.handles
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for (stop, thread) in self.threads.drain(..) {
            let _ = stop.send(());
            if thread.join().is_err() {
                tracing::error!("a worker thread panicked");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn each_runtime_runs_on_a_thread_of_its_own_until_dropped() {
        let workers = Workers::start(3).unwrap();
        let threads: HashSet<String> = workers
            .handles()
            .iter()
            .map(|handle| {
                let (tx, rx) = std::sync::mpsc::channel();
                handle.spawn(async move {
                    let name = std::thread::current().name().map(str::to_string);
                    let _ = tx.send(name);
                });
                rx.recv_timeout(std::time::Duration::from_secs(5))
                    .expect("the worker ran the task")
                    .expect("named")
            })
            .collect();
        assert_eq!(threads.len(), 3, "{threads:?}");
        assert!(
            threads
                .iter()
                .all(|name| name.starts_with("idemgate-worker-"))
        );
        // A task that never ends does not keep the threads alive.
        let forever = workers.handles()[0].spawn(std::future::pending::<()>());
        drop(workers);
        assert!(forever.is_finished());
    }
}
