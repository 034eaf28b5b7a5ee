//! Log retention (count, age, automatic, bounded steps, cursors) and index backfill in bounded
//! transactions, as a user of the store sees them.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use durable_informer::object::{ObjectKey, RawObject, ScopeSpec};
use durable_informer::store::{
    Batch, DeltaKind, DurableStore, IndexStatus, Indexer, ScopeId, Seq, StoreConfig, StoreError, LABELS,
};
use redb::backends::FileBackend;
use redb::StorageBackend;

#[path = "common/backend.rs"]
mod backend;
use backend::{hooked, Hooks};

fn cm(name: &str, rv: u64, app: &str) -> RawObject {
    RawObject::from_json(
        format!(r#"{{"metadata":{{"name":"{name}","namespace":"ns","resourceVersion":"{rv}","labels":{{"app":"{app}"}}}},"data":{{"k":"v"}}}}"#)
            .into_bytes(),
    )
    .expect("object")
}

fn spec() -> ScopeSpec {
    ScopeSpec::new("", "v1", "configmaps")
}

/// Fsyncs that take this long: a slow disk, so that each transaction lasts long enough for
/// another thread to see the state between two of them.
#[derive(Debug)]
struct SlowSync(Duration);

impl Hooks for SlowSync {
    fn sync_data(&self, file: &FileBackend) -> Result<(), std::io::Error> {
        std::thread::sleep(self.0);
        file.sync_data()
    }
}

fn slow(config: StoreConfig, delay: Duration) -> StoreConfig {
    hooked(config, &Arc::new(SlowSync(delay)))
}

/// A clock the test moves by hand (unix milliseconds).
fn fake_clock(start_ms: u64) -> (Arc<AtomicU64>, durable_informer::store::Clock) {
    let now = Arc::new(AtomicU64::new(start_ms));
    let n = now.clone();
    let clock: durable_informer::store::Clock =
        Arc::new(move || UNIX_EPOCH + Duration::from_millis(n.load(Ordering::SeqCst)));
    (now, clock)
}

fn log_len(db: &DurableStore) -> u64 {
    match db.log().bounds().expect("bounds") {
        Some((first, last)) => last.0 - first.0 + 1,
        None => 0,
    }
}

fn fill(db: &DurableStore, scope: ScopeId, objects: u64, per_batch: u64) {
    let w = db.writer();
    let mut i = 0;
    while i < objects {
        let mut batch = Batch::new(scope);
        for j in i..(i + per_batch).min(objects) {
            batch = batch.delta(DeltaKind::Added, cm(&format!("o{j:05}"), j + 1, &format!("a{}", j % 7)));
        }
        w.apply_blocking(batch).expect("apply");
        i += per_batch;
    }
}

#[test]
fn a_store_without_retention_never_compacts_on_its_own() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = DurableStore::open(
        StoreConfig::new(dir.path().join("db.redb"))
            .durable(false)
            .retention_entries(None),
    )
    .expect("open");
    let scope = db.writer().register_scope_blocking(&spec()).expect("scope");
    fill(&db, scope, 5000, 250);
    db.writer().settle_blocking().expect("settle");
    assert_eq!(db.log().bounds().expect("bounds"), Some((Seq(1), Seq(5000))));
}

#[test]
fn automatic_retention_keeps_the_log_bounded_and_never_passes_a_cursor() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = DurableStore::open(
        StoreConfig::new(dir.path().join("db.redb"))
            .durable(false)
            .retention_entries(Some(1000)),
    )
    .expect("open");
    let w = db.writer();
    let scope = w.register_scope_blocking(&spec()).expect("scope");
    let mut max_len = 0;
    for b in 0..40u64 {
        let mut batch = Batch::new(scope);
        for j in 0..500 {
            batch = batch.delta(DeltaKind::Updated, cm(&format!("o{j}"), b * 1000 + j + 1, "x"));
        }
        w.apply_blocking(batch).expect("apply");
        max_len = max_len.max(log_len(&db));
    }
    // Slack: 1000 / 10; compaction after a group removes at least what it appended.
    assert!(max_len <= 1000 + 100 + 500, "the log grew to {max_len} entries");
    w.settle_blocking().expect("settle");
    let len = log_len(&db);
    assert!((1000..=1100).contains(&len), "{len} entries after settling");
    assert!(db.check().expect("check").is_ok());

    // A durable consumer that stopped holds everything after its cursor.
    let (first, _) = db.log().bounds().expect("bounds").expect("entries");
    w.set_cursor_blocking(scope, "slow-handler".into(), first)
        .expect("cursor");
    for b in 40..50u64 {
        let mut batch = Batch::new(scope);
        for j in 0..500 {
            batch = batch.delta(DeltaKind::Updated, cm(&format!("o{j}"), b * 1000 + j + 1, "x"));
        }
        w.apply_blocking(batch).expect("apply");
    }
    w.settle_blocking().expect("settle");
    let (held, last) = db.log().bounds().expect("bounds").expect("entries");
    assert_eq!(held, Seq(first.0 + 1), "compaction stops right after the cursor");
    // Once it moves on, the next commit lets retention catch up.
    w.set_cursor_blocking(scope, "slow-handler".into(), last)
        .expect("cursor");
    w.settle_blocking().expect("settle");
    assert_eq!(log_len(&db), 1000);
    assert!(db.check().expect("check").is_ok());
}

