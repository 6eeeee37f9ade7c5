//! `cargo fuzz run canonical_json`: the properties of `idemgate_fuzz::canonical_json` (fuzz/checks.rs).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| idemgate_fuzz::canonical_json(data));
