//! The store's interface: the only truth about operations (README "The
//! states"; ARCHITECTURE.md §4), as its callers see it. The backends are
//! crates of their own (`idemgate-store-sqlite`, `idemgate-store-postgres`)
//! that implement [`Store`]; [`backend`] is what they share.
//!
//! Store methods work on whole operations and return after a durable commit.
//! Every state change is a compare-and-set on (id, state, attempt, owner), so a
//! stale writer loses instead of overwriting. The happy path costs two store
//! calls, each in a group commit: [`RequestPath::claim`] inserts the row and
//! [`RequestPath::record`] updates it, and neither stores an event row: the row
//! proves the first claim and a plain response, and [`timeline`] puts those
//! events back when an operator looks. All SQL lives in the backends.
//!
//! # Access paths
//!
//! Every read of the admin API, the console, the alerts and retention, and
//! the claim's look-ups, is one statement per access path, a range of one
//! index, so none costs more as `operations` grows (ARCHITECTURE.md §4,
//! "Access paths"). Lists page by `id < cursor ORDER BY id DESC LIMIT n`
//! inside the index; ids are UUIDv7, so id order is claim order. Each
//! backend lists its statements with the index that must serve them
//! (each backend crate's `access_paths`), and
//! `tests/it/store_contract.rs` explains every one.
//!
//! | access path | who asks | index |
//! |---|---|---|
//! | list, no filter | `GET /admin/keys`, the console | primary key |
//! | list by `state` | the console's held work (`state=unknown`) | `operations_state_id (state, id)`; `in_progress` on SQLite: `operations_in_progress (id)` |
//! | list by `route` and `state` | the console, `idemgate keys` | `operations_route_state_id (route, state, id)`; `in_progress` on SQLite: `operations_in_progress`, the route filtered from its few rows |
//! | list by `route` | the console | the same, one range per state, each ending at the limit, merged |
//! | list by `key` (with any other filter) | the console, `idemgate keys` | SQLite: `operations_identity (idem_key, route, scope)` for the current operations and `operations_superseded (idem_key, id)` for the rest, merged; PostgreSQL: `operations_key_id (idem_key, id)`. A key names few operations, so the other filters only sort those out |
//! | [`Operators::duplicated`] | the console's held work, first | `operations_duplicated (id)`: the held operations a probe found more than once |
//! | [`Operators::get`] | `GET /admin/keys/{id}` | primary key |
//! | [`Operators::find_newest`] | a client's status lookup | `operations_identity` for the current operation; under a pair that holds only superseded ones, `operations_superseded`: `(idem_key, id)` on SQLite, `(route, scope, idem_key, id)` on PostgreSQL |
//! | the rotated-key guard | the claim (`rotated_keys = "hold"`) | `operations_held_twins (route, scope, fingerprint)`: operations in flight or held |
//! | the `unknown-aged` scan | the alerts | `operations_state_updated (state, updated_at)`, from a cursor per threshold |
//! | [`Maintenance::sweep`] | retention | `operations_state_updated`, at most [`SWEEP_LIMIT`] rows |
//! | the pause latch's count | the latch | `operations_route_state_id` |
//!
//! Each index is one more b-tree every claim may write: each exists because
//! it serves a filter no other index can. What the backends add to this
//! (SQLite's partial indexes, PostgreSQL's plans before statistics) is in
//! their own module docs.
//!
//! # Log targets
//!
//! The store's log lines, this crate's and both backends', keep the
//! targets they had inside the gateway's crate
//! (`idemgate::store::sqlite::writer`, `idemgate::scope_key`, …), so
//! the `RUST_LOG` filters operators write (docs/configuration.md,
//! "Environment") keep naming them: each module that logs states its own
//! `TARGET` and passes it to every event.

#![forbid(unsafe_code)]

pub mod backend;
mod batches;
mod fence;
mod operation_id;
mod outbox;
pub mod scope_key;
pub mod seal;

use async_trait::async_trait;

use std::sync::Arc;

use crate::scope_key::{ScopeKey, ScopeKeyError};
pub use batches::{BatchLabels, StoreBatches};
pub use fence::{Fence, Permit};
use idemgate_model::operation::{
    Event, Fingerprint, Operation, RequestSummary, Settlement, State, StoredResponse, UnknownState,
};
pub use outbox::{Alert, AlertDelivery, AlertOutcome, AlertPoll, AlertSubscription};
pub use seal::{Seal, SealError, StoreKey};

/// An operation as listed for operators and clients: no payloads.
#[derive(Debug, Clone)]
pub struct Summary {
    pub id: String,
    pub route: String,
    pub key: String,
    pub state: State,
    pub attempt: u32,
    pub created_at: i64,
    pub updated_at: i64,
}

/// One entry of a stored timeline.
#[derive(Debug, Clone)]
pub struct StoredEvent {
    pub at: i64,
    pub kind: String,
    pub detail: serde_json::Value,
}

