//! Metadata extraction: runs on every object the store receives.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = durable_informer::object::extract_meta(data);
});
