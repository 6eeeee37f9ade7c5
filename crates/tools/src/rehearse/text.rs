//! Bodies and answers as one short line of a report.
//!
//! Invariant: what these return is at most the width asked for, `…`
//! marking a cut; [`shorten`]'s is one line (each run of whitespace one
//! space).

/// One line of at most 100 characters.
pub(super) fn shorten(body: &str) -> String {
    cut(&body.split_whitespace().collect::<Vec<_>>().join(" "), 100)
}

/// `text` cut to `width` characters, `…` marking the cut.
pub(super) fn cut(text: &str, width: usize) -> String {
    match text.char_indices().nth(width.saturating_sub(1)) {
        Some((at, _)) if text.chars().count() > width => format!("{}…", &text[..at]),
        _ => text.to_string(),
    }
}
