//! Writes `tests/golden/schema-v<N>.redb`: a small database in the current schema, kept in the
//! repository so later releases prove they still open it. Run once per released schema version:
//! `cargo run --example write_golden_db`.

use durable_informer::store::{
    Batch, Compression, DeltaKind, DurableStore, RawObject, ScopeSpec, StoreConfig, SCHEMA_VERSION,
};

fn cm(name: &str, rv: u64) -> Result<RawObject, Box<dyn std::error::Error>> {
    let json = format!(
        r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"{name}","namespace":"default","resourceVersion":"{rv}"}},"data":{{"k":"v"}}}}"#
    );
    Ok(RawObject::from_json(json.into_bytes())?)
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
    // dictionary was trained.
    let db = DurableStore::open(StoreConfig::new(&path).compression(Compression::ZstdDict(3)))?;
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
    db.close()?;
    println!("wrote {path}");
    Ok(())
}
