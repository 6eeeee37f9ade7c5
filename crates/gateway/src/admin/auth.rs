//! The admin token: `Authorization: Bearer <token>` on every `/admin/*`
//! call, the token read once at startup from the environment variable named
//! by `admin_token_env`.
//!
//! Invariants: the comparison takes the same time wherever the first wrong
//! byte is and whatever the presented token's length, and the token itself
//! is not kept (`crate::bearer`); a request with more than one `Authorization` line is
//! refused (400 `ambiguous-credentials`) whatever the lines hold, never
//! judged by one of them; with no token configured (the variable unset or
//! empty) every `/admin/*` call is 401 `admin-token-unset`, which names the
//! variable to set (never a value: there is none) so an operator at the
//! console learns what is missing; a configured token is one some
//! `Authorization` header can carry, so it can match — idemgate refuses to
//! start with one that has surrounding whitespace, is blank, or holds a
//! character outside printable ASCII ([`UnusableToken`]), rather than trim
//! a secret behind the operator's back; and idemgate refuses to start with
//! an admin listener off loopback and no token
//! (`AdminToken::check_exposure`).

use std::net::SocketAddr;

use http::HeaderMap;
use http::header::AUTHORIZATION;

use super::AdminError;
use crate::bearer::TokenDigest;

/// The configured token, if any, as its SHA-256: never logged or shown,
/// and compared digest to digest so that a presented token's length, which
/// an attacker chooses, says nothing of the configured one's.
pub struct AdminToken {
    token: Option<TokenDigest>,
    /// The token's length, for the request heads it must fit in.
    length: usize,
    /// The variable the token is read from, named when there is none.
    variable: String,
}

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.token.is_some() {
            "AdminToken(set)"
        } else {
            "AdminToken(unset)"
        })
    }
}

/// An admin listener reachable from other hosts with no token to guard it.
#[derive(Debug, thiserror::Error)]
#[error(
    "server.admin_listen = {admin_listen} is not a loopback address and the admin token variable {variable} is unset or empty: set it to a token, or listen on 127.0.0.1"
)]
pub struct ExposedAdmin {
    pub(crate) admin_listen: SocketAddr,
    pub(crate) variable: String,
}

/// A configured token that no request could ever present: header values
/// lose their surrounding whitespace on the wire and carry only printable
/// ASCII, so the admin API would be set up yet shut to everyone.
#[derive(Debug, thiserror::Error)]
#[error(
    "the admin token variable {variable} {fault}, so no Authorization header could ever match it: set it to the token alone (or unset it for no admin access)"
)]
pub struct UnusableToken {
    pub variable: String,
    pub fault: TokenFault,
}

/// What makes a token [unusable](UnusableToken).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TokenFault {
    #[error("is blank (only whitespace)")]
    Blank,
    #[error("has leading or trailing whitespace")]
    SurroundingWhitespace,
    #[error("has a character outside printable ASCII")]
    NotPrintable,
    #[error("is too long for a request head (server.max_header_bytes, less 1KiB for the rest)")]
    TooLong,
}

/// What would keep a non-empty `token` from ever matching an
/// `Authorization` header, if anything: the gateway refuses to start with
/// such a token, and `idemgate keys` refuses to send it.
pub fn token_fault(token: &str) -> Option<TokenFault> {
    // Whitespace first: a trailing newline (a token file written with
    // `echo`) is the likely mistake, and the message should say so.
    if token.trim().is_empty() {
        Some(TokenFault::Blank)
    } else if token.trim() != token {
        Some(TokenFault::SurroundingWhitespace)
    } else if !token
        .bytes()
        .all(|b| (0x20..=0x7e).contains(&b) || b == b'\t')
    {
        Some(TokenFault::NotPrintable)
    } else {
        None
    }
}

impl AdminToken {
    fn set(token: &[u8], variable: &str) -> Self {
        AdminToken {
            token: Some(TokenDigest::of(token)),
            length: token.len(),
            variable: variable.to_string(),
        }
    }

    fn unset(variable: &str) -> Self {
        AdminToken {
            token: None,
            length: 0,
            variable: variable.to_string(),
        }
    }

    /// Reads the token from the environment variable `variable`; unset or
    /// empty means no token.
    pub fn from_env(variable: &str) -> Result<Self, UnusableToken> {
        match std::env::var(variable) {
            Ok(token) => Self::new(token, variable),
            Err(std::env::VarError::NotPresent) => Ok(AdminToken::unset(variable)),
            Err(std::env::VarError::NotUnicode(_)) => Err(UnusableToken {
                variable: variable.to_string(),
                fault: TokenFault::NotPrintable,
            }),
        }
    }

    /// A token given directly, in place of `variable`'s value (which the
    /// error names); empty means no token.
    pub fn new(token: String, variable: &str) -> Result<Self, UnusableToken> {
        if token.is_empty() {
            return Ok(AdminToken::unset(variable));
        }
        match token_fault(&token) {
            None => Ok(AdminToken::set(token.as_bytes(), variable)),
            Some(fault) => Err(UnusableToken {
                variable: variable.to_string(),
                fault,
            }),
        }
    }

    /// Refuses a token no request head of at most `max_header_bytes`
    /// could carry beside a request line and a few fields (1 KiB): every
    /// admin call would be 431.
    pub(crate) fn check_length(&self, max_header_bytes: usize) -> Result<(), UnusableToken> {
        if self.length + 1024 > max_header_bytes && self.token.is_some() {
            return Err(UnusableToken {
                variable: self.variable.clone(),
                fault: TokenFault::TooLong,
            });
        }
        Ok(())
    }

