//! The operator console in a real browser: Debian's Chromium, headless,
//! driven through WebDriver (chromedriver, fantoccini) against an
//! in-process gateway and its fake upstream. An operator signs in, finds
//! the operation `/drop` left `unknown`, settles it, and the client's retry
//! through the proxy gets the replay (a body typed on settling, as typed);
//! a second operator's late settle shows the 409; a route is paused and
//! resumed, and one no longer configured is still shown, and resumed;
//! signing out empties the page; the main flow works by keyboard; at
//! 360 px nothing overflows sideways.
//!
//! chromium and chromium-driver are Debian packages that `.ci/run`
//! installs; the tests are `#[ignore]`d, `.ci/run` runs them
//! (`--include-ignored`), and without those packages they fail.
//! Screenshots go to `target/console-screenshots/`.

use std::net::TcpListener as StdListener;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;
use fantoccini::key::Key;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};

const ORDER: &str = r#"{"sku":"A-1","qty":2}"#;

/// A running chromedriver, stopped when dropped with every browser it
/// started: it leads a process group of its own, which they join, so a
/// test that fails before closing its session leaves nothing running.
struct Driver {
    child: Child,
    url: String,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let group = format!("-{}", self.child.id());
        let _ = child_status(Command::new("kill").args(["-KILL", "--", &group]));
        let _ = self.child.wait();
    }
}

/// chromedriver on a free loopback port; panics when chromium or
/// chromedriver is missing.
fn driver() -> Driver {
    for tool in ["chromium", "chromedriver"] {
        let found = child_status(
            Command::new(tool)
                .arg("--version")
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
        )
        .is_ok_and(|s| s.success());
        assert!(
            found,
            "{tool} is not installed (Debian packages chromium, chromium-driver; .ci/run installs them)"
        );
    }
    // chromedriver needs a port number: take a free one from the kernel.
    let port = StdListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let child = spawn_child(
        Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )
    .expect("start chromedriver");
    let driver = Driver {
        child,
        url: format!("http://127.0.0.1:{port}"),
    };
    let deadline = Instant::now() + WAIT;
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "chromedriver did not listen");
        std::thread::sleep(Duration::from_millis(50));
    }
    driver
}

/// A headless Chromium whose page is `width` px wide.
async fn browser(driver: &Driver, width: u32) -> Client {
    browser_with(driver, width, json!({})).await
}

/// Like [`browser`], with Chromium's preferences `prefs` set.
async fn browser_with(driver: &Driver, width: u32, prefs: Value) -> Client {
    let args = [
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-crash-reporter",
        "--window-size=1280,900",
    ];
    // A window is at least 500 px wide: narrower pages are emulated, as a
    // phone's would be.
    let mut options = json!({ "args": args, "prefs": prefs });
    if width < 1280 {
        options["mobileEmulation"] = json!({
            "deviceMetrics": { "width": width, "height": 800, "pixelRatio": 1.0 }
        });
    }
    let mut capabilities = serde_json::Map::new();
    capabilities.insert("goog:chromeOptions".into(), options);
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    tokio::time::timeout(
        WAIT,
        ClientBuilder::new(connector)
            .capabilities(capabilities)
            .connect(&driver.url),
    )
    .await
    .expect("chromium start timed out")
    .expect("a WebDriver session")
}

/// A gateway with an admin token, and the console's URL.
async fn console_gateway() -> (TestGateway, String) {
    console_gateway_with(Setup::route("")).await
}

/// Like [`console_gateway`], made as `setup` says.
async fn console_gateway_with(setup: Setup) -> (TestGateway, String) {
    let gw = spawn_gateway_with(setup.admin()).await;
    let url = format!("http://{}/", gw.admin_addr());
    (gw, url)
}

async fn lose(gw: &TestGateway, key: &str) -> String {
    let lost = write(gw.addr(), "/drop", Some(key), ORDER).await;
    lost.assert_operation_problem(502, "outcome-unknown", "unknown");
    // Found by listing, so that a key needs no encoding in a query.
    let held = gw.admin("GET", "/admin/keys?state=unknown", "").await;
    held.json()["items"]
        .as_array()
        .expect("items")
        .iter()
        .find(|item| item["key"] == key)
        .and_then(|item| item["id"].as_str())
        .expect("the lost write is held")
        .to_owned()
}

fn screenshot_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/console-screenshots");
    std::fs::create_dir_all(&dir).expect("screenshot dir");
    dir
}

async fn screenshot(client: &Client, name: &str) {
    let png = client.screenshot().await.expect("screenshot");
    std::fs::write(screenshot_dir().join(format!("{name}.png")), png).expect("write screenshot");
}

async fn js(client: &Client, script: &str) -> Value {
    client.execute(script, vec![]).await.expect("script")
}

/// The text of the element `css` once it contains `needle` (bounded).
async fn wait_text(client: &Client, css: &str, needle: &str) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        let text = match client.find(Locator::Css(css)).await {
            Ok(element) => element.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        };
        if text.contains(needle) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "`{css}` never showed {needle:?}; it shows {text:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn click(client: &Client, css: &str) {
    client
        .find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"))
        .click()
        .await
        .unwrap_or_else(|e| panic!("click {css}: {e}"));
}

async fn type_into(client: &Client, css: &str, text: &str) {
    let field = client
        .find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"));
    field.clear().await.expect("clear");
    field.send_keys(text).await.expect("type");
}

/// Presses Tab until the focused element's text is `text` (bounded), so
/// the element is reachable by keyboard, in the page's order.
async fn tab_to(client: &Client, text: &str) {
    for _ in 0..40 {
        let focused = client.active_element().await.expect("focus");
        if focused.text().await.unwrap_or_default().trim() == text {
            return;
        }
        focused.send_keys(&Key::Tab).await.expect("tab");
    }
    panic!("{text:?} is not reachable with Tab");
}

/// Signs in by keyboard only: the token field has focus, Enter submits.
async fn sign_in_by_keyboard(client: &Client, token: &str) {
    client
        .wait()
        .at_most(WAIT)
        .for_element(Locator::Css("#token"))
        .await
        .expect("sign-in form");
    let focused = client.active_element().await.expect("focus");
    assert_eq!(
        focused.attr("id").await.expect("id").as_deref(),
        Some("token"),
        "the token field has focus on arrival"
    );
    focused.send_keys(token).await.expect("type token");
    focused.send_keys(&Key::Enter).await.expect("enter");
}

