//! The periodic durable commit fsyncs in the background (`store::fence`): deferred batches go on
//! committing while it runs, nothing reaches the file until it finished, and a commit is
//! reported durable only after it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use durable_informer::object::{RawObject, ScopeSpec};
use durable_informer::store::{Batch, DeltaKind, DurableStore, ScopeId, Seq, StoreConfig, Writer};
use redb::backends::FileBackend;
use redb::StorageBackend;

#[path = "common/backend.rs"]
mod backend;
use backend::{hooked, Hooks};

/// The thread the store's background fsyncs run on (`store/fence.rs`).
const FSYNC_THREAD: &str = "durable-informer-fsync";

/// Holds background fsyncs while the gate is shut, and counts what reaches the file.
#[derive(Debug, Default)]
struct Gate {
    shut: Mutex<bool>,
    opened: Condvar,
    /// Fsyncs that entered and are waiting at the gate.
    waiting: AtomicU64,
    /// Writes and `set_len`s that reached the file.
    writes: AtomicU64,
    /// Fail the next fsync (after the gate).
    fail_next_sync: AtomicBool,
}

impl Gate {
    fn shut(&self) {
        *self.shut.lock().expect("gate") = true;
    }
    fn open(&self) {
        *self.shut.lock().expect("gate") = false;
        self.opened.notify_all();
    }
    /// Holds the fsync if the gate is shut and it runs in the background: other commits (a
    /// maintenance step, an explicit flush) fsync on the writer thread, which the fence makes
    /// wait for the held one anyway.
    fn pass(&self) {
        if std::thread::current().name() != Some(FSYNC_THREAD) {
            return;
        }
        let mut shut = self.shut.lock().expect("gate");
        if *shut {
            self.waiting.fetch_add(1, Ordering::SeqCst);
            while *shut {
                shut = self.opened.wait(shut).expect("gate");
            }
            self.waiting.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Counts what reaches the file, holds background fsyncs at the gate, fails one on demand.
impl Hooks for Gate {
    fn set_len(&self, file: &FileBackend, len: u64) -> Result<(), std::io::Error> {
        self.writes.fetch_add(1, Ordering::SeqCst);
        file.set_len(len)
    }
    fn sync_data(&self, file: &FileBackend) -> Result<(), std::io::Error> {
        self.pass();
        if self.fail_next_sync.swap(false, Ordering::SeqCst) {
            return Err(std::io::Error::other("injected fsync failure"));
        }
        file.sync_data()
    }
    fn write(&self, file: &FileBackend, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
        self.writes.fetch_add(1, Ordering::SeqCst);
        file.write(offset, data)
    }
}

/// Opens the gate when dropped: a failing test must not leave the writer held at it (the
/// store's drop would wait for it for ever). Declared after the store, so dropped first.
struct OpenOnDrop(Arc<Gate>);

impl Drop for OpenOnDrop {
    fn drop(&mut self) {
        self.0.open();
    }
}

fn open(dir: &tempfile::TempDir) -> (DurableStore, Arc<Gate>, ScopeId) {
    let gate = Arc::new(Gate::default());
    let config = hooked(
        StoreConfig::new(dir.path().join("db.redb")).fsync_delay(Some(Duration::from_millis(1))),
        &gate,
    );
    let db = DurableStore::open(config).expect("open");
    let scope = db
        .writer()
        .register_scope_blocking(&ScopeSpec::new("", "v1", "configmaps"))
        .expect("scope");
    (db, gate, scope)
}

fn cm(name: &str, rv: u64) -> RawObject {
    RawObject::from_json(
        format!(r#"{{"metadata":{{"name":"{name}","namespace":"ns","resourceVersion":"{rv}"}},"data":{{"k":"v"}}}}"#)
            .into_bytes(),
    )
    .expect("object")
}

/// A deferred batch at `rv` (requiring `rv - 1`, as a reflector's are).
fn deferred(scope: ScopeId, rv: u64) -> Batch {
    let batch = Batch::new(scope)
        .delta(DeltaKind::Added, cm(&format!("o{rv}"), rv))
        .rv(rv.to_string())
        .deferred_fsync();
    if rv > 1 {
        batch.requires((rv - 1).to_string())
    } else {
        batch
    }
}

fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Applies `batch`, failing the test if the writer has not acknowledged it within 5 s.
fn apply_within(w: &Writer, batch: Batch) -> Seq {
    let rx = w.submit(batch).expect("submit");
    let (tx, done) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(rx.blocking_recv());
    });
    match done.recv_timeout(Duration::from_secs(5)) {
        Ok(Ok(Ok(c))) => c.seq,
        Ok(other) => panic!("the batch failed: {other:?}"),
        Err(_) => panic!("the batch was not acknowledged within 5 s: the writer waits for an fsync"),
    }
}

#[test]
fn deferred_batches_commit_while_the_durable_commits_fsync_runs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (db, gate, scope) = open(&dir);
    let _open = OpenOnDrop(gate.clone());
    let w = db.writer();
    gate.shut();
    let first = apply_within(&w, deferred(scope, 1));
    // Within `fsync_delay` the durable commit starts, and its fsync is held at the gate.
    wait_until("the durable commit's fsync started", || {
        gate.waiting.load(Ordering::SeqCst) == 1
    });
    let writes = gate.writes.load(Ordering::SeqCst);

    // Decided, committed and shown while the fsync runs: before, the writer waited for it.
    let second = apply_within(&w, deferred(scope, 2));
    assert!(second > first);
    assert_eq!(*w.applied().borrow(), second);
    // Neither batch is reported durable before its fsync finished.
    assert!(*w.durable().borrow() < first, "durable before the fsync finished");
    // Nothing reached the file after the fsync was asked for.
    assert_eq!(gate.writes.load(Ordering::SeqCst), writes, "a write passed the fence");

    // An explicit flush needs the disk: it waits for the fsync in flight, then its own.
    let flusher = {
        let w = w.clone();
        std::thread::spawn(move || w.flush_blocking())
    };
    std::thread::sleep(Duration::from_millis(50));
    assert!(!flusher.is_finished(), "a flush returned while an fsync was held");
    assert_eq!(gate.writes.load(Ordering::SeqCst), writes, "a write passed the fence");
    gate.open();
    flusher.join().expect("flusher").expect("flush");
    assert!(*w.durable().borrow() >= second);
    let objects = db.store(scope).list_keys().expect("keys").len();
    assert_eq!(objects, 2);
}

#[test]
fn the_durable_position_moves_when_the_background_fsync_finishes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (db, gate, scope) = open(&dir);
    let _open = OpenOnDrop(gate.clone());
    let w = db.writer();
    gate.shut();
    let first = apply_within(&w, deferred(scope, 1));
    wait_until("the durable commit's fsync started", || {
        gate.waiting.load(Ordering::SeqCst) == 1
    });
    std::thread::sleep(Duration::from_millis(20));
    assert!(*w.durable().borrow() < first);
    gate.open();
    // No other command arrives: the writer is woken by the fsync itself.
    wait_until("the batch is durable", || *w.durable().borrow() >= first);
    drop(db);
}

