//! `cargo fuzz run resolution`: the properties of `idemgate_fuzz::resolution` (fuzz/checks.rs).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| idemgate_fuzz::resolution(data));
