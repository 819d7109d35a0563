#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| turnlog::fuzzing::scripted(data));
