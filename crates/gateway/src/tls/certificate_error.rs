//! Why rustls refused a server's certificate, in words an operator, and
//! the API client whose write got the 502, can act on: rustls writes most
//! certificate errors, and every webpki error it has no variant for, in
//! their Debug form (`invalid peer certificate:
//! Other(OtherError(CaUsedAsEndEntity))`).
//!
//! Invariant: the words come from the error alone (its kind, the dates
//! and names it carries), never from a payload. The gateway verifies only
//! servers' certificates (its listeners ask for no client certificate), so
//! a refused certificate is always the server's.

use std::error::Error;
use std::time::{Duration, UNIX_EPOCH};

use rustls::CertificateError;
use rustls::pki_types::UnixTime;

/// `error`'s message and its causes' (`outer: cause`), a rustls error
/// among them in words ([`in_words`]).
pub fn error_chain(error: &(dyn Error + 'static)) -> String {
    idemgate_model::error_chain::error_chain_with(error, |link| {
        rustls_error(link).and_then(in_words)
    })
}

/// The rustls error `link` is, or carries in I/O errors (tokio-rustls
/// wraps it in one, hyper-rustls that in another).
fn rustls_error<'a>(mut link: &'a (dyn Error + 'static)) -> Option<&'a rustls::Error> {
    loop {
        if let Some(error) = link.downcast_ref::<rustls::Error>() {
            return Some(error);
        }
        link = link.downcast_ref::<std::io::Error>()?.get_ref()?;
    }
}

/// What a refused certificate's error says, in words; `None` for other
/// errors, whose message is readable already.
pub fn in_words(error: &rustls::Error) -> Option<String> {
    match error {
        rustls::Error::InvalidCertificate(error) => Some(format!(
            "the server's certificate was refused: {}",
            certificate(error)
        )),
        _ => None,
    }
}

fn certificate(error: &CertificateError) -> String {
    match error {
        CertificateError::BadEncoding => "it is not a well-formed X.509 certificate".into(),
        CertificateError::Expired => "it has expired".into(),
        CertificateError::ExpiredContext { time, not_after } => expired(*time, *not_after),
        CertificateError::NotValidYet => "it is not valid yet".into(),
        CertificateError::NotValidYetContext { time, not_before } => {
            not_yet_valid(*time, *not_before)
        }
        CertificateError::Revoked => "it is revoked".into(),
        CertificateError::UnknownIssuer => {
            "it is not issued by a trusted CA, nor is it a trusted root itself".into()
        }
        CertificateError::BadSignature => "its signature does not verify".into(),
        CertificateError::UnsupportedSignatureAlgorithmContext { .. }
        | CertificateError::UnsupportedSignatureAlgorithmForPublicKeyContext { .. } => {
            "it is signed with an algorithm that is not supported".into()
        }
        CertificateError::NotValidForName => {
            "it does not name the host connected to (subjectAltName)".into()
        }
        CertificateError::InvalidPurpose => {
            "its extended key usage does not allow server authentication".into()
        }
        CertificateError::UnhandledCriticalExtension => {
            "it has a critical extension that is not supported".into()
        }
        CertificateError::Other(other) => match other.0.downcast_ref::<webpki::Error>() {
            Some(error) => webpki_words(error),
            None => other.to_string(),
        },
        // Readable already (the names asked for and presented, the
        // purposes), or about revocation lists, which are not used here.
        other => other.to_string(),
    }
}

/// A webpki error in words; the dates and kinds rustls maps to its own
/// variants are said as those are.
pub(super) fn webpki_words(error: &webpki::Error) -> String {
    match error {
        webpki::Error::CertExpired { time, not_after } => expired(*time, *not_after),
        webpki::Error::CertNotValidYet { time, not_before } => not_yet_valid(*time, *not_before),
        webpki::Error::InvalidCertValidity => "its validity period ends before it begins".into(),
        webpki::Error::CaUsedAsEndEntity => "it is a CA certificate (CA:TRUE), which webpki \
             accepts only as an issuer, never as a server's own: a self-signed certificate \
             must be CA:FALSE, or be issued by a CA that is trusted"
            .into(),
        webpki::Error::EndEntityUsedAsCa => {
            "its chain has a certificate that is not a CA (CA:FALSE) issuing another".into()
        }
        webpki::Error::PathLenConstraintViolated => {
            "its chain is longer than an issuer's path length constraint allows".into()
        }
        webpki::Error::NameConstraintViolation => {
            "it names a host its issuer's name constraints do not allow".into()
        }
        webpki::Error::MaximumPathDepthExceeded => "its chain is too long".into(),
        webpki::Error::UnsupportedCertVersion => "it is not an X.509 v3 certificate".into(),
        webpki::Error::EmptyEkuExtension => "its extended key usage extension is empty".into(),
        webpki::Error::CertDistrusted => "it is issued by a CA that is distrusted".into(),
        // The rarer ones (malformed extensions, budgets exceeded) by name.
        other => format!("webpki refuses it ({other:?})"),
    }
}

fn expired(time: UnixTime, not_after: UnixTime) -> String {
    format!("it expired at {} (now {})", date(not_after), date(time))
}

fn not_yet_valid(time: UnixTime, not_before: UnixTime) -> String {
    format!(
        "it is valid only from {} (now {})",
        date(not_before),
        date(time)
    )
}

/// `time` in RFC 3339, to the second.
fn date(time: UnixTime) -> String {
    let at = UNIX_EPOCH + Duration::from_secs(time.as_secs());
    humantime::format_rfc3339_seconds(at).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn refused(error: CertificateError) -> rustls::Error {
        rustls::Error::InvalidCertificate(error)
    }

    #[test]
    fn a_webpki_error_rustls_has_no_variant_for_is_said_in_words() {
        let other = rustls::OtherError(Arc::new(webpki::Error::CaUsedAsEndEntity));
        let said = in_words(&refused(CertificateError::Other(other))).unwrap();
        assert!(
            said.starts_with(
                "the server's certificate was refused: it is a CA certificate (CA:TRUE)"
            ),
            "{said}"
        );
        assert!(!said.contains("Other("), "{said}");
    }

    #[test]
    fn dates_are_written_as_dates() {
        let expired = CertificateError::ExpiredContext {
            time: UnixTime::since_unix_epoch(Duration::from_secs(1_700_000_000)),
            not_after: UnixTime::since_unix_epoch(Duration::from_secs(1_609_459_200)),
        };
        assert_eq!(
            in_words(&refused(expired)).unwrap(),
            "the server's certificate was refused: it expired at 2021-01-01T00:00:00Z (now 2023-11-14T22:13:20Z)"
        );
    }

    #[test]
    fn a_rustls_error_inside_io_errors_is_found_and_other_errors_keep_their_words() {
        #[derive(Debug, thiserror::Error)]
        #[error("client error (Connect)")]
        struct Connect(#[source] std::io::Error);

        let io = std::io::Error::other(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            refused(CertificateError::UnknownIssuer),
        ));
        assert_eq!(
            error_chain(&Connect(io)),
            "client error (Connect): the server's certificate was refused: it is not issued by a trusted CA, nor is it a trusted root itself"
        );
        let closed = std::io::Error::other("connection closed");
        assert_eq!(
            error_chain(&Connect(closed)),
            "client error (Connect): connection closed"
        );
        assert!(in_words(&rustls::Error::DecryptError).is_none());
    }
}
