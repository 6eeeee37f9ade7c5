//! `idemgate conformance`: one table of cases per profile — request
//! sequences and the answers a server that honours the profile's
//! convention gives — run against any endpoint (docs/profiles.md,
//! "Conformance"). The integration tests run the same tables against the
//! real gateway (`tests/it/conformance.rs`).
//!
//! Invariants: a case names what it needs — an idempotency layer
//! ([`Case::needs_layer`]) or nothing — so a failure against a plain API
//! says why; every key a run sends is new (the run's id is in it), so a
//! second run never replays the first; every request is bounded in time
//! and its body in size.

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full, Limited};

use idemgate::profile::{KeySyntax, Profile, Wire};

/// The method of a step's write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Write {
    Post,
    /// A replacing update (UCP's Update Checkout).
    Put,
}

impl Write {
    fn method(self) -> Method {
        match self {
            Write::Post => Method::POST,
            Write::Put => Method::PUT,
        }
    }
}

/// What one request of a case sends.
#[derive(Debug, Clone, Copy)]
pub struct Step {
    /// POST unless the case says otherwise.
    pub(crate) method: Write,
    /// The case's key number `n` (`Some(n)`), or no key.
    pub(crate) key: Option<u8>,
    /// Appended to the target URL: `/slow?ms=1500` and the like are the
    /// fault paths `idemgate mock-upstream` understands.
    pub(crate) path: &'static str,
    /// Which of the case's two payloads.
    pub(crate) payload: u8,
    /// Extra request headers.
    pub(crate) headers: &'static [(&'static str, Value)],
    /// Sent at the same time as the next step (a pair).
    pub(crate) together: bool,
    pub(crate) expect: Expect,
}

/// A header value, some computed when the case runs.
#[derive(Debug, Clone, Copy)]
pub enum Value {
    Text(&'static str),
    /// The step's key as its profile spells it.
    Key,
    /// Now, as an IMF-fixdate.
    Now,
    /// Two days ago, as an IMF-fixdate: older than any tracking window
    /// the gateway keeps by default.
    LongAgo,
}

/// What an answer must be.
#[derive(Debug, Clone, Copy)]
pub struct Expect {
    pub(crate) status: Status,
    /// Headers and their values (case-insensitive); `None`: absent.
    pub(crate) headers: &'static [(&'static str, Option<Value>)],
    /// A JSON pointer into the body and the string it must hold.
    pub(crate) code: Option<(&'static str, &'static str)>,
    /// The body compared with an earlier step's.
    pub(crate) body: Body,
}

