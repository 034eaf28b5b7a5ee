//! Raw table rows of a database file, read with redb directly: for tests that compare two
//! databases byte for byte.
#![allow(dead_code)]

use std::path::Path;

use redb::{ReadableDatabase, ReadableTable, TableDefinition};

const OBJECTS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("objects");
const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("log");

pub type Rows = Vec<(Vec<u8>, Vec<u8>)>;

/// The raw rows of the `objects` and `log` tables, read with redb directly.
pub fn tables(path: &Path) -> (Rows, Rows) {
    let db = redb::Database::open(path).unwrap();
    let txn = db.begin_read().unwrap();
    let objects = txn
        .open_table(OBJECTS)
        .unwrap()
        .iter()
        .unwrap()
        .map(|r| {
            let (k, v) = r.unwrap();
            (k.value().to_vec(), v.value().to_vec())
        })
        .collect();
    let log = txn
        .open_table(LOG)
        .unwrap()
        .iter()
        .unwrap()
        .map(|r| {
            let (k, v) = r.unwrap();
            (k.value().to_be_bytes().to_vec(), v.value().to_vec())
        })
        .collect();
    (objects, log)
}
