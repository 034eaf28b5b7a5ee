//! Storage faults: a fault-injecting redb backend (wrapping redb's `FileBackend`) fails syncs,
//! writes and `set_len` on command. A failed commit must be reported to every sender of its
//! group commit, the database must stay at the last acknowledged commit (`check` passes), and the
//! writer must keep working once the fault is gone (it reopens the database, as redb refuses
//! every operation after an I/O error until then).
//!
//! Finding: a commit whose *fsync* failed is reported as failed, but after the reopen it is
//! usually there (redb wrote the pages and the header; only the sync failed). That is the same
//! outcome as a crash between commit and acknowledgement, so the tests check the crash contract
//! (acknowledged ⊆ stored ⊆ acknowledged + whole failed batches, RV consistent), not equality. A full disk (ENOSPC) gives an error that says
//! "No space left on device", and nothing acknowledged is lost once space returns.

#[path = "common/stream_check.rs"]
mod stream_check;

#[path = "common/faults.rs"]
mod faults;

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use durable_informer::object::{RawObject, ScopeSpec};
use durable_informer::store::{
    Batch, DeltaKind, DurableStore, IndexStatus, Indexer, ScopeId, StoreConfig, StoreError, LABELS,
};
use faults::{config, Faults};

fn object(name: &str, rv: u64, pad: usize) -> RawObject {
    RawObject::from_json(
        format!(
            r#"{{"kind":"ConfigMap","metadata":{{"name":"{name}","namespace":"ns","resourceVersion":"{rv}"}},"data":{{"p":"{}"}}}}"#,
            "x".repeat(pad)
        )
        .into_bytes(),
    )
    .expect("object")
}

/// The scope's objects as name → rv, and its persisted RV.
///
/// While the writer reopens the database after an I/O error, read handles get
/// `StoreError::Closed` for a moment (redb's file lock allows one open `Database`); this retries
/// through that window.
fn state(db: &DurableStore, scope: ScopeId) -> (BTreeMap<String, String>, Option<String>) {
    for _ in 0..500 {
        let read = || -> Result<_, StoreError> {
            let objs = db
                .store(scope)
                .list()?
                .into_iter()
                .map(|o| (o.key.name.clone(), o.meta.resource_version.to_string()))
                .collect();
            let rv = db.store(scope).resource_version()?.map(|r| r.to_string());
            Ok((objs, rv))
        };
        match read() {
            Err(StoreError::Closed { .. }) => std::thread::sleep(std::time::Duration::from_millis(10)),
            other => return other.expect("read"),
        }
    }
    panic!("the store stayed closed");
}

fn check_clean(db: &DurableStore) {
    let report = db.check().expect("check");
    assert!(
        report.problems.is_empty(),
        "check found problems: {:?}",
        report.problems
    );
}

struct Model {
    objs: BTreeMap<String, String>,
    rv: Option<String>,
}

/// A commit whose fsync failed is reported as failed, yet its pages and header may already be in
/// the file (the write succeeded, only the sync did not): after the writer reopens the database
/// it can turn out durable — exactly like a crash between commit and acknowledgement. So the
/// contract checked here is the crash contract: the store equals the acknowledged commits plus,
/// possibly, some of the failed batches (each whole or not at all), with the RV of the newest
/// batch present; never less than acknowledged. `failed` lists the failed batches (name, rv);
/// those found in the store are adopted into the model. Returns how many were adopted.
fn adopt_possibly_durable(db: &DurableStore, scope: ScopeId, model: &mut Model, failed: &[(String, u64)]) -> usize {
    let (objs, rv) = state(db, scope);
    let mut adopted = 0;
    for (name, frv) in failed {
        if objs.get(name) == Some(&frv.to_string()) {
            model.objs.insert(name.clone(), frv.to_string());
            adopted += 1;
        }
    }
    assert_eq!(
        objs, model.objs,
        "the store is not the acknowledged state plus whole failed batches"
    );
    let max_present = model.objs.values().filter_map(|v| v.parse::<u64>().ok()).max();
    assert_eq!(
        rv.and_then(|r| r.parse::<u64>().ok()),
        max_present,
        "persisted RV does not match the data"
    );
    model.rv = max_present.map(|m| m.to_string());
    adopted
}

impl Model {
    fn ack(&mut self, name: &str, rv: u64) {
        self.objs.insert(name.to_owned(), rv.to_string());
        self.rv = Some(rv.to_string());
    }
}

