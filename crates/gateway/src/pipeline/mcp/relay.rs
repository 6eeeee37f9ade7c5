//! What an MCP server sends on a protected call's event stream before its
//! response — progress, and under 2025-11-25 its own requests (sampling,
//! elicitation) that the client must answer for the tool to go on —
//! relayed to the client as it comes (docs/mcp.md, "Outcomes").
//!
//! Invariants:
//! - the response itself is never relayed: it is recorded first, and the
//!   client hears it last, after every relayed event (one channel, in
//!   order);
//! - an event is relayed as its data alone, never with the upstream's
//!   `id` or `retry`: a client that reconnected with `Last-Event-ID` would
//!   have the server replay the response past the store;
//! - an event that carries no message (a comment, a `retry`, a 2025-11-25
//!   server's priming event: an `id` and empty data) is not relayed — its
//!   id withheld, it says nothing — and is not the server speaking for the
//!   call; any other data is both, whether or not it reads as JSON;
//! - relayed events are never stored, and what one call holds unread is
//!   bounded (the route's `max_stored_response`): past it a notification
//!   is dropped, never a request of the server's (the tool waits on its
//!   answer), and the call goes on;
//! - a client that stopped reading, or went away, never holds up the
//!   upstream read: relaying never waits.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use crate::body::{BoxError, ProxyBody};
use crate::pipeline::forward::EventAnswer;
use crate::pipeline::mcp::outcome;
use crate::pipeline::sse;

/// Where one call's relayed events go, within its byte budget.
#[derive(Debug, Clone)]
pub struct Relay {
    /// Each event with the bytes it took from the budget (a request of the
    /// server's takes what is left, however large it is).
    events: mpsc::UnboundedSender<(Bytes, usize)>,
    left: Arc<AtomicUsize>,
    /// Set once the server sent a message for the call before its
    /// response.
    spoke: Arc<std::sync::atomic::AtomicBool>,
}

/// The client's side of a [`Relay`]: what it takes gives the budget back.
#[derive(Debug)]
pub struct Relayed {
    events: mpsc::UnboundedReceiver<(Bytes, usize)>,
    left: Arc<AtomicUsize>,
}

impl Relayed {
    /// The next relayed event, once there is one; `None` once the relay
    /// is gone.
    pub async fn recv(&mut self) -> Option<Bytes> {
        std::future::poll_fn(|cx| self.poll_recv(cx)).await
    }

    /// A relayed event already there, if any.
    pub fn try_recv(&mut self) -> Option<Bytes> {
        let (event, took) = self.events.try_recv().ok()?;
        self.left.fetch_add(took, Ordering::SeqCst);
        Some(event)
    }

    fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        self.events.poll_recv(cx).map(|received| {
            let (event, took) = received?;
            self.left.fetch_add(took, Ordering::SeqCst);
            Some(event)
        })
    }
}

impl Relay {
    /// A relay that holds at most `budget` bytes unread, and its receiver.
    pub fn new(budget: usize) -> (Relay, Relayed) {
        let (events, relayed) = mpsc::unbounded_channel();
        let left = Arc::new(AtomicUsize::new(budget));
        let receiver = Relayed {
            events: relayed,
            left: left.clone(),
        };
        let spoke = Arc::default();
        (
            Relay {
                events,
                left,
                spoke,
            },
            receiver,
        )
    }

    /// Whether the server sent a message for the call before its response.
    pub fn spoke(&self) -> bool {
        self.spoke.load(Ordering::SeqCst)
    }

    /// Relays `event` (one message, written anew) if the budget has
    /// room, or whatever the budget if it is a request the client must
    /// answer; never waits.
    fn send(&self, event: Bytes, request: bool) {
        self.spoke.store(true, Ordering::SeqCst);
        let size = event.len();
        let taken = self
            .left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                left.checked_sub(size).or(request.then_some(0))
            });
        if let Ok(left) = taken {
            // What it took is given back when the client reads it: never
            // more than the budget.
            let took = size.min(left);
            // A client gone is no reason to stop reading the upstream.
            let _ = self.events.send((event, took));
        }
    }
}

/// Reads a call's event stream for its response (the one with its id),
/// relaying every other message.
pub struct CallEvents {
    pub(crate) id: Value,
    pub(crate) relay: Relay,
}

impl EventAnswer for CallEvents {
    fn take(&mut self, event: Bytes) -> Option<Bytes> {
        let messages = sse::messages(&event);
        let parsed: Vec<Option<Value>> = messages
            .iter()
            .map(|data| serde_json::from_str(data).ok())
            .collect();
        if parsed
            .iter()
            .flatten()
            .any(|message| outcome::answers(message, &self.id))
        {
            return Some(event);
        }
        for (data, message) in messages.iter().zip(&parsed) {
            // A request of the server's: it has a method and an id.
            let request = message
                .as_ref()
                .is_some_and(|m| m.get("method").is_some() && m.get("id").is_some());
            self.relay.send(sse::event(data.as_bytes()), request);
        }
        None
    }
}

