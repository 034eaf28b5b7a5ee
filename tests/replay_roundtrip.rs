//! Determinism (two replays of one recording give byte-identical object and log tables), the
//! record → replay → export round trip through the recorder (with rotation), an informer with
//! handlers driven by a recording, and time travel over the replayed log.

mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use common::fake::Fake;
use durable_informer::informer::{handler_fn, Event, HandlerOptions, Informer};
use durable_informer::object::{ObjectKey, ScopeSpec};
use durable_informer::replay::{
    export_log, history, replay_into, state_at, Recorder, RecorderConfig, ReplayError, ReplayOptions, ReplaySource,
    Speed,
};
use durable_informer::store::{DeltaKind, DurableStore, Seq, StoreConfig};
use k8s_openapi::api::core::v1::ConfigMap;

/// A ConfigMap watch line; object `i` is `ns-{i % 7}/cm-{i}`.
fn cm(kind: &str, i: u64, rv: u64, value: u64) -> String {
    format!(
        r#"{{"type":"{kind}","object":{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"cm-{i}","namespace":"ns-{}","resourceVersion":"{rv}","labels":{{"app":"x{}"}}}},"data":{{"v":"{value}"}}}}}}"#,
        i % 7,
        value % 3
    )
}

/// A deterministic workload: `objects` ADDEDs, then `events` changes over them.
fn workload(path: &Path, objects: u64, events: u64) {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut rv = 1000;
    let mut live: BTreeMap<u64, bool> = BTreeMap::new();
    for i in 0..objects {
        rv += 1;
        writeln!(f, "{}", cm("ADDED", i, rv, i)).unwrap();
        live.insert(i, true);
    }
    let mut x: u64 = 7;
    for _ in 0..events {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let i = (x >> 33) % (objects * 2);
        rv += 1;
        let kind = match (live.get(&i).copied().unwrap_or(false), (x >> 20) % 4) {
            (true, 0) => "DELETED",
            (true, _) => "MODIFIED",
            (false, _) => "ADDED",
        };
        live.insert(i, kind != "DELETED");
        writeln!(f, "{}", cm(kind, i, rv, x % 1000)).unwrap();
    }
}

use common::tables::{tables, Rows};

