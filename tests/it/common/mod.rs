//! Shared harness for the integration tests: fake upstream → idemgate → client.
//!
//! - [`FakeUpstream`]: a real HTTP/1.1 server on `127.0.0.1:0` that records
//!   every request and counts *committed writes* — non-GET requests whose
//!   handler got past its commit point, i.e. side effects the upstream would
//!   have performed. Paths choose the behaviour:
//!   - default: commit, wait `?ms=N` if given, answer 201 `{"id": n,
//!     "received": <body>}` with two `x-upstream-tag` headers (to check
//!     header order and duplicates), and a request's `x-echo` back as `x-echo-tag`;
//!   - `/slow?ms=N`: commit, sleep N ms, then answer like the default;
//!   - `/big?bytes=N`: commit, answer 200 with an N-byte body ([`big_body`]);
//!   - `/hold`: commit, then never answer (until the upstream is dropped);
//!   - `/drop`: commit, then close the connection without an answer;
//!   - `/truncate`: commit, announce a 100-byte body and stop after 6 bytes;
//!   - `/status/{code}`: answer `code` *without* committing (a refusal);
//!   - `/dedup`: an upstream that honours `Idempotency-Key`: the first write
//!     per key commits like the default, a repeat gets the same answer and
//!     commits nothing;
//!   - `/dedup-lost`: the same, but the first write's answer is lost (the
//!     connection closed after the commit): what a re-send under the same
//!     key then gets is the first write's answer;
//!   - `/dedup-busy`: the first write's answer is lost too, and a repeat
//!     under its key gets 409 (still working on it), committing nothing;
//!   - `/commit-then/{code}`: commit, then answer `code` (the write happened,
//!     the answer says otherwise: a 502/504 from a proxy in front of the API);
//!   - `/once/{code}[?ms=N]`: the first write per `Idempotency-Key` waits N
//!     ms and gets `code` uncommitted; later ones commit and wait N ms, then
//!     answer like the default;
//!   - `/alternate`: commit, then answer 202 `{"id": n % 2, "received":
//!     null}`: two nodes in turn, whose answers tell no record from another;
//!   - `/says-replayed`: commit, then answer like the default with
//!     `Idempotent-Replayed: true`, every write a record all the same;
//!   - `/mcp-events`: commit, then answer 200 `text/event-stream` made of
//!     the strings the JSON-RPC body's `params.arguments.events` lists, as
//!     written, `{id}` in each replaced by the request's id (an MCP
//!     server's answer to a tool call, exactly as a test wants its bytes);
//!   - `/scripted`: what [`FakeUpstream::script`] says now (commit and
//!     answer, commit and drop, commit and hold the answer until the test lets
//!     it go, or refuse with a status), so identical
//!     requests can meet different fates.
//!
//!   GET and HEAD are recorded and answered 200 but never counted as writes,
//!   except `GET /lookup?key=K[&ms=N]` (a reconcile probe's target, after N
//!   ms): 200 `{"id": n}` when a write was committed under
//!   `Idempotency-Key: K`, 404 otherwise; `GET /tasks/{key}` (a probe in
//!   the path) likewise answers `{"id": n}` or 404 for the percent-decoded
//!   key, but the collection (200 `{"data": [{"id": 1}]}`) for `/tasks/.`
//!   and `/tasks/..`, as an upstream that resolves dot-segments would.
//!   Accepted TCP connections are counted too.
//!   [`FakeUpstream::start_aliased`] makes a fixed path (an SDK's) behave
//!   as one of these; [`FakeUpstream::start_http2`] serves them over
//!   HTTP/2 (prior knowledge) and [`Recorded::version`] says which.
//! - [`RawUpstream`]: a TCP listener that counts connections and breaks each
//!   one on purpose (close at once, reset after reading the request, a
//!   `101` that no request asked for, an answer that stops coming and
//!   leaves the connection open), or drags its answer out slowly.
//! - [`TestGateway`]: an in-process gateway on a per-test SQLite file;
//!   [`Setup`] adds config lines, another upstream URL or a manual clock;
//!   [`WriteLock`] holds its store's write lock from a second connection.
//! - [`PgSchema`]: a PostgreSQL schema of its own per test, for the
//!   shared store; [`Setup::postgres`] puts a gateway on it,
//!   [`spawn_gateway_on_backend`] on either [`Backend`], and
//!   [`on_each_backend!`] makes a scenario's test for each;
//!   [`admin_connection`] is a test's own connection beside the gateway's.
//! - [`PgPair`]: two PostgreSQL clusters of a test's own, a primary and a
//!   streaming standby, to kill and promote; dropped with the test.
//!   [`TcpRelay`]: a stable address in front of one of them that moves.
//! - [`BinaryGateway`]: the real `idemgate serve` process; [`BinaryMock`]:
//!   the real `idemgate mock-upstream`.
//! - [`send`] / [`write`]: one request through a fresh hyper client;
//!   [`try_send`] when the peer may break or stay silent.
//! - [`silent_port`]: a listener whose full accept queue leaves every
//!   connect unanswered, until [`SilentPort::serve`].
//! - [`raw_exchange`]: raw TCP, for malformed or hand-framed requests;
//!   [`half_closed_exchange`] shuts the write side once the request is sent.
//! - [`TestCa`]: a CA made at test time and the certificates it signs (PEM
//!   files); [`TlsClient`]: a kept-alive connection over TLS;
//!   [`FakeUpstream::start_tls`] serves the fake upstream over TLS.
//! - [`run_to_exit_within`]: a process (the CLI, a client script) run to
//!   its end, killed past a bound; [`require_installed`]: a tool installed
//!   outside cargo is there, or its (`#[ignore]`d) test fails saying so.
//! - [`spawn_child`] (and [`child_status`], [`child_output`]): the only
//!   way to start a child process, so that no child holds a store's lock
//!   while an in-process gateway opens that store again ([`children`]).
//! - [`scrape_metrics`] / [`metric`]: the admin listener's counters.
//! - [`TestGateway::operation`]: an operation as the admin API shows it
//!   (state, attempts, evidence, timeline), for gateways set up with
//!   [`Setup::admin`].
//!
//! - [`eventually`]: a probe asked until it gives a value;
//!   [`next_full_pass`]: a whole pass of a background task (retention,
//!   alerts, replicas) after now, for gateways set up with
//!   [`Setup::quick`] (or patient tests: the passes are counted at any
//!   pace).
//!
//! No fixed ports, no fixed sleeps: every wait is for an event, bounded by
//! [`WAIT`].

use std::collections::{HashMap, HashSet};
use std::io::BufRead;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use idemgate::config::Config;
use idemgate::server::{Gateway, Pace};
use idemgate_model::clock::Clock;
use serde_json::{Value, json};
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// The lower-case hex SHA-256 of `text`: a scope, fingerprint or body
/// digest as the gateway computes them, for tests that call a store.
pub fn digest(text: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(text))
}

/// Upper bound for any single wait in these tests.
pub const WAIT: Duration = Duration::from_secs(15);

/// The credential most tests write with (the default scope header).
pub const ALICE: &str = "Bearer alice-token";
pub const BOB: &str = "Bearer bob-token";

mod admin;
mod binary;
mod children;
mod client;
mod config;
mod gateway;
mod pg_clusters;
mod postgres;
mod raw;
mod relay;
mod tls;
mod tools;
mod upstream;
mod wait;

pub use admin::*;
pub use binary::*;
pub use children::*;
pub use client::*;
pub use config::*;
pub use gateway::*;
pub use pg_clusters::*;
pub use postgres::*;
pub use raw::*;
pub use relay::*;
pub use tls::*;
pub use tools::*;
pub use upstream::*;
pub use wait::*;
