//! An error and its causes as one line (`outer: cause: root cause`), for
//! logs, events and messages: hyper's and hyper-util's own messages
//! ("client error (Connect)") say little without their sources. Only what
//! the errors themselves say: never a payload.

use std::error::Error;
use std::fmt::Write as _;

/// `error`'s message, then each of its sources', joined by `": "`.
pub fn error_chain(error: &(dyn Error + 'static)) -> String {
    error_chain_with(error, |_| None)
}

/// [`error_chain`], with what `in_words` says of a link in place of its
/// message where it says something: for an error whose own message is
/// its Debug form (a layer above knows the type; this floor does not).
pub fn error_chain_with(
    error: &(dyn Error + 'static),
    in_words: impl Fn(&(dyn Error + 'static)) -> Option<String>,
) -> String {
    let say = |link: &(dyn Error + 'static)| in_words(link).unwrap_or_else(|| link.to_string());
    let mut text = say(error);
    let mut source = error.source();
    while let Some(cause) = source {
        let _ = write!(text, ": {}", say(cause));
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn every_cause_is_written_in_order() {
        let root = std::io::Error::other("root");
        assert_eq!(error_chain(&Outer(root)), "outer: root");
        assert_eq!(error_chain(&std::io::Error::other("alone")), "alone");
    }

    #[test]
    fn a_link_said_in_words_takes_its_messages_place() {
        let chain = Outer(std::io::Error::other("root"));
        let root_in_words = |link: &(dyn Error + 'static)| {
            link.downcast_ref::<std::io::Error>()
                .map(|_| "in words".to_string())
        };
        assert_eq!(error_chain_with(&chain, root_in_words), "outer: in words");
        assert_eq!(error_chain_with(&chain, |_| None), "outer: root");
    }
}
