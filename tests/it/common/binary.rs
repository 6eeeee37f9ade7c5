//! The real binary: [`BinaryGateway`] (`idemgate serve`) and [`BinaryMock`]
//! (`idemgate mock-upstream`), and helpers to run and read processes.

use super::*;

/// A running `idemgate serve` process; killed (SIGKILL) when dropped.
pub struct BinaryGateway {
    child: Child,
    // Kept open: the process must never see a closed stdout.
    _stdout: std::io::BufReader<std::process::ChildStdout>,
    pub proxy: SocketAddr,
    pub admin: SocketAddr,
    pub stderr_path: PathBuf,
}

pub fn binary() -> Command {
    Command::new(env!("CARGO_BIN_EXE_idemgate"))
}

/// Writes `toml` to `dir/name` and returns its path.
pub fn write_config(dir: &Path, name: &str, toml: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, toml).expect("write config");
    path
}

impl BinaryGateway {
    /// Starts `idemgate serve --config FILE`, stderr into `stderr_path`, and
    /// waits for its `listening proxy=… admin=…` line.
    pub async fn start(config: &Path, stderr_path: &Path) -> BinaryGateway {
        let mut cmd = binary();
        cmd.arg("serve").arg("--config").arg(config);
        BinaryGateway::spawn(cmd, stderr_path).await
    }

    /// Spawns `cmd` (an `idemgate serve …`), stderr into `stderr_path`, and
    /// waits for its `listening proxy=… admin=…` line.
    pub async fn spawn(cmd: Command, stderr_path: &Path) -> BinaryGateway {
        let (child, reader, line) = spawn_until_first_line(cmd, stderr_path).await;
        let (proxy, admin) = parse_listening_line(&line);
        BinaryGateway {
            child,
            _stdout: reader,
            proxy,
            admin,
            stderr_path: stderr_path.to_owned(),
        }
    }

    /// SIGKILL (what `Child::kill` sends on Unix) and reap.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn stderr(&self) -> String {
        read_to_string(&self.stderr_path)
    }

    /// The process's id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its stderr once it contains `needle` (bounded by [`WAIT`]).
    pub async fn wait_for_log(&self, needle: &str) -> String {
        within_wait(|| async {
            let logged = self.stderr();
            logged.contains(needle).then_some(logged)
        })
        .await
        .unwrap_or_else(|| panic!("{needle:?} never logged:\n{}", self.stderr()))
    }

    /// Waits (up to [`WAIT`]) for the process to end, as after a SIGTERM
    /// it ends once its shutdown is done, and reaps it.
    pub async fn wait_for_exit(&mut self) -> std::process::ExitStatus {
        let child = &mut self.child;
        eventually("the process to exit", || {
            std::future::ready(child.try_wait().expect("wait for the process"))
        })
        .await
    }

    /// Sends the process signal `name` (`HUP`, `TERM`, …) with `kill -s`.
    pub fn signal(&self, name: &str) {
        let status = child_status(
            Command::new("kill")
                .arg("-s")
                .arg(name)
                .arg(self.child.id().to_string()),
        )
        .expect("run kill");
        assert!(status.success(), "kill -s {name} failed");
    }
}

impl Drop for BinaryGateway {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Spawns `cmd`, stderr into `stderr_path`, and waits (up to [`WAIT`]) for
/// the first line on its stdout; the reader stays open with the child.
pub async fn spawn_until_first_line(
    mut cmd: Command,
    stderr_path: &Path,
) -> (Child, std::io::BufReader<std::process::ChildStdout>, String) {
    let stderr = std::fs::File::create(stderr_path).expect("stderr file");
    let mut child = spawn_child(
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr),
    )
    .expect("spawn idemgate");
    let stdout = child.stdout.take().expect("stdout piped");
    let read = tokio::task::spawn_blocking(move || {
        let mut reader = std::io::BufReader::new(stdout);
        let mut line = String::new();
        let n = reader.read_line(&mut line).expect("read stdout");
        (reader, line, n)
    });
    let (reader, line, n) = match tokio::time::timeout(WAIT, read).await {
        Ok(joined) => joined.expect("stdout reader"),
        Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "no listening line within {WAIT:?}; stderr:\n{}",
                read_to_string(stderr_path)
            );
        }
    };
    if n == 0 {
        let status = child.wait().expect("wait");
        panic!(
            "idemgate exited ({status}) before listening; stderr:\n{}",
            read_to_string(stderr_path)
        );
    }
    (child, reader, line)
}

/// A running `idemgate mock-upstream` process; killed when dropped.
pub struct BinaryMock {
    child: Child,
    _stdout: std::io::BufReader<std::process::ChildStdout>,
    pub addr: SocketAddr,
}

impl BinaryMock {
    /// Starts `idemgate mock-upstream --listen 127.0.0.1:0` and waits for
    /// its `listening mock=ADDR` line.
    pub async fn start(stderr_path: &Path) -> BinaryMock {
        let mut cmd = binary();
        cmd.arg("mock-upstream").arg("--listen").arg("127.0.0.1:0");
        let (child, reader, line) = spawn_until_first_line(cmd, stderr_path).await;
        let addr = line
            .trim_end()
            .strip_prefix("listening mock=")
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("mock startup line: {line:?}"));
        BinaryMock {
            child,
            _stdout: reader,
            addr,
        }
    }
}

impl Drop for BinaryMock {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn read_to_string(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// Parses `listening proxy=ADDR admin=ADDR`.
pub fn parse_listening_line(line: &str) -> (SocketAddr, SocketAddr) {
    let mut words = line.split_whitespace();
    assert_eq!(words.next(), Some("listening"), "startup line: {line:?}");
    let mut field = |prefix: &str| -> SocketAddr {
        words
            .next()
            .and_then(|w| w.strip_prefix(prefix))
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("startup line lacks {prefix}ADDR: {line:?}"))
    };
    let proxy = field("proxy=");
    let admin = field("admin=");
    assert_eq!(words.next(), None, "startup line has extra words: {line:?}");
    (proxy, admin)
}

/// Runs `cmd` to completion within [`WAIT`] (killing it otherwise) and
/// returns (exit status, stdout, stderr).
pub async fn run_to_exit(cmd: Command) -> (std::process::ExitStatus, String, String) {
    run_to_exit_within(cmd, WAIT).await
}

/// Like [`run_to_exit`], bounded by `within` (for processes that wait on
/// their own retries and backoff, like real client SDKs).
pub async fn run_to_exit_within(
    mut cmd: Command,
    within: Duration,
) -> (std::process::ExitStatus, String, String) {
    let program = cmd.get_program().to_string_lossy().into_owned();
    let child = spawn_child(
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    )
    .unwrap_or_else(|e| panic!("spawn {program}: {e}"));
    let pid = child.id();
    let output = tokio::task::spawn_blocking(move || child.wait_with_output());
    match tokio::time::timeout(within, output).await {
        Ok(out) => {
            let out = out.expect("join").expect("wait_with_output");
            (
                out.status,
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            )
        }
        Err(_) => {
            // The child moved into the blocking task; kill it by its own pid.
            let _ = child_status(Command::new("kill").arg("-9").arg(pid.to_string()));
            panic!("{program} (pid {pid}) still running after {within:?}");
        }
    }
}
