//! Text a server sent, made safe to print: what `keys` renders from the
//! admin API and what `healthcheck` shows of an answer that is not ready.

/// `text` with its control characters (an escape sequence in a key, a
/// note or a page) and its bidirectional formatting characters (U+202E,
/// which turns the rest of a line around) shown escaped, never obeyed by
/// the terminal.
pub(crate) fn printable(text: &str) -> String {
    let mut shown = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() || bidi_control(c) {
            shown.extend(c.escape_default());
        } else {
            shown.push(c);
        }
    }
    shown
}

/// The characters that change the direction text is shown in (Unicode's
/// `Bidi_Control`).
fn bidi_control(c: char) -> bool {
    matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_and_direction_marks_are_shown_escaped() {
        assert_eq!(printable("a\u{1b}[31mb"), "a\\u{1b}[31mb");
        assert_eq!(printable("ann\u{202e}x"), "ann\\u{202e}x");
        assert_eq!(printable("Köln ✓"), "Köln ✓");
    }
}
