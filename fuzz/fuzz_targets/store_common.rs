//! What every store-row target checks: a decoder returns `Ok` or `Err` (a panic or an abort is
//! a crash), asks the allocator for at most [`bound`] bytes per input, and what it decodes
//! encodes to bytes that decode to the same thing. tests/store_damaged_rows.rs includes it too,
//! for the same allocator and bound.
// Each target (and the test) uses part of it.
#![allow(dead_code)]

use std::alloc::System;

use durable_informer::store::CodecError;
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Most bytes decoding `len` damaged bytes may ask for: a small multiple of the input, plus
/// serde's preallocation of a sequence (at most 1 MiB each) and zstd's first output buffer.
pub fn bound(len: usize) -> usize {
    64 * len + (4 << 20)
}

/// What `f` returns, and the bytes it asked the allocator for (growth by `realloc` included).
/// The counts are the process's: only one thread may be decoding.
pub fn asked<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let region = Region::new(GLOBAL);
    let out = f();
    let change = region.change();
    let grown = usize::try_from(change.bytes_reallocated).unwrap_or(0);
    (out, change.bytes_allocated + grown)
}

/// Runs `f` on `input`, failing the run if it asks for more than `bound(input.len())` bytes
/// plus `extra`.
pub fn within_bound<T>(input: &[u8], extra: usize, f: impl FnOnce() -> T) -> T {
    let (out, asked) = asked(f);
    assert!(
        asked <= bound(input.len()) + extra,
        "{} input bytes asked the allocator for {asked} bytes",
        input.len()
    );
    out
}

/// Decodes `value` as a row of `table` within the bound; a row that decodes survives a
/// re-encode. (The object bytes a row carries are `store_unpack`'s.)
pub fn check_row(table: &str, value: &[u8]) {
    within_bound(value, 0, || {
        if let Ok((canonical, _)) = CodecError::check_row(table, value) {
            let (again, _) = CodecError::check_row(table, &canonical).expect("a re-encoded row decodes");
            assert_eq!(
                again, canonical,
                "a decoded {table} row encodes differently after a round trip"
            );
        }
    });
}
