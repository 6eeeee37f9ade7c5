//! Faults injected on purpose into the writes of `idemgate rehearse`'s own
//! gateway (docs/rehearse.md): the interruption cases of a rehearsal need
//! a connection that fails before a byte is written, a response the
//! destination sent that the client never gets, and a write held open
//! while its duplicates arrive — against the user's real destination,
//! over its real TLS, which no relay in front of it could cut at a
//! response's end.
//!
//! Invariants:
//! - only an embedding program builds a [`Drill`] and hands it to a
//!   gateway of its own (`StartOptions::drill`); no config key names one,
//!   `serve` never sets one, and a route without one never reaches this
//!   module;
//! - a drill bounds the writes its gateway sends (`rehearse --writes`):
//!   past the bound a write fails before a byte of it is written, so a
//!   bug in the rehearsal can never create more records than it promised;
//!   a write counts as sent once a byte of it may have been written, and
//!   one that reached nothing (its connection refused) gives its share of
//!   the bound back;
//! - a fault only changes what the gateway makes of an exchange, never
//!   what is sent: the write goes out as the route would send it, once.

use std::future::Future;
use std::sync::Mutex;

use tokio::sync::Notify;

use crate::pipeline::forward::{Exchange, LostCause, Sent};

/// What the next write meets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Its connection fails before a byte is written: nothing reaches the
    /// destination (`not_attempted`).
    FailConnect,
    /// It is sent and the destination's whole response read, then dropped,
    /// as a connection reset before the client heard would drop it.
    LoseResponse,
    /// Its exchange runs (sent and its response read, or refused before a
    /// byte), then it is held until [`Drill::release`]: the operation
    /// stays `in_progress` meanwhile.
    Hold,
}

/// The faults of one rehearsal's gateway, and the writes it let through.
pub struct Drill {
    /// std Mutex: never held across `.await`.
    state: Mutex<State>,
    /// A held write is holding (a permit, if nobody waits yet).
    holding: Notify,
    /// The held write may go on.
    release: Notify,
}

struct State {
    armed: Option<Fault>,
    /// Writes that may still be sent; one that reached nothing is given
    /// back.
    left: u64,
    /// Writes whose exchange ran: sent, or refused before a byte.
    forwarded: u64,
    /// Writes that reached the destination, or may have (a byte written).
    sent: u64,
    /// Of those, the ones the destination gave no complete answer.
    unanswered: u64,
    /// The status of the last response the destination gave, whether or
    /// not the client got it.
    answered: Option<u16>,
}

impl Drill {
    /// A drill that lets at most `writes` writes through.
    pub fn new(writes: u64) -> Drill {
        Drill {
            state: Mutex::new(State {
                armed: None,
                left: writes,
                forwarded: 0,
                sent: 0,
                unanswered: 0,
                answered: None,
            }),
            holding: Notify::new(),
            release: Notify::new(),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut state)
    }

    /// The next write meets `fault`; later ones none, until armed again.
    pub fn arm(&self, fault: Fault) {
        self.with(|s| s.armed = Some(fault));
    }

    /// Writes that reached the destination so far, or may have.
    pub fn sent(&self) -> u64 {
        self.with(|s| s.sent)
    }

    /// Writes sent so far that the destination gave no complete answer
    /// (a reset, a timeout): nothing to deliver, withhold or hold.
    pub fn unanswered(&self) -> u64 {
        self.with(|s| s.unanswered)
    }

    /// Writes the gateway forwarded so far: those sent, and those whose
    /// connection failed before a byte was written (not the ones this
    /// drill failed or refused itself).
    pub fn forwarded(&self) -> u64 {
        self.with(|s| s.forwarded)
    }

    /// The status of the destination's last response, delivered or not;
    /// taken, so that each case reads its own.
    pub fn take_answered(&self) -> Option<u16> {
        self.with(|s| s.answered.take())
    }

    /// The status of the destination's last response, delivered or not,
    /// left for [`Drill::take_answered`]: what a case reads of a response
    /// its client never got.
    pub fn answered(&self) -> Option<u16> {
        self.with(|s| s.answered)
    }

    /// Resolves once a write armed with [`Fault::Hold`] is holding.
    pub async fn holding(&self) {
        self.holding.notified().await;
    }

    /// Lets the held write go on.
    pub fn release(&self) {
        self.release.notify_one();
    }

