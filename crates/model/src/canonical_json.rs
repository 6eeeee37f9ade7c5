//! RFC 8785 JSON Canonicalization Scheme (JCS), so a client that re-serialises
//! the same payload (other key order, whitespace, `1.0` for `1`) still sends
//! the same operation.
//!
//! Invariant: texts that [`parse_exact`] admits canonicalise to the same
//! bytes exactly when they are the same JSON value. Object members are sorted
//! by their UTF-16 code units, numbers are written as ECMAScript's
//! `Number.prototype.toString` writes the double, and strings use the minimal
//! escaping of RFC 8785 §3.2.2.2 (which is serde_json's).
//!
//! JCS is defined on I-JSON (RFC 7493), so `parse_exact` admits only I-JSON
//! that the canonical form keeps apart from every other value. It refuses:
//! - a member name twice in one object (serde_json keeps the last one, an
//!   upstream parser may keep the first), escapes unfolded (`"a"`, `"\u0061"`);
//! - a `\u` escape of a lone surrogate (no Unicode string holds it);
//! - a number whose decimal value is not the value of the decimal JCS writes
//!   for it: `9007199254740993` (a double holds 2^53 + 1 as 2^53), a 20-digit
//!   id, `0.30000000000000001` (its double is written `0.3`), `1e400` (no
//!   double), `1e-400` (written `0`).
//!
//! So numbers written differently with one value stay one (`1`, `1.0`, `1e0`;
//! `0.1` and `1e-1`, as the double nearest 0.1 is written `0.1`; `0` and
//! `-0`, the value zero), and two admitted numbers with one canonical form
//! name one value. (The test is not "the double is exactly the decimal": no
//! double is 0.1, yet `0.1` written back names the value sent.) Noncharacters, also outside I-JSON, are admitted: kept as
//! they are, they never make two values one.

use std::borrow::Cow;
use std::ops::Range;

use serde_json::Value;

/// Why a JSON text is not canonicalised: canonicalising it could make it
/// equal to another payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotExact {
    /// Not JSON at all (or nested deeper than serde_json reads).
    Syntax,
    /// An object names one member twice.
    DuplicateName,
    /// A `\u` escape of a surrogate that is not half of a pair.
    LoneSurrogate,
    /// A number whose value is not the value its canonical form writes.
    InexactNumber,
}

/// Parses `text` when it is I-JSON that [`canonicalize`] writes without
/// loss (see the module doc), for the fingerprint and derived keys.
pub fn parse_exact(text: &[u8]) -> Result<Value, NotExact> {
    check_exact(text)?;
    serde_json::from_slice(text).map_err(|_| NotExact::Syntax)
}

/// Whether `text` is JSON ([`NotExact::Syntax`] when not) and, if it is, the
/// first way it departs from exact I-JSON.
pub fn check_exact(text: &[u8]) -> Result<(), NotExact> {
    let text = std::str::from_utf8(text).map_err(|_| NotExact::Syntax)?;
    let mut scanner = Scanner::new(text);
    scanner.value(0).map_err(|NotJson| NotExact::Syntax)?;
    scanner.ws();
    if scanner.pos != text.len() {
        return Err(NotExact::Syntax);
    }
    scanner.problem.map_or(Ok(()), Err)
}

/// The text of the value `pointer` (RFC 6901) names in the JSON `text`, as
/// sent. `None` when there is none, or when an object on the way names the
/// wanted member twice: the upstream may read either.
pub fn raw_at<'t>(text: &'t [u8], pointer: &str) -> Option<&'t [u8]> {
    let text = std::str::from_utf8(text).ok()?;
    let mut value = text.trim_matches(JSON_WHITESPACE);
    if !pointer.is_empty() {
        for token in pointer.strip_prefix('/')?.split('/') {
            value = child(value, &token.replace("~1", "/").replace("~0", "~"))?;
        }
    }
    Some(value.as_bytes())
}

