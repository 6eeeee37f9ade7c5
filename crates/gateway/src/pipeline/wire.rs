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
use crate::pipeline::key::{self, KeyError};
use crate::pipeline::replay::IDEMPOTENT_REPLAYED;
use crate::profile::{EchoKey, REPEATABILITY_RESULT, Wire};
use idemgate_model::clock;

/// How long a first-sent time may be behind and ahead of the gateway's
/// clock: the store's retention behind, the route's `first_sent_skew`
/// ahead.
#[derive(Debug, Clone, Copy)]
pub struct FirstSentWindow {
    pub(crate) retention: Duration,
    pub(crate) skew: Duration,
}

/// Refuses a repeatable request whose `Repeatability-First-Sent` is
/// missing, unreadable, older than the retention less the skew before
/// `now` (ms since the epoch), or further ahead of `now` than the skew. Older, its
/// operation may have been deleted, so whether it already happened cannot
/// be told; ahead, it would still look recent once its operation is
/// deleted, and a retry would be sent again. A profile without the header
/// passes everything.
pub fn check_first_sent(
    wire: &Wire,
    headers: &HeaderMap,
    now: i64,
    window: FirstSentWindow,
) -> Result<(), ProxyError> {
    let Some(header) = wire.first_sent else {
        return Ok(());
    };
    let text = key::one_of(headers, header)?
        .ok_or(KeyError::FirstSentMissing { header })?
        .to_str()
        .map_err(|_| KeyError::FirstSentInvalid { header })?;
    // A time up to the skew ahead was taken at the first send: its retries
    // must stop looking recent the skew sooner, or the last of them would
    // come after the operation was deleted.
    let tracked = window.retention.saturating_sub(window.skew);
    let too_old = || ProxyError::FirstSentTooOld {
        first_sent: text.to_string(),
        tracked,
    };
    let sent_ms = match http_date_millis(text, now) {
        Ok(ms) => ms,
        Err(HttpDateError::BeforeTheEpoch) => return Err(too_old()),
        Err(HttpDateError::Invalid) => return Err(KeyError::FirstSentInvalid { header }.into()),
    };
    if now.saturating_sub(sent_ms) > clock::millis(tracked) {
        return Err(too_old());
    }
    if sent_ms.saturating_sub(now) > clock::millis(window.skew) {
        return Err(KeyError::FirstSentAhead {
            header,
            skew: window.skew,
        }
        .into());
    }
    Ok(())
}

/// Why an HTTP-date was not read.
#[derive(Debug, PartialEq, Eq)]
enum HttpDateError {
    Invalid,
    /// A valid date before 1970 (a two-digit year read as the last century).
    BeforeTheEpoch,
}

/// An HTTP-date in any of the three forms RFC 9110 §5.6.7 makes recipients
/// accept (IMF-fixdate, RFC 850, asctime), as ms since the epoch. An RFC
/// 850 date's two-digit year is read as §5.6.7 says: in this century unless
/// that is more than 50 years after `now`, else in the last one. A leap
/// second (second 60, which §5.6.7 allows and `httpdate` refuses) is read
/// as the second before it.
fn http_date_millis(text: &str, now: i64) -> Result<i64, HttpDateError> {
    let mut imf = match rfc850_as_imf_fixdate(text, now) {
        Some(Ok(imf)) => imf,
        Some(Err(error)) => return Err(error),
        None => text.to_string(),
    };
    // The seconds are the only part of a date that a space follows after
    // a `:`, in every form.
    if let Some(at) = imf.find(":60 ") {
        imf.replace_range(at..at + 3, ":59");
    }
    let Ok(sent) = httpdate::parse_http_date(&imf) else {
        return Err(match four_centuries_on(&imf) {
            Some(later) if httpdate::parse_http_date(&later).is_ok() => {
                HttpDateError::BeforeTheEpoch
            }
            _ => HttpDateError::Invalid,
        });
    };
    let ms = sent
        .duration_since(UNIX_EPOCH)
        .map_err(|_| HttpDateError::BeforeTheEpoch)?
        .as_millis();
    Ok(i64::try_from(ms).unwrap_or(i64::MAX))
}

