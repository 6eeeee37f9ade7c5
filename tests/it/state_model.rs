//! Model-based test: random sequences of keyless and keyed writes, window
//! expiries, lost responses, refusals, pauses, resumes, the pause latch,
//! operator resolutions and restarts, run against the real gateway (SQLite
//! file, or a PostgreSQL schema; manual clock, fake upstream) and against a
//! reference model of the states table. Every answer, and the number of
//! writes that reached the upstream, must be what the model says — so a
//! rule that answers from anything but the operation the store holds now
//! is caught by construction.
//!
//! On PostgreSQL the model also runs against two replicas (in-process
//! gateways on one schema, one lease of 1 s each): writes go through
//! either, and a replica's lease stalls (the test holds its `replicas`
//! row locked) with writes in flight — answers the upstream holds, a
//! write still connecting to a route whose upstream is down. The peer
//! marks them lost (`Store::recover`, as its watch does); held answers
//! then lose their compare-and-set and settle the operation only within
//! `late_window`, the connecting write is fenced (503 `lease-lost`) while
//! its retry through the peer sends, and operators resolve what is held.
//! An in-process replica cannot be frozen, so a held answer stands for a
//! replica frozen mid-write: what the client hears is decided by the
//! record's compare-and-set, which happens the same way after a thaw.
//! Every sequence ends with a replay, through every replica, of each key
//! the store holds completed: no client was told a 201 the store does not
//! hold.
//!
//! Seeded: a failure prints its seed and the steps that led to it; rerun
//! one seed with `IDEMGATE_MODEL_SEED=<n>`.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use http::StatusCode;
use idemgate_model::clock::{Clock, ManualClock};
use idemgate_store::Store;
use serde_json::{Value, json};
use sqlx::Connection;

const BODIES: [&str; 2] = [r#"{"task":"a"}"#, r#"{"task":"b"}"#];
const WINDOW_MS: i64 = 10_000;
/// Time steps the model takes; no sum of them is exactly the window.
const STEPS_MS: [u64; 2] = [3_000, 11_000];
const LATCH: usize = 3;
const SEEDS: u64 = 16;
const STEPS: usize = 60;
/// The replica sequences: fewer, as each lease stall waits out a real
/// lease (about a second), at most [`STALLS`] each.
const REPLICA_SEEDS: u64 = 4;
const REPLICA_STEPS: usize = 40;
const STALLS: usize = 2;
/// The shortest lease there is, for a stall to wait out.
const LEASE: &str = "lease = \"1s\"";
const LATE_WINDOW_MS: i64 = 5_000;
/// What an operator waits before a `not_attempted` resolution: just past
/// the late window; no sum of it and [`STEPS_MS`] is the window.
const WAIT_OUT_LATE_MS: u64 = LATE_WINDOW_MS as u64 + 1;
/// Past the late window; no sum of it and [`STEPS_MS`] is the window.
const PAST_LATE_MS: u64 = 6_000;
/// The key of the write to the route whose upstream is down.
const GATED_KEY: &str = "gated-key";

/// Who a write is, in the model: the derived key of body `i`, one
/// explicit key shared by both bodies, or the `n`th key first written
/// while its replica's lease stalled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Identity {
    Derived(usize),
    Explicit,
    Held(usize),
}

#[derive(Debug, Clone, Copy)]
enum Action {
    /// `keyless`: no header (the key is derived, with the window); else
    /// the identity's key sent explicitly.
    /// Through replica `via` (0 without replicas).
    Write {
        via: usize,
        identity: Identity,
        keyless: bool,
        body: usize,
        fate: Scripted,
    },
    Advance(u64),
    Pause,
    Resume,
    Resolve {
        via: usize,
        identity: Identity,
        completed: bool,
    },
    Restart(usize),
    /// Replica `via`'s lease stalls with `held` writes upstream whose
    /// answers the upstream holds, and (`fenced`) a write still connecting
    /// to the route whose upstream is down; the peer marks them lost; the
    /// first `in_time` answers come within the late window, the rest
    /// after it.
    Stall {
        via: usize,
        held: usize,
        in_time: usize,
        fenced: bool,
    },
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
/// committed writes, and the store's clock. The writes are compared with
/// the upstream's after every step, and the model sends only for a key
/// with no operation or one `not_attempted`: so no key is written twice
/// unless an operator resolved it `not_attempted`.
#[derive(Default)]
struct Model {
    current: HashMap<Identity, Operation>,
    paused: bool,
    /// `pause_after_unknown`; 0: no latch.
    latch: usize,
    writes: usize,
    now: i64,
    resolutions: usize,
    /// How many [`Identity::Held`] there are.
    held: usize,
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
            Scripted::Create | Scripted::Hold => {
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
        if unknown && self.latch > 0 && self.unknown_count() >= self.latch {
            self.paused = true;
        }
        expect
    }