/// `text` with the value each of `pointers` names written `null`: how a
/// JSON body that is not exact (hashed as sent) still leaves out its
/// ignored fields. A pointer that names nothing, or whose way is not one
/// member (a name given twice), masks nothing: the bytes count as sent.
/// A value inside another masked value is masked with it. `None` when no
/// pointer names a value.
pub fn mask_raw(text: &[u8], pointers: &[String]) -> Option<Vec<u8>> {
    let mut spans: Vec<Range<usize>> = pointers
        .iter()
        .filter(|pointer| !pointer.is_empty())
        .filter_map(|pointer| raw_at(text, pointer))
        .map(|value| {
            // `raw_at` gives a slice of `text` itself.
            let start = value.as_ptr() as usize - text.as_ptr() as usize;
            start..start + value.len()
        })
        .collect();
    if spans.is_empty() {
        return None;
    }
    spans.sort_by_key(|span| (span.start, std::cmp::Reverse(span.end)));
    let mut masked = Vec::with_capacity(text.len());
    let mut written = 0;
    for span in spans {
        if span.start < written {
            continue;
        }
        masked.extend_from_slice(&text[written..span.start]);
        masked.extend_from_slice(b"null");
        written = span.end;
    }
    masked.extend_from_slice(&text[written..]);
    Some(masked)
}

/// The member or element `token` names in the object or array `container`.
fn child<'t>(container: &'t str, token: &str) -> Option<&'t str> {
    let mut scanner = Scanner::new(container);
    let mut found = Vec::new();
    match container.as_bytes().first()? {
        b'{' => scanner
            .object(1, |name, span| {
                if name == token {
                    found.push(span);
                }
            })
            .ok()?,
        b'[' => {
            let wanted = array_index(token)?;
            let mut index = 0;
            scanner
                .array(1, |span| {
                    if index == wanted {
                        found.push(span);
                    }
                    index += 1;
                })
                .ok()?
        }
        _ => return None,
    }
    match found.as_slice() {
        [span] => container.get(span.clone()),
        _ => None,
    }
}

/// An RFC 6901 array index: `0`, or digits without a leading zero.
fn array_index(token: &str) -> Option<usize> {
    let digits = !token.is_empty() && token.bytes().all(|b| b.is_ascii_digit());
    if !digits || (token.len() > 1 && token.starts_with('0')) {
        return None;
    }
    token.parse().ok()
}

const JSON_WHITESPACE: [char; 4] = [' ', '\t', '\n', '\r'];

/// Nesting deeper than this is not JSON here: serde_json reads no deeper, and
/// it bounds the scanner's recursion on a hostile body.
const MAX_DEPTH: usize = 127;

/// The text is not JSON.
struct NotJson;

/// A validating JSON scanner over text already known to be UTF-8: it builds
/// nothing but member names, and notes the first departure from exact I-JSON
/// while it reads on, so that "not JSON" is still told apart.
struct Scanner<'t> {
    text: &'t str,
    pos: usize,
    problem: Option<NotExact>,
}

