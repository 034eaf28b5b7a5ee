//! The durable store against a simple `BTreeMap` model: random batches over several scopes,
//! with a label index and a custom index; after every commit (and after reopening) the objects,
//! index answers and log equal the model and `check` passes.

use std::collections::BTreeMap;

use durable_informer::store::{
    Batch, DeltaKind, DurableStore, Indexer, ObjectKey, RawObject, ScopeId, ScopeSpec, Seq, StoreConfig, LABELS,
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

#[derive(Default)]
struct Model {
    objects: Vec<BTreeMap<ObjectKey, (String, Vec<u8>)>>,
    log: Vec<LogLine>,
    rv: Vec<Option<String>>,
    first_retained: u64,
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

struct Harness {
    db: DurableStore,
    scopes: Vec<ScopeId>,
    model: Model,
    next_rv: u64,
}

impl Harness {
    fn open(path: &std::path::Path) -> (DurableStore, Vec<ScopeId>) {
        let db = DurableStore::open(StoreConfig::new(path).durable(false).retention_entries(None)).unwrap();
        let mut scopes = Vec::new();
        for ns in ["", "only"] {
            let mut spec = ScopeSpec::new("", "v1", "configmaps");
            if !ns.is_empty() {
                spec = spec.namespace(ns);
            }
            let id = db.writer().register_scope_blocking(&spec).unwrap();
            db.register_index(id, Indexer::labels());
            db.register_index(id, app_index());
            db.writer().ensure_index_blocking(id, LABELS.into()).unwrap();
            db.writer().ensure_index_blocking(id, "data-rv-parity".into()).unwrap();
            scopes.push(id);
        }
        (db, scopes)
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
                self.model.first_retained = self.model.first_retained.max(report.first_retained.0);
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
        let mut h = Harness { db, scopes, model: Model { objects: vec![BTreeMap::new(); 2], rv: vec![None; 2], ..Model::default() }, next_rv: 100 };
        for op in &ops {
            h.apply(op);
            h.verify();
        }
        let Harness { db, model, .. } = h;
        db.close().unwrap();
        let (db, scopes) = Harness::open(&path);
        verify(&db, &scopes, &model);
    }
}
