//! The admin token: `Authorization: Bearer <token>` on every `/admin/*`
//! call, the token read once at startup from the environment variable named
//! by `admin_token_env`.
//!
//! Invariants: the comparison takes the same time wherever the first wrong
//! byte is (`subtle`); with no token configured every `/admin/*` call is
//! 401; and idemgate refuses to start with an admin listener off loopback
//! and no token ([`AdminToken::check_exposure`]).

use std::net::SocketAddr;

use http::HeaderMap;
use http::header::AUTHORIZATION;
use subtle::ConstantTimeEq;

use super::AdminError;

/// The configured token, if any. Never logged or shown.
pub struct AdminToken(Option<Vec<u8>>);

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "AdminToken(set)"
        } else {
            "AdminToken(unset)"
        })
    }
}

/// An admin listener reachable from other hosts with no token to guard it.
#[derive(Debug, thiserror::Error)]
#[error(
    "server.admin_listen = {admin_listen} is not a loopback address and the admin token variable {variable} is not set: set it, or listen on 127.0.0.1"
)]
pub struct ExposedAdmin {
    pub admin_listen: SocketAddr,
    pub variable: String,
}

impl AdminToken {
    /// Reads the token from the environment variable `variable`; an empty
    /// value counts as unset.
    pub fn from_env(variable: &str) -> Self {
        Self::new(std::env::var(variable).unwrap_or_default())
    }

    /// A token given directly; empty counts as unset.
    pub fn new(token: String) -> Self {
        AdminToken(Some(token.into_bytes()).filter(|t| !t.is_empty()))
    }

    /// Refuses an admin listener off loopback without a token.
    pub fn check_exposure(
        &self,
        admin_listen: SocketAddr,
        variable: &str,
    ) -> Result<(), ExposedAdmin> {
        if self.0.is_none() && !admin_listen.ip().is_loopback() {
            return Err(ExposedAdmin {
                admin_listen,
                variable: variable.to_string(),
            });
        }
        Ok(())
    }

    /// Accepts exactly `Authorization: Bearer <token>`.
    pub fn check(&self, headers: &HeaderMap) -> Result<(), AdminError> {
        let Some(expected) = &self.0 else {
            return Err(AdminError::Unauthorized);
        };
        // The scheme is case-insensitive (RFC 9110 §11.1); the token is not.
        let presented = headers
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim().as_bytes())
            .ok_or(AdminError::Unauthorized)?;
        if bool::from(presented.ct_eq(expected)) {
            Ok(())
        } else {
            Err(AdminError::Unauthorized)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn with(auth: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(AUTHORIZATION, HeaderValue::from_str(auth).unwrap());
        headers
    }

    #[test]
    fn only_the_exact_bearer_token_passes() {
        let token = AdminToken(Some(b"s3cret".to_vec()));
        assert!(token.check(&with("Bearer s3cret")).is_ok());
        assert!(token.check(&with("Bearer s3cre")).is_err());
        assert!(token.check(&with("Bearer s3cret2")).is_err());
        assert!(token.check(&with("bearer s3cret")).is_ok());
        assert!(token.check(&with("Bearer  s3cret ")).is_ok());
        assert!(token.check(&with("Bearers3cret")).is_err());
        assert!(token.check(&with("Basic s3cret")).is_err());
        assert!(token.check(&HeaderMap::new()).is_err());
        assert!(AdminToken(None).check(&with("Bearer ")).is_err());
        assert_eq!(format!("{token:?}"), "AdminToken(set)");
    }

    #[test]
    fn an_exposed_listener_needs_a_token() {
        let exposed: SocketAddr = "0.0.0.0:9090".parse().unwrap();
        let local: SocketAddr = "127.0.0.1:9090".parse().unwrap();
        let err = AdminToken(None)
            .check_exposure(exposed, "IDEMGATE_ADMIN_TOKEN")
            .unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("admin_listen") && text.contains("IDEMGATE_ADMIN_TOKEN"),
            "{text}"
        );
        assert!(AdminToken(None).check_exposure(local, "X").is_ok());
        assert!(
            AdminToken(Some(b"t".to_vec()))
                .check_exposure(exposed, "X")
                .is_ok()
        );
    }
}
