//! A request's log line, from the real binary: the text format writes it
//! straight into the log sink (crates/gateway/src/request_log.rs), and it must read as the
//! tracing event it stands in for, once per request, under the filter
//! `RUST_LOG` sets.

use std::path::Path;

use crate::common::*;
use bytes::Bytes;

const ORDER: &str = r#"{"sku":"apple"}"#;

/// The lines of `logged` that are request lines.
fn request_lines(logged: &str) -> Vec<&str> {
    logged
        .lines()
        .filter(|line| line.contains(" idemgate::pipeline: request "))
        .collect()
}

/// The binary serving `upstream` in text format, its stderr in `dir`,
/// with `RUST_LOG` as given (unset when `None`).
async fn serve(dir: &Path, upstream: &FakeUpstream, rust_log: Option<&str>) -> BinaryGateway {
    let toml = gateway_toml(&dir.join("idemgate.db"), &upstream.url(), "/orders", "");
    let config = write_config(dir, "idemgate.toml", &toml);
    let mut cmd = binary();
    cmd.arg("serve").arg("--config").arg(&config);
    match rust_log {
        Some(filter) => cmd.env("RUST_LOG", filter),
        None => cmd.env_remove("RUST_LOG"),
    };
    BinaryGateway::spawn(cmd, &dir.join("serve.log")).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_request_writes_one_line_saying_how_it_ended() {
    let dir = tempfile::tempdir().expect("tempdir");
    let upstream = FakeUpstream::start().await;
    let mut gateway = serve(dir.path(), &upstream, None).await;

    assert_fresh_created(&write(gateway.proxy, "/orders", Some("log-1"), ORDER).await);
    assert!(
        write(gateway.proxy, "/orders", Some("log-1"), ORDER)
            .await
            .is_replay()
    );
    send(gateway.proxy, "GET", "/elsewhere", &[], Bytes::new()).await;
    let logged = gateway.wait_for_log("path=/elsewhere").await;
    gateway.kill();

    let lines = request_lines(&logged);
    assert_eq!(lines.len(), 3, "one line per request:\n{logged}");
    for (line, outcome, status) in [
        (lines[0], "forwarded", 201),
        (lines[1], "replayed", 201),
        (lines[2], "rejected", 404),
    ] {
        // `2026-12-05T21:54:14.851484Z  INFO idemgate::pipeline: request …`
        assert!(
            line.as_bytes()[10] == b'T'
                && line[26..].starts_with("Z  INFO idemgate::pipeline: request route="),
            "{line}"
        );
        assert!(
            line.contains(&format!(" outcome={outcome} status={status} latency_ms=")),
            "{line}"
        );
        let latency = line.rsplit("latency_ms=").next().expect("a latency");
        let latency: f64 = latency.parse().expect("the latency is a number");
        assert!((0.0..30_000.0).contains(&latency), "{line}");
    }
    for line in &lines[..2] {
        assert!(
            line.contains(r#"request route="api" method=POST path=/orders operation_id=""#),
            "{line}"
        );
    }
    assert!(
        lines[2].contains(r#"request route="" method=GET path=/elsewhere outcome="#),
        "no route, no operation: {}",
        lines[2]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filter_above_info_leaves_requests_unlogged() {
    let dir = tempfile::tempdir().expect("tempdir");
    let upstream = FakeUpstream::start().await;
    let filter = "warn,idemgate=info,idemgate::pipeline=warn";
    let mut gateway = serve(dir.path(), &upstream, Some(filter)).await;

    assert_fresh_created(&write(gateway.proxy, "/orders", Some("quiet-1"), ORDER).await);
    // Shutting down is logged at INFO under the target `idemgate`, which
    // the filter lets through: once it is out, a request line would be too.
    gateway.signal("TERM");
    let logged = gateway.wait_for_log("shutting down").await;
    gateway.kill();
    assert!(request_lines(&logged).is_empty(), "{logged}");
}
