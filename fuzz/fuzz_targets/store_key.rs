//! The store's composite keys (`objects`/`relist` keys and `index` keys). The first byte picks
//! the table, the rest is the key. A key that decodes encodes back to exactly its bytes.
#![no_main]
use durable_informer::store::ScopeId;
use libfuzzer_sys::fuzz_target;

#[path = "store_common.rs"]
mod store_common;

/// The tables, by first byte (modulo their number); `store_rows.rs` writes seeds the same way.
const TABLES: [&str; 2] = ["objects", "index"];

fuzz_target!(|data: &[u8]| {
    let Some((&which, key)) = data.split_first() else {
        return;
    };
    let table = TABLES[usize::from(which) % TABLES.len()];
    if let Ok(encoded) = store_common::within_bound(key, 0, || ScopeId::check_key(table, key)) {
        assert_eq!(encoded, key, "a decoded {table} key encodes to other bytes");
    }
});
