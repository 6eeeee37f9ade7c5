//! The report of a run: what was measured, as one JSON object (`--json`)
//! or as aligned lines for a person.
//!
//! Invariant: both forms come from the one [`Report`] value, so they never
//! disagree; the JSON keeps the documented names (`requests`, `seconds`,
//! `throughput_rps`, `latency_ms` {`p50`, `p90`, `p99`, `p999`},
//! `outcomes`, `keys`, `upstream_writes`, `exactly_once`).

use std::collections::BTreeMap;
use std::io::Write;

use serde::Serialize;

use super::load::Measured;

/// A whole run.
#[derive(Debug, Serialize)]
pub struct Report {
    /// What was driven, in words.
    pub(crate) driven: String,
    pub(crate) targets: Vec<String>,
    pub(crate) concurrency: usize,
    pub(crate) requests_per_key: u64,
    pub(crate) body_bytes: usize,
    #[serde(flatten)]
    pub(crate) figures: Figures,
    /// Distinct keys among the requests sent: the writes expected upstream.
    pub(crate) keys: u64,
    /// Writes the upstream committed during the run; `null` without a counter.
    pub(crate) upstream_writes: Option<u64>,
    /// Distinct keys those writes were committed under; `null` when the
    /// counter does not say or the key is not forwarded.
    pub(crate) upstream_keys: Option<u64>,
    /// `upstream_writes == keys` (and `upstream_keys == keys` when counted);
    /// `null` when not checked.
    pub exactly_once: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) compare: Option<Compared>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) populate: Option<Populated>,
}

/// The figures of one load against one set of targets.
#[derive(Debug, Serialize)]
pub struct Figures {
    pub(crate) requests: u64,
    pub(crate) seconds: f64,
    pub(crate) throughput_rps: f64,
    pub(crate) latency_ms: Latency,
    pub(crate) outcomes: BTreeMap<String, u64>,
}

#[derive(Debug, Serialize)]
pub struct Latency {
    pub(crate) p50: f64,
    pub(crate) p90: f64,
    pub(crate) p99: f64,
    pub(crate) p999: f64,
    pub(crate) max: f64,
}

/// The same load against `--compare`, and how the run fared against it.
#[derive(Debug, Serialize)]
pub struct Compared {
    pub(crate) target: String,
    #[serde(flatten)]
    pub(crate) figures: Figures,
    /// The run's throughput over this one's (1.0: as fast); `null` when
    /// this one measured nothing.
    pub(crate) throughput_ratio: Option<f64>,
    /// The run's p50 and p99 latency over this one's (1.0: as fast);
    /// `null` when this one measured nothing.
    pub(crate) p50_ratio: Option<f64>,
    pub(crate) p99_ratio: Option<f64>,
}

/// `--populate`: how fast completed operations were stored, and what they cost.
#[derive(Debug, Serialize)]
pub struct Populated {
    pub(crate) operations: u64,
    pub(crate) rate_per_second: f64,
    /// The database file and its write-ahead log.
    pub(crate) store_bytes: Option<u64>,
    /// `VmRSS` of the gateway's process.
    pub(crate) resident_bytes: Option<u64>,
    /// Whose memory that is, in words.
    pub(crate) resident_of: String,
}

impl From<&Measured> for Figures {
    fn from(m: &Measured) -> Figures {
        let seconds = m.elapsed.as_secs_f64();
        let ms = |micros: u64| micros as f64 / 1000.0;
        let at = |q: f64| ms(m.latency.value_at_quantile(q));
        Figures {
            requests: m.requests,
            seconds,
            throughput_rps: m.requests as f64 / seconds.max(1e-9),
            latency_ms: Latency {
                p50: at(0.5),
                p90: at(0.9),
                p99: at(0.99),
                p999: at(0.999),
                max: ms(m.latency.max()),
            },
            outcomes: m.outcomes.clone(),
        }
    }
}

impl Compared {
    pub fn new(target: String, figures: Figures, run: &Figures) -> Compared {
        // A load that got no answer has no throughput or latency to divide by.
        let measured = figures.answered();
        let ratio = |a: f64, b: f64| (measured && b > 0.0).then(|| a / b);
        Compared {
            target,
            throughput_ratio: ratio(run.throughput_rps, figures.throughput_rps),
            p50_ratio: ratio(run.latency_ms.p50, figures.latency_ms.p50),
            p99_ratio: ratio(run.latency_ms.p99, figures.latency_ms.p99),
            figures,
        }
    }
}

