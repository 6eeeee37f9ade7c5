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
//! scope; a value of any other scheme, or one whose parameters are not
//! exactly the scheme's, is read whole; and a signer's part begins with a
//! line break, which no header value holds, so it never equals a value
//! read whole.
//!
//! The gateway verifies no signature (the upstream does): whoever can
//! name a signed scope (its key id; for Azure Communication Services,
//! whose signature names no key, only the scheme) shares its key space,
//! so such keys must be unguessable, as the SDKs' UUIDs are
//! (docs/decisions.md, "Scope by credential").

use std::borrow::Cow;

/// What begins a signer's part: a line break, which no header value holds,
/// so that no credential sent as it is ever hashes as a signer does.
const SIGNER: &str = "\nsigner ";

/// The part of an `Authorization` value a scope hashes.
pub(crate) fn signer(value: &[u8]) -> Cow<'_, [u8]> {
    let Ok(text) = std::str::from_utf8(value) else {
        return Cow::Borrowed(value);
    };
    let Some((scheme, rest)) = text.trim().split_once(' ') else {
        return Cow::Borrowed(value);
    };
    let scheme = scheme.to_ascii_lowercase();
    let signed = match scheme.as_str() {
        "aws4-hmac-sha256" | "aws4-ecdsa-p256-sha256" | "goog4-hmac-sha256" => {
            dated_key(rest.trim())
        }
        "hmac-sha256" => hmac_key(rest.trim()),
        "sharedkey" | "sharedkeylite" => rest
            .trim()
            .split_once(':')
            .filter(|(account, signature)| {
                let token = |t: &str| !t.is_empty() && !t.contains([' ', '\t', ':']);
                token(account) && token(signature)
            })
            .map(|(account, _)| account.to_string()),
        _ => None,
    };
    signed.map_or(Cow::Borrowed(value), |signed| {
        Cow::Owned(format!("{SIGNER}{scheme} {signed}").into_bytes())
    })
}

/// A signature's parameters, `separator`-separated `name=value`s, when
/// their names are exactly `names` (in any order) and no value is empty.
fn parameters<'a>(
    text: &'a str,
    separator: char,
    names: &[&str],
) -> Option<Vec<(&'a str, &'a str)>> {
    let params: Vec<(&str, &str)> = text
        .split(separator)
        .map(|param| param.trim().split_once('='))
        .collect::<Option<_>>()?;
    let named = |name: &&str| params.iter().filter(|(n, _)| n == name).count() == 1;
    let complete = params.len() == names.len()
        && names.iter().all(named)
        && params.iter().all(|(_, value)| !value.is_empty());
    complete.then_some(params)
}

/// The value of parameter `name` among `params`.
fn value<'a>(params: &[(&str, &'a str)], name: &str) -> &'a str {
    params
        .iter()
        .find(|(n, _)| *n == name)
        .map_or("", |(_, v)| v)
}

/// An `HMAC-SHA256` signature's signer: its `Credential=` (Azure App
/// Configuration's access key id), or nothing for one that names no key
/// (Azure Communication Services': its resource's key is the one every
/// signer of it holds); `None` unless the parameters are exactly one of
/// those forms (`&`-separated).
fn hmac_key(params: &str) -> Option<String> {
    if let Some(params) = parameters(params, '&', &["Credential", "SignedHeaders", "Signature"]) {
        return Some(value(&params, "Credential").to_string());
    }
    parameters(params, '&', &["SignedHeaders", "Signature"]).map(|_| String::new())
}

