//! Profiles: the conventions a route speaks on the wire (docs/profiles.md).
//!
//! A profile is data — one [`Wire`] table per [`Profile`] — consulted at the
//! few places where the wire is decided: which request headers carry the
//! key and how it is spelled (`pipeline::key`), what the scope adds (the
//! path, a client id), the defaults a route's config takes
//! (`config::validate`), whether a body is compared as JSON or as sent
//! (`pipeline::fingerprint`), how each problem is answered (status, body shape,
//! error code, headers: `pipeline::error`), and which headers a first
//! answer and a replay carry (`pipeline::mod`).
//!
//! Invariant: a profile changes the wire, never the guarantees. The states,
//! the claim before sending, `unknown` held and never re-sent, every
//! operator feature: the same under every profile. Even a profile that
//! releases an upstream's 5xx (ACP §6.5) holds a lost response as
//! `unknown`: holding is not replaying.
//!
//! This module names nothing else of the crate, so that the configuration,
//! the pipeline and the conformance suite can all read it.

use std::borrow::Cow;
use std::time::Duration;

/// The conventions a route speaks (`routes[].profile`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    /// idemgate's own: the IETF draft's header with Stripe-style bodies.
    Idemgate,
    /// The IETF httpapi `Idempotency-Key` draft as written.
    Ietf,
    /// Stripe's API: what its SDKs expect.
    Stripe,
    /// The Agentic Commerce Protocol's checkout RFC, §6.
    Acp,
    /// OASIS Repeatable Requests 1.0.
    Oasis,
    /// Model Context Protocol tool calls (`tools/call`) over Streamable
    /// HTTP: JSON-RPC in, JSON-RPC out (docs/mcp.md, `pipeline::mcp`).
    Mcp,
    /// The Universal Commerce Protocol's checkout REST binding
    /// (`shopping/checkout/rest.md`).
    Ucp,
}

impl Profile {
    /// The profiles of plain HTTP writes: each has a conformance suite
    /// (the `conformance` module) of HTTP requests and answers.
    pub const HTTP: [Profile; 6] = [
        Profile::Idemgate,
        Profile::Ietf,
        Profile::Stripe,
        Profile::Acp,
        Profile::Oasis,
        Profile::Ucp,
    ];

    /// Every profile a route may speak.
    pub const ALL: [Profile; 7] = [
        Profile::Idemgate,
        Profile::Ietf,
        Profile::Stripe,
        Profile::Acp,
        Profile::Oasis,
        Profile::Mcp,
        Profile::Ucp,
    ];

    /// The name a config file and `idemgate conformance` use.
    pub fn name(self) -> &'static str {
        self.wire().name
    }

    /// The profile's table.
    pub fn wire(self) -> &'static Wire {
        match self {
            Profile::Idemgate => &IDEMGATE,
            Profile::Ietf => &IETF,
            Profile::Stripe => &STRIPE,
            Profile::Acp => &ACP,
            Profile::Oasis => &OASIS,
            Profile::Mcp => &MCP,
            Profile::Ucp => &UCP,
        }
    }
}

impl std::str::FromStr for Profile {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Profile::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = Profile::ALL.iter().map(|p| p.name()).collect();
                format!("unknown profile `{s}`: expected {}", names.join(", "))
            })
    }
}

/// How a key header's value is spelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeySyntax {
    /// A bare token or an RFC 8941 sf-string, both naming one key.
    TokenOrString,
    /// Only an sf-string (`"…"`), as the IETF draft's §2.1 says.
    String,
    /// An opaque value taken as sent.
    Opaque,
}

/// Which answers carry the key back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EchoKey {
    /// Only a key the gateway made (assigned or derived): the client
    /// needs it to retry.
    Made,
    /// Every answer to a write that carried one (ACP §3.1).
    Always,
}

/// The shape of the body of an answer the gateway makes itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyShape {
    /// RFC 9457 problem+json; with `error_member`, the Stripe-style
    /// `error` object beside the problem members.
    Problem { error_member: bool },
    /// `application/json` `{"error": {"type", "code", "message"}}`.
    StripeError,
    /// `application/json` flat `{"type", "code", "message"}` (ACP §3.1).
    Flat,
    /// `application/json` `{"code", "content"}`: UCP's protocol errors.
    CodeContent,
}

