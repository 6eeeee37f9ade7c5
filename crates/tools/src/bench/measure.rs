//! What the bench reads besides its own answers: the upstream's write
//! counter, a process's resident memory, a store's size on disk.
//!
//! Invariant: a figure that cannot be read is reported as absent, never
//! guessed — except the write counter, without which the exactly-once
//! verdict would be a guess, so failing to read it fails the run.

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full, Limited};

use super::BenchError;
use super::load::HttpClient;

/// Bound on reading the counter: it is one small GET on loopback.
const COUNTER_WAIT: Duration = Duration::from_secs(10);
/// The counter's answer is a few bytes; anything larger is not the mock.
const COUNTER_MAX_BYTES: usize = 64 * 1024;

/// The mock API's `GET /_effects` answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Effects {
    pub(crate) writes: u64,
    /// Distinct keys written under; absent from counters that do not say.
    pub(crate) keys: Option<u64>,
}

impl Effects {
    /// What happened between `before` and `self`.
    pub fn since(self, before: Effects) -> Effects {
        Effects {
            writes: self.writes.saturating_sub(before.writes),
            keys: self
                .keys
                .zip(before.keys)
                .map(|(now, then)| now.saturating_sub(then)),
        }
    }
}

/// Reads the write counter at `url` (`{"writes": n, "keys": m}`).
pub async fn effects(client: &HttpClient, url: &str) -> Result<Effects, BenchError> {
    let failed = |reason: String| BenchError::Counter {
        url: url.to_string(),
        reason,
    };
    let request = Request::get(url)
        .body(Full::new(Bytes::new()))
        .map_err(|e| failed(e.to_string()))?;
    let read = async {
        let response = client
            .request(request)
            .await
            .map_err(|e| failed(e.to_string()))?;
        let status = response.status();
        let body = Limited::new(response.into_body(), COUNTER_MAX_BYTES)
            .collect()
            .await
            .map_err(|e| failed(e.to_string()))?
            .to_bytes();
        if !status.is_success() {
            return Err(failed(format!("answered {status}")));
        }
        let value: serde_json::Value =
            serde_json::from_slice(&body).map_err(|e| failed(format!("not JSON: {e}")))?;
        let writes = value["writes"]
            .as_u64()
            .ok_or_else(|| failed("no `writes` number in the answer".into()))?;
        Ok(Effects {
            writes,
            keys: value["keys"].as_u64(),
        })
    };
    tokio::time::timeout(COUNTER_WAIT, read)
        .await
        .map_err(|_| failed(format!("no answer within {COUNTER_WAIT:?}")))?
}

/// Resident memory in bytes (`VmRSS`) of process `pid`, or of this process.
pub fn resident_bytes(pid: Option<u32>) -> Option<u64> {
    let path = match pid {
        Some(pid) => format!("/proc/{pid}/status"),
        None => "/proc/self/status".to_string(),
    };
    vm_rss(&std::fs::read_to_string(path).ok()?)
}

/// `VmRSS:   12345 kB` → bytes.
fn vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?;
    let kib: u64 = line.trim().strip_suffix("kB")?.trim().parse().ok()?;
    Some(kib * 1024)
}

/// A SQLite store's bytes on disk: the database file and its write-ahead
/// log (which holds the commits not yet checkpointed into the file).
pub fn store_bytes(file: &Path) -> Option<u64> {
    let main = std::fs::metadata(file).ok()?.len();
    let mut wal = file.as_os_str().to_owned();
    wal.push("-wal");
    Some(main + std::fs::metadata(wal).map_or(0, |m| m.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vm_rss_reads_the_kib_line() {
        let status = "Name:\tidemgate\nVmPeak:\t  9000 kB\nVmRSS:\t   12345 kB\nThreads: 3\n";
        assert_eq!(vm_rss(status), Some(12345 * 1024));
        assert_eq!(vm_rss("Name: x\n"), None);
        assert!(resident_bytes(None).is_some_and(|b| b > 0));
    }

    #[test]
    fn effects_since_subtracts_and_keeps_unknown_keys_unknown() {
        let before = Effects {
            writes: 5,
            keys: Some(4),
        };
        let after = Effects {
            writes: 25,
            keys: Some(24),
        };
        assert_eq!(
            after.since(before),
            Effects {
                writes: 20,
                keys: Some(20)
            }
        );
        let no_keys = Effects {
            writes: 25,
            keys: None,
        };
        assert_eq!(no_keys.since(before).keys, None);
    }
}