/// The member of a `probe` event's detail that counts the probes it
/// stands for when more than one ([`RequestPath::add_probe_event`]).
pub const PROBES: &str = "probes";

impl StoredEvent {
    /// How many probes this event stands for: 0 for another kind, 1 for a
    /// probe's own, more for the latest of a run that replaced others.
    pub fn probes(&self) -> u64 {
        match self.kind.as_str() {
            "probe" => self.detail[PROBES].as_u64().unwrap_or(1).max(1),
            _ => 0,
        }
    }
}

/// An operation's whole timeline: the stored events with the ones its row
/// implies (see [`backend::is_implied_by_record`]) put back in their place.
pub fn timeline(operation: &Operation, stored: Vec<StoredEvent>) -> Vec<StoredEvent> {
    let mut events = Vec::with_capacity(stored.len() + 3);
    let claimed_first = |e: &StoredEvent| e.kind == "claimed" && e.detail["attempt"] == 1;
    if !stored.iter().any(claimed_first) {
        // The row's owner claimed the latest attempt: the first one's only
        // while there has been no other.
        let detail = match (&operation.owner, operation.attempt) {
            (Some(owner), 1) => serde_json::json!({ "attempt": 1, "owner": owner }),
            _ => serde_json::json!({ "attempt": 1 }),
        };
        events.push(StoredEvent {
            at: operation.created_at,
            kind: "claimed".into(),
            detail,
        });
    }
    // In stored order, not by time: two events may share a millisecond.
    let since_last_claim = stored
        .iter()
        .rposition(|e| e.kind == "claimed")
        .map_or(&stored[..], |last| &stored[last..]);
    let responded = since_last_claim.iter().any(|e| e.kind == "response");
    // A write's `sent` is recorded with its outcome, and says how long
    // before it was handed over (`took_ms`): shown then.
    events.extend(stored.into_iter().map(|mut event| {
        if event.kind == "sent"
            && let Some(took) = event.detail["took_ms"].as_i64()
        {
            event.at = event.at.saturating_sub(took);
        }
        event
    }));
    if let (State::Completed, "response", false, Some(response)) = (
        operation.state,
        operation.evidence.as_str(),
        responded,
        &operation.response,
    ) {
        let bytes = operation.request.body_size;
        let answer = match &response.body {
            Some(body) => serde_json::json!({ "status": response.status, "bytes": body.len() }),
            None => serde_json::json!({ "status": response.status, "body_stored": false }),
        };
        // Sent right after its claim (the row's creation); answered at the
        // row's last update.
        events.push(StoredEvent {
            at: operation.created_at,
            kind: "sent".into(),
            detail: serde_json::json!({ "tries": 1, "bytes": bytes }),
        });
        events.push(StoredEvent {
            at: operation.updated_at,
            kind: "response".into(),
            detail: answer,
        });
    }
    // Stable: events at the same instant keep the order above.
    events.sort_by_key(|e| e.at);
    events
}

/// Which operations [`Operators::list`] returns, newest first.
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    pub state: Option<State>,
    pub route: Option<String>,
    pub key: Option<String>,
    /// Only operations older than this id (the previous page's last).
    pub before: Option<String>,
    pub limit: u32,
}

/// The most operations one [`Maintenance::sweep`] deletes: a transaction that
/// takes the writer (and, on PostgreSQL, row locks) for a few
/// milliseconds, however much has expired.
pub const SWEEP_LIMIT: u32 = 1000;

/// The access paths of [`Operators::list`]: one statement each, so that each
/// is served by its own index instead of one statement with optional
/// filters that none serves (ARCHITECTURE.md §4, "Access paths"). Each
/// pages by `id < cursor ORDER BY id DESC LIMIT n` inside its index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListPath {
    /// No filter: the primary key.
    All,
    /// `state`: `operations_state_id`.
    State,
    /// `route` and `state`: `operations_route_state_id`.
    RouteState,
    /// `route` alone: `operations_route_state_id` once per state, merged.
    Route,
    /// `key`, with or without the others: on SQLite the identity index
    /// (key first) for the current operations and `operations_superseded`
    /// for the others, merged; on PostgreSQL `operations_key_id`. A key
    /// names few operations (one per route and scope, and what they
    /// superseded), so `state` and `route` only filter those.
    Key,
}

impl ListFilter {
    /// The access path that serves this filter.
    pub fn path(&self) -> ListPath {
        match (&self.key, &self.route, &self.state) {
            (Some(_), _, _) => ListPath::Key,
            (None, Some(_), Some(_)) => ListPath::RouteState,
            (None, Some(_), None) => ListPath::Route,
            (None, None, Some(_)) => ListPath::State,
            (None, None, None) => ListPath::All,
        }
    }

