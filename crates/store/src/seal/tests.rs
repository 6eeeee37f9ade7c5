//! Unit tests of `crates/store/src/seal.rs`: sealed values bound to their place,
//! older formats, key rotation and rekey, the canary, key files.

use super::*;

/// Whether the canary is sealed under the current key, in the current
/// format (else a rekey has not finished since the last rotation or
/// upgrade).
fn canary_is_current(seal: &Seal, stored: &str) -> bool {
    !seal.is_stale(&STANDARD.decode(stored).unwrap_or_default())
}

fn sealed_with(byte: u8) -> Seal {
    Seal::with_keys(StoreKey::new(&[byte; 32]), None, "K")
}

fn id(key: &str) -> Identity {
    Identity::of("api", "scope", key, "fp")
}

fn response(status: u16, body: &[u8]) -> StoredResponse {
    StoredResponse {
        status,
        headers: vec![("x-secret".to_string(), b"marker".to_vec())],
        body: Some(body.to_vec()),
    }
}

/// `form` opened as operation `op` with `identity` and `status`.
fn open_form(
    seal: &Seal,
    op: &str,
    identity: &Identity,
    status: u16,
    form: &StoredForm,
) -> Result<StoredResponse, StoreError> {
    seal.open_response(op, identity, status, Some(&form.headers), form.body.clone())
}

#[test]
fn values_round_trip_and_bind_to_their_operation_field_identity_and_status() {
    let seal = sealed_with(1);
    let stored = seal
        .request_body("op1", &id("k"), Some(b"marker"))
        .unwrap()
        .into_owned();
    assert!(!stored.windows(6).any(|w| w == b"marker"));
    // The overhead SECURITY.md states: marker, key id, nonce, tag.
    assert_eq!(stored.len(), b"marker".len() + 44);
    let open =
        |op, identity, value: &[u8]| seal.open_request_body(op, &identity, Some(value.to_vec()));
    assert_eq!(open("op1", id("k"), &stored).unwrap().unwrap(), b"marker");
    assert!(open("op2", id("k"), &stored).is_err());
    assert!(open("op1", id("other"), &stored).is_err());
    let mut flipped = stored.clone();
    *flipped.last_mut().unwrap() ^= 1;
    assert!(open("op1", id("k"), &flipped).is_err());
    // A value written before sealing is read as it is.
    assert_eq!(open("op1", id("k"), b"{}").unwrap().unwrap(), b"{}");
    // Two seals of one value differ (fresh nonces).
    let again = seal.request_body("op1", &id("k"), Some(b"marker")).unwrap();
    assert_ne!(again.as_ref(), stored.as_slice());

    let form = seal.stored_form("op1", &id("k"), &response(201, b"body"));
    assert!(form.headers.starts_with(TEXT_PREFIX) && !form.headers.contains("marker"));
    assert_eq!(
        open_form(&seal, "op1", &id("k"), 201, &form).unwrap(),
        response(201, b"body")
    );
    // Another status, operation or identity: neither part opens.
    assert!(open_form(&seal, "op1", &id("k"), 200, &form).is_err());
    assert!(open_form(&seal, "op2", &id("k"), 201, &form).is_err());
    assert!(open_form(&seal, "op1", &id("other"), 201, &form).is_err());
    // A body moved to the request body's field, or taken away.
    assert!(open("op1", id("k"), form.body.as_deref().unwrap()).is_err());
    let no_body = seal.open_response("op1", &id("k"), 201, Some(&form.headers), None);
    assert!(no_body.is_err());
    // Headers from a response without a body do not open with one.
    let bodiless = StoredResponse {
        body: None,
        ..response(201, b"")
    };
    let bodiless = seal.stored_form("op1", &id("k"), &bodiless);
    assert!(bodiless.body.is_none());
    let with_body = StoredForm {
        body: form.body.clone(),
        ..bodiless
    };
    assert!(open_form(&seal, "op1", &id("k"), 201, &with_body).is_err());
}

