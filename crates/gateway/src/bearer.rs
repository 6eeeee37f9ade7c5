//! The admin token as its SHA-256, and whether an `Authorization` field
//! presents it: the admin API accepts a call by it (`admin::auth`), and the
//! proxy listener refuses a call meant for the admin API that carries it
//! (`pipeline`), so the token is never forwarded to an upstream.
//!
//! Invariant: a presented token is compared as its digest, 32 bytes
//! against 32 (`subtle`), so neither where its first wrong byte is nor its
//! length, which a caller chooses, changes how long the comparison takes;
//! the token itself is not kept.

use http::HeaderValue;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// A bearer token's SHA-256.
#[derive(Clone, Copy)]
pub struct TokenDigest([u8; 32]);

impl std::fmt::Debug for TokenDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenDigest(..)")
    }
}

impl TokenDigest {
    pub fn of(token: &[u8]) -> Self {
        TokenDigest(Sha256::digest(token).into())
    }

    /// Whether `field` (an `Authorization` value) is `Bearer <the token>`:
    /// the scheme in any case (RFC 9110 §11.1), the token exactly.
    pub fn presented_in(&self, field: &HeaderValue) -> bool {
        field
            .to_str()
            .ok()
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .is_some_and(|(_, token)| self.is(token.trim()))
    }

    /// Whether the token is anywhere in `field`, however framed (another
    /// separator, lines joined by commas): what must not be forwarded.
    pub fn carried_by(&self, field: &HeaderValue) -> bool {
        let text = String::from_utf8_lossy(field.as_bytes());
        text.split(|c: char| c == ',' || c.is_ascii_whitespace())
            .filter(|piece| !piece.is_empty())
            .any(|piece| self.is(piece))
    }

    fn is(&self, token: &str) -> bool {
        let presented = Sha256::digest(token.as_bytes());
        bool::from(presented.as_slice().ct_eq(&self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scheme_in_any_case_the_token_exactly() {
        let digest = TokenDigest::of(b"s3cret");
        let presents = |v: &str| digest.presented_in(&HeaderValue::from_str(v).unwrap());
        assert!(presents("Bearer s3cret"));
        assert!(presents("bEARER s3cret"));
        assert!(!presents("Bearer S3CRET"));
        assert!(!presents("Basic s3cret"));
        assert!(!presents("Bearer s3cret2"));
        assert!(!presents("s3cret"));
        let carried = |v: &str| digest.carried_by(&HeaderValue::from_str(v).unwrap());
        assert!(carried("Bearer\ts3cret"));
        assert!(carried("Bearer other, Bearer s3cret"));
        assert!(carried("s3cret"));
        assert!(!carried("Bearer s3cret2, Basic x"));
    }
}
