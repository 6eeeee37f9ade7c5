//! The sealed store: what operations keep of payloads — response headers
//! and bodies, and request bodies where a route stores them — sealed with
//! AES-256-GCM under a key kept outside the database (README "Sealed
//! store"). Both backends call this module on the way in and out; the SQL
//! never sees a key.
//!
//! Invariants:
//! - with a key, every payload written is sealed: [`MAGIC`], the key's id,
//!   a fresh random 96-bit nonce, then the ciphertext and its tag. The
//!   associated data names the operation and the field, so a sealed value
//!   copied to another operation, or a header blob put where a body goes,
//!   does not open;
//! - a value that does not open is an error ([`SealError::Unreadable`]),
//!   never handed out as bytes: a tampered or foreign value is reported,
//!   not replayed;
//! - values written before a key was configured stay readable as they
//!   are (they do not start with [`MAGIC`]) until `idemgate rekey` seals
//!   them;
//! - the store keeps a sealed canary ([`Seal::canary`]): at open, a key
//!   that does not fit the store, or no key for a sealed store, refuses to
//!   start ([`Seal::check_canary`]) instead of failing on every operation.

use std::borrow::Cow;
use std::sync::Arc;

use aes_gcm::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use sha2::{Digest, Sha256};

use super::{StoreError, StoredResponse, decode_headers, encode_headers};
use crate::config::StoreConfig;

/// The first bytes of every sealed value (format version 1). A NUL first,
/// so no JSON or text body written before sealing looks like one.
const MAGIC: &[u8; 8] = b"\0igseal1";

/// Sealed response headers are text (the column holds JSON when plain):
/// this prefix, then the sealed value in base64. JSON never starts so.
const TEXT_PREFIX: &str = "igseal1:";

const KEY_ID_LEN: usize = 8;
const NONCE_LEN: usize = 12;
const HEADER_LEN: usize = MAGIC.len() + KEY_ID_LEN + NONCE_LEN;

/// What the canary holds, sealed under the operation id [`CANARY_ID`].
const CANARY_PLAIN: &[u8] = b"idemgate store canary";
const CANARY_ID: &str = "store-canary";

/// The first 8 bytes of SHA-256 over a domain tag and the key: names a
/// key in the store and in messages without revealing it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyId([u8; KEY_ID_LEN]);

impl std::fmt::Display for KeyId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

/// Which stored payload a value is: part of its associated data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    RequestBody,
    ResponseHeaders,
    ResponseBody,
}

impl Field {
    fn name(self) -> &'static str {
        match self {
            Field::RequestBody => "request_body",
            Field::ResponseHeaders => "response_headers",
            Field::ResponseBody => "response_body",
        }
    }
}

/// Why a key was refused, or why a sealed value or store cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    #[error(
        "the environment variable {env} ({field}) is not set; it must hold a 32-byte key in base64"
    )]
    MissingKey { env: String, field: &'static str },
    #[error(
        "the environment variable {env} ({field}) does not hold a 32-byte key in base64: {reason}"
    )]
    MalformedKey {
        env: String,
        field: &'static str,
        reason: String,
    },
    #[error(
        "the store is sealed under key {stored}, but no key is configured: set store.encryption_key_env to the variable holding that key"
    )]
    NoKey { stored: KeyId },
    #[error(
        "the store is sealed under key {stored}, but the key in {env} has id {current}{previous}: give the key the store was sealed with (as store.previous_key_env while rotating, then run `idemgate rekey`)"
    )]
    WrongKey {
        stored: KeyId,
        current: KeyId,
        env: String,
        previous: String,
    },
    #[error("the store's canary does not open under key {0}: the key or the canary was altered")]
    CanaryAltered(KeyId),
    #[error("the sealed {field} of operation {operation} cannot be read: {reason}")]
    Unreadable {
        operation: String,
        field: &'static str,
        reason: String,
    },
}

/// One AES-256 key and its id.
#[derive(Clone)]
pub struct StoreKey {
    id: KeyId,
    cipher: Aes256Gcm,
}

