//! The sealed store: what operations keep of payloads — response headers
//! and bodies, and request bodies where a route stores them — sealed with
//! AES-256-GCM under a key kept outside the database (docs/deploying.md,
//! "Sealed store"). Both backends call this module on the way in and out,
//! sealing every payload they write and opening every one they read where
//! they make an operation from its row (`operation_from_row`), so the SQL
//! never sees a key and no path can skip it.
//!
//! Invariants:
//! - with a key, every payload written is sealed: `MAGIC`, the key's id,
//!   a fresh random 96-bit nonce, then the ciphertext and its tag. The
//!   associated data names the field, the operation's id and its
//!   [`Identity`] (route, scope, key, fingerprint: what a replay finds and
//!   checks it by), and for a response's headers and body the status (and
//!   for the headers whether a body is stored), so a sealed value copied
//!   to another operation or field, a row given another identity, or a
//!   status changed in clear, does not open;
//! - a value that does not open is an error ([`SealError::Unreadable`]),
//!   never handed out as bytes: a tampered or foreign value is reported,
//!   not replayed. It fails its row alone: the request gets 500
//!   `store-unreadable` (`ProxyError::store` tells it from a store that is
//!   down, 503), and on PostgreSQL, whose claim batches answer per call,
//!   one altered row fails its own claim, not the batch;
//! - legacy values — written before a key was configured (they do not
//!   start with a seal marker), or sealed in format version 1 (whose
//!   associated data bound only the operation id and the field) — stay
//!   readable until `idemgate rekey` seals them again; a store created
//!   sealed, or whose rekey finished, is *sealed-only*
//!   ([`SEALED_ONLY_ROW`], [`Seal::sealed_only`]) and refuses them, so
//!   someone who can write the database cannot plant a value in clear;
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

use crate::StoreError;
use crate::backend::{decode_headers, encode_headers};
use idemgate_model::operation::StoredResponse;

/// The first bytes of every value sealed now (format version 2). A NUL
/// first, so no JSON or text body written before sealing looks like one.
const MAGIC: &[u8; 8] = b"\0igseal2";

/// The marker of format version 1, opened (not written) until a rekey.
const MAGIC_V1: &[u8; 8] = b"\0igseal1";

/// Sealed response headers are text (the column holds JSON when plain):
/// this prefix, then the sealed value in base64. JSON never starts so.
const TEXT_PREFIX: &str = "igseal2:";
const TEXT_PREFIX_V1: &str = "igseal1:";

const KEY_ID_LEN: usize = 8;
const NONCE_LEN: usize = 12;
const HEADER_LEN: usize = MAGIC.len() + KEY_ID_LEN + NONCE_LEN;
const _: () = assert!(MAGIC.len() == MAGIC_V1.len());

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

/// What a replay finds an operation by and checks a request against —
/// route, scope, key, fingerprint — as a digest: part of the associated
/// data of the operation's sealed values, so a sealed row given another
/// row's identity does not open. None of them changes once the operation
/// is stored (scopes are keyed, once, before a sealed store is written).
/// A [`Claim`](crate::Claim) carries it, so a record seals its
/// response without reading the row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity([u8; 32]);

impl Identity {
    pub fn of(route: &str, scope: &str, key: &str, fingerprint: &str) -> Self {
        let mut digest = Sha256::new().chain_update(b"idemgate-seal-identity-v2");
        // Length-prefixed: no two tuples digest alike.
        for part in [route, scope, key, fingerprint] {
            digest = digest
                .chain_update((part.len() as u64).to_be_bytes())
                .chain_update(part);
        }
        Identity(digest.finalize().into())
    }
}

/// Where a value is stored: its operation and field, and for a response's
/// headers and body what else the response says — all bound into the
/// associated data.
struct Slot<'a> {
    operation: &'a str,
    identity: &'a Identity,
    field: Field,
    /// The response's status, and whether its body is stored.
    response: Option<(u16, bool)>,
}

impl<'a> Slot<'a> {
    fn request_body(operation: &'a str, identity: &'a Identity) -> Self {
        Slot {
            operation,
            identity,
            field: Field::RequestBody,
            response: None,
        }
    }

