//! `idemgate bench`: a retry-storm load generator in the spirit of pgbench
//! and redis-benchmark (docs/performance.md, "Benchmarking"). K keys × R requests each
//! (the first write and its retries) at concurrency C, against a gateway it
//! starts itself in front of the mock API (`local`) or against
//! `--target`s; then a report of throughput, latency percentiles, outcomes
//! and the upstream's writes.
//!
//! The verdict: a gateway keeps its promise when the upstream committed
//! exactly one write per key sent — `upstream_writes == keys`, and, where
//! the counter reports distinct keys (the mock's `/_effects` does),
//! `upstream_keys == keys`, which rules out one key written twice and
//! another not at all. That holds with `--faults` too: a write whose
//! response was lost is held as `unknown`, and its retries are never sent.
//!
//! Invariant: every loop is bounded in count and time, nothing is sent but
//! to the given targets (or the own stack on 127.0.0.1), and the own stack
//! is shut down and its store removed however the run ends.
//!
//! - `plan`: which request is which (key, path, body);
//! - `load`: the workers, the pooled client, outcome names, latencies;
//! - `progress`: the live line on stderr;
//! - `local`: the own mock API and gateway;
//! - `measure`: the upstream's counter, resident memory, store size;
//! - `report`: the JSON and the text report.

mod counters;
mod load;
mod local;
mod measure;
mod plan;
mod progress;
mod report;

use std::io::Write;
use std::time::Duration;

use crate::cli::Bench;

use load::{HttpClient, Target};
use local::{Local, Setup};
use measure::Effects;
use plan::Plan;
use progress::Progress;
use report::{Compared, Figures, Populated, Report};

/// A bound on `--duration` runs' request count, so no loop is unbounded.
const MAX_REQUESTS: u64 = 1 << 40;
const MAX_DURATION: Duration = Duration::from_secs(24 * 3600);
const MAX_CONCURRENCY: usize = 10_000;
/// Below the gateway's default `max_body` (10 MiB).
const MAX_BODY_BYTES: usize = 8 << 20;

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("{flag}: {reason}")]
    Flag { flag: &'static str, reason: String },
    #[error("--target {url}: {reason}")]
    Target { url: String, reason: String },
    #[error("cannot read the upstream's write counter at {url}: {reason}")]
    Counter { url: String, reason: String },
    #[error("cannot start the mock API and gateway: {0}")]
    Start(String),
    #[error("a load worker failed: {0}")]
    Worker(String),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// Runs the bench as `args` say and writes the report to `out`.
pub async fn run(args: &Bench, out: impl Write) -> Result<Report, BenchError> {
    let plan = plan(args)?;
    let client = load::client(plan.concurrency);
    let progress = Progress::for_stderr(args.json);
    let report = if args.target.is_empty() {
        let local = Local::start(Setup {
            durability: args.durability,
            wait: args.wait,
            sealed: args.sealed,
            forward_key: args.populate.is_none(),
        })
        .await?;
        let report = against_local(args, &plan, &client, progress, &local).await;
        local.stop().await;
        report?
    } else {
        against_targets(args, &plan, &client, progress).await?
    };
    if args.json {
        report.write_json(out)?;
    } else {
        report.write_text(out)?;
    }
    Ok(report)
}

/// The own gateway in front of the own mock; `--compare mock` is that mock.
async fn against_local(
    args: &Bench,
    plan: &Plan,
    client: &HttpClient,
    progress: Progress,
    local: &Local,
) -> Result<Report, BenchError> {
    let run = Run {
        client,
        plan,
        progress,
        driven: format!(
            "an in-process gateway (durability {}, in_progress {}{}) in front of the mock API",
            args.durability.as_str(),
            if args.wait { "wait" } else { "reject" },
            if args.sealed { ", sealed store" } else { "" }
        ),
        targets: vec![Target::parse(&local.target())?],
        effects_url: Some(local.effects_url()),
        count_keys: args.populate.is_none(),
    };
    let compare = match args.compare.as_deref() {
        Some("mock") => Some(local.mock_target()),
        other => other.map(str::to_string),
    };
    let footprint = || Footprint {
        store_bytes: measure::store_bytes(local.store_file()),
        resident_bytes: measure::resident_bytes(None),
        resident_of: "this process: gateway, mock API and load generator".to_string(),
    };
    run.drive(compare.as_deref(), args.populate.map(|_| footprint))
        .await
}

/// Running gateways, with the upstream's counter if given.
async fn against_targets(
    args: &Bench,
    plan: &Plan,
    client: &HttpClient,
    progress: Progress,
) -> Result<Report, BenchError> {
    if args.compare.as_deref() == Some("mock") {
        return Err(BenchError::Flag {
            flag: "--compare",
            reason: "`mock` is the own mock API, which runs only without --target".into(),
        });
    }
    let targets = args
        .target
        .iter()
        .map(|t| Target::parse(t))
        .collect::<Result<Vec<_>, _>>()?;
    let urls: Vec<&str> = targets.iter().map(Target::url).collect();
    let run = Run {
        client,
        plan,
        progress,
        driven: urls.join(", "),
        targets,
        effects_url: args.upstream_effects.clone(),
        count_keys: true,
    };
    let footprint = || Footprint {
        store_bytes: args.store_file.as_deref().and_then(measure::store_bytes),
        resident_bytes: args
            .gateway_pid
            .and_then(|p| measure::resident_bytes(Some(p))),
        resident_of: args
            .gateway_pid
            .map_or("give --gateway-pid".to_string(), |p| format!("process {p}")),
    };
    run.drive(args.compare.as_deref(), args.populate.map(|_| footprint))
        .await
}

/// The plan the flags describe, checked.
fn plan(args: &Bench) -> Result<Plan, BenchError> {
    let flag = |flag, reason: &str| BenchError::Flag {
        flag,
        reason: reason.to_string(),
    };
    let per_key = if args.populate.is_some() {
        1
    } else {
        args.retries
    };
    if per_key == 0 {
        return Err(flag("--retries", "at least 1 (the first write)"));
    }
    let requests = match (args.populate, args.requests, args.duration) {
        (Some(0), _, _) => return Err(flag("--populate", "at least 1")),
        (Some(n), _, _) => n,
        (None, Some(0), _) => return Err(flag("--requests", "at least 1")),
        (None, Some(n), _) => n,
        (None, None, Some(d)) if d.is_zero() || d > MAX_DURATION => {
            return Err(flag("--duration", "more than 0 and at most 24h"));
        }
        (None, None, Some(_)) => MAX_REQUESTS,
        (None, None, None) if args.keys == 0 => return Err(flag("--keys", "at least 1")),
        (None, None, None) => args
            .keys
            .checked_mul(per_key)
            .filter(|n| *n <= MAX_REQUESTS)
            .ok_or_else(|| flag("--keys", "keys × retries is too large"))?,
    };
    if !(1..=MAX_CONCURRENCY).contains(&args.concurrency) {
        return Err(flag("--concurrency", "from 1 to 10000"));
    }
    if !(0.0..=1.0).contains(&args.changed) {
        return Err(flag("--changed", "a fraction from 0 to 1"));
    }
    if args.body_bytes > MAX_BODY_BYTES {
        return Err(flag("--body-bytes", "at most 8 MiB"));
    }
    Ok(Plan {
        per_key,
        requests,
        duration: args.duration,
        concurrency: args.concurrency,
        body_bytes: args.body_bytes,
        changed: args.changed,
        faults: args.faults,
        run_id: uuid::Uuid::now_v7().simple().to_string(),
    })
}

/// What `--populate` reports besides the rate, read while the gateway runs.
struct Footprint {
    store_bytes: Option<u64>,
    resident_bytes: Option<u64>,
    resident_of: String,
}

/// One run against resolved targets.
struct Run<'a> {
    client: &'a HttpClient,
    plan: &'a Plan,
    progress: Progress,
    driven: String,
    targets: Vec<Target>,
    effects_url: Option<String>,
    /// Whether the upstream sees the keys, so its distinct-key count is checked.
    count_keys: bool,
}