impl StoreKey {
    /// The key held in `env` (named by config `field`), as `lookup` reads it:
    /// 32 bytes, in standard base64 (surrounding whitespace ignored).
    pub fn from_env(
        env: &str,
        field: &'static str,
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, SealError> {
        let text = lookup(env).ok_or_else(|| SealError::MissingKey {
            env: env.to_string(),
            field,
        })?;
        let malformed = |reason: String| SealError::MalformedKey {
            env: env.to_string(),
            field,
            reason,
        };
        let bytes = STANDARD
            .decode(text.trim())
            .map_err(|e| malformed(format!("not base64 ({e})")))?;
        let key: [u8; 32] = bytes
            .try_into()
            .map_err(|b: Vec<u8>| malformed(format!("{} bytes", b.len())))?;
        Ok(Self::new(&key))
    }

    /// A new random key in base64, as `store.encryption_key_env` takes it.
    pub fn generate_base64() -> String {
        STANDARD.encode(Aes256Gcm::generate_key(&mut OsRng))
    }

    pub fn new(key: &[u8; 32]) -> Self {
        let digest = Sha256::new()
            .chain_update(b"idemgate-store-key-id-v1")
            .chain_update(key)
            .finalize();
        let mut id = [0; KEY_ID_LEN];
        id.copy_from_slice(&digest[..KEY_ID_LEN]);
        StoreKey {
            id: KeyId(id),
            cipher: Aes256Gcm::new(key.into()),
        }
    }

    pub fn id(&self) -> KeyId {
        self.id
    }
}

/// The store's keys: the current one seals, both open.
struct Keys {
    current: StoreKey,
    /// Read only: opens values sealed before a rotation until `rekey`.
    previous: Option<StoreKey>,
    /// The variable the current key came from, for messages.
    env: String,
}

/// Seals and opens stored payloads; without keys it passes them through.
#[derive(Clone, Default)]
pub struct Seal {
    keys: Option<Arc<Keys>>,
}

/// The payload columns of one stored operation, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Payloads {
    pub request_body: Option<Vec<u8>>,
    pub response_headers: Option<String>,
    pub response_body: Option<Vec<u8>>,
}

/// A response's headers and body as the store writes them (sealed when
/// keys are set), made before a store call is queued so that SQLite's
/// single writer thread does not spend the sealing.
#[derive(Debug, Clone)]
pub struct StoredForm {
    pub headers: String,
    pub body: Option<Vec<u8>>,
}

/// The name of the canary's row in the store's meta table.
pub const CANARY_ROW: &str = "seal-canary";

/// What [`Seal::check_canary`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Canary {
    /// The keys fit the store.
    Fits,
    /// A store never sealed, opened with a key: store [`Seal::canary`].
    Missing,
}

impl Seal {
    /// No keys: payloads are stored as they are.
    pub fn plain() -> Self {
        Seal::default()
    }

    /// Sealing under `current` (read from `env`), opening with it or `previous`.
    pub fn with_keys(current: StoreKey, previous: Option<StoreKey>, env: &str) -> Self {
        Seal {
            keys: Some(Arc::new(Keys {
                current,
                previous,
                env: env.to_string(),
            })),
        }
    }