/// An IMF-fixdate or asctime date of a year before 1970, which `httpdate`
/// refuses as it does a malformed one, with the year 400 years on, or
/// 800, past 1969: the Gregorian calendar repeats every 400 years,
/// weekdays included, so that date is well formed exactly when this one
/// is. `None` when `text` has no year before 1970 (its one four-digit
/// part: an IMF-fixdate's day and an asctime's have one or two).
fn four_centuries_on(text: &str) -> Option<String> {
    let mut parts = text.split(' ');
    let year = parts.find(|part| part.len() == 4 && part.bytes().all(|b| b.is_ascii_digit()))?;
    let year: u32 = year.parse().ok()?;
    if year >= 1970 {
        return None;
    }
    let later = year + (1970 - year).div_ceil(400) * 400;
    let at = text.find(&format!(" {year:04}"))? + 1;
    Some(format!("{}{later:04}{}", &text[..at], &text[at + 4..]))
}

/// An RFC 850 date (`Sunday, 06-Nov-94 08:49:37 GMT`) rewritten as the
/// IMF-fixdate of the year §5.6.7 reads it as; `None` when `text` is not
/// in that form.
fn rfc850_as_imf_fixdate(text: &str, now: i64) -> Option<Result<String, HttpDateError>> {
    const WEEKDAYS: [&str; 7] = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
    let (weekday, rest) = text.split_once(", ")?;
    let rest = rest.as_bytes();
    // `06-Nov-94 08:49:37 GMT`
    if rest.len() != 22 || rest[2] != b'-' || rest[6] != b'-' {
        return None;
    }
    let (Some(day), Some(month), Some(two_digits), Some(time)) = (
        text.get(weekday.len() + 2..weekday.len() + 4),
        text.get(weekday.len() + 5..weekday.len() + 8),
        text.get(weekday.len() + 9..weekday.len() + 11),
        text.get(weekday.len() + 12..),
    ) else {
        return Some(Err(HttpDateError::Invalid));
    };
    let digits = two_digits.bytes().all(|b| b.is_ascii_digit());
    let (true, Ok(yy), Some(b' ')) = (digits, two_digits.parse::<i64>(), rest.get(9)) else {
        return Some(Err(HttpDateError::Invalid));
    };
    // The latest year with these two digits that is not more than 50
    // years ahead of now.
    let this_year = year_of(now);
    let century = this_year / 100 * 100;
    let year = [century + 100 + yy, century + yy, century - 100 + yy]
        .into_iter()
        .find(|year| *year <= this_year + 50)
        .unwrap_or(century - 100 + yy);
    if !WEEKDAYS.contains(&weekday) {
        return Some(Err(HttpDateError::Invalid));
    }
    if year < 1970 {
        return Some(Err(HttpDateError::BeforeTheEpoch));
    }
    let short = &weekday[..3];
    Some(Ok(format!("{short}, {day} {month} {year} {time}")))
}

