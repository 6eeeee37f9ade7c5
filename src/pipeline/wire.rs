//! What a route's profile ([`crate::profile`]) adds to the request's
//! phases: the OASIS `Repeatability-First-Sent` check before anything is
//! claimed, and the headers every answer to a write carries — the key and
//! request id echoed (ACP §3.1), `Idempotent-Replayed` on replays or not,
//! `Repeatability-Result` (OASIS).
//!
//! Invariant: only headers change here, never a status or a body, and
//! nothing here decides whether a write is sent.

use std::time::{Duration, UNIX_EPOCH};

use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, Response};

use crate::body::ProxyBody;
use crate::metrics::Outcome;
use crate::pipeline::error::ProxyError;
use crate::pipeline::key::KeyError;
use crate::pipeline::replay::IDEMPOTENT_REPLAYED;
use crate::profile::{EchoKey, REPEATABILITY_RESULT, Wire};

/// Refuses a repeatable request whose `Repeatability-First-Sent` is
/// missing, unreadable, or older than `retention` before `now` (ms since
/// the epoch): whether it already happened cannot be told once its
/// operation may have been deleted. A profile without the header passes
/// everything.
pub fn check_first_sent(
    wire: &Wire,
    headers: &HeaderMap,
    now: i64,
    retention: Duration,
) -> Result<(), ProxyError> {
    let Some(header) = wire.first_sent else {
        return Ok(());
    };
    let text = headers
        .get(header)
        .ok_or(KeyError::FirstSentMissing { header })?
        .to_str()
        .map_err(|_| KeyError::FirstSentInvalid { header })?;
    let sent =
        httpdate::parse_http_date(text).map_err(|_| KeyError::FirstSentInvalid { header })?;
    let sent_ms = sent
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    let retention_ms = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
    if now.saturating_sub(sent_ms) > retention_ms {
        return Err(ProxyError::FirstSentTooOld {
            first_sent: text.to_string(),
            retention,
        });
    }
    Ok(())
}

/// The request's headers a profile echoes on its answer, taken before the
/// request is consumed.
pub struct Echoed {
    headers: Vec<(HeaderName, HeaderValue)>,
}

impl Echoed {
    /// What `wire` echoes of a request with `headers`: the key as sent
    /// (under [`EchoKey::Always`]) and the request headers it names.
    pub fn of(wire: &Wire, headers: &HeaderMap) -> Self {
        let key = match wire.echo_key {
            EchoKey::Always => wire.key_headers.first().copied(),
            EchoKey::Made => None,
        };
        let headers = key
            .into_iter()
            .chain(wire.echo_request_headers.iter().copied())
            .filter_map(|name| {
                let value = headers.get(name)?.clone();
                Some((HeaderName::from_static(name), value))
            })
            .collect();
        Echoed { headers }
    }

    /// Finishes an answer to a write as `wire` says: the echoed headers,
    /// no replay marker where the profile has none, and
    /// `Repeatability-Result: accepted` on whatever is not a refusal (the
    /// problem renderer marks those `rejected`).
    pub fn apply(self, wire: &Wire, response: &mut Response<ProxyBody>) {
        let replayed = response.extensions().get::<Outcome>() == Some(&Outcome::replayed);
        let headers = response.headers_mut();
        for (name, value) in self.headers {
            headers.insert(name, value);
        }
        if replayed && !wire.replayed_header {
            headers.remove(IDEMPOTENT_REPLAYED);
        }
        if wire.repeatability_result && !headers.contains_key(REPEATABILITY_RESULT) {
            headers.insert(REPEATABILITY_RESULT, HeaderValue::from_static("accepted"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::Profile;

    fn first_sent(value: Option<&str>, now: i64) -> Result<(), ProxyError> {
        let mut headers = HeaderMap::new();
        if let Some(value) = value {
            headers.insert(
                "repeatability-first-sent",
                HeaderValue::from_str(value).unwrap(),
            );
        }
        check_first_sent(
            Profile::Oasis.wire(),
            &headers,
            now,
            Duration::from_secs(300),
        )
    }

    #[test]
    fn first_sent_is_required_readable_and_recent() {
        // Tue, 01 Dec 2026 12:00:00 GMT
        let sent = 1_796_126_400_000;
        let date = "Tue, 01 Dec 2026 12:00:00 GMT";
        assert!(first_sent(Some(date), sent + 300_000).is_ok());
        assert!(
            first_sent(Some(date), sent - 60_000).is_ok(),
            "a client clock ahead"
        );
        assert!(matches!(
            first_sent(Some(date), sent + 300_001),
            Err(ProxyError::FirstSentTooOld { .. })
        ));
        assert!(matches!(
            first_sent(None, sent),
            Err(ProxyError::InvalidKey(KeyError::FirstSentMissing { .. }))
        ));
        assert!(matches!(
            first_sent(Some("2026-12-01T12:00:00Z"), sent),
            Err(ProxyError::InvalidKey(KeyError::FirstSentInvalid { .. }))
        ));
        let idemgate = check_first_sent(
            Profile::Idemgate.wire(),
            &HeaderMap::new(),
            0,
            Duration::ZERO,
        );
        assert!(idemgate.is_ok());
    }
}
