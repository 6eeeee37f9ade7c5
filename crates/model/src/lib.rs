//! The operation model, below every other floor of idemgate: what an
//! operation is and the states it moves through ([`operation`]), the JSON a
//! fingerprint reads ([`canonical_json`]), the time the store keeps
//! ([`clock`]), the one retry delay ([`backoff`]), and two renderings every
//! floor shares ([`hex_text`], [`error_chain`]).
//!
//! Invariant: this crate depends on no other crate of idemgate's, and does
//! no I/O.
#![forbid(unsafe_code)]

pub mod backoff;
pub mod canonical_json;
pub mod clock;
pub mod error_chain;
pub mod hex_text;
pub mod operation;
