//! What of an `Authorization` value names its sender, for the scope
//! (`key::Scope`). A credential sent as it is — a bearer
//! token, an API key, basic credentials — is the scope byte for byte. A
//! signature that the client makes anew for each try is not: the SDKs
//! that sign (AWS's SigV4, Azure Communication Services' HMAC, Azure
//! Storage's shared key) date each try, so each try's value differs and,
//! hashed whole, each retry would be a scope of its own — a new operation,
//! sent a second time. Such a value's scope is its scheme and the key it
//! says it was signed with, never the signature.
//!
//! Invariant: two tries of one client signed with one key give one
//! scope; a value of any other scheme, or one whose form is not the
//! scheme's, is read whole.
//!
//! The gateway verifies no signature (the upstream does): whoever can
//! name a signed scope (its key id; for Azure Communication Services,
//! whose signature names no key, only the scheme) shares its key space,
//! so such keys must be unguessable, as the SDKs' UUIDs are
//! (docs/decisions.md, "Scope by credential").

use std::borrow::Cow;

/// The part of an `Authorization` value a scope hashes.
pub(crate) fn signer(value: &[u8]) -> Cow<'_, [u8]> {
    let Ok(text) = std::str::from_utf8(value) else {
        return Cow::Borrowed(value);
    };
    let (scheme, rest) = text
        .trim()
        .split_once([' ', '\t'])
        .unwrap_or((text.trim(), ""));
    let rest = rest.trim();
    let signed = match scheme.to_ascii_lowercase().as_str() {
        "aws4-hmac-sha256" => sigv4_key(rest).map(|key| format!("aws4-hmac-sha256 {key}")),
        "hmac-sha256" if rest.contains("Signature=") => Some(hmac_key(rest).map_or_else(
            || "hmac-sha256".to_string(),
            |key| format!("hmac-sha256 {key}"),
        )),
        scheme @ ("sharedkey" | "sharedkeylite") => rest
            .split_once(':')
            .filter(|(account, signature)| !account.is_empty() && !signature.is_empty())
            .map(|(account, _)| format!("{scheme} {account}")),
        _ => None,
    };
    signed.map_or(Cow::Borrowed(value), |signed| {
        Cow::Owned(signed.into_bytes())
    })
}

/// An `HMAC-SHA256` signature's `Credential=` (Azure App Configuration's
/// access key id; `&`-separated parameters), if it names one: Azure
/// Communication Services' names none, its resource's key being the one
/// every signer of it holds.
fn hmac_key(params: &str) -> Option<&str> {
    params
        .split('&')
        .find_map(|param| param.trim().strip_prefix("Credential="))
        .filter(|key| !key.is_empty())
}

/// A SigV4 `Credential=KEY/DATE/REGION/SERVICE/aws4_request` as
/// `KEY/REGION/SERVICE`: the date changes at midnight, the rest is the
/// signing key's.
fn sigv4_key(params: &str) -> Option<String> {
    let credential = params
        .split(',')
        .find_map(|param| param.trim().strip_prefix("Credential="))?;
    match credential.split('/').collect::<Vec<_>>()[..] {
        [key, _date, region, service, "aws4_request"] if !key.is_empty() => {
            Some(format!("{key}/{region}/{service}"))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(value: &str) -> String {
        String::from_utf8(signer(value.as_bytes()).into_owned()).unwrap()
    }

    #[test]
    fn a_signature_made_for_each_try_is_its_scheme_and_key() {
        let sigv4 = |date: &str, signature: &str| {
            format!(
                "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/{date}/us-east-1/iam/aws4_request, \
                 SignedHeaders=host;x-amz-date, Signature={signature}"
            )
        };
        assert_eq!(of(&sigv4("20261207", "aa")), of(&sigv4("20261208", "bb")));
        assert_eq!(
            of(&sigv4("20261207", "aa")),
            "aws4-hmac-sha256 AKIDEXAMPLE/us-east-1/iam"
        );
        let other_key = sigv4("20261207", "aa").replace("AKIDEXAMPLE", "AKIDOTHER");
        assert_ne!(of(&other_key), of(&sigv4("20261207", "aa")));
        let acs = |s: &str| {
            format!("HMAC-SHA256 SignedHeaders=x-ms-date;host;x-ms-content-sha256&Signature={s}")
        };
        assert_eq!(of(&acs("x=")), of(&acs("y=")));
        // Azure App Configuration names its access key: two keys, two scopes.
        let app_config = |key: &str, s: &str| {
            format!("HMAC-SHA256 Credential={key}&SignedHeaders=x-ms-date;host&Signature={s}")
        };
        assert_eq!(of(&app_config("id-1", "x=")), of(&app_config("id-1", "y=")));
        assert_eq!(of(&app_config("id-1", "x=")), "hmac-sha256 id-1");
        assert_ne!(of(&app_config("id-1", "x=")), of(&app_config("id-2", "x=")));
        assert_ne!(of(&app_config("id-1", "x=")), of(&acs("x=")));
        assert_eq!(of("SharedKey acct:c2ln"), of("SharedKey acct:b3RoZXI="));
        assert_ne!(of("SharedKey acct:c2ln"), of("SharedKey other:c2ln"));
    }

    #[test]
    fn any_other_value_is_read_whole() {
        for value in [
            "Bearer abc",
            "Basic dXNlcjpwdw==",
            "AWS4-HMAC-SHA256 Signature=aa",
            "AWS4-HMAC-SHA256 Credential=/20261207/us-east-1/iam/aws4_request",
            "HMAC-SHA256 abc",
            "SharedKey acct",
            "SharedKey :sig",
            "sk_live_123",
        ] {
            assert_eq!(of(value), value);
        }
        assert_eq!(signer(b"\xff\xfe").as_ref(), b"\xff\xfe");
    }
}
