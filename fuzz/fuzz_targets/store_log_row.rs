//! `log` rows (log header, the entry's object bytes, the inlined previous bytes) as the store
//! reads them.
#![no_main]
use libfuzzer_sys::fuzz_target;

#[path = "store_common.rs"]
mod store_common;

fuzz_target!(|data: &[u8]| store_common::check_row("log", data));
