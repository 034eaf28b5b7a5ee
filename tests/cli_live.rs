//! Inspecting a database that a live process writes: `get`, `list`, `history`, `stats`,
//! `check` and `export` read it beside the writer, see one commit, and never change the file
//! (no write, no migration, no recovery).

use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

#[path = "common/cli_bin.rs"]
mod cli_bin;

use cli_bin::{bin, run};
use durable_informer::object::{RawObject, ScopeSpec};
use durable_informer::store::{Batch, DeltaKind, Durability, DurableStore, ReadOnlyStore, StoreConfig, StoreError};
use serde_json::Value;

fn ok(args: &[&str], db: &Path) -> String {
    let (code, stdout, stderr) = run(args, db);
    assert_eq!(code, 0, "{args:?}: {stderr}");
    stdout
}

/// The file's bytes and modification time: what "never changes the file" is checked against.
fn fingerprint(path: &Path) -> (Vec<u8>, SystemTime) {
    let bytes = std::fs::read(path).unwrap();
    let mtime = std::fs::metadata(path).unwrap().modified().unwrap();
    (bytes, mtime)
}

fn cm(name: &str, rv: u64, value: u64) -> RawObject {
    RawObject::from_json(
        format!(
            r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"{name}","namespace":"ns","resourceVersion":"{rv}"}},"data":{{"v":"{value}"}}}}"#
        )
        .into_bytes(),
    )
    .unwrap()
}

fn spec() -> ScopeSpec {
    ScopeSpec::new("", "v1", "configmaps")
}

/// A writer that lets inspection commands read beside it.
fn live(path: &Path) -> DurableStore {
    DurableStore::open(StoreConfig::new(path).live_inspection(true)).unwrap()
}

#[test]
fn a_writer_without_live_inspection_refuses_readers_with_a_hint() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("exclusive.redb");
    let db = DurableStore::open(StoreConfig::new(&path)).unwrap();
    let scope = db.writer().register_scope_blocking(&spec()).unwrap();
    db.writer()
        .apply_blocking(Batch::new(scope).delta(DeltaKind::Added, cm("a", 1, 1)).rv("1"))
        .unwrap();
    let (code, _, stderr) = run(&["get", "configmaps"], &path);
    assert_eq!(code, 4, "{stderr}");
    assert!(stderr.contains("live_inspection"), "no hint: {stderr}");
    db.close().unwrap();
    // Once the writer is gone the same command reads the file.
    assert_eq!(ok(&["get", "configmaps", "-o", "name"], &path).trim(), "configmap/a");
}

#[test]
fn live_inspection_makes_every_commit_durable_and_refuses_a_store_that_never_fsyncs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("durable.redb");
    let refused = DurableStore::open(StoreConfig::new(&path).durable(false).live_inspection(true));
    assert!(matches!(refused, Err(StoreError::Config(_))), "{:?}", refused.err());
    // Deferral asked for before or after: redb shares only durable commits with readers.
    let db = DurableStore::open(
        StoreConfig::new(&path)
            .fsync_delay(Some(Duration::from_secs(3600)))
            .live_inspection(true)
            .fsync_delay(Some(Duration::from_secs(3600))),
    )
    .unwrap();
    let w = db.writer();
    let scope = w.register_scope_blocking(&spec()).unwrap();
    for (i, durability) in [Durability::Deferred, Durability::Relaxed].into_iter().enumerate() {
        let rv = (i + 1) as u64;
        let done = w
            .apply_blocking(
                Batch::new(scope)
                    .delta(DeltaKind::Added, cm(&format!("o{i}"), rv, 1))
                    .rv(rv.to_string())
                    .durability(durability),
            )
            .unwrap();
        // Durable handlers are told at once: the commit is on disk, not waiting for an fsync.
        assert!(
            *w.durable().borrow() >= done.seq,
            "{durability:?} batch not durable at its acknowledgement"
        );
        let names = ok(&["get", "configmaps", "-o", "name"], &path);
        assert!(names.contains(&format!("configmap/o{i}")), "{durability:?}: {names}");
    }
    db.close().unwrap();
}

