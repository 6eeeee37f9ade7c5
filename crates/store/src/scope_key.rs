//! The scope key: scopes are stored as HMAC-SHA256 under a secret kept
//! outside the database (docs/deploying.md, "Keyed scope hashes"), so a copy of the
//! store does not let anyone confirm a guessed credential offline.
//!
//! Invariants:
//! - a stored scope is `hex(HMAC-SHA256(key, "idemgate-scope-v2\0" ||
//!   digest))`, where `digest` is the SHA-256 scope of earlier versions:
//!   a store written before keying is rewritten in place, once, in one
//!   transaction (the backends' `key_scopes`; on PostgreSQL under an
//!   advisory lock, so replicas starting together do it once), and its
//!   operations keep their identities. The rewrite is a function of the
//!   stored value alone, which is what lets it run in place;
//! - the pipeline still computes the bare digest (`pipeline/key.rs`) and
//!   holds it in memory only: a derived key hashes that digest, not its
//!   HMAC, so keys derived before keying name the same operations;
//! - the store keeps a canary ([`ScopeKey::canary`]): a store keyed with
//!   another key refuses to start, instead of making every key a new
//!   operation;
//! - a key file this module creates is mode 0600 from its creation, and
//!   holds 32 bytes from the OS's generator: this module makes its own keys,
//!   so the store that uses them is above it, never beside it.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use aes_gcm::aead::OsRng;
use aes_gcm::aead::rand_core::RngCore;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use idemgate_model::hex_text;

use crate::seal::key_from_base64;

/// This module's log target (the crate docs, "Log targets").
const TARGET: &str = "idemgate::scope_key";

/// Why no scope key could be had, or why the one given does not fit.
#[derive(Debug, thiserror::Error)]
pub enum ScopeKeyError {
    #[error(
        "a postgres:// store is shared by replicas, which must hash scopes with one key: set {DEFAULT_POSTGRES_ENV} (32 bytes in base64, e.g. `head -c 32 /dev/urandom | base64`), or name another variable in store.scope_key_env or a file in store.scope_key_file; the same key on every replica"
    )]
    SharedStoreNeedsKey,
    #[error(
        "the environment variable {0} (store.scope_key_env) is not set; it must hold a 32-byte key in base64"
    )]
    MissingEnv(String),
    #[error("{source_name} does not hold a 32-byte key in base64: {reason}")]
    Malformed { source_name: String, reason: String },
    #[error("the scope key file {path}: {error}")]
    File { path: String, error: std::io::Error },
    /// The directory a key file would be created in does not exist.
    #[error(
        "the scope key file {0} cannot be created: its directory does not exist (by default the store's own: create it, or name another store path)"
    )]
    MissingDirectory(String),
    #[error(
        "the store's scopes were hashed with another scope key than {source_name}: give the key this store was used with (operations would otherwise all be new, and sent again)"
    )]
    Wrong { source_name: String },
}

/// The key scopes are hashed with, and where it came from (for messages).
#[derive(Clone)]
pub struct ScopeKey {
    mac: Hmac<Sha256>,
    /// Tells this key (and its clones) from every other in the process,
    /// for [`RECENT`].
    id: u64,
    source_name: String,
}

/// Where the next [`ScopeKey`]'s id comes from.
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// How many keyed scopes each thread keeps in [`RECENT`].
const RECENT_SCOPES: usize = 8;

thread_local! {
    /// The scopes this thread keyed last, the newest first, as (key id,
    /// digest, keyed). Clients send the same credential request after
    /// request, and keying it again took three SHA-256 blocks and two hex
    /// conversions of every request (about 2 % of a replay's CPU). Only
    /// digests and MACs are kept, never a credential, in memory only.
    static RECENT: RefCell<VecDeque<(u64, String, String)>> =
        RefCell::new(VecDeque::with_capacity(RECENT_SCOPES));
}

impl std::fmt::Debug for ScopeKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ScopeKey({})", self.source_name)
    }
}

impl ScopeKey {
    pub fn new(key: &[u8; 32], source_name: &str) -> Self {
        ScopeKey {
            mac: Hmac::new_from_slice(key).unwrap_or_else(|_| unreachable!("HMAC takes any key")),
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            source_name: source_name.to_string(),
        }
    }

