//! A new operation's id: a UUIDv7 (RFC 9562 §5.7), time-ordered, drawn
//! without a system call.
//!
//! `Uuid::now_v7` asks the OS for fresh randomness on every call: one
//! `getrandom(2)` per claim on the SQLite writer thread, the thread every
//! first write waits on. An id must be unique and sort by creation; it is
//! not a secret (it names an operation to operators, who hold the admin
//! token). So the random bits come from the thread's `fastrand`
//! generator, seeded once per thread from std's randomly keyed hasher, and
//! within one millisecond the 12 bits after the timestamp are a counter
//! (RFC 9562 §6.2, method 1): one thread's ids sort in the order it made
//! them, as `now_v7`'s did. The store's unique primary key would refuse a
//! collision rather than merge two operations.

use std::cell::Cell;
use std::time::{SystemTime, UNIX_EPOCH};

/// The counter's largest value (12 bits).
const COUNTER_MAX: u16 = 0x0FFF;

thread_local! {
    /// The millisecond and counter of this thread's last id.
    static LAST: Cell<(u64, u16)> = const { Cell::new((0, 0)) };
}

/// A new id, in the canonical hyphenated form.
pub fn new_id() -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    next(now).to_string()
}

/// The id after this thread's last, at `now` ms (or later: a clock that
/// stepped back, or 4,096 ids in one millisecond, borrow the next one).
fn next(now: u64) -> uuid::Uuid {
    let (millis, counter) = LAST.with(|last| {
        let (last_millis, last_counter) = last.get();
        // A new millisecond starts its counter in the lower half, so the
        // next ids of that millisecond have room to count up.
        let next = if now > last_millis {
            (now, fastrand::u16(..=COUNTER_MAX / 2))
        } else if last_counter < COUNTER_MAX {
            (last_millis, last_counter + 1)
        } else {
            (last_millis + 1, fastrand::u16(..=COUNTER_MAX / 2))
        };
        last.set(next);
        next
    });
    let mut bytes = [0u8; 10];
    bytes[..2].copy_from_slice(&counter.to_be_bytes());
    bytes[2..].copy_from_slice(&fastrand::u64(..).to_be_bytes());
    uuid::Builder::from_unix_timestamp_millis(millis, &bytes).into_uuid()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ids are version-7 UUIDs that sort in the order they were made,
    /// through a millisecond's worth of counter and a clock that steps
    /// back.
    #[test]
    fn ids_sort_in_the_order_they_were_made() {
        let mut ids = vec![next(1_000)];
        for now in [1_000; 5000].into_iter().chain([999, 5_000, 5_000, 4_000]) {
            ids.push(next(now));
        }
        for pair in ids.windows(2) {
            assert!(pair[0] < pair[1], "{} then {}", pair[0], pair[1]);
        }
        assert!(ids.iter().all(|id| id.get_version_num() == 7));
        let strings: Vec<String> = ids.iter().map(|id| id.to_string()).collect();
        let mut sorted = strings.clone();
        sorted.sort();
        assert_eq!(strings, sorted, "their text sorts as they do");
    }

    #[test]
    fn an_id_carries_the_millisecond_it_was_made_in() {
        let id = next(1_700_000_000_123);
        let (seconds, nanos) = id.get_timestamp().unwrap().to_unix();
        assert_eq!((seconds, nanos / 1_000_000), (1_700_000_000, 123));
    }
}
