//! What the backends share and nothing above them uses: the columns a
//! summary is read from, response headers as stored, the kept counts'
//! row, the routes' settings rows, the events a row implies, the aging
//! scan's window, where dropping finished alerts stands and new
//! operation ids. Public because each backend is a
//! crate of its own; the gateway and the tools never name this module.

use idemgate_model::operation::{Event, State};

use crate::StoreError;
pub use crate::operation_id::new_id;
pub use crate::outbox::{AGED_PER_PASS, ForgetCursor, aged_access_paths};

/// Events the operation row itself proves, so the happy path need not
/// store them (two fewer event rows, and their index entries, per write):
/// a first attempt's claim is the row's creation, and a plain response —
/// sent on the first try, recorded as `completed` with evidence
/// `response` — is the row's response columns at its last update.
pub fn is_implied_by_record(state: State, events: &[Event]) -> bool {
    let first_try = |e: &Event| e.kind == "sent" && e.detail["tries"] == 1;
    state == State::Completed
        && matches!(events, [sent, response] if first_try(sent) && response.kind == "response")
}

/// The `store_meta` rows of the routes' identity settings
/// ([`crate::Maintenance::route_settings`]): this prefix, then the route's
/// name.
pub const ROUTE_SETTINGS_ROW: &str = "route-settings:";

/// The store-meta row that says the kept counts are exact (the value
/// [`COUNTS_EXACT`]). The migration that adds the counts writes it; one
/// that changes `operations` around the statements that keep the counts
/// deletes it, and the next open recounts.
pub const COUNTS_ROW: &str = "operation-counts";
pub const COUNTS_EXACT: &str = "exact";

/// A kept count as stats report it. Below zero, the counts drifted from
/// the table: said loudly, with the remedy, rather than reported as 0.
pub fn operation_count(n: i64) -> Result<u64, StoreError> {
    u64::try_from(n).map_err(|_| {
        StoreError::Corrupt(format!(
            "operation count {n}: delete the store_meta row `{COUNTS_ROW}` to recount at the next open"
        ))
    })
}

/// The columns each backend's `summary_from_row` reads.
pub const SUMMARY_COLUMNS: &str = "id, route, idem_key, state, attempt, created_at, updated_at";

/// Headers as JSON `[[name, value]]`, each value byte kept as one char
/// U+0000–U+00FF (Latin-1), so values that are not UTF-8 survive unchanged.
pub fn encode_headers(headers: &[(String, Vec<u8>)]) -> String {
    let pairs: Vec<(&str, String)> = headers
        .iter()
        .map(|(name, value)| {
            (
                name.as_str(),
                value.iter().map(|&b| char::from(b)).collect(),
            )
        })
        .collect();
    serde_json::to_string(&pairs).unwrap_or_default()
}

pub fn decode_headers(text: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
    let corrupt = || StoreError::Corrupt("response headers".into());
    let pairs: Vec<(String, String)> = serde_json::from_str(text).map_err(|_| corrupt())?;
    pairs
        .into_iter()
        .map(|(name, value)| {
            let bytes = value
                .chars()
                .map(|c| u8::try_from(c).map_err(|_| corrupt()))
                .collect::<Result<_, _>>()?;
            Ok((name, bytes))
        })
        .collect()
}
