//! The `key` phase: which `Idempotency-Key` a write carries (honoured from the
//! header or assigned per the route's key mode), and the scope it lives in.
//!
//! Invariants: a key is 1–255 characters 0x21–0x7E after unquoting (the IETF
//! draft's sf-string, or a bare token as most SDKs send it), and never starts
//! with `"`, so its bare form (what is forwarded upstream, what operators
//! see) reads back as the same key; credentials only ever leave this module
//! as a [`Scope`]: a SHA-256 digest, stored only keyed with the scope key
//! (HMAC-SHA256, [`ScopeKey`]), never in clear.

use std::borrow::Cow;

use http::HeaderMap;
use http::header::{AUTHORIZATION, HeaderName};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use sha2::{Digest, Sha256};

use crate::pipeline::fingerprint::digest_hex;
use crate::pipeline::signer::signer;
use crate::profile::{KeySyntax, Profile, Wire};
use crate::request_path;
use idemgate_model::canonical_json::{self, NotExact};
use idemgate_model::operation::Fingerprint;
use idemgate_store::scope_key::ScopeKey;

/// URL-component encoding: everything but the RFC 3986 unreserved
/// characters, so a key (or any text) is one path segment or query value —
/// and `.` too, so that the keys `.` and `..` are never the dot-segments an
/// upstream would resolve to the parent resource (`/tasks/..`).
const URL_COMPONENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'~');

/// `text` URL-component encoded (`a/b c` → `a%2Fb%20c`, `..` → `%2E%2E`).
pub fn url_component(text: &str) -> String {
    utf8_percent_encode(text, URL_COMPONENT).to_string()
}

/// The `Idempotency-Key` header.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// The longest key, in characters (bytes: a key is ASCII).
pub const MAX_KEY_CHARS: usize = 255;

/// What every key the gateway derives starts with.
const DERIVED: &str = "derived-";

/// A validated idempotency key, held bare (unquoted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyKey(String);

/// Why a key header was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyError {
    Several,
    Empty,
    TooLong,
    /// An MCP tool call's key, too long to be stored beside its tool's
    /// name (`<tool>/<key>`, 255 characters in all): `room` is what the
    /// name leaves.
    TooLongBesideTool {
        room: usize,
    },
    BadCharacter,
    BadQuoting,
    LeadingQuote,
    NotString,
    /// A key sent in a JSON value (an MCP call's `_meta`) that is neither
    /// a string nor an integer: no text the gateway could read as the key.
    NotTextNorInteger {
        at: &'static str,
    },
    Disagree {
        headers: String,
    },
    /// A header the profile reads beside the key (OASIS
    /// `Repeatability-Client-ID`, `Repeatability-First-Sent`) came more
    /// than once.
    SeveralOf {
        header: &'static str,
    },
    FirstSentMissing {
        header: &'static str,
    },
    FirstSentInvalid {
        header: &'static str,
    },
    /// The first-sent time is further ahead of the gateway's clock than
    /// the route's `first_sent_skew` allows.
    FirstSentAhead {
        header: &'static str,
        skew: std::time::Duration,
    },
}

impl KeyError {
    /// What is wrong, naming the key header as `key` (the header the
    /// route's profile reads: `Idempotency-Key`, `Repeatability-Request-ID`).
    pub fn describe(&self, key: &str) -> String {
        use KeyError::*;
        match self {
            Several => format!("several {key} headers were sent; send one"),
            Empty => format!("the {key} is empty"),
            TooLong => format!("the {key} is longer than {MAX_KEY_CHARS} characters"),
            TooLongBesideTool { room } => format!(
                "the {key} is longer than the {room} characters its tool's name leaves: a call is kept as `<tool>/<key>`, {MAX_KEY_CHARS} characters in all"
            ),
            BadCharacter => {
                format!("the {key} has a character outside 0x21-0x7E (space, control or non-ASCII)")
            }
            BadQuoting => format!("the quoted {key} is not a valid sf-string"),
            LeadingQuote => format!(
                "the {key} starts with a quote (once unquoted, if it was sent quoted): it would read as the quoted spelling (sf-string) of another key"
            ),
            NotString => {
                format!("the {key} must be an sf-string (\"…\"), as the IETF draft's §2.1 says")
            }
            NotTextNorInteger { at } => {
                format!("the {key} in {at} must be a string or an integer")
            }
            Disagree { headers } => {
                format!("the request's key headers ({headers}) name different keys; send one")
            }
            SeveralOf { header } => format!("several {header} headers were sent; send one"),
            FirstSentMissing { header } => {
                format!("a repeatable request needs {header} (an HTTP-date) beside its {key}")
            }
            FirstSentInvalid { header } => {
                format!("{header} is not an HTTP-date (e.g. `Tue, 01 Dec 2026 12:00:00 GMT`)")
            }
            FirstSentAhead { header, skew } => format!(
                "{header} is more than {} ahead of the gateway's clock: a request cannot have been sent in the future, and a time kept ahead would outlive the window in which its {key} is tracked; send the time it was first sent",
                humantime::format_duration(*skew)
            ),
        }
    }
}

