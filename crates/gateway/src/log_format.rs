//! The text format of a log line, written without tracing-subscriber's
//! per-field machinery.
//!
//! A request's log line is the gateway's only log output on the happy path,
//! and the default formatter (`tracing_subscriber::fmt::format::Full`)
//! spent about a sixth of a forwarded request's instructions on it
//! (callgrind): a `write!` through an ANSI style wrapper for every field
//! name and `=` sign even with colours off, and the calendar arithmetic of
//! the timestamp on every line. [`TextLine`] writes the same bytes as
//! `Full` (timestamp, level, target, fields), with the date and time of the
//! current second kept per thread and integers written without
//! `core::fmt`.
//!
//! Invariant: a line reads byte for byte as `Full` would write it. What the
//! fast path does not cover — an event inside a span, a terminal's colours,
//! an error field (its sources are listed), a raw identifier or `log.`
//! field (a record from the `log` crate) — is handed whole to `Full`.

use std::cell::{Cell, RefCell};
use std::fmt::{self, Write};
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::{Format, Full, Writer};
use tracing_subscriber::fmt::time::SystemTime as Timer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// The event formatter of `--log-format text`.
#[derive(Default)]
pub struct TextLine {
    /// What writes every event the fast path does not cover.
    full: Format<Full, Timer>,
}

thread_local! {
    /// The line being written (kept: no allocation per line).
    static LINE: RefCell<String> = RefCell::new(String::with_capacity(256));
    /// The Unix second last formatted on this thread and its
    /// `YYYY-MM-DDTHH:MM:SS`.
    static SECOND: Cell<(u64, [u8; 19])> = const { Cell::new((u64::MAX, [0; 19])) };
}

impl<S, N> FormatEvent<S, N> for TextLine
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        if writer.has_ansi_escapes() || ctx.event_scope().is_some() {
            return self.full.format_event(ctx, writer, event);
        }
        let written = LINE.with(|line| {
            // A field's Debug that logs would find the line taken: `Full` then.
            let mut line = line.try_borrow_mut().ok()?;
            line.clear();
            write_line(&mut line, event, SystemTime::now()).then(|| writer.write_str(&line))
        });
        match written {
            Some(result) => result,
            None => self.full.format_event(ctx, writer, event),
        }
    }
}

/// `event` as `Full` writes it outside spans and without colours, at
/// `now`; `false` (and `line` to be discarded) when it has a field the fast
/// path does not cover.
fn write_line(line: &mut String, event: &Event<'_>, now: SystemTime) -> bool {
    if !timestamp(line, now) {
        return false;
    }
    line.push(' ');
    line.push_str(match *event.metadata().level() {
        Level::TRACE => "TRACE",
        Level::DEBUG => "DEBUG",
        Level::INFO => " INFO",
        Level::WARN => " WARN",
        Level::ERROR => "ERROR",
    });
    line.push(' ');
    line.push_str(event.metadata().target());
    line.push_str(": ");
    let mut fields = Fields {
        line,
        first: true,
        covered: true,
    };
    event.record(&mut fields);
    fields.line.push('\n');
    fields.covered
}

/// `now` as `Full`'s timer writes it: RFC 3339 in UTC with microseconds;
/// `false` for a clock before 1970 (not worth a fast path).
pub(crate) fn timestamp(line: &mut String, now: SystemTime) -> bool {
    let Ok(since) = now.duration_since(UNIX_EPOCH) else {
        return false;
    };
    let second = since.as_secs();
    let (cached, mut text) = SECOND.get();
    if cached != second {
        text = date_time(second);
        SECOND.set((second, text));
    }
    // Only ASCII digits and separators were written into `text`.
    line.push_str(std::str::from_utf8(&text).unwrap_or_default());
    line.push('.');
    let micros = since.subsec_micros();
    let mut digits = itoa::Buffer::new();
    let digits = digits.format(micros);
    for _ in digits.len()..6 {
        line.push('0');
    }
    line.push_str(digits);
    line.push('Z');
    true
}

/// `YYYY-MM-DDTHH:MM:SS` of a Unix second, in the proleptic Gregorian
/// calendar (days to civil date: Howard Hinnant's algorithm).
fn date_time(second: u64) -> [u8; 19] {
    let days = (second / 86_400) as i64;
    let of_day = second % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    let mut text = *b"0000-00-00T00:00:00";
    let mut put = |at: usize, width: usize, mut value: u64| {
        for i in (at..at + width).rev() {
            text[i] = b'0' + (value % 10) as u8;
            value /= 10;
        }
    };
    // Years past 9999 are seconds past 253,402,300,799: not this clock's.
    put(0, 4, year.clamp(0, 9999) as u64);
    put(5, 2, month as u64);
    put(8, 2, day as u64);
    put(11, 2, of_day / 3_600);
    put(14, 2, of_day / 60 % 60);
    put(17, 2, of_day % 60);
    text
}

/// The event's fields as `Full`'s visitor writes them: the message first
/// and bare, then ` name=value` with values in their `Debug` form.
struct Fields<'a> {
    line: &'a mut String,
    first: bool,
    /// Cleared by a field only `Full` writes right.
    covered: bool,
}

