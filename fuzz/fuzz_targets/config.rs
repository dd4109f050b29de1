//! Configuration variables, then optionally %% and the TOML file's text.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sendgate::fuzzing::config(data));