#[derive(Debug, Clone, Copy)]
pub enum Status {
    Success,
    Is(u16),
    OneOf(&'static [u16]),
    /// Of two requests sent at once, one is answered 2xx and the other
    /// 409: this one and step `n`.
    ConflictsWith(usize),
}

#[derive(Debug, Clone, Copy)]
pub enum Body {
    Any,
    /// Byte for byte the body of step `n` (a replay).
    SameAs(usize),
    /// Not the body of step `n` (a write of its own).
    Differs(usize),
}

/// One case: a request sequence and what each answer must be.
#[derive(Debug, Clone, Copy)]
pub struct Case {
    pub name: &'static str,
    /// The profile's specification section the case follows.
    pub(crate) section: &'static str,
    /// Passes only where an idempotency layer honours the key: a plain API
    /// fails it.
    pub needs_layer: bool,
    /// Writes an `idemgate mock-upstream` behind an honouring layer commits.
    pub writes: u64,
    pub(crate) steps: &'static [Step],
}

impl Case {
    pub fn requests(&self) -> usize {
        self.steps.len()
    }
}

const fn expect(status: Status) -> Expect {
    Expect {
        status,
        headers: &[],
        code: None,
        body: Body::Any,
    }
}

const fn step(key: Option<u8>, payload: u8, expect: Expect) -> Step {
    Step {
        method: Write::Post,
        key,
        path: "",
        payload,
        headers: &[],
        together: false,
        expect,
    }
}

const REPLAYED: (&str, Option<Value>) = ("idempotent-replayed", Some(Value::Text("true")));
const NOT_REPLAYED: (&str, Option<Value>) = ("idempotent-replayed", None);

/// A first write with key 0, then the same key again with payload
/// `$payload`, answered `$second`: one write either way.
macro_rules! retried {
    ($name:expr, $section:expr, $payload:expr, $second:expr) => {
        Case {
            name: $name,
            section: $section,
            needs_layer: true,
            writes: 1,
            steps: &[
                step(Some(0), 0, expect(Status::Success)),
                step(Some(0), $payload, $second),
            ],
        }
    };
}

/// A write whose response is lost (the mock's `/drop`), then its retry,
/// held and answered `$held`; each request carries `$headers`.
macro_rules! lost_response_held {
    ($headers:expr, $held:expr) => {
        Case {
            name: "lost-response-held",
            section: "idemgate: outcome unknown",
            needs_layer: true,
            writes: 1,
            steps: &[
                Step {
                    path: "/drop",
                    headers: $headers,
                    ..step(Some(0), 0, expect(Status::OneOf(&[502, 504])))
                },
                Step {
                    path: "/drop",
                    headers: $headers,
                    ..step(Some(0), 0, $held)
                },
            ],
        }
    };
}

/// The cases every profile keyed by `Idempotency-Key` shares, with its
/// statuses for a changed payload and its code pointer.
macro_rules! keyed_cases {
    ($reused:expr, $reused_code:expr, $missing_code:expr, $section:expr) => {
        [
            retried!(
                "replay",
                $section,
                0,
                Expect {
                    headers: &[REPLAYED],
                    body: Body::SameAs(0),
                    ..expect(Status::Success)
                }
            ),
            retried!(
                "changed-payload",
                $section,
                1,
                Expect {
                    code: $reused_code,
                    ..expect(Status::Is($reused))
                }
            ),
            Case {
                name: "missing-key",
                section: $section,
                needs_layer: true,
                writes: 0,
                steps: &[step(
                    None,
                    0,
                    Expect {
                        code: $missing_code,
                        ..expect(Status::Is(400))
                    },
                )],
            },
            Case {
                name: "in-flight",
                section: $section,
                needs_layer: true,
                writes: 1,
                steps: &[
                    Step {
                        path: "/slow?ms=1500",
                        together: true,
                        ..step(Some(0), 0, expect(Status::OneOf(&[201, 409])))
                    },
                    Step {
                        path: "/slow?ms=1500",
                        ..step(Some(0), 0, expect(Status::ConflictsWith(0)))
                    },
                ],
            },
            lost_response_held!(&[], expect(Status::Is(409))),
        ]
    };
}

const IDEMGATE: [Case; 5] = keyed_cases!(
    422,
    Some(("/error/code", "key-reused")),
    Some(("/error/code", "missing-key")),
    "README: the states"
);

const IETF_BARE_KEY: Case = Case {
    name: "bare-key-refused",
    section: "§2.1",
    needs_layer: true,
    writes: 0,
    steps: &[Step {
        headers: &[("idempotency-key", Value::Text("bare-token"))],
        ..step(None, 0, expect(Status::Is(400)))
    }],
};

const STRIPE_ECHO: Case = Case {
    name: "key-echoed",
    section: "Idempotent requests",
    needs_layer: true,
    writes: 1,
    steps: &[step(
        Some(0),
        0,
        Expect {
            headers: &[("idempotency-key", Some(Value::Key)), NOT_REPLAYED],
            ..expect(Status::Success)
        },
    )],
};

const ACP_ECHO: Case = Case {
    section: "§3.1",
    ..STRIPE_ECHO
};

const ACP_PATHS: Case = Case {
    name: "key-scoped-by-path",
    section: "§6.1",
    needs_layer: false,
    writes: 2,
    steps: &[
        Step {
            path: "/one",
            ..step(Some(0), 0, expect(Status::Success))
        },
        Step {
            path: "/two",
            ..step(
                Some(0),
                0,
                Expect {
                    body: Body::Differs(0),
                    ..expect(Status::Success)
                },
            )
        },
    ],
};

const ACP_5XX: Case = Case {
    name: "5xx-not-stored",
    section: "§6.5",
    needs_layer: false,
    writes: 0,
    steps: &[
        Step {
            path: "/status/500",
            ..step(Some(0), 0, expect(Status::Is(500)))
        },
        Step {
            path: "/status/500",
            ..step(
                Some(0),
                0,
                Expect {
                    headers: &[NOT_REPLAYED],
                    ..expect(Status::Is(500))
                },
            )
        },
    ],
};

/// A write with key 0 to `$path`, then the same key with the other
/// payload: UCP's conflict cases, 409 `key_reused`, one write.
macro_rules! ucp_conflict {
    ($name:expr, $section:expr, $method:expr, $path:expr) => {
        Case {
            name: $name,
            section: $section,
            needs_layer: true,
            writes: 1,
            steps: &[
                Step {
                    method: $method,
                    path: $path,
                    ..step(Some(0), 0, expect(Status::Success))
                },
                Step {
                    method: $method,
                    path: $path,
                    ..step(
                        Some(0),
                        1,
                        Expect {
                            code: Some(("/code", "key_reused")),
                            ..expect(Status::Is(409))
                        },
                    )
                },
            ],
        }
    };
}

/// UCP's two conflict cases beside the create (`changed-payload`): an
/// update (PUT) and a complete reusing their key with another body.
const UCP_CONFLICTS: [Case; 2] = [
    ucp_conflict!(
        "update-changed-payload",
        "checkout/rest.md: Update Checkout, Idempotency-Key",
        Write::Put,
        "/checkout-sessions/conformance"
    ),
    ucp_conflict!(
        "complete-changed-payload",
        "checkout/rest.md: Complete Checkout, Idempotency-Key",
        Write::Post,
        "/checkout-sessions/conformance/complete"
    ),
];

const UCP_PATHS: Case = Case {
    section: "signatures.md: Replay Protection (keys unique per operation type)",
    ..ACP_PATHS
};

const ACCEPTED: (&str, Option<Value>) = ("repeatability-result", Some(Value::Text("accepted")));
const REJECTED: (&str, Option<Value>) = ("repeatability-result", Some(Value::Text("rejected")));
const SENT_NOW: (&str, Value) = ("repeatability-first-sent", Value::Now);

/// A first sent, repeatable write answered 2xx and `accepted`.
const fn accepted(headers: &'static [(&'static str, Value)], body: Body) -> Step {
    Step {
        headers,
        ..step(
            Some(0),
            0,
            Expect {
                headers: &[ACCEPTED],
                body,
                ..expect(Status::Success)
            },
        )
    }
}