/// A profile's answer for one problem (by its name, as in
/// `urn:idemgate:problem:<name>`), overriding what idemgate answers.
#[derive(Debug, Clone, Copy)]
pub struct Answer {
    pub(crate) problem: &'static str,
    /// Only for the answer with this idemgate status (`outcome-unknown`
    /// has three); `None`: any.
    pub(crate) when_status: Option<u16>,
    pub(crate) status: Option<u16>,
    /// The error code in the body; `None`: the problem name.
    pub(crate) code: Option<&'static str>,
    /// The error `type` in a flat or Stripe body; `None`: the shape's own.
    pub(crate) error_type: Option<&'static str>,
    pub(crate) title: Option<&'static str>,
    pub(crate) retry_after: Option<u32>,
    pub(crate) headers: &'static [(&'static str, &'static str)],
    /// Where the specification says so, for the docs' tables.
    pub section: &'static str,
}

impl Answer {
    const fn of(problem: &'static str, section: &'static str) -> Self {
        Answer {
            problem,
            when_status: None,
            status: None,
            code: None,
            error_type: None,
            title: None,
            retry_after: None,
            headers: &[],
            section,
        }
    }
}

/// A problem's answer under a profile, everything decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decided {
    pub(crate) status: u16,
    pub(crate) code: String,
    pub(crate) error_type: &'static str,
    pub(crate) title: Option<&'static str>,
    /// `Some(n)`: this `Retry-After`, over idemgate's own; `None`: idemgate's.
    pub(crate) retry_after: Option<u32>,
    pub(crate) headers: &'static [(&'static str, &'static str)],
}

/// OASIS `Repeatability-Result`: whether the server took the request as
/// repeatable.
pub(crate) const REPEATABILITY_RESULT: &str = "repeatability-result";

/// Everything a profile decides, as data.
#[derive(Debug)]
pub struct Wire {
    pub profile: Profile,
    pub(crate) name: &'static str,
    /// The request headers that carry the key, in the order they are
    /// read; when several are present they must agree.
    pub key_headers: &'static [&'static str],
    pub key_syntax: KeySyntax,
    /// The key header as the profile's problem titles and details name it.
    pub(crate) key_name: &'static str,
    /// The endpoint path is part of the scope: one key on two paths is two
    /// operations (ACP §6.1).
    pub(crate) scope_path: bool,
    /// Request headers whose values, when sent, are part of the scope,
    /// beside the route's scope headers, each under its own name: one
    /// value sent in two of them is two scopes (OASIS
    /// `Repeatability-Client-ID`; Stripe's `Stripe-Account` and
    /// `Stripe-Context`).
    pub(crate) narrowing_headers: &'static [&'static str],
    /// A header that must accompany the key and say when the request was
    /// first sent (an HTTP-date); older than the store's retention, the
    /// request is refused 412, and further ahead of the gateway's clock
    /// than the route's `first_sent_skew`, 400 (OASIS
    /// `Repeatability-First-Sent`). Spelled as problem details name it.
    pub(crate) first_sent: Option<&'static str>,
    /// The route's `methods` (the writes it protects) when the file sets
    /// none; `None`: idemgate's default.
    pub(crate) methods: Option<&'static [&'static str]>,
    /// The route's `scope_headers` when the file sets none; `None`:
    /// idemgate's default.
    pub(crate) scope_headers: Option<&'static [&'static str]>,
    /// The route's `fingerprint_headers` when the file sets none; `None`:
    /// idemgate's default.
    pub(crate) fingerprint_headers: Option<&'static [&'static str]>,
    /// The body is compared byte for byte, JSON or not: re-serialising a
    /// payload is a change (UCP: the SHA-256 of the raw body). `false`: a
    /// JSON body is compared as JSON values (`pipeline::fingerprint`).
    pub(crate) body_as_sent: bool,
    /// The route's `release_statuses` when the file sets none: `true` adds
    /// every 5xx not in `unknown_statuses` to 429 (ACP §6.5).
    pub(crate) release_5xx: bool,
    /// `check-config` refuses a `store.retention` shorter than this.
    pub(crate) retention_floor: Option<Duration>,
    /// An upstream answer header that, set to `true`, says the request
    /// may be retried as it is — nothing was done, nothing saved for its
    /// key (Stripe's `Stripe-Should-Retry`): the attempt is released
    /// whatever its status, unless the route holds that status `unknown`.
    pub(crate) retry_safe_header: Option<&'static str>,
    /// Replays carry `Idempotent-Replayed: true`.
    pub(crate) replayed_header: bool,
    pub(crate) echo_key: EchoKey,
    /// Request headers echoed on every answer to a write (ACP `Request-Id`).
    pub(crate) echo_request_headers: &'static [&'static str],
    /// Request headers the client signs (UCP `signatures.md`), lower case:
    /// the destination must get each as sent, so no route option may drop
    /// or replace one.
    pub(crate) signed_headers: &'static [&'static str],
    /// Answers carry `Repeatability-Result` (OASIS).
    pub(crate) repeatability_result: bool,
    pub(crate) body: BodyShape,
    pub(crate) answers: &'static [Answer],
}