#[test]
fn a_large_backlog_is_compacted_in_bounded_transactions_readers_see_in_between() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("db.redb");
    {
        let db = DurableStore::open(StoreConfig::new(&path).durable(false).retention_entries(None)).expect("open");
        let scope = db.writer().register_scope_blocking(&spec()).expect("scope");
        fill(&db, scope, 3000, 1000);
        db.close().expect("close");
    }
    // Reopened with a retention the log is far beyond; steps of 100 entries on a slow disk.
    let db = DurableStore::open(
        slow(StoreConfig::new(&path), Duration::from_millis(5))
            .retention_entries(Some(10))
            .maintenance_steps(100, 1000),
    )
    .expect("open");
    let log = db.log();
    let seen = std::thread::scope(|s| {
        let reader = s.spawn(|| {
            let mut seen = BTreeSet::new();
            loop {
                let (first, _) = log.bounds().expect("bounds").expect("entries");
                seen.insert(first.0);
                if first.0 > 2990 {
                    return seen;
                }
            }
        });
        let report = db.writer().compact_blocking(None).expect("compact");
        assert_eq!(report.removed, 2990);
        assert_eq!(report.first_retained, Seq(2991));
        reader.join().expect("reader")
    });
    // Every state a reader saw is a step boundary: steps remove at most 100 entries.
    assert!(seen.len() >= 3, "readers saw only {seen:?}");
    for first in &seen {
        assert!(
            (first - 1) % 100 == 0 || *first == 2991,
            "{first} is not a step boundary"
        );
    }
    assert!(db.check().expect("check").is_ok());
}

#[test]
fn retention_by_age_removes_old_commits_below_the_cursors_even_while_idle() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (now, clock) = fake_clock(1_700_000_000_000);
    let hour = 3_600_000;
    let db = DurableStore::open(
        StoreConfig::new(dir.path().join("db.redb"))
            .durable(false)
            .retention_entries(None)
            .retention_age(Some(Duration::from_secs(3600)))
            .clock(clock),
    )
    .expect("open");
    let w = db.writer();
    let scope = w.register_scope_blocking(&spec()).expect("scope");
    let batch = |from: u64| {
        let mut b = Batch::new(scope);
        for j in 0..10 {
            b = b.delta(DeltaKind::Updated, cm(&format!("o{j}"), from + j, "x"));
        }
        b
    };
    w.apply_blocking(batch(100)).expect("apply"); // seqs 1..=10 at t0
    now.fetch_add(hour / 2, Ordering::SeqCst);
    w.apply_blocking(batch(200)).expect("apply"); // 11..=20 at t0 + 30 min
    now.fetch_add(hour / 2 + hour / 4, Ordering::SeqCst);
    w.settle_blocking().expect("settle"); // t0 + 75 min: the first commit is too old
    assert_eq!(db.log().bounds().expect("bounds"), Some((Seq(11), Seq(20))));
    assert!(db.check().expect("check").is_ok());

    // A durable cursor holds what it has not passed, however old.
    w.apply_blocking(batch(300)).expect("apply"); // 21..=30
    w.set_cursor_blocking(scope, "handler".into(), Seq(14)).expect("cursor");
    now.fetch_add(10 * hour, Ordering::SeqCst);
    w.settle_blocking().expect("settle");
    assert_eq!(db.log().bounds().expect("bounds"), Some((Seq(15), Seq(30))));
    assert!(db.check().expect("check").is_ok());

    // With nothing written, the writer still looks at the log's age now and then.
    w.set_cursor_blocking(scope, "handler".into(), Seq(30)).expect("cursor");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while db.log().bounds().expect("bounds").is_some() {
        assert!(std::time::Instant::now() < deadline, "idle age retention never ran");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Seqs go on after the log was emptied, and new commits are dated again.
    let c = w.apply_blocking(batch(400)).expect("apply");
    assert_eq!(c.seq, Seq(40));
    assert!(db.check().expect("check").is_ok());
}

