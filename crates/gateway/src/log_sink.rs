//! Where log lines go: a buffer in memory that a thread of its own writes
//! out in batches, so logging never waits on stderr and never wakes a
//! thread per line.
//!
//! A request's access line is one short copy into the buffer under a lock
//! (never held across a write to the output). The writer thread swaps the
//! buffer out every [`FLUSH_EVERY`], or sooner once [`FLUSH_AT`] bytes are
//! waiting, and writes it with one call. When the output is slower than the
//! lines (a stalled pipe), at most [`MAX_PENDING`] bytes wait; lines past
//! that are dropped and counted, and the count is written once the output
//! takes bytes again: requests are never delayed by their logs.
//!
//! (A per-line channel to a writer thread, as tracing-appender does, woke
//! that thread for nearly every line under load: a futex wake and a spin of
//! `sched_yield` calls per request, ~5% of the gateway's CPU in a
//! first-write benchmark.)

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use tracing_subscriber::fmt::MakeWriter;

/// The longest a line waits in memory before it is written.
pub const FLUSH_EVERY: Duration = Duration::from_millis(50);

/// Waiting bytes that wake the writer thread before its next tick.
pub const FLUSH_AT: usize = 64 * 1024;

/// The most bytes that wait for a slow output; lines beyond are dropped.
pub const MAX_PENDING: usize = 4 * 1024 * 1024;

struct Shared {
    pending: Mutex<Vec<u8>>,
    wake: Condvar,
    stopping: AtomicBool,
    dropped: AtomicU64,
}

impl Shared {
    fn pending(&self) -> MutexGuard<'_, Vec<u8>> {
        // A panic while appending leaves at worst a partial line: keep going.
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The sink: hand it to `tracing_subscriber::fmt().with_writer(…)` and to
/// the access log (`access_log.rs`).
#[derive(Clone)]
pub struct LogSink {
    shared: Arc<Shared>,
}

/// Keeps the writer thread; dropping it writes what is waiting and ends it.
pub struct FlushGuard {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl LogSink {
    /// A sink writing to `output` from a thread of its own.
    pub fn start<W: Write + Send + 'static>(output: W) -> std::io::Result<(LogSink, FlushGuard)> {
        let shared = Arc::new(Shared {
            pending: Mutex::new(Vec::with_capacity(FLUSH_AT)),
            wake: Condvar::new(),
            stopping: AtomicBool::new(false),
            dropped: AtomicU64::new(0),
        });
        let thread = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("idemgate-log".into())
                .spawn(move || write_out(&shared, output))?
        };
        let guard = FlushGuard {
            shared: shared.clone(),
            thread: Some(thread),
        };
        Ok((LogSink { shared }, guard))
    }

    /// Appends whole lines, or drops and counts them if [`MAX_PENDING`]
    /// bytes already wait.
    pub fn append(&self, line: &[u8]) {
        let mut pending = self.shared.pending();
        if pending.len() + line.len() > MAX_PENDING {
            self.shared.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let was_below = pending.len() < FLUSH_AT;
        pending.extend_from_slice(line);
        if was_below && pending.len() >= FLUSH_AT {
            self.shared.wake.notify_one();
        }
    }
}

/// One event's bytes, appended to the sink as written.
pub struct SinkWriter<'a> {
    sink: &'a LogSink,
}

