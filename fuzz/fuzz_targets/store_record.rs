//! The store's records: scope records, shard records, the values an object is indexed under and
//! backfill progress. The first byte picks the table, the rest is the value.
#![no_main]
use libfuzzer_sys::fuzz_target;

#[path = "store_common.rs"]
mod store_common;

/// The tables, by first byte (modulo their number); `store_rows.rs` writes seeds the same way.
const TABLES: [&str; 4] = ["scopes", "scope_shards", "index_rev", "index_backfill"];

fuzz_target!(|data: &[u8]| {
    let Some((&which, value)) = data.split_first() else {
        return;
    };
    store_common::check_row(TABLES[usize::from(which) % TABLES.len()], value);
});