impl Wire {
    /// Whether an upstream answer with `headers` says its request may be
    /// retried as it is ([`Wire::retry_safe_header`]).
    pub(crate) fn says_retry_is_safe(&self, headers: &http::HeaderMap) -> bool {
        self.retry_safe_header
            .and_then(|name| headers.get(name))
            .is_some_and(|value| value.as_bytes().eq_ignore_ascii_case(b"true"))
    }

    /// `key` as the profile writes it in an `Idempotency-Key` it sends (to
    /// the upstream, or a key it made back to the client): an sf-string
    /// where the key is only one ([`KeySyntax::String`], the IETF draft's
    /// §2.1), its quotes and backslashes escaped; as it is otherwise.
    pub(crate) fn spelled_key<'k>(&self, key: &'k str) -> Cow<'k, str> {
        if self.key_syntax != KeySyntax::String {
            return Cow::Borrowed(key);
        }
        let mut spelled = String::with_capacity(key.len() + 2);
        spelled.push('"');
        for c in key.chars() {
            if matches!(c, '"' | '\\') {
                spelled.push('\\');
            }
            spelled.push(c);
        }
        spelled.push('"');
        Cow::Owned(spelled)
    }

    /// The answer for problem `name` whose idemgate status is `status`.
    pub fn decide(&self, name: &str, status: u16) -> Decided {
        let answer = self
            .answers
            .iter()
            .find(|a| a.problem == name && a.when_status.is_none_or(|s| s == status));
        let status = answer.and_then(|a| a.status).unwrap_or(status);
        let code = match answer.and_then(|a| a.code) {
            Some(code) => code.to_string(),
            // Flat and UCP bodies spell codes with underscores.
            None if matches!(self.body, BodyShape::Flat | BodyShape::CodeContent) => {
                name.replace('-', "_")
            }
            None => name.to_string(),
        };
        let error_type = answer
            .and_then(|a| a.error_type)
            .unwrap_or(match self.body {
                BodyShape::Flat if status == 503 => "service_unavailable",
                BodyShape::Flat if status >= 500 => "processing_error",
                BodyShape::Flat => "invalid_request",
                _ => "idempotency_error",
            });
        Decided {
            status,
            code,
            error_type,
            title: answer.and_then(|a| a.title),
            retry_after: answer.and_then(|a| a.retry_after),
            headers: answer.map_or(&[], |a| a.headers),
        }
    }
}

const IDEMPOTENCY_KEY: &str = "idempotency-key";

const IDEMGATE: Wire = Wire {
    profile: Profile::Idemgate,
    name: "idemgate",
    key_headers: &[IDEMPOTENCY_KEY],
    key_syntax: KeySyntax::TokenOrString,
    key_name: "Idempotency-Key",
    scope_path: false,
    narrowing_headers: &[],
    first_sent: None,
    methods: None,
    scope_headers: None,
    fingerprint_headers: None,
    body_as_sent: false,
    release_5xx: false,
    retention_floor: None,
    retry_safe_header: None,
    replayed_header: true,
    echo_key: EchoKey::Made,
    echo_request_headers: &[],
    signed_headers: &[],
    repeatability_result: false,
    body: BodyShape::Problem { error_member: true },
    answers: &[],
};