#[test]
fn plain_headers_open_unless_the_store_is_sealed_only() {
    let seal = sealed_with(1);
    let plain = Seal::plain().stored_form("op1", &id("k"), &response(201, b"{}"));
    assert_eq!(
        open_form(&seal, "op1", &id("k"), 201, &plain).unwrap(),
        response(201, b"{}")
    );
    let sealed = seal.stored_form("op1", &id("k"), &response(201, b"{}"));
    assert!(open_form(&Seal::plain(), "op1", &id("k"), 201, &sealed).is_err());

    let only = sealed_with(1).sealed_only(Some(SEALED_ONLY_VALUE));
    assert!(only.sealed_only);
    assert!(open_form(&only, "op1", &id("k"), 201, &plain).is_err());
    assert_eq!(
        open_form(&only, "op1", &id("k"), 201, &sealed).unwrap(),
        response(201, b"{}")
    );
    // Not sealed-only without the row, nor without a key.
    assert!(!sealed_with(1).sealed_only(None).sealed_only);
    assert!(
        !Seal::plain()
            .sealed_only(Some(SEALED_ONLY_VALUE))
            .sealed_only
    );
}

/// A value as version 1 sealed it: its marker, and associated data
/// naming only the field and the operation.
fn seal_v1(key: &StoreKey, op: &str, field: Field, plain: &[u8]) -> Vec<u8> {
    let slot = Slot {
        operation: op,
        identity: &id("unused"),
        field,
        response: None,
    };
    let nonce = Aes256Gcm::generate_nonce(&mut OsRng);
    let aad = slot.associated_data(Version::V1);
    let payload = Payload {
        msg: plain,
        aad: &aad,
    };
    let ciphertext = key.cipher.encrypt(&nonce, payload).unwrap();
    [MAGIC_V1.as_slice(), &key.id.0, &nonce, &ciphertext].concat()
}

#[test]
fn version_1_values_open_until_rekey_seals_them_again() {
    let key = StoreKey::new(&[1; 32]);
    let body = seal_v1(&key, "op1", Field::ResponseBody, b"body");
    let headers = seal_v1(&key, "op1", Field::ResponseHeaders, b"[]");
    let headers = format!("{TEXT_PREFIX_V1}{}", STANDARD.encode(headers));
    let seal = sealed_with(1);
    let opened = seal
        .open_response("op1", &id("k"), 201, Some(&headers), Some(body.clone()))
        .unwrap();
    assert_eq!(
        (opened.status, opened.body.as_deref()),
        (201, Some(&b"body"[..]))
    );
    assert!(seal.is_stale(&body) && seal.is_stale(headers.as_bytes()));
    let only = sealed_with(1).sealed_only(Some(SEALED_ONLY_VALUE));
    assert!(
        only.open_response("op1", &id("k"), 201, Some(&headers), Some(body.clone()))
            .is_err()
    );
    // rekey: sealed again in version 2, bound to identity and status.
    let stored = Payloads {
        response_status: Some(201),
        request_body: None,
        response_headers: Some(headers),
        response_body: Some(body),
    };
    let new = seal.reseal("op1", &id("k"), &stored).unwrap().unwrap();
    let headers = new.response_headers.unwrap();
    let body = new.response_body.unwrap();
    assert!(!seal.is_stale(&body) && !seal.is_stale(headers.as_bytes()));
    let reopened = only
        .open_response("op1", &id("k"), 201, Some(&headers), Some(body.clone()))
        .unwrap();
    assert_eq!(reopened, opened);
    assert!(
        only.open_response("op1", &id("k"), 200, Some(&headers), Some(body))
            .is_err()
    );
    // A version 1 canary still tells the key, and is stale.
    let canary = STANDARD.encode(seal_v1(&key, CANARY_ID, Field::ResponseBody, CANARY_PLAIN));
    assert_eq!(seal.check_canary(Some(&canary)).unwrap(), Canary::Fits);
    assert!(!canary_is_current(&seal, &canary));
}

