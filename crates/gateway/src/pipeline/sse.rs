//! Server-sent events (the HTML Living Standard's event stream format), as
//! MCP servers answer over Streamable HTTP: the events of a stream as they
//! arrive (`Events`), the messages they carry (their `data`), and events
//! written back.
//!
//! Invariant: an event is complete only once a blank line ends it; what
//! comes after the last blank line of a stream that ended (a cut stream)
//! is no event.

use bytes::{Bytes, BytesMut};

/// A stream's complete events as its bytes arrive.
#[derive(Debug, Default)]
pub(crate) struct Events {
    pending: BytesMut,
    /// How far into `pending` the scan for an event's end got, and whether
    /// the byte before there ended a line: each byte is scanned once, so a
    /// large event arriving in small pieces costs its length, not more.
    scanned: usize,
    after_line_end: bool,
}

impl Events {
    /// Takes `bytes` of the stream; returns the events they complete, each
    /// as sent, its ending blank line included.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<Bytes> {
        self.pending.extend_from_slice(bytes);
        let mut events = Vec::new();
        while let Some(end) = self.event_end() {
            events.push(self.pending.split_to(end).freeze());
            self.scanned = 0;
            self.after_line_end = false;
        }
        events
    }

    /// Where the first pending event ends (after its blank line: a line
    /// end followed at once by another — `\n\n`, `\r\n\r\n`, `\r\r`,
    /// or mixed), scanning on from where the last scan stopped.
    fn event_end(&mut self) -> Option<usize> {
        let bytes = &self.pending;
        let mut i = self.scanned;
        while i < bytes.len() {
            let line_end = match bytes[i] {
                b'\r' if bytes.get(i + 1) == Some(&b'\n') => 2,
                // A lone CR at the very end may be half of a CRLF still
                // coming, unless it ends the blank line anyway.
                b'\r' if i + 1 == bytes.len() && !self.after_line_end => break,
                b'\r' | b'\n' => 1,
                _ => 0,
            };
            if line_end == 0 {
                self.after_line_end = false;
                i += 1;
                continue;
            }
            i += line_end;
            if self.after_line_end {
                return Some(i);
            }
            self.after_line_end = true;
        }
        self.scanned = i;
        None
    }

    /// How many bytes of an event not yet complete it holds.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }
}

/// The message of each complete event in `stream` that carries one, in
/// order: its `data` lines joined by `\n`. Comments, `event`, `id` and
/// `retry` lines carry none, nor does an event without data or whose data
/// is blank (a 2025-11-25 server's priming event: an `id` and `data: `,
/// for a client to resume from), since no JSON text is blank.
pub fn messages(stream: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(stream);
    let mut events = Vec::new();
    let mut data: Option<String> = None;
    // Lines end in CRLF, LF or CR; a trailing piece without an end is cut.
    let normalized = text.replace("\r\n", "\n").replace('\r', "\n");
    let mut lines: Vec<&str> = normalized.split('\n').collect();
    // The text after the last line end is no complete line.
    lines.pop();
    for line in lines {
        if line.is_empty() {
            events.extend(data.take().filter(|data| !is_blank(data)));
            continue;
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        if field == "data" {
            match &mut data {
                Some(joined) => {
                    joined.push('\n');
                    joined.push_str(value);
                }
                None => data = Some(value.to_string()),
            }
        }
    }
    events
}

/// Empty, or only JSON's whitespace.
fn is_blank(data: &str) -> bool {
    data.trim_matches([' ', '\t', '\n', '\r']).is_empty()
}

/// One event carrying `data`: each of its lines (ended by LF, CR or CRLF,
/// as a parser ends them) on a `data:` line of its own, since a parser
/// reads a line without that prefix as another field.
pub fn event(data: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(data.len() + 32);
    out.extend_from_slice(b"event: message\n");
    let mut rest = data;
    loop {
        let end = rest.iter().position(|b| matches!(b, b'\n' | b'\r'));
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(&rest[..end.unwrap_or(rest.len())]);
        out.push(b'\n');
        let Some(end) = end else { break };
        let crlf = rest[end..].starts_with(b"\r\n");
        rest = &rest[end + if crlf { 2 } else { 1 }..];
    }
    out.push(b'\n');
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_read_whatever_their_line_ends() {
        let stream = b": keep-alive\r\n\r\nevent: message\r\ndata: {\"a\":1}\r\n\r\nid: 7\ndata: x\ndata: y\n\nretry: 5\n\ndata: cut";
        assert_eq!(messages(stream), vec!["{\"a\":1}", "x\ny"]);
        assert_eq!(messages(b"data:{}\r\r"), vec!["{}"]);
    }

    #[test]
    fn an_event_with_blank_data_carries_no_message() {
        let primed = b"id: ev-0\ndata: \n\nid: ev-1\ndata:\n\ndata: \ndata:  \n\ndata: {}\n\n";
        assert_eq!(messages(primed), vec!["{}"]);
    }

    #[test]
    fn events_complete_as_their_bytes_arrive() {
        let mut events = Events::default();
        assert!(events.push(b"event: message\r\ndata: {\"a\"").is_empty());
        // A lone CR may be half a CRLF, unless the line before it ended.
        assert!(events.push(b":1}\r").is_empty(), "half a CRLF");
        let first = events.push(b"\n\r");
        assert_eq!(first.len(), 1);
        assert_eq!(messages(&first[0]), vec!["{\"a\":1}"]);
        // The LF after that CR is an empty line of its own: no event.
        let second = events.push(b"\ndata: b\n\ndata: c");
        assert_eq!(second.len(), 1);
        assert_eq!(messages(&second[0]), vec!["b"]);
        assert_eq!(events.pending(), b"data: c".len());
        assert_eq!(
            events.push(b"\r\r"),
            vec![Bytes::from_static(b"data: c\r\r")]
        );
    }

    #[test]
    fn events_split_in_any_pieces_are_the_same_events() {
        let stream = b"event: message\r\ndata: {\"a\":1}\r\n\r\n: comment\n\ndata: x\ndata: y\r\rdata: z\n\n";
        let whole = Events::default().push(stream);
        for size in 1..stream.len() {
            let mut events = Events::default();
            let pieces: Vec<Bytes> = stream.chunks(size).flat_map(|c| events.push(c)).collect();
            let data: Vec<Vec<String>> = pieces.iter().map(|e| messages(e)).collect();
            let expected: Vec<Vec<String>> = whole.iter().map(|e| messages(e)).collect();
            assert_eq!(data, expected, "pieces of {size}");
        }
    }

    #[test]
    fn a_written_event_reads_back() {
        assert_eq!(messages(&event(b"{\"id\":1}")), vec!["{\"id\":1}"]);
        // Each line of the data on a `data:` line of its own.
        let pretty = "{\n \"id\": 1,\n\n \"a\": \"b\"\n}";
        let written = event(pretty.as_bytes());
        assert_eq!(
            written,
            "event: message\ndata: {\ndata:  \"id\": 1,\ndata: \ndata:  \"a\": \"b\"\ndata: }\n\n"
        );
        assert_eq!(messages(&written), vec![pretty]);
        // A CR or CRLF ends a line as LF does.
        assert_eq!(messages(&event(b"{\r\"a\":\r\n1}")), vec!["{\n\"a\":\n1}"]);
    }
}