    /// The keys `store` names, read through `lookup` (the environment):
    /// none without `encryption_key_env`.
    pub fn from_config(
        store: &StoreConfig,
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, SealError> {
        let Some(env) = &store.encryption_key_env else {
            return Ok(Seal::plain());
        };
        let current = StoreKey::from_env(env, "store.encryption_key_env", lookup)?;
        let previous = match &store.previous_key_env {
            Some(previous) => Some(StoreKey::from_env(
                previous,
                "store.previous_key_env",
                lookup,
            )?),
            None => None,
        };
        Ok(Seal::with_keys(current, previous, env))
    }

    /// Whether payloads are sealed (a key is configured).
    pub fn is_sealing(&self) -> bool {
        self.keys.is_some()
    }

    /// `value` of `operation`'s `field` as it is to be stored.
    pub fn body<'a>(
        &self,
        operation: &str,
        field: Field,
        value: Option<&'a [u8]>,
    ) -> Option<Cow<'a, [u8]>> {
        let value = value?;
        Some(match &self.keys {
            Some(keys) => Cow::Owned(seal(&keys.current, operation, field, value)),
            None => Cow::Borrowed(value),
        })
    }

    /// Response headers of `operation` as they are to be stored.
    pub fn headers(&self, operation: &str, headers: &[(String, Vec<u8>)]) -> String {
        let json = encode_headers(headers);
        match &self.keys {
            Some(keys) => {
                let sealed = seal(
                    &keys.current,
                    operation,
                    Field::ResponseHeaders,
                    json.as_bytes(),
                );
                format!("{TEXT_PREFIX}{}", STANDARD.encode(sealed))
            }
            None => json,
        }
    }

    /// A stored `field` of `operation` as it was written.
    pub fn open_body(
        &self,
        operation: &str,
        field: Field,
        stored: Option<Vec<u8>>,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        match (stored, &self.keys) {
            (Some(value), Some(keys)) if value.starts_with(MAGIC) => {
                Ok(Some(open(keys, operation, field, &value)?))
            }
            (stored, _) => Ok(stored),
        }
    }

    /// `response` of `operation` as the store writes it.
    pub fn stored_form(&self, operation: &str, response: &StoredResponse) -> StoredForm {
        StoredForm {
            headers: self.headers(operation, &response.headers),
            body: self
                .body(operation, Field::ResponseBody, response.body.as_deref())
                .map(Cow::into_owned),
        }
    }

    /// Stored response headers of `operation` as they were written.
    pub fn open_headers(
        &self,
        operation: &str,
        stored: &str,
    ) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let Some(text) = stored.strip_prefix(TEXT_PREFIX) else {
            return decode_headers(stored);
        };
        let field = Field::ResponseHeaders;
        let keys = self
            .keys
            .as_ref()
            .ok_or_else(|| unreadable(operation, field, "no key"))?;
        let sealed = STANDARD
            .decode(text)
            .map_err(|_| unreadable(operation, field, "not base64"))?;
        let json = open(keys, operation, field, &sealed)?;
        let json = String::from_utf8(json).map_err(|_| unreadable(operation, field, "not text"))?;
        decode_headers(&json)
    }

    /// Whether a stored value must be sealed again under the current key
    /// (`idemgate rekey`): it is plain, or sealed under another key.
    pub fn is_stale(&self, stored: &[u8]) -> bool {
        let Some(keys) = &self.keys else {
            return false;
        };
        let stored = match stored.strip_prefix(TEXT_PREFIX.as_bytes()) {
            Some(text) => match STANDARD.decode(text) {
                Ok(bytes) => Cow::Owned(bytes),
                Err(_) => return true,
            },
            None => Cow::Borrowed(stored),
        };
        key_id_of(&stored) != Some(keys.current.id)
    }

    /// `stored` (of `operation`) sealed again under the current key, or
    /// `None` when every value in it already is (`idemgate rekey`).
    pub fn reseal(
        &self,
        operation: &str,
        stored: &Payloads,
    ) -> Result<Option<Payloads>, StoreError> {
        let stale = |value: Option<&[u8]>| value.is_some_and(|v| self.is_stale(v));
        if !(stale(stored.request_body.as_deref())
            || stale(stored.response_headers.as_deref().map(str::as_bytes))
            || stale(stored.response_body.as_deref()))
        {
            return Ok(None);
        }
        let reseal_body = |field, value: &Option<Vec<u8>>| -> Result<_, StoreError> {
            let plain = self.open_body(operation, field, value.clone())?;
            Ok(self
                .body(operation, field, plain.as_deref())
                .map(Cow::into_owned))
        };
        let response_headers = match &stored.response_headers {
            Some(text) => Some(self.headers(operation, &self.open_headers(operation, text)?)),
            None => None,
        };
        Ok(Some(Payloads {
            request_body: reseal_body(Field::RequestBody, &stored.request_body)?,
            response_headers,
            response_body: reseal_body(Field::ResponseBody, &stored.response_body)?,
        }))
    }

    /// The canary to store: [`CANARY_PLAIN`] sealed under the current key.
    pub fn canary(&self) -> Option<String> {
        let keys = self.keys.as_ref()?;
        let sealed = seal(&keys.current, CANARY_ID, Field::ResponseBody, CANARY_PLAIN);
        Some(STANDARD.encode(sealed))
    }

    /// Whether these keys fit a store whose canary is `stored` (`None`:
    /// never sealed).
    pub fn check_canary(&self, stored: Option<&str>) -> Result<Canary, SealError> {
        let (Some(stored), keys) = (stored, &self.keys) else {
            return Ok(if self.keys.is_some() {
                Canary::Missing
            } else {
                Canary::Fits
            });
        };
        let sealed = STANDARD.decode(stored).unwrap_or_default();
        let Some(stored_id) = key_id_of(&sealed) else {
            return Err(SealError::CanaryAltered(KeyId([0; KEY_ID_LEN])));
        };
        let Some(keys) = keys else {
            return Err(SealError::NoKey { stored: stored_id });
        };
        if keys.key(stored_id).is_none() {
            return Err(SealError::WrongKey {
                stored: stored_id,
                current: keys.current.id,
                env: keys.env.clone(),
                previous: match &keys.previous {
                    Some(previous) => format!(" and the previous key has id {}", previous.id),
                    None => String::new(),
                },
            });
        }
        match open(keys, CANARY_ID, Field::ResponseBody, &sealed) {
            Ok(plain) if plain == CANARY_PLAIN => Ok(Canary::Fits),
            _ => Err(SealError::CanaryAltered(stored_id)),
        }
    }

    /// Whether the canary is sealed under the current key (else a rekey
    /// has not finished since the last rotation).
    pub fn canary_is_current(&self, stored: &str) -> bool {
        !self.is_stale(&STANDARD.decode(stored).unwrap_or_default())
    }
}

