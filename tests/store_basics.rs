//! The durable store's contract as a user sees it: opening bad files, permissions, locking,
//! schema versions, cluster identity, relist diffs, index backfill and concurrent readers.

use std::os::unix::fs::PermissionsExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

mod common;

use common::tables::{tables, Rows};
use durable_informer::object::{ObjectKey, RawObject, ScopeSpec};
use durable_informer::store::{
    Batch, Compression, DeltaKind, DurableStore, Indexer, Seq, StoreConfig, StoreError, LABELS, SCHEMA_VERSION,
};

fn cm(ns: &str, name: &str, rv: u64, app: &str) -> RawObject {
    RawObject::from_json(
        format!(r#"{{"metadata":{{"name":"{name}","namespace":"{ns}","resourceVersion":"{rv}","labels":{{"app":"{app}"}}}}}}"#)
            .into_bytes(),
    )
    .unwrap()
}

fn spec() -> ScopeSpec {
    ScopeSpec::new("", "v1", "configmaps")
}

#[test]
fn database_file_is_created_owner_only() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db.redb");
    let db = DurableStore::open(StoreConfig::new(&path)).unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    assert!(db.check().unwrap().is_ok());
}

#[test]
fn a_file_that_is_not_a_database_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notes.txt");
    std::fs::write(&path, b"hello, this is not redb").unwrap();
    let err = DurableStore::open(StoreConfig::new(&path)).err().expect("must fail");
    assert!(matches!(err, StoreError::NotADatabase { .. }), "{err}");
    assert!(err.to_string().contains("notes.txt"), "{err}");
    assert_eq!(std::fs::read(&path).unwrap(), b"hello, this is not redb");
}

#[test]
fn a_second_open_gets_a_clear_locked_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db.redb");
    let _first = DurableStore::open(StoreConfig::new(&path)).unwrap();
    let err = DurableStore::open(StoreConfig::new(&path)).err().expect("must fail");
    assert!(matches!(err, StoreError::Locked { .. }), "{err}");
    assert!(err.to_string().contains("locked"), "{err}");
    // Here it is this process's own store: the message must not send the user hunting for
    // another process only.
    assert!(err.to_string().contains("another open store in this one"), "{err}");
}

#[test]
fn a_newer_schema_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db.redb");
    {
        let db = redb::Database::create(&path).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut meta = txn
                .open_table(redb::TableDefinition::<&str, &[u8]>::new("meta"))
                .unwrap();
            meta.insert("schema_version", (SCHEMA_VERSION + 1).to_be_bytes().as_slice())
                .unwrap();
        }
        txn.commit().unwrap();
    }
    let err = DurableStore::open(StoreConfig::new(&path)).err().expect("must fail");
    match &err {
        StoreError::NewerSchema { found, supported, .. } => {
            assert_eq!((*found, *supported), (SCHEMA_VERSION + 1, SCHEMA_VERSION));
        }
        other => panic!("unexpected {other}"),
    }
    assert!(err.to_string().contains("upgrade durable-informer"), "{err}");
}

#[test]
fn the_golden_v1_database_opens_and_reads() {
    // Written by `cargo run --example write_golden_db` with schema v1; never regenerate it for a
    // newer schema: add a new golden file instead.
    let golden = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/schema-v1.redb");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("copy.redb");
    std::fs::copy(golden, &path).unwrap();
    // A checkout gives the golden file the umask's mode; the copy stands for a database the
    // store created (invariant 5), so it gets the mode the store gives its files.
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let db = DurableStore::open(StoreConfig::new(&path)).unwrap();
    let scope = db.writer().register_scope_blocking(&spec()).unwrap();
    let store = db.store(scope);
    let keys = store.list_keys().unwrap();
    assert_eq!(
        keys,
        vec![
            ObjectKey::namespaced("default", "a"),
            ObjectKey::namespaced("default", "c")
        ]
    );
    assert_eq!(store.resource_version().unwrap().unwrap().as_str(), "13");
    assert_eq!(db.cluster_identity().unwrap().as_deref(), Some("golden-cluster"));
    let report = db.check().unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
}

