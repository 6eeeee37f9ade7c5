//! What an MCP server sends on a protected call's event stream before its
//! response — progress, and under 2025-11-25 its own requests (sampling,
//! elicitation) that the client must answer for the tool to go on —
//! relayed to the client as it comes (docs/mcp.md, "Outcomes").
//!
//! Invariants:
//! - the response itself is never relayed: it is recorded first, and the
//!   client hears it last, after every relayed event (one channel, in
//!   order);
//! - relayed events are never stored, and what one call relays is bounded
//!   (the route's `max_stored_response`): past it they are dropped, the
//!   call goes on;
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
use crate::pipeline::sse;

/// Where one call's relayed events go, within its byte budget.
#[derive(Debug, Clone)]
pub struct Relay {
    events: mpsc::UnboundedSender<Bytes>,
    left: Arc<AtomicUsize>,
}

/// The client's side of a [`Relay`].
pub type Relayed = mpsc::UnboundedReceiver<Bytes>;

impl Relay {
    /// A relay that carries at most `budget` bytes, and its receiver.
    pub fn new(budget: usize) -> (Relay, Relayed) {
        let (events, relayed) = mpsc::unbounded_channel();
        let left = Arc::new(AtomicUsize::new(budget));
        (Relay { events, left }, relayed)
    }

    /// Relays `event` if the budget has room; never waits.
    fn send(&self, event: Bytes) {
        let size = event.len();
        let taken = self
            .left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                left.checked_sub(size)
            });
        if taken.is_ok() {
            // A client gone is no reason to stop reading the upstream.
            let _ = self.events.send(event);
        }
    }
}

/// Reads a call's event stream for its response (the one with its id),
/// relaying every other event.
pub struct CallEvents {
    pub id: Value,
    pub relay: Relay,
}

impl EventAnswer for CallEvents {
    fn take(&mut self, event: Bytes) -> Option<Bytes> {
        let answers = sse::messages(&event).iter().any(|data| {
            serde_json::from_str::<Value>(data).is_ok_and(|message| {
                message.get("id") == Some(&self.id)
                    && (message.get("result").is_some() || message.get("error").is_some())
            })
        });
        if answers {
            return Some(event);
        }
        self.relay.send(event);
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
                while let Ok(event) = this.relayed.try_recv() {
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
        let response = event(r#"{"jsonrpc":"2.0","id":7,"result":{"content":[]}}"#);
        for relayed_event in [&progress, &asking, &other] {
            assert_eq!(call.take(relayed_event.clone()), None);
        }
        assert_eq!(call.take(response.clone()), Some(response));
        assert_eq!(relayed.try_recv().unwrap(), progress);
        assert_eq!(relayed.try_recv().unwrap(), asking);
        assert_eq!(relayed.try_recv().unwrap(), other);
    }

    #[test]
    fn what_one_call_relays_is_bounded() {
        let (relay, mut relayed) = Relay::new(10);
        relay.send(Bytes::from_static(b"123456"));
        relay.send(Bytes::from_static(b"123456"));
        relay.send(Bytes::from_static(b"1234"));
        assert_eq!(relayed.try_recv().unwrap(), "123456");
        assert_eq!(relayed.try_recv().unwrap(), "1234");
        assert!(relayed.try_recv().is_err());
    }

    #[tokio::test]
    async fn the_tail_comes_after_every_relayed_event() {
        let (relay, relayed) = Relay::new(1024);
        let (tail_tx, tail_rx) = oneshot::channel();
        let body = Streamed::new(Bytes::from_static(b"a"), relayed, tail_rx);
        relay.send(Bytes::from_static(b"b"));
        relay.send(Bytes::from_static(b"c"));
        tail_tx.send(full("z")).unwrap();
        relay.send(Bytes::from_static(b"late"));
        drop(relay);
        let all = body.collect().await.unwrap().to_bytes();
        // Whatever was queued when the tail came goes first; the tail ends it.
        assert!(all.starts_with(b"abc"), "{all:?}");
        assert!(all.ends_with(b"z"), "{all:?}");
    }
}
