//! A request's log line, the one line every request writes: written
//! straight into the log sink when the text format is on, with no tracing
//! event.
//!
//! Through tracing, the line cost 6.5 % of a replay's CPU (perf), about
//! an eighth of its user-space share: the event's dispatch, a visit of
//! each field behind `dyn Visit`, and `core::fmt` for four of its seven
//! values (`latency_ms` through the shortest float formatting), ~4,000
//! instructions (callgrind). Here the same bytes are put together from the
//! values themselves: a few `push_str`s and integer digits (~1,800 with
//! the clock and the sink).
//!
//! Invariants:
//! - a line reads byte for byte as [`crate::log_format::TextLine`] (and so
//!   tracing-subscriber's `Full`) writes the `tracing::info!` event this
//!   module falls back to; `latency_ms` is in whole microseconds either way;
//! - the line is written directly only when the log sink was handed to
//!   [`write_directly`] (the text format without colours), the filter
//!   lets an INFO line of [`TARGET`] through, and no span is entered (whose
//!   name `Full` would write before the target); otherwise the event goes
//!   through tracing as before, so `RUST_LOG`, `--log-format json` and
//!   every other subscriber (the tests', the bench's) see it unchanged.

use std::cell::RefCell;
use std::io::Write;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use http::Method;
use tracing::Level;
use tracing_subscriber::fmt::MakeWriter;

use crate::log_format;
use crate::log_sink::LogSink;
use crate::metrics::Outcome;

/// The target the line is logged under, as when it was logged from the
/// pipeline's own module.
pub const TARGET: &str = "idemgate::pipeline";

/// Where lines go directly, once the text format's sink is known.
static DIRECT: OnceLock<LogSink> = OnceLock::new();

thread_local! {
    /// The line being put together (kept: no allocation per line).
    static LINE: RefCell<String> = RefCell::new(String::with_capacity(256));
}

/// Request lines go straight into `sink` from now on (when the filter lets
/// them through). For the text format without colours only: its lines are
/// the ones [`put_together`] writes. Later calls change nothing.
pub fn write_directly(sink: LogSink) {
    let _ = DIRECT.set(sink);
}

/// What a request's line says.
pub struct RequestLine<'a> {
    /// The route's name, empty when none matched.
    pub route: &'a str,
    pub method: &'a Method,
    /// The path in normal form (never the query string's values).
    pub path: &'a str,
    pub operation_id: Option<&'a str>,
    pub outcome: Outcome,
    pub status: u16,
    pub latency: Duration,
}

/// Logs `line` once: into the sink directly when it can (see the module's
/// invariants), else as a tracing event.
pub fn log(line: &RequestLine<'_>) {
    if let Some(sink) = DIRECT.get()
        && tracing::enabled!(target: TARGET, Level::INFO)
        && tracing::Span::current().is_none()
    {
        let written = LINE.with(|text| {
            let mut text = text.try_borrow_mut().ok()?;
            text.clear();
            put_together(&mut text, line, SystemTime::now()).then(|| {
                // The sink takes every byte or counts the line dropped.
                let _ = sink.make_writer().write_all(text.as_bytes());
            })
        });
        if written.is_some() {
            return;
        }
    }
    tracing::info!(
        target: TARGET,
        route = line.route,
        method = %line.method,
        path = %line.path,
        operation_id = line.operation_id,
        outcome = ?line.outcome,
        status = line.status,
        latency_ms = whole_micros(line.latency) as f64 / 1000.0,
        "request"
    );
}

/// `latency` in whole microseconds (saturating: no request takes 584,000
/// years).
fn whole_micros(latency: Duration) -> u64 {
    u64::try_from(latency.as_micros()).unwrap_or(u64::MAX)
}

/// `line` as the text format writes its tracing event, at `now`; `false`
/// (and `text` to be discarded) for a clock before 1970.
fn put_together(text: &mut String, line: &RequestLine<'_>, now: SystemTime) -> bool {
    if !log_format::timestamp(text, now) {
        return false;
    }
    text.push_str("  INFO ");
    text.push_str(TARGET);
    text.push_str(": request route=");
    log_format::push_str_value(text, line.route);
    text.push_str(" method=");
    text.push_str(line.method.as_str());
    text.push_str(" path=");
    text.push_str(line.path);
    if let Some(id) = line.operation_id {
        text.push_str(" operation_id=");
        log_format::push_str_value(text, id);
    }
    text.push_str(" outcome=");
    text.push_str(line.outcome.name());
    text.push_str(" status=");
    text.push_str(itoa::Buffer::new().format(line.status));
    text.push_str(" latency_ms=");
    push_millis(text, whole_micros(line.latency));
    text.push('\n');
    true
}

