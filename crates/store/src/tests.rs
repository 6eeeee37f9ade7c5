//! Unit tests of `crates/store/src/lib.rs`: stored headers as bytes, and the timeline
//! an operation's row implies beside its stored events.

use super::*;
use crate::backend::{decode_headers, encode_headers, is_implied_by_record};

#[test]
fn headers_round_trip_bytes_exactly() {
    let headers = vec![
        ("set-cookie".to_string(), b"a=1".to_vec()),
        ("set-cookie".to_string(), b"b=2".to_vec()),
        ("x-latin".to_string(), vec![b'c', 0xe9, 0xff]),
    ];
    assert_eq!(decode_headers(&encode_headers(&headers)).unwrap(), headers);
    assert!(decode_headers("[[\"x\",\"\u{20ac}\"]]").is_err());
}

fn completed(created_at: i64, updated_at: i64) -> Operation {
    Operation {
        id: "op".into(),
        route: "r".into(),
        key: "k".into(),
        fingerprint: Fingerprint::from_stored("f".into()),
        state: State::Completed,
        attempt: 1,
        owner: Some("gw-1".into()),
        evidence: "response".into(),
        response: Some(StoredResponse {
            status: 201,
            headers: vec![],
            body: Some(b"{}".to_vec()),
        }),
        request: RequestSummary {
            method: "POST".into(),
            path: "/".into(),
            content_type: None,
            body_size: 7,
            body_sha256: String::new(),
            body: None,
        },
        superseded: false,
        created_at,
        updated_at,
    }
}

fn event(at: i64, kind: &str, detail: serde_json::Value) -> StoredEvent {
    StoredEvent {
        at,
        kind: kind.into(),
        detail,
    }
}

fn kinds(events: &[StoredEvent]) -> Vec<(i64, &str)> {
    events.iter().map(|e| (e.at, e.kind.as_str())).collect()
}

#[test]
fn the_happy_path_timeline_comes_from_the_row() {
    let events = timeline(&completed(10, 20), vec![]);
    assert_eq!(
        kinds(&events),
        [(10, "claimed"), (10, "sent"), (20, "response")]
    );
    assert_eq!(
        events[0].detail,
        serde_json::json!({"attempt": 1, "owner": "gw-1"})
    );
    assert_eq!(
        events[1].detail,
        serde_json::json!({"tries": 1, "bytes": 7})
    );
    assert_eq!(
        events[2].detail,
        serde_json::json!({"status": 201, "bytes": 2})
    );
    // Stored events keep their place among the implied ones.
    let late = event(30, "late-response", serde_json::json!({}));
    let events = timeline(&completed(10, 20), vec![late]);
    assert_eq!(kinds(&events).last(), Some(&(30, "late-response")));
}

/// A `sent` is recorded with the write's outcome; a timeout's came
/// `upstream_timeout` after the write left, and the timeline showed it
/// leaving then: it shows it `took_ms` earlier.
#[test]
fn a_sent_event_is_shown_when_the_write_left() {
    let mut held = completed(10, 30_020);
    held.evidence = "timeout".into();
    let stored = vec![
        event(
            30_020,
            "sent",
            serde_json::json!({"tries": 1, "took_ms": 30_000}),
        ),
        event(30_020, "timeout", serde_json::json!({})),
    ];
    assert_eq!(
        kinds(&timeline(&held, stored)),
        [(10, "claimed"), (20, "sent"), (30_020, "timeout")]
    );
}

#[test]
fn stored_events_are_never_implied_twice() {
    // A second attempt whose response was stored (it took connect retries).
    let stored = vec![
        event(12, "connect-failed", serde_json::json!({})),
        event(15, "claimed", serde_json::json!({"attempt": 2})),
        event(20, "sent", serde_json::json!({"tries": 2})),
        event(20, "response", serde_json::json!({"status": 201})),
    ];
    let events = timeline(&completed(10, 20), stored);
    assert_eq!(
        kinds(&events),
        [
            (10, "claimed"),
            (12, "connect-failed"),
            (15, "claimed"),
            (20, "sent"),
            (20, "response")
        ]
    );
    // Settled by an operator: no response is implied.
    let mut resolved = completed(10, 20);
    resolved.evidence = "operator".into();
    assert_eq!(kinds(&timeline(&resolved, vec![])), [(10, "claimed")]);
}

#[test]
fn only_a_plain_first_try_is_implied_by_its_record() {
    let response = Settlement::Completed {
        response: completed(0, 0).response.unwrap(),
    };
    let sent = |tries| Event {
        kind: "sent",
        detail: serde_json::json!({ "tries": tries }),
    };
    let answer = Event {
        kind: "response",
        detail: serde_json::json!({}),
    };
    let response = response.state();
    assert!(is_implied_by_record(response, &[sent(1), answer.clone()]));
    assert!(!is_implied_by_record(response, &[sent(2), answer.clone()]));
    let held = Settlement::Unknown {
        evidence: "timeout".into(),
    };
    assert!(!is_implied_by_record(held.state(), &[sent(1), answer]));
}