#[test]
fn explicit_compact_applies_count_and_age_and_reports_what_it_did() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (now, clock) = fake_clock(1_700_000_000_000);
    let db = DurableStore::open(
        StoreConfig::new(dir.path().join("db.redb"))
            .durable(false)
            .retention_entries(None)
            .retention_age(Some(Duration::from_secs(60)))
            .clock(clock),
    )
    .expect("open");
    let w = db.writer();
    let scope = w.register_scope_blocking(&spec()).expect("scope");
    fill(&db, scope, 50, 10);
    // Nothing is old yet: only the count applies.
    let report = w.compact_blocking(Some(30)).expect("compact");
    assert_eq!((report.removed, report.first_retained), (20, Seq(21)));
    // Everything is old now.
    now.fetch_add(120_000, Ordering::SeqCst);
    let report = w.compact_blocking(Some(1000)).expect("compact");
    assert_eq!(report.removed, 30);
    assert_eq!(db.log().bounds().expect("bounds"), None);
    // Objects kept their bytes when their log entries went.
    assert_eq!(db.store(scope).list().expect("list").len(), 50);
    assert!(db.check().expect("check").is_ok());
}

/// The values the test index gives an object: its label.
fn app_of(o: &RawObject) -> String {
    format!("app={}", o.meta.labels.get("app").unwrap_or_default())
}

#[test]
fn a_backfill_of_5000_objects_spans_several_transactions_between_batches() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = DurableStore::open(slow(
        StoreConfig::new(dir.path().join("db.redb")),
        Duration::from_millis(15),
    ))
    .expect("open");
    let w = db.writer();
    let scope = w.register_scope_blocking(&spec()).expect("scope");
    fill(&db, scope, 5000, 1000);
    let keys = db.store(scope).list_keys().expect("keys");
    // Where a step of 1,000 objects ends.
    let boundaries: BTreeSet<ObjectKey> = keys.iter().skip(999).step_by(1000).cloned().collect();
    let mut model: BTreeMap<ObjectKey, String> = db
        .store(scope)
        .list()
        .expect("list")
        .into_iter()
        .map(|o| (o.key, format!("app={}", &o.meta.labels["app"])))
        .collect();

    db.register_index(scope, Indexer::labels());
    let store = db.store(scope);
    let (observed, during) = std::thread::scope(|s| {
        let ensure = s.spawn(|| w.ensure_index_blocking(scope, LABELS.into()));
        while store.index_status(LABELS).expect("status") == IndexStatus::Absent {
            std::thread::yield_now();
        }
        let mut observed = BTreeSet::new();
        let mut during = 0;
        let mut rv = 10_000;
        loop {
            let snap = store.snapshot().expect("snapshot");
            match snap.index_status(LABELS).expect("status") {
                IndexStatus::Backfilling { after } => {
                    // Never a partial answer.
                    assert!(matches!(
                        snap.by_index(LABELS, "app=a1"),
                        Err(StoreError::IndexNotReady { .. })
                    ));
                    assert!(matches!(
                        snap.list_index_values(LABELS),
                        Err(StoreError::IndexNotReady { .. })
                    ));
                    observed.insert(after);
                }
                IndexStatus::Ready => break,
                IndexStatus::Absent => panic!("the index vanished"),
            }
            // Ingest goes on: relabel one object behind the cursor and one ahead of it.
            let mut batch = Batch::new(scope);
            for name in [format!("o{:05}", rv % 10), format!("o{:05}", 4999 - rv % 10)] {
                rv += 1;
                let o = cm(&name, rv, &format!("n{}", rv % 3));
                model.insert(o.key(), app_of(&o));
                batch = batch.delta(DeltaKind::Updated, o);
            }
            w.apply_blocking(batch).expect("apply");
            during += 1;
        }
        ensure.join().expect("thread").expect("ensure_index");
        (observed, during)
    });
    assert!(during >= 1, "no batch committed while the backfill ran");
    let steps: Vec<&ObjectKey> = observed.iter().flatten().collect();
    assert!(steps.len() >= 2, "readers saw only {observed:?}");
    for key in steps {
        assert!(boundaries.contains(key), "{key} is not where a step of 1,000 ends");
    }
    // Exact at the end, including the objects written while it ran.
    let mut want: BTreeMap<String, Vec<ObjectKey>> = BTreeMap::new();
    for (k, v) in &model {
        want.entry(v.clone()).or_default().push(k.clone());
    }
    assert_eq!(
        store.list_index_values(LABELS).expect("values"),
        want.keys().cloned().collect::<Vec<_>>()
    );
    for (value, keys) in want {
        assert_eq!(store.index_keys(LABELS, &value).expect("index"), keys, "{value}");
    }
    let report = db.check().expect("check");
    assert!(report.is_ok(), "{:?}", report.problems);
}