const IETF: Wire = Wire {
    profile: Profile::Ietf,
    name: "ietf",
    key_syntax: KeySyntax::String,
    body: BodyShape::Problem {
        error_member: false,
    },
    answers: &[
        Answer {
            title: Some("Idempotency-Key is missing"),
            ..Answer::of("missing-key", "§2.7")
        },
        Answer {
            title: Some("Idempotency-Key is already used"),
            ..Answer::of("key-reused", "§2.7")
        },
        Answer {
            title: Some("A request is outstanding for this Idempotency-Key"),
            ..Answer::of("request-in-progress", "§2.6, §2.7")
        },
        Answer {
            when_status: Some(409),
            title: Some("A request is outstanding for this Idempotency-Key"),
            ..Answer::of("outcome-unknown", "§2.6, §2.7")
        },
    ],
    ..IDEMGATE
};

const STRIPE: Wire = Wire {
    profile: Profile::Stripe,
    name: "stripe",
    // Connect: a request made as a connected account names it in
    // `Stripe-Account`, or in `Stripe-Context`, which supersedes it (the
    // SDKs' `stripe_context`). One key sent for two accounts is two
    // writes, one on each account; the first account's answer replayed to
    // the second would tell its caller that an object exists on an
    // account where none was made.
    narrowing_headers: &["Stripe-Account", "Stripe-Context"],
    // Stripe saves no result for a request no endpoint began (failed
    // validation, a concurrent conflict) and says so: the SDKs retry it,
    // and a stored copy would answer every retry the same for good.
    retry_safe_header: Some("stripe-should-retry"),
    echo_key: EchoKey::Always,
    body: BodyShape::StripeError,
    answers: &[
        Answer {
            status: Some(400),
            headers: &[("stripe-should-retry", "false")],
            ..Answer::of(
                "key-reused",
                "Idempotent requests; Errors: idempotency_error",
            )
        },
        Answer {
            code: Some("idempotency_key_in_use"),
            headers: &[("stripe-should-retry", "true")],
            ..Answer::of("request-in-progress", "Error codes: idempotency_key_in_use")
        },
        Answer {
            when_status: Some(409),
            headers: &[("stripe-should-retry", "false")],
            ..Answer::of("outcome-unknown", "Errors: Stripe-Should-Retry")
        },
        // Answers no retry of the SDK's changes: it would retry any 409
        // without the header. A rotated key retried once its twin settles
        // would even be sent, a second write.
        Answer {
            headers: &[("stripe-should-retry", "false")],
            ..Answer::of("response-not-stored", "Errors: Stripe-Should-Retry")
        },
        Answer {
            headers: &[("stripe-should-retry", "false")],
            ..Answer::of("possible-duplicate", "Errors: Stripe-Should-Retry")
        },
    ],
    ..IDEMGATE
};

const ACP: Wire = Wire {
    profile: Profile::Acp,
    name: "acp",
    // §6.1: a string of at most 255 characters, opaque: `"k"` is never
    // read as `k` (it is refused, as a leading quote is under every
    // opaque profile).
    key_syntax: KeySyntax::Opaque,
    scope_path: true,
    fingerprint_headers: Some(&[]),
    release_5xx: true,
    retention_floor: Some(Duration::from_secs(24 * 3600)),
    echo_key: EchoKey::Always,
    echo_request_headers: &["request-id"],
    body: BodyShape::Flat,
    answers: &[
        Answer {
            code: Some("idempotency_key_required"),
            ..Answer::of("missing-key", "§6.1, §6.4")
        },
        Answer {
            code: Some("idempotency_conflict"),
            ..Answer::of("key-reused", "§6.4")
        },
        Answer {
            code: Some("idempotency_in_flight"),
            ..Answer::of("request-in-progress", "§6.4")
        },
        Answer {
            when_status: Some(409),
            code: Some("idempotency_in_flight"),
            retry_after: Some(60),
            ..Answer::of("outcome-unknown", "§6.4 (decision: held is in flight)")
        },
    ],
    ..IDEMGATE
};

const OASIS: Wire = Wire {
    profile: Profile::Oasis,
    name: "oasis",
    key_headers: &["repeatability-request-id"],
    key_syntax: KeySyntax::Opaque,
    key_name: "Repeatability-Request-ID",
    narrowing_headers: &["Repeatability-Client-ID"],
    first_sent: Some("Repeatability-First-Sent"),
    release_5xx: true,
    replayed_header: false,
    repeatability_result: true,
    answers: &[
        Answer {
            title: Some("Repeatability-Request-ID required"),
            ..Answer::of("missing-key", "Repeatability-Request-ID")
        },
        Answer {
            title: Some("Invalid repeatability headers"),
            ..Answer::of(
                "invalid-key",
                "Repeatability-Request-ID, Repeatability-First-Sent",
            )
        },
        Answer {
            status: Some(400),
            title: Some("Repeatability-Request-ID reused with a different request"),
            ..Answer::of("key-reused", "Repeatability-Result (rejected)")
        },
    ],
    ..IDEMGATE
};

