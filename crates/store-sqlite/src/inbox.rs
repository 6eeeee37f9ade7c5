//! Where the writer thread's answers go: an inbox per calling thread.
//!
//! Waking a tokio task from another thread costs that thread a system call
//! when the task's runtime runs on one thread, as the proxy's workers do
//! (`workers.rs`): the runtime's I/O driver is woken through an eventfd,
//! asleep or not. Answering every call of a batch on a oneshot of its own
//! cost the writer — the one thread all first writes queue for — two such
//! calls per first write (its claim, its record). So the writer hands a
//! batch's answers to the inbox of the thread each call came from, waking
//! each inbox once per batch, and the inbox's delivery task, on the
//! caller's runtime, completes the calls' oneshots: a wake-up within one
//! thread costs no system call.
//!
//! Invariants:
//! - every answer handed to an inbox whose delivery task runs is delivered,
//!   in the order handed;
//! - an inbox whose delivery task ended (its runtime shut down, and the
//!   callers on it with it) is replaced at the next call from its thread;
//! - [`Inboxes::close`] (the writer stopping or dropped) ends every delivery
//!   task once it has delivered what it holds.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::ThreadId;

use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// An answer the writer computed, delivered on the caller's thread.
pub trait Answer: Send {
    fn deliver(self: Box<Self>);
}

/// Answers handed over together.
pub type Answers = Vec<Box<dyn Answer>>;

/// The inboxes of the threads that call one writer.
#[derive(Default)]
pub(crate) struct Inboxes {
    /// std Mutex: never held across `.await`.
    by_thread: Mutex<HashMap<ThreadId, Delivery>>,
}

/// A thread's inbox and the task that delivers from it.
struct Delivery {
    inbox: Arc<Inbox>,
    task: JoinHandle<()>,
}

/// The answers waiting for one thread's delivery task.
pub(crate) struct Inbox {
    answers: Mutex<Answers>,
    arrived: Notify,
    closed: AtomicBool,
}

thread_local! {
    /// `thread::current().id()` without cloning the current thread's handle.
    static THREAD: ThreadId = std::thread::current().id();
}

impl Inboxes {
    fn by_thread(&self) -> MutexGuard<'_, HashMap<ThreadId, Delivery>> {
        self.by_thread
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The current thread's inbox, its delivery task started on the
    /// current runtime if it has none running. Call from a task.
    pub fn here(&self) -> Arc<Inbox> {
        let thread = THREAD.with(|id| *id);
        let mut by_thread = self.by_thread();
        if let Some(delivery) = by_thread.get(&thread)
            && !delivery.task.is_finished()
        {
            return delivery.inbox.clone();
        }
        let inbox = Arc::new(Inbox {
            answers: Mutex::default(),
            arrived: Notify::new(),
            closed: AtomicBool::new(false),
        });
        let task = tokio::spawn(deliver(inbox.clone()));
        let delivery = Delivery {
            inbox: inbox.clone(),
            task,
        };
        by_thread.insert(thread, delivery);
        inbox
    }

    /// Ends every delivery task once it has delivered what it holds.
    pub fn close(&self) {
        for (_, Delivery { inbox, .. }) in self.by_thread().drain() {
            inbox.closed.store(true, Ordering::SeqCst);
            inbox.arrived.notify_one();
        }
    }
}

impl Inbox {
    /// An inbox no task delivers from, for tests that deliver by hand.
    #[cfg(test)]
    pub(crate) fn unattended() -> Arc<Inbox> {
        Arc::new(Inbox {
            answers: Mutex::default(),
            arrived: Notify::new(),
            closed: AtomicBool::new(false),
        })
    }

    /// Hands `answers` over, with one wake-up of the delivery task.
    pub fn hand(&self, answers: Answers) {
        self.answers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(answers);
        self.arrived.notify_one();
    }
}

/// The delivery task: whatever arrived, delivered, until closed.
async fn deliver(inbox: Arc<Inbox>) {
    loop {
        inbox.arrived.notified().await;
        let answers =
            std::mem::take(&mut *inbox.answers.lock().unwrap_or_else(PoisonError::into_inner));
        for answer in answers {
            answer.deliver();
        }
        if inbox.closed.load(Ordering::SeqCst) {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::sync::oneshot;

    struct Reply(u32, oneshot::Sender<(u32, ThreadId)>);

    impl Answer for Reply {
        fn deliver(self: Box<Self>) {
            let _ = self.1.send((self.0, std::thread::current().id()));
        }
    }

    #[tokio::test]
    async fn answers_handed_from_another_thread_arrive_on_the_callers_thread() {
        let inboxes = Arc::new(Inboxes::default());
        let inbox = inboxes.here();
        assert!(Arc::ptr_eq(&inbox, &inboxes.here()), "one inbox per thread");
        let (answers, receivers): (Answers, Vec<_>) = (0..3)
            .map(|n| {
                let (tx, rx) = oneshot::channel();
                (Box::new(Reply(n, tx)) as Box<dyn Answer>, rx)
            })
            .unzip();
        std::thread::spawn(move || inbox.hand(answers));
        for (n, receiver) in receivers.into_iter().enumerate() {
            let (got, thread) = tokio::time::timeout(Duration::from_secs(5), receiver)
                .await
                .expect("delivered")
                .unwrap();
            assert_eq!(got, n as u32);
            assert_eq!(thread, std::thread::current().id());
        }
        inboxes.close();
    }

    #[test]
    fn an_inbox_whose_runtime_ended_is_replaced() {
        let inboxes = Inboxes::default();
        let first = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(async { inboxes.here() });
        // That runtime is gone, and its delivery task with it.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let second = inboxes.here();
            assert!(!Arc::ptr_eq(&first, &second));
            let (tx, rx) = oneshot::channel();
            second.hand(vec![Box::new(Reply(7, tx))]);
            assert_eq!(rx.await.unwrap().0, 7);
        });
    }
}