impl std::fmt::Display for KeyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe(Profile::Idemgate.wire().key_name))
    }
}

impl std::error::Error for KeyError {}

impl IdempotencyKey {
    /// A new key for `assign` mode: a UUIDv7, time-ordered for operators.
    pub fn assign() -> Self {
        IdempotencyKey(uuid::Uuid::now_v7().to_string())
    }

    /// Derive mode with `derive_from`: the key is the business action's
    /// identity — the scope and the values the pointers name in a JSON body —
    /// so the same action is one operation whatever else changes. `None` when
    /// the body is not JSON or lacks one of them (or it is `null`), or when an
    /// object on a pointer's way names the wanted member twice (the upstream
    /// may read the other one).
    ///
    /// A value is hashed in its canonical form when that is exact (so `7` and
    /// `7.0` are one action), else as sent (a 20-digit id: two ids one double
    /// apart stay two actions), behind a NUL byte that no canonical text
    /// starts with.
    pub fn derive_from_body(scope: &Scope, pointers: &[String], body: &[u8]) -> Option<Self> {
        if canonical_json::check_exact(body) == Err(NotExact::Syntax) {
            return None;
        }
        let mut hasher = Sha256::new();
        hasher.update(b"idemgate-derive-v1:fields");
        hasher.update(scope.digest.as_bytes());
        for pointer in pointers {
            let raw = canonical_json::raw_at(body, pointer)?;
            let field = match canonical_json::parse_exact(raw) {
                Ok(serde_json::Value::Null) => return None,
                Ok(value) => canonical_json::canonicalize(&value),
                Err(_) => [b"\0".as_slice(), raw].concat(),
            };
            for part in [pointer.as_bytes(), &field] {
                hasher.update((part.len() as u64).to_be_bytes());
                hasher.update(part);
            }
        }
        Some(Self::derived(hasher))
    }

