//! Paths and probes name what they mean, however they are spelled:
//!
//! - a request path is normalized (RFC 3986 §6.2.2) before anything routes
//!   on it: `/./api/echo`, `/%61pi/echo` and `/x/../api/echo` are the
//!   protected `/api` route, one operation, and the upstream receives
//!   `/api/echo`; `/api/../v1/x` is `/v1/x`; a path that cannot be
//!   normalized is 400 `invalid-path` and nothing is sent;
//! - empty segments merge: `/o//prot/create`, `//o/prot/create` and
//!   `/o///prot/create` are `/o/prot/create`, one operation on its route,
//!   and the upstream receives `/o/prot/create`;
//! - a `;` parameter or an encoded delimiter (`%2F`, `%3B`, `%3A`, `%40`…)
//!   that another upstream's reading would move onto another route is 400
//!   `invalid-path`; under a profile that scopes keys by endpoint, one
//!   path spelled with and without such an encoding is one endpoint; where
//!   every reading keeps the route, the path is forwarded as sent;
//! - a path whose letters in another case (`/API/tasks`), or a `/` added
//!   at its end (`/o/prot`), match a longer prefix than its own route's is
//!   400 `invalid-path` too;
//! - an extension method a route names (`PURGE`) is that route's write in
//!   any case (`purge`), one operation, forwarded as the route names it;
//! - a reconcile probe never asks about the collection an upstream that
//!   resolves dot-segments would answer for: the keys `.` and `..` are
//!   never put in a probe's path (the operation stays held), and a key with
//!   dots elsewhere is encoded (`%2E`); the admin API (and so `idemgate
//!   keys`) reads `%2E` in a path as the same `.`;
//! - repeated `X-Forwarded-For` lines reach the upstream as one list with
//!   the peer appended.

use crate::common::*;
use bytes::Bytes;
use http::StatusCode;
use serde_json::json;

const BODY: &str = r#"{"title":"t"}"#;

/// Route `api` at `/api` (keys required) beside a catch-all that is a
/// plain proxy (`key = "off"`), both to one fake upstream.
async fn protected_api_beside_a_catch_all() -> TestGateway {
    protected_beside_open("/api", "/").await
}

/// Route `api` at `protected` (keys required) beside `open` at `open_at`,
/// a plain proxy (`key = "off"`), both to one fake upstream.
async fn protected_beside_open(protected: &str, open_at: &str) -> TestGateway {
    protected_with_beside_open(protected, "", open_at).await
}