    /// A peer marked `identity`'s attempt lost (`replica-lost`).
    fn mark_lost(&mut self, identity: Identity) {
        if let Some(op) = self.current.get_mut(&identity) {
            op.state = State::Unknown;
            op.updated_at = self.now;
        }
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

/// What a sequence may still do: the replicas it writes through, and on
/// replicas, whether a stall (and a fenced write) is left.
struct Room {
    replicas: usize,
    stalls: usize,
    fenced: bool,
}

fn random_action(
    rng: &mut fastrand::Rng,
    model: &Model,
    keys: &HashMap<usize, String>,
    room: &Room,
) -> Action {
    let fates = [
        Scripted::Create,
        Scripted::Create,
        Scripted::Drop,
        Scripted::Refuse(503),
    ];
    // Drawn only with replicas, so the sequences of one gateway stay
    // what they were.
    let via = |rng: &mut fastrand::Rng| {
        if room.replicas > 1 {
            rng.usize(0..room.replicas)
        } else {
            0
        }
    };
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
                2 if room.replicas > 1 && model.held > 0 => {
                    (Identity::Held(rng.usize(0..model.held)), false)
                }
                _ => (Identity::Derived(body), true),
            };
            Action::Write {
                via: via(rng),
                identity,
                keyless,
                body,
                fate: fates[rng.usize(0..fates.len())],
            }
        }
        12..=14 => Action::Advance(STEPS_MS[rng.usize(0..STEPS_MS.len())]),
        15 | 16 if room.replicas > 1 => {
            if room.stalls == 0 {
                return Action::Advance(STEPS_MS[0]);
            }
            let held = rng.usize(1..=2);
            Action::Stall {
                via: via(rng),
                held,
                in_time: rng.usize(0..=held),
                fenced: room.fenced && rng.bool(),
            }
        }
        15 => Action::Pause,
        16 => Action::Resume,
        17 | 18 => match model.held().first() {
            Some(identity) => Action::Resolve {
                via: via(rng),
                identity: *identity,
                completed: rng.bool(),
            },
            None if room.replicas > 1 => Action::Advance(STEPS_MS[0]),
            None => Action::Resume,
        },
        _ => Action::Restart(via(rng)),
    }
}

impl Expect {
    /// Whether `resp` is this answer.
    fn seen_in(&self, resp: &Response) -> bool {
        let text = String::from_utf8_lossy(&resp.body);
        match self {
            Expect::Fresh => resp.status == StatusCode::CREATED && !resp.is_replay(),
            Expect::Replay(stored) => resp.is_replay() && resp.body[..] == stored[..],
            Expect::Problem(status, name) => {
                resp.status.as_u16() == *status
                    && text.contains(&format!("urn:idemgate:problem:{name}"))
            }
            Expect::Refused => {
                resp.status == StatusCode::SERVICE_UNAVAILABLE && text.contains("upstream_status")
            }
        }
    }
}

/// What a replica sequence has beyond one gateway's.
struct Replicas {
    schema: String,
    /// A third replica of the test's own, that marks lost attempts as a
    /// peer's watch does, without waiting for the watch's period.
    peer: Arc<dyn Store>,
    /// Each replica's owner id (`replicas.id`).
    owners: Vec<String>,
    /// Where the gated route's upstream comes up, once, in a stall:
    /// refusing until then.
    gated_at: Option<RefusingPort>,
    gated: Option<FakeUpstream>,
    /// The gated key's first answer, once told 201.
    gated_told: Option<Vec<u8>>,
}

/// One sequence's gateways, model and log.
struct Run {
    clock: Arc<ManualClock>,
    start: i64,
    /// The replicas; the first holds the upstream.
    gws: Vec<TestGateway>,
    model: Model,
    keys: HashMap<usize, String>,
    log: String,
    replicas: Option<Replicas>,
}

