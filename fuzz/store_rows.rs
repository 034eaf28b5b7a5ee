//! Real stored rows of every kind, read raw from a database this build wrote: the golden
//! schema-v4 file (dictionary-compressed objects, a compacted log with inline rows, a finished
//! index and a cut-short backfill), opened by this build (so migrated to the latest schema),
//! relisted without some objects (deletes whose final state is unknown) and given a shard range
//! (a `scope_shards` row).
//!
//! Included by `tests/store_damaged_rows.rs`: the rows its property tests damage, and
//! [`write_seeds`], the store fuzz targets' seeds (`fuzz/seed-corpora.sh --store`).

use std::collections::BTreeMap;
use std::error::Error;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use durable_informer::object::{RawObject, ScopeSpec};
use durable_informer::selector::ShardSelector;
use durable_informer::store::{CodecError, Compression, DurableStore, ShardRecord, StoreConfig};
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
    // A relist that misses every tenth object and changes one; `a` and `c` (the first two) keep
    // the inline rows compaction gave them.
    let listed = db
        .store(scope)
        .list()?
        .into_iter()
        .enumerate()
        .filter(|(i, _)| i % 10 != 5)
        .map(|(i, o)| {
            let json = String::from_utf8_lossy(&o.bytes).into_owned();
            let json = if i == 2 {
                json.replace(
                    &format!(r#""resourceVersion":"{}""#, o.meta.resource_version.as_str()),
                    r#""resourceVersion":"1000""#,
                )
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

/// Rows kept per shape of row.
const PER_SHAPE: usize = 3;

/// A row's shape: its table and the tags of the object bytes it carries.
fn shape(table: &str, value: &[u8]) -> String {
    let tags = match CodecError::check_row(table, value) {
        Ok((_, blobs)) => blobs
            .iter()
            .map(|(c, _)| format!("{c:?}"))
            .collect::<Vec<_>>()
            .join("+"),
        Err(_) => "undecodable".to_owned(),
    };
    format!("{table}:{tags}")
}

/// Up to `n` items spread over `items`.
fn spread<T: Clone>(items: &[T], n: usize) -> Vec<T> {
    let step = items.len().div_ceil(n).max(1);
    items.iter().step_by(step).cloned().collect()
}

fn put(out: &Path, target: &str, name: &str, bytes: &[u8]) -> Res<()> {
    let dir = out.join(target);
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join(name), bytes)?;
    Ok(())
}

/// Writes the store targets' seeds into `out/<target>/`, in the formats the targets read: a few
/// rows of every shape (which object bytes a row carries, compressed how), keys of both kinds,
/// and the object bytes the rows carry, two of them with their dictionary.
pub fn write_seeds(rows: &Rows, out: &Path) -> Res<()> {
    let mut shapes: BTreeMap<String, Vec<(&str, &[u8])>> = BTreeMap::new();
    for (table, value) in &rows.values {
        shapes.entry(shape(table, value)).or_default().push((table, value));
    }
    // The order of `store_record`'s tables.
    let records = ["scopes", "scope_shards", "index_rev", "index_backfill"];
    let mut blobs = Vec::new();
    for (shape, group) in &shapes {
        for (i, (table, value)) in spread(group, PER_SHAPE).into_iter().enumerate() {
            let name = format!("{}-{i}", shape.replace(|c: char| !c.is_ascii_alphanumeric(), "_"));
            match table {
                "objects" => put(out, "store_object_row", &name, value)?,
                "log" => put(out, "store_log_row", &name, value)?,
                _ => {
                    let which = records.iter().position(|t| *t == table).ok_or("unknown table")?;
                    put(out, "store_record", &name, &[&[which as u8][..], value].concat())?;
                }
            }
            if let Ok((_, carried)) = CodecError::check_row(table, value) {
                blobs.extend(carried.into_iter().map(|(c, b)| (c, b.to_vec())));
            }
        }
    }
    for kind in ["objects", "index"] {
        let keys: Vec<_> = rows.keys.iter().filter(|(t, _)| *t == kind).collect();
        for (i, (_, key)) in spread(&keys, 6).into_iter().enumerate() {
            put(
                out,
                "store_key",
                &format!("{kind}-{i}"),
                &[&[u8::from(kind == "index")][..], key].concat(),
            )?;
        }
    }
    // A dictionary is about 64 KiB: two seeds carry one, the others go without.
    let mut with_dict = 0;
    for (i, (tag, blob)) in spread(&blobs, 12).into_iter().enumerate() {
        let (which, dict): (u8, &[u8]) = match tag {
            Compression::None => (0, &[]),
            Compression::Dict { .. } if with_dict >= 2 => (2, &[]),
            Compression::Dict { scope, dict } => (
                2,
                rows.dicts
                    .iter()
                    .find(|(k, _)| *k == (scope, dict))
                    .map(|(_, d)| d.as_slice())
                    .ok_or("a blob names a missing dictionary")?,
            ),
            _ => (1, &[]),
        };
        with_dict += usize::from(!dict.is_empty());
        let len = u32::try_from(dict.len())?.to_le_bytes();
        put(
            out,
            "store_unpack",
            &format!("blob-{i}-{which}"),
            &[&[which][..], &len, dict, &blob].concat(),
        )?;
    }
    Ok(())
}