/// A dated signature's signer (AWS SigV4 and SigV4a, Google Cloud
/// Storage's HMAC): its `Credential=KEY/DATE/…/aws4_request` (or
/// `goog4_request`) without the date, which changes at midnight — the
/// key and the scope it signs for (region, service); `None` unless the
/// parameters are exactly `Credential`, `SignedHeaders`, `Signature`
/// (`,`-separated).
fn dated_key(params: &str) -> Option<String> {
    let params = parameters(params, ',', &["Credential", "SignedHeaders", "Signature"])?;
    let parts: Vec<&str> = value(&params, "Credential").split('/').collect();
    match parts[..] {
        [key, _date, ref scope @ .., "aws4_request" | "goog4_request"]
            if !key.is_empty() && !scope.is_empty() =>
        {
            Some(format!("{key}/{}", scope.join("/")))
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
            "\nsigner aws4-hmac-sha256 AKIDEXAMPLE/us-east-1/iam"
        );
        let other_key = sigv4("20261207", "aa").replace("AKIDEXAMPLE", "AKIDOTHER");
        assert_ne!(of(&other_key), of(&sigv4("20261207", "aa")));
        // SigV4a names no region; Google's HMAC ends in goog4_request.
        let sigv4a = |date: &str| {
            format!(
                "AWS4-ECDSA-P256-SHA256 Credential=AKID/{date}/s3/aws4_request, SignedHeaders=host, Signature=ab"
            )
        };
        assert_eq!(of(&sigv4a("20261207")), of(&sigv4a("20261208")));
        let goog = |date: &str| {
            format!(
                "GOOG4-HMAC-SHA256 Credential=GOOG1K/{date}/auto/storage/goog4_request, SignedHeaders=host, Signature=ab"
            )
        };
        assert_eq!(of(&goog("20261207")), of(&goog("20261208")));
        let acs = |s: &str| {
            format!("HMAC-SHA256 SignedHeaders=x-ms-date;host;x-ms-content-sha256&Signature={s}")
        };
        assert_eq!(of(&acs("x=")), of(&acs("y=")));
        // Azure App Configuration names its access key: two keys, two scopes.
        let app_config = |key: &str, s: &str| {
            format!("HMAC-SHA256 Credential={key}&SignedHeaders=x-ms-date;host&Signature={s}")
        };
        assert_eq!(of(&app_config("id-1", "x=")), of(&app_config("id-1", "y=")));
        assert_ne!(of(&app_config("id-1", "x=")), of(&app_config("id-2", "x=")));
        assert_ne!(of(&app_config("id-1", "x=")), of(&acs("x=")));
        assert_eq!(of("SharedKey acct:c2ln"), of("SharedKey acct:b3RoZXI="));
        assert_ne!(of("SharedKey acct:c2ln"), of("SharedKey other:c2ln"));
    }

    /// Found from outside: a spelling that was not the scheme's form (a
    /// key under another name, `Credential =`) was reduced to the scheme
    /// alone, and clients naming two keys shared one scope; and the
    /// reduced form was a value a client could send as it is.
    #[test]
    fn any_other_value_is_read_whole() {
        for value in [
            "Bearer abc",
            "Basic dXNlcjpwdw==",
            "hmac-sha256",
            "sharedkey acct",
            "AWS4-HMAC-SHA256 Signature=aa",
            "AWS4-HMAC-SHA256 Credential=/20261207/us-east-1/iam/aws4_request, SignedHeaders=h, Signature=aa",
            "AWS4-HMAC-SHA256 Credential=K/20261207/aws4_request, SignedHeaders=h, Signature=aa",
            "AWS4-HMAC-SHA256 credential=K/20261207/r/s/aws4_request, SignedHeaders=h, Signature=aa",
            "HMAC-SHA256 abc",
            "HMAC-SHA256 Credential =tenantA&SignedHeaders=h&Signature=xx=",
            "HMAC-SHA256 credential=tenantA&SignedHeaders=h&Signature=xx=",
            "HMAC-SHA256 KeyId=tenantA&SignedHeaders=h&Signature=xx=",
            "HMAC-SHA256 Credential=&SignedHeaders=h&Signature=xx=",
            "HMAC-SHA256 SignedHeaders=h&Signature=",
            "SharedKey acct",
            "SharedKey :sig",
            "SharedKey acct:",
            "sk_live_123",
        ] {
            assert_eq!(of(value), value);
        }
        assert_eq!(signer(b"\xff\xfe").as_ref(), b"\xff\xfe");
    }
}