#[test]
fn a_backfill_interrupted_by_close_resumes_where_it_stopped() {
    use futures::FutureExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("db.redb");
    // Steps of 10 objects, each on a slow disk: 20 steps take far longer than closing.
    let config = || slow(StoreConfig::new(&path), Duration::from_millis(15)).maintenance_steps(4096, 10);
    let db = DurableStore::open(config()).expect("open");
    let w = db.writer();
    let scope = w.register_scope_blocking(&spec()).expect("scope");
    fill(&db, scope, 200, 100);
    db.register_index(scope, Indexer::labels());
    // Sends the command without waiting for it.
    assert!(w.ensure_index(scope, LABELS.into()).now_or_never().is_none());
    db.close().expect("close");

    let db = DurableStore::open(config()).expect("reopen");
    let status = db.store(scope).index_status(LABELS).expect("status");
    assert!(
        matches!(&status, IndexStatus::Backfilling { after: Some(_) }),
        "progress was not persisted: {status:?}"
    );
    assert!(matches!(
        db.store(scope).by_index(LABELS, "app=a0"),
        Err(StoreError::IndexNotReady { .. })
    ));
    // Written before the function is registered again, behind the cursor: repaired on resume.
    db.writer()
        .apply_blocking(Batch::new(scope).delta(DeltaKind::Updated, cm("o00000", 9999, "moved")))
        .expect("apply");
    db.register_index(scope, Indexer::labels());
    db.writer().ensure_index_blocking(scope, LABELS.into()).expect("ensure");
    assert_eq!(
        db.store(scope).index_status(LABELS).expect("status"),
        IndexStatus::Ready
    );
    assert_eq!(
        db.store(scope).index_keys(LABELS, "app=moved").expect("index"),
        vec![ObjectKey::namespaced("ns", "o00000")]
    );
    assert_eq!(db.store(scope).index_keys(LABELS, "app=a0").expect("index").len(), 28);
    let report = db.check().expect("check");
    assert!(report.is_ok(), "{:?}", report.problems);
}

#[test]
fn commit_times_are_recorded_once_per_commit_and_trimmed_with_the_log() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("db.redb");
    let (now, clock) = fake_clock(1_000_000);
    {
        let db = DurableStore::open(
            StoreConfig::new(&path)
                .durable(false)
                .retention_entries(None)
                .clock(clock),
        )
        .expect("open");
        let scope = db.writer().register_scope_blocking(&spec()).expect("scope");
        for b in 0..5u64 {
            now.fetch_add(1000, Ordering::SeqCst);
            fill_from(&db, scope, b * 10, 10);
        }
        // Removes 1..=24: the row of the commit holding 25 moves to 25.
        db.writer().compact_blocking(Some(26)).expect("compact");
        db.close().expect("close");
    }
    let raw = redb::Database::open(&path).expect("raw open");
    let txn = redb::ReadableDatabase::begin_read(&raw).expect("read");
    let times = txn
        .open_table(redb::TableDefinition::<u64, u64>::new("commit_times"))
        .expect("table");
    let rows: Vec<(u64, u64)> = redb::ReadableTable::iter(&times)
        .expect("iter")
        .map(|r| r.map(|(k, v)| (k.value(), v.value())).expect("row"))
        .collect();
    assert_eq!(rows, vec![(25, 1_003_000), (31, 1_004_000), (41, 1_005_000)]);
}

fn fill_from(db: &DurableStore, scope: ScopeId, from: u64, n: u64) {
    let mut batch = Batch::new(scope);
    for j in from..from + n {
        batch = batch.delta(DeltaKind::Added, cm(&format!("o{j:05}"), j + 1, "x"));
    }
    db.writer().apply_blocking(batch).expect("apply");
}

#[test]
fn the_default_clock_dates_commits_with_the_wall_clock() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("db.redb");
    let before = SystemTime::now().duration_since(UNIX_EPOCH).expect("time").as_millis() as u64;
    {
        let db = DurableStore::open(StoreConfig::new(&path).durable(false)).expect("open");
        let scope = db.writer().register_scope_blocking(&spec()).expect("scope");
        fill_from(&db, scope, 0, 3);
        db.close().expect("close");
    }
    let raw = redb::Database::open(&path).expect("raw open");
    let txn = redb::ReadableDatabase::begin_read(&raw).expect("read");
    let times = txn
        .open_table(redb::TableDefinition::<u64, u64>::new("commit_times"))
        .expect("table");
    let t = times.get(1).expect("get").expect("row").value();
    assert!(t >= before && t < before + 60_000, "{t} vs {before}");
}
