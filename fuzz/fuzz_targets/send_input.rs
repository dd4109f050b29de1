//! A send: header lines, a blank line, the body (see sendgate::fuzzing::send_input).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sendgate::fuzzing::send_input(data));