    /// One filter per access path, first page and next, named so: what
    /// the backends' [`AccessPath`] lists explain.
    pub fn samples() -> Vec<(String, ListFilter)> {
        let filters = [
            ListFilter::default(),
            ListFilter {
                state: Some(State::Unknown),
                ..ListFilter::default()
            },
            ListFilter {
                state: Some(State::InProgress),
                ..ListFilter::default()
            },
            ListFilter {
                state: Some(State::Completed),
                route: Some("api".into()),
                ..ListFilter::default()
            },
            ListFilter {
                state: Some(State::InProgress),
                route: Some("api".into()),
                ..ListFilter::default()
            },
            ListFilter {
                route: Some("api".into()),
                ..ListFilter::default()
            },
            ListFilter {
                key: Some("k".into()),
                route: Some("api".into()),
                state: Some(State::Unknown),
                ..ListFilter::default()
            },
        ];
        let cursor = "01900000-0000-7000-8000-000000000000";
        filters
            .into_iter()
            .flat_map(|filter| {
                let next = ListFilter {
                    before: Some(cursor.into()),
                    ..filter.clone()
                };
                [("first page", filter), ("next page", next)]
            })
            .map(|(page, filter)| {
                let filter = ListFilter {
                    limit: 50,
                    ..filter
                };
                let state = filter
                    .state
                    .map_or(String::new(), |s| format!(" {}", s.as_str()));
                (format!("list {:?}{state}, {page}", filter.path()), filter)
            })
            .collect()
    }
}

/// A statement the store runs on `operations`, with sample parameters:
/// what `tests/it/store_contract.rs` explains, on each backend, to show that
/// an index serves it. The statements are the store's own, never copies.
#[doc(hidden)]
#[derive(Debug, Clone)]
pub struct AccessPath {
    pub name: String,
    pub sql: String,
    /// The index its plan must read `operations` through.
    pub index: &'static str,
    /// What the index's condition must bound, as the plan writes it: a
    /// range that ends early, not a walk of every entry under a prefix.
    pub bound: Option<&'static str>,
    /// In placeholder order (`?1`, `$1`, …).
    pub params: Vec<Param>,
}

/// A parameter value: of an [`AccessPath`], and of SQLite's list.
#[doc(hidden)]
#[derive(Debug, Clone)]
pub enum Param {
    Null,
    Int(i64),
    Text(String),
    Texts(Vec<String>),
}

impl Param {
    pub fn text(text: &str) -> Param {
        Param::Text(text.to_string())
    }
}

impl From<Option<&str>> for Param {
    fn from(text: Option<&str>) -> Self {
        text.map_or(Param::Null, |text| Param::Text(text.to_string()))
    }
}

/// SQLite binds a parameter as itself (an array it cannot take); the
/// impl lives here, with the type, as the orphan rule requires.
#[cfg(feature = "sqlite")]
impl rusqlite::ToSql for Param {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        use rusqlite::types::{ToSqlOutput, Value, ValueRef};
        Ok(match self {
            Param::Null => ToSqlOutput::Borrowed(ValueRef::Null),
            Param::Int(n) => ToSqlOutput::Owned(Value::Integer(*n)),
            Param::Text(text) => ToSqlOutput::Borrowed(ValueRef::Text(text.as_bytes())),
            Param::Texts(_) => {
                return Err(rusqlite::Error::ToSqlConversionFailure(
                    "SQLite takes no arrays".into(),
                ));
            }
        })
    }
}

/// A decision about a held operation: an operator's, or the gateway's
/// that claimed the attempt and knows it sent nothing.
#[derive(Debug, Clone)]
pub enum Decision {
    /// It happened; later requests replay `response`.
    Completed { response: StoredResponse },
    /// It did not happen; the next request is forwarded as a new attempt.
    NotAttempted,
    /// Not an operator's: the replica that claimed the attempt was fenced
    /// before writing a byte of it (its lease ran low), after a peer held
    /// it `unknown` (`replica-lost`). Settles it as [`Decision::NotAttempted`]
    /// does, with the evidence [`LEASE_LOST`].
    Fenced,
}

impl Decision {
    /// The state it settles the operation in, and the response to replay.
    pub fn outcome(&self) -> (State, Option<&StoredResponse>) {
        match self {
            Decision::Completed { response } => (State::Completed, Some(response)),
            Decision::NotAttempted | Decision::Fenced => (State::NotAttempted, None),
        }
    }

    /// The operation's `evidence` once settled by it.
    pub fn evidence(&self) -> &'static str {
        match self {
            Decision::Completed { .. } | Decision::NotAttempted => "operator",
            Decision::Fenced => LEASE_LOST,
        }
    }
}