impl Write for SinkWriter<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.sink.append(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for LogSink {
    type Writer = SinkWriter<'a>;

    fn make_writer(&'a self) -> Self::Writer {
        SinkWriter { sink: self }
    }
}

impl Drop for FlushGuard {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        self.shared.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The writer thread: wait for a tick or a full buffer, swap, write, repeat;
/// once stopping, write what is left and end.
fn write_out<W: Write>(shared: &Shared, mut output: W) {
    let mut batch = Vec::with_capacity(FLUSH_AT);
    loop {
        let stopping = {
            let mut pending = shared.pending();
            if pending.len() < FLUSH_AT && !shared.stopping.load(Ordering::SeqCst) {
                pending = shared
                    .wake
                    .wait_timeout(pending, FLUSH_EVERY)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            std::mem::swap(&mut *pending, &mut batch);
            shared.stopping.load(Ordering::SeqCst)
        };
        // Nowhere to report a failing stderr: the lines are lost either way.
        if !batch.is_empty() {
            let _ = output.write_all(&batch);
        }
        let dropped = shared.dropped.swap(0, Ordering::Relaxed);
        if dropped > 0 {
            let _ = writeln!(
                output,
                "idemgate: {dropped} log lines dropped: the log output was too slow"
            );
        }
        let _ = output.flush();
        batch.clear();
        if stopping {
            break;
        }
    }
}

/// An output that keeps what it is given, shared with the test that
/// reads it: a sink's output, or a subscriber's writer.
#[cfg(test)]
#[derive(Clone, Default)]
pub(crate) struct Kept(Arc<Mutex<Vec<u8>>>);

#[cfg(test)]
impl Kept {
    /// Everything written so far.
    pub(crate) fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

#[cfg(test)]
impl Write for Kept {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
impl<'a> MakeWriter<'a> for Kept {
    type Writer = Kept;
    fn make_writer(&'a self) -> Kept {
        self.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Instant;

    fn log(sink: &LogSink, line: &str) {
        sink.make_writer().write_all(line.as_bytes()).unwrap();
    }

    #[test]
    fn lines_arrive_in_order_within_a_tick_and_all_by_the_guard() {
        let kept = Kept::default();
        let (sink, guard) = LogSink::start(kept.clone()).unwrap();
        log(&sink, "one\n");
        log(&sink, "two\n");
        let deadline = Instant::now() + Duration::from_secs(5);
        while kept.text().is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(kept.text(), "one\ntwo\n", "written within a tick");
        log(&sink, "three\n");
        drop(guard);
        assert_eq!(
            kept.text(),
            "one\ntwo\nthree\n",
            "the guard writes the rest"
        );
    }

    /// An output stuck in its first write until the test lets it go.
    struct Stuck {
        entered: mpsc::Sender<()>,
        release: Arc<(Mutex<bool>, Condvar)>,
        kept: Kept,
    }

    impl Write for Stuck {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            let _ = self.entered.send(());
            let (released, turn) = &*self.release;
            let mut released = released.lock().unwrap();
            while !*released {
                released = turn.wait(released).unwrap();
            }
            self.kept.write(bytes)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_stuck_output_never_blocks_logging_and_drops_are_counted() {
        let (entered, stuck) = mpsc::channel();
        let release = Arc::new((Mutex::new(false), Condvar::new()));
        let kept = Kept::default();
        let output = Stuck {
            entered,
            release: release.clone(),
            kept: kept.clone(),
        };
        let (sink, guard) = LogSink::start(output).unwrap();
        log(&sink, "first\n");
        stuck
            .recv_timeout(Duration::from_secs(5))
            .expect("the writer is inside its first write");

        // More than MAX_PENDING while the output is stuck: every call
        // returns at once, and what does not fit is dropped.
        let line = format!("{}\n", "x".repeat(1023));
        let lines = MAX_PENDING / line.len() + 100;
        let started = Instant::now();
        for _ in 0..lines {
            log(&sink, &line);
        }
        assert!(started.elapsed() < Duration::from_secs(5), "logging waited");

        *release.0.lock().unwrap() = true;
        release.1.notify_all();
        drop(guard);
        let text = kept.text();
        assert!(text.starts_with("first\n"));
        let written = text.matches(&line).count();
        assert_eq!(written, MAX_PENDING / line.len());
        assert!(
            text.contains(&format!("{} log lines dropped", lines - written)),
            "{}",
            &text[text.len() - 100..]
        );
    }
}
