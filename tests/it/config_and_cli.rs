//! The configuration and the command line: the commented example
//! `config/idemgate.toml` loads and passes `idemgate check-config`, invalid
//! files (an unknown field, a bad value, a probe URL with a fragment) are
//! rejected naming file, field and reason, and `idemgate serve`
//! runs from flags alone, announcing its addresses on stdout.
//! `check-config` and `serve` accept the same store URLs, every one the
//! documents show among them.

use crate::common::*;
use idemgate::config::Config;
use std::path::PathBuf;

fn example_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("config/idemgate.toml")
}

#[test]
fn example_config_loads() {
    let path = example_path();
    let text = std::fs::read_to_string(&path).expect("config/idemgate.toml exists");

    let loaded = Config::from_toml_str(&text, &path.display().to_string());

    if let Err(e) = loaded {
        panic!("example config rejected: {e}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_config_accepts_the_example() {
    let mut cmd = binary();
    cmd.arg("check-config").arg(example_path());

    let (status, stdout, stderr) = run_to_exit(cmd).await;

    assert!(status.success(), "exit {status}; stderr:\n{stderr}");
    assert_eq!(stdout.trim(), "ok");
}

/// A valid test config with `extra` appended to the route, in a temp file.
fn config_file_with(dir: &std::path::Path, extra: &str) -> PathBuf {
    let toml = gateway_toml(
        &dir.join("idemgate.db"),
        "http://upstream.example",
        "/",
        extra,
    );
    write_config(dir, "candidate.toml", &toml)
}

/// Runs `idemgate check-config` on a valid config with `extra` appended to
/// the route, which must fail naming the file; its stderr.
async fn check_config_refuses(extra: &str) -> String {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = config_file_with(dir.path(), extra);

    let mut cmd = binary();
    cmd.arg("check-config").arg(&path);
    let (status, stdout, stderr) = run_to_exit(cmd).await;

    assert!(!status.success(), "accepted {extra}; stdout: {stdout}");
    assert!(
        stderr.contains("candidate.toml"),
        "file not named:\n{stderr}"
    );
    stderr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_config_rejects_unknown_field_naming_file_and_field() {
    let stderr = check_config_refuses("retry_forever = true").await;

    assert!(
        stderr.contains("retry_forever"),
        "field not named:\n{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_config_rejects_bad_value_naming_the_field() {
    let stderr = check_config_refuses(r#"max_body = "lots""#).await;

    assert!(stderr.contains("max_body"), "field not named:\n{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_config_rejects_a_probe_key_in_the_fragment() {
    let probe =
        "[routes.reconcile]\nurl = \"http://upstream.example/v1/probe-list?tenant=1#{key}\"";

    let stderr = check_config_refuses(probe).await;

    assert!(
        stderr.contains("routes[0].reconcile.url"),
        "field not named:\n{stderr}"
    );
    assert!(stderr.contains("fragment"), "reason not given:\n{stderr}");
}

#[test]
fn parser_error_names_source_and_field() {
    let toml = gateway_toml(
        std::path::Path::new("/tmp/never-opened.db"),
        "http://upstream.example",
        "/",
        r#"key = "sometimes""#,
    );

    let err = match Config::from_toml_str(&toml, "named-source.toml") {
        Ok(_) => panic!("accepted key = \"sometimes\""),
        Err(e) => e.to_string(),
    };

    assert!(err.contains("named-source.toml"), "source not named: {err}");
    assert!(err.contains("key"), "field not named: {err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_from_flags_alone_proxies_writes() {
    let upstream = FakeUpstream::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let stderr_path = dir.path().join("serve.log");
    let store = format!("sqlite://{}", dir.path().join("flags.db").display());
    let mut cmd = binary();
    cmd.args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
    ])
    .args(["--upstream", &upstream.url(), "--store", &store]);

    let served = BinaryGateway::spawn(cmd, &stderr_path).await;
    let first = write(served.proxy, "/orders", Some("flag-1"), r#"{"a":1}"#).await;
    let retry = write(served.proxy, "/orders", Some("flag-1"), r#"{"a":1}"#).await;

    assert_fresh_created(&first);
    assert_replay_of(&retry, &first);
    assert_eq!(upstream.writes(), 1);
}

/// Every store URL the documents show (docs/*.md and the example config):
/// each `postgres://` or `postgresql://` to the end of its code span or
/// word. A scheme alone (`a postgres:// store`) or elided
/// (`postgres://…`) names no URL.
fn documented_store_urls() -> Vec<String> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![example_path()];
    for entry in std::fs::read_dir(root.join("docs")).expect("docs/") {
        let path = entry.expect("a docs/ entry").path();
        if path.extension().is_some_and(|e| e == "md") {
            files.push(path);
        }
    }
    let mut urls = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("a document");
        for scheme in ["postgres://", "postgresql://"] {
            for (at, _) in text.match_indices(scheme) {
                let url: String = text[at..]
                    .chars()
                    .take_while(|c| !c.is_whitespace() && !"`\"')|".contains(*c))
                    .collect();
                let rest = &url[scheme.len()..];
                if !rest.is_empty() && !rest.starts_with('…') {
                    urls.push(url);
                }
            }
        }
    }
    urls.sort();
    urls.dedup();
    urls
}

/// What `idemgate check-config` and `idemgate serve` make of a config
/// whose store is at `url`: accepted, or the line refusing the URL.
/// `serve` accepts when it goes on to ask the servers, none of which is
/// there.
async fn check_config_and_serve_read(
    url: String,
) -> (String, Result<(), String>, Result<(), String>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_, scope_key_file, _key_dir) = new_scope_key_file();
    // The files a documented URL names (`sslrootcert=/etc/…`) are read
    // with it: here, one that exists stands in for each.
    let file = dir.path().join("tls.pem");
    std::fs::write(&file, "").expect("a file");
    let opened = url
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((name, value))
                if value != "system"
                    && ["sslrootcert", "sslcert", "sslkey"]
                        .iter()
                        .any(|n| name.ends_with(n)) =>
            {
                format!("{name}={}", file.display())
            }
            _ => pair.to_string(),
        })
        .collect::<Vec<_>>()
        .join("&");
    let setup = Setup::route("").shared_store(&opened, &scope_key_file);
    let toml = gateway_toml_with(
        &dir.path().join("unused.db"),
        "http://upstream.example",
        &setup,
    );
    let path = write_config(dir.path(), "candidate.toml", &toml);
    let refusal = |stderr: &str| {
        stderr
            .lines()
            .find(|line| line.contains("not a PostgreSQL URL the store can open"))
            .map(str::to_owned)
    };

    let mut check = binary();
    check.arg("check-config").arg(&path);
    let (status, _, stderr) = run_to_exit(check).await;
    let checked = match (status.success(), refusal(&stderr)) {
        (true, None) => Ok(()),
        (false, Some(line)) => Err(line),
        _ => panic!("check-config on {url}: {status}\n{stderr}"),
    };

    let mut serve = binary();
    serve.arg("serve").arg("--config").arg(&path);
    let (status, _, stderr) = run_to_exit(serve).await;
    assert!(!status.success(), "serve started on {url}");
    let served = match (refusal(&stderr), stderr.contains("cannot open the store")) {
        (None, true) => Ok(()),
        (Some(line), false) => Err(line),
        _ => panic!("serve on {url}: {status}\n{stderr}"),
    };
    (url, checked, served)
}

/// One reading of a store URL: `check-config` accepts exactly the URLs
/// `serve` goes on to open, every one the documents show among them, and
/// both refuse the others for the same reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_config_and_serve_accept_the_same_store_urls() {
    let documented = documented_store_urls();
    assert!(
        documented.iter().any(|url| url.contains(',')) && documented.len() >= 3,
        "{documented:?}"
    );
    let refused = [
        "postgres://gw@h1:5432,h2:5432/db?target_session_attrs=read-only",
        "postgres://gw@h1:5432,,h2:5432/db",
        "postgres://gw@h1,h2/db?port=5433",
        "postgres://gw@db:notaport/x",
        // TLS settings the driver cannot follow, or files it cannot read.
        "postgres://gw@db/x?sslmode=allow",
        "postgres://gw@db/x?sslmode=verify-full&sslcert=gw.crt",
        "postgres://gw@db/x?sslmode=verify-full&sslrootcert=system",
        "postgres://gw@db/x?sslmode=verify-full&sslkey=gw.key&sslpassword=k",
    ];
    let mut runs = tokio::task::JoinSet::new();
    for url in documented.iter().cloned().chain(refused.map(String::from)) {
        runs.spawn(check_config_and_serve_read(url));
    }
    while let Some(run) = runs.join_next().await {
        let (url, checked, served) = run.expect("a run");
        assert_eq!(checked, served, "{url}");
        assert_eq!(
            checked.is_ok(),
            documented.contains(&url),
            "{url}: {checked:?}"
        );
    }
}
