//! Text a server sent, made safe to print: what `keys` renders from the
//! admin API and what `healthcheck` shows of an answer that is not ready.

/// `text` with its control characters (an escape sequence in a key, a
/// note or a page) shown escaped, never obeyed by the terminal.
pub(crate) fn printable(text: &str) -> String {
    let mut shown = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() {
            shown.extend(c.escape_default());
        } else {
            shown.push(c);
        }
    }
    shown
}
