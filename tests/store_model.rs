//! The durable store against a simple `BTreeMap` model: random batches over several scopes,
//! with a label index and a custom index; after every commit (and after reopening) the objects,
//! index answers and log equal the model and `check` passes.
//!
//! The second property adds log retention by count and age (with a clock the test moves), a
//! durable cursor that holds compaction back, small compaction and backfill steps, and an index
//! added to a filled scope mid-sequence whose backfill runs between the later operations (and is
//! cut short by closing the store, then resumed).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use durable_informer::object::{ObjectKey, RawObject, ScopeSpec};
use durable_informer::store::{
    Batch, DeltaKind, DurableStore, IndexStatus, Indexer, ScopeId, Seq, StoreConfig, StoreError, LABELS,
};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Upsert {
        scope: usize,
        ns: u8,
        name: u8,
        app: u8,
    },
    Delete {
        scope: usize,
        ns: u8,
        name: u8,
    },
    Bookmark {
        scope: usize,
    },
    /// Relist: keep objects whose `keep` bit is set, change those whose `change` bit is set, add
    /// `add` new ones.
    Relist {
        scope: usize,
        keep: u64,
        change: u64,
        add: u8,
    },
    Compact {
        keep: u8,
    },
    /// Moves the clock forward.
    Tick {
        minutes: u8,
    },
    /// Sets the durable cursor `back` entries before the last one, or removes it.
    Cursor {
        back: Option<u8>,
    },
    /// Adds the `rv-mod3` index to a scope; the backfill runs while later operations go on.
    AddIndex {
        scope: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..2usize, 0..3u8, 0..6u8, 0..3u8).prop_map(|(scope, ns, name, app)| Op::Upsert { scope, ns, name, app }),
        3 => (0..2usize, 0..3u8, 0..6u8).prop_map(|(scope, ns, name)| Op::Delete { scope, ns, name }),
        1 => (0..2usize).prop_map(|scope| Op::Bookmark { scope }),
        1 => (0..2usize, any::<u64>(), any::<u64>(), 0..3u8).prop_map(|(scope, keep, change, add)| Op::Relist { scope, keep, change, add }),
        1 => (0..20u8).prop_map(|keep| Op::Compact { keep }),
    ]
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct LogLine {
    scope: ScopeId,
    kind: DeltaKind,
    key: ObjectKey,
    rv: String,
    object: Option<Vec<u8>>,
    old: Option<Vec<u8>>,
}

fn retention_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => op(),
        2 => (0..90u8).prop_map(|minutes| Op::Tick { minutes }),
        2 => proptest::option::of(0..12u8).prop_map(|back| Op::Cursor { back }),
        1 => (0..2usize).prop_map(|scope| Op::AddIndex { scope }),
    ]
}

/// Retention settings of a run.
#[derive(Debug, Clone, Copy, Default)]
struct Settings {
    entries: Option<u64>,
    age_minutes: Option<u64>,
    compact_step: usize,
    backfill_step: usize,
}

fn settings() -> impl Strategy<Value = Settings> {
    (
        proptest::option::of(0..25u64),
        proptest::option::of(1..120u64),
        1..6usize,
        1..5usize,
    )
        .prop_map(|(entries, age_minutes, compact_step, backfill_step)| Settings {
            entries,
            age_minutes,
            compact_step,
            backfill_step,
        })
}

#[derive(Default)]
struct Model {
    objects: Vec<BTreeMap<ObjectKey, (String, Vec<u8>)>>,
    log: Vec<LogLine>,
    /// Commit time of each log line (unix ms).
    times: Vec<u64>,
    rv: Vec<Option<String>>,
    /// The first seq still in the log (0 or 1: nothing removed yet).
    first_retained: u64,
    cursor: Option<u64>,
    now: u64,
    /// Scopes that have the `rv-mod3` index.
    rv_index: [bool; 2],
}

const MINUTE: u64 = 60_000;

impl Model {
    fn first(&self) -> u64 {
        self.first_retained.max(1)
    }

    fn last(&self) -> u64 {
        self.log.len() as u64
    }

    /// Dates the lines appended since `before` with the current time.
    fn date(&mut self) {
        let now = self.times.last().map_or(self.now, |t| (*t).max(self.now));
        self.times.resize(self.log.len(), now);
    }

    /// Removes entries below `target`, never at or past the cursor.
    fn compact_to(&mut self, target: u64) {
        let bound = self.cursor.map_or(u64::MAX, |c| c + 1);
        let new = target.min(bound).min(self.last() + 1);
        if new > self.first() {
            self.first_retained = new;
        }
    }

