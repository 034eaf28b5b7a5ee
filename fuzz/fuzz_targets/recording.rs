//! The recording parser over arbitrary file contents.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(mut r) =
        durable_informer::replay::RecordingReader::from_reader("fuzz.jsonl", std::io::Cursor::new(data.to_vec()))
    else {
        return;
    };
    for _ in 0..10_000 {
        match r.next_event() {
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => break,
        }
    }
});
