//! The access log: one line per request on the proxy listener, in a format
//! of its own, written straight into the log sink.
//!
//! [`AccessLine`] holds what the line says; [`AccessLine::render`] writes
//! it, the one place that knows its fields, their order and their form,
//! in each [`Format`] (what each field means:
//! docs/operating.md, "Logs and health checks"):
//!
//! ```text
//! 2026-12-05T21:54:14.851484Z access route=orders method=POST path=/orders operation_id=01a24833-4328-760a-a5e1-06a8cda9b2d1 outcome=replayed status=201 latency_ms=0.412
//! {"timestamp":"2026-12-05T21:54:14.851484Z","log":"access","route":"orders","method":"POST","path":"/orders","operation_id":"01a24833-4328-760a-a5e1-06a8cda9b2d1","outcome":"replayed","status":201,"latency_ms":0.412}
//! ```
//!
//! Invariants:
//! - a line is whole and ends in `\n`, and its fields come in the order
//!   above; `operation_id` only when the request has an operation;
//! - a text value is written bare only when it is printable ASCII without
//!   space, `"`, `\` or `=` (and not empty); any other, and every JSON
//!   string, is a JSON string with every control character escaped, so a
//!   value can neither split a line nor drive a terminal;
//! - a line holds no header, query string, credential or body: the path
//!   is the normalized path alone, without its segments' parameters
//!   (`request_path::without_parameters`).
//!
//! It is not a `tracing` event: it has no level, span or message to write,
//! and it skips an event's dispatch and per-field `dyn Visit`, which cost
//! more than putting the line together. Whether it is written is still
//! `RUST_LOG`'s to say, under the target [`TARGET`]:
//! `serve` asks the filter once at start, as the filter is read once, and
//! gives the gateway an [`AccessLog`] only if INFO lines of that target pass
//! (`RUST_LOG=info,idemgate::access=off` keeps every other line; `warn`
//! drops them with the rest of INFO). In-process gateways (tests, `demo`,
//! `bench`) have none.

use std::fmt::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::Method;

use crate::log_sink::LogSink;
use crate::metrics::Outcome;

/// The target `RUST_LOG` names to keep or drop access lines.
pub const TARGET: &str = "idemgate::access";

/// How lines are written: `serve --log-format`'s choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `key=value` after the timestamp and the word `access`.
    Text,
    /// One JSON object.
    Json,
}

/// Where a gateway's access lines go, and in which format.
#[derive(Clone)]
pub struct AccessLog {
    sink: LogSink,
    format: Format,
}

/// What a request's line says.
pub struct AccessLine<'a> {
    /// The route's name, empty when none matched.
    pub(crate) route: &'a str,
    pub(crate) method: &'a Method,
    /// The path in normal form (never the query string).
    pub(crate) path: &'a str,
    /// The operation the request claimed, was answered from or was
    /// refused for.
    pub(crate) operation_id: Option<&'a str>,
    pub(crate) outcome: Outcome,
    pub(crate) status: u16,
    /// From the request's head read to its response's head built.
    pub(crate) latency: Duration,
}

/// A field's value, as each format writes it.
enum Value<'a> {
    Text(&'a str),
    Integer(u16),
    /// Microseconds, written as milliseconds with three decimals.
    Millis(u64),
}

impl AccessLog {
    pub fn new(sink: LogSink, format: Format) -> Self {
        AccessLog { sink, format }
    }

    /// Appends `line` to the sink, stamped now.
    pub fn write(&self, line: &AccessLine<'_>) {
        let text = line.render(self.format, SystemTime::now());
        self.sink.append(text.as_bytes());
    }
}

impl AccessLine<'_> {
    /// The line in `format`, stamped `at`; a clock before 1970 is written
    /// as 1970 (the line matters more than its time).
    pub fn render(&self, format: Format, at: SystemTime) -> String {
        let mut line = String::with_capacity(256);
        let at = humantime::format_rfc3339_micros(at.max(UNIX_EPOCH));
        // Writing into a String fails only past the year 9999.
        let _ = match format {
            Format::Text => write!(line, "{at} access"),
            Format::Json => write!(line, r#"{{"timestamp":"{at}","log":"access""#),
        };
        for (name, value) in self.fields() {
            let Some(value) = value else { continue };
            match format {
                Format::Text => {
                    line.push(' ');
                    line.push_str(name);
                    line.push('=');
                }
                Format::Json => {
                    line.push_str(",\"");
                    line.push_str(name);
                    line.push_str("\":");
                }
            }
            let _ = match value {
                Value::Text(text) if format == Format::Text && is_bare(text) => {
                    line.push_str(text);
                    Ok(())
                }
                Value::Text(text) => push_quoted(&mut line, text),
                Value::Integer(n) => write!(line, "{n}"),
                Value::Millis(micros) => write!(line, "{}.{:03}", micros / 1000, micros % 1000),
            };
        }
        if format == Format::Json {
            line.push('}');
        }
        line.push('\n');
        line
    }

    /// Every field in the order lines write them; `None` is left out.
    fn fields(&self) -> [(&'static str, Option<Value<'_>>); 7] {
        // Saturating: no request takes 584,000 years.
        let micros = u64::try_from(self.latency.as_micros()).unwrap_or(u64::MAX);
        [
            ("route", Some(Value::Text(self.route))),
            ("method", Some(Value::Text(self.method.as_str()))),
            ("path", Some(Value::Text(self.path))),
            ("operation_id", self.operation_id.map(Value::Text)),
            ("outcome", Some(Value::Text(self.outcome.name()))),
            ("status", Some(Value::Integer(self.status))),
            ("latency_ms", Some(Value::Millis(micros))),
        ]
    }
}