/// Like [`protected_beside_open`], `api` with `route_extra` (TOML lines).
async fn protected_with_beside_open(
    protected: &str,
    route_extra: &str,
    open_at: &str,
) -> TestGateway {
    let upstream = FakeUpstream::start().await;
    let open = format!(
        "key = \"require\"\n{route_extra}[[routes]]\nname = \"open\"\npath_prefix = \"{open_at}\"\n\
         upstream = \"{}\"\nkey = \"off\"\n",
        upstream.url()
    );
    spawn_gateway_on(upstream, Setup::route(&open).at(protected)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn equivalent_spellings_of_a_protected_path_are_one_operation_on_it() {
    let gw = protected_api_beside_a_catch_all().await;
    let spellings = [
        "/./api/echo",
        "/%61pi/echo",
        "/api/../api/echo",
        "/x/../api/echo",
    ];

    for (n, path) in spellings.iter().enumerate() {
        let key = format!("spelled-{n}");
        let first = write(gw.addr(), path, Some(&key), BODY).await;
        assert_fresh_created(&first);
        for _ in 0..2 {
            let retry = write(gw.addr(), path, Some(&key), BODY).await;
            assert_replay_of(&retry, &first);
        }
        let canonical = write(gw.addr(), "/api/echo", Some(&key), BODY).await;
        assert_replay_of(&canonical, &first);

        assert_eq!(gw.upstream.writes(), n + 1, "{path}: one upstream write");
        let sent = gw.upstream.write_requests();
        assert_eq!(sent[n].uri, "/api/echo", "{path}: what the upstream got");
    }
}

/// A character a path may not hold raw (non-ASCII, `{`, `}`, `"`) is one
/// character however the client spells it: on an `acp` route, whose key
/// is scoped by the endpoint's path, the same key and body sent raw and
/// percent-encoded are one operation, and the upstream gets the encoded
/// path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_spelled_raw_or_encoded_is_one_endpoint() {
    let gw = spawn_gateway("profile = \"acp\"").await;
    let spellings = [
        (
            "/checkout_sessions/caf\u{e9}/complete",
            "/checkout_sessions/caf%C3%A9/complete",
        ),
        (
            "/checkout_sessions/a{b}/complete",
            "/checkout_sessions/a%7Bb%7D/complete",
        ),
        (
            "/checkout_sessions/a\"b/complete",
            "/checkout_sessions/a%22b/complete",
        ),
    ];
    for (n, (raw, encoded)) in spellings.into_iter().enumerate() {
        let key = format!("spelled-raw-{n}");
        let head = raw_write_head(
            raw,
            "application/json",
            &key,
            &[&format!("content-length: {}", BODY.len())],
        );
        let mut request = head.into_bytes();
        request.extend_from_slice(BODY.as_bytes());
        let first = raw_exchange(gw.addr(), &request).await.expect("an answer");
        assert_eq!(first.status, 201, "{raw}: {}", first.head);
        let retry = write(gw.addr(), encoded, Some(&key), BODY).await;
        assert!(
            retry.is_replay(),
            "{encoded}: {:?} {:?}",
            retry.status,
            retry.body
        );
        assert_eq!(gw.upstream.writes(), n + 1, "{raw}: one upstream write");
        assert_eq!(gw.upstream.write_requests()[n].uri, encoded);
    }
    // Spellings an upstream may read as the same endpoint (a servlet
    // container strips `;` parameters, most frameworks take a trailing
    // `/`) are one endpoint for the key's scope: the retry is 422
    // `key-reused`, not a second write.
    let first = write(
        gw.addr(),
        "/checkout_sessions/cs_1/complete",
        Some("loose"),
        BODY,
    )
    .await;
    assert_eq!(first.status, 201, "{:?}", first.body);
    for spelled in [
        "/checkout_sessions/cs_1/complete;jsessionid=x",
        "/checkout_sessions/cs_1/complete/",
        "/checkout_sessions;v=1/cs_1/complete/",
    ] {
        let retry = write(gw.addr(), spelled, Some("loose"), BODY).await;
        assert_eq!(retry.status, 422, "{spelled}: {:?}", retry.body);
    }
    assert_eq!(gw.upstream.writes(), spellings.len() + 1);
}

/// An encoded delimiter, in either case — `%2F`, `%3B`, or a character a
/// segment may hold as itself (`%3A`, `%40`, `%2B`, `%21`, `%3D`, `%2C`,
/// `%27`…) — is that character to an upstream that decodes before it
/// routes or reads its parameters: under a profile that scopes keys by
/// endpoint (`acp`, `ucp`), a retry spelled so is the same endpoint's, so
/// its changed path is the profile's `key-reused`, never a second write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn encoded_delimiters_name_the_same_endpoint() {
    // (profile, collection, key-reused status and code)
    let profiles = [
        ("acp", "/checkout_sessions", 422, "idempotency_conflict"),
        ("ucp", "/checkout-sessions", 409, "key_reused"),
    ];
    let pairs = [
        ("/cs_1/complete", "/cs_1%2Fcomplete"),
        ("/cs_1/complete", "/cs_1%2fcomplete"),
        ("/cs_1;v=1/complete", "/cs_1%3Bv=1/complete"),
        ("/cs_1;v=1/complete", "/cs_1%3bv=1/complete"),
        ("/cs_1/complete", "/cs_1/complete%3B"),
        ("/cs_1/complete", "/cs_1/complete%2F"),
        ("/cs_2/complete", "/cs_1%2F..%2Fcs_2/complete"),
        ("/cs:1/complete", "/cs%3A1/complete"),
        ("/cs%3a2/complete", "/cs:2/complete"),
        ("/cs@1/complete", "/cs%401/complete"),
        ("/cs+1/complete", "/cs%2b1/complete"),
        ("/cs!1/complete", "/cs%211/complete"),
        ("/cs=1,2'/complete", "/cs%3D1%2C2%27/complete"),
        ("/cs($1*&)/complete", "/cs%28%241%2A%26%29/complete"),
    ];
    for (profile, collection, status, code) in profiles {
        let gw = spawn_gateway(&format!("profile = \"{profile}\"")).await;
        for (n, (sent, spelled)) in pairs.into_iter().enumerate() {
            let key = format!("{profile}-separators-{n}");
            let headers = [
                ("content-type", "application/json"),
                ("authorization", ALICE),
                ("idempotency-key", key.as_str()),
            ];
            let path = |p: &str| format!("{collection}{p}");
            let first = send(gw.addr(), "POST", &path(sent), &headers, BODY).await;
            assert_fresh_created(&first);
            let retry = send(gw.addr(), "POST", &path(spelled), &headers, BODY).await;
            let shown = String::from_utf8_lossy(&retry.body);
            assert_eq!(retry.status, status, "{profile} {spelled}: {shown}");
            assert_eq!(retry.json()["code"], code, "{profile} {spelled}: {shown}");
            assert_eq!(
                gw.upstream.writes(),
                n + 1,
                "{profile} {spelled}: one write"
            );
        }
    }
}

