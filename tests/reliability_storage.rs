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

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use durable_informer::store::{Batch, DeltaKind, DurableStore, RawObject, ScopeId, ScopeSpec, StoreConfig, StoreError};
use redb::backends::FileBackend;
use redb::{BackendError, StorageBackend};

/// What to fail, shared between the test and every backend the store opens.
#[derive(Debug, Default)]
struct Faults {
    /// Fail this many next `sync_data` calls.
    fail_syncs: AtomicU64,
    /// Fail this many next `write` calls.
    fail_writes: AtomicU64,
    /// While set, `write` and growing `set_len` fail with ENOSPC.
    disk_full: AtomicBool,
    /// How many calls failed.
    injected: AtomicU64,
    syncs: AtomicU64,
    writes: AtomicU64,
}

impl Faults {
    fn take(counter: &AtomicU64) -> bool {
        counter
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }

    fn enospc(&self) -> std::io::Error {
        self.injected.fetch_add(1, Ordering::SeqCst);
        std::io::Error::from_raw_os_error(28)
    }
}

#[derive(Debug)]
struct FaultyBackend {
    inner: FileBackend,
    faults: Arc<Faults>,
}

impl StorageBackend for FaultyBackend {
    fn len(&self) -> Result<u64, std::io::Error> {
        self.inner.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
        self.inner.read(offset, out)
    }
    fn set_len(&self, len: u64) -> Result<(), std::io::Error> {
        if self.faults.disk_full.load(Ordering::SeqCst) && len > self.inner.len()? {
            return Err(self.faults.enospc());
        }
        self.inner.set_len(len)
    }
    fn sync_data(&self) -> Result<(), std::io::Error> {
        self.faults.syncs.fetch_add(1, Ordering::SeqCst);
        if Faults::take(&self.faults.fail_syncs) {
            self.faults.injected.fetch_add(1, Ordering::SeqCst);
            return Err(std::io::Error::other("injected fsync failure"));
        }
        self.inner.sync_data()
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
        self.faults.writes.fetch_add(1, Ordering::SeqCst);
        if self.faults.disk_full.load(Ordering::SeqCst) {
            return Err(self.faults.enospc());
        }
        if Faults::take(&self.faults.fail_writes) {
            self.faults.injected.fetch_add(1, Ordering::SeqCst);
            return Err(std::io::Error::from_raw_os_error(5)); // EIO
        }
        self.inner.write(offset, data)
    }
    fn close(&self) -> Result<(), std::io::Error> {
        self.inner.close()
    }
    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.try_lock_range(start, end)
    }
    fn try_lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.try_lock_shared_range(start, end)
    }
    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_range(start, end)
    }
    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_shared_range(start, end)
    }
    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.unlock_range(start, end)
    }
    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.query_lock_range(start, end)
    }
}

fn config(path: &std::path::Path, faults: &Arc<Faults>) -> StoreConfig {
    let faults = faults.clone();
    StoreConfig::new(path)
        .cache_bytes(4 << 20)
        .backend_wrapper(Arc::new(move |inner| {
            Box::new(FaultyBackend {
                inner,
                faults: faults.clone(),
            })
        }))
}

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
    assert!(faults.injected.load(Ordering::SeqCst) > 0);
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
