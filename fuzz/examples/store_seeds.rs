//! Writes the store targets' seeds from real rows (see `store_rows.rs`): a few rows of every
//! kind, chosen so each shape of row (which object bytes it carries, compressed how) is there.
//!
//!   cargo run --example store_seeds -- DIR      (fuzz/seed-corpora.sh --store does this)

use std::collections::BTreeMap;
use std::error::Error;
use std::path::{Path, PathBuf};

use durable_informer::store::{CodecError, Compression};

#[path = "../store_rows.rs"]
mod store_rows;

/// Rows kept per shape of row.
const PER_SHAPE: usize = 3;

/// A row's shape: its table and the tags of the object bytes it carries.
fn shape(table: &str, value: &[u8]) -> String {
    let tags = match CodecError::check_row(table, value) {
        Ok((_, blobs)) => blobs.iter().map(|(c, _)| format!("{c:?}")).collect::<Vec<_>>().join("+"),
        Err(_) => "undecodable".to_owned(),
    };
    format!("{table}:{tags}")
}

/// Up to `n` items spread over `items`.
fn spread<T: Clone>(items: &[T], n: usize) -> Vec<T> {
    let step = items.len().div_ceil(n).max(1);
    items.iter().step_by(step).cloned().collect()
}

fn put(out: &Path, target: &str, name: &str, bytes: &[u8]) -> Result<(), Box<dyn Error>> {
    let dir = out.join(target);
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join(name), bytes)?;
    Ok(())
}

fn main() -> Result<(), Box<dyn Error>> {
    let out = PathBuf::from(std::env::args().nth(1).ok_or("usage: store_seeds DIR")?);
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/golden/schema-v4.redb");
    let tmp = tempfile::tempdir()?;
    let rows = store_rows::from_golden(&golden, tmp.path())?;

    let mut shapes: BTreeMap<String, Vec<(&str, &[u8])>> = BTreeMap::new();
    for (table, value) in &rows.values {
        shapes.entry(shape(table, value)).or_default().push((table, value));
    }
    let records = ["scopes", "scope_shards", "index_rev", "index_backfill"];
    let mut blobs = Vec::new();
    for (shape, group) in &shapes {
        for (i, (table, value)) in spread(group, PER_SHAPE).into_iter().enumerate() {
            let name = format!("{}-{i}", shape.replace([':', '+', ' ', '{', '}', ',', '(', ')'], "_"));
            match table {
                "objects" => put(&out, "store_object_row", &name, value)?,
                "log" => put(&out, "store_log_row", &name, value)?,
                _ => {
                    let which = records.iter().position(|t| t == &table).ok_or("unknown table")?;
                    put(&out, "store_record", &name, &[&[which as u8][..], value].concat())?;
                }
            }
            if let Ok((_, carried)) = CodecError::check_row(table, value) {
                blobs.extend(carried.into_iter().map(|(c, b)| (c, b.to_vec())));
            }
        }
    }
    for (i, (table, key)) in spread(&rows.keys, 12).into_iter().enumerate() {
        let which = u8::from(table == "index");
        put(&out, "store_key", &format!("{table}-{i}"), &[&[which][..], &key].concat())?;
    }
    let index_keys: Vec<_> = rows.keys.iter().filter(|(t, _)| *t == "index").cloned().collect();
    for (i, (_, key)) in spread(&index_keys, 6).into_iter().enumerate() {
        put(&out, "store_key", &format!("index-only-{i}"), &[&[1u8][..], &key].concat())?;
    }
    // A dictionary is about 64 KiB: two seeds carry one, the others are without.
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
        put(&out, "store_unpack", &format!("blob-{i}-{which}"), &[&[which][..], &len, dict, &blob].concat())?;
    }
    println!(
        "{} rows, {} keys, {} dictionaries read; {} shapes of row",
        rows.values.len(),
        rows.keys.len(),
        rows.dicts.len(),
        shapes.len()
    );
    for (shape, group) in &shapes {
        println!("  {shape}: {}", group.len());
    }
    Ok(())
}