const OASIS: [Case; 6] = [
    Case {
        name: "replay",
        section: "Repeatability-Request-ID, Repeatability-Result",
        needs_layer: true,
        writes: 1,
        steps: &[
            accepted(&[SENT_NOW], Body::Any),
            accepted(&[SENT_NOW], Body::SameAs(0)),
        ],
    },
    Case {
        name: "changed-payload",
        section: "Repeatability-Result (rejected)",
        needs_layer: true,
        writes: 1,
        steps: &[
            Step {
                headers: &[SENT_NOW],
                ..step(Some(0), 0, expect(Status::Success))
            },
            Step {
                headers: &[SENT_NOW],
                ..step(
                    Some(0),
                    1,
                    Expect {
                        headers: &[REJECTED],
                        ..expect(Status::Is(400))
                    },
                )
            },
        ],
    },
    Case {
        name: "first-sent-too-old",
        section: "Repeatability-First-Sent",
        needs_layer: true,
        writes: 0,
        steps: &[Step {
            headers: &[("repeatability-first-sent", Value::LongAgo)],
            ..step(
                Some(0),
                0,
                Expect {
                    headers: &[REJECTED],
                    ..expect(Status::Is(412))
                },
            )
        }],
    },
    Case {
        name: "first-sent-missing",
        section: "Repeatability-First-Sent",
        needs_layer: true,
        writes: 0,
        steps: &[step(
            Some(0),
            0,
            Expect {
                headers: &[REJECTED],
                ..expect(Status::Is(400))
            },
        )],
    },
    Case {
        name: "client-id-scopes-the-request-id",
        section: "Repeatability-Client-ID",
        needs_layer: true,
        writes: 2,
        steps: &[
            accepted(
                &[
                    SENT_NOW,
                    ("repeatability-client-id", Value::Text("client-a")),
                ],
                Body::Any,
            ),
            accepted(
                &[
                    SENT_NOW,
                    ("repeatability-client-id", Value::Text("client-b")),
                ],
                Body::Differs(0),
            ),
        ],
    },
    lost_response_held!(
        &[SENT_NOW],
        Expect {
            headers: &[ACCEPTED],
            ..expect(Status::Is(409))
        }
    ),
];