impl Run<'_> {
    async fn drive(
        self,
        compare: Option<&str>,
        footprint: Option<impl FnOnce() -> Footprint>,
    ) -> Result<Report, BenchError> {
        let compare = compare.map(Target::parse).transpose()?;
        let before = self.effects().await?;
        let measured = load::run(self.client, &self.targets, self.plan, self.progress).await?;
        let after = self.effects().await?;
        let figures = Figures::from(&measured);
        let populate = footprint.map(|footprint| {
            let footprint = footprint();
            Populated {
                operations: measured.requests,
                rate_per_second: figures.throughput_rps,
                store_bytes: footprint.store_bytes,
                resident_bytes: footprint.resident_bytes,
                resident_of: footprint.resident_of,
            }
        });
        let upstream = after.zip(before).map(|(after, before)| after.since(before));
        let upstream_keys = upstream.and_then(|u| u.keys).filter(|_| self.count_keys);
        let exactly_once = upstream
            .map(|u| u.writes == measured.keys && upstream_keys.is_none_or(|k| k == measured.keys));
        let compare = match compare {
            Some(target) => {
                // New keys: the compare target may be a gateway too.
                let plan = Plan {
                    run_id: uuid::Uuid::now_v7().simple().to_string(),
                    ..self.plan.clone()
                };
                let targets = [target.clone()];
                let other = load::run(self.client, &targets, &plan, self.progress).await?;
                Some(Compared::new(
                    target.url().to_string(),
                    Figures::from(&other),
                    &figures,
                ))
            }
            None => None,
        };
        Ok(Report {
            driven: self.driven,
            targets: self.targets.iter().map(|t| t.url().to_string()).collect(),
            concurrency: self.plan.concurrency,
            requests_per_key: self.plan.per_key,
            body_bytes: self.plan.body_bytes,
            figures,
            keys: measured.keys,
            upstream_writes: upstream.map(|u| u.writes),
            upstream_keys,
            exactly_once,
            compare,
            populate,
        })
    }

    async fn effects(&self) -> Result<Option<Effects>, BenchError> {
        match &self.effects_url {
            Some(url) => measure::effects(self.client, url).await.map(Some),
            None => Ok(None),
        }
    }
}