impl Keys {
    fn key(&self, id: KeyId) -> Option<&StoreKey> {
        std::iter::once(&self.current)
            .chain(&self.previous)
            .find(|key| key.id == id)
    }
}

fn associated_data(operation: &str, field: Field) -> Vec<u8> {
    [
        b"idemgate-seal-v1\0".as_slice(),
        field.name().as_bytes(),
        b"\0",
        operation.as_bytes(),
    ]
    .concat()
}

fn seal(key: &StoreKey, operation: &str, field: Field, plain: &[u8]) -> Vec<u8> {
    let nonce = Aes256Gcm::generate_nonce(&mut OsRng);
    let aad = associated_data(operation, field);
    let payload = Payload {
        msg: plain,
        aad: &aad,
    };
    // Encryption fails only for a message over 64 GiB; stored values are
    // bounded by max_body and max_stored_response far below that.
    let ciphertext = key.cipher.encrypt(&nonce, payload).unwrap_or_default();
    let mut sealed = Vec::with_capacity(HEADER_LEN + ciphertext.len());
    sealed.extend_from_slice(MAGIC);
    sealed.extend_from_slice(&key.id.0);
    sealed.extend_from_slice(&nonce);
    sealed.extend_from_slice(&ciphertext);
    sealed
}

fn key_id_of(sealed: &[u8]) -> Option<KeyId> {
    let rest = sealed.strip_prefix(MAGIC)?;
    let id = rest.get(..KEY_ID_LEN)?;
    Some(KeyId(id.try_into().ok()?))
}

fn open(keys: &Keys, operation: &str, field: Field, sealed: &[u8]) -> Result<Vec<u8>, StoreError> {
    let id = key_id_of(sealed).ok_or_else(|| unreadable(operation, field, "truncated"))?;
    let key = keys
        .key(id)
        .ok_or_else(|| unreadable(operation, field, &format!("sealed under unknown key {id}")))?;
    let nonce = sealed
        .get(MAGIC.len() + KEY_ID_LEN..HEADER_LEN)
        .ok_or_else(|| unreadable(operation, field, "truncated"))?;
    let aad = associated_data(operation, field);
    let payload = Payload {
        msg: &sealed[HEADER_LEN..],
        aad: &aad,
    };
    key.cipher
        .decrypt(Nonce::from_slice(nonce), payload)
        .map_err(|_| {
            unreadable(
                operation,
                field,
                "it does not open (altered, or moved from another operation)",
            )
        })
}