/// The profile's cases, in the order they run.
pub fn cases(profile: Profile) -> Vec<Case> {
    const IETF: [Case; 5] = keyed_cases!(422, None, None, "§2.6, §2.7");
    const STRIPE: [Case; 5] = keyed_cases!(
        400,
        Some(("/error/type", "idempotency_error")),
        None,
        "Idempotent requests"
    );
    const ACP: [Case; 5] = keyed_cases!(
        422,
        Some(("/code", "idempotency_conflict")),
        Some(("/code", "idempotency_key_required")),
        "§6.1–§6.4"
    );
    const UCP: [Case; 5] = keyed_cases!(
        409,
        Some(("/code", "key_reused")),
        Some(("/code", "missing_key")),
        "checkout/rest.md: Idempotency-Key"
    );
    match profile {
        Profile::Idemgate => IDEMGATE.to_vec(),
        Profile::Ietf => [&IETF[..], &[IETF_BARE_KEY]].concat(),
        Profile::Stripe => [&STRIPE[..], &[STRIPE_ECHO]].concat(),
        Profile::Acp => [&ACP[..], &[ACP_ECHO, ACP_PATHS, ACP_5XX]].concat(),
        Profile::Oasis => OASIS.to_vec(),
        Profile::Ucp => [&UCP[..], &UCP_CONFLICTS, &[UCP_PATHS]].concat(),
        // Tool calls, not HTTP writes: the MCP conformance suite's.
        Profile::Mcp => Vec::new(),
    }
}

/// How one case went.
#[derive(Debug, Clone)]
pub struct Verdict {
    /// Empty when it passed.
    pub failures: Vec<String>,
    /// Some request got no answer: nothing is said of what the target
    /// honours.
    pub unanswered: bool,
}

impl Verdict {
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}

/// One answer as the runner saw it.
#[derive(Debug, Clone)]
struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

/// A bound on each request: an in-flight case waits 1.5 s upstream.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// A bound on each answer's body.
const MAX_BODY: usize = 1024 * 1024;

type Client = hyper_util::client::legacy::Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    Full<Bytes>,
>;

/// Runs the cases against a target.
pub struct Runner {
    target: String,
    profile: Profile,
    run: String,
    client: Client,
}

impl Runner {
    /// A runner for `target` (an http(s) URL the cases' paths are appended
    /// to), speaking `profile`.
    pub fn new(target: &str, profile: Profile) -> Result<Self, String> {
        let uri: Uri = target.parse().map_err(|e| format!("--target: {e}"))?;
        if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.authority().is_none() {
            return Err("--target: give an http:// or https:// URL".into());
        }
        let client = idemgate::http_client::webpki_client(Duration::from_secs(5))
            .map_err(|e| format!("TLS: {e}"))?;
        Ok(Runner {
            target: target.trim_end_matches('/').to_string(),
            profile,
            run: uuid::Uuid::now_v7().simple().to_string(),
            client,
        })
    }