impl<'t> Scanner<'t> {
    fn new(text: &'t str) -> Self {
        Scanner {
            text,
            pos: 0,
            problem: None,
        }
    }

    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.pos).copied()
    }

    fn eat(&mut self, byte: u8) -> Result<(), NotJson> {
        if self.peek() != Some(byte) {
            return Err(NotJson);
        }
        self.pos += 1;
        Ok(())
    }

    fn ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.pos += 1;
        }
    }

    fn flag(&mut self, problem: NotExact) {
        self.problem.get_or_insert(problem);
    }

    /// One value after optional whitespace; its span, whitespace excluded.
    fn value(&mut self, depth: usize) -> Result<Range<usize>, NotJson> {
        self.ws();
        let start = self.pos;
        match self.peek().ok_or(NotJson)? {
            b'{' => self.object(depth + 1, |_, _| ())?,
            b'[' => self.array(depth + 1, |_| ())?,
            b'"' => self.string(None)?,
            b't' => self.literal("true")?,
            b'f' => self.literal("false")?,
            b'n' => self.literal("null")?,
            _ => self.number()?,
        }
        Ok(start..self.pos)
    }

    fn literal(&mut self, word: &str) -> Result<(), NotJson> {
        if !self.text[self.pos..].starts_with(word) {
            return Err(NotJson);
        }
        self.pos += word.len();
        Ok(())
    }

    /// An object; `each` sees every member's unescaped name and value span.
    fn object(
        &mut self,
        depth: usize,
        mut each: impl FnMut(&str, Range<usize>),
    ) -> Result<(), NotJson> {
        let mut names = Vec::new();
        self.list(depth, b'{', b'}', |scanner| {
            let name = scanner.name()?;
            scanner.ws();
            scanner.eat(b':')?;
            each(&name, scanner.value(depth)?);
            names.push(name);
            Ok(())
        })?;
        if self.problem.is_none() {
            names.sort_unstable();
            if names.windows(2).any(|pair| pair[0] == pair[1]) {
                self.flag(NotExact::DuplicateName);
            }
        }
        Ok(())
    }

    /// An array; `each` sees every element's span.
    fn array(&mut self, depth: usize, mut each: impl FnMut(Range<usize>)) -> Result<(), NotJson> {
        self.list(depth, b'[', b']', |scanner| {
            each(scanner.value(depth)?);
            Ok(())
        })
    }

    /// `open`, items separated by commas (each read by `item`), `close`.
    fn list(
        &mut self,
        depth: usize,
        open: u8,
        close: u8,
        mut item: impl FnMut(&mut Self) -> Result<(), NotJson>,
    ) -> Result<(), NotJson> {
        if depth > MAX_DEPTH {
            return Err(NotJson);
        }
        self.eat(open)?;
        self.ws();
        if self.eat(close).is_ok() {
            return Ok(());
        }
        loop {
            self.ws();
            item(self)?;
            self.ws();
            if self.eat(close).is_ok() {
                return Ok(());
            }
            self.eat(b',')?;
        }
    }

    /// A member name, unescaped: borrowed from the text when it has no
    /// escape, as most names have none.
    fn name(&mut self) -> Result<Cow<'t, str>, NotJson> {
        let start = self.pos;
        self.string(None)?;
        let raw = &self.text[start + 1..self.pos - 1];
        if !raw.contains('\\') {
            return Ok(Cow::Borrowed(raw));
        }
        self.pos = start;
        let mut name = String::new();
        self.string(Some(&mut name))?;
        Ok(Cow::Owned(name))
    }

    /// A string, unescaped into `out` when given.
    fn string(&mut self, mut out: Option<&mut String>) -> Result<(), NotJson> {
        self.eat(b'"')?;
        loop {
            let run = self.pos;
            while matches!(self.peek(), Some(b) if b != b'"' && b != b'\\' && b >= 0x20) {
                self.pos += 1;
            }
            if let Some(out) = out.as_deref_mut() {
                out.push_str(&self.text[run..self.pos]);
            }
            match self.peek() {
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(());
                }
                Some(b'\\') => {
                    self.pos += 1;
                    let c = self.escape()?;
                    if let Some(out) = out.as_deref_mut() {
                        out.push(c);
                    }
                }
                // A control character or the end of the text.
                _ => return Err(NotJson),
            }
        }
    }

    /// The character an escape after its backslash stands for; a lone
    /// surrogate is flagged and stands for U+FFFD.
    fn escape(&mut self) -> Result<char, NotJson> {
        let byte = self.peek().ok_or(NotJson)?;
        self.pos += 1;
        Ok(match byte {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => {
                let unit = self.hex4()?;
                if (0xD800..0xDC00).contains(&unit)
                    && let Some(pair) = self.low_surrogate_after(unit)?
                {
                    return Ok(pair);
                }
                char::from_u32(unit).unwrap_or_else(|| {
                    self.flag(NotExact::LoneSurrogate);
                    char::REPLACEMENT_CHARACTER
                })
            }
            _ => return Err(NotJson),
        })
    }

    /// The character a high surrogate makes with an escaped low one right
    /// after it, consumed; `None`, consuming nothing, when there is none.
    fn low_surrogate_after(&mut self, high: u32) -> Result<Option<char>, NotJson> {
        if !self.text[self.pos..].starts_with("\\u") {
            return Ok(None);
        }
        let escape = self.pos;
        self.pos += 2;
        let low = self.hex4()?;
        if !(0xDC00..0xE000).contains(&low) {
            self.pos = escape;
            return Ok(None);
        }
        Ok(char::from_u32(
            0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00),
        ))
    }

    fn hex4(&mut self) -> Result<u32, NotJson> {
        let digits = self.text.get(self.pos..self.pos + 4).ok_or(NotJson)?;
        if !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(NotJson);
        }
        self.pos += 4;
        u32::from_str_radix(digits, 16).map_err(|_| NotJson)
    }

    /// A number: `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`.
    fn number(&mut self) -> Result<(), NotJson> {
        let start = self.pos;
        let _ = self.eat(b'-');
        if self.eat(b'0').is_err() && self.digits() == 0 {
            return Err(NotJson);
        }
        let mut integer = true;
        if self.eat(b'.').is_ok() {
            integer = false;
            if self.digits() == 0 {
                return Err(NotJson);
            }
        }
        if self.eat(b'e').is_ok() || self.eat(b'E').is_ok() {
            integer = false;
            if self.eat(b'+').is_err() {
                let _ = self.eat(b'-');
            }
            if self.digits() == 0 {
                return Err(NotJson);
            }
        }
        if self.problem.is_none() && !is_exact(&self.text[start..self.pos], integer) {
            self.flag(NotExact::InexactNumber);
        }
        Ok(())
    }

    fn digits(&mut self) -> usize {
        let start = self.pos;
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.pos += 1;
        }
        self.pos - start
    }
}

