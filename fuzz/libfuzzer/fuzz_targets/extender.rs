#![no_main]
//! libFuzzer entry for `kudos_fuzz::extender`; see that module for the input format.

libfuzzer_sys::fuzz_target!(|data: &[u8]| kudos_fuzz::extender::run(data));