    /// Runs one case (the `index`th of its table) and says how it went.
    pub async fn run(&self, index: usize, case: &Case) -> Verdict {
        let wire = self.profile.wire();
        let mut answers: Vec<Result<Answer, String>> = Vec::new();
        let mut failures = Vec::new();
        let mut steps = case.steps.iter();
        while let Some(step) = steps.next() {
            match steps.clone().next().filter(|_| step.together) {
                // A pair sent at once: either may be the first.
                Some(next) => {
                    steps.next();
                    let (a, b) = tokio::join!(
                        self.send(wire, index, case, step),
                        self.send(wire, index, case, next)
                    );
                    answers.extend([a, b]);
                }
                None => answers.push(self.send(wire, index, case, step).await),
            }
        }
        for (n, (step, answer)) in case.steps.iter().zip(&answers).enumerate() {
            match answer {
                Ok(answer) => self.check(wire, index, n, step, answer, &answers, &mut failures),
                Err(error) => failures.push(format!("request {}: no answer ({error})", n + 1)),
            }
        }
        let unanswered = answers.iter().any(Result::is_err);
        Verdict {
            failures,
            unanswered,
        }
    }

    fn key(&self, index: usize, n: u8) -> String {
        format!("conformance-{}-{index}-{n}", self.run)
    }

    fn value(&self, wire: &Wire, index: usize, step: &Step, value: Value) -> String {
        let now = SystemTime::now();
        match value {
            Value::Text(text) => text.to_string(),
            Value::Key => {
                let key = self.key(index, step.key.unwrap_or(0));
                match wire.key_syntax {
                    KeySyntax::String => format!("\"{key}\""),
                    _ => key,
                }
            }
            Value::Now => httpdate::fmt_http_date(now),
            Value::LongAgo => httpdate::fmt_http_date(now - Duration::from_secs(2 * 24 * 3600)),
        }
    }

    async fn send(
        &self,
        wire: &Wire,
        index: usize,
        case: &Case,
        step: &Step,
    ) -> Result<Answer, String> {
        let url = format!("{}{}", self.target, step.path);
        let body = format!(
            "{{\"conformance\":\"{}\",\"payload\":{}}}",
            case.name, step.payload
        );
        let mut request = Request::builder()
            .method(step.method.method())
            .uri(&url)
            .header("content-type", "application/json")
            .header("authorization", format!("Bearer conformance-{}", self.run));
        if step.key.is_some() {
            request = request.header(
                wire.key_headers[0],
                self.value(wire, index, step, Value::Key),
            );
        }
        for (name, value) in step.headers {
            request = request.header(*name, self.value(wire, index, step, *value));
        }
        let request = request
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| e.to_string())?;
        let exchange = async {
            let response = self
                .client
                .request(request)
                .await
                .map_err(|e| e.to_string())?;
            let (head, body) = response.into_parts();
            let body = Limited::new(body, MAX_BODY)
                .collect()
                .await
                .map_err(|e| e.to_string())?
                .to_bytes();
            Ok(Answer {
                status: head.status,
                headers: head.headers,
                body,
            })
        };
        tokio::time::timeout(REQUEST_TIMEOUT, exchange)
            .await
            .map_err(|_| format!("no answer within {}s", REQUEST_TIMEOUT.as_secs()))?
    }

    #[allow(clippy::too_many_arguments)] // one answer and what it is checked against
    fn check(
        &self,
        wire: &Wire,
        index: usize,
        n: usize,
        step: &Step,
        answer: &Answer,
        answers: &[Result<Answer, String>],
        failures: &mut Vec<String>,
    ) {
        let at = n + 1;
        let status = answer.status.as_u16();
        let expected = step.expect;
        let earlier = |m: usize| answers.get(m).and_then(|a| a.as_ref().ok());
        let status_ok = match expected.status {
            Status::Success => answer.status.is_success(),
            Status::Is(s) => status == s,
            Status::OneOf(set) => set.contains(&status),
            Status::ConflictsWith(m) => earlier(m).is_some_and(|e| {
                let pair = [e.status, answer.status];
                pair.iter().any(StatusCode::is_success) && pair.contains(&StatusCode::CONFLICT)
            }),
        };
        if !status_ok {
            failures.push(format!(
                "request {at}: status {status}, expected {:?}",
                expected.status
            ));
        }
        for (name, value) in expected.headers {
            let got = answer.headers.get(*name).and_then(|v| v.to_str().ok());
            let want = value.map(|v| self.value(wire, index, step, v));
            let same = match (&want, got) {
                (None, None) => true,
                (Some(want), Some(got)) => want.eq_ignore_ascii_case(got),
                _ => false,
            };
            if !same {
                failures.push(format!(
                    "request {at}: header {name} is {got:?}, expected {want:?}"
                ));
            }
        }
        if let Some((pointer, code)) = expected.code {
            let json: Option<serde_json::Value> = serde_json::from_slice(&answer.body).ok();
            let got = json
                .as_ref()
                .and_then(|j| j.pointer(pointer))
                .and_then(|v| v.as_str());
            if got != Some(code) {
                failures.push(format!(
                    "request {at}: body {pointer} is {got:?}, expected {code:?}"
                ));
            }
        }
        match expected.body {
            Body::Any => {}
            Body::SameAs(m) if earlier(m).is_some_and(|e| e.body == answer.body) => {}
            Body::SameAs(m) => failures.push(format!(
                "request {at}: the body is not request {}'s (not a replay)",
                m + 1
            )),
            Body::Differs(m) if earlier(m).is_some_and(|e| e.body != answer.body) => {}
            Body::Differs(m) => failures.push(format!(
                "request {at}: the body is request {}'s (replayed where a write of its own was due)",
                m + 1
            )),
        }
    }
}