/// An MCP route's wire for what is still HTTP: the key header it reads
/// beside `params._meta` and a key argument, POST the one method it
/// intercepts (an MCP endpoint takes its JSON-RPC messages as POSTs), no
/// headers in the fingerprint (tool name and arguments are). Its answers
/// to a protected call are JSON-RPC responses (`pipeline::mcp::answer`),
/// never these bodies.
const MCP: Wire = Wire {
    profile: Profile::Mcp,
    name: "mcp",
    key_name: "idempotency key",
    methods: Some(&["POST"]),
    fingerprint_headers: Some(&[]),
    ..IDEMGATE
};

/// UCP's checkout REST binding: its writes are POST (create, complete,
/// cancel) and PUT (update); a key is the platform's per operation type,
/// so the path is in the scope, with the platform's credentials and its
/// `UCP-Agent` profile; the key is opaque and forwarded as sent, since a
/// platform signs it; no header is in the fingerprint (a retry may carry a
/// new `Request-Id` or signature) and the body counts byte for byte.
const UCP: Wire = Wire {
    profile: Profile::Ucp,
    name: "ucp",
    key_syntax: KeySyntax::Opaque,
    scope_path: true,
    methods: Some(&["POST", "PUT"]),
    scope_headers: Some(&["authorization", "x-api-key", "ucp-agent"]),
    fingerprint_headers: Some(&[]),
    body_as_sent: true,
    retention_floor: Some(Duration::from_secs(24 * 3600)),
    signed_headers: &[
        IDEMPOTENCY_KEY,
        "ucp-agent",
        "request-id",
        "signature",
        "signature-input",
        "content-digest",
    ],
    body: BodyShape::CodeContent,
    answers: &[Answer {
        status: Some(409),
        ..Answer::of(
            "key-reused",
            "checkout/rest.md: Idempotency-Key; signatures.md: Replay Protection",
        )
    }],
    ..IDEMGATE
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_profile_parses_by_its_name() {
        for profile in Profile::ALL {
            assert_eq!(profile.name().parse(), Ok(profile));
            assert_eq!(profile.wire().profile, profile);
        }
        let err = "soap".parse::<Profile>().unwrap_err();
        assert!(
            err.contains("idemgate, ietf, stripe, acp, oasis, mcp, ucp"),
            "{err}"
        );
    }

    #[test]
    fn the_default_profile_overrides_nothing() {
        let d = Profile::Idemgate.wire().decide("key-reused", 422);
        assert_eq!((d.status, d.code.as_str()), (422, "key-reused"));
        assert_eq!(d.error_type, "idempotency_error");
    }

    #[test]
    fn answers_follow_their_profile() {
        let acp = Profile::Acp.wire();
        let reused = acp.decide("key-reused", 422);
        assert_eq!(
            (reused.status, reused.code.as_str()),
            (422, "idempotency_conflict")
        );
        assert_eq!(reused.error_type, "invalid_request");
        let held = acp.decide("outcome-unknown", 409);
        assert_eq!(held.code, "idempotency_in_flight");
        // This attempt's own lost response is not the held answer.
        let lost = acp.decide("outcome-unknown", 502);
        assert_eq!(
            (lost.code.as_str(), lost.error_type),
            ("outcome_unknown", "processing_error")
        );
        assert_eq!(
            acp.decide("overloaded", 503).error_type,
            "service_unavailable"
        );
        let stripe = Profile::Stripe.wire().decide("key-reused", 422);
        assert_eq!(stripe.status, 400);
        assert_eq!(stripe.headers, &[("stripe-should-retry", "false")]);
        assert_eq!(Profile::Oasis.wire().decide("key-reused", 422).status, 400);
        let ucp = Profile::Ucp.wire();
        let reused = ucp.decide("key-reused", 422);
        assert_eq!((reused.status, reused.code.as_str()), (409, "key_reused"));
        let busy = ucp.decide("request-in-progress", 409);
        assert_eq!(
            (busy.status, busy.code.as_str()),
            (409, "request_in_progress")
        );
    }
}
