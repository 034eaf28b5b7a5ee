//! Writes `tests/golden/schema-v<N>.redb`: a small database in the current schema, kept in the
//! repository so later releases prove they still open it. Run once per released schema version:
//! `cargo run --example write_golden_db`.

use durable_informer::object::{RawObject, ScopeSpec};
use durable_informer::store::{
    Batch, Compression, DeltaKind, DurableStore, IndexStatus, Indexer, Seq, StoreConfig, LABELS, SCHEMA_VERSION,
};
use futures::FutureExt;

fn cm(name: &str, rv: u64) -> Result<RawObject, Box<dyn std::error::Error>> {
    let json = format!(
        r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"{name}","namespace":"default","resourceVersion":"{rv}"}},"data":{{"k":"v"}}}}"#
    );
    Ok(RawObject::from_json(json.into_bytes())?)
}

/// The index left half backfilled in the v3 file: the length of the object's name.
fn name_length() -> Indexer {
    Indexer::new("name-length", |meta, _| vec![meta.name.len().to_string()])
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = format!(
        "{}/tests/golden/schema-v{SCHEMA_VERSION}.redb",
        env!("CARGO_MANIFEST_DIR")
    );
    if std::path::Path::new(&path).exists() {
        return Err(format!("{path} exists: golden files are never rewritten").into());
    }
    // Dictionary compression (schema v2): blobs written before and after the scope's
    // dictionary was trained. Backfill steps of 50 objects (schema v3).
    let db = DurableStore::open(
        StoreConfig::new(&path)
            .compression(Compression::ZstdDict(3))
            .maintenance_steps(4096, 50),
    )?;
    let w = db.writer();
    w.cluster_identity_blocking("golden-cluster", false)?;
    let scope = w.register_scope_blocking(&ScopeSpec::new("", "v1", "configmaps"))?;
    w.apply_blocking(
        Batch::new(scope)
            .delta(DeltaKind::Added, cm("a", 10)?)
            .delta(DeltaKind::Added, cm("b", 11)?)
            .delta(DeltaKind::Updated, cm("a", 12)?)
            .rv("12")
            .synced(),
    )?;
    w.apply_blocking(
        Batch::new(scope)
            .delta(DeltaKind::Added, cm("c", 13)?)
            .delta(DeltaKind::Deleted, cm("b", 13)?)
            .rv("13"),
    )?;
    let mut batch = Batch::new(scope);
    for i in 0..300 {
        batch = batch.delta(DeltaKind::Added, cm(&format!("d{i}"), 100 + i)?);
    }
    w.apply_blocking(batch.rv("399"))?;
    w.apply_blocking(Batch::new(scope).delta(DeltaKind::Updated, cm("d299", 400)?).rv("400"))?;
    // Schema v3: commit times (entries 1..=4 compacted below the cursor, so the row of the
    // commit holding 5 moved to 5), a finished index and one whose backfill was cut short.
    w.set_cursor_blocking(scope, "golden-handler".into(), Seq(4))?;
    let report = w.compact_blocking(Some(0))?;
    db.register_index(scope, Indexer::labels());
    w.ensure_index_blocking(scope, LABELS.into())?;
    db.register_index(scope, name_length());
    // Sent without waiting; the store closes after the first steps.
    let _ = w.ensure_index(scope, "name-length".into()).now_or_never();
    db.close()?;
    let db = DurableStore::open(StoreConfig::new(&path))?;
    let status = db.store(scope).index_status("name-length")?;
    db.close()?;
    println!(
        "wrote {path}: compacted to {}, name-length index {status:?}",
        report.first_retained
    );
    if !matches!(status, IndexStatus::Backfilling { .. }) {
        return Err("the name-length backfill finished before the store closed; remove the file and run again".into());
    }
    Ok(())
}
