//! The operation model: what an operation is, where it stands, and how an
//! attempt at it ends. Both the store (which keeps operations) and the
//! pipeline (which makes and answers them) build on these types, so they
//! live below both: the store never imports the pipeline to name a
//! fingerprint, and the pipeline never reaches into the store for a state.
//!
//! Invariant: this module is plain data and the rules that follow from the
//! data alone (a settlement's state and evidence, a state's name); it imports
//! no other module of the crate. How a fingerprint is computed is the
//! pipeline's (`pipeline::fingerprint`); how operations are kept, the store's.
//! What only the store's callers see (claims, listings, decisions, stats)
//! stays with the store's interface.

/// A request's fingerprint, hex-encoded: what makes two requests with one
/// key "the same operation".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fingerprint(String);

impl Fingerprint {
    /// A fingerprint from its hex digest: read back from the store, or
    /// just computed (`pipeline::fingerprint`).
    pub fn from_stored(hex: String) -> Self {
        Fingerprint(hex)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Where an operation stands, and so what a request with its key gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Claimed durably by a live owner; the request is being sent.
    InProgress,
    /// A full upstream response (or other evidence) is held and replayed.
    Completed,
    /// The request was or may have been written but no full response came
    /// back: held, never re-sent automatically.
    Unknown,
    /// Proof that nothing reached the upstream: the next request is a fresh attempt.
    NotAttempted,
}

impl State {
    /// Every state, in the order of the states table.
    pub const ALL: [State; 4] = [
        State::InProgress,
        State::Completed,
        State::Unknown,
        State::NotAttempted,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            State::InProgress => "in_progress",
            State::Completed => "completed",
            State::Unknown => "unknown",
            State::NotAttempted => "not_attempted",
        }
    }

    pub fn parse(text: &str) -> Result<Self, UnknownState> {
        match text {
            "in_progress" => Ok(State::InProgress),
            "completed" => Ok(State::Completed),
            "unknown" => Ok(State::Unknown),
            "not_attempted" => Ok(State::NotAttempted),
            other => Err(UnknownState(other.to_string())),
        }
    }
}

/// A state name that is none of [`State`]'s.
#[derive(Debug, thiserror::Error)]
#[error("unknown state `{0}`")]
pub struct UnknownState(pub String);

/// A stored operation, as a request or an operator sees it.
#[derive(Debug, Clone)]
pub struct Operation {
    pub id: String,
    pub route: String,
    pub key: String,
    pub fingerprint: Fingerprint,
    pub state: State,
    pub attempt: u32,
    /// The instance id of the process that claimed the latest attempt.
    pub owner: Option<String>,
    /// What proves the state: `response`, `gateway-restarted`, `connect-failed`, …
    pub evidence: String,
    pub response: Option<StoredResponse>,
    pub request: RequestSummary,
    /// Derive mode: a newer operation took the key after `derive_window`.
    pub superseded: bool,
    pub created_at: i64,
    pub updated_at: i64,
}

/// An upstream response as recorded: end-to-end headers with lower-case
/// names, duplicates and order kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    pub status: u16,
    pub headers: Vec<(String, Vec<u8>)>,
    /// `None` when the body was larger than `max_stored_response`.
    pub body: Option<Vec<u8>>,
}

impl StoredResponse {
    /// The bytes it keeps in the store: header names and values and the body.
    pub fn stored_bytes(&self) -> usize {
        let headers: usize = self
            .headers
            .iter()
            .map(|(name, value)| name.len() + value.len())
            .sum();
        headers + self.body.as_ref().map_or(0, Vec::len)
    }
}

/// What is kept about the request: never credentials, the body only when the
/// route asks for it.
#[derive(Debug, Clone)]
pub struct RequestSummary {
    pub method: String,
    pub path: String,
    pub content_type: Option<String>,
    pub body_size: u64,
    /// Lower-case hex.
    pub body_sha256: String,
    pub body: Option<Vec<u8>>,
}

/// How an attempt ended.
#[derive(Debug, Clone)]
pub enum Settlement {
    Completed { response: StoredResponse },
    NotAttempted { evidence: String },
    Unknown { evidence: String },
}

impl Settlement {
    pub fn state(&self) -> State {
        match self {
            Settlement::Completed { .. } => State::Completed,
            Settlement::NotAttempted { .. } => State::NotAttempted,
            Settlement::Unknown { .. } => State::Unknown,
        }
    }

    /// The upstream's response, when it settles the attempt.
    pub fn response(&self) -> Option<&StoredResponse> {
        match self {
            Settlement::Completed { response } => Some(response),
            _ => None,
        }
    }

    pub fn evidence(&self) -> &str {
        match self {
            Settlement::Completed { .. } => "response",
            Settlement::NotAttempted { evidence } | Settlement::Unknown { evidence } => evidence,
        }
    }
}

/// One entry of an operation's timeline: short evidence, never credentials
/// or payloads.
#[derive(Debug, Clone)]
pub struct Event {
    pub kind: &'static str,
    pub detail: serde_json::Value,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_round_trip() {
        for state in [
            State::InProgress,
            State::Completed,
            State::Unknown,
            State::NotAttempted,
        ] {
            assert_eq!(State::parse(state.as_str()).unwrap(), state);
        }
        assert!(State::parse("maybe").is_err());
    }
}
