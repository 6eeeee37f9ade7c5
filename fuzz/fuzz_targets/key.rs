//! `cargo fuzz run key`: the properties of `idemgate_fuzz::key` (fuzz/checks.rs).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| idemgate_fuzz::key(data));