fn unreadable(operation: &str, field: Field, reason: &str) -> StoreError {
    StoreError::Seal(SealError::Unreadable {
        operation: operation.to_string(),
        field: field.name(),
        reason: reason.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sealed_with(byte: u8) -> Seal {
        Seal::with_keys(StoreKey::new(&[byte; 32]), None, "K")
    }

    #[test]
    fn values_round_trip_and_bind_to_their_operation_and_field() {
        let seal = sealed_with(1);
        let stored = seal
            .body("op1", Field::ResponseBody, Some(b"marker"))
            .unwrap()
            .into_owned();
        assert!(!stored.windows(6).any(|w| w == b"marker"));
        // The overhead SECURITY.md states: marker, key id, nonce, tag.
        assert_eq!(stored.len(), b"marker".len() + 44);
        let open = |op, field, value: &[u8]| seal.open_body(op, field, Some(value.to_vec()));
        assert_eq!(
            open("op1", Field::ResponseBody, &stored).unwrap().unwrap(),
            b"marker"
        );
        assert!(open("op2", Field::ResponseBody, &stored).is_err());
        assert!(open("op1", Field::RequestBody, &stored).is_err());
        let mut flipped = stored.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert!(open("op1", Field::ResponseBody, &flipped).is_err());
        // A value written before sealing is read as it is.
        assert_eq!(
            open("op1", Field::ResponseBody, b"{}").unwrap().unwrap(),
            b"{}"
        );
        // Two seals of one value differ (fresh nonces).
        let again = seal
            .body("op1", Field::ResponseBody, Some(b"marker"))
            .unwrap();
        assert_ne!(again.as_ref(), stored.as_slice());
    }

    #[test]
    fn headers_round_trip_sealed_and_plain() {
        let headers = vec![("x-secret".to_string(), b"marker".to_vec())];
        let seal = sealed_with(1);
        let stored = seal.headers("op1", &headers);
        assert!(stored.starts_with(TEXT_PREFIX) && !stored.contains("marker"));
        assert_eq!(seal.open_headers("op1", &stored).unwrap(), headers);
        assert!(seal.open_headers("op2", &stored).is_err());
        let plain = Seal::plain().headers("op1", &headers);
        assert_eq!(seal.open_headers("op1", &plain).unwrap(), headers);
        assert!(Seal::plain().open_headers("op1", &stored).is_err());
    }

    #[test]
    fn a_previous_key_opens_and_rekey_finds_what_it_sealed() {
        let old = sealed_with(1);
        let stored = old
            .body("op", Field::RequestBody, Some(b"x"))
            .unwrap()
            .into_owned();
        let rotated = Seal::with_keys(StoreKey::new(&[2; 32]), Some(StoreKey::new(&[1; 32])), "K");
        assert_eq!(
            rotated
                .open_body("op", Field::RequestBody, Some(stored.clone()))
                .unwrap()
                .unwrap(),
            b"x"
        );
        assert!(rotated.is_stale(&stored) && rotated.is_stale(b"plain"));
        let resealed = rotated.body("op", Field::RequestBody, Some(b"x")).unwrap();
        assert!(!rotated.is_stale(&resealed));
        let headers = rotated.headers("op", &[]);
        assert!(!rotated.is_stale(headers.as_bytes()));
        assert!(rotated.is_stale(old.headers("op", &[]).as_bytes()));
        assert!(
            sealed_with(2)
                .open_body("op", Field::RequestBody, Some(stored))
                .is_err()
        );
    }

    #[test]
    fn the_canary_tells_a_wrong_or_missing_key() {
        let one = sealed_with(1);
        let canary = one.canary().unwrap();
        assert_eq!(one.check_canary(Some(&canary)).unwrap(), Canary::Fits);
        assert_eq!(one.check_canary(None).unwrap(), Canary::Missing);
        assert_eq!(Seal::plain().check_canary(None).unwrap(), Canary::Fits);
        let id = StoreKey::new(&[1; 32]).id();
        let wrong = sealed_with(2)
            .check_canary(Some(&canary))
            .unwrap_err()
            .to_string();
        assert!(wrong.contains(&id.to_string()), "{wrong}");
        assert!(
            wrong.contains(&StoreKey::new(&[2; 32]).id().to_string()),
            "{wrong}"
        );
        let none = Seal::plain()
            .check_canary(Some(&canary))
            .unwrap_err()
            .to_string();
        assert!(none.contains("no key is configured"), "{none}");
        let rotated = Seal::with_keys(StoreKey::new(&[2; 32]), Some(StoreKey::new(&[1; 32])), "K");
        assert_eq!(rotated.check_canary(Some(&canary)).unwrap(), Canary::Fits);
        assert!(!rotated.canary_is_current(&canary));
        assert!(one.canary_is_current(&canary));
    }

    #[test]
    fn keys_must_be_32_bytes_of_base64() {
        let read = |value: String| {
            StoreKey::from_env("K", "store.encryption_key_env", &move |_| {
                Some(value.clone())
            })
        };
        assert!(read(STANDARD.encode([7; 32])).is_ok());
        let short = read(STANDARD.encode([7; 16])).err().unwrap().to_string();
        assert!(short.contains("16 bytes") && short.contains("K"), "{short}");
        assert!(
            read("not base64!".into())
                .err()
                .unwrap()
                .to_string()
                .contains("not base64")
        );
        let missing = StoreKey::from_env("K", "store.encryption_key_env", &|_| None);
        assert!(missing.err().unwrap().to_string().contains("is not set"));
    }
}