/// A browser at 1280 px signed in to the console at `url` by keyboard,
/// once its list says `summary`.
async fn signed_in(driver: &Driver, gw: &TestGateway, url: &str, summary: &str) -> Client {
    let client = browser(driver, 1280).await;
    client.goto(url).await.expect("open the console");
    sign_in_by_keyboard(&client, gw.admin_token()).await;
    wait_text(&client, "#list-summary", summary).await;
    client
}

/// The page is no wider than `width`, the window; on failure, names the
/// elements that stick out.
async fn assert_no_overflow(client: &Client, width: u64, what: &str) {
    let measured = js(
        client,
        &format!(
            "const wide = [...document.querySelectorAll('body *')]
               .filter((e) => e.getBoundingClientRect().right > {width}.5
                 || e.scrollWidth > e.clientWidth + 1)
               .slice(0, 5)
               .map((e) => e.tagName + '#' + e.id + '.' + e.className);
             return [document.documentElement.scrollWidth, window.innerWidth, wide];"
        ),
    )
    .await;
    let (scroll, inner) = (measured[0].as_u64(), measured[1].as_u64());
    assert!(
        scroll.is_some_and(|s| s <= width) && inner == Some(width),
        "{what}: page {scroll:?} px wide, window {inner:?} px; sticking out: {}",
        measured[2]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs chromium and chromedriver (.ci/run runs it)"]
async fn an_operator_settles_a_lost_write_and_the_retry_gets_the_replay() {
    let driver = driver();
    let clock = idemgate_model::clock::ManualClock::new();
    // A late window of a millisecond: the older write's next action is
    // to check the destination, not to wait for its attempt to land.
    let setup = Setup::route("late_window = \"1ms\"").clock(clock.clone());
    let (gw, url) = console_gateway_with(setup).await;
    // Two lost writes (the older first) and one that completed.
    lose(&gw, "order-older").await;
    clock.advance(Duration::from_millis(20));
    let raced = lose(&gw, "order-newer").await;
    let done = write(gw.addr(), "/orders", Some("order-done"), ORDER).await;
    assert_eq!(done.status, 201);
    let writes_before = gw.upstream.writes();
    assert_eq!(writes_before, 3);

    let client = browser(&driver, 1280).await;
    client.goto(&url).await.expect("open the console");

    // A wrong token is refused, plainly; the page keeps nothing.
    sign_in_by_keyboard(&client, "not-the-token").await;
    let refused = wait_text(&client, "#sign-in-error", "Wrong token").await;
    assert!(refused.contains("refused"), "{refused}");
    assert_eq!(js(&client, "return sessionStorage.length;").await, json!(0));
    screenshot(&client, "sign-in-refused").await;

    // The right one, by keyboard: the held work, oldest first.
    let field = client.find(Locator::Id("token")).await.expect("token");
    field.clear().await.expect("clear");
    field.send_keys(gw.admin_token()).await.expect("type");
    field.send_keys(&Key::Enter).await.expect("enter");
    wait_text(&client, "#list-summary", "2 held operations, oldest first").await;
    let keys = client
        .find_all(Locator::Css("#operations tbody a.key"))
        .await
        .expect("rows");
    let mut shown = Vec::new();
    for key in &keys {
        shown.push(key.text().await.expect("text"));
    }
    assert_eq!(
        shown,
        ["order-older", "order-newer"],
        "held work, oldest first"
    );
    let first_row = wait_text(&client, "#operations tbody tr", "Check the destination").await;
    assert!(
        first_row.contains("api") && first_row.contains("unknown"),
        "{first_row}"
    );
    // No cookie was set; the token is in this tab's session storage only.
    assert_eq!(js(&client, "return document.cookie;").await, json!(""));
    assert_eq!(
        js(
            &client,
            "return sessionStorage.getItem('idemgate.admin_token');"
        )
        .await,
        json!(gw.admin_token())
    );
    screenshot(&client, "held-work").await;

    // Open the oldest by keyboard: its request, and its timeline in words.
    tab_to(&client, "order-older").await;
    let focused = client.active_element().await.expect("focus");
    focused.send_keys(&Key::Enter).await.expect("enter");
    wait_text(&client, "#operation-title", "order-older").await;
    let facts = wait_text(&client, "#operation-facts", "POST /drop").await;
    assert!(
        facts.contains("unknown") && facts.contains("none recorded"),
        "{facts}"
    );
    let timeline = wait_text(&client, "#timeline", "Claimed").await;
    assert!(timeline.contains("Sent upstream"), "{timeline}");

    // A status that has no content with a body is refused on the page, as
    // the API refuses it: a replay could not send that body.
    type_into(&client, "#settle-operator", "ann").await;
    type_into(&client, "#settle-status", "204").await;
    type_into(&client, "#settle-body", "{\"id\": 1}").await;
    click(&client, "#settle-form button[type=submit]").await;
    wait_text(&client, "#settle-error", "has no content").await;
    js(
        &client,
        "document.getElementById('settle-status').value = ''; \
         document.getElementById('settle-body').value = ''; return null;",
    )
    .await;
    assert_eq!(gw.operation("order-older").await["state"], "unknown");

    // Settle it as completed with a reference; the confirmation says what
    // the retry will get, before anything is stored.
    type_into(&client, "#settle-reference", "T-42").await;
    screenshot(&client, "operation").await;
    click(&client, "#settle-form button[type=submit]").await;
    let confirm = wait_text(&client, "#confirm-text", "next retry").await;
    assert!(
        confirm.contains("order-older")
            && confirm.contains("status 200")
            && confirm.contains("T-42")
            && confirm.contains("nothing is sent upstream"),
        "{confirm}"
    );
    assert_eq!(gw.operation("order-older").await["state"], "unknown");
    screenshot(&client, "confirm").await;
    click(&client, "#confirm-ok").await;
    wait_text(&client, "#settle-result", "Settled as completed").await;
    wait_text(&client, "#operation-facts", "completed").await;
    wait_text(&client, "#timeline", "Resolved by an operator").await;

    // The client's retry through the proxy gets the replay; nothing sent.
    let retry = write(gw.addr(), "/drop", Some("order-older"), ORDER).await;
    assert_eq!(
        retry.status,
        200,
        "{:?}",
        String::from_utf8_lossy(&retry.body)
    );
    assert_eq!(retry.header("idempotent-replayed"), Some("true"));
    assert_eq!(
        retry.json(),
        json!({ "resolved_by": "ann", "reference": "T-42" })
    );
    assert_eq!(
        gw.upstream.writes(),
        writes_before,
        "the retry sent nothing"
    );

    // The newer one: another operator settles it while this one is
    // confirming; this one's settle is refused and the page says so.
    client
        .goto(&format!("{url}#/op/{raced}"))
        .await
        .expect("open");
    wait_text(&client, "#operation-title", "order-newer").await;
    type_into(&client, "#settle-operator", "ann").await;
    click(&client, "#settle-form input[value=not_attempted]").await;
    click(&client, "#settle-form button[type=submit]").await;
    let confirm = wait_text(&client, "#confirm-text", "sent to the upstream again").await;
    assert!(confirm.contains("attempt 2"), "{confirm}");
    gw.resolved(
        &raced,
        &json!({"outcome": "completed", "operator": "bob", "reference": "T-7"}),
    )
    .await;
    click(&client, "#confirm-ok").await;
    let conflict = wait_text(&client, "#settle-result", "409").await;
    assert!(
        conflict.contains("Not settled") && conflict.contains("another operator"),
        "{conflict}"
    );
    wait_text(&client, "#operation-facts", "completed").await;
    screenshot(&client, "conflict").await;
    let op = gw.operation("order-newer").await;
    assert_eq!(op["state"], "completed", "bob's settlement stands");

    client.close().await.expect("close");
}

/// A page read at attempt 1 settles nothing once a retry has moved the
/// operation on: another operator releases attempt 1, the client's retry
/// is lost again as attempt 2, and this page's `not_attempted` (decided on
/// attempt 1) is refused, the page saying so and showing attempt 2; the
/// next retry is not sent a third time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs chromium and chromedriver (.ci/run runs it)"]
async fn a_settle_decided_on_a_stale_page_is_refused() {
    let driver = driver();
    let (gw, url) = console_gateway_with(Setup::route("late_window = \"1ms\"")).await;
    let id = lose(&gw, "stale-page").await;
    let client = signed_in(&driver, &gw, &url, "1 held operation").await;
    client.goto(&format!("{url}#/op/{id}")).await.expect("open");
    wait_text(&client, "#operation-facts", "unknown").await;

    gw.resolved(&id, &json!({"outcome": "not_attempted", "operator": "bob"}))
        .await;
    let lost = write(gw.addr(), "/drop", Some("stale-page"), ORDER).await;
    lost.assert_operation_problem(502, "outcome-unknown", "unknown");
    let writes = gw.upstream.writes();

    type_into(&client, "#settle-operator", "ann").await;
    click(&client, "#settle-form input[value=not_attempted]").await;
    click(&client, "#settle-form button[type=submit]").await;
    wait_text(&client, "#confirm-text", "as attempt 2").await;
    click(&client, "#confirm-ok").await;
    let refused = wait_text(&client, "#settle-result", "409").await;
    assert!(
        refused.contains("moved on") && refused.contains("attempt 2"),
        "{refused}"
    );
    let op = gw.operation("stale-page").await;
    assert_eq!(
        (&op["state"], &op["attempts"]),
        (&json!("unknown"), &json!(2))
    );
    let held = write(gw.addr(), "/drop", Some("stale-page"), ORDER).await;
    held.assert_operation_problem(409, "outcome-unknown", "unknown");
    assert_eq!(gw.upstream.writes(), writes, "attempt 3 never sent");

    client.close().await.expect("close");
}

/// A refused settle says why, by the API's problem: within the route's
/// late window, when `not_attempted` will be taken and that `completed`
/// is taken now (not "someone else settled it"); for an operation in
/// flight with its gateway alive, the state it is in and that only one
/// whose gateway died can be settled, which the form says beforehand.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs chromium and chromedriver (.ci/run runs it)"]
async fn a_refused_settle_says_why() {
    let driver = driver();
    let (gw, url) = console_gateway_with(Setup::route("late_window = \"1h\"")).await;
    let id = lose(&gw, "early").await;
    let client = signed_in(&driver, &gw, &url, "1 held operation").await;
    client.goto(&format!("{url}#/op/{id}")).await.expect("open");
    wait_text(&client, "#operation-facts", "unknown").await;
    type_into(&client, "#settle-operator", "ann").await;
    click(&client, "#settle-form input[value=not_attempted]").await;
    click(&client, "#settle-form button[type=submit]").await;
    wait_text(&client, "#confirm-text", "attempt 2").await;
    click(&client, "#confirm-ok").await;
    let early = wait_text(&client, "#settle-result", "409").await;
    assert!(
        early.contains("may still land")
            && early.contains("in about")
            && early.contains("completed is taken now")
            && !early.contains("another operator"),
        "{early}"
    );
    assert_eq!(gw.operation("early").await["state"], "unknown");

    let addr = gw.addr();
    let in_flight =
        tokio::spawn(async move { write(addr, "/slow?ms=4000", Some("flying"), ORDER).await });
    gw.upstream.wait_for_writes(2).await;
    let flying = gw.operation("flying").await;
    let flying = flying["id"].as_str().expect("id").to_owned();
    client
        .goto(&format!("{url}#/op/{flying}"))
        .await
        .expect("open");
    wait_text(&client, "#operation-facts", "in_progress").await;
    wait_text(&client, "#settle-in-flight", "only if its gateway died").await;
    type_into(&client, "#settle-operator", "ann").await;
    click(&client, "#settle-form input[value=completed]").await;
    click(&client, "#settle-form button[type=submit]").await;
    wait_text(&client, "#confirm-text", "next retry").await;
    click(&client, "#confirm-ok").await;
    let live = wait_text(&client, "#settle-result", "409").await;
    assert!(
        live.contains("in_progress") && live.contains("gateway is alive"),
        "{live}"
    );
    in_flight.await.expect("the write finishes");

    client.close().await.expect("close");
}

/// An operation that cannot be read leaves nothing of the one shown
/// before under its address: no facts, no timeline, no settle form that
/// would settle the other one; the error is said.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs chromium and chromedriver (.ci/run runs it)"]
async fn a_failed_open_shows_nothing_of_the_previous_operation() {
    let driver = driver();
    let (gw, url) = console_gateway().await;
    let id = lose(&gw, "shown-first").await;
    let client = signed_in(&driver, &gw, &url, "1 held operation").await;
    client.goto(&format!("{url}#/op/{id}")).await.expect("open");
    wait_text(&client, "#operation-facts", "shown-first").await;

    let missing = "00000000-0000-7000-8000-000000000000";
    client
        .goto(&format!("{url}#/op/{missing}"))
        .await
        .expect("open");
    wait_text(&client, "#notice", "no such operation").await;
    let left = js(
        &client,
        "return [document.getElementById('operation-facts').textContent,
                 document.getElementById('timeline').textContent,
                 document.getElementById('settle').hidden,
                 document.getElementById('operation-title').textContent];",
    )
    .await;
    assert_eq!(left, json!(["", "", true, "Operation"]), "{left}");

    client.close().await.expect("close");
}

/// The settle form belongs to the operation shown: what was typed for
/// one (outcome, reference, note, status, body) is gone when another is
/// shown, the operator's name kept; the confirmation quotes the body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs chromium and chromedriver (.ci/run runs it)"]
async fn the_settle_form_starts_empty_for_each_operation() {
    let driver = driver();
    let (gw, url) = console_gateway().await;
    let first = lose(&gw, "form-first").await;
    let second = lose(&gw, "form-second").await;
    let client = signed_in(&driver, &gw, &url, "2 held operations").await;
    client
        .goto(&format!("{url}#/op/{first}"))
        .await
        .expect("open");
    wait_text(&client, "#operation-title", "form-first").await;
    type_into(&client, "#settle-operator", "ann").await;
    type_into(&client, "#settle-reference", "T-1").await;
    type_into(&client, "#settle-note", "seen").await;
    type_into(&client, "#settle-status", "201").await;
    type_into(&client, "#settle-body", r#"{"id":"first-1"}"#).await;
    click(&client, "#settle-form button[type=submit]").await;
    wait_text(&client, "#confirm-text", r#"“{"id":"first-1"}”"#).await;
    click(&client, "#confirm-cancel").await;
    click(&client, "#settle-form input[value=not_attempted]").await;

    client
        .goto(&format!("{url}#/op/{second}"))
        .await
        .expect("open");
    wait_text(&client, "#operation-title", "form-second").await;
    let form = js(
        &client,
        "return ['settle-operator', 'settle-reference', 'settle-note', 'settle-status', 'settle-body']
                  .map((id) => document.getElementById(id).value)
                  .concat([document.querySelector('input[name=outcome]:checked').value]);",
    )
    .await;
    assert_eq!(form, json!(["ann", "", "", "", "", "completed"]), "{form}");

    client.close().await.expect("close");
}

/// A settle whose answer is lost may have been taken: the page says so
/// rather than "Not settled", and shows the operation read again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs chromium and chromedriver (.ci/run runs it)"]
async fn a_settle_without_an_answer_may_have_been_taken() {
    let driver = driver();
    let (gw, url) = console_gateway().await;
    let id = lose(&gw, "lost-answer").await;
    let client = signed_in(&driver, &gw, &url, "1 held operation").await;
    client.goto(&format!("{url}#/op/{id}")).await.expect("open");
    wait_text(&client, "#operation-facts", "unknown").await;
    // The POST arrives and is taken; its answer never reaches the page.
    js(
        &client,
        "const sent = window.fetch;
         window.fetch = async (url, init) => {
           if (init && init.method === 'POST') {
             await sent(url, init);
             throw new TypeError('the connection was reset');
           }
           return sent(url, init);
         };
         return null;",
    )
    .await;
    type_into(&client, "#settle-operator", "ann").await;
    click(&client, "#settle-form button[type=submit]").await;
    wait_text(&client, "#confirm-text", "next retry").await;
    click(&client, "#confirm-ok").await;
    let said = wait_text(&client, "#settle-result", "No answer").await;
    assert!(
        said.contains("may or may not be settled")
            && said.contains("completed now")
            && !said.contains("Not settled"),
        "{said}"
    );
    wait_text(&client, "#operation-facts", "completed").await;

    client.close().await.expect("close");
}

/// A route a probe paused (it found a write twice at the destination) is
/// shown as paused by the probe, not by an operator. The API's answer is
/// rewritten in the page: a probe's finding is `probe_verdicts`' to make.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs chromium and chromedriver (.ci/run runs it)"]
async fn a_route_a_probe_paused_is_shown_as_paused_by_the_probe() {
    let driver = driver();
    let (gw, url) = console_gateway().await;
    let client = signed_in(&driver, &gw, &url, "No held operations").await;
    js(
        &client,
        "const sent = window.fetch;
         window.fetch = async (url, init) => {
           const answer = await sent(url, init);
           if (!String(url).startsWith('/admin/stats')) return answer;
           const stats = await answer.json();
           Object.assign(stats.routes[0], {
             paused: true, paused_by: 'probe', reason: 'order-1 found twice',
           });
           return new Response(JSON.stringify(stats), { status: 200 });
         };
         return null;",
    )
    .await;
    click(&client, "#nav-routes").await;
    let why = wait_text(&client, "#routes", "found twice").await;
    assert!(why.contains("probe") && !why.contains("operator"), "{why}");

    client.close().await.expect("close");
}

/// A held MCP tool call is settled with a tool result: the form offers
/// its text, structured content and isError (no HTTP status or body), the
/// confirmation quotes it, and the agent's retry gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs chromium and chromedriver (.ci/run runs it)"]
async fn a_held_tool_call_is_settled_with_a_tool_result() {
    let driver = driver();
    let (gw, url) = console_gateway_with(Setup::route("profile = \"mcp\"").at("/drop")).await;
    let call = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"create_task","arguments":{"title":"t"}}}"#;
    let headers = [
        ("content-type", "application/json"),
        ("accept", "application/json, text/event-stream"),
        ("authorization", ALICE),
        ("mcp-protocol-version", "2025-11-25"),
    ];
    send(gw.addr(), "POST", "/drop", &headers, call.to_string()).await;
    let held = gw
        .admin("GET", "/admin/keys?state=unknown", "")
        .await
        .json();
    let id = held["items"][0]["id"].as_str().expect("held").to_owned();

    let client = signed_in(&driver, &gw, &url, "1 held operation").await;
    client.goto(&format!("{url}#/op/{id}")).await.expect("open");
    wait_text(&client, "#operation-facts", "unknown").await;
    let hidden = js(
        &client,
        "return [document.getElementById('settle-response').hidden,
                 document.getElementById('settle-tool-result').hidden];",
    )
    .await;
    assert_eq!(
        hidden,
        json!([true, false]),
        "tool result offered, not an HTTP response"
    );
    type_into(&client, "#settle-operator", "ann").await;
    type_into(&client, "#settle-tool-text", "created task 42").await;
    // An id no double holds: sent and kept as typed, not parsed and
    // written again.
    type_into(
        &client,
        "#settle-tool-structured",
        r#"{"id": 42, "ref": 1790000000000000123}"#,
    )
    .await;
    click(&client, "#settle-form button[type=submit]").await;
    wait_text(
        &client,
        "#confirm-text",
        "tool result “created task 42” (isError: false) with its structured content",
    )
    .await;
    click(&client, "#confirm-ok").await;
    wait_text(&client, "#settle-result", "Settled as completed").await;

    let retry = send(gw.addr(), "POST", "/drop", &headers, call.to_string()).await;
    assert_eq!(retry.status, 200);
    let text = String::from_utf8_lossy(&retry.body);
    assert!(
        text.contains("created task 42")
            && text.contains("\"isError\":false")
            && text.contains(r#""structuredContent":{"id": 42, "ref": 1790000000000000123}"#),
        "{text}"
    );

    client.close().await.expect("close");
}

/// The body an operator types is replayed as typed: one that parses as
/// JSON byte for byte, as `application/json` — a JSON string with its
/// quotes, `null`, and an object whose keys are out of order and whose
/// number no double holds, none of which the API would store as that text
/// if sent as a JSON value — and one that does not as text, with no type.
/// The confirmation says which.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs chromium and chromedriver (.ci/run runs it)"]
async fn a_typed_body_is_replayed_as_typed_json_or_text() {
    let driver = driver();
    let (gw, url) = console_gateway().await;
    let json = Some("application/json");
    let cases = [
        ("body-string", r#""hello""#, json, "as JSON"),
        ("body-null", "null", json, "as JSON"),
        (
            "body-object",
            r#"{"b": 1, "a": 12345678901234567890}"#,
            json,
            "as JSON",
        ),
        ("body-text", "hello", None, "as text"),
    ];
    let mut ids = Vec::new();
    for (key, ..) in cases {
        ids.push(lose(&gw, key).await);
    }
    let writes_before = gw.upstream.writes();

    let client = signed_in(&driver, &gw, &url, "4 held operations").await;
    for ((key, typed, content_type, kind), id) in cases.into_iter().zip(&ids) {
        client.goto(&format!("{url}#/op/{id}")).await.expect("open");
        wait_text(&client, "#operation-title", key).await;
        type_into(&client, "#settle-operator", "ann").await;
        type_into(&client, "#settle-status", "201").await;
        type_into(&client, "#settle-body", typed).await;
        click(&client, "#settle-form button[type=submit]").await;
        let confirm = wait_text(&client, "#confirm-text", "next retry").await;
        click(&client, "#confirm-ok").await;
        wait_text(&client, "#settle-result", "Settled as completed").await;

        let retry = write(gw.addr(), "/drop", Some(key), ORDER).await;
        assert_eq!(retry.status, 201, "{key}");
        assert_eq!(retry.header("idempotent-replayed"), Some("true"), "{key}");
        assert_eq!(
            String::from_utf8_lossy(&retry.body),
            typed,
            "{key}: the replay is the body typed"
        );
        assert_eq!(retry.header("content-type"), content_type, "{key}");
        assert!(
            confirm.contains("status 201") && confirm.contains(kind),
            "{key}: {confirm}"
        );
    }
    assert_eq!(
        gw.upstream.writes(),
        writes_before,
        "the retries sent nothing"
    );

    client.close().await.expect("close");
}

/// The keys of the rows the list shows now.
async fn listed_keys(client: &Client) -> Vec<String> {
    let keys = js(
        client,
        "return [...document.querySelectorAll('#operations tbody a.key')].map((a) => a.textContent);",
    )
    .await;
    serde_json::from_value(keys).expect("keys")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs chromium and chromedriver (.ci/run runs it)"]
async fn held_work_pages_oldest_first_and_other_states_page_by_cursor() {
    let driver = driver();
    let (gw, url) = console_gateway().await;
    for n in 0..23 {
        lose(&gw, &format!("held-{n:02}")).await;
    }
    for n in 0..21 {
        let done = write(gw.addr(), "/orders", Some(&format!("done-{n:02}")), ORDER).await;
        assert_eq!(done.status, 201);
    }

    let client = browser(&driver, 1280).await;
    client.goto(&url).await.expect("open");
    sign_in_by_keyboard(&client, gw.admin_token()).await;
    wait_text(
        &client,
        "#list-summary",
        "23 held operations, oldest first; showing 1–20",
    )
    .await;
    let first: Vec<String> = (0..20).map(|n| format!("held-{n:02}")).collect();
    assert_eq!(listed_keys(&client).await, first);
    click(&client, "#page-next").await;
    wait_text(&client, "#list-summary", "showing 21–23").await;
    assert_eq!(
        listed_keys(&client).await,
        ["held-20", "held-21", "held-22"]
    );
    let next = client.find(Locator::Id("page-next")).await.expect("next");
    assert_eq!(
        next.prop("disabled").await.expect("disabled").as_deref(),
        Some("true")
    );

    // Another state: the API's order (newest first), page by page through
    // its cursor, and back.
    client
        .find(Locator::Id("filter-state"))
        .await
        .expect("state")
        .select_by_value("completed")
        .await
        .expect("select");
    click(&client, "#filter-form button[type=submit]").await;
    wait_text(
        &client,
        "#list-summary",
        "Newest first; page 1, 20 operations",
    )
    .await;
    assert_eq!(
        listed_keys(&client).await.first().map(String::as_str),
        Some("done-20")
    );
    click(&client, "#page-next").await;
    wait_text(&client, "#list-summary", "page 2, 1 operation.").await;
    assert_eq!(listed_keys(&client).await, ["done-00"]);
    click(&client, "#page-previous").await;
    wait_text(&client, "#list-summary", "page 1, 20 operations").await;

    // Filters by route and key.
    client
        .find(Locator::Id("filter-state"))
        .await
        .expect("state")
        .select_by_value("unknown")
        .await
        .expect("select");
    type_into(&client, "#filter-route", "api").await;
    type_into(&client, "#filter-key", "held-07").await;
    click(&client, "#filter-form button[type=submit]").await;
    wait_text(&client, "#list-summary", "1 held operation,").await;
    assert_eq!(listed_keys(&client).await, ["held-07"]);
    type_into(&client, "#filter-route", "elsewhere").await;
    click(&client, "#filter-form button[type=submit]").await;
    wait_text(&client, "#list-summary", "No held operations").await;
    client.close().await.expect("close");
}

/// More held operations on one route than the console reads: the list
/// says that only the newest were read and gives the command that lists
/// the older ones, from where reading stopped; filtered by that route, it
/// no longer advises filtering by route (which reached nothing more).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs chromium and chromedriver (.ci/run runs it)"]
async fn past_what_the_console_reads_it_says_how_to_list_the_older_held_work() {
    let driver = driver();
    let (gw, url) = console_gateway_with(Setup::route("pause_after_unknown = 0")).await;
    let oldest = lose(&gw, "held-00000").await;
    // The console reads 10,000 held operations at most.
    let addr = gw.addr();
    let mut writes = tokio::task::JoinSet::new();
    for n in 1..=10_000 {
        if writes.len() == 8 {
            assert_eq!(
                writes.join_next().await.expect("a write").expect("ran"),
                502
            );
        }
        writes.spawn(async move {
            let key = format!("held-{n:05}");
            write(addr, "/drop", Some(&key), ORDER).await.status
        });
    }
    while let Some(status) = writes.join_next().await {
        assert_eq!(status.expect("ran"), 502);
    }

    let client = signed_in(&driver, &gw, &url, "10000 held operations").await;
    let summary = wait_text(&client, "#list-summary", "Only the newest 10000").await;
    assert!(summary.contains("filtering by route or key"), "{summary}");
    type_into(&client, "#filter-route", "api").await;
    click(&client, "#filter-form button[type=submit]").await;
    let summary = wait_text(&client, "#list-summary", "--route api --cursor").await;
    assert!(!summary.contains("filtering by"), "{summary}");
    let command = summary
        .split("the older ones are listed by: ")
        .nth(1)
        .and_then(|c| c.strip_suffix('.'))
        .unwrap_or_else(|| panic!("no command: {summary}"));
    let cursor = command
        .strip_prefix("idemgate keys list --state unknown --route api --cursor ")
        .unwrap_or_else(|| panic!("{command}"));
    let older = gw
        .admin(
            "GET",
            &format!("/admin/keys?state=unknown&route=api&cursor={cursor}"),
            "",
        )
        .await
        .json();
    assert_eq!(older["items"][0]["id"], oldest.as_str(), "{older}");
    assert_eq!(older["items"][1], Value::Null, "{older}");
    client.close().await.expect("close");
}

/// "Back to the list" returns to the page left; "Held work" shows held
/// work, unfiltered, from its first page, even after another state was
/// chosen (the address unchanged).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs chromium and chromedriver (.ci/run runs it)"]
async fn held_work_is_held_work_and_back_is_where_the_list_was() {
    let driver = driver();
    let (gw, url) = console_gateway().await;
    for n in 0..21 {
        lose(&gw, &format!("held-{n:02}")).await;
    }
    let done = write(gw.addr(), "/orders", Some("done-00"), ORDER).await;
    assert_eq!(done.status, 201);

    let client = signed_in(&driver, &gw, &url, "showing 1–20").await;
    click(&client, "#page-next").await;
    wait_text(&client, "#list-summary", "showing 21–21").await;
    click(&client, "#operations a.key").await;
    wait_text(&client, "#operation-title", "held-20").await;
    click(&client, "#back").await;
    wait_text(&client, "#list-summary", "showing 21–21").await;
    assert_eq!(listed_keys(&client).await, ["held-20"]);

    client
        .find(Locator::Id("filter-state"))
        .await
        .expect("state")
        .select_by_value("completed")
        .await
        .expect("select");
    click(&client, "#filter-form button[type=submit]").await;
    wait_text(&client, "#list-summary", "page 1, 1 operation.").await;
    click(&client, "#nav-held").await;
    wait_text(&client, "#list-summary", "21 held operations").await;
    wait_text(&client, "#list-summary", "showing 1–20").await;
    wait_text(&client, "#list-title", "Held work").await;
    let state = js(
        &client,
        "return document.getElementById('filter-state').value;",
    )
    .await;
    assert_eq!(state, json!("unknown"));

    client.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs chromium and chromedriver (.ci/run runs it)"]
async fn an_operator_pauses_and_resumes_a_route_and_counts_refresh() {
    let driver = driver();
    let (gw, url) = console_gateway().await;
    lose(&gw, "lost-1").await;

    let client = browser(&driver, 1280).await;
    client.goto(&format!("{url}#/routes")).await.expect("open");
    sign_in_by_keyboard(&client, gw.admin_token()).await;
    let row = wait_text(&client, "#routes tbody tr", "Not paused").await;
    assert!(row.contains("api"), "{row}");

    // Counts refresh on their own: a write made now shows up unasked.
    let done = write(gw.addr(), "/orders", Some("fresh-1"), ORDER).await;
    assert_eq!(done.status, 201);
    wait_text(&client, "#routes tbody td[data-label=completed]", "1").await;

    type_into(&client, "#pause-reason", "upstream incident").await;
    click(&client, "#pause-button").await;
    wait_text(&client, "#pause-result", "is paused: upstream incident").await;
    let row = wait_text(&client, "#routes tbody tr", "Paused").await;
    assert!(row.contains("operator: upstream incident"), "{row}");
    screenshot(&client, "routes").await;
    let refused = write(gw.addr(), "/orders", Some("fresh-2"), ORDER).await;
    refused.assert_problem(503, "route-paused");

    click(&client, "#resume-button").await;
    wait_text(&client, "#pause-result", "is resumed").await;
    wait_text(&client, "#routes tbody tr", "Not paused").await;
    let sent = write(gw.addr(), "/orders", Some("fresh-2"), ORDER).await;
    assert_eq!(sent.status, 201);

    client.close().await.expect("close");
}

/// The text of each option `#pause-route` offers.
async fn route_choices(client: &Client) -> Value {
    js(
        client,
        "return [...document.querySelectorAll('#pause-route option')].map((o) => o.textContent);",
    )
    .await
}

/// A route paused and then renamed stays paused in the store: the Routes
/// page lists its old name, marked no longer configured, with the pause
/// and its operations' counts, and offers to resume it, not to pause it.
/// A reason typed before Resume is refused on the page, as the API would,
/// rather than dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs chromium and chromedriver (.ci/run runs it)"]
async fn a_paused_route_no_longer_configured_is_listed_and_resumed() {
    let driver = driver();
    let (mut gw, _) = console_gateway().await;
    lose(&gw, "lost-before-the-rename").await;
    let paused = gw
        .admin(
            "POST",
            "/admin/routes/api/pause",
            r#"{"reason": "incident 7"}"#,
        )
        .await;
    assert_eq!(paused.status, 200);
    gw.shutdown().await;
    gw.toml = gw.toml.replace("name = \"api\"", "name = \"api-v2\"");
    gw.accept_route_changes = true;
    gw.start_again().await;
    let url = format!("http://{}/", gw.admin_addr());

    let client = browser(&driver, 1280).await;
    client.goto(&format!("{url}#/routes")).await.expect("open");
    sign_in_by_keyboard(&client, gw.admin_token()).await;
    let old = "#routes tbody tr:nth-child(2)";
    let row = wait_text(&client, old, "no longer configured").await;
    assert!(row.contains("operator: incident 7"), "{row}");
    wait_text(&client, &format!("{old} td[data-label=Route]"), "api").await;
    wait_text(&client, &format!("{old} td[data-label=Pause]"), "Paused").await;
    wait_text(&client, &format!("{old} td[data-label=unknown]"), "1").await;
    // Like every other time on the console, in UTC.
    let summary = wait_text(&client, "#routes-summary", "last read").await;
    assert!(summary.ends_with(" UTC."), "{summary}");
    assert_eq!(
        route_choices(&client).await,
        json!(["api-v2", "api (paused; no longer configured: resume only)"])
    );
    screenshot(&client, "routes-no-longer-configured").await;

    let choice = client
        .find(Locator::Id("pause-route"))
        .await
        .expect("route");
    choice.select_by_value("api").await.expect("select");
    let pause = client
        .find(Locator::Id("pause-button"))
        .await
        .expect("pause");
    assert_eq!(
        pause.prop("disabled").await.expect("disabled").as_deref(),
        Some("true"),
        "a route no longer configured cannot be paused"
    );
    // A reason is for a pause: typed before Resume, it is not sent.
    type_into(&client, "#pause-reason", "all clear").await;
    click(&client, "#resume-button").await;
    wait_text(&client, "#pause-result", "a resume takes no reason").await;
    assert_eq!(
        gw.admin("GET", "/admin/stats", "").await.json()["paused_routes"],
        json!(["api"])
    );
    type_into(&client, "#pause-reason", "").await;
    click(&client, "#resume-button").await;
    wait_text(&client, "#pause-result", "Route api is resumed").await;
    let stats = gw.admin("GET", "/admin/stats", "").await.json();
    assert_eq!(stats["paused_routes"], json!([]), "{stats}");
    // Its operations are still counted under its old name.
    wait_text(
        &client,
        &format!("{old} td[data-label=Pause]"),
        "Not paused",
    )
    .await;
    wait_text(&client, old, "no longer configured").await;
    wait_text(&client, &format!("{old} td[data-label=unknown]"), "1").await;
    assert_eq!(route_choices(&client).await, json!(["api-v2"]));

    client.close().await.expect("close");
}

/// Signing out empties the page, not only hides it: nothing of the
/// operation shown (its facts, timeline, the settle form's text), the
/// list or the routes is left in the document.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs chromium and chromedriver (.ci/run runs it)"]
async fn signing_out_leaves_no_operation_data_in_the_page() {
    let driver = driver();
    let (gw, url) = console_gateway().await;
    let id = lose(&gw, "order-of-a-customer").await;
    let client = signed_in(&driver, &gw, &url, "1 held operation").await;
    type_into(&client, "#filter-key", "order-of-a-customer").await;
    client
        .goto(&format!("{url}#/routes"))
        .await
        .expect("routes");
    wait_text(&client, "#routes tbody tr", "Not paused").await;
    client.goto(&format!("{url}#/op/{id}")).await.expect("open");
    wait_text(&client, "#timeline", "Sent upstream").await;
    wait_text(&client, "#operation-facts", "POST /drop").await;
    type_into(&client, "#settle-note", "phoned the customer").await;

    click(&client, "#sign-out").await;
    wait_text(&client, "#notice", "Signed out").await;
    let left = js(
        &client,
        "return document.getElementById('main').textContent + ' ' +
           [...document.querySelectorAll('input, textarea, select')].map((f) => f.value).join(' ');",
    )
    .await;
    let left = left.as_str().expect("text");
    for data in [
        "order-of-a-customer",
        id.as_str(),
        "POST /drop",
        "Sent upstream",
        "phoned the customer",
        "Not paused",
        "held operation",
    ] {
        assert!(!left.contains(data), "{data:?} is left in the page: {left}");
    }
    client.close().await.expect("close");
}

/// Signing out while the held-work list was still reading its rows'
/// details left the rows (keys, routes, states) written into the page
/// once the details came: each failed detail was only "no detail".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs chromium and chromedriver (.ci/run runs it)"]
async fn signing_out_while_the_list_loads_leaves_no_rows() {
    let driver = driver();
    let (gw, url) = console_gateway().await;
    lose(&gw, "order-in-flight").await;
    let client = signed_in(&driver, &gw, &url, "1 held operation").await;
    // The rows' details wait for the test: the list is loading.
    js(
        &client,
        "window.heldDetails = [];
         const original = window.fetch;
         window.fetch = (path, init) => String(path).includes('?body=omit')
           ? new Promise((answer) => window.heldDetails.push(() => answer(original(path, init))))
           : original(path, init);
         return null;",
    )
    .await;
    click(&client, "#nav-held").await;
    let deadline = Instant::now() + WAIT;
    while js(&client, "return window.heldDetails.length;").await != json!(1) {
        assert!(Instant::now() < deadline, "the list never asked a detail");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    click(&client, "#sign-out").await;
    wait_text(&client, "#notice", "Signed out").await;
    // The details come now, and the list's work ends.
    let rows = client
        .execute_async(
            "const done = arguments[arguments.length - 1];
             window.heldDetails.forEach((release) => release());
             setTimeout(() => done(document.querySelectorAll('#operations tbody tr').length
               + ' ' + document.getElementById('main').textContent.includes('order-in-flight')), 500);",
            vec![],
        )
        .await
        .expect("script");
    assert_eq!(rows, json!("0 false"), "rows written after signing out");
    client.close().await.expect("close");
}

/// With JavaScript off, the page says that the console needs it and what
/// else does the work, rather than show its title alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs chromium and chromedriver (.ci/run runs it)"]
async fn without_javascript_the_page_says_it_needs_it() {
    let driver = driver();
    let (_gw, url) = console_gateway().await;
    let off = json!({ "profile.managed_default_content_settings.javascript": 2 });
    let client = browser_with(&driver, 1280, off).await;
    client.goto(&url).await.expect("open");
    let said = wait_text(&client, "#main", "needs JavaScript").await;
    assert!(said.contains("idemgate keys"), "{said}");
    screenshot(&client, "no-javascript").await;
    client.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs chromium and chromedriver (.ci/run runs it)"]
async fn without_a_configured_token_the_console_says_what_to_set() {
    let driver = driver();
    let variable = format!("IDEMGATE_TEST_UNSET_{}", uuid::Uuid::now_v7().simple());
    let setup = Setup::route("").server(&format!("admin_token_env = \"{variable}\""));
    let gw = spawn_gateway_with(setup).await;

    let client = browser(&driver, 1280).await;
    client
        .goto(&format!("http://{}/", gw.admin_addr()))
        .await
        .expect("open");
    sign_in_by_keyboard(&client, "anything").await;
    let said = wait_text(&client, "#sign-in-error", "no admin token configured").await;
    assert!(
        said.contains(&variable) && said.contains("server.admin_token_env"),
        "{said}"
    );
    client.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs chromium and chromedriver (.ci/run runs it)"]
async fn at_360_px_nothing_overflows_and_markup_in_keys_stays_text() {
    let driver = driver();
    let (gw, url) = console_gateway().await;
    // A long key with markup in it: shown as text, wrapped, never parsed.
    let key = format!("<b/id=injected>x</b>{}", "k".repeat(150));
    let id = lose(&gw, &key).await;

    let client = browser(&driver, 360).await;
    client.goto(&url).await.expect("open");
    assert_eq!(js(&client, "return window.innerWidth;").await, json!(360));
    assert_no_overflow(&client, 360, "sign-in").await;
    sign_in_by_keyboard(&client, gw.admin_token()).await;
    wait_text(&client, "#list-summary", "1 held operation").await;
    let shown = wait_text(&client, "#operations tbody a.key", "<b/id=injected>").await;
    assert_eq!(shown, key);
    assert_eq!(
        js(
            &client,
            "return document.getElementById('injected') === null;"
        )
        .await,
        json!(true),
        "the key was rendered as markup"
    );
    assert_no_overflow(&client, 360, "held work").await;
    screenshot(&client, "held-work-360").await;

    client.goto(&format!("{url}#/op/{id}")).await.expect("open");
    wait_text(&client, "#timeline", "Claimed").await;
    assert_no_overflow(&client, 360, "operation").await;
    screenshot(&client, "operation-360").await;

    client.goto(&format!("{url}#/routes")).await.expect("open");
    wait_text(&client, "#routes tbody tr", "Not paused").await;
    assert_no_overflow(&client, 360, "routes").await;
    screenshot(&client, "routes-360").await;
    client.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_is_served_with_a_strict_policy_and_no_token() {
    let (gw, _) = console_gateway().await;
    for (path, content_type) in [
        ("/", "text/html; charset=utf-8"),
        ("/console.css", "text/css; charset=utf-8"),
        ("/console.js", "text/javascript; charset=utf-8"),
    ] {
        let resp = send(gw.admin_addr(), "GET", path, &[], bytes::Bytes::new()).await;
        assert_eq!(resp.status, 200, "{path}");
        assert_eq!(resp.header("content-type"), Some(content_type), "{path}");
        let policy = resp.header("content-security-policy").unwrap_or_default();
        assert!(
            policy.contains("default-src 'self'") && !policy.contains("unsafe"),
            "{path}: {policy}"
        );
        assert_eq!(resp.header("x-content-type-options"), Some("nosniff"));
        assert_eq!(resp.header("cache-control"), Some("no-store"));
        assert!(resp.header("set-cookie").is_none());
    }
    // The page is served, the data is not: the API still wants the token.
    let data = send(
        gw.admin_addr(),
        "GET",
        "/admin/keys",
        &[],
        bytes::Bytes::new(),
    )
    .await;
    data.assert_problem(401, "unauthorized");
    let other = send(
        gw.admin_addr(),
        "GET",
        "/index.html",
        &[],
        bytes::Bytes::new(),
    )
    .await;
    assert_eq!(other.status, 404);
}
