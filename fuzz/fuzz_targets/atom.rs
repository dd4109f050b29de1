//! A body the Service Bus management endpoint answered (ATOM XML).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sendgate::fuzzing::atom(data));