#[test]
fn damaged_files_give_errors_not_panics() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db.redb");
    {
        let db = DurableStore::open(StoreConfig::new(&path)).unwrap();
        let scope = db.writer().register_scope_blocking(&spec()).unwrap();
        for i in 0..50 {
            db.writer()
                .apply_blocking(Batch::new(scope).delta(DeltaKind::Added, cm("a", &format!("o{i}"), i + 1, "x")))
                .unwrap();
        }
    }
    let original = std::fs::read(&path).unwrap();
    // Truncations and garbled pages: each open either works (redb repairs what it can) or
    // returns an error; none may panic through to the caller.
    for (i, cut) in [original.len() / 2, 4096, 600, 20].into_iter().enumerate() {
        let p = dir.path().join(format!("cut{i}.redb"));
        std::fs::write(&p, &original[..cut.min(original.len())]).unwrap();
        let _ = DurableStore::open(StoreConfig::new(&p).check_integrity(true)).map(|db| db.check());
    }
    let mut garbled = original.clone();
    for b in garbled.iter_mut().skip(512).step_by(7) {
        *b ^= 0x5a;
    }
    let p = dir.path().join("garbled.redb");
    std::fs::write(&p, &garbled).unwrap();
    let _ = DurableStore::open(StoreConfig::new(&p).check_integrity(true)).map(|db| db.check());
}

#[test]
fn another_clusters_database_is_refused_unless_reset() {
    let dir = tempfile::tempdir().unwrap();
    let db = DurableStore::open(StoreConfig::new(dir.path().join("db.redb"))).unwrap();
    let w = db.writer();
    assert!(!w.cluster_identity_blocking("uid-A@https://a", false).unwrap());
    let scope = w.register_scope_blocking(&spec()).unwrap();
    w.apply_blocking(Batch::new(scope).delta(DeltaKind::Added, cm("a", "x", 5, "x")).rv("5"))
        .unwrap();
    assert!(!w.cluster_identity_blocking("uid-A@https://a", false).unwrap());
    let err = w.cluster_identity_blocking("uid-B@https://b", false).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("uid-A@https://a") && msg.contains("uid-B@https://b"),
        "{msg}"
    );
    assert_eq!(
        db.store(scope).list().unwrap().len(),
        1,
        "a refused identity changes nothing"
    );
    assert!(w.cluster_identity_blocking("uid-B@https://b", true).unwrap());
    assert!(db.store(scope).list().unwrap().is_empty());
    assert_eq!(db.store(scope).resource_version().unwrap(), None);
    assert!(db.check().unwrap().is_ok());
}

#[test]
fn an_rv_regression_is_refused_while_the_rest_of_the_group_commits() {
    let dir = tempfile::tempdir().unwrap();
    let db = DurableStore::open(StoreConfig::new(dir.path().join("db.redb"))).unwrap();
    let w = db.writer();
    let scope = w.register_scope_blocking(&spec()).unwrap();
    w.apply_blocking(
        Batch::new(scope)
            .delta(DeltaKind::Added, cm("a", "x", 10, "x"))
            .rv("10"),
    )
    .unwrap();
    let err = w
        .apply_blocking(Batch::new(scope).delta(DeltaKind::Added, cm("a", "y", 9, "x")).rv("9"))
        .unwrap_err();
    assert!(matches!(err, StoreError::RvRegression { .. }), "{err}");
    assert_eq!(
        db.store(scope).list_keys().unwrap(),
        vec![ObjectKey::namespaced("a", "x")]
    );
    w.apply_blocking(
        Batch::new(scope)
            .delta(DeltaKind::Added, cm("a", "z", 11, "x"))
            .rv("11"),
    )
    .unwrap();
    assert_eq!(db.store(scope).list().unwrap().len(), 2);
}