    /// Derive mode without `derive_from`: the scope and the whole request's
    /// fingerprint, so identical requests are one operation.
    pub(crate) fn derive_from_fingerprint(scope: &Scope, fingerprint: &Fingerprint) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(b"idemgate-derive-v1:fingerprint");
        hasher.update(scope.digest.as_bytes());
        hasher.update(fingerprint.as_str().as_bytes());
        Self::derived(hasher)
    }

    fn derived(hasher: Sha256) -> Self {
        IdempotencyKey(format!("{DERIVED}{}", digest_hex(hasher)))
    }

    /// Whether `stored`, an operation's key as a route of `profile` keeps
    /// it (under `mcp`, `<tool>/<key>`), is one the gateway derived for a
    /// request that sent none. A client may send a key spelled so too: this
    /// words an answer, it decides nothing.
    pub(crate) fn names_a_derived_key(stored: &str, profile: Profile) -> bool {
        let own = match profile {
            Profile::Mcp => stored.split_once('/').map_or(stored, |(_, key)| key),
            _ => stored,
        };
        own.starts_with(DERIVED)
    }

    /// Validates an unquoted key. One that starts with `"` (sent as the
    /// sf-string `"\"abc"`) is refused: forwarded bare, `"abc"` would be read
    /// upstream as the sf-string of another key, `abc`.
    pub fn new(bare: &str) -> Result<Self, KeyError> {
        match bare.len() {
            0 => Err(KeyError::Empty),
            n if n > MAX_KEY_CHARS => Err(KeyError::TooLong),
            _ if !bare.bytes().all(|b| (0x21..=0x7e).contains(&b)) => Err(KeyError::BadCharacter),
            _ if bare.starts_with('"') => Err(KeyError::LeadingQuote),
            _ => Ok(IdempotencyKey(bare.to_string())),
        }
    }

    /// The key a request carries: `None` when it has no `Idempotency-Key`.
    pub fn from_headers(headers: &HeaderMap) -> Result<Option<Self>, KeyError> {
        Self::from_wire(headers, Profile::Idemgate.wire())
    }

    /// The key a request carries under a route's profile: read from the
    /// profile's key headers in order, spelled as it says; when several
    /// are present they must name one key. `None` when it has none.
    pub(crate) fn from_wire(headers: &HeaderMap, wire: &Wire) -> Result<Option<Self>, KeyError> {
        let mut found: Option<Self> = None;
        for name in wire.key_headers {
            let mut values = headers.get_all(*name).iter();
            let Some(value) = values.next() else {
                continue;
            };
            if values.next().is_some() {
                return Err(KeyError::Several);
            }
            let text = value.to_str().map_err(|_| KeyError::BadCharacter)?;
            let key = match wire.key_syntax {
                KeySyntax::TokenOrString => Self::parse(text)?,
                KeySyntax::String if text.starts_with('"') => Self::parse(text)?,
                KeySyntax::String => return Err(KeyError::NotString),
                KeySyntax::Opaque => Self::new(text)?,
            };
            match &found {
                Some(earlier) if *earlier != key => {
                    return Err(KeyError::Disagree {
                        headers: wire.key_headers.join(", "),
                    });
                }
                _ => found = Some(key),
            }
        }
        Ok(found)
    }

    /// A key as the header spells it — an sf-string `"…"` or a bare token —
    /// wherever it is written (the header, a status lookup's path), so both
    /// forms always name one key.
    pub fn parse(text: &str) -> Result<Self, KeyError> {
        match text.strip_prefix('"') {
            Some(quoted) => Self::new(&unquote(quoted)?),
            None => Self::new(text),
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The inside of an RFC 8941 sf-string whose opening quote is already gone.
fn unquote(quoted: &str) -> Result<String, KeyError> {
    let mut out = String::with_capacity(quoted.len());
    let mut chars = quoted.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(escaped @ ('"' | '\\')) => out.push(escaped),
                _ => return Err(KeyError::BadQuoting),
            },
            '"' if chars.as_str().is_empty() => return Ok(out),
            '"' => return Err(KeyError::BadQuoting),
            c => out.push(c),
        }
    }
    Err(KeyError::BadQuoting)
}

/// A header value that is empty or only spaces and tabs.
fn is_blank(value: &http::HeaderValue) -> bool {
    value.as_bytes().iter().all(|b| matches!(b, b' ' | b'\t'))
}

/// A SHA-256 over a route's scope header values: two clients with different
/// credentials never share keys or see each other's stored responses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    /// The SHA-256 digest, in memory only. Derived keys hash it as they
    /// always did, so keys derived before scopes were keyed still name
    /// their operations (docs/deploying.md, "Keyed scope hashes").
    digest: String,
    /// The digest keyed with the scope key: what is stored and compared.
    keyed: String,
}

impl Scope {
    /// The scope of a request, or `None` when it carries none of `names`.
    /// An anonymous route gives requests without them one shared scope.
    /// A value that is empty or only whitespace counts as absent: an empty
    /// `Authorization` is no credential, and clients sending one must not
    /// share a scope (and each other's stored responses). An
    /// `Authorization` signed anew for each try counts as its signer
    /// ([`signer`]).
    pub fn from_headers(
        headers: &HeaderMap,
        names: &[HeaderName],
        allow_anonymous: bool,
        key: &ScopeKey,
    ) -> Option<Self> {
        let given = |name| headers.get_all(name).iter().filter(|v| !is_blank(v));
        let present = names.iter().any(|n| given(n).next().is_some());
        if !present && !allow_anonymous {
            return None;
        }
        let mut hasher = Sha256::new();
        hasher.update(b"idemgate-scope-v1");
        for name in names {
            let values: Vec<_> = given(name).collect();
            hasher.update((values.len() as u64).to_be_bytes());
            for value in values {
                let value = if *name == AUTHORIZATION {
                    signer(value.as_bytes())
                } else {
                    Cow::Borrowed(value.as_bytes())
                };
                hasher.update((value.len() as u64).to_be_bytes());
                hasher.update(&value);
            }
        }
        let digest = digest_hex(hasher);
        Some(Scope {
            keyed: key.keyed(&digest),
            digest,
        })
    }

