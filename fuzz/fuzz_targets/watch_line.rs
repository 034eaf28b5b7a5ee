//! The watch-line decoder: every line of a WATCH body comes from the network.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = durable_informer::source::decode_watch_line(data);
});
