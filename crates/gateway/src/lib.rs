//! The idempotency gateway: automations point at it instead of an API whose
//! writes are not idempotent; it makes every write safe to retry. The
//! `idemgate` binary runs it (`serve`); the tools that talk to one from
//! outside are the crate above this one, `idemgate_tools`.
//!
//! # Layout
//! - [`config`]: the TOML file → validated [`config::Config`].
//! - `request_path`: a request path in normal form, and the readings other
//!   upstreams give it; the config keeps route prefixes so, the pipeline
//!   routes and scopes by it.
//! - [`server`]: listeners, accept loops, graceful shutdown; `accept`:
//!   taking a connection off a listener, refusing it at once when out of
//!   file descriptors; [`workers`]: the threads (a runtime each) proxy
//!   connections are spread over;
//!   `connection`: one connection served as HTTP/1.1 or HTTP/2, with
//!   the listener's limits.
//! - [`systemd`]: readiness, reloads, the drain and a watchdog told to
//!   systemd.
//! - [`tls`]: certificates from PEM files: the listeners' (swapped on
//!   SIGHUP) and what upstream connections trust and present.
//! - [`pipeline`]: the life of a request, one module per phase (the
//!   `unknown` operation's reconcile probes among them), and its error.
//! - The operation model (fingerprint, state, settlement, events), the
//!   canonical JSON fingerprints read, the clock and the one backoff are the
//!   crate below this one, [`idemgate_model`].
//! - The store, the only truth about operations, and the secret scopes are
//!   keyed with, are the crates below this one: the interface
//!   [`idemgate_store`], with its backends [`idemgate_store_sqlite`] and
//!   [`idemgate_store_postgres`] (shared by several replicas), where all
//!   SQL lives. [`stores`] opens the one `[store]` names; everything else
//!   holds the interface's traits. The store knows neither the pipeline nor
//!   the metrics exporter: [`metrics`] reads its counters.
//! - `replicas`: dead owners' operations, and keeping up with peer replicas.
//! - `route_settings`: a start that would leave stored operations unfound
//!   (a route renamed, its scopes or fingerprints made otherwise) noticed.
//! - `retention`: the background sweep of expired operations;
//!   `background`: the background loops' one shape.
//! - [`alerts`]: webhooks told about held work, from the store's outbox.
//! - [`http_client`]: the client for the gateway's own calls (not proxied).
//! - `problem`: the RFC 9457 problem+json body of every error idemgate
//!   answers itself, on both listeners.
//! - `traces`: OpenTelemetry spans of each request's steps, exported over
//!   OTLP when an `OTEL_*` endpoint is set.
//! - [`admin`]: the operators' listener (the admin API and the operator
//!   console at `/`); [`metrics`]: Prometheus counters.
//! - [`rekey`]: `idemgate rekey`, stored payloads sealed again under the current key.
//! - [`log_sink`]: log lines batched in memory, written by a thread of their own;
//!   [`access_log`]: a request's line, in a format of its own, straight into
//!   the sink.
//! - [`body`]: the body types the proxy sends.
//!
//! # Life of a write request
//! path (normalized) → route → key and scope → body (bounded) → fingerprint
//! (the write's identity, built once) → replay cache → claim (one commit;
//! from here in a task of its own) → forward → record (one commit) →
//! respond. A key that already has an operation is answered from the
//! operation the store holds now for it instead: from the replay cache when
//! it holds it, else by the claim (ARCHITECTURE.md §2):
//!
//! | state | what a request with the key gets |
//! |---|---|
//! | `in_progress` | 409 `request-in-progress` + `Retry-After` |
//! | `completed` | the stored response, `Idempotent-Replayed: true` |
//! | `unknown` | 409 `outcome-unknown`: nothing sent until it is resolved |
//! | `not_attempted` | forwarded as a fresh attempt |
//!
//! A key reused with a different fingerprint is 422 `key-reused` in any state.
//! The whole story, module by module, is in ARCHITECTURE.md. No two of
//! these modules import each other (tests/it/layout.rs checks it).
#![forbid(unsafe_code)]

mod accept;
pub mod access_log;
pub mod admin;
pub mod alerts;
mod background;
mod bearer;
pub mod body;
pub mod config;
mod connection;
pub mod http_client;
pub mod log_sink;
pub mod metrics;
pub mod pipeline;
mod problem;
pub mod profile;
pub mod rekey;
mod replicas;
mod request_path;
mod retention;
pub mod route_settings;
pub mod server;
pub mod stores;
pub mod systemd;
pub mod tls;
mod traces;
pub mod workers;
mod write_stall;
