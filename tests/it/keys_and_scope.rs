//! Keys and scopes: which `Idempotency-Key` values are accepted (and that a
//! quoted and a bare spelling are one key), what happens without one in
//! `require` and `assign` mode, and that the scope (the `Authorization`
//! header by default) separates operations of different credentials.

use crate::common::*;

const BODY: &str = r#"{"amount":1000,"currency":"eur"}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_key_is_400_missing_key_and_nothing_sent() {
    let gw = spawn_gateway("").await;

    let resp = write(gw.addr(), "/payments", None, BODY).await;

    resp.assert_problem(400, "missing-key");
    assert!(gw.upstream.requests().is_empty(), "nothing sent upstream");
}

/// Sends a write with exactly these `Idempotency-Key` values and expects
/// 400 `invalid-key` with nothing sent.
async fn assert_key_rejected(keys: &[&str]) {
    let gw = spawn_gateway("").await;
    let mut headers = vec![
        ("content-type", "application/json"),
        ("authorization", ALICE),
    ];
    headers.extend(keys.iter().map(|k| ("idempotency-key", *k)));

    let resp = send(gw.addr(), "POST", "/payments", &headers, BODY).await;

    resp.assert_problem(400, "invalid-key");
    assert!(
        gw.upstream.requests().is_empty(),
        "nothing sent for {keys:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_of_256_characters_is_invalid() {
    assert_key_rejected(&["k".repeat(256).as_str()]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quoted_key_of_256_characters_is_invalid() {
    assert_key_rejected(&[format!("\"{}\"", "k".repeat(256)).as_str()]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_containing_a_space_is_invalid() {
    assert_key_rejected(&["abc def"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quoted_key_containing_a_space_is_invalid() {
    assert_key_rejected(&["\"abc def\""]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_key_headers_are_invalid() {
    assert_key_rejected(&["abc", "abc"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_quoted_key_is_invalid() {
    assert_key_rejected(&["\"\""]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_of_255_characters_is_accepted() {
    let gw = spawn_gateway("").await;
    let key = "k".repeat(255);

    let resp = write(gw.addr(), "/payments", Some(&key), BODY).await;

    assert_fresh_created(&resp);
    let sent = gw.upstream.requests();
    assert_eq!(sent[0].header("idempotency-key"), Some(key.as_str()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quoted_and_bare_key_are_one_operation() {
    let gw = spawn_gateway("").await;

    let quoted = write(gw.addr(), "/payments", Some("\"abc\""), BODY).await;
    assert_fresh_created(&quoted);
    let bare = write(gw.addr(), "/payments", Some("abc"), BODY).await;

    assert_replay_of(&bare, &quoted);
    assert_eq!(gw.upstream.writes(), 1);
}

/// ACP keys are opaque (§6.1): a quoted key is never taken for its bare
/// text (two clients' keys `"q-1"` and `q-1` were one operation, the
/// second's write never made): it is refused, nothing sent, and the bare
/// key reaches the upstream as sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acp_key_is_opaque_never_unquoted() {
    let gw = spawn_gateway("profile = \"acp\"").await;
    let bare = write(gw.addr(), "/checkout_sessions", Some("q-1"), BODY).await;
    assert_fresh_created(&bare);
    let quoted = write(gw.addr(), "/checkout_sessions", Some("\"q-1\""), BODY).await;
    assert_eq!(quoted.status, 400, "{quoted:?}");
    assert!(String::from_utf8_lossy(&quoted.body).contains("invalid_key"));
    let sent = gw.upstream.requests();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].header("idempotency-key"), Some("q-1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bare_key_reaches_upstream_unquoted() {
    let gw = spawn_gateway("").await;

    let resp = write(gw.addr(), "/payments", Some("\"pay-42:x/y\""), BODY).await;

    assert_fresh_created(&resp);
    let sent = gw.upstream.requests();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].header("idempotency-key"), Some("pay-42:x/y"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn different_credentials_with_one_key_are_two_operations() {
    let gw = spawn_gateway("").await;

    let alice = write_as(gw.addr(), "/payments", Some("k-1"), Some(ALICE), BODY).await;
    let bob = write_as(gw.addr(), "/payments", Some("k-1"), Some(BOB), BODY).await;

    let alice_id = assert_fresh_created(&alice);
    let bob_id = assert_fresh_created(&bob);
    assert_ne!(alice_id, bob_id, "bob must not get alice's response");
    assert_eq!(gw.upstream.writes(), 2);

    // Each retry replays its own credential's response.
    let alice_again = write_as(gw.addr(), "/payments", Some("k-1"), Some(ALICE), BODY).await;
    let bob_again = write_as(gw.addr(), "/payments", Some("k-1"), Some(BOB), BODY).await;
    assert_replay_of(&alice_again, &alice);
    assert_replay_of(&bob_again, &bob);
    assert_eq!(gw.upstream.writes(), 2);
}

/// Stripe Connect: a platform's requests made as a connected account name
/// it in `Stripe-Account`. One key sent for two accounts is a write on
/// each, never the first account's answer replayed to the second; the
/// platform's own request (no `Stripe-Account`) is a third.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stripe_key_sent_for_two_connected_accounts_is_two_writes() {
    one_write_per_connected_account("stripe-account").await;
}

/// `Stripe-Context` names the account as `Stripe-Account` does (and
/// supersedes it): stripe-python sends it for its `stripe_context`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stripe_key_sent_in_two_contexts_is_two_writes() {
    one_write_per_connected_account("stripe-context").await;
}

/// One key sent as `acct_1` and `acct_2` in `header`, then with no
/// account: three writes, each retry replaying its own.
async fn one_write_per_connected_account(header: &'static str) {
    let gw = spawn_gateway("profile = \"stripe\"").await;
    let addr = gw.addr();
    let as_account = |account: &'static str| {
        stripe_write(
            addr,
            "k-connect",
            (!account.is_empty()).then_some((header, account)),
        )
    };
    let first = as_account("acct_1").await;
    let second = as_account("acct_2").await;
    let platform = as_account("").await;
    let ids = [&first, &second, &platform].map(assert_fresh_created);
    assert_ne!(
        ids[0], ids[1],
        "{header}: acct_2 must not get acct_1's object"
    );
    assert_ne!(ids[0], ids[2], "{header}");
    assert_eq!(gw.upstream.writes(), 3, "{header}");
    // Each account's retry replays its own answer.
    assert_replay_of(&as_account("acct_1").await, &first);
    assert_replay_of(&as_account("acct_2").await, &second);
    assert_replay_of(&as_account("").await, &platform);
    assert_eq!(gw.upstream.writes(), 3, "{header}");
}

/// One account named in `Stripe-Account` and in `Stripe-Context` is two
/// scopes: a value is read with the header that carries it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stripe_account_and_stripe_context_are_two_scopes() {
    let gw = spawn_gateway("profile = \"stripe\"").await;
    let account = stripe_write(gw.addr(), "k-named", Some(("stripe-account", "acct_1"))).await;
    let context = stripe_write(gw.addr(), "k-named", Some(("stripe-context", "acct_1"))).await;
    assert_ne!(
        assert_fresh_created(&account),
        assert_fresh_created(&context)
    );
    assert_eq!(gw.upstream.writes(), 2);
    let twice = send(
        gw.addr(),
        "POST",
        "/payments",
        &[
            ("content-type", "application/json"),
            ("authorization", ALICE),
            ("idempotency-key", "k-named"),
            ("stripe-context", "acct_1"),
            ("stripe-context", "acct_2"),
        ],
        BODY,
    )
    .await;
    assert_eq!(twice.status, 400, "{:?}", twice.body);
    assert_eq!(twice.json()["error"]["code"], "invalid-key");
    assert_eq!(gw.upstream.writes(), 2, "nothing sent");
}

/// A Stripe write as [`ALICE`] with `key` and the account header, if any.
async fn stripe_write(
    addr: std::net::SocketAddr,
    key: &str,
    account: Option<(&str, &str)>,
) -> Response {
    let mut headers = vec![
        ("content-type", "application/json"),
        ("authorization", ALICE),
        ("idempotency-key", key),
    ];
    headers.extend(account);
    send(addr, "POST", "/payments", &headers, BODY).await
}

/// stripe-python and stripe-node retry any 409 unless `Stripe-Should-Retry`
/// says `false`: every 409 no retry of theirs changes says so, or the SDK
/// spends its retries (and, for a rotated key whose twin settles
/// meanwhile, would send a second write).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stripe_answers_no_retry_changes_say_stripe_should_retry_false() {
    let gw = spawn_gateway_with(
        Setup::route(
            "profile = \"stripe\"\nmax_stored_response = \"16\"\nrotated_keys = \"hold\"\n\
             upstream_timeout = \"300ms\"",
        )
        .admin(),
    )
    .await;
    let first = write(gw.addr(), "/payments", Some("big-1"), BODY).await;
    assert_fresh_created(&first);
    let not_stored = write(gw.addr(), "/payments", Some("big-1"), BODY).await;
    assert_eq!(not_stored.status, 409, "{not_stored:?}");
    assert!(String::from_utf8_lossy(&not_stored.body).contains("response-not-stored"));
    assert_eq!(not_stored.header("stripe-should-retry"), Some("false"));

    let held = write(gw.addr(), "/hold", Some("rot-1"), BODY).await;
    assert_eq!(held.status, 504, "{held:?}");
    let rotated = write(gw.addr(), "/hold", Some("rot-2"), BODY).await;
    assert_eq!(rotated.status, 409, "{rotated:?}");
    assert!(String::from_utf8_lossy(&rotated.body).contains("possible-duplicate"));
    assert_eq!(rotated.header("stripe-should-retry"), Some("false"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_credentials_with_changed_body_are_not_key_reused() {
    // Scopes are separate key spaces: bob's body is not compared with alice's.
    let gw = spawn_gateway("").await;

    let alice = write_as(gw.addr(), "/payments", Some("k-1"), Some(ALICE), BODY).await;
    let bob = write_as(
        gw.addr(),
        "/payments",
        Some("k-1"),
        Some(BOB),
        r#"{"amount":1}"#,
    )
    .await;

    assert_fresh_created(&alice);
    assert_fresh_created(&bob);
    assert_eq!(gw.upstream.writes(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_without_scope_header_is_400_missing_scope() {
    let gw = spawn_gateway("").await;

    let resp = write_as(gw.addr(), "/payments", Some("k-1"), None, BODY).await;

    resp.assert_problem(400, "missing-scope");
    assert!(gw.upstream.requests().is_empty(), "nothing sent upstream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anonymous_route_accepts_write_without_scope_header() {
    let gw = spawn_gateway("allow_anonymous = true").await;

    let first = write_as(gw.addr(), "/payments", Some("k-1"), None, BODY).await;
    assert_fresh_created(&first);
    let retry = write_as(gw.addr(), "/payments", Some("k-1"), None, BODY).await;

    assert_replay_of(&retry, &first);
    assert_eq!(gw.upstream.writes(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_scope_header_replaces_authorization() {
    let gw = spawn_gateway(r#"scope_headers = ["x-account"]"#).await;
    let write_for = |account: &'static str, token: &'static str| {
        let addr = gw.addr();
        async move {
            let headers = [
                ("content-type", "application/json"),
                ("idempotency-key", "k-1"),
                ("x-account", account),
                ("authorization", token),
            ];
            send(addr, "POST", "/payments", &headers, BODY).await
        }
    };

    let first = write_for("acct-1", "Bearer old-token").await;
    assert_fresh_created(&first);
    // A rotated token under the same account is the same scope.
    let rotated = write_for("acct-1", "Bearer new-token").await;
    assert_replay_of(&rotated, &first);
    // Another account is another scope.
    let other = write_for("acct-2", "Bearer old-token").await;
    assert_fresh_created(&other);
    assert_eq!(gw.upstream.writes(), 2);
}

/// Under the `ietf` profile a key is an sf-string on the wire (the draft's
/// §2.1), the only spelling such a route takes: the upstream gets it so
/// (quotes and backslashes escaped), and so does the client a key the
/// gateway assigned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ietf_route_spells_the_key_as_an_sf_string_both_ways() {
    let gw = spawn_gateway("profile = \"ietf\"").await;
    let first = write(gw.addr(), "/payments", Some("\"pay-1\""), BODY).await;
    assert_fresh_created(&first);
    let escaped = write(gw.addr(), "/payments", Some(r#""a\"b\\c""#), BODY).await;
    assert_fresh_created(&escaped);
    let sent = gw.upstream.write_requests();
    assert_eq!(sent[0].header("idempotency-key"), Some("\"pay-1\""));
    assert_eq!(sent[1].header("idempotency-key"), Some(r#""a\"b\\c""#));

    let assigning = spawn_gateway("profile = \"ietf\"\nkey = \"assign\"").await;
    let made = write(assigning.addr(), "/payments", None, BODY).await;
    assert_fresh_created(&made);
    let key = made.header("idempotency-key").expect("the assigned key");
    let bare = key.strip_prefix('"').and_then(|k| k.strip_suffix('"'));
    assert_uuid_v7(bare.unwrap_or_else(|| panic!("not an sf-string: {key}")));
    let sent = assigning.upstream.write_requests();
    assert_eq!(sent[0].header("idempotency-key"), Some(key));
    let retry = write(assigning.addr(), "/payments", Some(key), BODY).await;
    assert_replay_of(&retry, &made);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn assign_mode_returns_its_key() {
    let gw = spawn_gateway(r#"key = "assign""#).await;

    let first = write(gw.addr(), "/payments", None, BODY).await;
    let second = write(gw.addr(), "/payments", None, BODY).await;

    assert_fresh_created(&first);
    assert_fresh_created(&second);
    let key = first
        .header("idempotency-key")
        .expect("assigned key header");
    let other = second
        .header("idempotency-key")
        .expect("assigned key header");
    assert_uuid_v7(key);
    assert_uuid_v7(other);
    assert_ne!(key, other, "each keyless write gets its own key");
    assert_eq!(gw.upstream.writes(), 2);
    let sent = gw.upstream.requests();
    assert_eq!(
        sent[0].header("idempotency-key"),
        Some(key),
        "upstream sees it"
    );

    // A client that learned the key can retry with it.
    let retry = write(gw.addr(), "/payments", Some(key), BODY).await;
    assert_replay_of(&retry, &first);
    assert_eq!(gw.upstream.writes(), 2);
}

fn assert_uuid_v7(key: &str) {
    let groups: Vec<&str> = key.split('-').collect();
    let lengths: Vec<usize> = groups.iter().map(|g| g.len()).collect();
    assert_eq!(lengths, [8, 4, 4, 4, 12], "not a UUID: {key}");
    assert!(
        groups
            .iter()
            .all(|g| g.chars().all(|c| c.is_ascii_hexdigit())),
        "not a UUID: {key}"
    );
    assert!(groups[2].starts_with('7'), "not a UUIDv7: {key}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn assign_mode_honours_a_client_key() {
    let gw = spawn_gateway(r#"key = "assign""#).await;

    let first = write(gw.addr(), "/payments", Some("mine-1"), BODY).await;
    assert_fresh_created(&first);
    let retry = write(gw.addr(), "/payments", Some("mine-1"), BODY).await;

    assert_replay_of(&retry, &first);
    assert_eq!(gw.upstream.writes(), 1);
    assert_eq!(
        gw.upstream.requests()[0].header("idempotency-key"),
        Some("mine-1")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_mode_off_is_a_plain_proxy() {
    let gw = spawn_gateway(r#"key = "off""#).await;

    let first = write_as(gw.addr(), "/payments", None, None, BODY).await;
    let second = write_as(gw.addr(), "/payments", None, None, BODY).await;

    assert_fresh_created(&first);
    assert_fresh_created(&second);
    assert_eq!(gw.upstream.writes(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unintercepted_method_needs_no_key() {
    let gw = spawn_gateway(r#"methods = ["POST"]"#).await;

    let patch = send(gw.addr(), "PATCH", "/payments/1", &[], BODY).await;
    let again = send(gw.addr(), "PATCH", "/payments/1", &[], BODY).await;

    assert_fresh_created(&patch);
    assert_fresh_created(&again);
    assert_eq!(gw.upstream.writes(), 2);
}