impl Run {
    fn upstream(&self) -> &FakeUpstream {
        &self.gws[0].upstream
    }

    fn key_of(&self, identity: Identity) -> Option<String> {
        match identity {
            Identity::Explicit => Some("explicit-key".to_owned()),
            Identity::Derived(i) => self.keys.get(&i).cloned(),
            Identity::Held(n) => Some(format!("held-{n}")),
        }
    }

    /// Logs `resp`; whether it is `expect`.
    fn answer(&mut self, expect: &Expect, resp: &Response) -> Result<(), String> {
        let text = String::from_utf8_lossy(&resp.body);
        let seen = format!("{} replayed={} {text}", resp.status, resp.is_replay());
        let _ = writeln!(self.log, "    -> {seen}");
        if expect.seen_in(resp) {
            Ok(())
        } else {
            Err(format!("expected {expect:?}, got {seen}"))
        }
    }

    fn advance(&mut self, ms: u64) {
        self.clock.advance(Duration::from_millis(ms));
        self.model.now = self.clock.now_millis() - self.start;
    }

    /// An operator about to resolve a held write `not_attempted` waits
    /// until its attempt can no longer land (the late window after it was
    /// held; before, the gateway refuses it, as
    /// `admin_api::not_attempted_waits_until_the_attempt_can_no_longer_land`
    /// checks).
    fn wait_out_the_late_window(&mut self) {
        let _ = writeln!(self.log, "    (the operator waits {WAIT_OUT_LATE_MS} ms)");
        self.advance(WAIT_OUT_LATE_MS);
    }

    async fn step(&mut self, action: Action) -> Result<(), String> {
        match action {
            Action::Write {
                via,
                identity,
                keyless,
                body,
                fate,
            } => self.write(via, identity, keyless, body, fate).await?,
            Action::Advance(ms) => self.advance(ms),
            Action::Pause | Action::Resume => {
                let verb = if matches!(action, Action::Pause) {
                    "pause"
                } else {
                    "resume"
                };
                let resp = self.gws[0]
                    .admin("POST", &format!("/admin/routes/api/{verb}"), "")
                    .await;
                if resp.status != StatusCode::OK {
                    return Err(format!("{verb}: {}", resp.status));
                }
                self.model.paused = verb == "pause";
            }
            Action::Resolve {
                via,
                identity,
                completed,
            } => self.resolve(via, identity, completed).await?,
            Action::Restart(via) => {
                self.gws[via].restart().await;
                if let Some(replicas) = &mut self.replicas {
                    replicas.owners[via] = newest_replica(&replicas.schema).await;
                }
            }
            Action::Stall {
                via,
                held,
                in_time,
                fenced,
            } => self.stall(via, held, in_time, fenced).await?,
        }
        if self.upstream().writes() != self.model.writes {
            return Err(format!(
                "the upstream saw {} writes, the model {}",
                self.upstream().writes(),
                self.model.writes
            ));
        }
        Ok(())
    }

    async fn write(
        &mut self,
        via: usize,
        identity: Identity,
        keyless: bool,
        body: usize,
        fate: Scripted,
    ) -> Result<(), String> {
        self.upstream().script(fate);
        let key = if keyless { None } else { self.key_of(identity) };
        let resp = write(
            self.gws[via].addr(),
            "/scripted",
            key.as_deref(),
            BODIES[body],
        )
        .await;
        if keyless {
            match resp.header("idempotency-key") {
                Some(announced) => {
                    let known = self
                        .keys
                        .entry(body)
                        .or_insert_with(|| announced.to_owned());
                    if known != announced {
                        return Err(format!("derived key changed: {known} then {announced}"));
                    }
                }
                None => return Err(format!("no derived key announced: {}", resp.status)),
            }
        }
        let expect = self.model.write(identity, keyless, body, fate);
        self.answer(&expect, &resp)?;
        if let Expect::Fresh = expect {
            self.settle(identity, &resp);
        }
        Ok(())
    }

    /// `identity`'s operation holds what `resp`, a first answer, said.
    fn settle(&mut self, identity: Identity, resp: &Response) {
        if let Some(op) = self.model.current.get_mut(&identity) {
            op.state = State::Completed(resp.body.to_vec());
        }
    }