impl Report {
    /// Whether the run, and the compared run if any, measured something:
    /// one whose every request failed to connect or timed out measured
    /// nothing (exit 1).
    pub fn answered(&self) -> bool {
        self.figures.answered()
            && self
                .compare
                .as_ref()
                .is_none_or(|compare| compare.figures.answered())
    }

    pub(crate) fn write_json(&self, mut out: impl Write) -> std::io::Result<()> {
        serde_json::to_writer(&mut out, self)?;
        writeln!(out)
    }

    pub(crate) fn write_text(&self, mut out: impl Write) -> std::io::Result<()> {
        writeln!(out, "idemgate bench: {}", self.driven)?;
        let requests = if self.requests_per_key == 1 {
            "request"
        } else {
            "requests"
        };
        writeln!(
            out,
            "  {} keys, {} {requests} per key, concurrency {}, {}-byte bodies",
            self.keys, self.requests_per_key, self.concurrency, self.body_bytes
        )?;
        self.figures.write_text(&mut out, "")?;
        match self.upstream_writes {
            Some(writes) => {
                let distinct = self
                    .upstream_keys
                    .map_or(String::new(), |k| format!(" under {k} distinct keys"));
                writeln!(
                    out,
                    "upstream      {writes} writes{distinct}, for {} keys",
                    self.keys
                )?;
            }
            None => writeln!(out, "upstream      writes not counted")?,
        }
        writeln!(out, "exactly once  {}", self.verdict())?;
        if let Some(compare) = &self.compare {
            writeln!(out, "compare       {}", compare.target)?;
            compare.figures.write_text(&mut out, "  ")?;
            match (
                compare.throughput_ratio,
                compare.p50_ratio,
                compare.p99_ratio,
            ) {
                (Some(throughput), Some(p50), Some(p99)) => writeln!(
                    out,
                    "ratio         {throughput:.2}× the throughput; latency p50 {p50:.2}×, p99 {p99:.2}×"
                )?,
                _ => writeln!(
                    out,
                    "ratio         none: the compared run measured nothing (no request got an answer)"
                )?,
            }
        }
        if let Some(populated) = &self.populate {
            let size = |bytes: Option<u64>| {
                bytes.map_or("not measured".to_string(), |b| {
                    format!("{:.1} MiB", b as f64 / 1024.0 / 1024.0)
                })
            };
            writeln!(
                out,
                "populated     {} operations at {:.0} per second",
                populated.operations, populated.rate_per_second
            )?;
            writeln!(
                out,
                "store         {} (database and write-ahead log)",
                size(populated.store_bytes)
            )?;
            writeln!(
                out,
                "memory        {} resident ({})",
                size(populated.resident_bytes),
                populated.resident_of
            )?;
        }
        Ok(())
    }

    fn verdict(&self) -> String {
        match (self.exactly_once, self.upstream_writes) {
            (Some(true), _) => "yes: one upstream write per key".to_string(),
            (Some(false), Some(writes)) => match self.upstream_keys {
                Some(distinct) if writes == self.keys => format!(
                    "NO: {writes} writes for {} keys, but under {distinct} distinct keys",
                    self.keys
                ),
                _ => format!("NO: {writes} upstream writes for {} keys", self.keys),
            },
            _ => "not checked: give --upstream-effects URL (the mock API's /_effects)".to_string(),
        }
    }
}

impl Figures {
    /// Whether any request got an HTTP answer.
    fn answered(&self) -> bool {
        self.outcomes
            .keys()
            .any(|name| name != super::load::TRANSPORT_ERROR && name != super::load::TIMEOUT)
    }

    fn write_text(&self, out: &mut impl Write, indent: &str) -> std::io::Result<()> {
        let l = &self.latency_ms;
        writeln!(
            out,
            "{indent}requests      {} in {:.2} s: {:.0} per second",
            self.requests, self.seconds, self.throughput_rps
        )?;
        writeln!(
            out,
            "{indent}latency ms    p50 {:.2}  p90 {:.2}  p99 {:.2}  p99.9 {:.2}  max {:.2}",
            l.p50, l.p90, l.p99, l.p999, l.max
        )?;
        let outcomes: Vec<String> = self
            .outcomes
            .iter()
            .map(|(name, count)| format!("{name}: {count}"))
            .collect();
        writeln!(out, "{indent}outcomes      {}", outcomes.join(", "))
    }
}