/// What [`Operators::resolve`] did.
#[derive(Debug)]
pub enum Resolved {
    Done,
    NotFound,
    /// Settled already, or `in_progress` with a live owner.
    NotResolvable(State),
    /// A `not_attempted` decision on an operation a probe found at the
    /// destination more than once ([`DUPLICATED`]): it happened, and the
    /// retry it would let through would make it once more. Checked in the
    /// store's own transaction, so a probe's finding that lands after the
    /// operator read the operation still refuses it.
    FoundAtDestination,
    /// The operator decided on another attempt than the one the operation
    /// is at now (a retry claimed it since the page was read): that
    /// attempt was never checked, so the decision says nothing about it.
    OtherAttempt {
        attempt: u32,
        state: State,
    },
}

/// Counts for operators, read from counters the store keeps with every
/// write (ARCHITECTURE.md §4, "Counts"): no read of them counts the table.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    /// (route, state, count), superseded operations included; only
    /// nonzero counts.
    pub counts: Vec<(String, State, u64)>,
    /// When (ms) the longest-held `unknown` operation became unknown: its
    /// last update, since an `unknown` operation is updated only to leave
    /// that state.
    pub oldest_unknown_since: Option<i64>,
    /// A PostgreSQL store: its server's replication as last read (`None`
    /// for SQLite, or when no fresh reading is at hand).
    pub replication: Option<ReplicationState>,
}

/// One reading of a PostgreSQL server's replication, as `/metrics` and
/// `/admin/stats` show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicationState {
    /// `pg_is_in_recovery()`: a standby, where no write can commit.
    pub in_recovery: bool,
    /// The server's `synchronous_standby_names` (empty: none).
    pub synchronous_standby_names: String,
    /// Standbys `pg_stat_replication` shows streaming as `sync` or
    /// `quorum` (seen only with `pg_read_all_stats` or as a superuser).
    pub synchronous_standbys: u32,
    /// Whether writes wait for one (`store.require_synchronous_standby`).
    pub required: bool,
}

/// A paused route, the reason stored with its pause, and who paused it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutePause {
    pub route: String,
    pub reason: String,
    pub by: PausedBy,
}

/// Who paused a route, stored as its own column (`paused_by`): never read
/// from the reason, which is an operator's free text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PausedBy {
    /// `POST /admin/routes/{name}/pause` (the last pause wins: an
    /// operator's pause of a route the latch paused is the operator's).
    Operator,
    /// The route's `pause_after_unknown` latch (`trip_pause_latch`).
    Latch,
    /// A probe found one of its operations more than once at the
    /// destination ([`Finding::Duplicated`]).
    Probe,
}

impl PausedBy {
    /// As stored, and as the admin API's `paused_by` says it.
    pub fn as_str(self) -> &'static str {
        match self {
            PausedBy::Operator => "operator",
            PausedBy::Latch => "latch",
            PausedBy::Probe => "probe",
        }
    }

    pub fn parse(stored: &str) -> Result<Self, StoreError> {
        match stored {
            "operator" => Ok(PausedBy::Operator),
            "latch" => Ok(PausedBy::Latch),
            "probe" => Ok(PausedBy::Probe),
            other => Err(StoreError::Corrupt(format!("route paused by `{other}`"))),
        }
    }
}

/// A write that wants to become an operation.
#[derive(Debug, Clone)]
pub struct NewOperation {
    pub route: String,
    /// The scope's digest, as lower-case hex (`pipeline::key`). It, the
    /// fingerprint and the body's SHA-256 are SHA-256 digests, and a store
    /// may keep them as their 32 bytes: anything else is refused.
    pub scope: String,
    pub key: String,
    pub fingerprint: Fingerprint,
    pub request: RequestSummary,
    /// Derive mode without `derive_from`: a settled operation last updated
    /// before this time (ms) is superseded and the key starts a new one.
    pub fresh_after: Option<i64>,
    /// The rotated-key guard (`rotated_keys = "hold"`, docs/requests.md "A
    /// rotated key"), whoever named the key: when no operation holds this
    /// write's own identity, or the one that does would have it sent
    /// (`not_attempted` with its fingerprint, or outdated by `fresh_after`),
    /// and one under another key of its route and scope, with its
    /// fingerprint, is `in_progress` or `unknown`, the claim answers
    /// [`ClaimResult::HeldTwin`] and stores (and supersedes) nothing.
    pub refuse_held_twin: bool,
}

impl NewOperation {
    /// What the sealed values of the operation stored for this write are
    /// bound to.
    pub fn identity(&self) -> seal::Identity {
        seal::Identity::of(
            &self.route,
            &self.scope,
            &self.key,
            self.fingerprint.as_str(),
        )
    }