#[test]
fn relist_reports_only_real_differences_and_swaps_atomically() {
    let dir = tempfile::tempdir().unwrap();
    let db = DurableStore::open(StoreConfig::new(dir.path().join("db.redb"))).unwrap();
    let w = db.writer();
    let scope = w.register_scope_blocking(&spec()).unwrap();
    let mut batch = Batch::new(scope).rv("100");
    for i in 0..100 {
        batch = batch.delta(DeltaKind::Added, cm("ns", &format!("o{i:03}"), i + 1, "x"));
    }
    w.apply_blocking(batch.synced()).unwrap();
    let before = db.log().bounds().unwrap().unwrap().1;
    // The relist: o000 deleted, o001 changed, o100 new, the rest unchanged.
    let mut page = vec![cm("ns", "o001", 200, "y"), cm("ns", "o100", 201, "x")];
    for i in 2..100 {
        page.push(cm("ns", &format!("o{i:03}"), i + 1, "x"));
    }
    w.stage_relist_blocking(scope, page).unwrap();
    // Readers still see the old state until the relist finishes.
    assert!(db
        .store(scope)
        .get(&ObjectKey::namespaced("ns", "o000"))
        .unwrap()
        .is_some());
    let summary = w.finish_relist_blocking(scope, "300".into(), "410 Gone").unwrap();
    assert_eq!(
        (summary.added, summary.updated, summary.deleted, summary.unchanged),
        (1, 1, 1, 98)
    );
    let entries = db.log().read_after(before, 100, Some(scope)).unwrap();
    assert_eq!(entries.len(), 3, "only real differences reach the log");
    let deleted = entries.iter().find(|e| e.kind == DeltaKind::Deleted).unwrap();
    assert!(deleted.final_state_unknown);
    assert_eq!(deleted.key, ObjectKey::namespaced("ns", "o000"));
    assert!(deleted.old.is_some(), "the last known state travels with the delete");
    let rec = db.store(scope).record().unwrap();
    assert_eq!((rec.rv.unwrap().0, rec.relist_count), ("300".to_owned(), 1));
    assert_eq!(rec.last_relist_reason.as_deref(), Some("410 Gone"));
    assert!(db.check().unwrap().is_ok());
}

#[test]
fn adding_an_index_to_a_filled_scope_backfills_it() {
    let dir = tempfile::tempdir().unwrap();
    let db = DurableStore::open(StoreConfig::new(dir.path().join("db.redb"))).unwrap();
    let w = db.writer();
    let scope = w.register_scope_blocking(&spec()).unwrap();
    let mut batch = Batch::new(scope);
    for i in 0..30 {
        batch = batch.delta(
            DeltaKind::Added,
            cm("ns", &format!("o{i}"), i + 1, if i % 3 == 0 { "web" } else { "db" }),
        );
    }
    w.apply_blocking(batch).unwrap();
    assert!(matches!(
        db.store(scope).by_index(LABELS, "app=web"),
        Err(StoreError::UnknownIndex { .. })
    ));
    db.register_index(scope, Indexer::labels());
    w.ensure_index_blocking(scope, LABELS.into()).unwrap();
    assert_eq!(db.store(scope).by_index(LABELS, "app=web").unwrap().len(), 10);
    assert_eq!(
        db.store(scope).list_index_values(LABELS).unwrap(),
        vec!["app=db", "app=web"]
    );
    // Later changes keep it up to date, stale values are dropped.
    w.apply_blocking(Batch::new(scope).delta(DeltaKind::Updated, cm("ns", "o0", 100, "db")))
        .unwrap();
    assert_eq!(db.store(scope).by_index(LABELS, "app=web").unwrap().len(), 9);
    assert!(db.check().unwrap().is_ok());
}

