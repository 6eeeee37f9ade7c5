//! The `claim` phase: one store transaction decides what a write gets — it is
//! sent (new, or a `not_attempted` one's next attempt), replayed, or refused.
//!
//! Invariant: nothing goes upstream unless this process durably holds the
//! claim; a store that cannot commit means 503 `store-unavailable` and nothing
//! sent.

use http::Response;

use crate::body::ProxyBody;
use crate::pipeline::replay;
use crate::problem::ProxyError;
use crate::store::{Claim, ClaimResult, NewOperation, Store};

/// What the claim decided.
pub enum Claimed {
    /// This process owns the attempt: forward it.
    Send(Claim),
    /// The operation exists and answers for itself (a replay).
    Answer(Response<ProxyBody>),
}

pub async fn claim(store: &dyn Store, new: &NewOperation) -> Result<Claimed, ProxyError> {
    match store
        .claim(new)
        .await
        .map_err(|source| ProxyError::StoreUnavailable { source })?
    {
        ClaimResult::Claimed(claim) => Ok(Claimed::Send(claim)),
        ClaimResult::Existing(operation) => {
            replay::answer_existing(&operation, &new.fingerprint).map(Claimed::Answer)
        }
    }
}
