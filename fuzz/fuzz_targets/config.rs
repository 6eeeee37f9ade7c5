//! `cargo fuzz run config`: the properties of `idemgate_fuzz::config` (fuzz/checks.rs).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| idemgate_fuzz::config(data));
