//! The loader's answers to good and bad files, key by key.

use std::time::Duration;

use http::Method;

use std::path::Path;

use super::*;

const MINIMAL: &str = "[[routes]]\nname = \"api\"\nupstream = \"http://127.0.0.1:9\"\n";

fn error_of(text: &str) -> String {
    Config::from_toml_str(text, "test.toml")
        .unwrap_err()
        .to_string()
}

#[test]
fn defaults_are_the_documented_ones() {
    let config = Config::from_toml_str(MINIMAL, "test.toml").unwrap();
    assert_eq!(config.server.listen.to_string(), "127.0.0.1:8080");
    assert_eq!(config.server.admin_listen.to_string(), "127.0.0.1:9090");
    assert_eq!(config.store.url, StoreUrl::Sqlite("idemgate.db".into()));
    assert_eq!(config.store.durability, Durability::Full);
    assert_eq!(config.server.max_connections, 4096);
    assert_eq!(config.server.admin_max_connections, 64);
    assert_eq!(config.server.buffered_body_budget, 256 * 1024 * 1024);
    let route = &config.routes[0];
    assert_eq!(route.methods, vec![Method::POST, Method::PATCH]);
    assert_eq!(route.key, KeyMode::Require);
    assert_eq!(route.scope_headers, vec![http::header::AUTHORIZATION]);
    assert_eq!(
        route.forward_key_header.as_ref().map(|h| h.as_str()),
        Some("idempotency-key")
    );
    assert_eq!(route.max_body, 10 * 1024 * 1024);
    assert_eq!(route.max_stored_response, 1024 * 1024);
    assert_eq!(route.release_statuses, vec![429, 503]);
    assert_eq!(route.unknown_statuses, vec![502, 504]);
    assert_eq!(route.upstream_timeout, Duration::from_secs(30));
    assert_eq!(route.late_window, Duration::from_secs(60));
    assert_eq!(route.pause_after_unknown, 100);
    assert!(route.reconcile.is_none());
}

#[test]
fn unknown_fields_are_rejected_with_the_file() {
    let err = error_of(&format!("{MINIMAL}colour = \"blue\"\n"));
    assert!(err.starts_with("test.toml:"), "{err}");
    assert!(err.contains("colour"), "{err}");
}

#[test]
fn bad_values_name_field_and_reason() {
    let route = |line: &str| format!("{MINIMAL}{line}\n");
    let cases = [
        (
            route("max_body = \"lots\""),
            "routes[0].max_body",
            "not a size",
        ),
        (
            route("upstream_timeout = \"0s\""),
            "routes[0].upstream_timeout",
            "greater than zero",
        ),
        (route("key = \"sometimes\""), "routes[0].key", "sometimes"),
        (
            route("methods = [\"GET\"]"),
            "routes[0].methods",
            "safe method",
        ),
        (
            route("methods = [\"POST\", \"CONNECT\"]"),
            "routes[0].methods",
            "tunnel",
        ),
        (
            route("scope_headers = []"),
            "routes[0].scope_headers",
            "allow_anonymous",
        ),
        (
            route("release_statuses = [200]"),
            "routes[0].release_statuses",
            "4xx and 5xx",
        ),
        (
            route("unknown_statuses = [429]"),
            "routes[0].unknown_statuses",
            "also a release status",
        ),
        (
            route("ignore_fields = [\"nonce\"]"),
            "routes[0].ignore_fields",
            "JSON pointer",
        ),
        (
            "[server]\nlisten = \"localhost\"\n".into(),
            "server.listen",
            "IP:PORT",
        ),
        (
            format!("[server]\nmax_connections = 0\n{MINIMAL}"),
            "server.max_connections",
            "greater than zero",
        ),
        (
            format!("[server]\nhttp2_max_concurrent_streams = 0\n{MINIMAL}"),
            "server.http2_max_concurrent_streams",
            "from 1 to 10000",
        ),
        (
            format!("[server]\nhttp2_max_concurrent_streams = 10001\n{MINIMAL}"),
            "server.http2_max_concurrent_streams",
            "from 1 to 10000",
        ),
    ];
    for (file, field, reason) in cases {
        let err = error_of(&file);
        assert!(
            err.contains(&format!("field `{field}`")) && err.contains(reason),
            "{err}"
        );
    }
}

#[test]
fn values_the_gateway_cannot_run_on_are_refused() {
    // A quota window past the store's clock, a wait past an `Instant`.
    let err = error_of(&format!(
        "{MINIMAL}quota_operations = 1\nquota_window = \"300000000y\"\n"
    ));
    assert!(
        err.contains("routes[0].quota_window") && err.contains("at most 100y"),
        "{err}"
    );
    let err = error_of(&format!("{MINIMAL}wait_timeout = \"500000000000y\"\n"));
    assert!(err.contains("routes[0].wait_timeout"), "{err}");
    let config = Config::from_toml_str(
        &format!("[store]\nretention = \"100y\"\n{MINIMAL}"),
        "test.toml",
    );
    assert!(config.is_ok());
    // More connections than a semaphore holds.
    let err = error_of(&format!(
        "[server]\nadmin_max_connections = 9223372036854775807\n{MINIMAL}"
    ));
    assert!(err.contains("server.admin_max_connections"), "{err}");
}

#[test]
fn upstream_must_be_an_origin() {
    let with = |u: &str| error_of(&format!("[[routes]]\nname = \"a\"\nupstream = \"{u}\"\n"));
    assert!(with("ftp://x").contains("not http or https"));
    assert!(with("http://x/v1").contains("origin only"));
    assert!(with("http://user:pw@x").contains("credentials"));
    assert!(with("x").contains("routes[0].upstream"));
    // A port the URL cannot hold is not the scheme's default port.
    for port in ["99999", "65536", "0", ""] {
        let err = with(&format!("http://127.0.0.1:{port}"));
        assert!(err.contains("is not a port"), "{port}: {err}");
    }
    assert!(with("http://[::1]:70000").contains("is not a port"));
    // Said so, not the URL parser's "empty string".
    for hostless in ["https://", "http:///v1", "http://?x"] {
        assert!(with(hostless).contains("has no host"), "{hostless}");
    }
    let console = format!("[server]\nconsole_url = \"https://\"\n{MINIMAL}");
    let error = error_of(&console);
    assert!(
        error.contains("server.console_url") && error.contains("has no host"),
        "{error}"
    );
    let fine = |u: &str| {
        let toml = format!("[[routes]]\nname = \"a\"\nupstream = \"{u}\"\n");
        Config::from_toml_str(&toml, "t").map(|_| ())
    };
    for ok in [
        "http://127.0.0.1:65535",
        "http://[::1]:8080",
        "https://[::1]",
        "http://h",
    ] {
        assert!(fine(ok).is_ok(), "{ok}: {:?}", fine(ok).err());
    }
    let alert = format!("{MINIMAL}[[alerts]]\nurl = \"https://h.example:99999/x\"\n");
    assert!(error_of(&alert).contains("is not a port"));
}