#[test]
fn readers_during_writes_only_see_committed_snapshots() {
    let dir = tempfile::tempdir().unwrap();
    let db = DurableStore::open(StoreConfig::new(dir.path().join("db.redb")).durable(false)).unwrap();
    let w = db.writer();
    let scope = w.register_scope_blocking(&spec()).unwrap();
    let store = db.store(scope);
    let done = Arc::new(AtomicBool::new(false));
    let reader = {
        let done = done.clone();
        std::thread::spawn(move || {
            let mut reads = 0;
            while !done.load(Ordering::Relaxed) {
                let snap = store.snapshot().unwrap();
                let objs = snap.list().unwrap();
                let rv = snap.record().unwrap().rv.and_then(|r| r.as_u64()).unwrap_or(0);
                // Each batch adds 10 objects and sets RV = 10 × batches: a torn read breaks this.
                assert_eq!(objs.len() as u64, rv, "saw a half-applied batch");
                assert_eq!(snap.len().unwrap(), rv);
                reads += 1;
            }
            reads
        })
    };
    for b in 0..200u64 {
        let mut batch = Batch::new(scope).rv(((b + 1) * 10).to_string());
        for j in 0..10 {
            batch = batch.delta(DeltaKind::Added, cm("ns", &format!("o{b}-{j}"), b * 10 + j + 1, "x"));
        }
        w.apply_blocking(batch).unwrap();
    }
    done.store(true, Ordering::Relaxed);
    let reads = reader.join().unwrap();
    assert!(reads > 0);
}

#[test]
fn group_commit_acknowledges_every_sender() {
    let dir = tempfile::tempdir().unwrap();
    let db = DurableStore::open(StoreConfig::new(dir.path().join("db.redb"))).unwrap();
    let w = db.writer();
    let scope = w.register_scope_blocking(&spec()).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    let committed = rt.block_on(async {
        let mut tasks = Vec::new();
        for i in 0..200u64 {
            let w = w.clone();
            tasks.push(tokio::spawn(async move {
                w.apply(Batch::new(scope).delta(DeltaKind::Added, cm("ns", &format!("o{i}"), i + 1, "x")))
                    .await
            }));
        }
        let mut n = 0;
        for t in tasks {
            let c = t.await.unwrap().unwrap();
            n += c.entries;
        }
        n
    });
    assert_eq!(committed, 200);
    assert_eq!(*w.committed().borrow(), durable_informer::store::Seq(200));
    assert_eq!(db.store(scope).list().unwrap().len(), 200);
}

fn pod_like(i: u64, rv: u64) -> RawObject {
    RawObject::from_json(
        format!(
            r#"{{"kind":"Pod","metadata":{{"name":"p{i}","namespace":"ns{}","resourceVersion":"{rv}","labels":{{"app":"a{}"}}}},"spec":{{"containers":[{{"name":"c","image":"img:{}","env":[{{"name":"X","value":"{}"}}]}}]}},"status":{{"phase":"Running","podIP":"10.0.{}.{}"}}}}"#,
            i % 3,
            i % 5,
            i % 7,
            "v".repeat((i % 40) as usize),
            i % 250,
            rv % 250
        )
        .into_bytes(),
    )
    .unwrap()
}