/// A route's `path_prefix` is matched in the paths' normal form: one
/// written with a character a path may not hold raw takes that character
/// raw and encoded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_is_matched_in_normal_form() {
    let gw = spawn_gateway_at("/caf\u{e9}", "").await;
    let head = raw_write_head(
        "/caf\u{e9}/orders",
        "application/json",
        "prefix-raw",
        &[&format!("content-length: {}", BODY.len())],
    );
    let mut request = head.into_bytes();
    request.extend_from_slice(BODY.as_bytes());
    let raw = raw_exchange(gw.addr(), &request).await.expect("an answer");
    assert_eq!(raw.status, 201, "{}", raw.head);
    let encoded = write(gw.addr(), "/caf%C3%A9/orders", Some("prefix-raw"), BODY).await;
    assert!(
        encoded.is_replay(),
        "{:?} {:?}",
        encoded.status,
        encoded.body
    );
    assert_eq!(gw.upstream.writes(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dot_segment_leaves_the_prefix_it_names() {
    let gw = protected_api_beside_a_catch_all().await;

    // `/api/../v1/x` is `/v1/x`: the catch-all's, which needs no key.
    let resp = write(gw.addr(), "/api/../v1/x?src=test", None, BODY).await;

    assert_fresh_created(&resp);
    let sent = gw.upstream.write_requests();
    assert_eq!(sent.len(), 1);
    assert_eq!(
        sent[0].uri, "/v1/x?src=test",
        "normalized path, query as is"
    );
    // Pass-through requests are forwarded normalized too.
    let read = send(gw.addr(), "GET", "/%61pi/./items/%7e1", &[], Bytes::new()).await;
    assert_eq!(read.status, StatusCode::OK);
    assert_eq!(
        gw.upstream.requests().last().expect("a GET").uri,
        "/api/items/~1"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reserved_prefix_is_decided_after_normalization() {
    let gw = protected_api_beside_a_catch_all().await;
    let written = write(gw.addr(), "/api/echo", Some("lookup-1"), BODY).await;
    assert_fresh_created(&written);

    let found = send(
        gw.addr(),
        "GET",
        "/api/../.idemgate/operations/lookup-1",
        &[("authorization", ALICE)],
        Bytes::new(),
    )
    .await;

    assert_eq!(found.status, StatusCode::OK);
    assert_eq!(found.json()["state"], "completed", "{:?}", found.json());
    assert_eq!(
        gw.upstream.requests().len(),
        1,
        "the lookup stays in idemgate"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_that_cannot_be_normalized_is_refused() {
    let gw = protected_api_beside_a_catch_all().await;

    for path in ["/%zz", "/api/%4", "/api/echo%"] {
        let resp = write(gw.addr(), path, Some("bad-path"), BODY).await;
        let problem = resp.assert_problem(400, "invalid-path");
        assert!(
            problem["detail"].as_str().is_some_and(|d| d.contains('%')),
            "{path}: {problem}"
        );
    }
    let raw = raw_exchange(gw.addr(), b"OPTIONS * HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .expect("a response");
    assert_eq!(raw.status, 400, "asterisk-form: {}", raw.head);
    assert!(gw.upstream.requests().is_empty(), "nothing sent");
}

/// A protected `/o/prot/` inside an open `/o/`: the setup the empty-segment
/// bypass was reported on.
async fn protected_prefix_inside_an_open_one() -> TestGateway {
    protected_beside_open("/o/prot/", "/o/").await
}

/// One write to `/o/prot/create`, as the bypass report spelled it.
const SLASHED: [&str; 4] = [
    "/o/prot/create",
    "/o//prot/create",
    "//o/prot/create",
    "/o///prot/create",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_segments_merge_so_a_write_keeps_its_route() {
    let gw = protected_prefix_inside_an_open_one().await;

    let first = write(gw.addr(), SLASHED[0], Some("slashes-1"), BODY).await;
    assert_fresh_created(&first);
    for path in SLASHED.iter().chain(&SLASHED).skip(1) {
        let retry = write(gw.addr(), path, Some("slashes-1"), BODY).await;
        assert_replay_of(&retry, &first);
    }

    assert_eq!(gw.upstream.writes(), 1, "eight requests, one write");
    let sent = gw.upstream.write_requests();
    assert_eq!(sent[0].uri, "/o/prot/create");
    // The protected route's rules hold whatever the spelling.
    for path in ["//o/prot/create", "/o//prot//create//?a=b"] {
        write(gw.addr(), path, None, BODY)
            .await
            .assert_problem(400, "missing-key");
    }
    // Proxied requests are forwarded merged too.
    let read = send(gw.addr(), "GET", "/o//x//y/?q=a//b", &[], Bytes::new()).await;
    assert_eq!(read.status, StatusCode::OK);
    let last = gw.upstream.requests().last().expect("a GET").uri.clone();
    assert_eq!(last, "/o/x/y/?q=a//b", "the query is kept as sent");
    assert_eq!(gw.upstream.writes(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_an_upstream_could_route_elsewhere_is_refused() {
    let gw = protected_prefix_inside_an_open_one().await;
    // Literally these are the open route's; a servlet container strips the
    // `;` parameter, nginx decodes `%2F` (and `%3B`) before it routes: the
    // protected route's write to them.
    for path in [
        "/o/prot;x/create",
        "/o/prot;/create",
        "/o;v=1/prot/create",
        "/o/x/..;/prot/create",
        "/o%2Fprot/create",
        "/o/x%2F..%2Fprot/create",
        "/o/prot%3Bx/create",
    ] {
        let resp = write(gw.addr(), path, None, BODY).await;
        resp.assert_problem_mentioning(400, "invalid-path", "/o/prot/");
    }
    assert!(gw.upstream.requests().is_empty(), "nothing sent");

    // Where every reading keeps the route, the path is forwarded as sent:
    // `;` and `%2F` are data to the upstreams that do not strip or decode.
    let kept = [
        ("/o/prot/create;v=1", Some("kept-1")),
        ("/o/prot/a%2Fb", Some("kept-2")),
        ("/o/x;y/z", None),
        ("/o/a%2fb", None),
    ];
    for (n, (path, key)) in kept.iter().enumerate() {
        assert_fresh_created(&write(gw.addr(), path, *key, BODY).await);
        let sent = gw.upstream.write_requests();
        assert_eq!(sent[n].uri, path.replace("%2f", "%2F"), "{path}");
    }
}

/// A prefix holding a character a segment may hold as itself (`:` in a
/// custom method, `@` in a handle): the same path with it encoded is the
/// protected route's to an upstream that decodes before it routes, so it
/// is refused, never taken by the catch-all that needs no key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_with_an_encoded_delimiter_is_not_slipped_past() {
    let gw = protected_beside_open("/v1/payments:charge", "/").await;
    for path in [
        "/v1/payments%3Acharge",
        "/v1/payments%3acharge/x",
        "/v1%2Fpayments:charge",
        // Fully decoded it is `/z`, the catch-all's; an upstream that
        // keeps `%2F` as data and decodes the rest routes it to the
        // protected route.
        "/v1/payments%3Acharge/a%2F..%2F..%2F..%2Fz",
    ] {
        let resp = write(gw.addr(), path, None, BODY).await;
        resp.assert_problem_mentioning(400, "invalid-path", "/v1/payments:charge");
    }
    write(gw.addr(), "/v1/payments:charge", None, BODY)
        .await
        .assert_problem(400, "missing-key");
    assert!(gw.upstream.requests().is_empty(), "nothing sent");
    // Where no reading changes the route, the encoding is data, kept.
    assert_fresh_created(&write(gw.addr(), "/v1/users/a%40b", None, BODY).await);
    assert_eq!(gw.upstream.write_requests()[0].uri, "/v1/users/a%40b");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_an_upstream_reads_in_another_case_or_with_a_slash_is_refused() {
    // Literally the open route's; an upstream that routes without regard
    // to case (Express, ASP.NET Core) or to a trailing `/` (Express) writes
    // them as the protected route's.
    let gw = protected_api_beside_a_catch_all().await;
    for path in ["/API/tasks", "/Api/tasks", "/aPI"] {
        for _ in 0..2 {
            let resp = write(gw.addr(), path, Some("cased-1"), BODY).await;
            resp.assert_problem_mentioning(400, "invalid-path", "/api");
        }
    }
    assert!(gw.upstream.requests().is_empty(), "nothing sent");
    // What no case could move keeps its route.
    assert_fresh_created(&write(gw.addr(), "/api/Tasks", Some("cased-2"), BODY).await);
    assert_fresh_created(&write(gw.addr(), "/APIs/x", None, BODY).await);
    assert_eq!(gw.upstream.write_requests()[0].uri, "/api/Tasks");

    let gw = protected_prefix_inside_an_open_one().await;
    for path in ["/o/prot", "/o/PROT/create", "/O/Prot"] {
        for _ in 0..2 {
            let resp = write(gw.addr(), path, Some("slashed-1"), BODY).await;
            resp.assert_problem_mentioning(400, "invalid-path", "/o/prot/");
        }
    }
    assert!(gw.upstream.requests().is_empty(), "nothing sent");
    for (path, key) in [("/o/prot/", Some("slashed-2")), ("/o/protx", None)] {
        assert_fresh_created(&write(gw.addr(), path, key, BODY).await);
    }
    assert_eq!(gw.upstream.writes(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extension_method_a_route_names_is_intercepted_in_any_case() {
    let methods = "methods = [\"POST\", \"PURGE\", \"MKCOL\"]\n";
    let gw = protected_with_beside_open("/dav", methods, "/").await;
    let keyed = [("authorization", ALICE), ("idempotency-key", "purged-1")];
    let first = send(gw.addr(), "purge", "/dav/cache", &keyed, BODY.to_owned()).await;
    assert_fresh_created(&first);
    let retry = send(gw.addr(), "Purge", "/dav/cache", &keyed, BODY.to_owned()).await;
    assert_replay_of(&retry, &first);
    assert_eq!(gw.upstream.writes(), 1, "one write");
    assert_eq!(gw.upstream.write_requests()[0].method.as_str(), "PURGE");
    // The route's rules hold whatever the spelling.
    let keyless = [("authorization", ALICE)];
    send(gw.addr(), "Mkcol", "/dav/col", &keyless, BODY.to_owned())
        .await
        .assert_problem(400, "missing-key");
    // A method no route names keeps its spelling.
    send(gw.addr(), "purge", "/other", &[], Bytes::new()).await;
    let other = gw
        .upstream
        .requests()
        .last()
        .expect("the other")
        .method
        .clone();
    assert_eq!(other.as_str(), "purge");
    assert_eq!(gw.upstream.writes(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_forwarded_for_lines_are_one_list() {
    let gw = protected_api_beside_a_catch_all().await;
    let headers = [
        ("content-type", "application/json"),
        ("authorization", ALICE),
        ("idempotency-key", "xff-1"),
        ("x-forwarded-for", "10.0.0.1"),
        ("x-forwarded-for", "10.0.0.2, 10.0.0.3"),
    ];

    let written = send(gw.addr(), "POST", "/api/echo", &headers, BODY).await;
    let read = send(gw.addr(), "GET", "/v1/x", &headers[3..], Bytes::new()).await;

    assert_fresh_created(&written);
    assert_eq!(read.status, StatusCode::OK);
    for up in gw.upstream.requests() {
        let lines: Vec<_> = up.headers.get_all("x-forwarded-for").iter().collect();
        assert_eq!(
            lines,
            ["10.0.0.1, 10.0.0.2, 10.0.0.3, 127.0.0.1"],
            "{} {}",
            up.method,
            up.uri
        );
    }
}

// ------------------------------------------------ probes for keys `.` and `..`

/// A gateway whose route probes `GET /tasks/{key}` on its upstream, which
/// answers `/tasks/.` and `/tasks/..` for the collection.
async fn with_path_probe() -> TestGateway {
    spawn_probing("/tasks/{key}", "").await
}

fn probes(gw: &TestGateway) -> Vec<String> {
    gw.upstream
        .requests()
        .into_iter()
        .filter(|r| r.uri.starts_with("/tasks/"))
        .map(|r| r.uri)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dot_key_is_never_probed_in_a_path() {
    let gw = with_path_probe().await;

    for key in ["..", "."] {
        // Committed, then the connection dropped: the write happened, but
        // no probe URL can name its resource safely, so it stays held.
        let lost = write(gw.addr(), "/drop", Some(key), BODY).await;
        lost.assert_operation_problem(502, "outcome-unknown", "unknown");
        let retry = write(gw.addr(), "/drop", Some(key), BODY).await;
        assert_held_unknown(&retry);
        let stored = gw.operation(key).await;
        assert_eq!(stored["state"], "unknown", "{key}: {stored}");
        let skipped = events_of(&stored, "probe");
        assert!(
            !skipped.is_empty()
                && skipped.iter().all(|p| p["error"]
                    .as_str()
                    .is_some_and(|e| e.starts_with("not asked") && e.contains("dot-segment"))),
            "{key}: {stored}"
        );
        // The client can still ask for it, in the quoted form.
        let path = format!("/.idemgate/operations/%22{key}%22");
        let lookup = send(
            gw.addr(),
            "GET",
            &path,
            &[("authorization", ALICE)],
            String::new(),
        )
        .await;
        assert_eq!(lookup.status, StatusCode::OK, "{key}: {:?}", lookup.body);
        assert_eq!(lookup.json()["state"], "unknown");
    }
    assert!(probes(&gw).is_empty(), "asked {:?}", probes(&gw));
    assert_eq!(gw.upstream.writes(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_key_with_dots_is_settled_with_its_own_resource() {
    let gw = with_path_probe().await;
    let settled = lost_then_settled(gw.addr(), "/drop", "...", BODY).await;

    assert_eq!(settled.status, StatusCode::OK);
    assert!(settled.is_replay());
    assert_eq!(settled.json(), json!({ "id": 1 }), "the key's own task");
    assert!(probes(&gw).iter().all(|uri| uri == "/tasks/%2E%2E%2E"));
    assert_eq!(gw.upstream.writes(), 1);
    assert_eq!(gw.operation("...").await["evidence"], "reconciled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_reads_percent_encoded_path_segments() {
    let setup = Setup::route("").admin();
    let token = setup.admin_token.clone().expect("a token");
    let gw = spawn_gateway_with(setup).await;
    assert_fresh_created(&write(gw.addr(), "/tasks", Some(".."), BODY).await);
    let id = gw.operation("..").await["id"]
        .as_str()
        .expect("id")
        .to_owned();

    // Every byte of the id percent-encoded: still the same operation.
    let encoded: String = id.bytes().map(|b| format!("%{b:02X}")).collect();
    let shown = admin_call(
        gw.admin_addr(),
        "GET",
        &format!("/admin/keys/{encoded}"),
        Some(&token),
        "",
    )
    .await;
    assert_eq!(shown.status, StatusCode::OK, "{:?}", shown.body);
    assert_eq!(shown.json()["id"], id.as_str());

    // `idemgate keys` encodes `.` as `%2E`, in the query and in the path.
    let variable = format!("IDEMGATE_TEST_TOKEN_{}", uuid::Uuid::now_v7().simple());
    let keys = |args: &[&str]| {
        let mut cmd = binary();
        cmd.arg("keys")
            .args(args)
            .args(["--json", "--admin"])
            .arg(format!("http://{}", gw.admin_addr()))
            .args(["--token-env", &variable])
            .env(&variable, &token);
        cmd
    };
    let (status, stdout, stderr) = run_to_exit(keys(&["list", "--key", ".."])).await;
    assert!(status.success(), "{stderr}");
    let page: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    assert_eq!(page["items"][0]["id"], id.as_str(), "{page}");
    let (status, _, stderr) = run_to_exit(keys(&["show", "."])).await;
    assert!(!status.success());
    assert!(stderr.contains("404 unknown-operation"), "{stderr}");
}
