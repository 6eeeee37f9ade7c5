//! Real client libraries, unmodified, against the real gateway (in-process,
//! on `127.0.0.1:0`): what each one ends with when the first response to its
//! write is lost — the upstream committed the write and closed the
//! connection, so the operation is `unknown` and every retry is held with
//! 409 `outcome-unknown` — and that its own retries never reach the
//! upstream again.
//!
//! - stripe-node and stripe-python (`maxNetworkRetries: 2`; both retry 502
//!   and 409 themselves under one generated `Idempotency-Key`) must raise
//!   an error that carries the idempotency error envelope, never resolve
//!   the held 409 as if it were the created customer; and a write that
//!   succeeds resolves, so raising on everything cannot pass.
//! - requests with urllib3's `Retry` (any method, on 502/503/504) retries
//!   the lost 502 once and ends on the held 409, whose problem body parses
//!   as JSON with the `error` member.
//!
//! - On a `stripe` route, both SDKs stop at the held 409
//!   (`Stripe-Should-Retry: false`) after one retry.
//! - azure-communication-sms, its retry policy on, on an `oasis` route:
//!   the response to its one message is lost (the gateway's 504), the SDK
//!   retries and is held (409, `Repeatability-Result: accepted`), and the
//!   fake SMS API got one message.
//! - A client of our own that follows ACP §6's text (`acp_client.py`), on
//!   an `acp` route: a 503 is retried and processed fresh, a lost response
//!   is held as `idempotency_in_flight`.
//!
//! The client scripts and their pinned versions live in `tests/clients/`
//! (`package-lock.json`, `requirements.txt`); `.ci/run` installs them into
//! `tests/clients/node_modules` and `tests/clients/.venv`. The tests are
//! `#[ignore]`d; `.ci/run` runs them (`--include-ignored`), and a missing
//! install fails them.

use crate::common::*;
use serde_json::{Value, json};

/// Requests whose attempt was sent and lost (`unknown`).
const LOST: &str = r#"idemgate_requests_total{route="api",outcome="unknown"}"#;
/// Requests answered from a held operation (its retries: `conflict`).
const HELD: &str = r#"idemgate_requests_total{route="api",outcome="conflict"}"#;

/// The path every SDK here creates a customer on.
const CUSTOMERS: &str = "/v1/customers";

/// Runs a Stripe SDK's `script`, creating one customer through a new
/// gateway (its route configured with `route_extra`: a profile) whose
/// upstream commits `/v1/customers` and answers 201 — or, with
/// `lose_response`, commits it and closes the connection unanswered.
async fn create_customer(
    script: &str,
    route_extra: &str,
    lose_response: bool,
) -> (TestGateway, Value) {
    let aliases: &[(&str, &str)] = if lose_response {
        &[(CUSTOMERS, "/drop")]
    } else {
        &[]
    };
    let upstream = FakeUpstream::start_aliased(aliases).await;
    let gw = spawn_gateway_on(upstream, Setup::route(route_extra).admin()).await;
    let report = run_client(script, &[&format!("http://{}", gw.addr())]).await;
    (gw, report)
}

/// After a lost response: exactly one write reached the upstream, its
/// operation is `unknown` after one attempt, and the gateway answered
/// `requests` requests for it (the client's first try, lost, and its
/// retries, held).
async fn assert_one_write_held(gw: &TestGateway, requests: f64) {
    assert_eq!(gw.upstream.writes(), 1, "exactly one write upstream");
    let sent = gw.upstream.write_requests();
    assert_eq!(sent.len(), 1, "no retry reached the upstream: {sent:?}");
    let key = sent[0]
        .header("idempotency-key")
        .expect("the client's key was forwarded");
    let operation = gw.operation(key).await;
    assert_eq!(operation["state"], "unknown", "{operation}");
    assert_eq!(operation["attempts"], 1, "{operation}");
    let metrics = scrape_metrics(gw.admin_addr()).await;
    assert_eq!(metric(&metrics, LOST), Some(1.0), "{metrics}");
    assert_eq!(metric(&metrics, HELD), Some(requests - 1.0), "{metrics}");
}