#[test]
fn dictionary_compressed_objects_read_back_across_restarts_settings_and_compaction() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db.redb");
    let dict = StoreConfig::new(&path).compression(Compression::ZstdDict(3));
    let n = 400;
    let expect = |db: &DurableStore, scope, version: u64| {
        let store = db.store(scope);
        for i in 0..n {
            let got = store
                .get(&ObjectKey::namespaced(format!("ns{}", i % 3), format!("p{i}")))
                .unwrap()
                .unwrap();
            assert_eq!(got.bytes, pod_like(i, version * 1000 + i + 1).bytes);
        }
        let report = db.check().unwrap();
        assert!(report.is_ok(), "{:?}", report.problems);
    };
    let scope;
    {
        let db = DurableStore::open(dict.clone()).unwrap();
        scope = db.writer().register_scope_blocking(&spec()).unwrap();
        db.register_index(scope, Indexer::labels());
        db.writer().ensure_index_blocking(scope, LABELS.into()).unwrap();
        // Small batches first: the dictionary is trained once enough objects were seen, in the
        // middle of the adds, so the scope holds blobs with and without it.
        for chunk in (0..n).collect::<Vec<_>>().chunks(50) {
            let mut b = Batch::new(scope);
            for &i in chunk {
                b = b.delta(DeltaKind::Added, pod_like(i, i + 1));
            }
            db.writer().apply_blocking(b).unwrap();
        }
        expect(&db, scope, 0);
    }
    {
        // Without the setting, dictionary blobs stay readable; updates are stored uncompressed.
        let db = DurableStore::open(StoreConfig::new(&path).compression(Compression::None)).unwrap();
        db.register_index(scope, Indexer::labels());
        expect(&db, scope, 0);
        let mut b = Batch::new(scope);
        for i in 0..n / 2 {
            b = b.delta(DeltaKind::Updated, pod_like(i, 1000 + i + 1));
        }
        db.writer().apply_blocking(b).unwrap();
    }
    {
        // Back with dictionaries: the stored one is reused; the rest are updated; the log
        // hands old and new states of every kind of blob to handlers.
        let db = DurableStore::open(dict).unwrap();
        db.register_index(scope, Indexer::labels());
        let mut b = Batch::new(scope);
        for i in n / 2..n {
            b = b.delta(DeltaKind::Updated, pod_like(i, 1000 + i + 1));
        }
        db.writer().apply_blocking(b).unwrap();
        expect(&db, scope, 1);
        let log = db.log().read_after(Seq(0), usize::MAX, Some(scope)).unwrap();
        let updates: Vec<_> = log.iter().filter(|r| r.kind == DeltaKind::Updated).collect();
        assert_eq!(updates.len() as u64, n);
        for r in updates {
            let i: u64 = r.key.name[1..].parse().unwrap();
            assert_eq!(r.old.as_ref().unwrap(), &pod_like(i, i + 1).bytes);
            assert_eq!(r.object.as_ref().unwrap(), &pod_like(i, 1000 + i + 1).bytes);
        }
        // Compaction moves blobs (with their tags) into rows; they still decode.
        db.writer().compact_blocking(Some(10)).unwrap();
        expect(&db, scope, 1);
        // A relist re-stores what changed with the dictionary, and diffs correctly.
        let listed: Vec<_> = (0..n)
            .map(|i| pod_like(i, if i < 10 { 5000 + i } else { 1000 + i + 1 }))
            .collect();
        db.writer().stage_relist_blocking(scope, listed).unwrap();
        let summary = db
            .writer()
            .finish_relist_blocking(scope, "9999".into(), "test")
            .unwrap();
        assert_eq!((summary.updated, summary.unchanged), (10, n - 10));
        assert!(db.check().unwrap().is_ok());
    }
    // `check` notices blobs whose dictionary is gone.
    {
        let raw = redb::Database::open(&path).unwrap();
        let txn = raw.begin_write().unwrap();
        txn.open_table(redb::TableDefinition::<(u32, u32), &[u8]>::new("dicts"))
            .unwrap()
            .retain(|_, _| false)
            .unwrap();
        txn.commit().unwrap();
    }
    let db = DurableStore::open(StoreConfig::new(&path)).unwrap();
    let report = db.check().unwrap();
    assert!(
        report.problems.iter().any(|p| p.contains("missing dictionary")),
        "{:?}",
        report.problems
    );
}

