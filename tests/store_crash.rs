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

use durable_informer::object::{ObjectKey, RawObject, ScopeSpec};
use durable_informer::store::{Batch, DeltaKind, DurableStore, Indexer, StoreConfig, LABELS};

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

// Index backfill killed mid-way ---------------------------------------------------------------

const BACKFILL_OBJECTS: u64 = 20_000;

/// The index of round `r`: two rounds per index (see `killed_backfill_resumes_to_an_exact_index`).
fn backfill_index(n: u64) -> Indexer {
    Indexer::new(&format!("idx-{n}"), move |meta, _| {
        meta.labels.get("g").map(|g| format!("{n}-{g}")).into_iter().collect()
    })
}

fn labeled(i: u64, rv: u64, g: u64) -> Vec<u8> {
    format!(r#"{{"kind":"ConfigMap","metadata":{{"name":"o{i:05}","namespace":"ns","resourceVersion":"{rv}","labels":{{"g":"{g}"}}}}}}"#)
        .into_bytes()
}

fn open_backfill_db(path: &std::path::Path, indexes: u64) -> (DurableStore, durable_informer::store::ScopeId) {
    let db = DurableStore::open(StoreConfig::new(path)).expect("open");
    let scope = db
        .writer()
        .register_scope_blocking(&ScopeSpec::new("", "v1", "configmaps"))
        .expect("scope");
    for n in 0..indexes {
        db.register_index(scope, backfill_index(n));
    }
    (db, scope)
}

/// Round `round` of the child: writes to the scope all along; registers the round's index
/// before its writes start (even rounds) or after (odd rounds, so that a resume must repair
/// what was written meanwhile), then runs `ensure_index` while printing each step it sees.
fn backfill_child(path: &str, round: u64) -> ! {
    let n = round / 2;
    let (db, scope) = open_backfill_db(std::path::Path::new(path), n);
    let register = || db.register_index(scope, backfill_index(n));
    if round.is_multiple_of(2) {
        register();
    }
    let w = db.writer();
    let rv0 = db
        .store(scope)
        .resource_version()
        .expect("rv")
        .and_then(|rv| rv.as_u64())
        .unwrap_or(0);
    std::thread::spawn(move || {
        let mut seed = round * 7919 + 1;
        let mut rv = rv0;
        loop {
            let mut batch = Batch::new(scope);
            for _ in 0..20 {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                rv += 1;
                let i = seed % BACKFILL_OBJECTS;
                let obj = RawObject::from_json(labeled(i, rv, seed % 5)).expect("json");
                let kind = if seed.is_multiple_of(11) {
                    DeltaKind::Deleted
                } else {
                    DeltaKind::Updated
                };
                batch = batch.delta(kind, obj);
            }
            w.apply_blocking(batch.rv(rv.to_string())).expect("apply");
        }
    });
    if round % 2 == 1 {
        std::thread::sleep(Duration::from_millis(20));
        register();
    }
    let store = db.store(scope);
    let name = format!("idx-{n}");
    std::thread::spawn(move || {
        let mut seen = None;
        loop {
            if let Ok(durable_informer::store::IndexStatus::Backfilling { after: Some(k) }) = store.index_status(&name)
            {
                if seen.as_ref() != Some(&k) {
                    println!("progress {k}");
                    seen = Some(k);
                }
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    });
    db.writer()
        .ensure_index_blocking(scope, format!("idx-{n}").as_str().into())
        .expect("ensure");
    println!("done");
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// The objects' `g` labels, by key.
fn labels_of(db: &DurableStore, scope: durable_informer::store::ScopeId) -> BTreeMap<ObjectKey, String> {
    db.store(scope)
        .list()
        .expect("list")
        .into_iter()
        .map(|o| (o.key, o.meta.labels.get("g").unwrap_or_default().to_owned()))
        .collect()
}

#[test]
fn killed_backfill_resumes_to_an_exact_index() {
    if let (Ok(path), Ok(round)) = (std::env::var("DI_BACKFILL_CHILD"), std::env::var("DI_BACKFILL_ROUND")) {
        backfill_child(&path, round.parse().expect("round"));
    }
    let rounds: u64 = std::env::var("DI_BACKFILL_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(8);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("backfill.redb");
    {
        let (db, scope) = open_backfill_db(&path, 0);
        for chunk in 0..BACKFILL_OBJECTS / 1000 {
            let mut batch = Batch::new(scope);
            for i in chunk * 1000..(chunk + 1) * 1000 {
                batch = batch.delta(
                    DeltaKind::Added,
                    RawObject::from_json(labeled(i, i + 1, i % 5)).unwrap(),
                );
            }
            db.writer()
                .apply_blocking(batch.rv(((chunk + 1) * 1000).to_string()))
                .unwrap();
        }
        db.close().unwrap();
    }
    let exe = std::env::current_exe().unwrap();
    let mut seed: u64 = 0x2545_F491_4F6C_DD1D;
    let mut resumed_mid_way = 0;
    for round in 0..rounds {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let mut child = Command::new(&exe)
            .args([
                "killed_backfill_resumes_to_an_exact_index",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("DI_BACKFILL_CHILD", &path)
            .env("DI_BACKFILL_ROUND", round.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        // Killed after the k-th step it saw (or soon after the backfill finished).
        let kill_after = 1 + seed % 4;
        let (tx, rx) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            let mut steps = 0;
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line.starts_with("progress ") {
                    steps += 1;
                    if steps == kill_after {
                        let _ = tx.send(());
                    }
                } else if line == "done" {
                    let _ = tx.send(());
                }
            }
        });
        let _ = rx.recv_timeout(Duration::from_secs(60));
        std::thread::sleep(Duration::from_millis(seed % 10));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        reader.join().unwrap();

        let n = round / 2;
        let (db, scope) = open_backfill_db(&path, n + 1);
        let name = format!("idx-{n}");
        let status = db.store(scope).index_status(&name).unwrap();
        if matches!(
            status,
            durable_informer::store::IndexStatus::Backfilling { after: Some(_) }
        ) {
            resumed_mid_way += 1;
        }
        // Partial state: rows behind the cursor exact, none wrong ahead of it.
        let report = db.check().unwrap();
        assert!(report.is_ok(), "round {round} ({status:?}): {:?}", report.problems);
        if round % 2 == 1 {
            // Resume here (the next child gets a new index): exact once it returns.
            db.writer().ensure_index_blocking(scope, name.as_str().into()).unwrap();
            let labels = labels_of(&db, scope);
            for g in 0..5 {
                let want: Vec<ObjectKey> = labels
                    .iter()
                    .filter(|(_, v)| **v == g.to_string())
                    .map(|(k, _)| k.clone())
                    .collect();
                let got = db.store(scope).index_keys(&name, &format!("{n}-{g}")).unwrap();
                assert_eq!(got, want, "round {round}: index {name} value {n}-{g}");
            }
            let report = db.check().unwrap();
            assert!(report.is_ok(), "round {round} after resuming: {:?}", report.problems);
        }
        db.close().unwrap();
    }
    assert!(resumed_mid_way > 0, "no round was killed in the middle of a backfill");
}