/// Why `idemgate conformance` did not run.
#[derive(Debug, thiserror::Error)]
pub enum RefusedRun {
    #[error(
        "refusing to run: the {cases} cases of profile `{profile}` send {requests} writes to {target}; add --writes if it may be written to"
    )]
    NoWrites {
        cases: usize,
        profile: &'static str,
        requests: usize,
        target: String,
    },
    #[error("{0}")]
    Arguments(String),
    #[error("cannot write the report: {0}")]
    Output(#[from] std::io::Error),
}

/// `idemgate conformance`: says how many requests it will make, runs every
/// case of the profile against the target and prints one line per case;
/// `true` when every case passed.
pub async fn command(
    args: &crate::cli::Conformance,
    mut out: impl std::io::Write,
) -> Result<bool, RefusedRun> {
    let profile: Profile = args.profile.parse().map_err(RefusedRun::Arguments)?;
    if !Profile::HTTP.contains(&profile) {
        return Err(RefusedRun::Arguments(format!(
            "profile `{}` has no HTTP cases: an MCP route is checked with MCP's own conformance suite (docs/mcp.md)",
            profile.name()
        )));
    }
    let cases = cases(profile);
    let requests: usize = cases.iter().map(Case::requests).sum();
    if !args.writes {
        return Err(RefusedRun::NoWrites {
            cases: cases.len(),
            profile: profile.name(),
            requests,
            target: args.target.clone(),
        });
    }
    let runner = Runner::new(&args.target, profile).map_err(RefusedRun::Arguments)?;
    writeln!(
        out,
        "conformance: profile {}, {} cases, {requests} requests to {}",
        profile.name(),
        cases.len(),
        args.target
    )?;
    let mut passed = 0;
    for (index, case) in cases.iter().enumerate() {
        let verdict = runner.run(index, case).await;
        if verdict.passed() {
            passed += 1;
            writeln!(out, "pass  {} ({})", case.name, case.section)?;
            continue;
        }
        let why = if verdict.unanswered {
            " — the target did not answer every request"
        } else if case.needs_layer {
            " — needs an idempotency layer that honours the key; the target does not"
        } else {
            ""
        };
        writeln!(out, "FAIL  {} ({}){why}", case.name, case.section)?;
        for failure in &verdict.failures {
            writeln!(out, "        {failure}")?;
        }
    }
    writeln!(out, "{passed}/{} cases passed", cases.len())?;
    Ok(passed == cases.len())
}