/// The UTC year of `now` (ms since the epoch).
fn year_of(now: i64) -> i64 {
    let at = UNIX_EPOCH + Duration::from_millis(u64::try_from(now).unwrap_or(0));
    // `Sun, 06 Nov 1994 08:49:37 GMT`: the year is at 12..16.
    httpdate::fmt_http_date(at)
        .get(12..16)
        .and_then(|year| year.parse().ok())
        .unwrap_or(1970)
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
    use http_body_util::BodyExt;

    const WINDOW: FirstSentWindow = FirstSentWindow {
        retention: Duration::from_secs(300),
        skew: Duration::from_secs(60),
    };

    fn first_sent(value: Option<&str>, now: i64) -> Result<(), ProxyError> {
        let mut headers = HeaderMap::new();
        if let Some(value) = value {
            headers.insert(
                "repeatability-first-sent",
                HeaderValue::from_str(value).unwrap(),
            );
        }
        check_first_sent(Profile::Oasis.wire(), &headers, now, WINDOW)
    }

    // Tue, 01 Dec 2026 12:00:00 GMT
    const SENT: i64 = 1_796_126_400_000;
    const DATE: &str = "Tue, 01 Dec 2026 12:00:00 GMT";

    #[test]
    fn first_sent_is_required_readable_and_recent() {
        // Tracked for the retention less the skew: a first send taken a
        // skew ahead still has its operation when its last retry comes.
        assert!(first_sent(Some(DATE), SENT + 240_000).is_ok());
        assert!(matches!(
            first_sent(Some(DATE), SENT + 240_001),
            Err(ProxyError::FirstSentTooOld { .. })
        ));
        assert!(matches!(
            first_sent(None, SENT),
            Err(ProxyError::InvalidKey(KeyError::FirstSentMissing { .. }))
        ));
        assert!(matches!(
            first_sent(Some("2026-12-01T12:00:00Z"), SENT),
            Err(ProxyError::InvalidKey(KeyError::FirstSentInvalid { .. }))
        ));
        let idemgate = check_first_sent(
            Profile::Idemgate.wire(),
            &HeaderMap::new(),
            0,
            FirstSentWindow {
                retention: Duration::ZERO,
                skew: Duration::ZERO,
            },
        );
        assert!(idemgate.is_ok());
    }

    #[test]
    fn first_sent_ahead_of_the_clock_only_within_the_skew() {
        // A client clock a minute ahead is taken; one further ahead would
        // keep its request "recent" past the retention (a second send).
        assert!(first_sent(Some(DATE), SENT - 60_000).is_ok());
        assert!(matches!(
            first_sent(Some(DATE), SENT - 60_001),
            Err(ProxyError::InvalidKey(KeyError::FirstSentAhead { .. }))
        ));
        let a_day_ahead = first_sent(Some(DATE), SENT - 86_400_000).unwrap_err();
        let problem = a_day_ahead.into_response_as(Profile::Oasis.wire());
        assert_eq!(problem.status(), 400);
        assert_eq!(
            problem.headers()[crate::profile::REPEATABILITY_RESULT],
            "rejected"
        );
    }

    #[test]
    fn first_sent_is_read_in_all_three_http_date_forms() {
        for form in [
            DATE,
            "Tuesday, 01-Dec-26 12:00:00 GMT",
            "Tue Dec  1 12:00:00 2026",
        ] {
            assert!(first_sent(Some(form), SENT).is_ok(), "{form}");
        }
        assert_eq!(
            http_date_millis("Tuesday, 01-Dec-26 12:00:00 GMT", SENT),
            Ok(SENT)
        );
        // The weekday must be the date's, and spelled out.
        assert!(first_sent(Some("Monday, 01-Dec-26 12:00:00 GMT"), SENT).is_err());
        assert!(first_sent(Some("Tuesxx, 01-Dec-26 12:00:00 GMT"), SENT).is_err());
    }

    #[test]
    fn a_leap_second_is_read_as_the_second_before_it() {
        // RFC 9110 §5.6.7: second 60 is a leap second, in every form.
        let leap = [
            (
                "Sat, 31 Dec 2016 23:59:60 GMT",
                "Sat, 31 Dec 2016 23:59:59 GMT",
            ),
            (
                "Saturday, 31-Dec-16 23:59:60 GMT",
                "Saturday, 31-Dec-16 23:59:59 GMT",
            ),
            ("Sat Dec 31 23:59:60 2016", "Sat Dec 31 23:59:59 2016"),
        ];
        for (leap, before) in leap {
            let read = http_date_millis(leap, SENT);
            assert_eq!(read, http_date_millis(before, SENT), "{leap}");
            assert!(read.is_ok(), "{leap}");
        }
        assert_eq!(
            http_date_millis("Sat, 31 Dec 2016 23:59:61 GMT", SENT),
            Err(HttpDateError::Invalid)
        );
    }

    #[test]
    fn two_digit_years_more_than_50_years_ahead_are_the_last_century() {
        // 2076 is 50 years after 2026: this century. 2077 is further: 1977.
        let year = |text: &str| {
            let ms = http_date_millis(text, SENT).unwrap();
            year_of(ms)
        };
        assert_eq!(year("Sunday, 01-Nov-76 00:00:00 GMT"), 2076);
        assert_eq!(year("Tuesday, 01-Nov-77 00:00:00 GMT"), 1977);
        assert_eq!(year("Friday, 01-Nov-69 00:00:00 GMT"), 2069);
        // Read as this century, 69 is far ahead: refused, never taken as recent.
        assert!(matches!(
            first_sent(Some("Friday, 01-Nov-69 00:00:00 GMT"), SENT),
            Err(ProxyError::InvalidKey(KeyError::FirstSentAhead { .. }))
        ));
        // Near a century's end the next one is read: in 2099, 00 is 2100.
        let in_2099 = 4_070_908_800_000; // 2099-01-01
        assert_eq!(
            year_of(http_date_millis("Friday, 01-Jan-00 00:00:00 GMT", in_2099).unwrap()),
            2100
        );
        // Two digits, then a space: nothing else is a year.
        for odd in [
            "Tuesday, 01-Dec--6 12:00:00 GMT",
            "Tuesday, 01-Dec-+6 12:00:00 GMT",
            "Tuesday, 01-Dec-26x12:00:00 GMT",
        ] {
            assert_eq!(
                http_date_millis(odd, SENT),
                Err(HttpDateError::Invalid),
                "{odd}"
            );
        }
        // Before 1970 in the forms with four-digit years too: 412, not
        // "not an HTTP-date" (`httpdate` refuses them as malformed).
        for before in [
            "Wed, 31 Dec 1969 23:59:59 GMT",
            "Wed Dec 31 23:59:59 1969",
            "Wed, 01 Jan 1000 00:00:00 GMT",
        ] {
            assert_eq!(
                http_date_millis(before, SENT),
                Err(HttpDateError::BeforeTheEpoch),
                "{before}"
            );
        }
        for malformed in [
            "Thu, 31 Dec 1969 23:59:59 GMT",
            "Wed, 32 Dec 1969 23:59:59 GMT",
        ] {
            assert_eq!(
                http_date_millis(malformed, SENT),
                Err(HttpDateError::Invalid),
                "{malformed}"
            );
        }
        // In 2015, 69 is 2069 - 54 years ahead - so 1969, before the
        // epoch: older than any retention.
        let now_2015 = 1_433_116_800_000;
        assert_eq!(
            http_date_millis("Wednesday, 01-Jan-69 00:00:00 GMT", now_2015),
            Err(HttpDateError::BeforeTheEpoch)
        );
    }

    #[tokio::test]
    async fn oasis_answers_name_the_headers_it_reads() {
        use crate::pipeline::error::OperationRef;
        use idemgate_model::operation::State;
        let operation = || OperationRef {
            id: "op".into(),
            state: State::InProgress,
        };
        let errors = [
            ProxyError::MissingKey,
            ProxyError::InvalidKey(KeyError::Empty),
            ProxyError::InvalidKey(KeyError::Several),
            ProxyError::KeyReused {
                operation: operation(),
            },
            ProxyError::InProgress {
                operation: operation(),
            },
        ];
        for error in errors {
            let shown = format!("{error:?}");
            let problem = error.into_response_as(Profile::Oasis.wire());
            let body = problem.into_body().collect().await.unwrap().to_bytes();
            let body = String::from_utf8(body.to_vec()).unwrap();
            assert!(!body.contains("Idempotency-Key"), "{shown}: {body}");
            assert!(body.contains("Repeatability-Request-ID"), "{shown}: {body}");
        }
    }
}