#[test]
fn the_golden_v2_database_opens_and_reads() {
    // Written by `cargo run --example write_golden_db` with schema v2 (dictionary compression).
    let golden = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/schema-v2.redb");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("copy.redb");
    std::fs::copy(golden, &path).unwrap();
    std::fs::set_permissions(&path, PermissionsExt::from_mode(0o600)).unwrap();
    let db = DurableStore::open(StoreConfig::new(&path)).unwrap();
    let scope = db.writer().register_scope_blocking(&spec()).unwrap();
    let store = db.store(scope);
    let keys = store.list_keys().unwrap();
    assert_eq!(keys.len(), 302);
    assert_eq!(keys[0], ObjectKey::namespaced("default", "a"));
    // Objects stored before and after the dictionary was trained.
    for key in [
        ObjectKey::namespaced("default", "a"),
        ObjectKey::namespaced("default", "d299"),
    ] {
        let o = store.get(&key).unwrap().unwrap();
        assert_eq!(o.meta.key(), key);
        assert!(o.bytes.starts_with(br#"{"apiVersion":"v1","kind":"ConfigMap""#));
    }
    assert_eq!(store.resource_version().unwrap().unwrap().as_str(), "400");
    assert_eq!(db.cluster_identity().unwrap().as_deref(), Some("golden-cluster"));
    let report = db.check().unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
    drop(store);
    db.close().unwrap();
    // The file really holds a trained dictionary (so the reads above went through it).
    let raw = redb::Database::open(&path).unwrap();
    let txn = redb::ReadableDatabase::begin_read(&raw).unwrap();
    let dicts = txn
        .open_table(redb::TableDefinition::<(u32, u32), &[u8]>::new("dicts"))
        .unwrap();
    assert_eq!(redb::ReadableTableMetadata::len(&dicts).unwrap(), 1);
}

/// A copy of a golden file with the mode the store gives its files.
fn golden_copy(version: u32, dir: &std::path::Path) -> std::path::PathBuf {
    let golden = format!("{}/tests/golden/schema-v{version}.redb", env!("CARGO_MANIFEST_DIR"));
    let path = dir.join(format!("copy-v{version}.redb"));
    std::fs::copy(golden, &path).unwrap();
    std::fs::set_permissions(&path, PermissionsExt::from_mode(0o600)).unwrap();
    path
}

#[test]
fn every_golden_database_migrates_to_the_latest_schema() {
    use redb::{ReadableDatabase, ReadableTable};
    let dir = tempfile::tempdir().unwrap();
    for version in 1..=4 {
        let path = golden_copy(version, dir.path());
        let db = DurableStore::open(StoreConfig::new(&path).retention_entries(None)).unwrap();
        let report = db.check().unwrap();
        assert!(report.is_ok(), "v{version}: {:?}", report.problems);
        let bounds = db.log().bounds().unwrap();
        // Still writable, and new commits are dated.
        let scope = db.writer().register_scope_blocking(&spec()).unwrap();
        let c = db
            .writer()
            .apply_blocking(
                Batch::new(scope)
                    .delta(DeltaKind::Added, cm("default", "after-upgrade", 100_000, "x"))
                    .rv("100000"),
            )
            .unwrap();
        let report = db.check().unwrap();
        assert!(report.is_ok(), "v{version} after a write: {:?}", report.problems);
        if version >= 3 {
            // The one scope of the file owns the cursor written by name only before v4.
            assert_eq!(
                db.log().cursor(scope, "golden-handler").unwrap(),
                Some(Seq(4)),
                "v{version}"
            );
        }
        db.close().unwrap();

        let raw = redb::Database::open(&path).unwrap();
        let txn = raw.begin_read().unwrap();
        let meta = txn
            .open_table(redb::TableDefinition::<&str, &[u8]>::new("meta"))
            .unwrap();
        let found = meta.get("schema_version").unwrap().unwrap().value().to_vec();
        assert_eq!(found, SCHEMA_VERSION.to_be_bytes().to_vec(), "v{version}");
        let times = txn
            .open_table(redb::TableDefinition::<u64, u64>::new("commit_times"))
            .unwrap();
        let rows: Vec<u64> = times.iter().unwrap().map(|r| r.unwrap().0.value()).collect();
        let (first, _) = bounds.expect("every golden file has log entries");
        // Older entries got one row at the first retained seq; the new commit its own.
        assert_eq!(rows.first(), Some(&first.0), "v{version}");
        assert_eq!(rows.last(), Some(&c.seq.0), "v{version}");
        txn.open_table(redb::TableDefinition::<(u32, &str), &[u8]>::new("index_backfill"))
            .unwrap();
        txn.open_table(redb::TableDefinition::<(u32, u32), &[u8]>::new("dicts"))
            .unwrap();
        assert!(
            txn.open_table(redb::TableDefinition::<&str, u64>::new("cursors"))
                .is_err(),
            "v{version}: the name-only cursor table is gone"
        );
    }
}

#[test]
fn the_golden_v3_database_opens_reads_and_resumes_its_backfill() {
    // Written by `cargo run --example write_golden_db` with schema v3: a compacted log below a
    // durable cursor, a finished label index and a backfill that was cut short.
    use durable_informer::store::IndexStatus;
    let dir = tempfile::tempdir().unwrap();
    let path = golden_copy(3, dir.path());
    let db = DurableStore::open(StoreConfig::new(&path)).unwrap();
    let scope = db.writer().register_scope_blocking(&spec()).unwrap();
    let store = db.store(scope);
    assert_eq!(store.list_keys().unwrap().len(), 302);
    assert_eq!(store.resource_version().unwrap().unwrap().as_str(), "400");
    assert_eq!(db.log().cursor(scope, "golden-handler").unwrap(), Some(Seq(4)));
    let (first, last) = db.log().bounds().unwrap().unwrap();
    assert_eq!((first, last), (Seq(5), Seq(306)));
    assert_eq!(store.index_status(LABELS).unwrap(), IndexStatus::Ready);
    assert!(matches!(
        store.index_status("name-length").unwrap(),
        IndexStatus::Backfilling { after: Some(_) }
    ));
    assert!(matches!(
        store.by_index("name-length", "4"),
        Err(StoreError::IndexNotReady { .. })
    ));
    db.register_index(scope, Indexer::labels());
    db.register_index(
        scope,
        Indexer::new("name-length", |meta, _| vec![meta.name.len().to_string()]),
    );
    let report = db.check().unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
    db.writer().ensure_index_blocking(scope, "name-length".into()).unwrap();
    // a, c; d0..d9; d10..d99; d100..d299.
    for (len, n) in [("1", 2), ("2", 10), ("3", 90), ("4", 200)] {
        assert_eq!(store.index_keys("name-length", len).unwrap().len(), n, "length {len}");
    }
    assert_eq!(store.index_keys(LABELS, "app=x").unwrap().len(), 0);
    let report = db.check().unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
}

/// A pipelined batch requires the RV its predecessor reaches: if the predecessor did not
/// commit, the batch is refused and changes nothing (its events would otherwise skip the
/// predecessor's).
#[test]
fn a_batch_whose_predecessor_did_not_commit_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let db = DurableStore::open(StoreConfig::new(dir.path().join("db.redb"))).unwrap();
    let w = db.writer();
    let scope = w.register_scope_blocking(&spec()).unwrap();
    w.apply_blocking(
        Batch::new(scope)
            .delta(DeltaKind::Added, cm("a", "x", 10, "x"))
            .rv("10"),
    )
    .unwrap();
    // The predecessor (reaching 12) never committed.
    let err = w
        .apply_blocking(
            Batch::new(scope)
                .requires("12")
                .delta(DeltaKind::Added, cm("a", "y", 13, "x"))
                .rv("13"),
        )
        .unwrap_err();
    assert!(matches!(err, StoreError::PredecessorMissing { .. }), "{err}");
    assert!(err.to_string().contains("previous batch did not commit"), "{err}");
    assert_eq!(db.store(scope).list().unwrap().len(), 1);
    assert_eq!(
        db.store(scope).resource_version().unwrap().map(|r| r.0),
        Some("10".into())
    );
    // It did (or an older requirement): the batch applies.
    for (req, rv) in [("10", 11), ("11", 12)] {
        w.apply_blocking(
            Batch::new(scope)
                .requires(req)
                .delta(DeltaKind::Added, cm("a", &format!("n{rv}"), rv, "x"))
                .rv(rv.to_string()),
        )
        .unwrap();
    }
    assert_eq!(db.store(scope).list().unwrap().len(), 3);
    assert!(db.check().unwrap().is_ok());
}

/// The same objects applied in batches of any size give byte-identical tables: the dictionary
/// starts at the object that completes its samples, wherever the batch boundaries fall.
#[test]
fn batch_boundaries_do_not_change_the_stored_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let run = |sizes: &[usize]| -> (Rows, Rows) {
        let path = dir.path().join(format!("db-{sizes:?}.redb"));
        {
            let db = DurableStore::open(StoreConfig::new(&path).durable(false)).unwrap();
            let scope = db.writer().register_scope_blocking(&spec()).unwrap();
            let objects: Vec<RawObject> = (0..600u64).map(|i| pod_like(i % 400, i + 1)).collect();
            let mut rest = objects.as_slice();
            for &n in sizes.iter().cycle() {
                if rest.is_empty() {
                    break;
                }
                let (now, later) = rest.split_at(n.min(rest.len()));
                let mut b =
                    Batch::new(scope).rv((now[now.len() - 1].meta.resource_version.as_u64().unwrap()).to_string());
                for o in now {
                    b = b.delta(DeltaKind::Updated, o.clone());
                }
                db.writer().apply_blocking(b).unwrap();
                rest = later;
            }
            db.close().unwrap();
        }
        tables(&path)
    };
    let whole = run(&[600]);
    assert_eq!(whole.1.len(), 600);
    for sizes in [&[1][..], &[7], &[255, 2], &[256], &[100, 300]] {
        let other = run(sizes);
        assert!(other.0 == whole.0, "object rows differ with batches of {sizes:?}");
        assert!(other.1 == whole.1, "log rows differ with batches of {sizes:?}");
    }
}