#[test]
fn inspection_reads_beside_a_live_writer_and_never_changes_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("live.redb");
    let db = live(&path);
    let scope = db.writer().register_scope_blocking(&spec()).unwrap();
    let w = db.writer();
    w.apply_blocking(
        Batch::new(scope)
            .delta(DeltaKind::Added, cm("a", 1, 1))
            .delta(DeltaKind::Added, cm("b", 2, 1))
            .rv("2"),
    )
    .unwrap();
    w.apply_blocking(Batch::new(scope).delta(DeltaKind::Updated, cm("a", 3, 2)).rv("3"))
        .unwrap();
    w.apply_blocking(Batch::new(scope).delta(DeltaKind::Deleted, cm("b", 4, 1)).rv("4"))
        .unwrap();

    // The writer stays open (its process holds the file) for everything below.
    let before = fingerprint(&path);
    let list: Value = serde_json::from_str(&ok(&["get", "configmaps", "-o", "json"], &path)).unwrap();
    let items = list["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{list}");
    assert_eq!(items[0]["metadata"]["name"], "a");
    assert_eq!(items[0]["data"]["v"], "2");
    assert_eq!(list["metadata"]["resourceVersion"], "4");
    assert!(ok(&["list", "configmaps", "-o", "name"], &path).contains("configmap/a"));
    let history = ok(&["history", "configmaps", "b", "-n", "ns"], &path);
    assert!(history.contains("Added") && history.contains("Deleted"), "{history}");
    let stats: Value = serde_json::from_str(&ok(&["stats", "-o", "json"], &path)).unwrap();
    assert_eq!(stats["scopes"][0]["objects"], 1, "{stats}");
    assert!(ok(&["check"], &path).contains("every invariant holds"));
    let export = dir.path().join("export.jsonl");
    let exported = ok(&["export", "configmaps", "--out", export.to_str().unwrap()], &path);
    assert!(exported.contains("exported"), "{exported}");
    assert_eq!(std::fs::read_to_string(&export).unwrap().lines().count(), 4);
    assert!(fingerprint(&path) == before, "an inspection command changed the file");

    // The writer goes on, and the next inspection sees its new commit.
    w.apply_blocking(Batch::new(scope).delta(DeltaKind::Added, cm("c", 5, 1)).rv("5"))
        .unwrap();
    let names = ok(&["get", "configmaps", "-o", "name"], &path);
    assert_eq!(names.lines().collect::<Vec<_>>(), ["configmap/a", "configmap/c"]);
    // A command that writes is still refused while the writer lives.
    let (code, _, stderr) = run(&["compact"], &path);
    assert_eq!(code, 4, "{stderr}");
    assert!(stderr.contains("locked"), "{stderr}");
    db.close().unwrap();
}

#[test]
fn each_inspection_shows_one_commit_while_the_writer_commits() {
    const OBJECTS: u64 = 40;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("busy.redb");
    let db = live(&path);
    let scope = db.writer().register_scope_blocking(&spec()).unwrap();
    let w = db.writer();
    let mut batch = Batch::new(scope).rv("1");
    for i in 0..OBJECTS {
        batch = batch.delta(DeltaKind::Added, cm(&format!("cm-{i:02}"), 1, 0));
    }
    w.apply_blocking(batch).unwrap();
    // Every commit sets all objects to the same value: a view mixing two commits shows two.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
        let w = w.clone();
        std::thread::spawn(move || {
            let mut round = 1u64;
            while !stop.load(Ordering::Relaxed) {
                let rv = round + 1;
                let mut batch = Batch::new(scope).rv(rv.to_string());
                for i in 0..OBJECTS {
                    batch = batch.delta(DeltaKind::Updated, cm(&format!("cm-{i:02}"), rv, round));
                }
                w.apply_blocking(batch).unwrap();
                round += 1;
            }
            round
        })
    };
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..8 {
        let list: Value = serde_json::from_str(&ok(&["get", "configmaps", "-o", "json"], &path)).unwrap();
        let items = list["items"].as_array().unwrap();
        assert_eq!(items.len() as u64, OBJECTS);
        let values: std::collections::BTreeSet<&str> = items.iter().map(|o| o["data"]["v"].as_str().unwrap()).collect();
        assert_eq!(values.len(), 1, "one listing mixes commits: {values:?}");
        let rvs: std::collections::BTreeSet<&str> = items
            .iter()
            .map(|o| o["metadata"]["resourceVersion"].as_str().unwrap())
            .collect();
        assert_eq!(rvs.len(), 1, "{rvs:?}");
        // The list's resourceVersion is the scope's at that same commit.
        assert_eq!(list["metadata"]["resourceVersion"].as_str(), rvs.first().copied());
        seen.insert(values.first().unwrap().to_string());
    }
    stop.store(true, Ordering::Relaxed);
    let rounds = writer.join().unwrap();
    assert!(rounds > 1, "the writer committed while the CLI read");
    assert!(seen.len() > 1, "the CLI followed the writer's commits: {seen:?}");
    db.close().unwrap();
}