fn setup() -> (tempfile::TempDir, Arc<Faults>, DurableStore, ScopeId, Model) {
    let dir = tempfile::tempdir().expect("tempdir");
    let faults = Arc::new(Faults::default());
    let db = DurableStore::open(config(&dir.path().join("db.redb"), &faults)).expect("open");
    let scope = db
        .writer()
        .register_scope_blocking(&ScopeSpec::new("", "v1", "configmaps"))
        .expect("scope");
    let mut model = Model {
        objs: BTreeMap::new(),
        rv: None,
    };
    for i in 1..=5 {
        let name = format!("base-{i}");
        db.writer()
            .apply_blocking(
                Batch::new(scope)
                    .delta(DeltaKind::Added, object(&name, i, 100))
                    .rv(i.to_string()),
            )
            .expect("base batch");
        model.ack(&name, i);
    }
    (dir, faults, db, scope, model)
}

/// Submits `n` batches at once (pipelined, so they share group commits) and returns each one's
/// outcome.
fn submit_many(db: &DurableStore, scope: ScopeId, first_rv: u64, n: u64) -> Vec<(String, u64, Result<(), StoreError>)> {
    let rxs: Vec<_> = (0..n)
        .map(|i| {
            let rv = first_rv + i;
            let name = format!("obj-{rv}");
            let rx = db
                .writer()
                .submit(
                    Batch::new(scope)
                        .delta(DeltaKind::Added, object(&name, rv, 2000))
                        .rv(rv.to_string()),
                )
                .expect("submit");
            (name, rv, rx)
        })
        .collect();
    rxs.into_iter()
        .map(|(name, rv, rx)| {
            let r = rx.blocking_recv().expect("writer replied");
            (name, rv, r.map(|_| ()))
        })
        .collect()
}

/// Applies one batch and returns the outcome.
fn apply_one(db: &DurableStore, scope: ScopeId, rv: u64) -> Result<(), StoreError> {
    db.writer()
        .apply_blocking(
            Batch::new(scope)
                .delta(DeltaKind::Added, object(&format!("obj-{rv}"), rv, 500))
                .rv(rv.to_string()),
        )
        .map(|_| ())
}

/// While every sync fails, every command of every group commit gets an error; the database stays
/// at the last acknowledged commit; after the fault clears, the writer reopens and goes on.
#[test]
fn failed_syncs_fail_every_command_of_the_group_and_the_writer_recovers() {
    let (dir, faults, db, scope, mut model) = setup();
    faults.fail_syncs.store(u64::MAX, Ordering::SeqCst);
    let outcomes = submit_many(&db, scope, 100, 20);
    for (name, _, r) in &outcomes {
        let e = r
            .as_ref()
            .expect_err("a commit whose sync failed must not be acknowledged");
        assert!(
            e.to_string().contains("injected fsync failure") || e.to_string().contains("I/O"),
            "{name}: unclear error: {e}"
        );
    }
    faults.fail_syncs.store(0, Ordering::SeqCst);
    assert!(faults.report("failed_syncs_fail_every_command_of_the_group_and_the_writer_recovers") > 0);
    // The writer recovers: new commits succeed (the first one after the reopen, at the latest).
    for rv in 200..205 {
        apply_one(&db, scope, rv).expect("commit after the fault cleared");
        model.ack(&format!("obj-{rv}"), rv);
    }
    // The state is every acknowledged commit plus, possibly, whole failed batches whose pages
    // reached the file before the sync failed.
    let failed: Vec<(String, u64)> = outcomes.iter().map(|(n, rv, _)| (n.clone(), *rv)).collect();
    let adopted = adopt_possibly_durable(&db, scope, &mut model, &failed);
    eprintln!(
        "{adopted} of {} batches reported failed turned out durable after the reopen",
        failed.len()
    );
    check_clean(&db);
    assert_eq!(state(&db, scope), (model.objs.clone(), model.rv.clone()));
    // And it survives a reopen.
    db.close().expect("close");
    let db = DurableStore::open(StoreConfig::new(dir.path().join("db.redb"))).expect("reopen");
    check_clean(&db);
    assert_eq!(state(&db, scope), (model.objs, model.rv));
}