    /// `resolution` of `id` through gateway `via`, as an operator makes
    /// it: an operation marked with its attempt in flight (a stalled
    /// replica's) may land for that attempt's exchange after the mark, not
    /// only the late window, so a 409 says until when, and the operator
    /// waits that out and resolves again. `what` names it in an error.
    async fn resolve_told(
        &mut self,
        via: usize,
        id: &str,
        resolution: &Value,
        what: &str,
    ) -> Result<Response, String> {
        let resp = self.gws[via].resolve(id, resolution).await;
        if resp.status != StatusCode::CONFLICT {
            return Ok(resp);
        }
        let Some(seconds) = resp
            .header("retry-after")
            .and_then(|s| s.parse::<u64>().ok())
        else {
            return Err(format!("{what}: 409 {:?}", resp.body));
        };
        let _ = writeln!(
            self.log,
            "    (told to wait, the operator waits {seconds} s)"
        );
        self.advance(seconds * 1000 + 1);
        Ok(self.gws[via].resolve(id, resolution).await)
    }

    async fn resolve(
        &mut self,
        via: usize,
        identity: Identity,
        completed: bool,
    ) -> Result<(), String> {
        let key = self.key_of(identity).expect("a held operation's key");
        let shown = self.gws[via].operation(&key).await;
        let Some(id) = shown["id"].as_str() else {
            return Err(format!("no operation id: {shown}"));
        };
        self.model.resolutions += 1;
        let body = json!({ "resolution": self.model.resolutions });
        let resolution = if completed {
            json!({"outcome": "completed", "operator": "model",
                   "response": {"status": 201, "body": body}})
        } else {
            self.wait_out_the_late_window();
            json!({"outcome": "not_attempted", "operator": "model"})
        };
        let resp = self.resolve_told(via, id, &resolution, "resolve").await?;
        if resp.status != StatusCode::OK {
            return Err(format!("resolve: {} {:?}", resp.status, resp.body));
        }
        let op = self
            .model
            .current
            .get_mut(&identity)
            .expect("held operation");
        op.state = if completed {
            State::Completed(body.to_string().into_bytes())
        } else {
            State::NotAttempted
        };
        op.updated_at = self.model.now;
        Ok(())
    }

    /// [`Action::Stall`].
    async fn stall(
        &mut self,
        via: usize,
        held: usize,
        in_time: usize,
        fenced: bool,
    ) -> Result<(), String> {
        let replicas = self.replicas.as_ref().expect("a stall needs replicas");
        let (schema, owner) = (replicas.schema.clone(), replicas.owners[via].clone());
        let peer = 1 - via;
        let addr = self.gws[via].addr();
        let fenced = fenced.then(|| {
            tokio::spawn(
                async move { write(addr, "/gated/orders", Some(GATED_KEY), BODIES[0]).await },
            )
        });
        let mut answers = Vec::new();
        for _ in 0..held {
            let identity = Identity::Held(self.model.held);
            self.model.held += 1;
            let body = self.model.held % BODIES.len();
            let expect = self.model.write(identity, false, body, Scripted::Hold);
            assert!(matches!(expect, Expect::Fresh), "a new key sends");
            self.upstream().script(Scripted::Hold);
            let key = self.key_of(identity).expect("a held key");
            let answer =
                tokio::spawn(
                    async move { write(addr, "/scripted", Some(&key), BODIES[body]).await },
                );
            // In order: the upstream lets the held answers go first held first.
            self.upstream().wait_for_writes(self.model.writes).await;
            answers.push((identity, answer));
        }
        let claimed = held + usize::from(fenced.is_some());
        eventually("the stalled replica's claims", || async {
            (in_progress_of(&schema, &owner).await == claimed).then_some(())
        })
        .await;

        // The replica's lease cannot renew while the test holds its row.
        let mut stall = database().await;
        let lock =
            format!("BEGIN; SELECT 1 FROM {schema}.replicas WHERE id = '{owner}' FOR UPDATE");
        sqlx::raw_sql(&lock)
            .execute(&mut stall)
            .await
            .expect("lock the replica's row");

        // Once its lease runs out by the database's clock, a peer marks
        // what it held lost; the fenced write may have settled itself
        // `not_attempted` first.
        let peer_store = self.replicas.as_ref().expect("replicas").peer.clone();
        eventually("the peer marking the stalled replica lost", || async {
            peer_store.recover().await.expect("recover");
            (!lease_runs(&schema, &owner).await && in_progress_of(&schema, &owner).await == 0)
                .then_some(())
        })
        .await;
        for (identity, _) in &answers {
            self.model.mark_lost(*identity);
        }
        // Past its lease, the replica claims nothing.
        self.upstream().script(Scripted::Create);
        let _ = writeln!(self.log, "    stalled replica {via} claims:");
        let key = format!("claimed-while-stalled-{}", self.model.now);
        let refused = write(addr, "/scripted", Some(&key), BODIES[0]).await;
        self.answer(&Expect::Problem(503, "store-unavailable"), &refused)?;

        // The held answers come, first within the late window of the
        // peer's mark, then past it: a lost compare-and-set each.
        for (i, (identity, answer)) in answers.into_iter().enumerate() {
            if i == in_time {
                self.advance(PAST_LATE_MS);
            }
            self.upstream().release_one();
            let resp = tokio::time::timeout(WAIT, answer)
                .await
                .map_err(|_| format!("held write {identity:?} never answered"))?
                .expect("write task");
            let _ = writeln!(self.log, "    {identity:?} answered:");
            if i < in_time {
                self.answer(&Expect::Fresh, &resp)?;
                self.settle(identity, &resp);
            } else {
                self.answer(&Expect::Problem(409, "outcome-unknown"), &resp)?;
            }
        }
        if let Some(first) = fenced {
            self.fenced(peer, first).await?;
        }

        sqlx::query("ROLLBACK")
            .execute(&mut stall)
            .await
            .expect("rollback");
        // The replica renews on its schedule and serves again.
        let admin = self.gws[via].admin_addr();
        eventually("the stalled replica ready again", || async {
            let ready = send(admin, "GET", "/readyz", &[], bytes::Bytes::new()).await;
            (ready.status == StatusCode::OK).then_some(())
        })
        .await;
        Ok(())
    }