    /// The key `source` names (the gateway's `[store]` decides which,
    /// docs/deploying.md, "Keyed scope hashes"), read through `lookup`
    /// (the environment).
    pub fn load(
        source: ScopeKeySource<'_>,
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, ScopeKeyError> {
        match source {
            ScopeKeySource::Env(env) => {
                let text = lookup(env).ok_or_else(|| ScopeKeyError::MissingEnv(env.into()))?;
                let source_name = format!("the variable {env} (store.scope_key_env)");
                Ok(Self::new(&decode(&text, &source_name)?, &source_name))
            }
            ScopeKeySource::File { path, create } => read_file(path, create),
            ScopeKeySource::SharedDefault => {
                let text =
                    lookup(DEFAULT_POSTGRES_ENV).ok_or(ScopeKeyError::SharedStoreNeedsKey)?;
                let source_name = format!("the variable {DEFAULT_POSTGRES_ENV}");
                Ok(Self::new(&decode(&text, &source_name)?, &source_name))
            }
        }
    }

    /// The scope as stored: `digest` (the SHA-256 scope) keyed; from
    /// `RECENT` when this thread keyed it lately.
    pub fn keyed(&self, digest: &str) -> String {
        RECENT.with(|recent| {
            let Ok(mut recent) = recent.try_borrow_mut() else {
                return self.mac_of(digest);
            };
            let found = recent
                .iter()
                .position(|(id, seen, _)| *id == self.id && seen == digest);
            let entry = match found.and_then(|at| recent.remove(at)) {
                Some(entry) => entry,
                None => {
                    recent.truncate(RECENT_SCOPES - 1);
                    (self.id, digest.to_string(), self.mac_of(digest))
                }
            };
            let keyed = entry.2.clone();
            recent.push_front(entry);
            keyed
        })
    }

    fn mac_of(&self, digest: &str) -> String {
        let mut mac = self.mac.clone();
        mac.update(b"idemgate-scope-v2\0");
        mac.update(digest.as_bytes());
        hex_text::of(&mac.finalize().into_bytes())
    }

    /// An operation's identity (route, keyed scope, key) as traces show it:
    /// keyed like scopes but under a label of its own, so a trace can be
    /// matched to its retries without telling their key.
    pub fn trace_label(&self, identity: &str) -> String {
        let mut mac = self.mac.clone();
        mac.update(b"idemgate-trace-key-v1\0");
        mac.update(identity.as_bytes());
        hex_text::of(&mac.finalize().into_bytes()[..16])
    }

    /// What the store keeps to recognise this key: a MAC of a constant,
    /// which tells nothing about the key.
    pub fn canary(&self) -> String {
        let mut mac = self.mac.clone();
        mac.update(b"idemgate-scope-canary-v1");
        hex_text::of(&mac.finalize().into_bytes())
    }

    /// The error for a store whose canary is not this key's.
    pub fn wrong(&self) -> ScopeKeyError {
        ScopeKeyError::Wrong {
            source_name: self.source_name.clone(),
        }
    }
}

/// Where a scope key is read from.
#[derive(Debug, Clone, Copy)]
pub enum ScopeKeySource<'a> {
    /// The variable `store.scope_key_env` names.
    Env(&'a str),
    /// A file; `create`: written with a new random key, mode 0600, when
    /// missing (a key only this store's one process uses).
    File { path: &'a Path, create: bool },
    /// A shared store's key when the config names none: the variable
    /// `IDEMGATE_SCOPE_KEY`, never a file one replica would make alone.
    SharedDefault,
}

/// Where a PostgreSQL store's scope key is read when the config names none.
pub const DEFAULT_POSTGRES_ENV: &str = "IDEMGATE_SCOPE_KEY";

/// The meta row the scope key's canary is kept in.
pub const CANARY_ROW: &str = "scope-canary";

/// `<store file>.scope-key`, beside the database.
pub fn default_file(db: &Path) -> PathBuf {
    let mut path = PathBuf::from(db);
    path.as_mut_os_string().push(".scope-key");
    path
}

fn decode(text: &str, source_name: &str) -> Result<[u8; 32], ScopeKeyError> {
    key_from_base64(text).map_err(|reason| ScopeKeyError::Malformed {
        source_name: source_name.to_string(),
        reason,
    })
}

/// The key in the file at `path`; a new one, written with mode 0600,
/// when the file does not exist and `create` allows it.
fn read_file(path: &Path, create: bool) -> Result<ScopeKey, ScopeKeyError> {
    let file_error = |error| ScopeKeyError::File {
        path: path.display().to_string(),
        error,
    };
    if create
        && let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty())
        && matches!(dir.try_exists(), Ok(false))
    {
        return Err(ScopeKeyError::MissingDirectory(path.display().to_string()));
    }
    let created = create && create_file(path).map_err(file_error)?;
    if created {
        tracing::info!(target: TARGET,
            path = %path.display(),
            "wrote a new scope key: back it up with the store (docs/deploying.md, \"Keyed scope hashes\")"
        );
    }
    let text = std::fs::read_to_string(path).map_err(file_error)?;
    let mode = std::fs::metadata(path)
        .map_err(file_error)?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        tracing::warn!(target: TARGET,
            path = %path.display(),
            mode = format!("{:o}", mode & 0o777),
            "the scope key file can be read by other users; chmod 600 it"
        );
    }
    let source_name = format!(
        "the file {}{}",
        path.display(),
        if created { " (created just now)" } else { "" }
    );
    Ok(ScopeKey::new(&decode(&text, &source_name)?, &source_name))
}