    /// The first seq not older than the age (last + 1 when all are).
    fn age_end(&self, s: &Settings) -> u64 {
        match s.age_minutes {
            None => 0,
            Some(m) => {
                let cutoff = self.now.saturating_sub(m * MINUTE);
                (self.first()..=self.last())
                    .find(|seq| self.times[*seq as usize - 1] >= cutoff)
                    .unwrap_or(self.last() + 1)
            }
        }
    }

    /// What the writer's automatic retention does after a commit.
    fn auto_retention(&mut self, s: &Settings) {
        let (first, last) = (self.first(), self.last());
        if first > last {
            return;
        }
        let len = last - first + 1;
        let count = match s.entries {
            Some(n) if len > n + (n / 10).min(s.compact_step as u64) => last - n + 1,
            _ => 0,
        };
        let target = count.max(self.age_end(s));
        self.compact_to(target);
    }

    /// An explicit `compact(Some(keep))`: the count without slack, and the age.
    fn explicit_compact(&mut self, keep: u64, s: &Settings) {
        let count = self.last().saturating_sub(keep) + 1;
        let target = count.max(self.age_end(s));
        self.compact_to(target);
    }
}

fn json(ns: &str, name: &str, rv: u64, app: u8) -> Vec<u8> {
    format!(
        r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"{name}","namespace":"{ns}","resourceVersion":"{rv}","labels":{{"app":"a{app}"}}}},"data":{{"rv":"{rv}"}}}}"#
    )
    .into_bytes()
}

fn app_index() -> Indexer {
    // A custom index over the JSON body, not only the metadata.
    Indexer::new("data-rv-parity", |_, json| {
        let v: serde_json::Value = serde_json::from_slice(json).unwrap_or_default();
        let rv: u64 = v["data"]["rv"].as_str().and_then(|s| s.parse().ok()).unwrap_or(0);
        vec![if rv.is_multiple_of(2) {
            "even".into()
        } else {
            "odd".into()
        }]
    })
}

/// Added mid-sequence: changes with every new version of an object.
fn rv_index() -> Indexer {
    Indexer::new("rv-mod3", |meta, _| {
        let rv = meta.resource_version.as_u64().unwrap_or(0);
        vec![(rv % 3).to_string()]
    })
}

struct Harness {
    db: DurableStore,
    scopes: Vec<ScopeId>,
    model: Model,
    next_rv: u64,
    settings: Settings,
    clock: Arc<AtomicU64>,
    /// Threads waiting in `ensure_index` for a backfill.
    ensures: Vec<std::thread::JoinHandle<Result<(), StoreError>>>,
}

impl Harness {
    fn open(path: &std::path::Path) -> (DurableStore, Vec<ScopeId>) {
        Self::open_with(path, None, [false; 2])
    }

    /// Opens with retention `settings` (none: no retention) on the clock `clock`, and registers
    /// the `rv-mod3` index on the scopes that have it.
    fn open_with(
        path: &std::path::Path,
        retention: Option<(Settings, Arc<AtomicU64>)>,
        rv_index_on: [bool; 2],
    ) -> (DurableStore, Vec<ScopeId>) {
        let mut config = StoreConfig::new(path).durable(false).retention_entries(None);
        if let Some((s, clock)) = retention {
            config = config
                .retention_entries(s.entries)
                .retention_age(s.age_minutes.map(|m| Duration::from_secs(m * 60)))
                .maintenance_steps(s.compact_step, s.backfill_step)
                .clock(Arc::new(move || {
                    UNIX_EPOCH + Duration::from_millis(clock.load(Ordering::SeqCst))
                }));
        }
        let db = DurableStore::open(config).unwrap();
        let mut scopes = Vec::new();
        for (i, ns) in ["", "only"].into_iter().enumerate() {
            let mut spec = ScopeSpec::new("", "v1", "configmaps");
            if !ns.is_empty() {
                spec = spec.namespace(ns);
            }
            let id = db.writer().register_scope_blocking(&spec).unwrap();
            db.register_index(id, Indexer::labels());
            db.register_index(id, app_index());
            db.writer().ensure_index_blocking(id, LABELS.into()).unwrap();
            db.writer().ensure_index_blocking(id, "data-rv-parity".into()).unwrap();
            if rv_index_on[i] {
                db.register_index(id, rv_index());
                db.writer().ensure_index_blocking(id, "rv-mod3".into()).unwrap();
            }
            scopes.push(id);
        }
        (db, scopes)
    }

