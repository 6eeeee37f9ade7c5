//! Model-based test: random sequences of keyless and keyed writes, window
//! expiries, lost responses, refusals, pauses, resumes, the pause latch,
//! operator resolutions and restarts, run against the real gateway (SQLite
//! file, or a PostgreSQL schema; manual clock, fake upstream) and against a
//! reference model of the states table. Every answer, and the number of
//! writes that reached the upstream, must be what the model says — so a
//! rule that answers from anything but the operation the store holds now
//! is caught by construction.
//!
//! Seeded: a failure prints its seed and the steps that led to it; rerun
//! one seed with `IDEMGATE_MODEL_SEED=<n>`.

mod common;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::Duration;

use common::*;
use http::StatusCode;
use idemgate::clock::{Clock, ManualClock};
use serde_json::json;

const BODIES: [&str; 2] = [r#"{"task":"a"}"#, r#"{"task":"b"}"#];
const WINDOW_MS: i64 = 10_000;
/// Time steps the model takes; no sum of them is exactly the window.
const STEPS_MS: [u64; 2] = [3_000, 11_000];
const LATCH: usize = 3;
const SEEDS: u64 = 16;
const STEPS: usize = 60;

/// Who a write is, in the model: the derived key of body `i`, or one
/// explicit key shared by both bodies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Identity {
    Derived(usize),
    Explicit,
}

#[derive(Debug, Clone, Copy)]
enum Action {
    /// `keyless`: no header (the key is derived, with the window); else
    /// the identity's key sent explicitly.
    Write {
        identity: Identity,
        keyless: bool,
        body: usize,
        fate: Scripted,
    },
    Advance(u64),
    Pause,
    Resume,
    Resolve {
        identity: Identity,
        completed: bool,
    },
    Restart,
}

#[derive(Debug, Clone, PartialEq)]
enum State {
    /// What a replay answers: the body bytes.
    Completed(Vec<u8>),
    Unknown,
    NotAttempted,
}

#[derive(Debug, Clone)]
struct Operation {
    body: usize,
    state: State,
    updated_at: i64,
}

/// The reference: the current operation per identity, the pause, the
/// committed writes, and the store's clock.
#[derive(Default)]
struct Model {
    current: HashMap<Identity, Operation>,
    paused: bool,
    writes: usize,
    now: i64,
    resolutions: usize,
}

/// What the gateway must answer.
#[derive(Debug)]
enum Expect {
    Fresh,
    Replay(Vec<u8>),
    Problem(u16, &'static str),
    Refused,
}

impl Model {
    /// The operation a write sees: a settled one past the window is not
    /// current for a keyless write (the next claim supersedes it).
    fn current_for(&self, identity: Identity, keyless: bool) -> Option<&Operation> {
        self.current.get(&identity).filter(|op| {
            let settled = !matches!(op.state, State::Unknown);
            !(keyless && settled && op.updated_at < self.now - WINDOW_MS)
        })
    }

    fn write(&mut self, identity: Identity, keyless: bool, body: usize, fate: Scripted) -> Expect {
        let sends = match self.current_for(identity, keyless) {
            Some(op) if op.body != body => return Expect::Problem(422, "key-reused"),
            Some(Operation {
                state: State::Completed(stored),
                ..
            }) => return Expect::Replay(stored.clone()),
            Some(Operation {
                state: State::Unknown,
                ..
            }) => return Expect::Problem(409, "outcome-unknown"),
            Some(_) | None => true,
        };
        assert!(sends);
        if self.paused {
            return Expect::Problem(503, "route-paused");
        }
        let (state, expect) = match fate {
            Scripted::Create => {
                self.writes += 1;
                // Filled in with the real body once the answer is seen.
                (State::Completed(Vec::new()), Expect::Fresh)
            }
            Scripted::Drop => {
                self.writes += 1;
                (State::Unknown, Expect::Problem(502, "outcome-unknown"))
            }
            Scripted::Refuse(_) => (State::NotAttempted, Expect::Refused),
        };
        let unknown = state == State::Unknown;
        self.current.insert(
            identity,
            Operation {
                body,
                state,
                updated_at: self.now,
            },
        );
        if unknown && self.unknown_count() >= LATCH {
            self.paused = true;
        }
        expect
    }