    /// The associated data of format `version`.
    fn associated_data(&self, version: Version) -> Vec<u8> {
        let mut aad = Vec::with_capacity(96);
        match version {
            Version::V1 => aad.extend_from_slice(b"idemgate-seal-v1\0"),
            Version::V2 => aad.extend_from_slice(b"idemgate-seal-v2\0"),
        }
        aad.extend_from_slice(self.field.name().as_bytes());
        aad.push(0);
        aad.extend_from_slice(self.operation.as_bytes());
        if version == Version::V2 {
            aad.push(0);
            aad.extend_from_slice(&self.identity.0);
            if let Some((status, body_stored)) = self.response {
                aad.extend_from_slice(&status.to_be_bytes());
                // The headers say whether a body goes with them: a body
                // set to NULL makes them not open.
                if self.field == Field::ResponseHeaders {
                    aad.push(u8::from(body_stored));
                }
            }
        }
        aad
    }

    fn unreadable(&self, reason: &str) -> StoreError {
        unreadable(self.operation, self.field, reason)
    }
}

/// A seal format: what its marker is and what its associated data binds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Version {
    /// The operation id and the field only: opened until a rekey.
    V1,
    /// Also the identity and the response's status.
    V2,
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

/// A 32-byte key written in standard base64, surrounding whitespace
/// ignored; what is wrong with it otherwise, saying nothing of the text
/// (the decoder's own error names a character of the secret and where).
pub(crate) fn key_from_base64(text: &str) -> Result<[u8; 32], String> {
    let text = text.trim();
    let bytes = STANDARD.decode(text).map_err(|_| {
        if text.contains(['-', '_']) {
            "not standard base64 (it has `-` or `_`: write `+` and `/`)".to_string()
        } else {
            "not base64".to_string()
        }
    })?;
    bytes
        .try_into()
        .map_err(|b: Vec<u8>| format!("{} bytes, not 32", b.len()))
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
        Ok(Self::new(&key_from_base64(&text).map_err(malformed)?))
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
    /// Set at open when the store is sealed-only ([`SEALED_ONLY_ROW`]):
    /// legacy values (plain or version 1) are refused, not read.
    sealed_only: bool,
}

/// The payload columns of one stored operation, as stored, and the status
/// its response values are bound to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Payloads {
    pub response_status: Option<u16>,
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