    /// Applies `op` to the store and the model, then lets automatic retention finish.
    fn step(&mut self, op: &Op) {
        self.apply(op);
        self.model.date();
        self.model.auto_retention(&self.settings.clone());
        self.db.writer().settle_blocking().unwrap();
    }

    fn apply(&mut self, op: &Op) {
        let w = self.db.writer();
        match *op {
            Op::Upsert { scope, ns, name, app } => {
                self.next_rv += 1;
                let rv = self.next_rv;
                let (ns, name) = (format!("ns{ns}"), format!("o{name}"));
                let bytes = json(&ns, &name, rv, app);
                let key = ObjectKey::namespaced(&ns, &name);
                let old = self.model.objects[scope].insert(key.clone(), (rv.to_string(), bytes.clone()));
                self.model.log.push(LogLine {
                    scope: self.scopes[scope],
                    kind: if old.is_some() {
                        DeltaKind::Updated
                    } else {
                        DeltaKind::Added
                    },
                    key,
                    rv: rv.to_string(),
                    object: Some(bytes.clone()),
                    old: old.map(|o| o.1),
                });
                self.model.rv[scope] = Some(rv.to_string());
                let obj = RawObject::from_json(bytes).unwrap();
                w.apply_blocking(
                    Batch::new(self.scopes[scope])
                        .delta(DeltaKind::Updated, obj)
                        .rv(rv.to_string()),
                )
                .unwrap();
            }
            Op::Delete { scope, ns, name } => {
                self.next_rv += 1;
                let rv = self.next_rv;
                let (ns, name) = (format!("ns{ns}"), format!("o{name}"));
                let bytes = json(&ns, &name, rv, 0);
                let key = ObjectKey::namespaced(&ns, &name);
                if let Some(old) = self.model.objects[scope].remove(&key) {
                    self.model.log.push(LogLine {
                        scope: self.scopes[scope],
                        kind: DeltaKind::Deleted,
                        key,
                        rv: rv.to_string(),
                        object: Some(bytes.clone()),
                        old: Some(old.1),
                    });
                }
                self.model.rv[scope] = Some(rv.to_string());
                let obj = RawObject::from_json(bytes).unwrap();
                w.apply_blocking(
                    Batch::new(self.scopes[scope])
                        .delta(DeltaKind::Deleted, obj)
                        .rv(rv.to_string()),
                )
                .unwrap();
            }
            Op::Bookmark { scope } => {
                self.next_rv += 1;
                self.model.rv[scope] = Some(self.next_rv.to_string());
                w.apply_blocking(Batch::new(self.scopes[scope]).rv(self.next_rv.to_string()))
                    .unwrap();
            }
            Op::Relist {
                scope,
                keep,
                change,
                add,
            } => {
                let sid = self.scopes[scope];
                let current = self.model.objects[scope].clone();
                let mut target = BTreeMap::new();
                for (i, (key, (rv, bytes))) in current.iter().enumerate() {
                    let bit = 1u64 << (i % 64);
                    if keep & bit == 0 {
                        continue;
                    }
                    if change & bit != 0 {
                        self.next_rv += 1;
                        let b = json(key.namespace_str(), &key.name, self.next_rv, 1);
                        target.insert(key.clone(), (self.next_rv.to_string(), b));
                    } else {
                        target.insert(key.clone(), (rv.clone(), bytes.clone()));
                    }
                }
                for a in 0..add {
                    self.next_rv += 1;
                    let name = format!("new{}", self.next_rv);
                    let b = json("ns9", &name, self.next_rv, a);
                    target.insert(ObjectKey::namespaced("ns9", &name), (self.next_rv.to_string(), b));
                }
                // Expected log: upserts in key order, then deletes in key order.
                for (key, (rv, bytes)) in &target {
                    match current.get(key) {
                        Some((old_rv, _)) if old_rv == rv => {}
                        old => self.model.log.push(LogLine {
                            scope: sid,
                            kind: if old.is_some() {
                                DeltaKind::Updated
                            } else {
                                DeltaKind::Added
                            },
                            key: key.clone(),
                            rv: rv.clone(),
                            object: Some(bytes.clone()),
                            old: old.map(|o| o.1.clone()),
                        }),
                    }
                }
                for (key, (rv, bytes)) in &current {
                    if !target.contains_key(key) {
                        self.model.log.push(LogLine {
                            scope: sid,
                            kind: DeltaKind::Deleted,
                            key: key.clone(),
                            rv: rv.clone(),
                            object: None,
                            old: Some(bytes.clone()),
                        });
                    }
                }
                self.next_rv += 1;
                let list_rv = self.next_rv.to_string();
                // Stage in pages of 2, in reverse order: order of pages must not matter.
                let objs: Vec<RawObject> = target
                    .values()
                    .rev()
                    .map(|(_, b)| RawObject::from_json(b.clone()).unwrap())
                    .collect();
                for page in objs.chunks(2) {
                    w.stage_relist_blocking(sid, page.to_vec()).unwrap();
                }
                w.finish_relist_blocking(sid, list_rv.as_str().into(), "test").unwrap();
                self.model.objects[scope] = target;
                self.model.rv[scope] = Some(list_rv);
            }
            Op::Compact { keep } => {
                let report = w.compact_blocking(Some(u64::from(keep))).unwrap();
                let before = self.model.first();
                self.model.explicit_compact(u64::from(keep), &self.settings.clone());
                assert_eq!(report.removed, self.model.first() - before, "entries compact removed");
                if self.model.first() <= self.model.last() {
                    assert_eq!(report.first_retained, Seq(self.model.first()));
                }
            }
            Op::Tick { minutes } => {
                self.model.now += u64::from(minutes) * MINUTE;
                self.clock.store(self.model.now, Ordering::SeqCst);
            }
            Op::Cursor { back } => match back {
                Some(back) => {
                    let seq = self.model.last().saturating_sub(u64::from(back));
                    self.model.cursor = Some(seq);
                    w.set_cursor_blocking(self.scopes[0], "model".into(), Seq(seq)).unwrap();
                }
                None => {
                    self.model.cursor = None;
                    w.delete_cursor_blocking(self.scopes[0], "model".into()).unwrap();
                }
            },
            Op::AddIndex { scope } => {
                let sid = self.scopes[scope];
                self.model.rv_index[scope] = true;
                self.db.register_index(sid, rv_index());
                self.ensures.push(std::thread::spawn(move || {
                    w.ensure_index_blocking(sid, "rv-mod3".into())
                }));
            }
        }
    }