    /// Whether `operation`, stored under this write's identity, is no longer
    /// the current one for it: a settled operation last updated before the
    /// derive window (`fresh_after`) gives way to a new one; `unknown` and
    /// `in_progress` ones always match, since they may still have happened.
    ///
    /// This is the one rule that decides "the operation the store holds now
    /// for this identity": [`RequestPath::claim`] supersedes what it outdates, and
    /// [`RequestPath::current`] does not return it, so a claim, the paused path
    /// and a probe's answer all see the same operation.
    pub fn outdates(&self, operation: &Operation) -> bool {
        matches!(operation.state, State::Completed | State::NotAttempted)
            && self
                .fresh_after
                .is_some_and(|cutoff| operation.updated_at < cutoff)
    }

    /// Whether a claim of this write would send it with `operation` the
    /// store's current one for its identity: the operation is its own and
    /// `not_attempted`, so the next attempt is due.
    pub fn would_send(&self, operation: &Operation) -> bool {
        operation.state == State::NotAttempted && operation.fingerprint == self.fingerprint
    }
}

/// Proof that this process owns an attempt: the compare-and-set token for
/// [`RequestPath::record`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub operation_id: String,
    pub attempt: u32,
    /// What the operation's sealed values are bound to, known from the
    /// claim so that a record seals without reading the row.
    pub identity: seal::Identity,
    /// Its route and key, for what the record writes beside the row (the
    /// counts, an alert) without reading it either.
    pub route: String,
    pub key: String,
    /// Where the store keeps the operation's row, when it has a handle
    /// cheaper to find than the id: SQLite's rowid, known from the claim's
    /// insert. Only a hint: a record checks the id beside it, and looks the
    /// id up when the hint names no such row.
    pub row: Option<i64>,
}

/// What settles a held operation after the fact ([`RequestPath::settle_held`]).
#[derive(Debug, Clone)]
pub struct LateEvidence {
    pub operation_id: String,
    pub source: LateSource,
    /// The response that settles it: stored as the operation's.
    pub response: StoredResponse,
    /// The timeline entry, kept whether or not it settles.
    pub event: Event,
}

/// Where [`LateEvidence`] came from, which decides what it may settle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LateSource {
    /// The response to this attempt, after it was held: settles only an
    /// operation still `unknown` at that attempt.
    LateResponse { attempt: u32 },
    /// A reconcile probe found the write at the destination: settles the
    /// operation at whatever attempt it is.
    Reconciled,
    /// The destination answered a re-send under the operation's destination
    /// key (`resend_unknown`): settles it at whatever attempt it is, since
    /// every attempt carried that key.
    Resent,
}

impl LateSource {
    /// The attempt it is bound to; `None` for any.
    pub fn attempt(self) -> Option<u32> {
        match self {
            LateSource::LateResponse { attempt } => Some(attempt),
            LateSource::Reconciled | LateSource::Resent => None,
        }
    }

    /// The operation's `evidence` once settled.
    pub fn evidence(self) -> &'static str {
        match self {
            LateSource::LateResponse { .. } => "late-response",
            LateSource::Reconciled => "reconciled",
            LateSource::Resent => "resent",
        }
    }
}

/// What a probe concluded that changes a held operation short of
/// completing it ([`RequestPath::settle_probed`]).
#[derive(Debug, Clone)]
pub struct Probed {
    pub operation_id: String,
    /// The attempt the probe asked about: only an operation still
    /// `unknown` at this attempt changes.
    pub attempt: u32,
    pub finding: Finding,
    /// The timeline entry (each question and its answer), kept whether or
    /// not the operation changes.
    pub event: Event,
}

/// A probe's finding about a held operation (docs/requests.md, "Probe
/// verdicts").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finding {
    /// Authoritatively absent: `unknown` → `not_attempted`, so the next
    /// request is sent as the next attempt.
    Absent,
    /// At the destination more than once: stays `unknown`, with its own
    /// evidence, a `duplicated-at-destination` alert, and its route paused
    /// ([`PausedBy::Probe`]) unless it is already; once per operation.
    /// From then on only an operator settles it: no late response, probe or
    /// re-send's answer does.
    Duplicated,
}

impl Finding {
    /// The operation's `evidence` once it applies.
    pub fn evidence(self) -> &'static str {
        match self {
            Finding::Absent => "reconciled-absent",
            Finding::Duplicated => DUPLICATED,
        }
    }
}

/// The evidence (and the alert event) of an operation a probe found more
/// than once at the destination.
pub const DUPLICATED: &str = "duplicated-at-destination";

/// The evidence of an operation its owner left `in_progress`, marked
/// `unknown` by the next start ([`Maintenance::recover`]).
pub const GATEWAY_RESTARTED: &str = "gateway-restarted";
/// ... by its owner stopping past its grace ([`Maintenance::close`]).
pub const GATEWAY_STOPPED: &str = "gateway-stopped";
/// ... by a peer replica that found its owner's lease lapsed.
pub const REPLICA_LOST: &str = "replica-lost";
/// The evidence of an attempt its replica never sent: the fence (its
/// lease ran low) held it back before a byte was written.
pub const LEASE_LOST: &str = "lease-lost";
/// The evidence of an operation marked `unknown` with its attempt still in
/// flight: the mark says nothing of when that attempt ended.
pub const MARKED_IN_FLIGHT: [&str; 3] = [GATEWAY_RESTARTED, GATEWAY_STOPPED, REPLICA_LOST];

