//! The LIST body decoder.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = durable_informer::source::decode_list(data);
});