/// The meta row that makes a store sealed-only: written when a store is
/// first sealed holding no operation, and when a rekey finishes. Its
/// value names the one format the store holds.
pub const SEALED_ONLY_ROW: &str = "sealed-only";
pub const SEALED_ONLY_VALUE: &str = "igseal2";

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
            sealed_only: false,
        }
    }

    /// The keys the variables `store.encryption_key_env` (`current`) and
    /// `store.previous_key_env` (`previous`) hold, read through `lookup`
    /// (the environment): none without `current`.
    pub fn from_env(
        current: Option<&str>,
        previous: Option<&str>,
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, SealError> {
        let Some(env) = current else {
            return Ok(Seal::plain());
        };
        let current = StoreKey::from_env(env, "store.encryption_key_env", lookup)?;
        let previous = match previous {
            Some(previous) => Some(StoreKey::from_env(
                previous,
                "store.previous_key_env",
                lookup,
            )?),
            None => None,
        };
        Ok(Seal::with_keys(current, previous, env))
    }

    /// This seal for a store whose meta row [`SEALED_ONLY_ROW`] is
    /// `stored`: sealed-only when it is there and keys are set (a sealed
    /// store without a key does not open).
    pub fn sealed_only(self, stored: Option<&str>) -> Self {
        Seal {
            sealed_only: stored.is_some() && self.keys.is_some(),
            ..self
        }
    }

    /// Whether payloads are sealed (a key is configured).
    pub fn is_sealing(&self) -> bool {
        self.keys.is_some()
    }

    /// The request body of `operation` as it is to be stored.
    pub fn request_body<'a>(
        &self,
        operation: &str,
        identity: &Identity,
        value: Option<&'a [u8]>,
    ) -> Option<Cow<'a, [u8]>> {
        self.body(&Slot::request_body(operation, identity), value)
    }

    fn body<'a>(&self, slot: &Slot, value: Option<&'a [u8]>) -> Option<Cow<'a, [u8]>> {
        let value = value?;
        Some(match &self.keys {
            Some(keys) => Cow::Owned(seal(&keys.current, slot, value)),
            None => Cow::Borrowed(value),
        })
    }

    fn headers(&self, slot: &Slot, headers: &[(String, Vec<u8>)]) -> String {
        let json = encode_headers(headers);
        match &self.keys {
            Some(keys) => {
                let sealed = seal(&keys.current, slot, json.as_bytes());
                format!("{TEXT_PREFIX}{}", STANDARD.encode(sealed))
            }
            None => json,
        }
    }

    /// `response` of `operation` as the store writes it.
    pub fn stored_form(
        &self,
        operation: &str,
        identity: &Identity,
        response: &StoredResponse,
    ) -> StoredForm {
        let body = response.body.as_deref();
        let [headers, body_slot] = response_slots(operation, identity, response.status, body);
        StoredForm {
            headers: self.headers(&headers, &response.headers),
            body: self.body(&body_slot, body).map(Cow::into_owned),
        }
    }

    /// The stored request body of `operation` as it was written.
    pub fn open_request_body(
        &self,
        operation: &str,
        identity: &Identity,
        stored: Option<Vec<u8>>,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        self.open_body(&Slot::request_body(operation, identity), stored)
    }

    /// The stored response of `operation` — its status, headers (`None`:
    /// a NULL column) and body — as it was written.
    pub fn open_response(
        &self,
        operation: &str,
        identity: &Identity,
        status: u16,
        headers: Option<&str>,
        body: Option<Vec<u8>>,
    ) -> Result<StoredResponse, StoreError> {
        let [headers_slot, body_slot] =
            response_slots(operation, identity, status, body.as_deref());
        Ok(StoredResponse {
            status,
            headers: self.open_headers(&headers_slot, headers.unwrap_or("[]"))?,
            body: self.open_body(&body_slot, body)?,
        })
    }

    fn open_body(
        &self,
        slot: &Slot,
        stored: Option<Vec<u8>>,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let Some(value) = stored else {
            return Ok(None);
        };
        match &self.keys {
            Some(keys) if version_of(&value).is_some() => Ok(Some(self.open(keys, slot, &value)?)),
            _ => self.legacy(slot).map(|()| Some(value)),
        }
    }

    fn open_headers(
        &self,
        slot: &Slot,
        stored: &str,
    ) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let Some(text) = strip_text_prefix(stored) else {
            self.legacy(slot)?;
            return decode_headers(stored);
        };
        let keys = self
            .keys
            .as_ref()
            .ok_or_else(|| slot.unreadable("no key"))?;
        let sealed = STANDARD
            .decode(text)
            .map_err(|_| slot.unreadable("not base64"))?;
        let json = self.open(keys, slot, &sealed)?;
        let json = String::from_utf8(json).map_err(|_| slot.unreadable("not text"))?;
        decode_headers(&json)
    }

    /// A value in clear is read as it is, unless the store is sealed-only.
    fn legacy(&self, slot: &Slot) -> Result<(), StoreError> {
        if self.sealed_only {
            return Err(slot.unreadable(
                "it is not sealed, and this store holds sealed values only (planted in clear?)",
            ));
        }
        Ok(())
    }

    fn open(&self, keys: &Keys, slot: &Slot, sealed: &[u8]) -> Result<Vec<u8>, StoreError> {
        if self.sealed_only && version_of(sealed) == Some(Version::V1) {
            return Err(slot.unreadable(
                "it is sealed in format version 1, and this store holds version 2 only",
            ));
        }
        open(keys, slot, sealed)
    }

    /// Whether a stored value must be sealed again under the current key
    /// (`idemgate rekey`): it is plain, in format version 1, or sealed
    /// under another key.
    pub(crate) fn is_stale(&self, stored: &[u8]) -> bool {
        let Some(keys) = &self.keys else {
            return false;
        };
        let text = std::str::from_utf8(stored).ok().and_then(strip_text_prefix);
        let stored = match text {
            Some(text) => match STANDARD.decode(text) {
                Ok(bytes) => Cow::Owned(bytes),
                Err(_) => return true,
            },
            None => Cow::Borrowed(stored),
        };
        !(version_of(&stored) == Some(Version::V2) && key_id_of(&stored) == Some(keys.current.id))
    }

    /// `stored` (of `operation`) sealed again under the current key, in
    /// the current format, or `None` when every value in it already is
    /// (`idemgate rekey`).
    pub fn reseal(
        &self,
        operation: &str,
        identity: &Identity,
        stored: &Payloads,
    ) -> Result<Option<Payloads>, StoreError> {
        let stale = |value: Option<&[u8]>| value.is_some_and(|v| self.is_stale(v));
        if !(stale(stored.request_body.as_deref())
            || stale(stored.response_headers.as_deref().map(str::as_bytes))
            || stale(stored.response_body.as_deref()))
        {
            return Ok(None);
        }
        let request_body =
            self.open_request_body(operation, identity, stored.request_body.clone())?;
        let response = match stored.response_status {
            Some(status) => Some(self.open_response(
                operation,
                identity,
                status,
                stored.response_headers.as_deref(),
                stored.response_body.clone(),
            )?),
            None => None,
        };
        let form = response
            .as_ref()
            .map(|response| self.stored_form(operation, identity, response));
        Ok(Some(Payloads {
            response_status: stored.response_status,
            request_body: self
                .request_body(operation, identity, request_body.as_deref())
                .map(Cow::into_owned),
            response_headers: form.as_ref().map(|form| form.headers.clone()),
            response_body: form.and_then(|form| form.body),
        }))
    }

    /// The canary to store: `CANARY_PLAIN` sealed under the current key.
    pub fn canary(&self) -> Option<String> {
        let keys = self.keys.as_ref()?;
        let sealed = seal(&keys.current, &canary_slot(), CANARY_PLAIN);
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
        // A version 1 canary (a store sealed before version 2) still
        // tells the key: it names no operation.
        match open(keys, &canary_slot(), &sealed) {
            Ok(plain) if plain == CANARY_PLAIN => Ok(Canary::Fits),
            _ => Err(SealError::CanaryAltered(stored_id)),
        }
    }
}

