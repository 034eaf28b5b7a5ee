//! Decompression of stored object bytes, with the dictionary a tag names: a tag byte (0: none,
//! 1: zstd, 2: a dictionary), the dictionary's length (u32, little endian), the dictionary (the
//! row as stored; empty: the row is missing), then the stored bytes.
//!
//! A valid frame may expand a lot (zstd allows about 40,000 to 1), so the bound here allows
//! for what the frame's blocks really produce, counted beforehand with zstd's streaming decoder:
//! a damaged frame (a wrong declared size, a damaged dictionary) must not make the reader ask
//! for much more than that.
#![no_main]
use std::io::Read;

use durable_informer::store::Compression;
use libfuzzer_sys::fuzz_target;

#[path = "store_common.rs"]
mod store_common;

/// Bytes the frames in `bytes` produce before they end or fail (at most 2^30 + 1).
fn produced(bytes: &[u8], dict: Option<&[u8]>) -> usize {
    let decoder = match dict {
        Some(d) => zstd::stream::read::Decoder::with_dictionary(bytes, d),
        None => zstd::stream::read::Decoder::with_buffer(bytes),
    };
    let Ok(mut decoder) = decoder else { return 0 };
    if decoder.window_log_max(31).is_err() {
        return 0;
    }
    let mut buf = vec![0u8; 64 << 10];
    let mut total = 0;
    while total <= 1 << 30 {
        match decoder.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => total += n,
        }
    }
    total
}

fuzz_target!(|data: &[u8]| {
    let Some((&tag, rest)) = data.split_first() else { return };
    let Some((len, rest)) = rest.split_first_chunk::<4>() else {
        return;
    };
    let len = (u32::from_le_bytes(*len) as usize).min(rest.len());
    let (dict, bytes) = rest.split_at(len);
    let dict = (!dict.is_empty()).then_some(dict);
    let tag = match tag % 3 {
        0 => Compression::None,
        1 => Compression::Zstd(3),
        _ => Compression::Dict { scope: 1, dict: 1 },
    };
    let real = match tag {
        Compression::None => bytes.len(),
        Compression::Dict { .. } => produced(bytes, dict),
        _ => produced(bytes, None),
    };
    store_common::within_bound(data, 8 * real, || {
        let _ = tag.check_unpack(bytes, dict);
    });
});