/// What a Stripe SDK must end with when its customer's outcome is unknown:
/// an error with the gateway's idempotency error, never a customer.
fn assert_raised_outcome_unknown(report: &Value) {
    assert_eq!(report["outcome"], "raised", "the SDK resolved: {report}");
    assert_eq!(report["type"], "idempotency_error", "{report}");
    assert_eq!(report["code"], "outcome-unknown", "{report}");
    assert_eq!(report["status"], 409, "{report}");
    assert!(
        report["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{report}"
    );
}

/// A Stripe SDK's customer created through the gateway: resolved with the
/// upstream's object, one write.
async fn assert_created(gw: &TestGateway, report: &Value) {
    assert_eq!(report["outcome"], "resolved", "{report}");
    assert_eq!(report["id"], 1, "the upstream's object: {report}");
    assert_eq!(gw.upstream.writes(), 1);
}

// ------------------------------------------------------------- stripe-node

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the client SDKs of tests/clients (.ci/run runs it)"]
async fn stripe_node_raises_when_the_outcome_is_unknown() {
    let (gw, report) = create_customer("stripe_node.js", "", true).await;
    assert_raised_outcome_unknown(&report);
    assert_eq!(report["class"], "StripeAPIError", "{report}");
    assert_eq!(report["attempts"], 3, "1 + maxNetworkRetries: {report}");
    assert_one_write_held(&gw, 3.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the client SDKs of tests/clients (.ci/run runs it)"]
async fn stripe_node_resolves_a_created_customer() {
    let (gw, report) = create_customer("stripe_node.js", "", false).await;
    assert_created(&gw, &report).await;
    assert_eq!(report["attempts"], 1, "{report}");
}

// ----------------------------------------------------------- stripe-python

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the client SDKs of tests/clients (.ci/run runs it)"]
async fn stripe_python_raises_when_the_outcome_is_unknown() {
    let (gw, report) = create_customer("stripe_python.py", "", true).await;
    assert_raised_outcome_unknown(&report);
    assert_eq!(report["class"], "APIError", "{report}");
    assert_one_write_held(&gw, 3.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the client SDKs of tests/clients (.ci/run runs it)"]
async fn stripe_python_resolves_a_created_customer() {
    let (gw, report) = create_customer("stripe_python.py", "", false).await;
    assert_created(&gw, &report).await;
}

// ------------------------------------------- stripe SDKs on a `stripe` route

/// A `stripe` route (docs/profiles.md, "stripe"): the held 409 says
/// `Stripe-Should-Retry: false`, so each SDK stops after its one retry of
/// the lost 502 instead of spending every retry, and raises the same error.
const STRIPE_ROUTE: &str = "profile = \"stripe\"";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the client SDKs of tests/clients (.ci/run runs it)"]
async fn stripe_node_on_a_stripe_route_stops_at_the_held_answer() {
    let (gw, report) = create_customer("stripe_node.js", STRIPE_ROUTE, true).await;
    assert_raised_outcome_unknown(&report);
    assert_eq!(
        report["attempts"], 2,
        "the lost try and one retry: {report}"
    );
    assert_one_write_held(&gw, 2.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the client SDKs of tests/clients (.ci/run runs it)"]
async fn stripe_python_on_a_stripe_route_stops_at_the_held_answer() {
    let (gw, report) = create_customer("stripe_python.py", STRIPE_ROUTE, true).await;
    assert_raised_outcome_unknown(&report);
    assert_one_write_held(&gw, 2.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the client SDKs of tests/clients (.ci/run runs it)"]
async fn stripe_sdks_on_a_stripe_route_resolve_a_created_customer() {
    for script in ["stripe_node.js", "stripe_python.py"] {
        let (gw, report) = create_customer(script, STRIPE_ROUTE, false).await;
        assert_created(&gw, &report).await;
    }
}

// ------------------------------------- azure-communication-sms, `oasis` route

/// An `oasis` route for the SMS API. azure-communication-sms 1.1.0 carries
/// the OASIS request id and first-sent time in the body, per recipient
/// (`smsRecipients[].repeatabilityRequestId`), not in headers, so the
/// route derives its key from that id; its HMAC `Authorization` is signed
/// anew for every try, so the scope is not read from it.
const SMS_ROUTE: &str = "profile = \"oasis\"\nkey = \"derive\"\n\
    derive_from = [\"/smsRecipients/0/repeatabilityRequestId\"]\n\
    scope_headers = []\nallow_anonymous = true\nupstream_timeout = \"1s\"\n\
    late_window = \"1s\"";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the client SDKs of tests/clients (.ci/run runs it)"]
async fn azure_sms_with_its_retry_policy_sends_one_message_when_the_response_is_lost() {
    // The fake SMS API takes the message and never answers: the gateway's
    // 504 is one azure-core retries for a POST; its retry is held.
    let upstream = FakeUpstream::start_aliased(&[("/sms", "/hold")]).await;
    let gw = spawn_gateway_on(upstream, Setup::route(SMS_ROUTE).admin()).await;
    let report = run_client("azure_sms.py", &[&format!("http://{}", gw.addr())]).await;
    assert_eq!(report["outcome"], "raised", "{report}");
    assert_eq!(report["status"], 409, "the held answer: {report}");
    assert_eq!(report["repeatability_result"], "accepted", "{report}");
    assert_eq!(
        report["attempts"], 2,
        "the lost try and one retry: {report}"
    );
    assert_eq!(
        report["request_ids"].as_array().map(Vec::len),
        Some(1),
        "one request id for every try: {report}"
    );
    assert_eq!(gw.upstream.writes(), 1, "one message sent");
    let metrics = scrape_metrics(gw.admin_addr()).await;
    assert_eq!(metric(&metrics, LOST), Some(1.0), "{metrics}");
    assert_eq!(metric(&metrics, HELD), Some(1.0), "{metrics}");
}

// ---------------------------------------------- an ACP §6 client, `acp` route

const ACP_ROUTE: &str = "profile = \"acp\"";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the client SDKs of tests/clients (.ci/run runs it)"]
async fn an_acp_client_retries_a_5xx_fresh_and_is_held_after_a_lost_response() {
    // §6.5: the upstream's 503 is not stored; the retry is processed fresh.
    let upstream = FakeUpstream::start_aliased(&[("/checkout_sessions", "/once/503")]).await;
    let gw = spawn_gateway_on(upstream, Setup::route(ACP_ROUTE)).await;
    let url = format!("http://{}/checkout_sessions", gw.addr());
    let report = run_client("acp_client.py", &[&url, "3", "0.1"]).await;
    assert_eq!(report["outcome"], "created", "{report}");
    assert_eq!(report["statuses"], json!([503, 201]), "{report}");
    let key = &report["keys"][0];
    assert_eq!(
        report["echoed"],
        json!([key, key]),
        "§3.1: echoed: {report}"
    );
    assert_eq!(gw.upstream.writes(), 1);

    // A lost response is held, never re-sent: the agent is told the
    // checkout is in flight until it is settled.
    let upstream = FakeUpstream::start_aliased(&[("/checkout_sessions", "/drop")]).await;
    let gw = spawn_gateway_on(upstream, Setup::route(ACP_ROUTE).admin()).await;
    let url = format!("http://{}/checkout_sessions", gw.addr());
    let report = run_client("acp_client.py", &[&url, "3", "0.1"]).await;
    assert_eq!(report["outcome"], "held", "{report}");
    assert_eq!(report["statuses"], json!([502, 409, 409]), "{report}");
    assert_eq!(
        report["codes"],
        json!([
            "outcome_unknown",
            "idempotency_in_flight",
            "idempotency_in_flight"
        ]),
        "{report}"
    );
    assert_one_write_held(&gw, 3.0).await;
}

// ------------------------------------------------- requests + urllib3 Retry

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the client SDKs of tests/clients (.ci/run runs it)"]
async fn requests_retry_ends_on_the_held_409_with_a_parseable_error() {
    let gw = spawn_gateway_with(Setup::route("").admin()).await;
    let url = format!("http://{}/drop", gw.addr());
    let report = run_client("requests_retry.py", &[&url, "requests-lost-1"]).await;
    assert_eq!(report["outcome"], "response", "{report}");
    assert_eq!(report["status"], 409, "{report}");
    assert_eq!(
        report["retried"],
        json!([502]),
        "one retry, on the lost 502"
    );
    assert_eq!(report["content_type"], "application/problem+json");
    let body = &report["body"];
    assert_eq!(
        body["type"], "urn:idemgate:problem:outcome-unknown",
        "{body}"
    );
    assert_eq!(body["state"], "unknown", "{body}");
    assert_eq!(
        body["error"],
        json!({
            "type": "idempotency_error",
            "code": "outcome-unknown",
            "message": body["detail"],
        }),
        "{body}"
    );
    assert_one_write_held(&gw, 2.0).await;
}