    fn verify(&self) {
        verify(&self.db, &self.scopes, &self.model);
    }
}

fn verify(db: &DurableStore, scopes: &[ScopeId], model: &Model) {
    for (i, sid) in scopes.iter().enumerate() {
        let store = db.store(*sid);
        let snap = store.snapshot().unwrap();
        let got: Vec<(ObjectKey, String, Vec<u8>)> = snap
            .list()
            .unwrap()
            .into_iter()
            .map(|o| (o.key, o.meta.resource_version.0, o.bytes.to_vec()))
            .collect();
        let want: Vec<(ObjectKey, String, Vec<u8>)> = model.objects[i]
            .iter()
            .map(|(k, (rv, b))| (k.clone(), rv.clone(), b.clone()))
            .collect();
        assert_eq!(got, want, "objects of scope {i}");
        // Paging through the keys alone, as the controller's initial adds do.
        let mut keys: Vec<ObjectKey> = Vec::new();
        loop {
            let page = snap.list_keys_after(keys.last(), 2).unwrap();
            assert!(page.len() <= 2);
            if page.is_empty() {
                break;
            }
            keys.extend(page);
        }
        let want_keys: Vec<ObjectKey> = model.objects[i].keys().cloned().collect();
        assert_eq!(keys, want_keys, "keys of scope {i}, paged");
        // The headers-only log read: the same entries without their states.
        let log = db.log();
        let full = log.read_scope_after_contiguous(Seq(0), usize::MAX, *sid);
        let heads = log.read_scope_keys_after_contiguous(Seq(0), usize::MAX, *sid);
        match (full, heads) {
            (Ok((full, f_at)), Ok((heads, h_at))) => {
                assert_eq!(f_at, h_at);
                let strip = |r: &durable_informer::store::LogRecord| (r.seq, r.kind, r.key.clone(), r.rv.clone());
                assert_eq!(
                    full.iter().map(strip).collect::<Vec<_>>(),
                    heads.iter().map(strip).collect::<Vec<_>>()
                );
                assert!(heads.iter().all(|r| r.object.is_none() && r.old.is_none()));
            }
            // Compacted from the start: both say so.
            (Err(StoreError::LogCompacted { .. }), Err(StoreError::LogCompacted { .. })) => {}
            (f, h) => panic!(
                "full read {:?}, headers read {:?}",
                f.map(|r| r.0.len()),
                h.map(|r| r.0.len())
            ),
        }
        assert_eq!(snap.record().unwrap().rv.map(|r| r.0), model.rv[i], "rv of scope {i}");
        for app in 0..3 {
            let v = format!("app=a{app}");
            let got = snap.index_keys(LABELS, &v).unwrap();
            let want: Vec<ObjectKey> = model.objects[i]
                .iter()
                .filter(|(_, (_, b))| String::from_utf8_lossy(b).contains(&format!("\"app\":\"a{app}\"")))
                .map(|(k, _)| k.clone())
                .collect();
            assert_eq!(got, want, "label index app=a{app}");
        }
        if model.rv_index[i] {
            match snap.index_status("rv-mod3").unwrap() {
                IndexStatus::Ready => {
                    for v in 0..3u64 {
                        let got = snap.index_keys("rv-mod3", &v.to_string()).unwrap();
                        let want: Vec<ObjectKey> = model.objects[i]
                            .iter()
                            .filter(|(_, (rv, _))| rv.parse::<u64>().unwrap() % 3 == v)
                            .map(|(k, _)| k.clone())
                            .collect();
                        assert_eq!(got, want, "rv-mod3 index = {v}");
                    }
                }
                // Never a partial answer while the backfill runs.
                IndexStatus::Backfilling { .. } => assert!(matches!(
                    snap.index_keys("rv-mod3", "0"),
                    Err(StoreError::IndexNotReady { .. })
                )),
                // The thread has not sent its command yet.
                IndexStatus::Absent => {}
            }
        }
        for ns in 0..3 {
            let ns = format!("ns{ns}");
            let got: Vec<ObjectKey> = snap.list_namespace(&ns).unwrap().into_iter().map(|o| o.key).collect();
            let want: Vec<ObjectKey> = model.objects[i]
                .keys()
                .filter(|k| k.namespace.as_deref() == Some(&ns))
                .cloned()
                .collect();
            assert_eq!(got, want);
        }
    }
    let retained: Vec<LogLine> = db
        .log()
        .read_after(Seq(0), usize::MAX, None)
        .unwrap()
        .into_iter()
        .map(|r| LogLine {
            scope: r.scope,
            kind: r.kind,
            key: r.key,
            rv: r.rv.0,
            object: r.object.map(|b| b.to_vec()),
            old: r.old.map(|b| b.to_vec()),
        })
        .collect();
    let skip = model.first_retained.saturating_sub(1) as usize;
    assert_eq!(retained, model.log[skip.min(model.log.len())..].to_vec(), "log");
    let report = db.check().unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

    #[test]
    fn store_equals_model_after_every_commit_and_after_reopen(ops in proptest::collection::vec(op(), 1..40)) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.redb");
        let (db, scopes) = Harness::open(&path);
        let mut h = Harness {
            db,
            scopes,
            model: Model { objects: vec![BTreeMap::new(); 2], rv: vec![None; 2], ..Model::default() },
            next_rv: 100,
            settings: Settings::default(),
            clock: Arc::default(),
            ensures: Vec::new(),
        };
        for op in &ops {
            h.step(op);
            h.verify();
        }
        let Harness { db, model, .. } = h;
        db.close().unwrap();
        let (db, scopes) = Harness::open(&path);
        verify(&db, &scopes, &model);
    }

    #[test]
    fn retention_and_backfill_follow_the_model(
        settings in settings(),
        ops in proptest::collection::vec(retention_op(), 1..50),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.redb");
        let start = 1_700_000_000_000;
        let clock = Arc::new(AtomicU64::new(start));
        let (db, scopes) = Harness::open_with(&path, Some((settings, clock.clone())), [false; 2]);
        let mut h = Harness {
            db,
            scopes,
            model: Model { objects: vec![BTreeMap::new(); 2], rv: vec![None; 2], now: start, ..Model::default() },
            next_rv: 100,
            settings,
            clock: clock.clone(),
            ensures: Vec::new(),
        };
        for op in &ops {
            h.step(op);
            h.verify();
        }
        // Closing may cut a backfill short (or come before it was asked for): its callers hear
        // so, and it resumes on reopen.
        let Harness { db, model, ensures, .. } = h;
        db.close().unwrap();
        for e in ensures {
            match e.join().unwrap() {
                Ok(()) | Err(StoreError::Aborted(_) | StoreError::WriterGone) => {}
                Err(other) => panic!("ensure_index failed: {other}"),
            }
        }
        let (db, scopes) = Harness::open_with(&path, Some((settings, clock)), model.rv_index);
        db.writer().settle_blocking().unwrap();
        verify(&db, &scopes, &model);
    }
}