/// Whether the JSON number `text` names exactly the decimal [`canonicalize`]
/// writes for its double.
fn is_exact(text: &str, integer: bool) -> bool {
    // Below 10^15 < 2^53 every integer is a double, written as itself.
    if integer && text.trim_start_matches('-').len() <= 15 {
        return true;
    }
    let Ok(double) = text.parse::<f64>() else {
        return false;
    };
    let mut buffer = ryu_js::Buffer::new();
    double.is_finite() && Decimal::of(text) == Decimal::of(buffer.format(double))
}

/// A decimal number's value as `(-1)^negative × digits × 10^exponent`, with
/// no leading or trailing zero in `digits`: equal values, equal fields.
#[derive(Debug, PartialEq, Eq)]
struct Decimal {
    negative: bool,
    digits: Vec<u8>,
    exponent: i64,
}

impl Decimal {
    /// Reads a number in JSON's grammar (ECMAScript's output is in it too,
    /// with `e+`). The exponent saturates: a value that far out rounds to 0
    /// or to no double at all, and is never equal to what JCS writes.
    fn of(text: &str) -> Decimal {
        let (mantissa, exponent) = match text.find(['e', 'E']) {
            Some(at) => (&text[..at], &text[at + 1..]),
            None => (text, "0"),
        };
        let (negative, mantissa) = match mantissa.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, mantissa),
        };
        let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
        let exponent_negative = exponent.starts_with('-');
        let exponent = exponent
            .trim_start_matches(['+', '-'])
            .bytes()
            .fold(0i64, |n, d| {
                n.saturating_mul(10).saturating_add(i64::from(d - b'0'))
            });
        let mut digits: Vec<u8> = whole.bytes().chain(fraction.bytes()).collect();
        let trailing = digits.iter().rev().take_while(|&&d| d == b'0').count();
        digits.truncate(digits.len() - trailing);
        let leading = digits.iter().take_while(|&&d| d == b'0').count();
        digits.drain(..leading);
        if digits.is_empty() {
            return Decimal {
                negative: false,
                digits,
                exponent: 0,
            };
        }
        let exponent = if exponent_negative {
            -exponent
        } else {
            exponent
        };
        Decimal {
            negative,
            digits,
            exponent: exponent
                .saturating_sub(fraction.len() as i64)
                .saturating_add(trailing as i64),
        }
    }
}

/// The canonical bytes of `value`.
pub fn canonicalize(value: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    write_value(value, &mut out);
    out
}

fn write_value(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(n) => {
            // I-JSON numbers are doubles; a value serde_json cannot make a
            // double of does not exist in JSON text, so 0 is never reached.
            let double = n.as_f64().unwrap_or(0.0);
            let mut buffer = ryu_js::Buffer::new();
            out.extend_from_slice(buffer.format(double).as_bytes());
        }
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_value(item, out);
            }
            out.push(b']');
        }
        Value::Object(members) => {
            let mut sorted: Vec<(&String, &Value)> = members.iter().collect();
            sorted.sort_by(|(a, _), (b, _)| a.encode_utf16().cmp(b.encode_utf16()));
            out.push(b'{');
            for (i, (name, member)) in sorted.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_string(name, out);
                out.push(b':');
                write_value(member, out);
            }
            out.push(b'}');
        }
    }
}

fn write_string(s: &str, out: &mut Vec<u8>) {
    // serde_json escapes exactly `"`, `\` and C0 controls, with the short forms
    // \b \f \n \r \t and lower-case \u00xx otherwise: RFC 8785's rules.
    serde_json::to_writer(&mut *out, s).unwrap_or_default();
}

/// Removes the member or element `pointer` (RFC 6901) names, if it exists:
/// an element only by an index in RFC 6901's form, so `/01` or `/+1`, which
/// name nothing, never remove element 1.
pub fn remove_pointer(value: &mut Value, pointer: &str) {
    let Some((parent, last)) = pointer.rsplit_once('/') else {
        return;
    };
    let token = last.replace("~1", "/").replace("~0", "~");
    match value.pointer_mut(parent) {
        Some(Value::Object(members)) => {
            members.remove(&token);
        }
        Some(Value::Array(items)) => {
            if let Some(index) = array_index(&token)
                && index < items.len()
            {
                items.remove(index);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests;
