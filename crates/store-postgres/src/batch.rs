//! Group commit for PostgreSQL: the claims (and, apart, the records) of
//! every request waiting at a moment on this replica go to the database as
//! one multi-row statement — one round trip and one commit per batch
//! instead of one per request (ARCHITECTURE.md §4).
//!
//! Invariants:
//! - answered after the commit: a caller hears its result only once the
//!   statement that holds it committed;
//! - a batch is one statement, so it commits whole or not at all: a
//!   batch that fails fails every call in it (503), and none of their
//!   writes happened;
//! - a call that waited in the queue past [`QUEUE_TIMEOUT`] is refused
//!   unrun, so a caller told "busy" never has its claim committed later;
//! - a batch the database does not answer within [`BATCH_TIMEOUT`] fails
//!   its calls (503) instead of holding every later one behind it (a
//!   network partition). Such a batch may still commit on the server, as
//!   any statement whose connection broke after it was sent: its calls
//!   fail with [`StoreError::Unanswered`], so that the caller can find out
//!   afterwards what committed (`PostgresStore::claim`);
//! - one batch at a time per kind, in the order the calls were queued.

use std::future::Future;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

use idemgate_store::StoreBatches;
use idemgate_store::StoreError;

/// This module's log target (`idemgate_store`'s crate docs, "Log targets").
const TARGET: &str = "idemgate::store::postgres::batch";

/// The most calls one statement takes; more wait for the next one.
const MAX_BATCH: usize = 256;

/// Calls queued beyond this make callers wait to queue (backpressure).
const QUEUE: usize = 4096;

/// How long a call may wait for its batch before it is refused unrun.
pub(crate) const QUEUE_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a batch may wait for the database's answer.
pub(crate) const BATCH_TIMEOUT: Duration = Duration::from_secs(10);

type Reply<R> = oneshot::Sender<Result<R, StoreError>>;

/// The queue of one kind of call, and the task that sends its batches.
pub(crate) struct Batcher<J, R> {
    queue: mpsc::Sender<(Instant, J, Reply<R>)>,
}