/// Readers must not depend on a later write: once the fault clears, the writer reopens a
/// poisoned database by itself, even when its own reopen failed while the fault lasted.
#[test]
fn readers_recover_after_the_fault_clears_without_another_write() {
    let (_dir, faults, db, scope, mut model) = setup();
    for round in 0..10u64 {
        faults.fail_syncs.store(u64::MAX, Ordering::SeqCst);
        let outcomes = submit_many(&db, scope, 1000 + round * 10, 10);
        assert!(
            outcomes.iter().all(|(_, _, r)| r.is_err()),
            "a failed sync was acknowledged"
        );
        // Give the writer time to try (and fail) a reopen while syncs still fail.
        std::thread::sleep(std::time::Duration::from_millis(30));
        faults.fail_syncs.store(0, Ordering::SeqCst);
        // `state` panics if reads stay `Closed` for 5 s.
        let failed: Vec<(String, u64)> = outcomes.iter().map(|(n, rv, _)| (n.clone(), *rv)).collect();
        let _ = state(&db, scope);
        // Wait for the reopen the writer does on its own, then the file decides what is durable.
        for _ in 0..500 {
            if db.store(scope).list().is_ok() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        apply_one(&db, scope, 5000 + round).expect("commit after the fault cleared");
        model.ack(&format!("obj-{}", 5000 + round), 5000 + round);
        adopt_possibly_durable(&db, scope, &mut model, &failed);
    }
    assert!(faults.report("readers_recover_after_the_fault_clears_without_another_write") >= 10);
    check_clean(&db);
}

/// One failed sync in the middle of pipelined commits: every acknowledged command is in
/// the database, failed ones are whole-or-absent (see `adopt_possibly_durable`), a later commit works.
#[test]
fn a_single_failed_sync_fails_its_group_and_loses_nothing_acknowledged() {
    let (dir, faults, db, scope, mut model) = setup();
    for round in 0..5u64 {
        faults.fail_syncs.store(1, Ordering::SeqCst);
        let outcomes = submit_many(&db, scope, 1000 + round * 100, 30);
        let failed = outcomes.iter().filter(|(_, _, r)| r.is_err()).count();
        assert!(
            failed > 0,
            "round {round}: the injected sync failure did not fail any command"
        );
        // Replies in order: the failed group is contiguous, and later batches of the same
        // pipeline may still commit (the writer reopened); an RV regression refusal is not
        // possible here, as RVs increase.
        let mut failed = Vec::new();
        for (name, rv, r) in &outcomes {
            match r {
                Ok(()) => model.ack(name, *rv),
                Err(_) => failed.push((name.clone(), *rv)),
            }
        }
        // Make the writer reopen (if it has not yet) before comparing.
        apply_one(&db, scope, 1050 + round * 100).expect("commit after the fault");
        model.ack(&format!("obj-{}", 1050 + round * 100), 1050 + round * 100);
        adopt_possibly_durable(&db, scope, &mut model, &failed);
        check_clean(&db);
    }
    assert_eq!(
        faults.report("a_single_failed_sync_fails_its_group_and_loses_nothing_acknowledged"),
        5
    );
    apply_one(&db, scope, 9000).expect("commit after faults");
    model.ack("obj-9000", 9000);
    db.close().expect("close");
    let db = DurableStore::open(StoreConfig::new(dir.path().join("db.redb"))).expect("reopen");
    check_clean(&db);
    assert_eq!(state(&db, scope), (model.objs, model.rv));
}

/// A failed page write (EIO) aborts the commit with an I/O error; nothing is lost.
#[test]
fn failed_write_aborts_the_commit_and_the_writer_recovers() {
    let (dir, faults, db, scope, mut model) = setup();
    faults.fail_writes.store(1, Ordering::SeqCst);
    let outcomes = submit_many(&db, scope, 100, 10);
    assert!(
        outcomes.iter().any(|(_, _, r)| r.is_err()),
        "no command saw the failed write"
    );
    let mut failed = Vec::new();
    for (name, rv, r) in &outcomes {
        match r {
            Ok(()) => model.ack(name, *rv),
            Err(e) => {
                assert!(
                    e.to_string().contains("I/O") || e.to_string().contains("Input/output"),
                    "{e}"
                );
                failed.push((name.clone(), *rv));
            }
        }
    }
    assert_eq!(
        faults.report("failed_write_aborts_the_commit_and_the_writer_recovers"),
        1
    );
    apply_one(&db, scope, 500).expect("commit after the fault");
    model.ack("obj-500", 500);
    // A failed page write leaves no header pointing at it: nothing failed may appear.
    assert_eq!(adopt_possibly_durable(&db, scope, &mut model, &failed), 0);
    check_clean(&db);
    db.close().expect("close");
    let db = DurableStore::open(StoreConfig::new(dir.path().join("db.redb"))).expect("reopen");
    check_clean(&db);
    assert_eq!(state(&db, scope), (model.objs, model.rv));
}

/// A full disk: commits fail with an error that says "No space left on device"; once space
/// returns the writer commits again, and nothing acknowledged is lost.
#[test]
fn disk_full_gives_a_clear_error_and_recovers_when_space_returns() {
    let (dir, faults, db, scope, mut model) = setup();
    faults.disk_full.store(true, Ordering::SeqCst);
    for rv in 100..110 {
        let e = apply_one(&db, scope, rv).expect_err("commit on a full disk");
        let mut msg = e.to_string();
        let mut src = std::error::Error::source(&e);
        while let Some(s) = src {
            msg.push_str(&format!(" / {s}"));
            src = s.source();
        }
        assert!(msg.contains("No space left on device"), "unclear ENOSPC error: {msg}");
    }
    // While the disk stays full, the writer's reopen fails too (redb repairs an uncleanly
    // closed file on open, which writes), so read handles get `Closed` until space returns.
    match db.store(scope).list() {
        Ok(objs) => assert_eq!(objs.len(), model.objs.len()),
        Err(e) => assert!(matches!(e, StoreError::Closed { .. }), "{e}"),
    }
    assert!(faults.report("disk_full_gives_a_clear_error_and_recovers_when_space_returns") >= 10);
    faults.disk_full.store(false, Ordering::SeqCst);
    for rv in 200..210 {
        apply_one(&db, scope, rv).expect("commit once space returned");
        model.ack(&format!("obj-{rv}"), rv);
    }
    check_clean(&db);
    assert_eq!(adopt_possibly_durable(&db, scope, &mut model, &[]), 0);
    db.close().expect("close");
    let db = DurableStore::open(StoreConfig::new(dir.path().join("db.redb"))).expect("reopen");
    check_clean(&db);
    assert_eq!(state(&db, scope), (model.objs, model.rv));
}

/// The hook keeps the file checks: a file created through it is mode 0600, and a file that is
/// not a redb database is refused before the wrapper runs.
#[test]
fn backend_wrapper_keeps_mode_and_magic_checks() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let faults = Arc::new(Faults::default());
    let path = dir.path().join("db.redb");
    drop(DurableStore::open(config(&path, &faults)).expect("open"));
    assert_eq!(
        std::fs::metadata(&path).expect("meta").permissions().mode() & 0o777,
        0o600
    );
    let bogus = dir.path().join("bogus.redb");
    std::fs::write(&bogus, b"definitely not redb").expect("write");
    assert!(matches!(
        DurableStore::open(config(&bogus, &faults)),
        Err(StoreError::NotADatabase { .. })
    ));
    assert!(faults.writes.load(Ordering::SeqCst) > 0);
}

