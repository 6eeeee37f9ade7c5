//! What the bench sends: request `j` of a run is request `j % R` of key
//! `j / R`. Requests are handed out in that order, so the R requests of a
//! key leave back to back and meet at the gateway as a retry storm whenever
//! the concurrency is above 1.
//!
//! Keys look like the ones SDKs send: version-4 UUIDs, so they land at
//! random places in the store's identity index and a first write dirties
//! the index pages a real client's would. (Keys from a counter, such as
//! `bench-RUN-17`, sort next to each other and share a few pages: on this
//! machine they understated the bytes written per first write by 40 %.)
//! A key is derived from the run id and the key's number, so a retry
//! repeats it and another run never does.
//!
//! Invariant: every request of a key carries the same key, path and body,
//! except the retries chosen as "changed" (another amount, so another
//! fingerprint). Whichever of a key's requests arrives first is its one
//! upstream write; the others are replays, 409s or 422s.

use std::time::Duration;

use bytes::Bytes;
use sha2::{Digest, Sha256};

/// The fault paths of the mock API (see [`crate::mock_upstream`]), by key.
/// Keys `k % 10 == 0, 1, 2` get them; the rest go to the plain path.
const FAULTS: [&str; 3] = ["/drop", "/truncate", "/slow?ms=50"];
const FAULT_PERIOD: u64 = 10;

/// The golden ratio's fractional part: `j · φ mod 1` spreads any fraction
/// of the retries evenly over the run, deterministically.
const PHI: f64 = 0.618_033_988_749_894_9;

/// One run's requests.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Requests per key (R): the first write and R-1 retries.
    pub(crate) per_key: u64,
    /// The run ends after this many requests…
    pub(crate) requests: u64,
    /// …or when this much time has passed, whichever comes first.
    pub(crate) duration: Option<Duration>,
    pub(crate) concurrency: usize,
    pub(crate) body_bytes: usize,
    /// The fraction of retries sent with a changed payload.
    pub(crate) changed: f64,
    pub(crate) faults: bool,
    /// Keeps this run's keys apart from every earlier run's on the same store.
    pub(crate) run_id: String,
}

/// One request of the plan.
#[derive(Debug, Clone, PartialEq)]
pub struct Shot {
    pub(crate) key: String,
    /// Appended to the target's path: a fault path, or nothing.
    pub(crate) suffix: &'static str,
    pub(crate) body: Bytes,
}

impl Plan {
    /// Request `j` (0-based) of the run.
    pub(crate) fn shot(&self, j: u64) -> Shot {
        let key_index = j / self.per_key;
        let retry = j % self.per_key;
        let changed = retry > 0 && (j as f64 * PHI).fract() < self.changed;
        let suffix = match key_index % FAULT_PERIOD {
            n if self.faults && n < FAULTS.len() as u64 => FAULTS[n as usize],
            _ => "",
        };
        Shot {
            key: self.key(key_index),
            suffix,
            body: self.body(key_index, changed),
        }
    }

    /// The distinct keys among the first `sent` requests.
    pub(crate) fn keys_in(&self, sent: u64) -> u64 {
        sent.div_ceil(self.per_key)
    }

    /// Key `key_index` of this run: a version-4 UUID whose random bits are
    /// a digest of the run id and the number.
    fn key(&self, key_index: u64) -> String {
        let digest = Sha256::new()
            .chain_update(b"idemgate-bench-key\0")
            .chain_update(self.run_id.as_bytes())
            .chain_update(b"\0")
            .chain_update(key_index.to_be_bytes())
            .finalize();
        let mut random = [0u8; 16];
        random.copy_from_slice(&digest[..16]);
        uuid::Builder::from_random_bytes(random)
            .into_uuid()
            .hyphenated()
            .to_string()
    }

    /// A JSON body of `body_bytes` bytes (or the shortest one, if that is
    /// more): the key's order number, an amount, and padding.
    fn body(&self, key_index: u64, changed: bool) -> Bytes {
        let amount = if changed { 1001 } else { 1000 };
        let head = format!(r#"{{"order":{key_index},"amount":{amount},"pad":""#);
        let pad = self.body_bytes.saturating_sub(head.len() + 2);
        let mut body = String::with_capacity(head.len() + pad + 2);
        body.push_str(&head);
        body.extend(std::iter::repeat_n('x', pad));
        body.push_str("\"}");
        Bytes::from(body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(per_key: u64, changed: f64, faults: bool) -> Plan {
        Plan {
            per_key,
            requests: 10_000,
            duration: None,
            concurrency: 8,
            body_bytes: 100,
            changed,
            faults,
            run_id: "t".into(),
        }
    }

    #[test]
    fn a_keys_requests_are_consecutive_and_identical() {
        let p = plan(3, 0.0, false);
        let shots: Vec<Shot> = (0..6).map(|j| p.shot(j)).collect();
        assert_eq!(shots[0], shots[1]);
        assert_eq!(shots[1], shots[2]);
        assert_ne!(shots[2].key, shots[3].key);
        let key = uuid::Uuid::parse_str(&shots[3].key).expect("a UUID");
        assert_eq!(key.get_version(), Some(uuid::Version::Random));
        assert_eq!(shots[3].key, shots[5].key);
        let other_run = Plan {
            run_id: "u".into(),
            ..p.clone()
        };
        assert_ne!(other_run.shot(3).key, shots[3].key);
        assert_eq!(other_run.shot(3).key, other_run.shot(4).key);
        assert_eq!(p.keys_in(0), 0);
        assert_eq!(p.keys_in(4), 2);
        assert_eq!(p.keys_in(6), 2);
    }

    #[test]
    fn bodies_are_json_of_the_asked_size() {
        let p = plan(1, 0.0, false);
        let body = p.shot(7).body;
        assert_eq!(body.len(), 100);
        let value: serde_json::Value = serde_json::from_slice(&body).expect("json");
        assert_eq!(value["order"], 7);
        let tiny = Plan {
            body_bytes: 1,
            ..p.clone()
        };
        let shortest = tiny.shot(7).body;
        assert!(serde_json::from_slice::<serde_json::Value>(&shortest).is_ok());
    }

    #[test]
    fn changed_payloads_are_only_retries_in_the_asked_fraction() {
        let p = plan(4, 0.25, false);
        let mut changed = 0;
        for j in 0..10_000 {
            let shot = p.shot(j);
            let first = p.shot(j - j % 4);
            if shot.body != first.body {
                assert_ne!(j % 4, 0, "a first write is never changed");
                changed += 1;
            }
        }
        // 7,500 retries, a quarter of them changed.
        assert!((1_800..=1_950).contains(&changed), "{changed}");
        let unchanged = plan(4, 0.0, false);
        assert!((0..100).all(|j| unchanged.shot(j) == unchanged.shot(j - j % 4)));
    }

    #[test]
    fn faults_take_three_keys_in_ten() {
        let p = plan(2, 0.0, true);
        let suffixes: Vec<&str> = (0..20).map(|j| p.shot(j).suffix).collect();
        assert_eq!(&suffixes[..6], &FAULTS.map(|f| [f, f]).concat()[..]);
        assert!(suffixes[6..].iter().all(|s| s.is_empty()));
        assert!((0..20).all(|j| plan(2, 0.0, false).shot(j).suffix.is_empty()));
    }
}