#[test]
fn an_older_or_newer_schema_is_refused_and_left_as_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let older = dir.path().join("v4.redb");
    std::fs::copy(
        concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/schema-v4.redb"),
        &older,
    )
    .unwrap();
    let before = fingerprint(&older);
    for args in [
        &["get", "configmaps"][..],
        &["list", "configmaps"],
        &["history", "configmaps", "x"],
        &["stats"],
        &["check"],
    ] {
        let (code, stdout, stderr) = run(args, &older);
        assert_eq!(code, 4, "{args:?}: {stdout} {stderr}");
        assert!(stderr.contains("older than this build reads"), "{args:?}: {stderr}");
        assert!(stderr.contains("never upgrades"), "{stderr}");
    }
    assert!(fingerprint(&older) == before, "an inspection migrated the file");
    let err = ReadOnlyStore::open(&older).unwrap_err();
    assert!(matches!(err, StoreError::OlderSchema { found: 4, .. }), "{err}");

    // The writer's open still migrates it (that is the writer's job).
    DurableStore::open(StoreConfig::new(&older)).unwrap().close().unwrap();
    assert!(ReadOnlyStore::open(&older).is_ok());

    let newer = dir.path().join("newer.redb");
    {
        let db = redb::Database::create(&newer).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut meta = txn
                .open_table(redb::TableDefinition::<&str, &[u8]>::new("meta"))
                .unwrap();
            meta.insert(
                "schema_version",
                (durable_informer::store::SCHEMA_VERSION + 1).to_be_bytes().as_slice(),
            )
            .unwrap();
        }
        txn.commit().unwrap();
    }
    let before = fingerprint(&newer);
    let (code, _, stderr) = run(&["stats"], &newer);
    assert_eq!(code, 4, "{stderr}");
    assert!(stderr.contains("newer than this build"), "{stderr}");
    assert!(fingerprint(&newer) == before);
}

#[test]
fn a_file_left_by_a_killed_writer_is_refused_untouched_until_the_writer_recovers_it() {
    let sim = durable_informer::sim::Sim::start(durable_informer::sim::SimConfig::default()).unwrap();
    sim.create(
        "configmaps",
        Some("default"),
        serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": "default"}}),
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("killed.redb");
    let mut watch = bin()
        .args(["watch", "configmaps", "-A", "--server", &sim.url(), "--db"])
        .arg(&path)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Its first event means the object is committed; the live writer's file is readable.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (code, stdout, _) = run(&["get", "configmaps", "-o", "name"], &path);
        if code == 0 && stdout.contains("configmap/x") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the watch never stored the object"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    watch.kill().unwrap();
    watch.wait().unwrap();

    let before = fingerprint(&path);
    let (code, _, stderr) = run(&["get", "configmaps"], &path);
    assert_eq!(code, 4, "{stderr}");
    assert!(stderr.contains("needs recovery"), "{stderr}");
    assert!(fingerprint(&path) == before, "an inspection recovered (wrote) the file");

    // The writer recovers it on open; inspection works again.
    DurableStore::open(StoreConfig::new(&path)).unwrap().close().unwrap();
    assert!(ok(&["get", "configmaps", "-o", "name"], &path).contains("configmap/x"));
}