    /// Refuses an admin listener off loopback without a token.
    pub(crate) fn check_exposure(
        &self,
        admin_listen: SocketAddr,
        variable: &str,
    ) -> Result<(), ExposedAdmin> {
        if self.token.is_none() && !admin_listen.ip().is_loopback() {
            return Err(ExposedAdmin {
                admin_listen,
                variable: variable.to_string(),
            });
        }
        Ok(())
    }

    /// Accepts exactly one `Authorization: Bearer <token>`.
    pub fn check(&self, headers: &HeaderMap) -> Result<(), AdminError> {
        let Some(expected) = &self.token else {
            return Err(AdminError::TokenUnset {
                variable: self.variable.clone(),
            });
        };
        // Refused before any comparison, so that which line holds the token
        // (the right one first, or second) changes nothing in the answer.
        let count = headers.get_all(AUTHORIZATION).iter().count();
        if count > 1 {
            return Err(AdminError::AmbiguousCredentials { count });
        }
        match headers.get(AUTHORIZATION) {
            Some(field) if expected.presented_in(field) => Ok(()),
            _ => Err(AdminError::Unauthorized),
        }
    }

    /// The token's digest, for the proxy listener to refuse a call that
    /// carries it; `None` when there is no token.
    pub(crate) fn digest(&self) -> Option<TokenDigest> {
        self.token
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn a_token_no_request_head_can_carry_is_refused() {
        let long = AdminToken::new("t".repeat(65 * 1024), "V").unwrap();
        let refused = long.check_length(64 * 1024).unwrap_err();
        assert_eq!(refused.fault, TokenFault::TooLong);
        assert!(
            refused.to_string().contains("max_header_bytes"),
            "{refused}"
        );
        let fits = AdminToken::new("t".repeat(63 * 1024), "V").unwrap();
        assert!(fits.check_length(64 * 1024).is_ok());
        assert!(
            AdminToken::new(String::new(), "V")
                .unwrap()
                .check_length(8192)
                .is_ok()
        );
    }

    fn with(auth: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(AUTHORIZATION, HeaderValue::from_str(auth).unwrap());
        headers
    }

    #[test]
    fn only_the_exact_bearer_token_passes() {
        let token = AdminToken::set(b"s3cret", "V");
        assert!(token.check(&with("Bearer s3cret")).is_ok());
        assert!(token.check(&with("Bearer s3cre")).is_err());
        assert!(token.check(&with("Bearer s3cret2")).is_err());
        assert!(token.check(&with("bearer s3cret")).is_ok());
        assert!(token.check(&with("Bearer  s3cret ")).is_ok());
        assert!(token.check(&with("Bearers3cret")).is_err());
        assert!(token.check(&with("Basic s3cret")).is_err());
        assert!(token.check(&HeaderMap::new()).is_err());
        assert!(matches!(
            AdminToken::unset("V").check(&with("Bearer ")),
            Err(AdminError::TokenUnset { variable }) if variable == "V"
        ));
        assert_eq!(format!("{token:?}"), "AdminToken(set)");
    }

    #[test]
    fn two_authorization_lines_are_refused_whatever_they_hold() {
        let token = AdminToken::set(b"s3cret", "V");
        for pair in [
            ["Bearer s3cret", "Bearer wrong"],
            ["Bearer wrong", "Bearer s3cret"],
            ["Bearer s3cret", "Bearer s3cret"],
        ] {
            let mut headers = HeaderMap::new();
            for line in pair {
                headers.append(AUTHORIZATION, HeaderValue::from_static(line));
            }
            assert!(
                matches!(
                    token.check(&headers),
                    Err(AdminError::AmbiguousCredentials { count: 2 })
                ),
                "{pair:?}"
            );
        }
    }

    #[test]
    fn an_exposed_listener_needs_a_token() {
        let exposed: SocketAddr = "0.0.0.0:9090".parse().unwrap();
        let local: SocketAddr = "127.0.0.1:9090".parse().unwrap();
        let err = AdminToken::unset("V")
            .check_exposure(exposed, "IDEMGATE_ADMIN_TOKEN")
            .unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("admin_listen") && text.contains("IDEMGATE_ADMIN_TOKEN"),
            "{text}"
        );
        assert!(AdminToken::unset("V").check_exposure(local, "X").is_ok());
        assert!(
            AdminToken::set(b"t", "V")
                .check_exposure(exposed, "X")
                .is_ok()
        );
    }

    #[test]
    fn a_token_no_header_can_carry_is_refused_not_trimmed() {
        let fault = |token: &str| AdminToken::new(token.into(), "ADMIN_VAR").map_err(|e| e.fault);
        for (token, expected) in [
            (" s3cret", TokenFault::SurroundingWhitespace),
            ("s3cret\n", TokenFault::SurroundingWhitespace),
            ("\ts3cret", TokenFault::SurroundingWhitespace),
            ("   ", TokenFault::Blank),
            ("s3cr\u{e9}t", TokenFault::NotPrintable),
            ("s3\ncret", TokenFault::NotPrintable),
        ] {
            assert_eq!(fault(token).err(), Some(expected), "{token:?}");
        }
        let err = AdminToken::new(" s3cret ".into(), "ADMIN_VAR").unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("ADMIN_VAR") && text.contains("whitespace"),
            "{text}"
        );
        assert!(!text.contains("s3cret"), "the token is never shown: {text}");
        // Empty is no token; inner spaces can be sent, so they are kept.
        let none = AdminToken::new(String::new(), "ADMIN_VAR").unwrap();
        assert_eq!(format!("{none:?}"), "AdminToken(unset)");
        let spaced = AdminToken::new("s3 cret".into(), "ADMIN_VAR").unwrap();
        assert!(spaced.check(&with("Bearer s3 cret")).is_ok());
    }
}
