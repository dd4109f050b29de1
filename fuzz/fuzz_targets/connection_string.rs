//! A SAS connection string (SERVICEBUS_CONNECTION_STRING).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sendgate::fuzzing::connection_string(data));
