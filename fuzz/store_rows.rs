//! Real stored rows of every kind, read raw from a database this build wrote: the golden
//! schema-v4 file (dictionary-compressed objects, a compacted log with inline rows, a finished
//! index and a cut-short backfill), opened by this build (so migrated to the latest schema),
//! relisted without some objects (deletes whose final state is unknown) and given a shard range
//! (a `scope_shards` row).
//!
//! Shared by `tests/store_damaged_rows.rs` (the rows its property tests damage) and
//! `fuzz/examples/store_seeds.rs` (the fuzz targets' seeds).

use std::error::Error;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use durable_informer::object::{RawObject, ScopeSpec};
use durable_informer::selector::ShardSelector;
use durable_informer::store::{DurableStore, ShardRecord, StoreConfig};
use redb::{ReadableDatabase, ReadableTable, TableDefinition};

/// Every stored row with a decoder, by table.
#[derive(Debug, Default)]
pub struct Rows {
    /// Values the codec decodes: (table, value).
    pub values: Vec<(&'static str, Vec<u8>)>,
    /// Keys the schema decodes: (table, key).
    pub keys: Vec<(&'static str, Vec<u8>)>,
    /// Dictionary rows: ((scope, id), dictionary).
    pub dicts: Vec<((u32, u32), Vec<u8>)>,
}

type Res<T> = Result<T, Box<dyn Error>>;

/// Copies `golden` (tests/golden/schema-v4.redb) into `dir`, lets the store migrate it and add a
/// shard range, and reads every row back raw.
pub fn from_golden(golden: &Path, dir: &Path) -> Res<Rows> {
    let path = dir.join("rows.redb");
    std::fs::copy(golden, &path)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    let db = DurableStore::open(StoreConfig::new(&path))?;
    let scope = db
        .writer()
        .register_scope_blocking(&ScopeSpec::new("", "v1", "configmaps"))?;
    // A relist that misses every tenth object and changes one.
    let listed = db
        .store(scope)
        .list()?
        .into_iter()
        .enumerate()
        .filter(|(i, _)| i % 10 != 0)
        .map(|(i, o)| {
            let json = String::from_utf8_lossy(&o.bytes).into_owned();
            let json = if i == 1 {
                json.replace(&format!(r#""resourceVersion":"{}""#, o.meta.resource_version.as_str()), r#""resourceVersion":"1000""#)
            } else {
                json
            };
            RawObject::from_json(json.into_bytes())
        })
        .collect::<Result<Vec<_>, _>>()?;
    db.writer().stage_relist_blocking(scope, listed)?;
    db.writer().finish_relist_blocking(scope, "1000".into(), "store_rows")?;
    // The golden objects have no uid: a range over the whole hash space keeps them all.
    let range = Some(ShardSelector::by_uid(0, 1)?);
    db.writer().change_shard_blocking(
        scope,
        ShardRecord {
            range: range.clone(),
            pending: range,
        },
    )?;
    db.close()?;
    read_all(&path)
}

fn read_all(path: &Path) -> Res<Rows> {
    let db = redb::Database::open(path)?;
    let txn = db.begin_read()?;
    let mut rows = Rows::default();
    for name in ["objects", "index_rev"] {
        let t = txn.open_table(TableDefinition::<&[u8], &[u8]>::new(name))?;
        for row in t.iter()? {
            let (k, v) = row?;
            if name == "objects" {
                rows.keys.push(("objects", k.value().to_vec()));
            }
            rows.values.push((name, v.value().to_vec()));
        }
    }
    let log = txn.open_table(TableDefinition::<u64, &[u8]>::new("log"))?;
    for row in log.iter()? {
        rows.values.push(("log", row?.1.value().to_vec()));
    }
    for name in ["scopes", "scope_shards"] {
        let t = txn.open_table(TableDefinition::<u32, &[u8]>::new(name))?;
        for row in t.iter()? {
            rows.values.push((name, row?.1.value().to_vec()));
        }
    }
    let backfill = txn.open_table(TableDefinition::<(u32, &str), &[u8]>::new("index_backfill"))?;
    for row in backfill.iter()? {
        rows.values.push(("index_backfill", row?.1.value().to_vec()));
    }
    let index = txn.open_table(TableDefinition::<&[u8], ()>::new("index"))?;
    for row in index.iter()? {
        rows.keys.push(("index", row?.0.value().to_vec()));
    }
    let dicts = txn.open_table(TableDefinition::<(u32, u32), &[u8]>::new("dicts"))?;
    for row in dicts.iter()? {
        let (k, v) = row?;
        rows.dicts.push((k.value(), v.value().to_vec()));
    }
    Ok(rows)
}
