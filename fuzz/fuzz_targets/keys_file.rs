//! The text of the API keys file (SENDGATE_API_KEYS_FILE).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sendgate::fuzzing::keys_file(data));