/// The fingerprint is a bare SHA-256, kept in clear: a credential in it
/// could be confirmed from a copy of the store by hashing guesses. Warned
/// of, not refused: moving it changes the fingerprint of what is stored.
#[test]
fn a_credential_in_the_fingerprint_is_warned_of() {
    let with = |lines: &str| {
        let text = format!("[[routes]]\nname = \"a\"\nupstream = \"http://h\"\n{lines}");
        Config::from_toml_str(&text, "t").unwrap().warnings()
    };
    for credential in ["Authorization", "cookie", "x-api-key"] {
        let warnings = with(&format!("fingerprint_headers = [\"{credential}\"]\n"));
        assert_eq!(warnings.len(), 1, "{credential}");
        assert!(warnings[0].contains("a credential"), "{}", warnings[0]);
    }
    let scope =
        "scope_headers = [\"x-tenant-token\"]\nfingerprint_headers = [\"x-tenant-token\"]\n";
    assert!(with(scope)[0].contains("`x-tenant-token`, a credential"));
    assert!(with("fingerprint_headers = [\"content-type\", \"x-kind\"]\n").is_empty());
}

/// An MCP probe that asks by `{key}` believes an absence only for a call
/// whose kept body shows it carried its key: without kept bodies none is
/// believed, said at start rather than found by an operator.
#[test]
fn an_mcp_probe_reading_absence_by_an_unprovable_key_is_warned_of() {
    let with = |lines: &str, arguments: &str| {
        let text = format!(
            "[[routes]]\nname = \"a\"\nupstream = \"http://h\"\nprofile = \"mcp\"\n{lines}\
             [routes.mcp.reconcile]\ntool = \"find\"\ntools = [\"create\"]\narguments = '{arguments}'\n\
             absent_json_pointer = \"/structuredContent/tasks\"\ncount_json_pointer = \"/structuredContent/tasks\"\n"
        );
        Config::from_toml_str(&text, "t").unwrap().warnings()
    };
    let by_key = r#"{"request_id": "{key}"}"#;
    let warnings = with("", by_key);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains("store_request_body = true"),
        "{}",
        warnings[0]
    );
    assert!(with("store_request_body = true\n", by_key).is_empty());
    let destination = "destination_key_header = \"X-Request-Id\"\n";
    assert!(with(destination, r#"{"request_id": "{destination_key}"}"#).is_empty());
}

/// A probe that finds the write inside a list (Stripe's API has no
/// lookup but its lists and searches) replays that whole list to the
/// write's retries unless `result_json_pointer` says which part is the
/// write: an SDK reads it as the object it created.
#[test]
fn a_probe_reading_a_list_without_a_result_pointer_is_warned_of() {
    let with = |lines: &str| {
        let text = format!(
            "[[routes]]\nname = \"a\"\nupstream = \"http://h\"\n[routes.reconcile]\n\
             url = \"http://h/v1/customers/search?query={{key}}\"\n{lines}"
        );
        Config::from_toml_str(&text, "t").unwrap().warnings()
    };
    for lines in [
        "found_json_pointer = \"/data/0/id\"\n",
        "found_json_pointer = \"/data/0\"\n",
        "count_json_pointer = \"/data\"\n",
    ] {
        let warnings = with(lines);
        assert_eq!(warnings.len(), 1, "{lines}: {warnings:?}");
        assert!(
            warnings[0].contains("result_json_pointer"),
            "{}",
            warnings[0]
        );
        let pointed = format!("{lines}result_json_pointer = \"/data/0\"\n");
        assert!(with(&pointed).is_empty(), "{pointed}");
    }
    assert!(with("found_json_pointer = \"/id\"\n").is_empty());
    assert!(with("").is_empty());
    let text = "[[routes]]\nname = \"a\"\nupstream = \"http://h\"\n[routes.reconcile]\n\
                url = \"http://h/x/{key}\"\nresult_json_pointer = \"data\"\n";
    let error = Config::from_toml_str(text, "t").unwrap_err().to_string();
    assert!(error.contains("result_json_pointer"), "{error}");
}

/// `methods = ["PSOT"]` took the typo as an extension method and left
/// every POST unprotected, and `methods = []` protected nothing: both
/// said nothing at all.
#[test]
fn misspelled_or_no_methods_are_warned_of() {
    let with = |methods: &str| {
        let text =
            format!("[[routes]]\nname = \"a\"\nupstream = \"http://h\"\nmethods = {methods}\n");
        Config::from_toml_str(&text, "t").unwrap().warnings()
    };
    let typo = with(r#"["PSOT", "PUT"]"#);
    assert_eq!(typo.len(), 1, "{typo:?}");
    assert!(
        typo[0].contains("names PSOT (for POST), taken"),
        "{}",
        typo[0]
    );
    for (sent, meant) in [
        ("PUTT", "PUT"),
        ("PACTH", "PATCH"),
        ("DELET", "DELETE"),
        ("POTS", "POST"),
    ] {
        let warned = with(&format!(r#"["{sent}"]"#));
        assert!(
            warned[0].contains(&format!("{sent} (for {meant})")),
            "{warned:?}"
        );
    }
    assert!(with("[]")[0].contains("no write is protected"));
    // Methods that are meant: the standard ones, and extension methods.
    assert!(with(r#"["POST", "PATCH", "DELETE"]"#).is_empty());
    assert!(with(r#"["POST", "PURGE", "LINK", "MKCOL"]"#).is_empty());
}

/// Alerts link to the console at the admin listener when no console_url
/// says where operators open it: `0.0.0.0` opens nothing. Said by
/// `check-config` as by `serve` (only `serve` said it).
#[test]
fn alerts_linking_to_a_wildcard_admin_listener_are_warned_of() {
    let with = |server: &str| {
        let text = format!(
            "[server]\nadmin_listen = \"0.0.0.0:9090\"\nadmin_token_env = \"T\"\n{server}\n\
             [[alerts]]\nurl = \"http://hooks.example/x\"\n{MINIMAL}"
        );
        Config::from_toml_str(&text, "t").unwrap().warnings()
    };
    let warned = with("");
    assert!(
        warned.iter().any(|w| w.contains("server.console_url")),
        "{warned:?}"
    );
    assert!(with("console_url = \"https://ops.example/idemgate\"").is_empty());
}

#[test]
fn routes_need_unique_names_and_prefixes() {
    let twice = format!("{MINIMAL}{MINIMAL}");
    assert!(error_of(&twice).contains("used twice"));
    let cased = "[[routes]]\nname = \"a\"\nupstream = \"http://h\"\npath_prefix = \"/api\"\n\
                 [[routes]]\nname = \"b\"\nupstream = \"http://h\"\npath_prefix = \"/API\"\n";
    let error = error_of(cased);
    assert!(
        error.contains("routes[1].path_prefix") && error.contains("in another case"),
        "{error}"
    );
    // `/a` beside `/a/` took no path: `/a/…` is the longer's, `/a` is
    // refused as `/a/` read.
    let slashed = cased.replace("\"/API\"", "\"/api/\"");
    assert!(error_of(&slashed).contains("with a `/` at its end"));
    let root = "[[routes]]\nname = \"a\"\nupstream = \"http://h\"\npath_prefix = \"/\"\n\
                [[routes]]\nname = \"b\"\nupstream = \"http://h\"\npath_prefix = \"/v1/\"\n";
    assert!(Config::from_toml_str(root, "t").is_ok());
    assert!(error_of("[server]\n").contains("at least one"));
}

/// A prefix is matched against paths in normal form, so it is kept in
/// that form; one an upstream reads as another path would serve nothing
/// (each path under it refused as that path's route), so it is refused.
#[test]
fn a_prefix_is_kept_in_normal_form_and_read_alike_by_upstreams() {
    let at = |prefix: &str| {
        format!("[[routes]]\nname = \"a\"\nupstream = \"http://h\"\npath_prefix = \"{prefix}\"\n")
    };
    for (written, kept) in [
        ("/%61pi", "/api"),
        ("/a//b/", "/a/b/"),
        ("/v1/caf\u{e9}", "/v1/caf%C3%A9"),
        ("/v1/payments:charge", "/v1/payments:charge"),
    ] {
        let config = Config::from_toml_str(&at(written), "t").expect(written);
        assert_eq!(config.routes[0].path_prefix, kept, "{written}");
    }
    for (written, read) in [
        ("/v1/payments%3Acharge", "/v1/payments:charge"),
        ("/users/%40me", "/users/@me"),
        ("/a%2Fb", "/a/b"),
        ("/api;v=1", "/api"),
    ] {
        let error = error_of(&at(written));
        assert!(
            error.contains("routes[0].path_prefix") && error.contains(&format!("`{read}`")),
            "{written}: {error}"
        );
    }
    assert!(error_of(&at("/a%zz")).contains("two hex digits"));
}

#[test]
fn alerts_are_validated_with_their_defaults() {
    let alert = |lines: &str| format!("{MINIMAL}[[alerts]]\n{lines}\n");
    let config = Config::from_toml_str(&alert("url = \"https://h.example/x\""), "t").unwrap();
    let endpoint = &config.alerts[0];
    assert_eq!(endpoint.events, AlertEvent::ALL);
    assert_eq!(endpoint.aged_after, Duration::from_secs(3600));
    assert_eq!(endpoint.give_up_after, Duration::from_secs(86_400));
    assert!(endpoint.secret_env.is_none());
    assert!(error_of(&alert("events = [\"route-paused\"]")).contains("alerts[0].url"));
    assert!(error_of(&alert("url = \"ftp://h/x\"")).contains("not http or https"));
    assert!(
        error_of(&alert("url = \"https://h/x\"\nevents = [\"deleted\"]"))
            .contains("`deleted`: expected operation-unknown")
    );
    assert!(error_of(&alert("url = \"https://h/x\"\nevents = []")).contains("at least one"));
    assert!(error_of(&alert("url = \"https://h/x\"\naged_after = \"0s\"")).contains("greater"));
    assert!(
        error_of(&alert("url = \"https://h/x\"\nsecret_env = \"\""))
            .contains("environment variable")
    );
    assert!(error_of(&alert("url = \"https://h/x\"\nretries = 3")).contains("unknown field"));
}

#[test]
fn store_keys_are_named_by_variables() {
    let with = |lines: &str| format!("[store]\n{lines}{MINIMAL}");
    let store = Config::from_toml_str(
        &with("encryption_key_env = \"K1\"\nprevious_key_env = \"K0\"\n"),
        "t",
    )
    .unwrap()
    .store;
    assert_eq!(store.encryption_key_env.as_deref(), Some("K1"));
    assert_eq!(store.previous_key_env.as_deref(), Some("K0"));
    assert!(error_of(&with("previous_key_env = \"K0\"\n")).contains("only with"));
    assert!(error_of(&with("encryption_key_env = \"\"\n")).contains("environment variable"));
    let same = with("encryption_key_env = \"K\"\nprevious_key_env = \"K\"\n");
    assert!(error_of(&same).contains("same variable"));
    // One key for scopes and sealing: rotating it would change both.
    for (sealing, field) in [
        ("encryption_key_env = \"K\"\n", "encryption_key_env"),
        (
            "encryption_key_env = \"J\"\nprevious_key_env = \"K\"\n",
            "previous_key_env",
        ),
    ] {
        let error = error_of(&with(&format!("{sealing}scope_key_env = \"K\"\n")));
        assert!(
            error.contains(&format!(
                "`store.{field}`: names K, the variable the scope key"
            )) && error.contains("move the same value"),
            "{error}"
        );
    }
    // A shared store's default variable too.
    let postgres = "url = \"postgres://db/test\"\nencryption_key_env = \"IDEMGATE_SCOPE_KEY\"\n";
    let error = error_of(&with(postgres));
    assert!(
        error.contains("names IDEMGATE_SCOPE_KEY, the variable the scope key is read from"),
        "{error}"
    );
}

#[test]
fn tls_files_come_in_pairs_only_for_https_and_are_named_not_read() {
    let err = error_of(&format!("[server]\ntls_cert = \"c.pem\"\n{MINIMAL}"));
    assert!(
        err.contains("`server.tls_key`: is required with `server.tls_cert`"),
        "{err}"
    );
    let err = error_of(&format!("[server]\nadmin_tls_key = \"k.pem\"\n{MINIMAL}"));
    assert!(
        err.contains("`server.admin_tls_cert`: is required"),
        "{err}"
    );
    let err = error_of(&format!("{MINIMAL}upstream_ca = \"ca.pem\"\n"));
    assert!(
        err.contains("routes[0].upstream_ca") && err.contains("only for an https://"),
        "{err}"
    );
    let https = "[[routes]]\nname = \"api\"\nupstream = \"https://127.0.0.1:9\"\n";
    // Named, not read: a missing file is refused at start (tls::read).
    let ca = format!("{https}upstream_ca = \"/nonexistent/ca.pem\"\n");
    let route = &Config::from_toml_str(&ca, "t").unwrap().routes[0];
    assert_eq!(
        route.upstream_tls.ca.as_deref(),
        Some(Path::new("/nonexistent/ca.pem"))
    );
    let err = error_of(&format!("{https}upstream_client_cert = \"c.pem\"\n"));
    assert!(err.contains("routes[0].upstream_client_key"), "{err}");
}

#[test]
fn derive_and_wait_values_are_checked() {
    assert!(error_of(&format!("{MINIMAL}derive_from = [\"/id\"]\n")).contains("only with key"));
    assert!(error_of(&format!("{MINIMAL}in_progress = \"later\"\n")).contains("reject or wait"));
    assert!(
        error_of(&format!(
            "{MINIMAL}key = \"derive\"\nderive_from = [\"id\"]\n"
        ))
        .contains("JSON pointer")
    );
    let text = format!(
        "{MINIMAL}key = \"derive\"\nderive_from = [\"/event_id\"]\nin_progress = \"wait\"\n"
    );
    let route = &Config::from_toml_str(&text, "t").unwrap().routes[0];
    assert_eq!(route.key, KeyMode::Derive);
    assert_eq!(route.in_progress, InProgressMode::Wait);
    assert_eq!(route.derive_window, Duration::from_secs(600));
    assert_eq!(route.wait_timeout, Duration::from_secs(10));
    assert_eq!(route.max_waiters, 256);
    assert!(route.quota.is_none());
    let quota = |lines: &str| {
        let text = format!("{MINIMAL}{lines}");
        let route = Config::from_toml_str(&text, "t").unwrap().routes.remove(0);
        let quota = route.quota.expect("a quota");
        (quota.operations, quota.stored_bytes, quota.window)
    };
    assert_eq!(
        quota("quota_operations = 100\n"),
        (Some(100), None, Duration::from_secs(60))
    );
    assert_eq!(
        quota("quota_stored_bytes = \"5MiB\"\nquota_window = \"1h\"\n"),
        (None, Some(5 << 20), Duration::from_secs(3600))
    );
    assert!(error_of(&format!("{MINIMAL}quota_window = \"1h\"\n")).contains("only with"));
    assert!(error_of(&format!("{MINIMAL}quota_operations = 0\n")).contains("greater"));
    assert!(error_of(&format!("{MINIMAL}quota_stored_bytes = \"0B\"\n")).contains("greater"));
    assert!(error_of(&format!("{MINIMAL}quota_stored_bytes = \"lots\"\n")).contains("not a size"));
}

#[test]
fn reconcile_probes_stay_on_the_upstream_origin() {
    let with = |table: &str| {
        let text = format!(
            "[[routes]]\nname = \"a\"\nupstream = \"http://api:8000\"\n[routes.reconcile]\n{table}"
        );
        Config::from_toml_str(&text, "t")
    };
    let probe = with("url = \"http://api:8000/v1/orders?idempotency_key={key}\"\nfound_json_pointer = \"/data/0/id\"\n")
        .unwrap()
        .routes[0]
        .reconcile
        .clone()
        .unwrap();
    assert_eq!(probe.found_status, 200);
    assert_eq!(probe.timeout, Duration::from_secs(5));
    let err = |table: &str| with(table).unwrap_err().to_string();
    assert!(err("url = \"http://other:8000/x/{key}\"\n").contains("own upstream origin"));
    assert!(err("url = \"https://api:8000/x/{key}\"\n").contains("own upstream origin"));
    assert!(err("url = \"http://api:8000/x\"\n").contains("{key}"));
    assert!(
        err("url = \"http://api:8000/{key}\"\nfound_json_pointer = \"id\"\n")
            .contains("JSON pointer")
    );
    assert!(err("url = \"http://api:8000/{key}\"\nmethod = \"POST\"\n").contains("method"));
}

#[test]
fn probe_verdicts_are_checked_at_load() {
    let with = |route: &str, table: &str| {
        let text = format!(
            "[[routes]]\nname = \"a\"\nupstream = \"http://api:8000\"\n{route}[routes.reconcile]\n{table}"
        );
        Config::from_toml_str(&text, "t")
    };
    let lookup = "url = \"http://api:8000/v1/orders/{key}\"\nfound_json_pointer = \"/id\"\n";
    let probe = with(
        "store_request_body = true\n",
        &format!(
            "{lookup}absent_status = 404\ncount_json_pointer = \"/n\"\nmin_age = \"30s\"\n\
             confirm_url = \"http://api:8000/v1/orders?title={{body:/title}}\"\n\
             confirm_absent_json_pointer = \"/data\"\n"
        ),
    )
    .unwrap()
    .routes[0]
        .reconcile
        .clone()
        .unwrap();
    let verdicts = probe.verdicts;
    assert_eq!(
        verdicts.absent,
        Some(Absence {
            status: Some(404),
            json_pointer: None
        })
    );
    assert_eq!(verdicts.min_age, Duration::from_secs(30));
    let confirm = verdicts.confirm.unwrap();
    assert_eq!(
        confirm.absent,
        Absence {
            status: Some(200),
            json_pointer: Some("/data".into())
        },
        "a pointer alone is read at 200"
    );
    // Without rules for absence, nothing is absent; the default minimum age.
    let plain = with("", lookup).unwrap().routes[0]
        .reconcile
        .clone()
        .unwrap();
    assert_eq!(plain.verdicts.absent, None);
    assert_eq!(plain.verdicts.min_age, Duration::from_secs(60));
    let err = |route: &str, table: &str| with(route, table).unwrap_err().to_string();
    assert!(
        err("", &format!("{lookup}confirm_url = \"http://api:8000/x?t={{body:/title}}\"\nconfirm_absent_status = 404\nabsent_status = 404\n"))
            .contains("store_request_body")
    );
    assert!(
        err(
            "",
            &format!(
                "{lookup}confirm_url = \"http://api:8000/x/{{key}}\"\nconfirm_absent_status = 404\n"
            )
        )
        .contains("only confirms an absence")
    );
    assert!(
        err(
            "",
            &format!("{lookup}absent_status = 404\nconfirm_url = \"http://api:8000/x/{{key}}\"\n")
        )
        .contains("confirm_absent_status")
    );
    assert!(
        err(
            "",
            &format!("{lookup}absent_status = 404\nconfirm_absent_status = 404\n")
        )
        .contains("confirm_url")
    );
    assert!(
        err(
            "",
            "url = \"http://api:8000/x/{key}\"\nabsent_json_pointer = \"/data\"\n"
        )
        .contains("found_json_pointer"),
        "absence at the found status needs a found pointer"
    );
    assert!(err("", "url = \"http://api:8000/x/{id}\"\n").contains("not a placeholder"));
    assert!(err("", &format!("{lookup}count_json_pointer = \"n\"\n")).contains("JSON pointer"));
}

#[test]
fn an_mcp_probe_takes_the_same_verdicts() {
    let with = |table: &str| {
        let text = format!(
            "[[routes]]\nname = \"a\"\nupstream = \"http://api:8000\"\nprofile = \"mcp\"\n\
             [routes.mcp.reconcile]\ntool = \"find\"\ntools = [\"create\"]\n{table}"
        );
        Config::from_toml_str(&text, "t")
    };
    let tools = with(
        "absent_json_pointer = \"/structuredContent/n\"\ncount_json_pointer = \"/structuredContent/n\"\n\
         confirm_tool = \"list\"\nconfirm_absent_json_pointer = \"/structuredContent/items\"\n",
    )
    .unwrap()
    .routes[0]
        .mcp
        .clone()
        .unwrap();
    let verdicts = tools.reconcile.unwrap().verdicts;
    assert_eq!(
        verdicts.absent.unwrap().status,
        None,
        "a tool's result has no status"
    );
    let confirm = verdicts.confirm.unwrap();
    assert_eq!(
        (
            confirm.question.tool.as_str(),
            confirm.question.arguments.as_str()
        ),
        ("list", "{}")
    );
    let err = |table: &str| with(table).unwrap_err().to_string();
    assert!(
        err("absent_json_pointer = \"/n\"\nconfirm_tool = \"list\"\n")
            .contains("confirm_absent_json_pointer")
    );
    assert!(err("confirm_arguments = \"{}\"\n").contains("confirm_tool"));
    assert!(err("absent_json_pointer = \"/n\"\nconfirm_tool = \"list\"\nconfirm_absent_json_pointer = \"/n\"\nconfirm_arguments = '{\"t\": \"{argument:title}\"}'\n")
        .contains("store_request_body"));
}

/// An MCP probe proves the writes of the tools it names, and no other's:
/// without them, or naming a tool whose calls are never held, it is
/// refused.
#[test]
fn an_mcp_probe_names_the_tools_whose_writes_it_proves() {
    let with = |tools: &str| {
        let text = format!(
            "[[routes]]\nname = \"a\"\nupstream = \"http://api:8000\"\nprofile = \"mcp\"\n\
             [routes.mcp]\nread_only_tools = [\"search\"]\nprotected_tools = [\"archive\"]\n\
             [routes.mcp.reconcile]\ntool = \"find\"\n{tools}"
        );
        Config::from_toml_str(&text, "t.toml")
    };
    let config = with("tools = [\"create\", \"archive\"]\n").unwrap();
    let probe = config.routes[0]
        .mcp
        .as_ref()
        .unwrap()
        .reconcile
        .clone()
        .unwrap();
    assert!(probe.proves("create") && probe.proves("archive"));
    assert!(!probe.proves("comment"));
    for (tools, says) in [
        (
            "",
            "a probe for one tool's writes says nothing of another's",
        ),
        (
            "tools = []\n",
            "a probe for one tool's writes says nothing of another's",
        ),
        ("tools = [\"\"]\n", "not a tool name"),
        ("tools = [\"search\"]\n", "read_only_tools"),
        ("tools = [\"find\"]\n", "the probe's own tool"),
    ] {
        let error = with(tools).unwrap_err().to_string();
        assert!(
            error.contains("routes[0].mcp.reconcile.tools") && error.contains(says),
            "{tools}: {error}"
        );
    }
}

#[test]
fn reconcile_keys_go_in_the_path_or_the_query_only() {
    let with = |url: &str| {
        let text = format!(
            "[[routes]]\nname = \"a\"\nupstream = \"http://api:8000\"\n[routes.reconcile]\nurl = \"{url}\"\n"
        );
        Config::from_toml_str(&text, "t.toml").map(|c| c.routes[0].reconcile.clone())
    };
    for url in [
        "http://api:8000/v1/tasks/{key}",
        "http://api:8000/v1/tasks?key={key}",
        "http://api:8000/{key}/x?again={key}",
        "http://api:8000?key={key}",
    ] {
        assert!(with(url).is_ok(), "{url}");
    }
    let err = |url: &str| match with(url) {
        Ok(_) => panic!("accepted {url}"),
        Err(e) => e.to_string(),
    };
    let fragment = err("http://api:8000/v1/probe-list?tenant=1#{key}");
    assert!(
        fragment.starts_with("t.toml: field `routes[0].reconcile.url`")
            && fragment.contains("fragment"),
        "{fragment}"
    );
    // A fragment is refused even beside a key in the path.
    assert!(err("http://api:8000/v1/{key}#top").contains("fragment"));
    assert!(err("http://api:8000/v1/{key}#").contains("fragment"));
    // In the authority, `{key}` would pick the host (here it would even
    // pass the origin check, the upstream's host being `k`).
    let text = "[[routes]]\nname = \"a\"\nupstream = \"http://k:8000\"\n[routes.reconcile]\nurl = \"http://{key}:8000/x\"\n";
    let host = Config::from_toml_str(text, "t.toml")
        .unwrap_err()
        .to_string();
    assert!(host.contains("path or query"), "{host}");
    assert!(err("http://api:8000/x").contains("path or query"));
}

#[test]
fn store_urls() {
    assert_eq!(
        StoreUrl::parse("sqlite:///tmp/a.db"),
        Ok(StoreUrl::Sqlite("/tmp/a.db".into()))
    );
    assert_eq!(
        StoreUrl::parse("sqlite:a.db"),
        Ok(StoreUrl::Sqlite("a.db".into()))
    );
    assert!(StoreUrl::parse("sqlite://").is_err());
    // A directory is no file SQLite can open.
    for directory in ["sqlite:///", "sqlite:///var/lib/idemgate/", "sqlite:data/"] {
        let error = StoreUrl::parse(directory).expect_err(directory);
        assert!(error.contains("directory"), "{directory}: {error}");
    }
    assert!(StoreUrl::parse("sqlite::memory:").is_err());
    assert!(StoreUrl::parse("mysql://x").is_err());
    // What `serve` cannot open, `check-config` does not accept: one reading.
    for refused in [
        "postgres://gw@h1:5432,h2:5432/db?target_session_attrs=read-only",
        "postgres://gw@db:notaport/x",
    ] {
        let error = StoreUrl::parse(refused).expect_err(refused);
        assert!(
            error.contains("not a PostgreSQL URL the store can open"),
            "{error}"
        );
    }
    assert_eq!(
        StoreUrl::parse("postgresql://db/x"),
        Ok(StoreUrl::Postgres("postgresql://db/x".into()))
    );
    let several = "postgres://gw@h1:5432,h2:5432/db?target_session_attrs=read-write";
    assert_eq!(
        StoreUrl::parse(several),
        Ok(StoreUrl::Postgres(several.into()))
    );
}

#[test]
fn postgres_stores_take_a_lease_and_hide_passwords() {
    let config = Config::from_toml_str(
        &format!("[store]\nurl = \"postgres://gw:s3cret@db:5432/x?sslmode=require\"\nlease = \"4s\"\n{MINIMAL}"),
        "t",
    )
    .unwrap();
    assert_eq!(config.store.lease, Duration::from_secs(4));
    assert_eq!(
        config.store.url.to_string(),
        "postgres://gw:***@db:5432/x?sslmode=require"
    );
    let default = Config::from_toml_str(
        &format!("[store]\nurl = \"postgres://db/x\"\n{MINIMAL}"),
        "t",
    );
    assert_eq!(default.unwrap().store.lease, Duration::from_secs(10));
    assert_eq!(redact_url("postgres://gw@db/x"), "postgres://gw@db/x");
    // libpq's query parameters carry passwords too.
    assert_eq!(
        redact_url("postgres://gw@db/x?sslmode=require&password=s3cret&PassWord=b&sslpassword=k"),
        "postgres://gw@db/x?sslmode=require&password=***&PassWord=***&sslpassword=***"
    );
    assert_eq!(
        redact_url("postgres://gw:p@db/x?password=s3cret"),
        "postgres://gw:***@db/x?password=***"
    );
    let short = format!("[store]\nurl = \"postgres://db/x\"\nlease = \"500ms\"\n{MINIMAL}");
    assert!(error_of(&short).contains("at least 1s"));
    let sqlite = format!("[store]\nlease = \"10s\"\n{MINIMAL}");
    assert!(
        error_of(&sqlite).contains("only a postgres"),
        "{}",
        error_of(&sqlite)
    );
}

#[test]
fn overrides_replace_file_values() {
    let mut config = Config::from_toml_str(MINIMAL, "t").unwrap();
    config
        .apply(&Overrides {
            listen: Some("127.0.0.1:1".parse().unwrap()),
            admin_listen: None,
            store_url: Some("sqlite:///tmp/o.db".into()),
        })
        .unwrap();
    assert_eq!(config.server.listen.port(), 1);
    assert_eq!(config.store.url, StoreUrl::Sqlite("/tmp/o.db".into()));
    let bad = Overrides {
        store_url: Some("nope".into()),
        ..Overrides::default()
    };
    assert!(
        config
            .apply(&bad)
            .unwrap_err()
            .to_string()
            .contains("--store")
    );
    // The command line's listeners are checked as the file's are: one
    // address for both would fail at the second bind.
    let clash = Overrides {
        admin_listen: Some("0.0.0.0:1".parse().unwrap()),
        ..Overrides::default()
    };
    let error = config.apply(&clash).unwrap_err().to_string();
    assert!(
        error.contains("--admin-listen") && error.contains("its own"),
        "{error}"
    );
}

#[test]
fn a_profile_sets_its_defaults_and_its_retention_floor() {
    let with = |lines: &str| Config::from_toml_str(&format!("{MINIMAL}{lines}"), "test.toml");
    let acp = with("profile = \"acp\"\n").unwrap();
    let route = &acp.routes[0];
    assert_eq!(route.profile, crate::profile::Profile::Acp);
    assert!(route.fingerprint_headers.is_empty(), "§6.2: the body only");
    let released = &route.release_statuses;
    assert!(released.contains(&429) && released.contains(&500) && released.contains(&503));
    assert!(
        !released.contains(&502) && !released.contains(&504),
        "held as unknown"
    );
    // What the file sets wins over the profile's defaults.
    let set = with("profile = \"acp\"\nrelease_statuses = [503]\n").unwrap();
    assert_eq!(set.routes[0].release_statuses, vec![503]);
    let error = error_of(&format!(
        "[store]\nretention = \"23h\"\n{MINIMAL}profile = \"acp\"\n"
    ));
    assert!(
        error.contains("store.retention") && error.contains("`acp`") && error.contains("24h"),
        "{error}"
    );
    let idemgate = Config::from_toml_str(&format!("[store]\nretention = \"1h\"\n{MINIMAL}"), "t");
    assert!(idemgate.is_ok(), "no floor for idemgate");
    let unknown = error_of(&format!("{MINIMAL}profile = \"soap\"\n"));
    assert!(unknown.contains("routes[0].profile"), "{unknown}");
}

#[test]
fn a_ucp_route_protects_updates_and_compares_bodies_as_sent() {
    let with = |lines: &str| Config::from_toml_str(&format!("{MINIMAL}{lines}"), "test.toml");
    let ucp = with("profile = \"ucp\"\n").unwrap();
    let route = &ucp.routes[0];
    assert_eq!(route.methods, [http::Method::POST, http::Method::PUT]);
    let scope: Vec<_> = route.scope_headers.iter().map(|h| h.as_str()).collect();
    assert_eq!(scope, ["authorization", "x-api-key", "ucp-agent"]);
    assert!(route.fingerprint_headers.is_empty());
    let set = with("profile = \"ucp\"\nmethods = [\"POST\"]\n").unwrap();
    assert_eq!(set.routes[0].methods, [http::Method::POST]);
    let error = error_of(&format!(
        "{MINIMAL}profile = \"ucp\"\nignore_fields = [\"/nonce\"]\n"
    ));
    assert!(
        error.contains("routes[0].ignore_fields") && error.contains("byte for byte"),
        "{error}"
    );
    let error = error_of(&format!(
        "[store]\nretention = \"23h\"\n{MINIMAL}profile = \"ucp\"\n"
    ));
    assert!(error.contains("`ucp`") && error.contains("24h"), "{error}");
}

#[test]
fn no_route_takes_a_body_larger_than_the_bodies_budget() {
    let error = error_of(&format!(
        "[server]\nbuffered_body_budget = \"1KiB\"\n{MINIMAL}"
    ));
    assert!(
        error.contains("routes[0].max_body") && error.contains("buffered_body_budget"),
        "{error}"
    );
    let fits = format!("[server]\nbuffered_body_budget = \"1KiB\"\n{MINIMAL}max_body = \"1KiB\"\n");
    assert!(Config::from_toml_str(&fits, "t").is_ok());
}

#[test]
fn no_key_takes_a_header_that_frames_routes_or_authenticates_the_request() {
    for field in ["forward_key_header", "destination_key_header"] {
        for name in [
            "Host",
            "Content-Length",
            "Transfer-Encoding",
            "Connection",
            "TE",
            "Upgrade",
            "Content-Type",
            "Authorization",
            "X-Forwarded-For",
        ] {
            let error = error_of(&format!("{MINIMAL}{field} = \"{name}\"\n"));
            assert!(
                error.contains(&format!("routes[0].{field}")) && error.contains("take its place"),
                "{field} = {name}: {error}"
            );
        }
        // A route's scope header is its credential too.
        let error = error_of(&format!(
            "{MINIMAL}scope_headers = [\"x-tenant\"]\n{field} = \"X-Tenant\"\n"
        ));
        assert!(error.contains("take its place"), "{error}");
        let own = format!("{MINIMAL}{field} = \"X-Request-Key\"\n");
        assert!(Config::from_toml_str(&own, "t").is_ok(), "{field}");
        // Nor one the route's profile reads beside the key: the destination
        // reads it as the profile does (another account, another client).
        for (profile, name) in [
            ("stripe", "Stripe-Account"),
            ("stripe", "Stripe-Context"),
            ("oasis", "Repeatability-Client-ID"),
            ("oasis", "Repeatability-First-Sent"),
        ] {
            let error = error_of(&format!(
                "{MINIMAL}profile = \"{profile}\"\n{field} = \"{name}\"\n"
            ));
            assert!(
                error.contains("take its place"),
                "{profile} {field} = {name}: {error}"
            );
        }
    }
}

/// Absence is said by a 2xx or a 4xx only: an error or a redirect (never
/// followed) says nothing of the write.
#[test]
fn an_absent_status_is_a_2xx_or_a_4xx() {
    let with = |status: u16| {
        error_of(&format!(
            "[[routes]]\nname = \"a\"\nupstream = \"http://api:8000\"\n[routes.reconcile]\n\
             url = \"http://api:8000/v1/orders/{{key}}\"\nfound_json_pointer = \"/id\"\n\
             absent_status = {status}\n"
        ))
    };
    for status in [500, 503, 302, 101] {
        assert!(
            with(status).contains("says nothing of the write"),
            "{status}"
        );
    }
}

#[test]
fn a_ucp_route_never_drops_or_replaces_a_signed_header() {
    let ucp = |lines: &str| format!("{MINIMAL}profile = \"ucp\"\n{lines}");
    for (lines, field) in [
        ("forward_key_header = \"\"\n", "forward_key_header"),
        ("forward_key_header = \"X-Key\"\n", "forward_key_header"),
        (
            "destination_key_header = \"Idempotency-Key\"\n",
            "destination_key_header",
        ),
        (
            "destination_key_header = \"signature\"\n",
            "destination_key_header",
        ),
        (
            "destination_key_header = \"Request-Id\"\n",
            "destination_key_header",
        ),
    ] {
        let error = error_of(&ucp(lines));
        assert!(
            error.contains(&format!("routes[0].{field}")) && error.contains("signed"),
            "{lines}: {error}"
        );
    }
    let own = Config::from_toml_str(&ucp("destination_key_header = \"X-Operation\"\n"), "t");
    assert!(own.is_ok(), "a header of its own is fine");
    let spelled = Config::from_toml_str(&ucp("forward_key_header = \"idempotency-key\"\n"), "t");
    assert!(spelled.is_ok(), "the key's own name, in any case");
    // Other profiles sign nothing: the key may go elsewhere.
    let idemgate = format!("{MINIMAL}destination_key_header = \"Idempotency-Key\"\n");
    assert!(Config::from_toml_str(&idemgate, "t").is_ok());
}

#[test]
fn an_mcp_route_intercepts_its_posts_alone() {
    let config = Config::from_toml_str(
        "[[routes]]\nname = \"tools\"\nprofile = \"mcp\"\nupstream = \"http://127.0.0.1:9\"\n",
        "t.toml",
    )
    .unwrap();
    let route = &config.routes[0];
    assert_eq!(route.methods, vec![http::Method::POST]);
    assert_eq!(route.key, KeyMode::Derive);
    assert_eq!(route.in_progress, InProgressMode::Wait);
    assert!(route.mcp.is_some());
    let refused = Config::from_toml_str(
        "[[routes]]\nname = \"tools\"\nprofile = \"mcp\"\nupstream = \"http://127.0.0.1:9\"\nmethods = [\"PATCH\"]\n",
        "t.toml",
    );
    assert!(refused.unwrap_err().to_string().contains("always a POST"));
}

#[test]
fn a_probe_template_is_filled_from_the_held_call() {
    use serde_json::json;
    let args = json!({"title": "a {argument:title}", "n": 7, "nested": {"x": "{key}"}});
    let argument = |name: &str| args.get(name).cloned();
    let keys = ProbeKeys {
        key: "k-1",
        destination_key: "op-1",
    };
    let filled = fill_template(
        r##"{"title": "{argument:title}", "n": "{argument:n}", "label": "#{argument:n} {key}", "deep": ["{argument:nested}"], "sent_as": "{destination_key}"}"##,
        keys,
        argument,
    )
    .unwrap();
    assert_eq!(
        filled,
        json!({
            "title": "a {argument:title}",
            "n": 7,
            "label": "#7 k-1",
            "deep": [{"x": "{key}"}],
            "sent_as": "op-1",
        }),
        "whole strings take the value; what an argument holds is never a placeholder"
    );
    assert!(fill_template(r#"{"t": "{argument:missing}"}"#, keys, argument).is_err());
    assert!(fill_template(r#"{"t": "{argument:open"}"#, keys, argument).is_err());
    assert!(fill_template("not json", keys, argument).is_err());
}

/// A probe asks by a key the destination got: `{destination_key}` only
/// where `destination_key_header` sends the operation's id, `{key}` only
/// where the client's key goes on — not with `forward_key_header = ""`,
/// nor where the destination key takes its header. A probe asking by a
/// key the destination never got finds nothing, and with rules for
/// absence releases the write to be sent again.
#[test]
fn a_probe_asks_by_a_key_the_destination_gets() {
    let route = |lines: &str, probe: &str| {
        let text = format!(
            "[[routes]]\nname = \"a\"\nupstream = \"http://api:8000\"\n{lines}\n\
             [routes.reconcile]\n{probe}\n"
        );
        Config::from_toml_str(&text, "t.toml")
    };
    let by_key = "url = \"http://api:8000/v1/tasks?key={key}\"";
    let by_destination_key = "url = \"http://api:8000/v1/tasks/{destination_key}\"";
    let confirmed_by_key = "url = \"http://api:8000/v1/tasks/{destination_key}\"\n\
         absent_status = 404\nconfirm_url = \"http://api:8000/v1/tasks?key={key}\"\n\
         confirm_absent_status = 404";
    let in_its_place = "destination_key_header = \"Idempotency-Key\"";
    let own_header = "destination_key_header = \"X-Destination-Key\"";
    let no_client_key = "forward_key_header = \"\"";
    let oasis = "profile = \"oasis\"\nforward_key_header = \"\"";
    for (lines, probe) in [
        ("", by_key),
        (own_header, by_key),
        (in_its_place, by_destination_key),
        (own_header, by_destination_key),
        (
            &format!("{own_header}\n{no_client_key}"),
            by_destination_key,
        ),
        (
            "forward_key_header = \"X-Client-Key\"\ndestination_key_header = \"Idempotency-Key\"",
            by_key,
        ),
        // OASIS passes Repeatability-Request-ID on as the client sent it.
        (oasis, by_key),
    ] {
        let loaded = route(lines, probe);
        assert!(loaded.is_ok(), "{lines} / {probe}: {:?}", loaded.err());
    }
    for (lines, probe, field, says) in [
        (in_its_place, by_key, "reconcile.url", "in its place"),
        (
            no_client_key,
            by_key,
            "reconcile.url",
            "forward_key_header = \"\"",
        ),
        (
            in_its_place,
            confirmed_by_key,
            "reconcile.confirm_url",
            "in its place",
        ),
        (
            &format!("{oasis}\ndestination_key_header = \"Repeatability-Request-ID\""),
            by_key,
            "reconcile.url",
            "in its place",
        ),
        (
            "",
            by_destination_key,
            "reconcile.url",
            "set destination_key_header",
        ),
        (
            no_client_key,
            by_destination_key,
            "reconcile.url",
            "set destination_key_header",
        ),
    ] {
        let error = route(lines, probe).unwrap_err().to_string();
        assert!(
            error.contains(&format!("routes[0].{field}")) && error.contains(says),
            "{lines} / {probe}: {error}"
        );
        if says != "set destination_key_header" {
            assert!(
                error.contains("ask by {destination_key}") && error.contains("{body:/pointer}"),
                "{error}"
            );
        }
    }
}

/// An MCP route's probe tool may ask by `{destination_key}` where the
/// route sends one; `{key}`, the call's own, reaches the server in the
/// call itself (its `_meta` or key argument), so it is never refused.
#[test]
fn an_mcp_probe_asks_by_the_destination_key_only_where_one_is_sent() {
    let route = |lines: &str, arguments: &str| {
        let text = format!(
            "[[routes]]\nname = \"a\"\nupstream = \"http://api:8000\"\nprofile = \"mcp\"\n{lines}\n\
             [routes.mcp.reconcile]\ntool = \"find\"\ntools = [\"create\"]\narguments = '{arguments}'\n"
        );
        Config::from_toml_str(&text, "t.toml")
    };
    let by_destination_key = r#"{"sent_as": "{destination_key}"}"#;
    let in_its_place = "destination_key_header = \"Idempotency-Key\"";
    assert!(route(in_its_place, by_destination_key).is_ok());
    assert!(route(in_its_place, r#"{"request_id": "{key}"}"#).is_ok());
    let error = route("", by_destination_key).unwrap_err().to_string();
    assert!(
        error.contains("routes[0].mcp.reconcile.arguments")
            && error.contains("set destination_key_header"),
        "{error}"
    );
}

/// An MCP route's held calls are probed by a tool; an HTTP probe there
/// was taken and the tool's ignored, its GET's body replayed to the agent
/// as the tool's result.
#[test]
fn an_mcp_route_takes_no_http_probe() {
    let text = "[[routes]]\nname = \"a\"\nupstream = \"http://api:8000\"\nprofile = \"mcp\"\n\
                [routes.reconcile]\nurl = \"http://api:8000/find?k={key}\"\n";
    let error = Config::from_toml_str(text, "t.toml")
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("routes[0].reconcile") && error.contains("[routes.mcp.reconcile]"),
        "{error}"
    );
}

#[test]
fn an_mcp_probes_arguments_are_an_object() {
    let array = "[[routes]]\nname = \"a\"\nupstream = \"http://api:8000\"\nprofile = \"mcp\"\n\
                 [routes.mcp.reconcile]\ntool = \"find\"\ntools = [\"create\"]\narguments = '[1]'\n";
    let error = Config::from_toml_str(array, "t.toml")
        .unwrap_err()
        .to_string();
    assert!(error.contains("must be a JSON object"), "{error}");
}

#[test]
fn a_first_sent_skew_is_less_than_the_retention() {
    let toml = "[store]\nretention = \"10m\"\n[[routes]]\nname = \"sms\"\nprofile = \"oasis\"\nupstream = \"http://127.0.0.1:9\"\nfirst_sent_skew = \"10m\"\n";
    let error = Config::from_toml_str(toml, "t.toml")
        .unwrap_err()
        .to_string();
    assert!(error.contains("first_sent_skew"), "{error}");
    // A profile that reads no first-sent time does not care.
    let plain = toml.replace("profile = \"oasis\"\n", "");
    assert!(Config::from_toml_str(&plain, "t.toml").is_ok());
}

#[test]
fn a_derive_window_is_no_longer_than_the_retention() {
    // Deleted at `retention`, an operation could not make identical
    // requests one operation for a longer window: the next is sent again.
    let toml = "[store]\nretention = \"1h\"\n[[routes]]\nname = \"d\"\nupstream = \"http://127.0.0.1:9\"\nkey = \"derive\"\nderive_window = \"2h\"\n";
    let error = Config::from_toml_str(toml, "t.toml")
        .unwrap_err()
        .to_string();
    assert!(error.contains("derive_window"), "{error}");
    for fits in [
        toml.replace("\"2h\"", "\"1h\""),
        // Keys derived from named fields have no window.
        toml.replace(
            "key = \"derive\"\n",
            "key = \"derive\"\nderive_from = [\"/id\"]\n",
        ),
        toml.replace("key = \"derive\"\n", ""),
    ] {
        assert!(Config::from_toml_str(&fits, "t.toml").is_ok(), "{fits}");
    }
}

#[test]
fn the_two_listeners_are_two_addresses() {
    let toml = "[server]\nlisten = \"127.0.0.1:8080\"\nadmin_listen = \"127.0.0.1:8080\"\n[[routes]]\nname = \"r\"\nupstream = \"http://127.0.0.1:9\"\n";
    let error = Config::from_toml_str(toml, "t.toml")
        .unwrap_err()
        .to_string();
    assert!(error.contains("server.admin_listen"), "{error}");
    let wildcard = toml.replacen("127.0.0.1:8080", "0.0.0.0:8080", 1);
    assert!(
        Config::from_toml_str(&wildcard, "t.toml").is_err(),
        "{wildcard}"
    );
    let apart = toml.replacen("127.0.0.1:8080", "127.0.0.2:8080", 1);
    assert!(Config::from_toml_str(&apart, "t.toml").is_ok(), "{apart}");
    // Port 0: each gets a port of its own.
    let any = toml.replace("8080", "0");
    assert!(Config::from_toml_str(&any, "t.toml").is_ok());
}

#[test]
fn rotated_keys_hold_on_mcp_routes_and_are_off_elsewhere_by_default() {
    let route = |extra: &str| {
        let toml = format!("[[routes]]\nname = \"r\"\nupstream = \"http://127.0.0.1:9\"\n{extra}");
        Config::from_toml_str(&toml, "t.toml").map(|c| c.routes[0].rotated_keys)
    };
    assert_eq!(route("").unwrap(), RotatedKeys::Off);
    assert_eq!(route("profile = \"mcp\"\n").unwrap(), RotatedKeys::Hold);
    assert_eq!(
        route("rotated_keys = \"hold\"\n").unwrap(),
        RotatedKeys::Hold
    );
    assert_eq!(
        route("profile = \"mcp\"\nrotated_keys = \"off\"\n").unwrap(),
        RotatedKeys::Off
    );
    let error = route("rotated_keys = \"sometimes\"\n")
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("rotated_keys") && error.contains("hold or off"),
        "{error}"
    );
}

#[test]
fn a_destination_key_needs_its_header_and_a_resend_its_window() {
    let route = |extra: &str| {
        let toml = format!("[[routes]]\nname = \"r\"\nupstream = \"http://127.0.0.1:9\"\n{extra}");
        Config::from_toml_str(&toml, "t.toml").map(|c| c.routes[0].destination_key.clone())
    };
    assert!(route("").unwrap().is_none(), "off by default");
    let key = route("destination_key_header = \"Idempotency-Key\"\n")
        .unwrap()
        .expect("a destination key");
    assert_eq!(
        (key.header.as_str(), key.window, key.resend_unknown),
        ("idempotency-key", None, false)
    );
    let resending = route(
        "destination_key_header = \"X-Dest\"\ndestination_key_window = \"24h\"\nresend_unknown = true\n",
    )
    .unwrap()
    .expect("a destination key");
    assert_eq!(
        (resending.window, resending.resend_unknown),
        (Some(std::time::Duration::from_secs(86_400)), true)
    );
    for (extra, names, says) in [
        (
            "resend_unknown = true\n",
            "resend_unknown",
            "only with destination_key_header",
        ),
        (
            "destination_key_window = \"24h\"\n",
            "destination_key_window",
            "only with destination_key_header",
        ),
        (
            "destination_key_header = \"Idempotency-Key\"\nresend_unknown = true\n",
            "destination_key_window",
            "required with resend_unknown",
        ),
        (
            "destination_key_header = \"Idempotency-Key\"\ndestination_key_window = \"0s\"\n",
            "destination_key_window",
            "greater than zero",
        ),
        (
            "destination_key_header = \"bad header\"\n",
            "destination_key_header",
            "not a header name",
        ),
    ] {
        let error = route(extra).unwrap_err().to_string();
        assert!(
            error.contains(names) && error.contains(says),
            "{extra}: {error}"
        );
    }
}

#[test]
fn a_synchronous_standby_is_required_only_of_a_durable_postgres_store() {
    let store = |lines: &str| {
        let toml = format!(
            "[store]\n{lines}\n[[routes]]\nname = \"r\"\nupstream = \"http://127.0.0.1:9\"\n"
        );
        Config::from_toml_str(&toml, "t.toml").map(|c| c.store.require_synchronous_standby)
    };
    let postgres = "url = \"postgres://u@127.0.0.1:5432/db\"";
    assert!(!store(postgres).unwrap(), "off by default");
    assert!(store(&format!("{postgres}\nrequire_synchronous_standby = true")).unwrap());
    let normal = store(&format!(
        "{postgres}\ndurability = \"normal\"\nrequire_synchronous_standby = true"
    ))
    .unwrap_err()
    .to_string();
    assert!(normal.contains("synchronous_commit = off"), "{normal}");
    let sqlite = store("require_synchronous_standby = true")
        .unwrap_err()
        .to_string();
    assert!(sqlite.contains("only a postgres:// store"), "{sqlite}");
}

#[test]
fn an_mcp_probes_absence_needs_where_a_found_result_holds_the_write() {
    let route = |extra: &str| {
        let toml = format!(
            "[[routes]]\nname = \"r\"\nupstream = \"http://127.0.0.1:9\"\nprofile = \"mcp\"\n[routes.mcp]\nread_only_tools = [\"count_tasks\"]\n[routes.mcp.reconcile]\ntool = \"count_tasks\"\ntools = [\"create_task\"]\n{extra}"
        );
        Config::from_toml_str(&toml, "t.toml").map(|_| ())
    };
    let error = route("absent_json_pointer = \"/structuredContent/tasks\"\n")
        .unwrap_err()
        .to_string();
    assert!(error.contains("found_json_pointer"), "{error}");
    route("absent_json_pointer = \"/structuredContent/tasks\"\ncount_json_pointer = \"/structuredContent/tasks\"\n")
        .expect("with a count");
    route("absent_json_pointer = \"/structuredContent/tasks\"\nfound_json_pointer = \"/structuredContent/tasks/0\"\n")
        .expect("with a found pointer");
}

/// A file the parser refuses is named by line, column and the key its
/// line sets, never quoted: the line may hold a credential.
#[test]
fn a_parse_error_never_quotes_the_line() {
    let secret = "PWsecret123";
    for (text, key) in [
        (
            format!(
                "[store]\nurl = \"postgres://u:{secret}@db/x\"\nurl = \"postgres://u:{secret}@db/y\"\n{MINIMAL}"
            ),
            "`url`",
        ),
        (
            format!("[store]\nurl = \"postgres://u:{secret}@db/x\n{MINIMAL}"),
            "line 2",
        ),
        // A string where a table belongs: the message names its type only.
        (
            format!("store = \"postgres://u:{secret}@db/x\"\n{MINIMAL}"),
            "`store`",
        ),
    ] {
        let error = error_of(&text);
        assert!(!error.contains(secret), "{error}");
        assert!(error.contains(key), "{error}");
        assert!(error.starts_with("test.toml: line "), "{error}");
    }
}