/// Fails the k-th write of a commit for every k from the first write to one past the last (a
/// later page, the header, and — once k runs past the commit — the writes of the writer's
/// reopen or of the next commit). Each time: the error is reported, the store is the
/// acknowledged state plus whole failed batches, `check` passes, and the next commit works.
#[test]
fn a_write_failing_at_any_point_of_a_commit_loses_nothing_acknowledged() {
    let (dir, faults, db, scope, mut model) = setup();
    // How many writes one commit of this size makes.
    let before = faults.writes.load(Ordering::SeqCst);
    apply_one(&db, scope, 100).expect("probe commit");
    model.ack("obj-100", 100);
    let per_commit = faults.writes.load(Ordering::SeqCst) - before;
    assert!(per_commit > 0, "the probe commit wrote nothing");
    let mut failed_commits = 0;
    let mut rv = 1000;
    for k in 0..=per_commit + 1 {
        faults.skip_writes.store(k, Ordering::SeqCst);
        faults.fail_writes.store(1, Ordering::SeqCst);
        rv += 1;
        let mut failed = Vec::new();
        match apply_one(&db, scope, rv) {
            Ok(()) => model.ack(&format!("obj-{rv}"), rv),
            Err(e) => {
                let msg = e.to_string();
                assert!(msg.contains("I/O") || msg.contains("Input/output"), "k={k}: {msg}");
                failed.push((format!("obj-{rv}"), rv));
                failed_commits += 1;
            }
        }
        // A fault not reached by this commit hits the next one (or the reopen) instead.
        rv += 1;
        let mut next_ok = false;
        for _ in 0..3 {
            match apply_one(&db, scope, rv) {
                Ok(()) => {
                    model.ack(&format!("obj-{rv}"), rv);
                    next_ok = true;
                    break;
                }
                Err(_) => {
                    failed.push((format!("obj-{rv}"), rv));
                    rv += 1;
                }
            }
        }
        assert!(next_ok, "k={k}: the writer did not recover");
        faults.fail_writes.store(0, Ordering::SeqCst);
        faults.skip_writes.store(0, Ordering::SeqCst);
        adopt_possibly_durable(&db, scope, &mut model, &failed);
        check_clean(&db);
    }
    assert!(failed_commits > 0, "no commit saw a failed write");
    let injected = faults.report("a_write_failing_at_any_point_of_a_commit_loses_nothing_acknowledged");
    assert!(
        injected >= per_commit,
        "{injected} faults for {per_commit} write points"
    );
    eprintln!("{per_commit} writes per commit, {failed_commits} commits failed");
    db.close().expect("close");
    let db = DurableStore::open(StoreConfig::new(dir.path().join("db.redb"))).expect("reopen");
    check_clean(&db);
    assert_eq!(state(&db, scope), (model.objs, model.rv));
}