impl Fields<'_> {
    /// The separator before a field, and `false` when `Full` must write it.
    fn start(&mut self, field: &Field) -> bool {
        let name = field.name();
        if name.starts_with("r#") || name.starts_with("log.") {
            self.covered = false;
        }
        if !self.covered {
            return false;
        }
        if !self.first {
            self.line.push(' ');
        }
        self.first = false;
        if name != "message" {
            self.line.push_str(name);
            self.line.push('=');
        }
        true
    }
}

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if !self.start(field) {
            return;
        }
        if field.name() == "message" {
            let _ = Escaping(self.line).write_str(value);
        } else {
            push_str_value(self.line, value);
        }
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        if self.start(field) {
            self.line.push_str(itoa::Buffer::new().format(value));
        }
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        if self.start(field) {
            self.line.push_str(itoa::Buffer::new().format(value));
        }
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        if self.start(field) {
            self.line.push_str(if value { "true" } else { "false" });
        }
    }

    fn record_error(&mut self, _: &Field, _: &(dyn std::error::Error + 'static)) {
        self.covered = false;
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if !self.start(field) {
            return;
        }
        let _ = if field.name() == "message" {
            write!(Escaping(self.line), "{value:?}")
        } else {
            write!(self.line, "{value:?}")
        };
    }
}

/// A string field's value as `Full` writes it: its `Debug`, which for
/// printable ASCII without quotes or backslashes is the text in quotes.
pub(crate) fn push_str_value(line: &mut String, value: &str) {
    if value
        .bytes()
        .all(|b| (b' '..=b'~').contains(&b) && b != b'"' && b != b'\\')
    {
        line.push('"');
        line.push_str(value);
        line.push('"');
    } else {
        let _ = write!(line, "{value:?}");
    }
}

/// Writes a message as `Full` does: terminal control characters (ESC, BEL,
/// BS, FF, DEL and the C1 range) escaped, so a logged value cannot drive a
/// terminal.
struct Escaping<'a>(&'a mut String);

impl Write for Escaping<'_> {
    fn write_str(&mut self, text: &str) -> fmt::Result {
        // U+0080..U+009F are 0xC2 0x80..0x9F in UTF-8.
        if !text
            .bytes()
            .any(|b| matches!(b, 0x1b | 0x07 | 0x08 | 0x0c | 0x7f | 0xc2))
        {
            self.0.push_str(text);
            return Ok(());
        }
        for ch in text.chars() {
            match ch {
                '\x1b' => self.0.push_str("\\x1b"),
                '\x07' => self.0.push_str("\\x07"),
                '\x08' => self.0.push_str("\\x08"),
                '\x0c' => self.0.push_str("\\x0c"),
                '\x7f' => self.0.push_str("\\x7f"),
                ch if ('\u{80}'..='\u{9f}').contains(&ch) => {
                    write!(self.0, "\\u{{{:x}}}", ch as u32)?
                }
                ch => self.0.push(ch),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log_sink::Kept;
    use std::time::Duration;

    /// Every event `log` emits, as `Full` and as `TextLine` write it, with
    /// the timestamps cut off (they are two readings of the clock).
    fn both(log: fn()) -> (Vec<String>, Vec<String>) {
        let lines = |kept: &Kept| -> Vec<String> {
            kept.text()
                .lines()
                .map(|line| line[27..].to_string())
                .collect()
        };
        let (full, fast) = (Kept::default(), Kept::default());
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(Level::TRACE)
            .with_ansi(false)
            .with_writer(full.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, log);
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(Level::TRACE)
            .with_ansi(false)
            .with_writer(fast.clone())
            .event_format(TextLine::default())
            .finish();
        tracing::subscriber::with_default(subscriber, log);
        (lines(&full), lines(&fast))
    }

    #[derive(Debug)]
    enum Outcome {
        #[allow(dead_code)] // only printed
        Forwarded { status: u16 },
    }

    #[test]
    fn lines_read_as_the_default_format_writes_them() {
        let (full, fast) = both(|| {
            let path = "/a/b?c=\"d\"";
            tracing::info!(
                route = "orders",
                method = %http::Method::POST,
                %path,
                operation_id = Some("0190-ab"),
                missing = None::<&str>,
                outcome = ?Outcome::Forwarded { status: 201 },
                status = 201_u16,
                delta = -3_i64,
                latency_ms = 0.442033_f64,
                whole = 2.0_f64,
                ok = true,
                "request"
            );
            tracing::warn!(
                quote = "a \"quoted\" \\ value\n",
                "two\u{1b}[31m words \u{85}"
            );
            tracing::error!("formatted {} {:?}", 7, "x\u{7}");
            tracing::debug!(target: "another::target", empty = "", unicode = "é");
            tracing::trace!(n = u64::MAX, "");
            let error = std::io::Error::other("disk gone");
            tracing::error!(%error, "display of an error");
            tracing::error!(error = &error as &dyn std::error::Error, "an error field");
            tracing::info!(r#type = "raw", "raw identifier");
            let _span = tracing::info_span!("outer", id = 3).entered();
            tracing::info!(inside = 1, "in a span");
        });
        assert_eq!(fast, full);
        assert_eq!(full.len(), 9, "{full:#?}");
    }

    #[test]
    fn timestamps_are_rfc_3339_with_microseconds() {
        let at = |seconds: u64, micros: u64| {
            let mut line = String::new();
            let then = UNIX_EPOCH + Duration::from_secs(seconds) + Duration::from_micros(micros);
            assert!(timestamp(&mut line, then));
            line
        };
        assert_eq!(at(0, 0), "1970-01-01T00:00:00.000000Z");
        // `date -u -d @951868799`: the end of a leap day in a century year.
        assert_eq!(at(951_868_799, 999_999), "2000-02-29T23:59:59.999999Z");
        assert_eq!(at(1_764_592_335, 58_751), "2025-12-01T12:32:15.058751Z");
        assert_eq!(at(4_107_542_400, 7), "2100-03-01T00:00:00.000007Z");
        // The cached second is replaced when the second changes.
        assert_eq!(at(86_399, 1), "1970-01-01T23:59:59.000001Z");
        assert_eq!(at(86_400, 1), "1970-01-02T00:00:00.000001Z");
    }
}
