//! The simulated server's continue-token decoder (tokens come from clients' `continue=`).
//! Whatever it accepts must survive a re-encode unchanged.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else { return };
    if let Ok((rv, start)) = durable_informer::sim::decode_continue_token(s) {
        let again = durable_informer::sim::encode_continue_token(rv, &start);
        assert_eq!(durable_informer::sim::decode_continue_token(&again), Ok((rv, start)));
    }
});
