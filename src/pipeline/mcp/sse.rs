//! Server-sent events as an MCP server writes them (the HTML Living
//! Standard's event stream format): the `data` of each event, and events
//! written back.
//!
//! Invariant: [`messages`] reads a whole stream that has ended; an event
//! not ended by a blank line (a cut stream) is not an event.

use bytes::Bytes;

/// The data of each complete event in `stream`, in order: its `data`
/// lines joined by `\n`. Comments, `event`, `id` and `retry` lines, and
/// events without data, carry none.
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
            if let Some(event) = data.take() {
                events.push(event);
            }
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

/// One event carrying `data` (a JSON text: it holds no line end).
pub fn event(data: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(data.len() + 24);
    out.extend_from_slice(b"event: message\ndata: ");
    out.extend_from_slice(data);
    out.extend_from_slice(b"\n\n");
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
    fn a_written_event_reads_back() {
        assert_eq!(messages(&event(b"{\"id\":1}")), vec!["{\"id\":1}"]);
    }
}