async fn replay_file(recording: &Path, db_path: &Path) {
    let db = DurableStore::open(StoreConfig::new(db_path).durable(false)).unwrap();
    replay_into(&db, ReplaySource::open(recording, ReplayOptions::default()).unwrap())
        .await
        .unwrap();
    db.close().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replays_of_one_recording_give_byte_identical_tables() {
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("rec.jsonl");
    workload(&rec, 2_000, 20_000);
    let (a, b) = (dir.path().join("a.redb"), dir.path().join("b.redb"));
    replay_file(&rec, &a).await;
    replay_file(&rec, &b).await;
    let (ta, tb) = (tables(&a), tables(&b));
    assert!(ta.1.len() > 20_000, "log has {} rows", ta.1.len());
    assert!(ta.0 == tb.0, "object tables differ");
    assert!(ta.1 == tb.1, "logs differ");
}

/// Drops the `"receivedAt"` field the recorder appends.
fn without_received_at(line: &[u8]) -> Vec<u8> {
    let text = std::str::from_utf8(line).unwrap();
    match text.rfind(r#","receivedAt":"#) {
        Some(at) => format!("{}}}", &text[..at]).into_bytes(),
        None => line.to_vec(),
    }
}

fn lines_of(files: &[PathBuf]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for f in files {
        let bytes = std::fs::read(f).unwrap();
        out.extend(
            bytes
                .split(|b| *b == b'\n')
                .filter(|l| !l.is_empty())
                .map(<[u8]>::to_vec),
        );
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_replay_export_gives_back_the_recorded_events() {
    let fake = Fake::new();
    for i in 0..20 {
        fake.upsert(&format!("cm-{i}"), "v0");
    }
    let dir = tempfile::tempdir().unwrap();
    let recorder = Recorder::new(
        fake.clone(),
        RecorderConfig::new(dir.path().join("rec.jsonl")).rotate_bytes(4096),
    );
    let mut progress = recorder.progress();
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(recorder.run(stop_rx));
    progress.wait_for(|p| !p.last_rv.is_empty()).await.unwrap();
    for i in 0..30 {
        fake.upsert(&format!("cm-{}", i % 25), &format!("v{i}"));
        if i % 4 == 0 {
            fake.delete(&format!("cm-{}", i % 7));
        }
    }
    fake.bookmark();
    let target = fake.current_rv().to_string();
    progress.wait_for(|p| p.last_rv.as_str() == target).await.unwrap();
    stop.send(true).unwrap();
    let report = task.await.unwrap().unwrap();
    assert!(report.files.len() > 1, "rotated into {:?}", report.files);
    assert!(report.files[1].ends_with("rec.1.jsonl"));

    let db = DurableStore::open(StoreConfig::new(dir.path().join("db.redb")).durable(false)).unwrap();
    let source = ReplaySource::open_all(report.files.clone(), ReplayOptions::default()).unwrap();
    let replayed = replay_into(&db, source).await.unwrap();
    assert_eq!(replayed.last_rv.as_str(), target);
    let (scope, _) = db.scopes().unwrap()[0].clone();
    let stored: BTreeMap<String, u64> = db
        .store(scope)
        .list()
        .unwrap()
        .into_iter()
        .map(|o| (o.key.to_string(), o.meta.resource_version.as_u64().unwrap()))
        .collect();
    assert_eq!(stored, fake.objects());

    let mut out = Vec::new();
    export_log(&db, Some(scope), &mut out).unwrap();
    let exported: Vec<Vec<u8>> = out
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(<[u8]>::to_vec)
        .collect();
    let recorded: Vec<Vec<u8>> = lines_of(&report.files)
        .iter()
        .filter(|l| !l.starts_with(br#"{"type":"BOOKMARK""#))
        .map(|l| without_received_at(l))
        .collect();
    assert_eq!(exported.len(), recorded.len());
    assert!(exported == recorded, "export differs from the recording");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_informer_with_handlers_is_driven_by_a_recording() {
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("rec.jsonl");
    std::fs::write(
        &rec,
        [
            cm("ADDED", 1, 10, 1),
            cm("ADDED", 2, 11, 2),
            cm("MODIFIED", 1, 12, 3),
            cm("DELETED", 2, 13, 4),
        ]
        .join("\n"),
    )
    .unwrap();
    let db = DurableStore::open(StoreConfig::new(dir.path().join("db.redb")).durable(false)).unwrap();
    let source = ReplaySource::open(&rec, ReplayOptions::default()).unwrap();
    let handle = source.handle();
    let informer = Informer::<ConfigMap>::builder(&db, source).build().await.unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s2 = seen.clone();
    let reg = informer.add_event_handler(
        handler_fn(move |ev: Event<ConfigMap>| -> Result<(), std::convert::Infallible> {
            let name = |c: &ConfigMap| c.metadata.name.clone().unwrap_or_default();
            s2.lock().unwrap().push(match &ev {
                Event::Add { object, .. } => format!("add {}", name(object)),
                Event::Update { new, .. } => format!("update {}", name(new)),
                Event::Delete { object, .. } => format!("delete {}", name(object)),
            });
            Ok(())
        }),
        HandlerOptions::durable("test"),
    );
    // A durable handler without a cursor is first told what is on disk when its task gets to
    // it: started late, it would see a snapshot of a later state (`add cm-1` alone) instead of
    // each change. Its cursor is persisted once that first view (of the empty scope) is told.
    let (log, scope) = (db.log(), informer.scope());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while log.cursor(scope, "test").unwrap().is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "the durable handler did not take its first view within 30 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    informer.start();
    let report = handle.wait_applied(informer.status()).await.unwrap();
    assert_eq!(report.last_rv.as_str(), "13");
    // `shutdown` lets the handler catch up with every commit before stopping it.
    informer.shutdown().await.unwrap();
    drop(reg);
    assert_eq!(
        *seen.lock().unwrap(),
        ["add cm-1", "add cm-2", "update cm-1", "delete cm-2"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn time_travel_gives_past_states_and_key_histories() {
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("rec.jsonl");
    workload(&rec, 50, 500);
    let db = DurableStore::open(StoreConfig::new(dir.path().join("db.redb")).durable(false)).unwrap();
    replay_into(&db, ReplaySource::open(&rec, ReplayOptions::default()).unwrap())
        .await
        .unwrap();
    let (scope, _) = db.scopes().unwrap()[0].clone();

    // The truth at every 50th RV, computed from the recording itself.
    let text = std::fs::read_to_string(&rec).unwrap();
    let mut model: BTreeMap<String, String> = BTreeMap::new();
    let mut checked = 0;
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let meta = &v["object"]["metadata"];
        let key = format!(
            "{}/{}",
            meta["namespace"].as_str().unwrap(),
            meta["name"].as_str().unwrap()
        );
        let rv: u64 = meta["resourceVersion"].as_str().unwrap().parse().unwrap();
        if v["type"] == "DELETED" {
            model.remove(&key);
        } else {
            model.insert(key, rv.to_string());
        }
        if rv.is_multiple_of(50) {
            let past: BTreeMap<String, String> = state_at(&db, scope, &rv.to_string().into())
                .unwrap()
                .into_iter()
                .map(|o| (o.key.to_string(), o.meta.resource_version.0))
                .collect();
            assert_eq!(past, model, "state at {rv}");
            checked += 1;
        }
    }
    assert!(checked >= 10);

    let key = ObjectKey::namespaced("ns-1", "cm-1");
    let h = history(&db, scope, &key).unwrap();
    assert!(h.complete);
    assert_eq!(h.entries[0].kind, DeltaKind::Added);
    assert!(h.entries.iter().all(|e| e.key == key));
    let rvs: Vec<u64> = h.entries.iter().map(|e| e.rv.as_u64().unwrap()).collect();
    let sorted = {
        let mut s = rvs.clone();
        s.sort_unstable();
        s
    };
    assert_eq!(rvs, sorted);

    // After compaction, history before the oldest retained entry is refused with a clear error.
    db.writer().compact(Some(100)).await.unwrap();
    match state_at(&db, scope, &"1001".into()) {
        Err(ReplayError::HistoryCompacted { first_retained_rv }) => {
            assert!(first_retained_rv.as_u64().unwrap() > 1001);
        }
        other => panic!("{other:?}"),
    }
    assert!(!history(&db, scope, &key).unwrap().complete);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_initial_state_is_served_as_list_pages_when_streaming_lists_are_off() {
    use durable_informer::reflector::{ReflectorConfig, Transform};
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("rec.jsonl");
    workload(&rec, 30, 100);
    let a = dir.path().join("a.redb");
    replay_file(&rec, &a).await;

    let b = dir.path().join("b.redb");
    let db = DurableStore::open(StoreConfig::new(&b).durable(false)).unwrap();
    let source = ReplaySource::open(&rec, ReplayOptions::default()).unwrap();
    let handle = source.handle();
    let informer = Informer::<ConfigMap>::builder(&db, source)
        .reflector_config(ReflectorConfig {
            streaming_list: false,
            page_size: 7,
            ..ReflectorConfig::default()
        })
        .transform(Transform {
            drop_managed_fields: false,
            ..Transform::default()
        })
        .build()
        .await
        .unwrap();
    informer.start();
    let report = handle.wait_applied(informer.status()).await.unwrap();
    // The leading ADDED run: the 30 objects, and the workload's first creations.
    assert!(report.initial_objects >= 30);
    informer.shutdown().await.unwrap();
    drop(informer);
    db.close().unwrap();
    let (ta, tb) = (tables(&a), tables(&b));
    assert!(ta.0 == tb.0, "object tables differ");
    assert!(ta.1 == tb.1, "logs differ");
}

/// `workload` with a receive time on every line, `gap_ms` apart.
fn timed_workload(path: &Path, objects: u64, events: u64, gap_ms: u64) {
    let plain = path.with_extension("plain");
    workload(&plain, objects, events);
    let text = std::fs::read_to_string(&plain).unwrap();
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    for (n, line) in text.lines().enumerate() {
        let at = 1_700_000_000_000 + n as u64 * gap_ms;
        let open = line.strip_suffix('}').unwrap();
        writeln!(f, r#"{open},"receivedAt":{at}}}"#).unwrap();
    }
}

/// Replays `rec` through an informer with a durable handler; returns what the handler saw.
async fn replay_with_handler(rec: &Path, db_path: &Path, speed: Speed, max_batch: usize) -> Vec<String> {
    use durable_informer::reflector::{ReflectorConfig, Transform};
    let db = DurableStore::open(StoreConfig::new(db_path).durable(false)).unwrap();
    // A durable handler without a cursor starts with a snapshot of whatever is committed when
    // it starts (timing); from a cursor at 0 it reads the whole log, in log order.
    let scope = db
        .writer()
        .register_scope(&ScopeSpec::new("", "v1", "configmaps"))
        .await
        .unwrap();
    db.writer().set_cursor(scope, "test".into(), Seq(0)).await.unwrap();
    let source = ReplaySource::open(rec, ReplayOptions::default().speed(speed)).unwrap();
    let handle = source.handle();
    let informer = Informer::<ConfigMap>::builder(&db, source)
        .reflector_config(ReflectorConfig {
            max_batch,
            ..ReflectorConfig::default()
        })
        .transform(Transform {
            drop_managed_fields: false,
            ..Transform::default()
        })
        .build()
        .await
        .unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s2 = seen.clone();
    let reg = informer.add_event_handler(
        handler_fn(move |ev: Event<ConfigMap>| -> Result<(), std::convert::Infallible> {
            let id = |c: &ConfigMap| {
                format!(
                    "{} {}",
                    c.metadata.name.clone().unwrap_or_default(),
                    c.metadata.resource_version.clone().unwrap_or_default()
                )
            };
            s2.lock().unwrap().push(match &ev {
                Event::Add { object, .. } => format!("add {}", id(object)),
                Event::Update { old, new, .. } => format!("update {} -> {}", id(old), id(new)),
                Event::Delete { object, .. } => format!("delete {}", id(object)),
            });
            Ok(())
        }),
        HandlerOptions::durable("test"),
    );
    informer.start();
    let report = handle.wait_applied(informer.status()).await.unwrap();
    let target = report.last_rv.as_u64().unwrap();
    // The handler runs behind the commit: wait until it has seen the last RV.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let reached = seen
            .lock()
            .unwrap()
            .last()
            .is_some_and(|l| l.ends_with(&format!(" {target}")));
        if reached || std::time::Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    informer.shutdown().await.unwrap();
    drop(reg);
    drop(informer);
    db.close().unwrap();
    let out = seen.lock().unwrap().clone();
    out
}

/// Fewer initial objects than the store's dictionary needs samples, so the dictionary is
/// trained while watch events arrive, in batches whose boundaries depend on the pace and the
/// batch size. The stored bytes and what a handler sees must not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replays_at_any_speed_and_batch_size_give_byte_identical_tables_and_handler_events() {
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("rec.jsonl");
    timed_workload(&rec, 10, 900, 1);
    let runs = [
        (Speed::Max, 1000),
        (Speed::Max, 1),
        (Speed::Max, 13),
        (Speed::Factor(2.0), 1000),
        (Speed::Factor(1.0), 3),
    ];
    let mut first: Option<((Rows, Rows), Vec<String>)> = None;
    for (n, (speed, max_batch)) in runs.into_iter().enumerate() {
        let path = dir.path().join(format!("r{n}.redb"));
        let seen = replay_with_handler(&rec, &path, speed, max_batch).await;
        let t = tables(&path);
        assert!(t.1.len() > 900, "log has {} rows", t.1.len());
        match &first {
            None => {
                assert!(seen.len() > 900, "handler saw {} events", seen.len());
                first = Some((t, seen));
            }
            Some((t0, seen0)) => {
                assert!(t.0 == t0.0, "object tables differ at {speed:?}, max_batch {max_batch}");
                assert!(t.1 == t0.1, "logs differ at {speed:?}, max_batch {max_batch}");
                let at = seen
                    .iter()
                    .zip(seen0)
                    .position(|(a, b)| a != b)
                    .unwrap_or(seen.len().min(seen0.len()));
                assert!(
                    &seen == seen0,
                    "handler events differ at {speed:?}, max_batch {max_batch}: {} vs {} events, first difference at {at}: {:?} vs {:?}",
                    seen.len(),
                    seen0.len(),
                    seen.get(at),
                    seen0.get(at)
                );
            }
        }
    }
}

/// A recorder killed mid-file leaves a zstd frame that never ends (it flushes blocks, never
/// the frame's end). Replay keeps every complete line before the cut and reports the cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compressed_recording_cut_by_a_crash_replays_its_complete_prefix() {
    let fake = Fake::new();
    for i in 0..20 {
        fake.upsert(&format!("cm-{i}"), "v0");
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rec.jsonl.zst");
    let recorder = Recorder::new(fake.clone(), RecorderConfig::new(&path));
    let mut progress = recorder.progress();
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(recorder.run(stop_rx));
    progress.wait_for(|p| !p.last_rv.is_empty()).await.unwrap();
    // In rounds, so the recorder flushes (ends a zstd block) between them.
    for i in 0..200 {
        fake.upsert(&format!("cm-{}", i % 25), &format!("v{i}"));
        if i % 5 == 0 {
            fake.delete(&format!("cm-{}", i % 9));
        }
        if i % 10 == 9 {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }
    fake.bookmark();
    let target = fake.current_rv().to_string();
    progress.wait_for(|p| p.last_rv.as_str() == target).await.unwrap();
    stop.send(true).unwrap();
    let report = task.await.unwrap().unwrap();
    assert_eq!(report.files, std::slice::from_ref(&path));
    let whole = std::fs::read(&path).unwrap();
    let cut = dir.path().join("cut.jsonl.zst");
    std::fs::write(&cut, &whole[..whole.len() * 2 / 3]).unwrap();

    // The truth: the complete lines a zstd decoder gets out of the cut file.
    let mut prefix = Vec::new();
    let mut decoder = zstd::stream::read::Decoder::new(std::fs::File::open(&cut).unwrap()).unwrap();
    let decode_err = std::io::Read::read_to_end(&mut decoder, &mut prefix).unwrap_err();
    assert_eq!(decode_err.kind(), std::io::ErrorKind::UnexpectedEof);
    let complete = &prefix[..prefix.iter().rposition(|b| *b == b'\n').map_or(0, |p| p + 1)];
    let mut model: BTreeMap<String, u64> = BTreeMap::new();
    let mut last_rv = String::new();
    let mut lines = 0;
    for line in complete.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        lines += 1;
        let v: serde_json::Value = serde_json::from_slice(line).unwrap();
        let meta = &v["object"]["metadata"];
        last_rv = meta["resourceVersion"].as_str().unwrap().to_owned();
        let key = format!(
            "{}/{}",
            meta["namespace"].as_str().unwrap_or(""),
            meta["name"].as_str().unwrap_or("")
        );
        match v["type"].as_str().unwrap() {
            "DELETED" => {
                model.remove(&key);
            }
            "BOOKMARK" => {}
            _ => {
                model.insert(key, last_rv.parse().unwrap());
            }
        }
    }
    assert!(
        lines > 25 && lines < report.lines,
        "{lines} of {} lines before the cut",
        report.lines
    );

    let db = DurableStore::open(StoreConfig::new(dir.path().join("db.redb")).durable(false)).unwrap();
    let replayed = replay_into(&db, ReplaySource::open(&cut, ReplayOptions::default()).unwrap())
        .await
        .unwrap();
    assert!(replayed.truncated_tail);
    assert_eq!(replayed.last_rv.as_str(), last_rv);
    let (scope, _) = db.scopes().unwrap()[0].clone();
    let stored: BTreeMap<String, u64> = db
        .store(scope)
        .list()
        .unwrap()
        .into_iter()
        .map(|o| (o.key.to_string(), o.meta.resource_version.as_u64().unwrap()))
        .collect();
    assert_eq!(stored, model);
}

fn stored_rvs(db: &DurableStore) -> BTreeMap<String, u64> {
    let (scope, _) = db.scopes().unwrap()[0].clone();
    db.store(scope)
        .list()
        .unwrap()
        .into_iter()
        .map(|o| (o.key.to_string(), o.meta.resource_version.as_u64().unwrap()))
        .collect()
}

/// Runs an informer over `fake` until the store equals it, then shuts it down.
async fn sync_with(fake: &Fake, db: &DurableStore, during: impl FnOnce(&Fake)) {
    let informer = Informer::<ConfigMap>::builder(db, fake.clone()).build().await.unwrap();
    informer.start();
    during(fake);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while stored_rvs(db) != fake.objects() {
        assert!(std::time::Instant::now() < deadline, "the informer did not converge");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    informer.shutdown().await.unwrap();
}

/// A relist logs its differences in key order and its deletes with the last known RV; the
/// export still replays (as a 410 then the relisted state) to the same objects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_of_a_store_that_relisted_after_a_410_replays_to_the_same_objects() {
    let fake = Fake::new();
    for i in 0..20 {
        fake.upsert(&format!("cm-{i:02}"), "v0");
    }
    let dir = tempfile::tempdir().unwrap();
    let db = DurableStore::open(StoreConfig::new(dir.path().join("db.redb")).durable(false)).unwrap();
    sync_with(&fake, &db, |fake| {
        fake.upsert("cm-03", "v1");
        fake.delete("cm-04");
    })
    .await;
    // While the informer is down: changes in reverse key order, deletes, then compaction.
    for i in (10..20).rev() {
        fake.upsert(&format!("cm-{i:02}"), "v2");
    }
    fake.delete("cm-01");
    fake.delete("cm-15");
    fake.upsert("cm-30", "new");
    fake.compact();
    sync_with(&fake, &db, |fake| {
        fake.upsert("cm-02", "after");
        fake.delete("cm-05");
    })
    .await;
    let (scope, record) = db.scopes().unwrap()[0].clone();
    assert_eq!(record.relist_count, 1, "the store went through one relist");

    let rec = dir.path().join("export.jsonl");
    let exported = durable_informer::replay::export_log_file(&db, Some(scope), &rec).unwrap();
    assert!(exported.relists >= 1, "{exported:?}");

    let replayed_db = DurableStore::open(StoreConfig::new(dir.path().join("r.redb")).durable(false)).unwrap();
    let report = replay_into(
        &replayed_db,
        ReplaySource::open(&rec, ReplayOptions::default()).unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(report.relists, exported.relists);
    assert_eq!(report.error_events, 0);
    assert_eq!(stored_rvs(&replayed_db), fake.objects());
    assert_eq!(stored_rvs(&replayed_db), stored_rvs(&db));
}

/// Export of every scope (`scope = None`) writes one file with the scopes interleaved in log
/// order; each scope's lines in it are exactly that scope's own export. Pinned because the
/// result replays into one scope only (documented on `export_log`).
#[test]
fn an_export_of_all_scopes_interleaves_them_in_log_order() {
    use durable_informer::object::{RawObject, ScopeSpec};
    use durable_informer::store::Batch;
    let obj = |kind: &str, name: &str, rv: u64| {
        RawObject::from_json(
            format!(
                r#"{{"apiVersion":"v1","kind":"{kind}","metadata":{{"name":"{name}","namespace":"ns","resourceVersion":"{rv}"}}}}"#
            )
            .into_bytes(),
        )
        .unwrap()
    };
    let dir = tempfile::tempdir().unwrap();
    let db = DurableStore::open(StoreConfig::new(dir.path().join("db.redb")).durable(false)).unwrap();
    let w = db.writer();
    let cms = w
        .register_scope_blocking(&ScopeSpec::new("", "v1", "configmaps"))
        .unwrap();
    let secrets = w.register_scope_blocking(&ScopeSpec::new("", "v1", "secrets")).unwrap();
    let steps = [
        (cms, DeltaKind::Added, "ConfigMap", "a", 1),
        (secrets, DeltaKind::Added, "Secret", "s", 2),
        (cms, DeltaKind::Added, "ConfigMap", "b", 3),
        (secrets, DeltaKind::Updated, "Secret", "s", 4),
        (cms, DeltaKind::Updated, "ConfigMap", "a", 5),
        (secrets, DeltaKind::Deleted, "Secret", "s", 6),
    ];
    for (scope, kind, k, name, rv) in steps {
        w.apply_blocking(Batch::new(scope).delta(kind, obj(k, name, rv)).rv(rv.to_string()))
            .unwrap();
    }
    let export = |scope| {
        let mut out = Vec::new();
        let report = export_log(&db, scope, &mut out).unwrap();
        let lines: Vec<String> = String::from_utf8(out).unwrap().lines().map(str::to_owned).collect();
        assert_eq!(report.lines, lines.len() as u64);
        lines
    };
    let all = export(None);
    let summary: Vec<String> = all
        .iter()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            format!(
                "{} {} {}",
                v["type"].as_str().unwrap(),
                v["object"]["kind"].as_str().unwrap(),
                v["object"]["metadata"]["resourceVersion"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            "ADDED ConfigMap 1",
            "ADDED Secret 2",
            "ADDED ConfigMap 3",
            "MODIFIED Secret 4",
            "MODIFIED ConfigMap 5",
            "DELETED Secret 6",
        ]
    );
    let of_kind = |kind: &str| -> Vec<String> {
        all.iter()
            .filter(|l| l.contains(&format!(r#""kind":"{kind}""#)))
            .cloned()
            .collect()
    };
    assert_eq!(of_kind("ConfigMap"), export(Some(cms)));
    assert_eq!(of_kind("Secret"), export(Some(secrets)));
}

/// `replay_into` commits its batches without an fsync and makes the end durable itself: a
/// process that dies right after it returns (no close, no later commit) leaves the whole
/// replay in the file. Without the final durable commit the reopened store would be at an
/// earlier state (redb drops non-durable commits when the process goes away).
#[test]
fn a_replay_is_durable_when_replay_into_returns() {
    if let (Ok(rec), Ok(db)) = (
        std::env::var("DI_REPLAY_CHILD_REC"),
        std::env::var("DI_REPLAY_CHILD_DB"),
    ) {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let store = DurableStore::open(StoreConfig::new(&db)).unwrap();
        let report = rt
            .block_on(replay_into(
                &store,
                ReplaySource::open(Path::new(&rec), ReplayOptions::default()).unwrap(),
            ))
            .unwrap();
        println!("replayed {}", report.last_rv);
        // Die without closing: whatever is not durable now is gone.
        std::process::abort();
    }
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("rec.jsonl");
    workload(&rec, 300, 3000);
    let db = dir.path().join("child.redb");
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["a_replay_is_durable_when_replay_into_returns", "--exact", "--nocapture"])
        .env("DI_REPLAY_CHILD_REC", &rec)
        .env("DI_REPLAY_CHILD_DB", &db)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("replayed 4300"), "child: {stdout}");
    // The same recording replayed in this process and closed cleanly is the truth.
    let truth = dir.path().join("truth.redb");
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let store = DurableStore::open(StoreConfig::new(&truth)).unwrap();
        replay_into(&store, ReplaySource::open(&rec, ReplayOptions::default()).unwrap())
            .await
            .unwrap();
        store.close().unwrap();
    });
    let (objects, log) = tables(&db);
    let (want_objects, want_log) = tables(&truth);
    assert_eq!(log.len(), want_log.len(), "log rows after the child died");
    assert!(objects == want_objects, "object rows after the child died");
    assert!(log == want_log, "log rows after the child died");
}