    /// The scope as stored (keyed).
    pub fn as_str(&self) -> &str {
        &self.keyed
    }

    /// This scope narrowed by what a route's profile adds to it: the
    /// endpoint path (ACP §6.1), the client or account headers it names
    /// (`Wire::narrowing_headers`), each read as a scope header is (empty
    /// or blank, it is none). Unchanged when the profile adds nothing, so
    /// idemgate's scopes (and the keys derived from them) stay what they
    /// were. Refused when one of those headers came more than once: the
    /// request names no one client or account.
    pub(crate) fn narrowed(
        self,
        wire: &Wire,
        path: &str,
        headers: &HeaderMap,
        key: &ScopeKey,
    ) -> Result<Self, KeyError> {
        let mut sent = Vec::new();
        for (n, header) in wire.narrowing_headers.iter().enumerate() {
            if let Some(value) = one_of(headers, header)? {
                // Each value under its header's name, so that one value in
                // two headers, or in one and none, is never one scope. The
                // first is labelled `peer`, as the stored scopes of a
                // client header are: another label would leave their
                // operations unfound, and their retries sent again.
                let label = if n == 0 { "peer" } else { header };
                sent.push((label.as_bytes(), value.as_bytes()));
            }
        }
        if !wire.scope_path && sent.is_empty() {
            return Ok(self);
        }
        let mut hasher = Sha256::new();
        hasher.update(b"idemgate-scope-v1:narrowed");
        hasher.update(self.digest.as_bytes());
        let endpoint = wire.scope_path.then(|| request_path::endpoint(path));
        let path = endpoint.as_deref().map(|p| (&b"path"[..], p.as_bytes()));
        for (label, part) in path.into_iter().chain(sent) {
            hasher.update(label);
            hasher.update((part.len() as u64).to_be_bytes());
            hasher.update(part);
        }
        let digest = digest_hex(hasher);
        Ok(Scope {
            keyed: key.keyed(&digest),
            digest,
        })
    }
}