/// The keys on which two maps differ, with both values.
fn diff(a: &BTreeMap<String, String>, b: &BTreeMap<String, String>) -> Vec<(String, Option<String>, Option<String>)> {
    let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    keys.into_iter()
        .filter(|k| a.get(*k) != b.get(*k))
        .map(|k| (k.clone(), a.get(k).cloned(), b.get(k).cloned()))
        .collect()
}

/// An informer with a durable handler against the simulated cluster, under churn, while syncs
/// fail and the disk fills up and frees again: it reports the errors, retries, and ends with
/// the server's objects; the handler missed nothing (duplicates allowed); `check` passes.
#[cfg(feature = "sim")]
#[test]
fn informer_survives_storage_faults() {
    survives_storage_faults(
        durable_informer::informer::HandlerOptions::durable("faults"),
        false,
        "informer_survives_storage_faults",
    );
}

/// The same with a volatile handler, which the informer's cache tells of each group before its
/// commit: when that commit fails, the handler is told of what stands instead (the restored
/// state, or a delete), then again of what the refetch brings; it misses nothing, and the
/// events it was told, replayed, give the server's objects.
#[cfg(feature = "sim")]
#[test]
fn a_volatile_handler_told_before_failed_commits_misses_nothing() {
    survives_storage_faults(
        durable_informer::informer::HandlerOptions::volatile(),
        true,
        "a_volatile_handler_told_before_failed_commits_misses_nothing",
    );
}