impl<J: Send + 'static, R: Send + 'static> Batcher<J, R> {
    /// Starts the task that runs each batch through `run`, which returns
    /// one result per call, in the order given, within `timeout`, and
    /// counts each in `observed` under its kind.
    pub fn start<F, Fut>(timeout: Duration, observed: (&'static str, StoreBatches), run: F) -> Self
    where
        F: Fn(Vec<J>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<Vec<R>, StoreError>> + Send + 'static,
    {
        let (queue, receiver) = mpsc::channel(QUEUE);
        tokio::spawn(send_batches(receiver, timeout, observed, run));
        Batcher { queue }
    }

    /// Runs `job` in the next batch; its result once that batch committed.
    pub async fn call(&self, job: J) -> Result<R, StoreError> {
        let (reply, answer) = oneshot::channel();
        let queued = tokio::time::timeout(
            QUEUE_TIMEOUT,
            self.queue
                .send((Instant::now() + QUEUE_TIMEOUT, job, reply)),
        );
        match queued.await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return Err(StoreError::Closed),
            Err(_) => return Err(StoreError::Busy("the store's queue is full".into())),
        }
        answer.await.unwrap_or(Err(StoreError::Closed))
    }
}

/// The task: take whatever is queued, send it as one batch, answer
/// everyone in it, repeat; ends when every [`Batcher`] handle is gone.
async fn send_batches<J, R, F, Fut>(
    mut receiver: mpsc::Receiver<(Instant, J, Reply<R>)>,
    timeout: Duration,
    (kind, batches): (&'static str, StoreBatches),
    run: F,
) where
    F: Fn(Vec<J>) -> Fut,
    Fut: Future<Output = Result<Vec<R>, StoreError>>,
{
    let mut waiting = Vec::with_capacity(MAX_BATCH);
    while receiver.recv_many(&mut waiting, MAX_BATCH).await > 0 {
        let now = Instant::now();
        let (mut jobs, mut replies) = (Vec::new(), Vec::new());
        for (deadline, job, reply) in waiting.drain(..) {
            if deadline < now {
                let busy = format!(
                    "the store did not reach this call within {}",
                    humantime::format_duration(QUEUE_TIMEOUT)
                );
                drop(reply.send(Err(StoreError::Busy(busy))));
            } else {
                jobs.push(job);
                replies.push(reply);
            }
        }
        if jobs.is_empty() {
            continue;
        }
        let calls = jobs.len();
        let started = Instant::now();
        let answered = tokio::time::timeout(timeout, run(jobs)).await;
        batches.observe(kind, calls, started.elapsed());
        match answered.unwrap_or_else(|_| {
            Err(StoreError::Unanswered(format!(
                "the database did not answer within {}",
                humantime::format_duration(timeout)
            )))
        }) {
            Ok(results) if results.len() == calls => {
                for (reply, result) in replies.into_iter().zip(results) {
                    drop(reply.send(Ok(result)));
                }
            }
            Ok(results) => {
                // It committed, but which answer is whose cannot be told:
                // the callers find out what became of their calls.
                let reason = format!("a batch of {calls} calls returned {}", results.len());
                tracing::error!(target: TARGET, %reason, "a store batch answered wrongly");
                fail_all(replies, || StoreError::Unanswered(reason.clone()));
            }
            Err(error) if answer_lost(&error) => {
                tracing::error!(target: TARGET, %error, calls, "a store batch's answer was lost; it may have committed");
                let reason = error.to_string();
                fail_all(replies, || StoreError::Unanswered(reason.clone()));
            }
            Err(error) => {
                tracing::error!(target: TARGET, %error, calls, "a store batch did not commit");
                let reason = error.to_string();
                fail_all(replies, || StoreError::Failed(reason.clone()));
            }
        }
    }
}

/// Whether a batch that failed with `error` may have committed: its
/// statement was (or may have been) sent, and the connection broke or the
/// answer never came. An error the database answered with is a rollback.
fn answer_lost(error: &StoreError) -> bool {
    matches!(
        error,
        StoreError::Unanswered(_)
            | StoreError::Unavailable(
                sqlx::Error::Io(_) | sqlx::Error::Protocol(_) | sqlx::Error::WorkerCrashed
            )
    )
}

fn fail_all<R>(replies: Vec<Reply<R>>, error: impl Fn() -> StoreError) {
    for reply in replies {
        drop(reply.send(Err(error())));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn unobserved() -> (&'static str, StoreBatches) {
        ("test", StoreBatches::new(&[]))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_calls_share_batches_and_each_gets_its_own_result() {
        let batches = Arc::new(AtomicUsize::new(0));
        let counted = batches.clone();
        let batcher = Arc::new(Batcher::start(
            BATCH_TIMEOUT,
            unobserved(),
            move |jobs: Vec<u32>| {
                let counted = counted.clone();
                async move {
                    counted.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    Ok(jobs.into_iter().map(|j| j * 2).collect())
                }
            },
        ));
        let mut calls = tokio::task::JoinSet::new();
        for j in 0..200_u32 {
            let batcher = batcher.clone();
            calls.spawn(async move { (j, batcher.call(j).await) });
        }
        while let Some(done) = calls.join_next().await {
            let (j, result) = done.unwrap();
            assert_eq!(result.unwrap(), j * 2);
        }
        assert!(batches.load(Ordering::SeqCst) < 200, "calls were batched");
    }

    #[tokio::test]
    async fn a_failed_batch_fails_every_call_in_it() {
        let batcher = Arc::new(Batcher::start(
            BATCH_TIMEOUT,
            unobserved(),
            |_: Vec<u32>| async { Err::<Vec<u32>, _>(StoreError::Busy("down".into())) },
        ));
        let (a, b) = tokio::join!(batcher.call(1), batcher.call(2));
        assert!(matches!(a, Err(StoreError::Failed(reason)) if reason.contains("down")));
        assert!(matches!(b, Err(StoreError::Failed(_))));
    }

    /// Its statement committed: the calls hear that what became of them
    /// is to be found out, not that nothing happened.
    #[tokio::test]
    async fn a_batch_that_answers_wrongly_fails_its_calls_as_unanswered() {
        let batcher = Batcher::start(BATCH_TIMEOUT, unobserved(), |_: Vec<u32>| async {
            Ok(Vec::<u32>::new())
        });
        assert!(matches!(
            batcher.call(1).await,
            Err(StoreError::Unanswered(_))
        ));
    }

    #[tokio::test]
    async fn a_batch_the_database_never_answers_fails_and_the_next_one_runs() {
        let hung = Arc::new(AtomicUsize::new(0));
        let batcher = Batcher::start(
            Duration::from_millis(50),
            unobserved(),
            move |jobs: Vec<u32>| {
                let first = hung.fetch_add(1, Ordering::SeqCst) == 0;
                async move {
                    if first {
                        std::future::pending::<()>().await;
                    }
                    Ok(jobs)
                }
            },
        );
        // Sent and never answered: it may yet commit, and the caller hears so.
        let failed = batcher.call(1).await;
        assert!(
            matches!(failed, Err(StoreError::Unanswered(reason)) if reason.contains("did not answer"))
        );
        assert_eq!(batcher.call(2).await.unwrap(), 2);
    }
}
