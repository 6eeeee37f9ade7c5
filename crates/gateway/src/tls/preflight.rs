//! What webpki will refuse in a certificate, found when the files are
//! read rather than at every handshake: a certificate outside its validity
//! period (expired, or not valid yet), which every peer refuses; and an
//! `upstream_ca` certificate that names its route's upstream but is a CA
//! certificate, which webpki refuses as the upstream's own (what `openssl
//! req -x509` makes unless told `CA:FALSE`).
//!
//! webpki itself is asked: the certificate is verified as a server's, with
//! itself as the trust anchor, and only the error asked about is read.
//! webpki checks an end-entity certificate's validity period, then its
//! basic constraints, before it looks for an issuer, so the answer does
//! not depend on who issued it.

use rustls::pki_types::{CertificateDer, ServerName, UnixTime};

use super::certificate_error;

/// Why `certificate` is outside its validity period at `now`, if it is.
pub(super) fn outside_validity(certificate: &CertificateDer<'_>, now: UnixTime) -> Option<String> {
    match verify_against_itself(certificate, now) {
        Err(
            error @ (webpki::Error::CertExpired { .. }
            | webpki::Error::CertNotValidYet { .. }
            | webpki::Error::InvalidCertValidity),
        ) => Some(certificate_error::webpki_words(&error)),
        _ => None,
    }
}

/// Why an upstream presenting `certificate` (from an `upstream_ca` file)
/// would be refused, when it names `host` but is a CA certificate; `None`
/// when it does not name `host` (a CA's certificate, as an `upstream_ca`
/// file should hold) or is not a CA.
pub(super) fn ca_named_for(
    certificate: &CertificateDer<'_>,
    host: &ServerName<'_>,
) -> Option<String> {
    let server = webpki::EndEntityCert::try_from(certificate).ok()?;
    server.verify_is_valid_for_subject_name(host).ok()?;
    match verify_against_itself(certificate, UnixTime::now()) {
        Err(webpki::Error::CaUsedAsEndEntity) => Some(format!(
            "the certificate for {} is a CA certificate (CA:TRUE), which webpki accepts only as \
             an issuer: an upstream presenting it as its own fails every handshake, and every \
             write is 502; make the upstream's self-signed certificate CA:FALSE, or issue it \
             from a private CA and name that CA here",
            host.to_str()
        )),
        _ => None,
    }
}

/// `certificate` verified as a server's certificate (any name), at
/// `now`, with itself as the only trust anchor.
fn verify_against_itself(
    certificate: &CertificateDer<'_>,
    now: UnixTime,
) -> Result<(), webpki::Error> {
    let server = webpki::EndEntityCert::try_from(certificate)?;
    let anchor = webpki::anchor_from_trusted_cert(certificate)?;
    let algorithms = super::provider().signature_verification_algorithms.all;
    server
        .verify_for_usage(
            algorithms,
            &[anchor],
            &[],
            now,
            webpki::KeyUsage::server_auth(),
            None,
            None,
        )
        .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(secs: u64) -> UnixTime {
        UnixTime::since_unix_epoch(Duration::from_secs(secs))
    }

    #[test]
    fn a_certificate_is_outside_its_validity_before_and_after_it() {
        let mut params = rcgen::CertificateParams::new(vec!["localhost".into()]).unwrap();
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = rcgen::date_time_ymd(2021, 1, 1);
        let key = rcgen::KeyPair::generate().unwrap();
        let certificate = params.self_signed(&key).unwrap();
        let der = certificate.der();
        // 2020-07-01, 2021-07-01, 2019-07-01.
        assert_eq!(outside_validity(der, at(1_593_561_600)), None);
        let expired = outside_validity(der, at(1_625_097_600)).unwrap();
        assert!(
            expired.starts_with("it expired at 2021-01-01T00:00:00Z"),
            "{expired}"
        );
        let early = outside_validity(der, at(1_561_939_200)).unwrap();
        assert!(
            early.starts_with("it is valid only from 2020-01-01T00:00:00Z"),
            "{early}"
        );
    }
}