/// The one value of `header` that is not empty or blank, if any; refused
/// when there are several.
pub(crate) fn one_of<'h>(
    headers: &'h HeaderMap,
    header: &'static str,
) -> Result<Option<&'h http::HeaderValue>, KeyError> {
    let mut given = headers.get_all(header).iter().filter(|v| !is_blank(v));
    match (given.next(), given.next()) {
        (Some(_), Some(_)) => Err(KeyError::SeveralOf { header }),
        (one, _) => Ok(one),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn parse(values: &[&[u8]]) -> Result<Option<IdempotencyKey>, KeyError> {
        let mut headers = HeaderMap::new();
        for v in values {
            headers.append(IDEMPOTENCY_KEY, HeaderValue::from_bytes(v).unwrap());
        }
        IdempotencyKey::from_headers(&headers)
    }

    fn key(s: &str) -> Option<IdempotencyKey> {
        Some(IdempotencyKey(s.into()))
    }

    #[test]
    fn bare_and_quoted_forms_are_one_key() {
        assert_eq!(parse(&[b"abc-123"]), Ok(key("abc-123")));
        assert_eq!(parse(&[b"\"abc-123\""]), Ok(key("abc-123")));
        assert_eq!(parse(&[br#""a\"b\\c""#]), Ok(key(r#"a"b\c"#)));
        assert_eq!(parse(&[]), Ok(None));
        // The same parse wherever a key is written (a status lookup's path).
        assert_eq!(IdempotencyKey::parse("\"abc-123\"").ok(), key("abc-123"));
        assert_eq!(IdempotencyKey::parse("\"abc"), Err(KeyError::BadQuoting));
    }

    #[test]
    fn malformed_keys_are_refused() {
        assert_eq!(parse(&[b"a", b"b"]), Err(KeyError::Several));
        assert_eq!(parse(&[b"a b"]), Err(KeyError::BadCharacter));
        assert_eq!(parse(&[b"\"a b\""]), Err(KeyError::BadCharacter));
        assert_eq!(parse(&[b"\"\""]), Err(KeyError::Empty));
        assert_eq!(parse(&[b"\"abc"]), Err(KeyError::BadQuoting));
        assert_eq!(parse(&[b"\"a\"b\""]), Err(KeyError::BadQuoting));
        assert_eq!(parse(&[br#""a\b""#]), Err(KeyError::BadQuoting));
        // No bare form: forwarded as `"b"`, the upstream would read `b`.
        assert_eq!(parse(&[br#""\"b\"""#]), Err(KeyError::LeadingQuote));
        assert_eq!(parse(&[br#""b\"""#]), Ok(key(r#"b""#)));
        assert_eq!(parse(&["k\u{e9}".as_bytes()]), Err(KeyError::BadCharacter));
        assert_eq!(parse(&[&[0x80]]), Err(KeyError::BadCharacter));
        let long = "k".repeat(256);
        assert_eq!(parse(&[long.as_bytes()]), Err(KeyError::TooLong));
        assert!(parse(&["k".repeat(255).as_bytes()]).unwrap().is_some());
    }

    fn parse_as(
        profile: Profile,
        headers: &[(&'static str, &str)],
    ) -> Result<Option<IdempotencyKey>, KeyError> {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.append(*name, HeaderValue::from_str(value).unwrap());
        }
        IdempotencyKey::from_wire(&map, profile.wire())
    }

    #[test]
    fn each_profile_reads_its_own_headers_and_spelling() {
        use Profile::*;
        let ik = "idempotency-key";
        assert_eq!(parse_as(Ietf, &[(ik, "\"k-1\"")]), Ok(key("k-1")));
        assert_eq!(parse_as(Ietf, &[(ik, "k-1")]), Err(KeyError::NotString));
        assert_eq!(parse_as(Acp, &[(ik, "k-1")]), Ok(key("k-1")));
        let rid = "repeatability-request-id";
        assert_eq!(parse_as(Oasis, &[(rid, "r-1")]), Ok(key("r-1")));
        // Not the profile's header: no key.
        assert_eq!(parse_as(Oasis, &[(ik, "r-1")]), Ok(None));
        assert_eq!(parse_as(Idemgate, &[(rid, "r-1")]), Ok(None));
        assert_eq!(
            parse_as(Oasis, &[(rid, "a"), (rid, "b")]),
            Err(KeyError::Several)
        );
    }

    #[test]
    fn a_profile_narrows_the_scope_only_when_it_says_so() {
        let mut headers = HeaderMap::new();
        headers.insert("repeatability-client-id", HeaderValue::from_static("c1"));
        let key = test_key();
        let base = scope("Bearer a");
        let same = base
            .clone()
            .narrowed(Profile::Idemgate.wire(), "/a", &headers, &key)
            .unwrap();
        assert_eq!(same, base);
        let acp = |path| {
            base.clone()
                .narrowed(Profile::Acp.wire(), path, &headers, &key)
                .unwrap()
        };
        assert_ne!(acp("/a"), base);
        assert_ne!(acp("/a"), acp("/b"));
        assert_eq!(acp("/a"), acp("/a"));
        let oasis = base
            .clone()
            .narrowed(Profile::Oasis.wire(), "/a", &headers, &key)
            .unwrap();
        assert_ne!(oasis, base);
        assert_eq!(
            base.clone()
                .narrowed(Profile::Oasis.wire(), "/a", &HeaderMap::new(), &key)
                .unwrap(),
            base
        );
        // A blank client id is none, as a blank scope header is; two name no one client.
        let mut blank = HeaderMap::new();
        blank.insert("repeatability-client-id", HeaderValue::from_static(" "));
        let unnamed = base
            .clone()
            .narrowed(Profile::Oasis.wire(), "/a", &blank, &key);
        assert_eq!(unnamed, Ok(base.clone()));
        headers.append("repeatability-client-id", HeaderValue::from_static("c2"));
        let two = base.narrowed(Profile::Oasis.wire(), "/a", &headers, &key);
        let header = "Repeatability-Client-ID";
        assert_eq!(two, Err(KeyError::SeveralOf { header }));
    }

    #[test]
    fn stripe_narrows_by_account_and_context_each_named() {
        let key = test_key();
        let base = scope("Bearer a");
        let narrowed = |sent: &[(&'static str, &'static str)]| {
            let mut headers = HeaderMap::new();
            for (name, value) in sent {
                headers.append(*name, HeaderValue::from_static(value));
            }
            base.clone()
                .narrowed(Profile::Stripe.wire(), "/v1/charges", &headers, &key)
        };
        let (account, context) = ("stripe-account", "stripe-context");
        assert_eq!(narrowed(&[]), Ok(base.clone()));
        let scopes = [
            narrowed(&[(context, "acct_1")]).unwrap(),
            narrowed(&[(context, "acct_2")]).unwrap(),
            narrowed(&[(account, "acct_1")]).unwrap(),
            narrowed(&[(account, "acct_1"), (context, "acct_1")]).unwrap(),
            base.clone(),
        ];
        for (i, a) in scopes.iter().enumerate() {
            for b in &scopes[i + 1..] {
                assert_ne!(a, b);
            }
        }
        assert_eq!(narrowed(&[(context, "acct_1")]).unwrap(), scopes[0]);
        let two = narrowed(&[(context, "acct_1"), (context, "acct_2")]);
        let header = "Stripe-Context";
        assert_eq!(two, Err(KeyError::SeveralOf { header }));
        // A scope narrowed by one account header is what it always was:
        // stored operations keep theirs (pinned).
        assert_eq!(
            scopes[2].digest,
            "cd87f7f982ebe9c85f08a5ede19de8f6d7ef6729cfc6f6246a1dfc4538ee17d4"
        );
    }

    #[test]
    fn url_components_are_never_dot_segments() {
        assert_eq!(url_component("a/b c"), "a%2Fb%20c");
        assert_eq!(url_component("."), "%2E");
        assert_eq!(url_component(".."), "%2E%2E");
        assert_eq!(url_component("v1.2-x_y~z"), "v1%2E2-x_y~z");
    }

    #[test]
    fn assigned_keys_are_valid_and_distinct() {
        let (a, b) = (IdempotencyKey::assign(), IdempotencyKey::assign());
        assert_ne!(a, b);
        assert_eq!(IdempotencyKey::new(a.as_str()), Ok(a));
    }

    fn test_key() -> ScopeKey {
        ScopeKey::new(&[9; 32], "test")
    }

    fn scope(token: &str) -> Scope {
        let mut headers = HeaderMap::new();
        headers.insert(
            http::header::AUTHORIZATION,
            HeaderValue::from_str(token).unwrap(),
        );
        Scope::from_headers(&headers, &[http::header::AUTHORIZATION], false, &test_key()).unwrap()
    }

    #[test]
    fn derived_keys_follow_the_named_fields() {
        let pointers = vec!["/event_id".to_string(), "/source".to_string()];
        let derive = |scope: &Scope, body: &str| {
            IdempotencyKey::derive_from_body(scope, &pointers, body.as_bytes())
        };
        let alice = scope("Bearer a");
        let a = derive(&alice, r#"{"event_id":7,"source":"crm","title":"x"}"#).unwrap();
        assert!(a.as_str().starts_with("derived-"));
        assert_eq!(IdempotencyKey::new(a.as_str()), Ok(a.clone()));
        // Other fields do not count; the named ones and the scope do.
        assert_eq!(
            derive(&alice, r#"{"title":"y","source":"crm","event_id":7.0}"#),
            Some(a.clone())
        );
        assert_ne!(
            derive(&alice, r#"{"event_id":8,"source":"crm"}"#),
            Some(a.clone())
        );
        assert_ne!(
            derive(&scope("Bearer b"), r#"{"event_id":7,"source":"crm"}"#),
            Some(a)
        );
        // A body lacking a field, with it null, or not JSON derives nothing.
        assert_eq!(derive(&alice, r#"{"event_id":7}"#), None);
        assert_eq!(derive(&alice, r#"{"event_id":7,"source":null}"#), None);
        assert_eq!(derive(&alice, "event_id=7"), None);
    }

    #[test]
    fn derived_keys_never_merge_two_values() {
        let pointers = vec!["/event/id".to_string()];
        let alice = scope("Bearer a");
        let derive =
            |body: &str| IdempotencyKey::derive_from_body(&alice, &pointers, body.as_bytes());
        // Two 20-digit ids, and 2^53 + 1 beside 2^53, are one double each.
        let id = derive(r#"{"event":{"id":12345678901234567890}}"#).unwrap();
        assert_ne!(
            derive(r#"{"event":{"id":12345678901234567891}}"#),
            Some(id.clone())
        );
        assert_eq!(
            derive(r#"{"event":{"id":12345678901234567890},"x":1}"#),
            Some(id)
        );
        assert_ne!(
            derive(r#"{"event":{"id":9007199254740993}}"#),
            derive(r#"{"event":{"id":9007199254740992}}"#)
        );
        // A field holding a duplicate member is not merged with its last one.
        assert_ne!(
            derive(r#"{"event":{"id":{"n":1,"n":2}}}"#),
            derive(r#"{"event":{"id":{"n":2}}}"#)
        );
        // A name the path goes through twice is ambiguous: no key.
        assert_eq!(derive(r#"{"event":{"id":1},"event":{"id":2}}"#), None);
        assert_eq!(derive(r#"{"event":{"id":1,"id":2}}"#), None);
        // Exact values keep the key they always had (pinned: stored keys).
        assert_eq!(
            derive(r#"{"event":{"id":7.0}}"#).unwrap().as_str(),
            "derived-6bb84260f99e4bb461bfd42f8b78bf2033f508c759d619cd3eed6776032ea431"
        );
    }

    #[test]
    fn fingerprint_keys_are_per_scope() {
        let fp = Fingerprint::from_stored("ab".into());
        let a = IdempotencyKey::derive_from_fingerprint(&scope("Bearer a"), &fp);
        assert_eq!(
            a,
            IdempotencyKey::derive_from_fingerprint(&scope("Bearer a"), &fp)
        );
        assert_ne!(
            a,
            IdempotencyKey::derive_from_fingerprint(&scope("Bearer b"), &fp)
        );
        let other = Fingerprint::from_stored("cd".into());
        assert_ne!(
            a,
            IdempotencyKey::derive_from_fingerprint(&scope("Bearer a"), &other)
        );
    }

    #[test]
    fn scope_hides_credentials_and_separates_them() {
        let names = [http::header::AUTHORIZATION];
        let with = |token: &str| {
            let mut h = HeaderMap::new();
            h.insert(
                http::header::AUTHORIZATION,
                HeaderValue::from_str(token).unwrap(),
            );
            Scope::from_headers(&h, &names, false, &test_key()).unwrap()
        };
        let a = with("Bearer secret-a");
        assert_eq!(a, with("Bearer secret-a"));
        assert_ne!(a, with("Bearer secret-b"));
        assert!(!a.as_str().contains("secret"));
        assert_eq!(a.as_str().len(), 64);
        // Stored keyed: neither the digest of earlier versions nor a plain
        // hash of the credential.
        assert_eq!(a.as_str(), test_key().keyed(&a.digest));
        assert_ne!(a.as_str(), a.digest);
        let empty = HeaderMap::new();
        assert_eq!(
            Scope::from_headers(&empty, &names, false, &test_key()),
            None
        );
        assert!(Scope::from_headers(&empty, &names, true, &test_key()).is_some());
        assert!(Scope::from_headers(&empty, &[], true, &test_key()).is_some());
    }

    #[test]
    fn an_empty_or_blank_credential_is_no_credential() {
        let names = [http::header::AUTHORIZATION];
        let with = |values: &[&str], anonymous| {
            let mut h = HeaderMap::new();
            for value in values {
                h.append(
                    http::header::AUTHORIZATION,
                    HeaderValue::from_str(value).unwrap(),
                );
            }
            Scope::from_headers(&h, &names, anonymous, &test_key())
        };
        for blank in ["", " ", "\t \t"] {
            assert_eq!(with(&[blank], false), None, "{blank:?}");
            // On an anonymous route: the anonymous scope, not one of its own.
            assert_eq!(with(&[blank], true), with(&[], true), "{blank:?}");
        }
        // A blank value beside a credential does not change its scope.
        assert_eq!(with(&["", "Bearer a"], false), with(&["Bearer a"], false));
        assert!(with(&["Bearer a"], false).is_some());
    }
}
