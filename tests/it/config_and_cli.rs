//! The configuration and the command line: the commented example
//! `config/idemgate.toml` loads and passes `idemgate check-config`, invalid
//! files (an unknown field, a bad value, a probe URL with a fragment) are
//! rejected naming file, field and reason, and `idemgate serve`
//! runs from flags alone, announcing its addresses on stdout.

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
