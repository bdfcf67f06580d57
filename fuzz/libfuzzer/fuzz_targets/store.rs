#![no_main]
//! libFuzzer entry for `kudos_fuzz::store`; see that module for the input format. redb panics
//! on some damaged pages and the stores catch that on purpose, so libFuzzer's abort-on-panic
//! hook is replaced by one that counts; a panic that escapes still aborts (libfuzzer-sys
//! catches it at the target's edge).

libfuzzer_sys::fuzz_target!(
    init: kudos_fuzz::count_caught_panics(),
    |data: &[u8]| kudos_fuzz::store::run(data)
);