/// `micros` / 1000 as `{:?}` writes that `f64`: the shortest decimal that
/// reads back as it. A decimal of at most 15 significant digits reads back
/// from the `f64` nearest it, and no shorter decimal does, so below 10^15
/// microseconds (31 years) that is the milliseconds with at most three
/// decimals, trailing zeros cut, and at least one (`2.0`).
fn push_millis(text: &mut String, micros: u64) {
    if micros >= 1_000_000_000_000_000 {
        // Past 15 digits the `f64` may not keep the last one: `Debug` decides.
        let _ = std::fmt::Write::write_fmt(text, format_args!("{:?}", micros as f64 / 1000.0));
        return;
    }
    text.push_str(itoa::Buffer::new().format(micros / 1000));
    text.push('.');
    let fraction = micros % 1000;
    let digits = [fraction / 100, fraction / 10 % 10, fraction % 10];
    let kept = digits
        .iter()
        .rposition(|&d| d != 0)
        .map_or(1, |last| last + 1);
    for digit in &digits[..kept] {
        text.push(char::from(b'0' + *digit as u8));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log_format::TextLine;
    use crate::log_sink::Kept;
    use std::time::UNIX_EPOCH;

    /// `line` as the tracing event writes it, under the text format.
    fn through_tracing(line: &RequestLine<'_>) -> String {
        let kept = Kept::default();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(kept.clone())
            .event_format(TextLine::default())
            .finish();
        // No test hands a sink to `write_directly`: in this process the
        // fallback, the tracing event, is what runs.
        tracing::subscriber::with_default(subscriber, || log(line));
        kept.text()
    }

    fn direct(line: &RequestLine<'_>) -> String {
        let mut text = String::new();
        assert!(put_together(&mut text, line, SystemTime::now()));
        text
    }

    /// The two lines without their timestamps (two readings of the clock).
    fn untimed(line: &str) -> &str {
        &line[27..]
    }

    #[test]
    fn a_line_reads_as_the_tracing_event_writes_it() {
        let post = Method::POST;
        let get = Method::GET;
        let lines = [
            RequestLine {
                route: "orders",
                method: &post,
                path: "/orders/7",
                operation_id: Some("0190f3a2c4e14b7f8d6e5a3b2c1d0e9f"),
                outcome: Outcome::replayed,
                status: 201,
                latency: Duration::from_nanos(512_345),
            },
            RequestLine {
                route: "",
                method: &get,
                path: "/nowhere",
                operation_id: None,
                outcome: Outcome::rejected,
                status: 404,
                latency: Duration::from_millis(2),
            },
            RequestLine {
                // A name with a quote and a byte past ASCII: written as
                // `Debug` writes it.
                route: "odd \"name\" é",
                method: &post,
                path: "/a/b",
                operation_id: Some("id"),
                outcome: Outcome::unknown,
                status: 502,
                latency: Duration::from_secs(31),
            },
        ];
        for line in &lines {
            let (fallback, direct) = (through_tracing(line), direct(line));
            assert_eq!(untimed(&direct), untimed(&fallback));
            assert!(direct.ends_with('\n'));
        }
    }

    #[test]
    fn milliseconds_read_as_the_f64_debug_writes_them() {
        for micros in [
            0,
            1,
            7,
            10,
            99,
            100,
            512,
            999,
            1_000,
            1_001,
            1_010,
            1_500,
            12_340,
            123_456,
            999_999_999,
            999_999_999_999_999,
            1_000_000_000_000_000,
            (1 << 53) - 1,
            u64::MAX,
        ] {
            let mut text = String::new();
            push_millis(&mut text, micros);
            assert_eq!(text, format!("{:?}", micros as f64 / 1000.0), "{micros} µs");
        }
    }

    #[test]
    fn a_line_starts_with_the_time_it_was_written() {
        let post = Method::POST;
        let line = RequestLine {
            route: "orders",
            method: &post,
            path: "/orders",
            operation_id: None,
            outcome: Outcome::forwarded,
            status: 201,
            latency: Duration::ZERO,
        };
        let mut text = String::new();
        let at = UNIX_EPOCH + Duration::from_micros(1_764_592_335_058_751);
        assert!(put_together(&mut text, &line, at));
        assert_eq!(
            text,
            "2025-12-01T12:32:15.058751Z  INFO idemgate::pipeline: request route=\"orders\" \
             method=POST path=/orders outcome=forwarded status=201 latency_ms=0.0\n"
        );
    }
}