impl Keys {
    fn key(&self, id: KeyId) -> Option<&StoreKey> {
        std::iter::once(&self.current)
            .chain(&self.previous)
            .find(|key| key.id == id)
    }
}

/// The slots of a response's headers and body.
fn response_slots<'a>(
    operation: &'a str,
    identity: &'a Identity,
    status: u16,
    body: Option<&[u8]>,
) -> [Slot<'a>; 2] {
    let response = Some((status, body.is_some()));
    [Field::ResponseHeaders, Field::ResponseBody].map(|field| Slot {
        operation,
        identity,
        field,
        response,
    })
}

/// The canary's slot: an operation id no operation has (ids are UUIDs).
fn canary_slot() -> Slot<'static> {
    static NOBODY: Identity = Identity([0; 32]);
    Slot {
        operation: CANARY_ID,
        identity: &NOBODY,
        field: Field::ResponseBody,
        response: None,
    }
}

fn strip_text_prefix(stored: &str) -> Option<&str> {
    stored
        .strip_prefix(TEXT_PREFIX)
        .or_else(|| stored.strip_prefix(TEXT_PREFIX_V1))
}

fn version_of(sealed: &[u8]) -> Option<Version> {
    if sealed.starts_with(MAGIC) {
        Some(Version::V2)
    } else if sealed.starts_with(MAGIC_V1) {
        Some(Version::V1)
    } else {
        None
    }
}

fn seal(key: &StoreKey, slot: &Slot, plain: &[u8]) -> Vec<u8> {
    let nonce = Aes256Gcm::generate_nonce(&mut OsRng);
    let aad = slot.associated_data(Version::V2);
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
    version_of(sealed)?;
    let id = sealed.get(MAGIC.len()..MAGIC.len() + KEY_ID_LEN)?;
    Some(KeyId(id.try_into().ok()?))
}

fn open(keys: &Keys, slot: &Slot, sealed: &[u8]) -> Result<Vec<u8>, StoreError> {
    let version = version_of(sealed).ok_or_else(|| slot.unreadable("not sealed"))?;
    let id = key_id_of(sealed).ok_or_else(|| slot.unreadable("truncated"))?;
    let key = keys
        .key(id)
        .ok_or_else(|| slot.unreadable(&format!("sealed under unknown key {id}")))?;
    let nonce = sealed
        .get(MAGIC.len() + KEY_ID_LEN..HEADER_LEN)
        .ok_or_else(|| slot.unreadable("truncated"))?;
    let aad = slot.associated_data(version);
    let payload = Payload {
        msg: &sealed[HEADER_LEN..],
        aad: &aad,
    };
    key.cipher
        .decrypt(Nonce::from_slice(nonce), payload)
        .map_err(|_| {
            slot.unreadable(
                "it does not open (altered, moved from another operation or field, or its status or identity changed)",
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
mod tests;
