//! An error and its causes as one line (`outer: cause: root cause`), for
//! logs, events and messages: hyper's and hyper-util's own messages
//! ("client error (Connect)") say little without their sources. Only what
//! the errors themselves say: never a payload.

use std::error::Error;
use std::fmt::Write as _;

/// `error`'s message, then each of its sources', joined by `": "`.
pub fn error_chain(error: &dyn Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let _ = write!(text, ": {cause}");
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
}
