//! Micro-benchmarks of the pure, per-request phases: key parsing, RFC 8785
//! canonical JSON, the fingerprint, and sealing a stored response (a sealed
//! store's extra work per record and per read from the store). No I/O; see `gateway.rs` for the
//! end-to-end numbers these sit inside.
//!
//! `cargo bench --bench pipeline`

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use http::header::{AUTHORIZATION, CONTENT_TYPE};
use http::{HeaderMap, HeaderValue, Method};
use idemgate::pipeline::fingerprint::{self, FingerprintInput};
use idemgate::pipeline::key::IdempotencyKey;
use idemgate_model::canonical_json::canonicalize;
use idemgate_model::operation::StoredResponse;
use idemgate_store::seal::Identity;
use idemgate_store::{Seal, StoreKey};
use serde_json::{Value, json};

/// A deterministic JSON document of at least `target` bytes when serialised:
/// an order-like object whose `items` mix strings (some needing escapes),
/// integers, floats, booleans, nulls and nested objects. (serde_json's map is
/// a `BTreeMap` here, so members arrive sorted; the canonical writer still
/// sorts them by UTF-16 code units, which is the cost measured.)
fn sample_json(target: usize) -> Value {
    let mut doc = json!({
        "zeta_reference": "ord_2024_000001",
        "customer": {"name": "Zoë \"Q\" Müller", "id": 42, "vip": false},
        "amount": 1999.5,
        "currency": "EUR",
        "items": [],
    });
    let mut i = 0u64;
    while serde_json::to_vec(&doc).map_or(0, |v| v.len()) < target {
        let item = json!({
            "sku": format!("SKU-{i:06}"),
            "quantity": i % 7 + 1,
            "unit_price": (i as f64) * 1.25 + 0.1,
            "note": format!("line {i}\twith\u{00e9}scapes \\ and \"quotes\""),
            "gift": i.is_multiple_of(3),
            "discount": null,
            "attributes": {"weight_kg": 0.5e-3 * i as f64, "colour": "blue", "a": [1, 2, 3]},
        });
        if let Some(items) = doc["items"].as_array_mut() {
            items.push(item);
        }
        i += 1;
    }
    doc
}

fn key_parsing(c: &mut Criterion) {
    let mut group = c.benchmark_group("key_parsing");
    let cases = [
        ("bare_uuid", "0190b8f4-8f5a-7c4e-9d1e-2f6a8b3c4d5e"),
        ("sf_string", "\"0190b8f4-8f5a-7c4e-9d1e-2f6a8b3c4d5e\""),
        ("sf_string_escaped", "\"order\\\"42\\\\retry-0001\""),
    ];
    for (name, value) in cases {
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(AUTHORIZATION, HeaderValue::from_static("Bearer bench"));
        headers.insert("idempotency-key", HeaderValue::from_static(value));
        assert!(matches!(
            IdempotencyKey::from_headers(&headers),
            Ok(Some(_))
        ));
        group.bench_function(name, |b| {
            b.iter(|| IdempotencyKey::from_headers(black_box(&headers)))
        });
    }
    group.finish();
}

fn canonical_json(c: &mut Criterion) {
    let mut group = c.benchmark_group("canonical_json");
    for (name, target) in [("1KiB", 1024), ("64KiB", 64 * 1024)] {
        let value = sample_json(target);
        let text = serde_json::to_vec(&value).expect("serialise sample");
        group.throughput(Throughput::Bytes(text.len() as u64));
        // The writer alone, on an already-parsed value.
        group.bench_with_input(BenchmarkId::new("canonicalize", name), &value, |b, v| {
            b.iter(|| canonicalize(black_box(v)))
        });
        // What the fingerprint phase pays: parse the body, then canonicalise.
        group.bench_with_input(
            BenchmarkId::new("parse_and_canonicalize", name),
            &text,
            |b, t| {
                b.iter(|| {
                    let v: Value = serde_json::from_slice(black_box(t)).expect("valid JSON");
                    canonicalize(&v)
                })
            },
        );
    }
    group.finish();
}

fn fingerprint(c: &mut Criterion) {
    let mut group = c.benchmark_group("fingerprint");
    let fingerprint_headers = [CONTENT_TYPE];
    let ignore_fields = ["/zeta_reference".to_string()];
    let method = Method::POST;
    for (name, target) in [("1KiB", 1024), ("64KiB", 64 * 1024)] {
        let body = serde_json::to_vec(&sample_json(target)).expect("serialise sample");
        group.throughput(Throughput::Bytes(body.len() as u64));
        // JSON: parse, drop ignore_fields, canonicalise, hash.
        // Raw: the same bytes as text/plain are only hashed.
        for (kind, content_type) in [("json", "application/json"), ("raw", "text/plain")] {
            let mut headers = HeaderMap::new();
            headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
            headers.insert(AUTHORIZATION, HeaderValue::from_static("Bearer bench"));
            let input = FingerprintInput {
                method: &method,
                path_and_query: "/v1/orders?expand=items",
                headers: &headers,
                fingerprint_headers: &fingerprint_headers,
                ignore_fields: &ignore_fields,
                body_as_sent: false,
                body: &body,
            };
            group.bench_with_input(BenchmarkId::new(kind, name), &input, |b, input| {
                b.iter(|| fingerprint::compute(black_box(input)))
            });
        }
    }
    group.finish();
}

/// What a sealed store adds to a record (seal the headers and body) and
/// to a read from the store (open them), for a 1 KiB and a 64 KiB body.
fn sealing(c: &mut Criterion) {
    let mut group = c.benchmark_group("seal");
    let seal = Seal::with_keys(StoreKey::new(&[7; 32]), None, "BENCH_KEY");
    let headers = vec![
        ("content-type".to_string(), b"application/json".to_vec()),
        ("x-request-id".to_string(), b"0192f0c4-5b1e-7d2a".to_vec()),
        ("cache-control".to_string(), b"no-store".to_vec()),
    ];
    let id = "0192f0c4-5b1e-7d2a-8c3e-1f2a3b4c5d6e";
    let identity = Identity::of("api", "scope", "key-1", "fingerprint");
    for (name, target) in [("1KiB", 1024), ("64KiB", 64 * 1024)] {
        let body = serde_json::to_vec(&sample_json(target)).expect("serialise sample");
        group.throughput(Throughput::Bytes(body.len() as u64));
        let response = StoredResponse {
            status: 201,
            headers: headers.clone(),
            body: Some(body),
        };
        group.bench_with_input(BenchmarkId::new("seal", name), &response, |b, response| {
            b.iter(|| seal.stored_form(id, &identity, black_box(response)))
        });
        let stored = seal.stored_form(id, &identity, &response);
        group.bench_with_input(BenchmarkId::new("open", name), &stored, |b, stored| {
            b.iter(|| {
                let body = black_box(stored.body.clone());
                seal.open_response(id, &identity, 201, Some(&stored.headers), body)
                    .is_ok()
            })
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(50);
    targets = key_parsing, canonical_json, fingerprint, sealing
}
criterion_main!(benches);