/// An answer streamed to the client: the relayed events as they come,
/// then, once it is known, the tail (the recorded response as its last
/// event, or the rest of an answer too large to store).
pub struct Streamed {
    relayed: Relayed,
    queued: VecDeque<Bytes>,
    tail: Option<oneshot::Receiver<ProxyBody>>,
    rest: Option<ProxyBody>,
}

impl Streamed {
    /// The body that starts with `first`, goes on with `relayed`, and ends
    /// with the body `tail` brings.
    pub fn new(first: Bytes, relayed: Relayed, tail: oneshot::Receiver<ProxyBody>) -> Self {
        Streamed {
            relayed,
            queued: VecDeque::from([first]),
            tail: Some(tail),
            rest: None,
        }
    }
}

impl Body for Streamed {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if let Some(event) = this.queued.pop_front() {
            return Poll::Ready(Some(Ok(Frame::data(event))));
        }
        if let Some(rest) = &mut this.rest {
            return Pin::new(rest).poll_frame(cx);
        }
        if let Poll::Ready(Some(event)) = this.relayed.poll_recv(cx) {
            return Poll::Ready(Some(Ok(Frame::data(event))));
        }
        let Some(tail) = &mut this.tail else {
            return Poll::Ready(None);
        };
        match Pin::new(tail).poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(tail) => {
                this.tail = None;
                // Everything relayed was sent before the response was
                // recorded: it goes first.
                while let Some(event) = this.relayed.try_recv() {
                    this.queued.push_back(event);
                }
                this.rest = tail.ok();
                cx.waker().wake_by_ref();
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        false
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::body::full;
    use http_body_util::BodyExt;

    fn event(data: &str) -> Bytes {
        sse::event(data.as_bytes())
    }

    #[test]
    fn only_the_calls_response_is_kept_the_rest_relayed() {
        let (relay, mut relayed) = Relay::new(1024);
        let mut call = CallEvents {
            id: Value::from(7),
            relay,
        };
        let progress = event(r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{}}"#);
        let asking = event(r#"{"jsonrpc":"2.0","id":0,"method":"elicitation/create","params":{}}"#);
        let other = event(r#"{"jsonrpc":"2.0","id":8,"result":{}}"#);
        let response = event(r#"{"jsonrpc":"2.0","id":7.0,"result":{"content":[]}}"#);
        for relayed_event in [&progress, &asking, &other] {
            assert_eq!(call.take(relayed_event.clone()), None);
        }
        assert_eq!(call.take(response.clone()), Some(response));
        assert_eq!(relayed.try_recv().unwrap(), progress);
        assert_eq!(relayed.try_recv().unwrap(), asking);
        assert_eq!(relayed.try_recv().unwrap(), other);
        // Relayed as data alone: no upstream `id` or `retry` goes on.
        let with_id = Bytes::from_static(
            b"id: 41\nretry: 5\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"n\"}\n\n",
        );
        assert_eq!(call.take(with_id), None);
        assert_eq!(
            relayed.try_recv().unwrap(),
            event(r#"{"jsonrpc":"2.0","method":"n"}"#)
        );
    }

    #[test]
    fn what_one_call_holds_unread_is_bounded_but_requests_pass() {
        let (relay, mut relayed) = Relay::new(10);
        relay.send(Bytes::from_static(b"123456"), false);
        relay.send(Bytes::from_static(b"123456"), false);
        relay.send(Bytes::from_static(b"1234"), false);
        relay.send(Bytes::from_static(b"request"), true);
        assert_eq!(relayed.try_recv().unwrap(), "123456");
        assert_eq!(relayed.try_recv().unwrap(), "1234");
        assert_eq!(relayed.try_recv().unwrap(), "request");
        assert!(relayed.try_recv().is_none());
        // What the client took is room again, and never more than there was.
        assert_eq!(relay.left.load(Ordering::SeqCst), 10);
        relay.send(Bytes::from_static(b"123456789"), false);
        assert_eq!(relayed.try_recv().unwrap(), "123456789");
        relay.send(Bytes::from_static(b"a request larger than ten"), true);
        assert_eq!(relayed.try_recv().unwrap(), "a request larger than ten");
        assert_eq!(relay.left.load(Ordering::SeqCst), 10);
    }

    #[tokio::test]
    async fn the_tail_comes_after_every_relayed_event() {
        let (relay, relayed) = Relay::new(1024);
        let (tail_tx, tail_rx) = oneshot::channel();
        let body = Streamed::new(Bytes::from_static(b"a"), relayed, tail_rx);
        relay.send(Bytes::from_static(b"b"), false);
        relay.send(Bytes::from_static(b"c"), false);
        tail_tx.send(full("z")).unwrap();
        relay.send(Bytes::from_static(b"late"), false);
        drop(relay);
        let all = body.collect().await.unwrap().to_bytes();
        // Whatever was queued when the tail came goes first; the tail ends it.
        assert!(all.starts_with(b"abc"), "{all:?}");
        assert!(all.ends_with(b"z"), "{all:?}");
    }
}