#[cfg(feature = "sim")]
fn survives_storage_faults(options: durable_informer::informer::HandlerOptions, volatile: bool, test: &str) {
    use durable_informer::informer::{handler_fn, Event, Informer};
    use durable_informer::reflector::{BackoffConfig, ReflectorConfig};
    use durable_informer::sim::{Sim, SimConfig};
    use durable_informer::source::KubeSource;
    use k8s_openapi::api::core::v1::ConfigMap;
    use serde_json::{json, Value};
    use std::sync::Mutex;
    use std::time::{Duration, Instant};
    use stream_check::{Ev, Kind, ListWindow, Opts};

    let sim = Arc::new(Sim::start(SimConfig::default().bookmark_interval(Duration::from_millis(200))).expect("sim"));
    let truth: Arc<Mutex<Vec<Ev>>> = Arc::default();
    let record = {
        let truth = truth.clone();
        move |obj: &Value, kind: Kind| {
            let key = format!(
                "{}/{}",
                obj.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or(""),
                obj.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("")
            );
            let rv = obj
                .pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
                .and_then(|s| s.parse().ok())
                .expect("numeric RV");
            truth.lock().expect("truth").push(Ev::new(key, rv, kind));
        }
    };
    let create = |i: u64| {
        let obj = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": format!("cm-{i}"), "namespace": "ns"}, "data": {"v": "0"}});
        record(&sim.create("configmaps", Some("ns"), obj).expect("create"), Kind::Add);
    };
    for i in 0..50 {
        create(i);
    }

    let dir = tempfile::tempdir().expect("tempdir");
    let faults = Arc::new(Faults::default());
    let db = DurableStore::open(config(&dir.path().join("db.redb"), &faults)).expect("open");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let delivered: Arc<Mutex<Vec<Ev>>> = Arc::default();
    let informer = rt.block_on(async {
        let client = sim.client().expect("client");
        let informer = Informer::<ConfigMap>::builder(&db, KubeSource::typed::<ConfigMap>(client, &sim.url()))
            .reflector_config(ReflectorConfig {
                page_size: 20,
                max_batch: 16,
                backoff: BackoffConfig {
                    initial: Duration::from_millis(10),
                    max: Duration::from_millis(100),
                    ..BackoffConfig::default()
                },
                ..ReflectorConfig::default()
            })
            .build()
            .await
            .expect("build");
        let sink = delivered.clone();
        informer.add_event_handler(
            handler_fn(move |ev: Event<ConfigMap>| -> Result<(), std::io::Error> {
                let (kind, obj) = match &ev {
                    Event::Add { object, .. } => (Kind::Add, object),
                    Event::Update { new, .. } => (Kind::Update, new),
                    Event::Delete { object, .. } => (Kind::Delete, object),
                };
                let m = &obj.metadata;
                let key = format!(
                    "{}/{}",
                    m.namespace.as_deref().unwrap_or(""),
                    m.name.as_deref().unwrap_or("")
                );
                let rv = m.resource_version.as_deref().and_then(|r| r.parse().ok()).unwrap_or(0);
                sink.lock()
                    .map_err(|_| std::io::Error::other("poisoned"))?
                    .push(Ev::new(key, rv, kind));
                Ok(())
            }),
            options,
        );
        informer.start();
        tokio::time::timeout(Duration::from_secs(30), informer.wait_for_sync())
            .await
            .expect("synced")
            .expect("cache synced");
        informer
    });
    let lo = sim.current_rv();

    // Churn while faults come and go.
    let mut live: Vec<u64> = (0..50).collect();
    let mut next = 50;
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let mut churn = |n: usize| {
        for _ in 0..n {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            match rng % 5 {
                0 => {
                    create(next);
                    live.push(next);
                    next += 1;
                }
                1 if live.len() > 10 => {
                    let i = live.swap_remove((rng >> 8) as usize % live.len());
                    record(
                        &sim.delete("configmaps", Some("ns"), &format!("cm-{i}"))
                            .expect("delete"),
                        Kind::Delete,
                    );
                }
                _ => {
                    let i = live[(rng >> 8) as usize % live.len()];
                    let got = sim
                        .patch(
                            "configmaps",
                            Some("ns"),
                            &format!("cm-{i}"),
                            &json!({"data": {"v": rng.to_string()}}),
                        )
                        .expect("patch");
                    record(&got, Kind::Update);
                }
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    };
    for phase in 0..12 {
        match phase % 3 {
            0 => faults.fail_syncs.store(3, Ordering::SeqCst),
            1 => faults.disk_full.store(true, Ordering::SeqCst),
            _ => {
                faults.skip_writes.store(phase, Ordering::SeqCst);
                faults.fail_writes.store(1, Ordering::SeqCst);
            }
        }
        churn(40);
        faults.disk_full.store(false, Ordering::SeqCst);
        churn(20);
    }
    faults.fail_syncs.store(0, Ordering::SeqCst);
    faults.fail_writes.store(0, Ordering::SeqCst);
    let injected = faults.report(test);
    assert!(injected >= 8, "only {injected} faults were injected");
    churn(20);
    let last = truth.lock().expect("truth").last().cloned().expect("events");

    // Caught up: the handler saw the last write, and the store equals the server's LIST.
    let deadline = Instant::now() + Duration::from_secs(60);
    let theirs: BTreeMap<String, String> = rt.block_on(async {
        let api: kube::Api<ConfigMap> = kube::Api::all(sim.client().expect("client"));
        api.list(&Default::default())
            .await
            .expect("list")
            .items
            .into_iter()
            .map(|c| {
                (
                    c.metadata.name.unwrap_or_default(),
                    c.metadata.resource_version.unwrap_or_default(),
                )
            })
            .collect()
    });
    let scope = informer.scope();
    loop {
        let seen = delivered
            .lock()
            .expect("delivered")
            .iter()
            .any(|e| e.key == last.key && e.rv == last.rv);
        if seen && state(&db, scope).0 == theirs {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not caught up within 60 s: delivered the last write: {seen}; status {:?}; store vs \
             server: {:?}; errors: {:?}",
            informer.status().borrow().clone(),
            diff(&state(&db, scope).0, &theirs),
            informer.errors()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let errors = informer.errors();
    assert!(!errors.is_empty(), "the storage faults were not reported");
    let status = informer.status().borrow().clone();
    // A commit reported failed may still be durable (see the module doc); the next batch is then
    // refused as an RV regression and a relist covers it: events during the faults may collapse.
    let windows = if status.relists > 0 {
        vec![ListWindow {
            lo,
            hi: sim.current_rv(),
        }]
    } else {
        Vec::new()
    };
    let delivered = delivered.lock().expect("delivered").clone();
    let truth = truth.lock().expect("truth").clone();
    stream_check::check_with_lists(
        &delivered,
        &truth,
        Opts {
            allow_duplicates: true,
            from_rv: 0,
            // Told before the commit: a failed one is taken back.
            allow_rollbacks: volatile,
        },
        &windows,
    )
    .unwrap_or_else(|e| panic!("delivered stream vs the server's log: {e}"));
    // Replayed, what the handler was told is the server's state.
    let mut replayed: BTreeMap<String, String> = BTreeMap::new();
    for e in &delivered {
        let name = e.key.trim_start_matches("ns/").to_owned();
        match e.kind {
            Kind::Delete => {
                replayed.remove(&name);
            }
            _ => {
                replayed.insert(name, e.rv.to_string());
            }
        }
    }
    assert_eq!(
        diff(&replayed, &theirs),
        Vec::new(),
        "the handler's replayed state vs the server's"
    );
    let dups = delivered.len() - stream_check::dedup(&delivered).len();
    eprintln!(
        "{test}: {} server events, {} delivered ({dups} repeated), {} errors reported, {} relists",
        truth.len(),
        delivered.len(),
        errors.len(),
        status.relists
    );
    rt.block_on(informer.shutdown()).expect("shutdown");
    drop(informer);
    check_clean(&db);
}

/// Batches with a deferred fsync are acknowledged before the disk has them. When the durable
/// commit that follows fails, some of them may be lost, but only whole and only from the end:
/// the store is at some committed state, the durable seq never passed what the file holds, and
/// a batch that requires a lost one is refused (a reflector then re-watches from the file).
#[test]
fn a_failed_deferred_fsync_loses_only_whole_trailing_batches_and_refuses_their_successors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let faults = Arc::new(Faults::default());
    let db = DurableStore::open(
        config(&dir.path().join("db.redb"), &faults).fsync_delay(Some(std::time::Duration::from_secs(3600))),
    )
    .expect("open");
    let w = db.writer();
    let scope = w
        .register_scope_blocking(&ScopeSpec::new("", "v1", "configmaps"))
        .expect("scope");
    for rv in 1..=5 {
        apply_one(&db, scope, rv).expect("durable base");
    }
    let base_seq = *w.durable().borrow();
    assert_eq!(base_seq, *w.committed().borrow(), "plain batches are fsynced at once");
    let mut prev = 5u64;
    for rv in 10..15u64 {
        w.apply_blocking(
            Batch::new(scope)
                .delta(DeltaKind::Added, object(&format!("obj-{rv}"), rv, 500))
                .rv(rv.to_string())
                .requires(prev.to_string())
                .deferred_fsync(),
        )
        .expect("a deferred batch is acknowledged once committed");
        prev = rv;
    }
    assert_eq!(*w.durable().borrow(), base_seq, "deferred batches are not on disk yet");
    assert!(*w.committed().borrow() > base_seq);
    faults.fail_syncs.store(1, Ordering::SeqCst);
    let flushed = w.flush_blocking();
    assert!(flushed.is_err(), "the durable commit failed: {flushed:?}");
    assert!(faults.report("a_failed_deferred_fsync") > 0);
    // The fault is gone; the next durable commit reopens the file first.
    w.flush_blocking().expect("flush after the fault");
    assert_eq!(*w.durable().borrow(), *w.committed().borrow());
    let (objs, rv) = state(&db, scope);
    let rv: u64 = rv.expect("an RV").parse().expect("numeric");
    // Whatever survived is the base plus the deferred batches up to `rv`, RV and data together.
    let mut want: Vec<String> = (1..=5).map(|i| format!("obj-{i}")).collect();
    want.extend((10..=rv).map(|i| format!("obj-{i}")));
    want.sort();
    assert_eq!(objs.keys().cloned().collect::<Vec<_>>(), want, "rv {rv}");
    assert!(rv == 5 || (10..15).contains(&rv), "rv {rv}");
    check_clean(&db);
    // The successor of the last deferred batch commits only if that batch survived.
    let next = w.apply_blocking(
        Batch::new(scope)
            .delta(DeltaKind::Added, object("obj-20", 20, 500))
            .rv("20")
            .requires("14")
            .deferred_fsync(),
    );
    match (rv, next) {
        (14, Ok(_)) => {}
        (14, Err(e)) => panic!("the predecessor is there: {e}"),
        (_, Ok(_)) => panic!("committed after a lost predecessor (rv {rv})"),
        (_, Err(e)) => assert!(matches!(e, StoreError::PredecessorMissing { .. }), "{e}"),
    }
}

/// The value of a counter of the database file `file` in the metrics exposition.
#[cfg(feature = "metrics")]
fn counter(name: &str, file: &str) -> u64 {
    let text = durable_informer::metrics::encode();
    let prefix = format!("{name}{{database=\"{file}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map_or(0, |v| v.trim().parse().expect("a counter's value"))
}

/// A failed write in a commit of the writer's own (here compaction's) used to be said only in
/// its log: it is counted now, and so is the reopen that follows.
#[cfg(feature = "metrics")]
#[test]
fn an_io_error_in_a_maintenance_commit_is_counted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let faults = Arc::new(Faults::default());
    let file = "maintenance-io.redb";
    let db = DurableStore::open(config(&dir.path().join(file), &faults).retention_entries(Some(1))).expect("open");
    let scope = db
        .writer()
        .register_scope_blocking(&ScopeSpec::new("", "v1", "configmaps"))
        .expect("scope");
    for rv in 1..=20 {
        apply_one(&db, scope, rv).expect("batch");
    }
    assert_eq!(counter("durable_informer_storage_errors_total", file), 0);
    faults.fail_writes.store(1, Ordering::SeqCst);
    let _ = db.writer().compact_blocking(Some(1));
    assert_eq!(
        faults.injected.load(Ordering::SeqCst),
        1,
        "the write failure was injected"
    );
    apply_one(&db, scope, 100).expect("a commit after the fault");
    assert_eq!(counter("durable_informer_storage_errors_total", file), 1);
    assert_eq!(counter("durable_informer_database_reopens_total", file), 1);
}

/// A store that does not fsync (`durable(false)`) keeps an earlier run's state through a reopen
/// after an I/O error. Oracle seed 281 found that it did not always: with the oracle's
/// restarts (the store dropped while its informer's last reads end), the reopen went back to
/// the last durable commit, before the earlier run and its durable handlers' cursors; the
/// writer now makes what it acknowledged durable as it closes. This directed test passes
/// without that change too (its close is a clean one); the oracle seed fails without it.
#[test]
fn a_store_that_does_not_fsync_keeps_the_previous_run_through_a_reopen_after_an_io_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let faults = Arc::new(Faults::default());
    let path = dir.path().join("db.redb");
    let db = DurableStore::open(config(&path, &faults).durable(false)).expect("open");
    let scope = db
        .writer()
        .register_scope_blocking(&ScopeSpec::new("", "v1", "configmaps"))
        .expect("scope");
    for rv in 1..=5 {
        apply_one(&db, scope, rv).expect("batch");
    }
    let before = state(&db, scope);
    db.close().expect("close");
    let db = DurableStore::open(config(&path, &faults).durable(false)).expect("reopen");
    apply_one(&db, scope, 6).expect("batch after the reopen");
    // A durable commit (a scope's registration) whose fsync fails: the writer reopens the file
    // after the I/O error.
    faults.fail_syncs.store(1, Ordering::SeqCst);
    let registered = db
        .writer()
        .register_scope_blocking(&ScopeSpec::new("", "v1", "secrets"));
    assert!(registered.is_err(), "the registration met the failed fsync");
    assert_eq!(faults.injected.load(Ordering::SeqCst), 1);
    apply_one(&db, scope, 7).expect("a commit after the fault");
    let (objs, rv) = state(&db, scope);
    for (name, version) in &before.0 {
        assert_eq!(
            objs.get(name),
            Some(version),
            "{name} of the earlier run survived the reopen"
        );
    }
    assert_eq!(rv.as_deref(), Some("7"));
}

/// An index made ready on a store that does not fsync: a reopen after an I/O error goes back to
/// the last durable commit, and the index must not go with it (its informer ensures it only
/// when built, so its queries would fail for ever with "no index named"; oracle seed 100).
#[test]
fn a_store_that_does_not_fsync_keeps_an_index_through_a_reopen_after_an_io_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let faults = Arc::new(Faults::default());
    let db = DurableStore::open(config(&dir.path().join("db.redb"), &faults).durable(false)).expect("open");
    let w = db.writer();
    let scope = w
        .register_scope_blocking(&ScopeSpec::new("", "v1", "configmaps"))
        .expect("scope");
    // More objects than one backfill transaction takes (1,000): the index is made ready by
    // the writer's own maintenance commit.
    let mut batch = Batch::new(scope).rv("1");
    for i in 0..1_100 {
        batch = batch.delta(DeltaKind::Added, object(&format!("o-{i}"), 1, 10));
    }
    db.writer().apply_blocking(batch).expect("batch");
    db.register_index(scope, Indexer::labels());
    w.ensure_index_blocking(scope, LABELS.into()).expect("index");
    // A durable commit on a full disk: what redb kept in its write buffer never reaches the
    // file, and the writer reopens it after the I/O error.
    faults.disk_full.store(true, Ordering::SeqCst);
    let registered = w.register_scope_blocking(&ScopeSpec::new("", "v1", "secrets"));
    assert!(registered.is_err(), "the registration met the full disk");
    faults.disk_full.store(false, Ordering::SeqCst);
    apply_one(&db, scope, 2).expect("a commit after the fault");
    assert_eq!(
        db.store(scope).index_status(LABELS).expect("status"),
        IndexStatus::Ready,
        "the index survived the reopen"
    );
}