    /// The stalled replica's write to the gated route, `first`: held
    /// (`replica-lost`, resolved `not_attempted` by an operator, unless
    /// its fenced owner settles it first) or settled `not_attempted`
    /// (`lease-lost`); its retry through `peer`
    /// sends once the upstream is up; `first` ends fenced, unsent.
    async fn fenced(
        &mut self,
        peer: usize,
        first: tokio::task::JoinHandle<Response>,
    ) -> Result<(), String> {
        let op = self.gws[peer].operation(GATED_KEY).await;
        let _ = writeln!(self.log, "    gated: {} {}", op["state"], op["evidence"]);
        match (op["state"].as_str(), op["evidence"].as_str()) {
            (Some("unknown"), Some("replica-lost")) => {
                let id = op["id"].as_str().expect("operation id");
                self.wait_out_the_late_window();
                let resolution = json!({"outcome": "not_attempted", "operator": "model"});
                let resp = self
                    .resolve_told(peer, id, &resolution, "resolve gated")
                    .await?;
                // Unless the stalled replica, fenced meanwhile, settled
                // it as never sent first.
                let now = self.gws[peer].operation(GATED_KEY).await;
                let settled_by_owner =
                    now["state"] == "not_attempted" && now["evidence"] == "lease-lost";
                if resp.status != StatusCode::OK && !settled_by_owner {
                    return Err(format!("resolve gated: {} {:?}", resp.status, resp.body));
                }
            }
            (Some("not_attempted"), Some("lease-lost")) => {}
            _ => return Err(format!("the fenced write's operation: {op}")),
        }
        let replicas = self.replicas.as_mut().expect("replicas");
        let gated = FakeUpstream::start_on(
            replicas
                .gated_at
                .take()
                .expect("the gated upstream comes up once")
                .release(),
        )
        .await;
        let retried = write(
            self.gws[peer].addr(),
            "/gated/orders",
            Some(GATED_KEY),
            BODIES[0],
        )
        .await;
        let _ = writeln!(self.log, "    gated retry through {peer}:");
        self.answer(&Expect::Fresh, &retried)?;
        let first = tokio::time::timeout(WAIT, first)
            .await
            .map_err(|_| "the fenced write never answered".to_string())?
            .expect("write task");
        let _ = writeln!(self.log, "    gated first write:");
        self.answer(&Expect::Problem(503, "lease-lost"), &first)?;
        if gated.writes() != 1 {
            return Err(format!(
                "the gated upstream saw {} writes of one key",
                gated.writes()
            ));
        }
        let replicas = self.replicas.as_mut().expect("replicas");
        replicas.gated = Some(gated);
        replicas.gated_told = Some(retried.body.to_vec());
        Ok(())
    }