    fn unknown_count(&self) -> usize {
        self.current
            .values()
            .filter(|op| op.state == State::Unknown)
            .count()
    }

    fn held(&self) -> Vec<Identity> {
        let mut held: Vec<Identity> = self
            .current
            .iter()
            .filter(|(_, op)| op.state == State::Unknown)
            .map(|(id, _)| *id)
            .collect();
        held.sort_by_key(|id| format!("{id:?}"));
        held
    }
}

fn random_action(rng: &mut fastrand::Rng, model: &Model, keys: &HashMap<usize, String>) -> Action {
    let fates = [
        Scripted::Create,
        Scripted::Create,
        Scripted::Drop,
        Scripted::Refuse(503),
    ];
    match rng.u32(0..20) {
        0..=11 => {
            let body = rng.usize(0..BODIES.len());
            let (identity, keyless) = match rng.u32(0..4) {
                0 => (Identity::Explicit, false),
                1 if !keys.is_empty() => {
                    // A derived key sent back explicitly, with either body.
                    let mut known: Vec<usize> = keys.keys().copied().collect();
                    known.sort_unstable();
                    (Identity::Derived(known[rng.usize(0..known.len())]), false)
                }
                _ => (Identity::Derived(body), true),
            };
            Action::Write {
                identity,
                keyless,
                body,
                fate: fates[rng.usize(0..fates.len())],
            }
        }
        12..=14 => Action::Advance(STEPS_MS[rng.usize(0..STEPS_MS.len())]),
        15 => Action::Pause,
        16 => Action::Resume,
        17 | 18 => match model.held().first() {
            Some(identity) => Action::Resolve {
                identity: *identity,
                completed: rng.bool(),
            },
            None => Action::Resume,
        },
        _ => Action::Restart,
    }
}

/// One seeded sequence, on a SQLite file or (`postgres`) in a PostgreSQL
/// schema of its own.
async fn run_sequence(seed: u64, postgres: Option<&PgSchema>) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let clock = ManualClock::new();
    let route = format!(
        "key = \"derive\"\nderive_window = \"{WINDOW_MS}ms\"\npause_after_unknown = {LATCH}"
    );
    let mut setup = Setup::route(&route).clock(clock.clone()).admin();
    if let Some(schema) = postgres {
        setup = setup.postgres(schema);
    }
    let mut gw = spawn_gateway_with(setup).await;
    let start = clock.now_millis();
    let mut model = Model::default();
    let mut keys: HashMap<usize, String> = HashMap::new();
    let mut log = String::new();
    for step in 0..STEPS {
        let action = random_action(&mut rng, &model, &keys);
        let _ = writeln!(log, "{step}: {action:?}");
        macro_rules! fail {
            ($($what:tt)*) => {
                panic!("seed {seed}, step {step}: {}\nsteps:\n{log}", format!($($what)*))
            };
        }
        match action {
            Action::Write {
                identity,
                keyless,
                body,
                fate,
            } => {
                gw.upstream.script(fate);
                let key = match (identity, keyless) {
                    (_, true) => None,
                    (Identity::Explicit, false) => Some("explicit-key".to_owned()),
                    (Identity::Derived(i), false) => keys.get(&i).cloned(),
                };
                let resp = write(gw.addr(), "/scripted", key.as_deref(), BODIES[body]).await;
                if keyless {
                    match resp.header("idempotency-key") {
                        Some(announced) => {
                            let known = keys.entry(body).or_insert_with(|| announced.to_owned());
                            if known != announced {
                                fail!("derived key changed: {known} then {announced}");
                            }
                        }
                        None => fail!("no derived key announced: {}", resp.status),
                    }
                }
                let expect = model.write(identity, keyless, body, fate);
                let text = String::from_utf8_lossy(&resp.body).into_owned();
                let seen = format!("{} replayed={} {text}", resp.status, resp.is_replay());
                let _ = writeln!(log, "    -> {seen}");
                let ok = match &expect {
                    Expect::Fresh => resp.status == StatusCode::CREATED && !resp.is_replay(),
                    Expect::Replay(stored) => resp.is_replay() && resp.body[..] == stored[..],
                    Expect::Problem(status, name) => {
                        resp.status.as_u16() == *status
                            && text.contains(&format!("urn:idemgate:problem:{name}"))
                    }
                    Expect::Refused => {
                        resp.status == StatusCode::SERVICE_UNAVAILABLE
                            && text.contains("upstream_status")
                    }
                };
                if !ok {
                    fail!("expected {expect:?}, got {seen}");
                }
                if let Expect::Fresh = expect
                    && let Some(op) = model.current.get_mut(&identity)
                {
                    op.state = State::Completed(resp.body.to_vec());
                }
            }
            Action::Advance(ms) => {
                clock.advance(Duration::from_millis(ms));
                model.now = clock.now_millis() - start;
            }
            Action::Pause | Action::Resume => {
                let verb = if matches!(action, Action::Pause) {
                    "pause"
                } else {
                    "resume"
                };
                let resp = gw
                    .admin("POST", &format!("/admin/routes/api/{verb}"), "")
                    .await;
                if resp.status != StatusCode::OK {
                    fail!("{verb}: {}", resp.status);
                }
                model.paused = verb == "pause";
            }
            Action::Resolve {
                identity,
                completed,
            } => {
                let key = match identity {
                    Identity::Explicit => "explicit-key".to_owned(),
                    Identity::Derived(i) => keys[&i].clone(),
                };
                let shown = gw.operation(&key).await;
                let Some(id) = shown["id"].as_str() else {
                    fail!("no operation id: {shown}")
                };
                model.resolutions += 1;
                let body = json!({ "resolution": model.resolutions });
                let resolution = if completed {
                    json!({"outcome": "completed", "operator": "model",
                           "response": {"status": 201, "body": body}})
                } else {
                    json!({"outcome": "not_attempted", "operator": "model"})
                };
                let resp = gw
                    .admin(
                        "POST",
                        &format!("/admin/keys/{id}/resolve"),
                        &resolution.to_string(),
                    )
                    .await;
                if resp.status != StatusCode::OK {
                    fail!("resolve: {} {:?}", resp.status, resp.body);
                }
                let op = model.current.get_mut(&identity).expect("held operation");
                op.state = if completed {
                    State::Completed(body.to_string().into_bytes())
                } else {
                    State::NotAttempted
                };
                op.updated_at = model.now;
            }
            Action::Restart => gw.restart().await,
        }
        if gw.upstream.writes() != model.writes {
            fail!(
                "the upstream saw {} writes, the model {}",
                gw.upstream.writes(),
                model.writes
            );
        }
    }
}

/// The seeds to run: `IDEMGATE_MODEL_SEED`, or `1..=SEEDS`.
fn seeds() -> Vec<u64> {
    match std::env::var("IDEMGATE_MODEL_SEED") {
        Ok(seed) => vec![seed.parse().expect("IDEMGATE_MODEL_SEED is a number")],
        Err(_) => (1..=SEEDS).collect(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_matches_the_states_model() {
    for seed in seeds() {
        tokio::time::timeout(Duration::from_secs(60), run_sequence(seed, None))
            .await
            .unwrap_or_else(|_| panic!("seed {seed} took longer than 60 s"));
    }
}

/// The same sequences on the PostgreSQL store (no replay cache, the
/// claim function, leases), a schema per seed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_matches_the_states_model_on_postgres() {
    for seed in seeds() {
        let Some(schema) = PgSchema::create().await else {
            return;
        };
        tokio::time::timeout(Duration::from_secs(60), run_sequence(seed, Some(&schema)))
            .await
            .unwrap_or_else(|_| panic!("seed {seed} took longer than 60 s"));
    }
}