#[test]
fn a_sealed_only_store_does_not_reseal_what_is_in_clear() {
    let only = sealed_with(1).sealed_only(Some(SEALED_ONLY_VALUE));
    let planted = Payloads {
        response_status: Some(201),
        request_body: None,
        response_headers: Some("[]".into()),
        response_body: Some(b"forged".to_vec()),
    };
    assert!(only.reseal("op1", &id("k"), &planted).is_err());
}

#[test]
fn a_previous_key_opens_and_rekey_finds_what_it_sealed() {
    let old = sealed_with(1);
    let stored = old
        .request_body("op", &id("k"), Some(b"x"))
        .unwrap()
        .into_owned();
    let rotated = Seal::with_keys(StoreKey::new(&[2; 32]), Some(StoreKey::new(&[1; 32])), "K");
    assert_eq!(
        rotated
            .open_request_body("op", &id("k"), Some(stored.clone()))
            .unwrap()
            .unwrap(),
        b"x"
    );
    assert!(rotated.is_stale(&stored) && rotated.is_stale(b"plain"));
    let resealed = rotated.request_body("op", &id("k"), Some(b"x")).unwrap();
    assert!(!rotated.is_stale(&resealed));
    let headers = rotated
        .stored_form("op", &id("k"), &response(201, b""))
        .headers;
    assert!(!rotated.is_stale(headers.as_bytes()));
    let old_headers = old.stored_form("op", &id("k"), &response(201, b"")).headers;
    assert!(rotated.is_stale(old_headers.as_bytes()));
    assert!(
        sealed_with(2)
            .open_request_body("op", &id("k"), Some(stored))
            .is_err()
    );
}

#[test]
fn the_canary_tells_a_wrong_or_missing_key() {
    let one = sealed_with(1);
    let canary = one.canary().unwrap();
    assert_eq!(one.check_canary(Some(&canary)).unwrap(), Canary::Fits);
    assert_eq!(one.check_canary(None).unwrap(), Canary::Missing);
    assert_eq!(Seal::plain().check_canary(None).unwrap(), Canary::Fits);
    let id = StoreKey::new(&[1; 32]).id();
    let wrong = sealed_with(2)
        .check_canary(Some(&canary))
        .unwrap_err()
        .to_string();
    assert!(wrong.contains(&id.to_string()), "{wrong}");
    assert!(
        wrong.contains(&StoreKey::new(&[2; 32]).id().to_string()),
        "{wrong}"
    );
    let none = Seal::plain()
        .check_canary(Some(&canary))
        .unwrap_err()
        .to_string();
    assert!(none.contains("no key is configured"), "{none}");
    let rotated = Seal::with_keys(StoreKey::new(&[2; 32]), Some(StoreKey::new(&[1; 32])), "K");
    assert_eq!(rotated.check_canary(Some(&canary)).unwrap(), Canary::Fits);
    assert!(!canary_is_current(&rotated, &canary));
    assert!(canary_is_current(&one, &canary));
}

#[test]
fn keys_must_be_32_bytes_of_base64() {
    let read = |value: String| {
        StoreKey::from_env("K", "store.encryption_key_env", &move |_| {
            Some(value.clone())
        })
    };
    assert!(read(STANDARD.encode([7; 32])).is_ok());
    let short = read(STANDARD.encode([7; 16])).err().unwrap().to_string();
    assert!(short.contains("16 bytes") && short.contains("K"), "{short}");
    // What is wrong is said, never where or which character: the text is
    // a secret.
    let garbled = read("c2VjcmV0$c2VjcmV0".into()).err().unwrap().to_string();
    assert!(garbled.ends_with(": not base64"), "{garbled}");
    let url_safe = read(base64::engine::general_purpose::URL_SAFE.encode([0xfb; 32]));
    let url_safe = url_safe.err().unwrap().to_string();
    assert!(url_safe.contains("not standard base64"), "{url_safe}");
    assert!(!url_safe.contains("offset"), "{url_safe}");
    let missing = StoreKey::from_env("K", "store.encryption_key_env", &|_| None);
    assert!(missing.err().unwrap().to_string().contains("is not set"));
}
