//! Crash consistency: a child process applies batches and is killed with SIGKILL at random
//! moments; after reopening, the database equals the model at some committed prefix (never less
//! than what was acknowledged), the RV matches that prefix and `check` passes.
//!
//! The test binary is its own child: with `DI_CRASH_CHILD` set, the same test runs the writer
//! loop instead of the parent.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use durable_informer::store::{
    Batch, DeltaKind, DurableStore, Indexer, ObjectKey, RawObject, ScopeSpec, StoreConfig, LABELS,
};

const DELTAS_PER_BATCH: u64 = 25;

/// The deltas of batch `i` (1-based): deterministic, so the parent can rebuild the model.
fn batch_ops(i: u64) -> Vec<(bool, String, u64)> {
    (0..DELTAS_PER_BATCH)
        .map(|j| {
            let name = format!("cm-{}", (i * 7 + j * 13) % 60);
            let delete = (i + j).is_multiple_of(5);
            (delete, name, i * 100 + j)
        })
        .collect()
}

fn object(name: &str, rv: u64) -> Vec<u8> {
    format!(
        r#"{{"kind":"ConfigMap","metadata":{{"name":"{name}","namespace":"ns{}","resourceVersion":"{rv}","labels":{{"parity":"{}"}}}},"data":{{"payload":"{}"}}}}"#,
        name.len() % 3,
        rv % 2,
        "x".repeat(200 + (rv % 300) as usize)
    )
    .into_bytes()
}

fn model_after(k: u64) -> BTreeMap<ObjectKey, String> {
    let mut m = BTreeMap::new();
    for i in 1..=k {
        for (delete, name, rv) in batch_ops(i) {
            let key = ObjectKey::namespaced(format!("ns{}", name.len() % 3), name);
            if delete {
                m.remove(&key);
            } else {
                m.insert(key, rv.to_string());
            }
        }
    }
    m
}

fn open(path: &std::path::Path) -> (DurableStore, durable_informer::store::ScopeId) {
    let db = DurableStore::open(StoreConfig::new(path)).expect("open");
    let scope = db
        .writer()
        .register_scope_blocking(&ScopeSpec::new("", "v1", "configmaps"))
        .expect("scope");
    db.register_index(scope, Indexer::labels());
    db.writer().ensure_index_blocking(scope, LABELS.into()).expect("index");
    (db, scope)
}

fn child(path: &str) -> ! {
    let (db, scope) = open(std::path::Path::new(path));
    let start = db
        .store(scope)
        .resource_version()
        .expect("rv")
        .and_then(|rv| rv.as_u64())
        .map_or(0, |rv| rv / 100);
    let w = db.writer();
    let mut i = start + 1;
    loop {
        let mut batch = Batch::new(scope).rv((i * 100 + DELTAS_PER_BATCH).to_string());
        for (delete, name, rv) in batch_ops(i) {
            let obj = RawObject::from_json(object(&name, rv)).expect("json");
            batch = batch.delta(if delete { DeltaKind::Deleted } else { DeltaKind::Updated }, obj);
        }
        w.apply_blocking(batch).expect("apply");
        println!("acked {i}");
        i += 1;
    }
}

#[test]
fn killed_writer_leaves_a_committed_prefix() {
    if let Ok(path) = std::env::var("DI_CRASH_CHILD") {
        child(&path);
    }
    let rounds: u64 = std::env::var("DI_CRASH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(50);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("crash.redb");
    let exe = std::env::current_exe().unwrap();
    let mut seed: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut highest_acked = 0;
    for round in 0..rounds {
        let mut child = Command::new(&exe)
            .args([
                "killed_writer_leaves_a_committed_prefix",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("DI_CRASH_CHILD", &path)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let reader = std::thread::spawn(move || {
            let mut last = 0u64;
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(n) = line.strip_prefix("acked ").and_then(|n| n.parse().ok()) {
                    last = n;
                }
            }
            last
        });
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        std::thread::sleep(Duration::from_millis(40 + seed % 160));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let acked = reader.join().unwrap();
        highest_acked = highest_acked.max(acked);

        let (db, scope) = open(&path);
        let store = db.store(scope);
        let rv = store.resource_version().unwrap().and_then(|r| r.as_u64()).unwrap_or(0);
        let k = rv / 100;
        assert!(
            k >= highest_acked,
            "round {round}: batch {highest_acked} was acknowledged but only {k} survived"
        );
        if k > 0 {
            assert_eq!(
                rv,
                k * 100 + DELTAS_PER_BATCH,
                "round {round}: RV is not a batch boundary"
            );
        }
        let got: BTreeMap<ObjectKey, String> = store
            .list()
            .unwrap()
            .into_iter()
            .map(|o| (o.key, o.meta.resource_version.0))
            .collect();
        assert_eq!(
            got,
            model_after(k),
            "round {round}: store differs from the model at batch {k}"
        );
        let report = db.check().unwrap();
        assert!(report.is_ok(), "round {round}: {:?}", report.problems);
        highest_acked = k;
        db.close().unwrap();
    }
    assert!(highest_acked > 0, "no batch was ever committed");
}