/// What [`RequestPath::claim`] found.
#[derive(Debug)]
pub enum ClaimResult {
    /// New, or a `not_attempted` one taken for its next attempt: send it.
    Claimed(Claim),
    /// Someone else's business: replay, refuse or hold per its state.
    Existing(Box<Operation>),
    /// Refused by the rotated-key guard ([`NewOperation::refuse_held_twin`]):
    /// the identical operation under another key, in flight or held;
    /// nothing was stored.
    HeldTwin(Box<Operation>),
}

/// What one [`Maintenance::rekey`] batch did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RekeyBatch {
    /// The last operation id looked at; `None` when none was left.
    pub last: Option<String>,
    /// Operations looked at.
    pub operations: u64,
    /// Operations whose payloads were sealed again.
    pub resealed: u64,
}

/// Whether [`RequestPath::record`] won its compare-and-set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    Applied,
    /// The operation had already left this attempt's `in_progress`, or is
    /// no longer stored.
    Stale,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("the store {store} is in use by another idemgate process (it holds a lock on {lock})")]
    Locked {
        store: String,
        /// The file locked, its symlinks resolved.
        lock: String,
    },
    #[error("cannot open the store {store}: {reason}")]
    Open { store: String, reason: String },
    #[error("the store is busy: {0}")]
    Busy(String),
    /// Writes are refused though the store answers: this replica's lease
    /// is not renewed, or the server cannot keep a commit through a
    /// failover (docs/replicas.md).
    #[error("writes are refused: {0}")]
    WritesRefused(String),
    #[cfg(feature = "postgres")]
    #[error("the store is unavailable: {0}")]
    Unavailable(#[from] sqlx::Error),
    #[cfg(feature = "sqlite")]
    #[error("the store is unavailable: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("the store did not commit: {0}")]
    Failed(String),
    /// The statement was sent but its answer never came (the connection
    /// broke, or the database took too long): it may have committed.
    #[error("the store's answer was lost, and it may have committed: {0}")]
    Unanswered(String),
    #[error("the store is closed")]
    Closed,
    #[error("the store holds a value it cannot read: {0}")]
    Corrupt(String),
    #[error(transparent)]
    Seal(#[from] SealError),
    #[error(transparent)]
    ScopeKey(#[from] ScopeKeyError),
}

impl From<UnknownState> for StoreError {
    fn from(unknown: UnknownState) -> Self {
        StoreError::Corrupt(unknown.to_string())
    }
}

impl StoreError {
    /// Whether the store answered but holds a value that must not be
    /// used: a sealed payload that does not open (a request gets 500
    /// `store-unreadable`, never the bytes), as opposed to a store that
    /// did not answer (503, worth a retry).
    pub fn is_unreadable(&self) -> bool {
        matches!(self, StoreError::Seal(SealError::Unreadable { .. }))
    }
}

/// The operations store, as every caller together sees it; each part is
/// the interface of one kind of caller, so a signature says who may call
/// what. Implementations commit durably before returning.
pub trait Store: RequestPath + Operators + Outbox + Maintenance {}

impl<T: RequestPath + Operators + Outbox + Maintenance> Store for T {}

/// What the request path calls, in the order of a write's life: the claim,
/// the record of its outcome, the answer from what is held now, and the
/// evidence that settles a held operation.
#[async_trait]
pub trait RequestPath: Send + Sync {
    /// Looks up `(route, scope, key)` and, in the same transaction, claims it
    /// for this process when it is new or `not_attempted` — unless the
    /// rotated-key guard finds a held twin first
    /// ([`NewOperation::refuse_held_twin`]). (An `Arc`: a
    /// store that claims on a thread or a batch of its own shares it, not
    /// a copy of its strings.)
    async fn claim(&self, new: &Arc<NewOperation>) -> Result<ClaimResult, StoreError>;

    /// Settles a claimed attempt, with its events, as one compare-and-set.
    /// Events the row itself proves are not stored ([`timeline`] shows
    /// them). An operation no longer stored (settled otherwise, then
    /// swept) is [`Recorded::Stale`] like any other, its events dropped,
    /// and fails no other call.
    async fn record(
        &self,
        claim: &Claim,
        settlement: &Settlement,
        events: &[Event],
    ) -> Result<Recorded, StoreError>;

    /// The operation the store holds now for `new`'s identity, without
    /// claiming anything: `None` when there is none, or when the one stored
    /// is outdated for `new` ([`NewOperation::outdates`]) and the next claim
    /// would supersede it.
    async fn current(&self, new: &NewOperation) -> Result<Option<Operation>, StoreError>;

    /// Whether this process may still write the attempts it claimed
    /// ([`Fence`]): checked right before each is written, since a claim's
    /// ownership can end while its attempt is on its way.
    fn fence(&self) -> Fence;

    /// Whether other gateway processes (replicas) share this store: then
    /// each replica calls [`Maintenance::recover`] periodically, re-reads the
    /// paused routes, and caches nothing the store holds, since a peer
    /// may change it.
    fn shared(&self) -> bool {
        false
    }

    /// Appends an event to an operation's timeline.
    async fn add_event(&self, operation_id: &str, event: &Event) -> Result<(), StoreError>;

    /// Appends a `probe` event that settled nothing (an undetermined
    /// answer, or any answer about a write found more than once already,
    /// which only an operator settles), keeping a run of them short: when
    /// the operation's two latest stored events are probes with this one's
    /// `verdict`, the latest is replaced by this one, its [`PROBES`] the
    /// replaced one's plus one. So a run of probes in a row with one
    /// verdict keeps its first event and its latest, which counts the
    /// probes it stands for: a client that retries a held operation for
    /// days adds two events, not one per probe.
    async fn add_probe_event(&self, operation_id: &str, event: &Event) -> Result<(), StoreError>;

    /// Settles a held operation with evidence that came after the fact:
    /// `unknown` → `completed`, as a compare-and-set. The event is kept
    /// either way; `false` when the operation was no longer `unknown` (or,
    /// for a late response, no longer at its attempt), or a probe found it
    /// more than once at the destination ([`Finding::Duplicated`]): that
    /// one only an operator settles ([`Operators::resolve`]).
    async fn settle_held(&self, late: &LateEvidence) -> Result<bool, StoreError>;

    /// Applies a probe's [`Finding`] to an operation still `unknown` at the
    /// probed attempt, as one compare-and-set with what goes with it (the
    /// counts; for a duplicate its alert and its route's pause). The event
    /// is kept either way; `false` when nothing changed (no longer
    /// `unknown` at that attempt, or already found more than once: no
    /// absence releases it, and a duplicate is reported once).
    async fn settle_probed(&self, probed: &Probed) -> Result<bool, StoreError>;

    /// Pauses `route` if at least `threshold` of its operations are
    /// `unknown`; `true` when the route is paused afterwards.
    async fn trip_pause_latch(&self, route: &str, threshold: u32) -> Result<bool, StoreError>;
}

/// What operators (the admin API, the console, `idemgate keys`) and the
/// metrics read and decide: lists, one operation, resolutions, pauses,
/// counts.
#[async_trait]
pub trait Operators: Send + Sync {
    /// The routes paused now.
    async fn paused_routes(&self) -> Result<Vec<String>, StoreError>;

    /// The routes paused now with their stored reasons, by route name.
    async fn pauses(&self) -> Result<Vec<RoutePause>, StoreError>;

    /// Operations matching `filter`, newest first.
    async fn list(&self, filter: &ListFilter) -> Result<Vec<Summary>, StoreError>;

    /// The `unknown` operations a probe found more than once at the
    /// destination ([`Finding::Duplicated`]), on `route` or any, newest
    /// first, at most `limit`: what operators see first.
    async fn duplicated(&self, route: Option<&str>, limit: u32)
    -> Result<Vec<Summary>, StoreError>;

    /// One operation with its whole [`timeline`].
    async fn get(&self, id: &str) -> Result<Option<(Operation, Vec<StoredEvent>)>, StoreError>;

    /// The newest operation with `key` under any of the (route, scope) pairs.
    async fn find_newest(
        &self,
        scopes: &[(String, String)],
        key: &str,
    ) -> Result<Option<Summary>, StoreError>;

    /// Settles a held operation by an operator's decision: allowed from
    /// `unknown`, or `in_progress` whose owner is dead. One transaction, so
    /// a concurrent client retry either sees the decision or claims first.
    /// With `attempt`, only while the operation is at that attempt (the one
    /// the operator checked), else [`Resolved::OtherAttempt`].
    async fn resolve(
        &self,
        id: &str,
        attempt: Option<u32>,
        decision: &Decision,
        event: &Event,
    ) -> Result<Resolved, StoreError>;

    /// Whether `owner` (an operation's) is a live gateway: an `in_progress`
    /// operation of a live owner is in flight, and [`Operators::resolve`]
    /// refuses it.
    async fn owner_alive(&self, owner: &str) -> Result<bool, StoreError>;

    /// Counts by route and state, and the oldest `unknown` operation.
    async fn stats(&self) -> Result<Stats, StoreError>;

    /// Pauses `route` with `reason`, or resumes it (`None`), durably.
    async fn set_paused(&self, route: &str, reason: Option<&str>) -> Result<(), StoreError>;
}

/// The alert outbox: what the deliverer takes and settles.
#[async_trait]
pub trait Outbox: Send + Sync {
    /// Alerts, in one transaction: adds `unknown-aged` alerts for the
    /// operations `unknown` longer than a subscription's threshold (each
    /// once), fans the alerts not yet fanned out to the endpoints that
    /// subscribe to them, drops old finished ones, and takes up to `limit`
    /// deliveries due — fresh alerts' before `unknown-aged` ones', so a new
    /// loss never waits behind a backlog of reminders, each kind the
    /// earliest first — and no more of one endpoint's than its `room`,
    /// leasing them: a delivery
    /// taken is not due again before `lease_until` unless settled. A
    /// [`shared`](RequestPath::shared) store fans out to the subscriptions
    /// of every replica that polled lately, not only to `poll`'s, and hands
    /// out only deliveries of `poll`'s endpoints: another replica may have
    /// the others. A single-process store hands out any, and one whose
    /// endpoint is no longer configured is the caller's to give up.
    async fn take_alerts(&self, poll: &AlertPoll) -> Result<Vec<AlertDelivery>, StoreError>;

    /// Settles a delivery taken by [`Outbox::take_alerts`].
    async fn settle_alert(
        &self,
        delivery: &AlertDelivery,
        outcome: &AlertOutcome,
        now: i64,
    ) -> Result<(), StoreError>;
}

/// What the gateway's own housekeeping calls: recovery at start and from
/// peers, retention, rekeying, readiness, batch figures and the close.
#[async_trait]
pub trait Maintenance: Send + Sync {
    /// Marks the `in_progress` operations whose owners are dead `unknown`:
    /// they may have reached the upstream, so they are held, never
    /// re-sent. Run at start, before the first request is served. SQLite:
    /// this process alone holds the store, so every one found is a dead
    /// owner's (`gateway-restarted`); call it only then. A [`shared`]
    /// store: the owners whose lease ran out (`replica-lost`), and this
    /// replica's own that none of its attempts works on any more
    /// (`record-lost`: their records were lost with a failed-over server),
    /// at any time. Returns the routes of the operations it marked, for their pause
    /// latches.
    ///
    /// [`shared`]: RequestPath::shared
    async fn recover(&self) -> Result<Vec<String>, StoreError>;

    /// Its group commits' sizes and times, for the gateway's metrics.
    fn batches(&self) -> &StoreBatches;

    /// Deletes up to `limit` (at most [`SWEEP_LIMIT`]) `completed` and
    /// `not_attempted` operations last updated before `cutoff` (ms), with
    /// their events; `unknown` ones stay. One transaction: on SQLite one
    /// writer job, so the writer's other jobs run between two calls.
    async fn sweep(&self, cutoff: i64, limit: u32) -> Result<u64, StoreError>;

    /// `idemgate rekey`: seals again, under the current key, the payloads
    /// of up to `limit` operations after `after` (by id; `""` from the
    /// start) that are plain or sealed under another key.
    async fn rekey(&self, after: &str, limit: u32) -> Result<RekeyBatch, StoreError>;

    /// After a whole [`Maintenance::rekey`] pass: the canary is sealed under the
    /// current key, so only that key is needed from now on.
    async fn finish_rekey(&self) -> Result<(), StoreError>;

    /// The identity settings kept for each route, by route name
    /// ([`Maintenance::keep_route_settings`]): what the gateway last
    /// started with, that decides which stored operation a request is.
    async fn route_settings(&self) -> Result<Vec<(String, String)>, StoreError>;

    /// Keeps each route's identity settings (`None`: forgets the
    /// route's), in one transaction.
    async fn keep_route_settings(
        &self,
        settings: &[(String, Option<String>)],
    ) -> Result<(), StoreError>;

    /// Whether the store can take a write now (readiness: `/readyz`, the
    /// systemd watchdog). SQLite makes one, a row of its own committed
    /// as any write is, since a transaction that writes nothing commits on
    /// a full disk; PostgreSQL asks whether this replica's lease runs, which
    /// only a renewal (a write) extends, and whether a claim could lock the
    /// tables it writes now.
    async fn ping(&self) -> Result<(), StoreError>;

    /// Marks what this process still has `in_progress` as `unknown`
    /// (`gateway-stopped`), closes connections and releases the store for
    /// another process.
    async fn close(&self);
}

/// How hard each commit is pushed to disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// fsync every commit: survives a power loss.
    Full,
    /// Survives a process crash, not a power loss.
    Normal,
}

/// The secrets a store is opened with, kept outside it.
#[derive(Clone)]
pub struct StoreKeys {
    /// Seals payloads (or passes them through, without a key).
    pub seal: Seal,
    /// What scopes are keyed with; at open, a store written before keying
    /// has its scopes keyed in place, once, and a store keyed with
    /// another key refuses to open.
    pub scope: ScopeKey,
}

#[cfg(test)]
mod tests;