    /// Every key the store holds completed replays what it holds, through
    /// every replica.
    async fn replay_all(&mut self) -> Result<(), String> {
        let mut completed: Vec<(Identity, usize)> = self
            .model
            .current
            .iter()
            .filter(|(_, op)| matches!(op.state, State::Completed(_)))
            .map(|(identity, op)| (*identity, op.body))
            .collect();
        completed.sort_by_key(|(identity, _)| format!("{identity:?}"));
        for via in 0..self.gws.len() {
            for (identity, body) in &completed {
                let _ = writeln!(self.log, "end: replay {identity:?} through {via}");
                self.write(via, *identity, false, *body, Scripted::Create)
                    .await?;
            }
            let told = self.replicas.as_ref().and_then(|r| r.gated_told.clone());
            if let Some(told) = told {
                let _ = writeln!(self.log, "end: replay {GATED_KEY} through {via}");
                let addr = self.gws[via].addr();
                let resp = write(addr, "/gated/orders", Some(GATED_KEY), BODIES[0]).await;
                self.answer(&Expect::Replay(told), &resp)?;
            }
        }
        Ok(())
    }
}

async fn database() -> sqlx::PgConnection {
    sqlx::PgConnection::connect(&postgres_url())
        .await
        .expect("connect to the test database")
}

/// One value `sql` reads (on a connection of its own), `$1` bound to
/// `owner` when it has one.
async fn read_one<T>(sql: &str, owner: Option<&str>) -> T
where
    T: Send + Unpin + for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    let mut db = database().await;
    let query = sqlx::query_scalar(sql);
    let query = match owner {
        Some(owner) => query.bind(owner.to_owned()),
        None => query,
    };
    let value = query
        .fetch_one(&mut db)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    let _ = db.close().await;
    value
}

/// How many operations `owner` holds `in_progress`.
async fn in_progress_of(schema: &str, owner: &str) -> usize {
    let sql = format!(
        "SELECT count(*) FROM {schema}.operations WHERE owner = $1 AND state = 'in_progress'"
    );
    let count: i64 = read_one(&sql, Some(owner)).await;
    usize::try_from(count).expect("a count")
}

/// Whether `owner`'s lease runs, by the database's clock.
async fn lease_runs(schema: &str, owner: &str) -> bool {
    let sql =
        format!("SELECT lease_until > clock_timestamp() FROM {schema}.replicas WHERE id = $1");
    read_one(&sql, Some(owner)).await
}

/// The replica that registered last (owner ids are UUIDv7: they sort by
/// start time).
async fn newest_replica(schema: &str) -> String {
    let sql = format!("SELECT id FROM {schema}.replicas ORDER BY id DESC LIMIT 1");
    read_one(&sql, None).await
}