/// What a restart inside one process does: reopen the file right after the last handle went.
#[test]
fn a_dropped_or_closed_store_frees_its_file_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db.redb");
    for i in 0..50u64 {
        let db = DurableStore::open(StoreConfig::new(&path)).unwrap_or_else(|e| panic!("open {i}: {e}"));
        let w = db.writer();
        let scope = w.register_scope_blocking(&spec()).unwrap();
        w.apply_blocking(Batch::new(scope).delta(DeltaKind::Added, cm("ns", &format!("o{i}"), i + 1, "x")))
            .unwrap();
        drop(w);
        if i % 2 == 0 {
            drop(db);
        } else {
            db.close().unwrap();
        }
    }
    let db = DurableStore::open(StoreConfig::new(&path)).unwrap();
    assert_eq!(db.store(db.scopes().unwrap()[0].0).list().unwrap().len(), 50);
}

/// The same with an informer on the store, whichever of the two goes last: its tasks end on
/// the runtime after `shutdown`, and the file is still free for the next open at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_file_is_free_at_once_when_the_store_and_its_informer_are_gone() {
    use durable_informer::informer::Informer;
    use k8s_openapi::api::core::v1::ConfigMap;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db.redb");
    let fake = common::fake::Fake::new();
    for i in 0..50u64 {
        fake.upsert(&format!("o{i}"), "1");
        let p = path.clone();
        let db = tokio::task::spawn_blocking(move || DurableStore::open(StoreConfig::new(p)))
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("open {i}: {e}"));
        let inf = Informer::<ConfigMap>::builder(&db, fake.clone()).build().await.unwrap();
        inf.start();
        inf.wait_for_sync().await.unwrap();
        assert_eq!(inf.store().list_keys().unwrap().len() as u64, i + 1);
        inf.shutdown().await.unwrap();
        if i % 2 == 0 {
            drop(inf);
            drop(db);
        } else {
            drop(db);
            drop(inf);
        }
    }
}