/// Whether a text value can go unquoted: a space would end it, `"` start a
/// quoted one, `=` read as a key (logfmt).
fn is_bare(text: &str) -> bool {
    !text.is_empty()
        && text
            .bytes()
            .all(|b| b.is_ascii_graphic() && !matches!(b, b'"' | b'\\' | b'='))
}

/// `text` as a JSON string, control characters (C0, DEL, C1) as `\u00XX`.
fn push_quoted(line: &mut String, text: &str) -> std::fmt::Result {
    line.push('"');
    for ch in text.chars() {
        match ch {
            '"' => line.push_str("\\\""),
            '\\' => line.push_str("\\\\"),
            ch if ch.is_control() => write!(line, "\\u{:04x}", u32::from(ch))?,
            ch => line.push(ch),
        }
    }
    line.push('"');
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log_sink::Kept;

    const AT: u64 = 1_764_592_335_058_751;

    fn at() -> SystemTime {
        UNIX_EPOCH + Duration::from_micros(AT)
    }

    fn replayed(method: &Method) -> AccessLine<'_> {
        AccessLine {
            route: "orders",
            method,
            path: "/orders",
            operation_id: Some("01a24833-4328-760a-a5e1-06a8cda9b2d1"),
            outcome: Outcome::replayed,
            status: 201,
            latency: Duration::from_nanos(412_999),
        }
    }

    #[test]
    fn a_text_line_is_the_time_the_word_access_and_its_fields_in_order() {
        let post = Method::POST;
        assert_eq!(
            replayed(&post).render(Format::Text, at()),
            "2025-12-01T12:32:15.058751Z access route=orders method=POST path=/orders \
             operation_id=01a24833-4328-760a-a5e1-06a8cda9b2d1 outcome=replayed status=201 \
             latency_ms=0.412\n"
        );
        let get = Method::GET;
        let unrouted = AccessLine {
            route: "",
            method: &get,
            path: "/nowhere",
            operation_id: None,
            outcome: Outcome::rejected,
            status: 404,
            latency: Duration::from_secs(31),
        };
        assert_eq!(
            unrouted.render(Format::Text, at()),
            "2025-12-01T12:32:15.058751Z access route=\"\" method=GET path=/nowhere \
             outcome=rejected status=404 latency_ms=31000.000\n"
        );
    }

    #[test]
    fn a_json_line_is_one_object_with_the_same_fields() {
        let post = Method::POST;
        let line = replayed(&post).render(Format::Json, at());
        assert_eq!(
            line,
            "{\"timestamp\":\"2025-12-01T12:32:15.058751Z\",\"log\":\"access\",\
             \"route\":\"orders\",\"method\":\"POST\",\"path\":\"/orders\",\
             \"operation_id\":\"01a24833-4328-760a-a5e1-06a8cda9b2d1\",\
             \"outcome\":\"replayed\",\"status\":201,\"latency_ms\":0.412}\n"
        );
        let parsed: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(parsed["latency_ms"], 0.412);
    }

    #[test]
    fn odd_values_are_quoted_and_escaped_in_both_formats() {
        let post = Method::POST;
        let route = "odd \"name\" é \\ a=b \u{1b}[31m \u{9b} \u{7f}\n";
        let line = AccessLine {
            route,
            operation_id: None,
            ..replayed(&post)
        };
        let text = line.render(Format::Text, at());
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(!text.chars().any(|c| c.is_control() && c != '\n'), "{text}");
        let quoted = text
            .strip_prefix("2025-12-01T12:32:15.058751Z access route=")
            .and_then(|rest| {
                rest.strip_suffix(
                    " method=POST path=/orders outcome=replayed status=201 latency_ms=0.412\n",
                )
            })
            .unwrap_or_else(|| panic!("{text}"));
        assert_eq!(serde_json::from_str::<String>(quoted).unwrap(), route);

        let json = line.render(Format::Json, at());
        assert!(!json.chars().any(|c| c.is_control() && c != '\n'), "{json}");
        let parsed: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(parsed["route"], route);
        assert!(parsed.get("operation_id").is_none());
    }

    #[test]
    fn latency_is_whole_microseconds_as_milliseconds() {
        for (latency, written) in [
            (Duration::ZERO, "0.000"),
            (Duration::from_nanos(999), "0.000"),
            (Duration::from_micros(7), "0.007"),
            (Duration::from_micros(1_010), "1.010"),
            (Duration::from_millis(2), "2.000"),
            (Duration::MAX, "18446744073709551.615"),
        ] {
            let post = Method::POST;
            let line = AccessLine {
                latency,
                ..replayed(&post)
            };
            let text = line.render(Format::Text, at());
            assert!(
                text.ends_with(&format!(" latency_ms={written}\n")),
                "{text}"
            );
            let json = line.render(Format::Json, at());
            assert!(
                json.ends_with(&format!(",\"latency_ms\":{written}}}\n")),
                "{json}"
            );
        }
    }

    #[test]
    fn a_clock_before_1970_writes_1970() {
        let post = Method::POST;
        let text = replayed(&post).render(Format::Text, UNIX_EPOCH - Duration::from_secs(5));
        assert!(
            text.starts_with("1970-01-01T00:00:00.000000Z access "),
            "{text}"
        );
    }

    #[test]
    fn each_write_appends_one_line_to_the_sink() {
        let kept = Kept::default();
        let (sink, guard) = LogSink::start(kept.clone()).unwrap();
        let log = AccessLog::new(sink, Format::Json);
        let post = Method::POST;
        log.write(&replayed(&post));
        log.write(&replayed(&post));
        drop(guard);
        let text = kept.text();
        assert_eq!(text.lines().count(), 2, "{text}");
        for line in text.lines() {
            serde_json::from_str::<serde_json::Value>(line).unwrap();
        }
    }
}