    /// Runs a write's exchange `send` (not yet polled: nothing is sent
    /// unless it is) under the armed fault and the bound.
    pub async fn run(&self, send: impl Future<Output = Sent>) -> Sent {
        let taken = self.with(|s| {
            let fault = s.armed.take();
            if fault == Some(Fault::FailConnect) {
                return Err(
                    "the rehearsal failed the connection on purpose, before writing a byte",
                );
            }
            if s.left == 0 {
                return Err("the rehearsal's --writes bound is reached: nothing more is sent");
            }
            s.left -= 1;
            s.forwarded += 1;
            Ok(fault)
        });
        let fault = match taken {
            Ok(fault) => fault,
            Err(reason) => {
                return Sent {
                    exchange: Exchange::NotSent {
                        attempts: 1,
                        reason: reason.into(),
                    },
                    tries: 1,
                    late: None,
                };
            }
        };
        let mut sent = send.await;
        let status = match &sent.exchange {
            Exchange::Complete { head, .. }
            | Exchange::Released { head, .. }
            | Exchange::Classified { head, .. }
            | Exchange::Oversized { head, .. } => Some(head.status.as_u16()),
            _ => None,
        };
        self.with(|s| {
            if sent.exchange.written() {
                s.sent += 1;
                s.unanswered += u64::from(status.is_none());
                s.answered = status;
            } else {
                s.left += 1;
            }
        });
        match fault {
            Some(Fault::LoseResponse) if status.is_some() => {
                sent.exchange = Exchange::Lost {
                    cause: LostCause::Broken,
                    reason: "the rehearsal dropped the destination's response on purpose".into(),
                };
                sent.late = None;
            }
            Some(Fault::Hold) => {
                self.holding.notify_one();
                self.release.notified().await;
            }
            _ => {}
        }
        sent
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn complete(status: u16) -> Sent {
        let (head, ()) = http::Response::builder()
            .status(status)
            .body(())
            .unwrap()
            .into_parts();
        Sent {
            exchange: Exchange::Complete {
                head,
                body: bytes::Bytes::new(),
            },
            tries: 1,
            late: None,
        }
    }

    #[tokio::test]
    async fn a_failed_connect_sends_nothing_and_the_bound_holds() {
        let drill = Drill::new(1);
        drill.arm(Fault::FailConnect);
        let sent = drill.run(async { panic!("sent despite the fault") }).await;
        assert!(matches!(sent.exchange, Exchange::NotSent { .. }));
        assert_eq!(drill.sent(), 0);
        let sent = drill.run(async { complete(201) }).await;
        assert!(matches!(sent.exchange, Exchange::Complete { .. }));
        assert_eq!(drill.sent(), 1);
        let sent = drill.run(async { panic!("sent past the bound") }).await;
        assert!(matches!(sent.exchange, Exchange::NotSent { .. }));
        assert_eq!(drill.sent(), 1);
    }

    /// A write whose connection was refused reached nothing: it is not
    /// counted sent, and its share of the bound is given back.
    #[tokio::test]
    async fn a_write_that_reached_nothing_is_not_counted() {
        let drill = Drill::new(1);
        drill.arm(Fault::LoseResponse);
        let refused = drill
            .run(async {
                Sent {
                    exchange: Exchange::NotSent {
                        attempts: 1,
                        reason: "connection refused".into(),
                    },
                    tries: 1,
                    late: None,
                }
            })
            .await;
        assert!(matches!(refused.exchange, Exchange::NotSent { .. }));
        assert_eq!((drill.sent(), drill.forwarded()), (0, 1));
        assert_eq!(drill.take_answered(), None);
        let sent = drill.run(async { complete(201) }).await;
        assert!(matches!(sent.exchange, Exchange::Complete { .. }));
        assert_eq!((drill.sent(), drill.forwarded()), (1, 2));
        let sent = drill.run(async { panic!("sent past the bound") }).await;
        assert!(matches!(sent.exchange, Exchange::NotSent { .. }));
    }

    #[tokio::test]
    async fn a_lost_response_is_read_then_dropped_once() {
        let drill = Drill::new(2);
        drill.arm(Fault::LoseResponse);
        let sent = drill.run(async { complete(201) }).await;
        assert!(matches!(
            sent.exchange,
            Exchange::Lost {
                cause: LostCause::Broken,
                ..
            }
        ));
        assert_eq!(drill.answered(), Some(201), "read, not taken");
        assert_eq!(drill.take_answered(), Some(201));
        assert_eq!(drill.unanswered(), 0, "answered, then withheld");
        // Disarmed: the next write's response reaches the client.
        let sent = drill.run(async { complete(403) }).await;
        assert!(matches!(sent.exchange, Exchange::Complete { .. }));
        assert_eq!(drill.take_answered(), Some(403));
    }

    /// A write sent whose answer never came is counted sent and
    /// unanswered: there was nothing to withhold.
    #[tokio::test]
    async fn a_write_without_an_answer_is_counted_unanswered() {
        let drill = Drill::new(1);
        drill.arm(Fault::LoseResponse);
        let lost = drill
            .run(async {
                Sent {
                    exchange: Exchange::Lost {
                        cause: LostCause::Broken,
                        reason: "reset".into(),
                    },
                    tries: 1,
                    late: None,
                }
            })
            .await;
        assert!(matches!(lost.exchange, Exchange::Lost { .. }));
        assert_eq!((drill.sent(), drill.unanswered()), (1, 1));
        assert_eq!(drill.take_answered(), None);
    }

    #[tokio::test]
    async fn a_held_write_waits_for_its_release() {
        let drill = std::sync::Arc::new(Drill::new(1));
        drill.arm(Fault::Hold);
        let running = tokio::spawn({
            let drill = drill.clone();
            async move { drill.run(async { complete(201) }).await.tries }
        });
        drill.holding().await;
        assert!(!running.is_finished());
        drill.release();
        assert_eq!(running.await.unwrap(), 1);
    }
}