/// Writes a new random key to `path` unless it exists; whether it did.
fn create_file(path: &Path) -> std::io::Result<bool> {
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path);
    let mut file = match file {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => return Ok(false),
        Err(error) => return Err(error),
    };
    let mut key = [0; 32];
    OsRng.fill_bytes(&mut key);
    file.write_all(format!("{}\n", STANDARD.encode(key)).as_bytes())?;
    file.sync_all()?;
    tracing::info!(target: TARGET, path = %path.display(), "created a new scope key file");
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyed_scopes_depend_on_the_key_and_hide_the_digest() {
        let (a, b) = (ScopeKey::new(&[1; 32], "a"), ScopeKey::new(&[2; 32], "b"));
        let digest = "ab".repeat(32);
        assert_eq!(a.keyed(&digest), a.keyed(&digest));
        assert_ne!(a.keyed(&digest), b.keyed(&digest));
        assert_ne!(a.keyed(&digest), digest);
        assert_eq!(a.keyed(&digest).len(), 64);
        assert_ne!(a.canary(), b.canary());
    }

    #[test]
    fn a_recent_scope_is_keyed_as_it_was_and_by_its_own_key_only() {
        let (a, b) = (ScopeKey::new(&[1; 32], "a"), ScopeKey::new(&[2; 32], "b"));
        let digests: Vec<String> = (0..2 * RECENT_SCOPES)
            .map(|i| format!("{i:064x}"))
            .collect();
        let first: Vec<String> = digests.iter().map(|d| a.keyed(d)).collect();
        // Kept, pushed out and keyed again, under another key in between:
        // each the MAC it always was, never another key's.
        for _ in 0..2 {
            for (digest, keyed) in digests.iter().zip(&first) {
                assert_eq!(&a.keyed(digest), keyed);
                assert_eq!(a.keyed(digest), a.mac_of(digest));
                assert_eq!(b.keyed(digest), b.mac_of(digest));
                assert_ne!(b.keyed(digest), *keyed);
                assert_eq!(a.clone().keyed(digest), *keyed);
            }
        }
        RECENT.with(|recent| assert!(recent.borrow().len() <= RECENT_SCOPES));
    }

    #[test]
    fn a_traces_label_is_keyed_apart_from_the_stored_scope() {
        let (a, b) = (ScopeKey::new(&[1; 32], "a"), ScopeKey::new(&[2; 32], "b"));
        let identity = "api\0scope\0key-1";
        assert_eq!(a.trace_label(identity), a.trace_label(identity));
        assert_ne!(a.trace_label(identity), b.trace_label(identity));
        assert_ne!(a.trace_label(identity), a.trace_label("api\0scope\0key-2"));
        // Not the stored scope's MAC cut short: another label goes in first.
        assert!(!a.keyed(identity).starts_with(&a.trace_label(identity)));
        assert_eq!(a.trace_label(identity).len(), 32);
    }

    /// A store path in a directory that does not exist says so, not that
    /// the key file is missing.
    #[test]
    fn a_missing_store_directory_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nowhere/s.db.scope-key");
        let Err(error) = read_file(&path, true) else {
            panic!("a key file created in a missing directory");
        };
        let error = error.to_string();
        assert!(
            error.contains("nowhere/s.db.scope-key") && error.contains("does not exist"),
            "{error}"
        );
    }

    #[test]
    fn a_key_file_is_created_once_with_mode_0600() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db.scope-key");
        let first = read_file(&path, true).unwrap();
        assert!(first.source_name.contains("created just now"));
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let again = read_file(&path, true).unwrap();
        assert_eq!(first.canary(), again.canary());
        assert!(!again.source_name.contains("created"));
        assert!(read_file(&dir.path().join("missing"), false).is_err());
        std::fs::write(&path, "short").unwrap();
        let short = read_file(&path, true).unwrap_err().to_string();
        assert!(short.contains("32-byte"), "{short}");
    }
}