#[test]
fn a_failed_background_fsync_takes_back_what_was_shown_meanwhile() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (db, gate, scope) = open(&dir);
    let _open = OpenOnDrop(gate.clone());
    let w = db.writer();
    // A first batch made durable, so the file holds rv 1.
    apply_within(&w, deferred(scope, 1));
    w.flush_blocking().expect("flush");
    let durable_before = *w.durable().borrow();

    gate.shut();
    gate.fail_next_sync.store(true, Ordering::SeqCst);
    let rollbacks = *w.rollbacks().borrow();
    let second = apply_within(&w, deferred(scope, 2));
    wait_until("the durable commit's fsync started", || {
        gate.waiting.load(Ordering::SeqCst) == 1
    });
    let third = apply_within(&w, deferred(scope, 3));
    assert!(third > second);
    gate.open();

    // The writer reopens the file. Whatever the page cache kept of the failed commit, the
    // third batch never reached the file: it is taken back, and never reported durable.
    wait_until("the rollback is reported", || w.rollbacks().borrow().0 > rollbacks.0);
    let (_, to) = *w.rollbacks().borrow();
    assert!(to < third && to >= durable_before, "rolled back to {to:?}");
    assert!(*w.durable().borrow() < third);
    // The writer goes on: a batch that requires what the file holds commits.
    let held = db.store(scope).list_keys().expect("keys").len() as u64;
    let next = apply_within(&w, deferred(scope, held + 1));
    w.flush_blocking().expect("flush");
    assert!(*w.durable().borrow() >= next);
}
