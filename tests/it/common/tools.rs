//! Tools installed outside cargo that some tests drive (client SDKs,
//! Schemathesis, promtool, Chromium): their tests are `#[ignore]`d, so
//! `cargo test` says they did not run; `cargo test -- --include-ignored`,
//! as `.ci/run` runs after installing them, runs them, and a missing tool
//! fails its test naming what installs it.

use super::*;

/// A bound on one client run: its retries back off (stripe: 0.5–1 s per
/// retry), so a healthy run takes a few seconds.
pub const CLIENT_RUN: Duration = Duration::from_secs(60);

/// Panics unless `installed` exists, naming `install`, the command that
/// installs it.
pub fn require_installed(installed: &Path, install: &str) {
    assert!(
        installed.exists(),
        "{} is missing; install it with {install} (.ci/run does)",
        installed.display()
    );
}

/// `tests/clients/`: the client scripts and their installs.
pub fn clients_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients")
}

/// Runs `tests/clients/<script>` with `args` (node for `.js`, the venv's
/// Python otherwise), within [`CLIENT_RUN`], and returns the JSON report
/// it prints last.
pub async fn run_client(script: &str, args: &[&str]) -> Value {
    let dir = clients_dir();
    let venv_python = dir.join(".venv/bin/python");
    let (installed, program, install) = if script.ends_with(".js") {
        let install = "`npm ci` in tests/clients";
        (
            dir.join("node_modules/stripe"),
            PathBuf::from("node"),
            install,
        )
    } else {
        let install = "`python3 -m venv .venv && .venv/bin/pip install -r requirements.txt` \
                       in tests/clients";
        (venv_python.clone(), venv_python, install)
    };
    require_installed(&installed, install);
    let mut cmd = Command::new(program);
    cmd.current_dir(&dir).arg(dir.join(script)).args(args);
    let (status, stdout, stderr) = run_to_exit_within(cmd, CLIENT_RUN).await;
    assert!(
        status.success(),
        "{script} failed ({status}); stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    let report = stdout.lines().last().unwrap_or_default();
    eprintln!("{script} reported: {report}");
    serde_json::from_str(report).unwrap_or_else(|e| {
        panic!("{script} printed no JSON report ({e}); stdout:\n{stdout}\nstderr:\n{stderr}")
    })
}

pub const CURL: &str = "/usr/bin/curl";

/// `curl` with `args`, to its end; its stdout (`-i`: the head too).
pub async fn curl(args: &[&str]) -> String {
    require_installed(Path::new(CURL), "`apt-get install curl` (with HTTP2)");
    let mut cmd = Command::new(CURL);
    cmd.args(["-sS", "-i", "--max-time", "20"]).args(args);
    let (status, stdout, stderr) = run_to_exit_within(cmd, CLIENT_RUN).await;
    assert!(status.success(), "curl {args:?} failed: {stderr}");
    stdout
}

/// The head lines of a `curl -i` output, lower-cased.
pub fn head_lines(output: &str) -> Vec<String> {
    output
        .lines()
        .take_while(|line| !line.trim().is_empty())
        .map(str::to_ascii_lowercase)
        .collect()
}