/// Where a sequence runs.
enum Place<'a> {
    Sqlite,
    Postgres(&'a PgSchema),
    /// Two replicas on one schema.
    Replicas(&'a PgSchema),
}

/// One seeded sequence at `place`.
async fn run_sequence(seed: u64, place: Place<'_>) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let clock = ManualClock::new();
    let mut route = format!(
        "key = \"derive\"\nderive_window = \"{WINDOW_MS}ms\"\nlate_window = \"{LATE_WINDOW_MS}ms\"\n"
    );
    let mut model = Model::default();
    let gated_at = closed_port().await;
    if let Place::Replicas(_) = place {
        // No latch: a pause reaches the other replica only with its
        // watch, a second later.
        let _ = write!(
            route,
            "\n[[routes]]\nname = \"gated\"\n\
             path_prefix = \"/gated\"\nupstream = \"http://{gated_at}\"\nconnect_retries = 10\n\
             late_window = \"{LATE_WINDOW_MS}ms\"\n"
        );
    } else {
        let _ = write!(route, "pause_after_unknown = {LATCH}");
        model.latch = LATCH;
    }
    let mut setup = Setup::route(&route).clock(clock.clone()).admin();
    if let Place::Postgres(schema) | Place::Replicas(schema) = place {
        setup = setup.postgres(schema);
    }
    let mut gws = Vec::new();
    let mut replicas = None;
    if let Place::Replicas(schema) = place {
        setup = setup.store(LEASE);
        let a = spawn_gateway_with(setup.clone()).await;
        let first = newest_replica(&schema.name).await;
        let url = a.upstream.url();
        gws.push(a);
        let b = spawn_gateway_on(FakeUpstream::start().await, setup.upstream_url(url)).await;
        let second = newest_replica(&schema.name).await;
        gws.push(b);
        let config = parse_config(&gws[0].toml);
        let scope =
            idemgate::stores::scope_key(&config.store, &|_| None).expect("the schema's scope key");
        let keys = idemgate_store::StoreKeys {
            seal: idemgate_store::Seal::plain(),
            scope,
        };
        // Registered before any restart: never the newest replica again.
        let owner = uuid::Uuid::now_v7().to_string();
        let peer = idemgate::stores::open(&config.store, owner, clock.clone(), keys)
            .await
            .expect("open the peer store");
        replicas = Some(Replicas {
            schema: schema.name.clone(),
            peer,
            owners: vec![first, second],
            gated_at: Some(gated_at),
            gated: None,
            gated_told: None,
        });
    } else {
        gws.push(spawn_gateway_with(setup).await);
    }
    let mut room = Room {
        replicas: gws.len(),
        stalls: if replicas.is_some() { STALLS } else { 0 },
        fenced: replicas.is_some(),
    };
    let steps = if replicas.is_some() {
        REPLICA_STEPS
    } else {
        STEPS
    };
    let mut run = Run {
        start: clock.now_millis(),
        clock,
        gws,
        model,
        keys: HashMap::new(),
        log: String::new(),
        replicas,
    };
    for step in 0..steps {
        let action = random_action(&mut rng, &run.model, &run.keys, &room);
        let _ = writeln!(run.log, "{step}: {action:?}");
        if let Action::Stall { fenced, .. } = action {
            room.stalls -= 1;
            room.fenced &= !fenced;
        }
        if let Err(what) = run.step(action).await {
            panic!("seed {seed}, step {step}: {what}\nsteps:\n{}", run.log);
        }
    }
    if let Err(what) = run.replay_all().await {
        panic!("seed {seed}, at the end: {what}\nsteps:\n{}", run.log);
    }
    if let Some(replicas) = &run.replicas {
        replicas.peer.close().await;
    }
}

/// The seeds to run: `IDEMGATE_MODEL_SEED`, or `1..=count`.
fn seeds(count: u64) -> Vec<u64> {
    match std::env::var("IDEMGATE_MODEL_SEED") {
        Ok(seed) => vec![seed.parse().expect("IDEMGATE_MODEL_SEED is a number")],
        Err(_) => (1..=count).collect(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_matches_the_states_model() {
    for seed in seeds(SEEDS) {
        tokio::time::timeout(Duration::from_secs(60), run_sequence(seed, Place::Sqlite))
            .await
            .unwrap_or_else(|_| panic!("seed {seed} took longer than 60 s"));
    }
}

/// Each seed of `count` in a PostgreSQL schema of its own, at the place
/// `place` makes of it.
async fn each_seed_in_a_schema(count: u64, place: fn(&PgSchema) -> Place<'_>) {
    for seed in seeds(count) {
        let schema = PgSchema::create().await;
        tokio::time::timeout(Duration::from_secs(60), run_sequence(seed, place(&schema)))
            .await
            .unwrap_or_else(|_| panic!("seed {seed} took longer than 60 s"));
    }
}

/// The same sequences on the PostgreSQL store (no replay cache, the
/// claim function, leases), a schema per seed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (.ci/run runs it)"]
async fn every_answer_matches_the_states_model_on_postgres() {
    each_seed_in_a_schema(SEEDS, |schema| Place::Postgres(schema)).await;
}

/// Two replicas on one schema, with lease stalls, fenced and late
/// writes, lost compare-and-sets and operators resolving what peers
/// marked lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (.ci/run runs it)"]
async fn every_answer_matches_the_states_model_across_replicas() {
    each_seed_in_a_schema(REPLICA_SEEDS, |schema| Place::Replicas(schema)).await;
}
