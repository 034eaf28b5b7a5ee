//! The recorder writes lines as received (a source's own bytes, BOOKMARK and ERROR lines
//! included), records an expired watch as a 410 plus the relist, starts from a watch when
//! asked, and writes zstd; every such recording replays to the server's state.

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use common::fake::{status, Fake, Fault};
use durable_informer::object::{ResourceVersion, ScopeSpec};
use durable_informer::replay::{
    replay_into, InitialState, Recorder, RecorderConfig, RecorderReport, ReplayOptions, ReplaySource,
};
use durable_informer::source::{
    decode_watch_line, ListPage, ListRequest, RawWatchEvent, RawWatchStream, Source, SourceError, WatchRequest,
    WatchStream,
};
use durable_informer::store::{DurableStore, StoreConfig};
use futures::StreamExt;

fn lines_of(files: &[PathBuf]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for f in files {
        let raw = std::fs::read(f).unwrap();
        let bytes = if raw.starts_with(&[0x28, 0xB5, 0x2F, 0xFD]) {
            zstd::decode_all(&raw[..]).unwrap()
        } else {
            raw
        };
        out.extend(
            bytes
                .split(|b| *b == b'\n')
                .filter(|l| !l.is_empty())
                .map(<[u8]>::to_vec),
        );
    }
    out
}

/// Drops the `"receivedAt"` field the recorder appends; fails when it is missing.
fn without_received_at(line: &[u8]) -> Vec<u8> {
    let text = std::str::from_utf8(line).unwrap();
    let at = text
        .rfind(r#","receivedAt":"#)
        .expect("every recorded line has a receive time");
    format!("{}}}", &text[..at]).into_bytes()
}

async fn stored(db: &DurableStore) -> BTreeMap<String, u64> {
    let (scope, _) = db.scopes().unwrap()[0].clone();
    db.store(scope)
        .list()
        .unwrap()
        .into_iter()
        .map(|o| (o.key.to_string(), o.meta.resource_version.as_u64().unwrap()))
        .collect()
}

/// Sends bookmarks until the recorder has written the fake's current RV (a bookmark sent
/// while the recorder has no watch open is lost).
async fn settle(fake: &Fake, progress: &mut tokio::sync::watch::Receiver<RecorderReport>) {
    let target = fake.current_rv().to_string();
    for _ in 0..500 {
        if progress.borrow().last_rv.as_str() == target {
            return;
        }
        fake.bookmark();
        tokio::time::sleep(Duration::from_millis(20)).await;
        let _ = progress.has_changed();
    }
    panic!("the recorder never reached RV {target}");
}

/// A source whose watch sends fixed server lines, then stays open.
struct Scripted {
    lines: Vec<&'static str>,
}

impl Source for Scripted {
    async fn list(&self, _req: ListRequest) -> Result<ListPage, SourceError> {
        Ok(ListPage {
            items: Vec::new(),
            resource_version: ResourceVersion("10".into()),
            continue_token: None,
            remaining: None,
            shard_info: None,
        })
    }

    async fn watch(&self, req: WatchRequest) -> Result<WatchStream, SourceError> {
        let raw = self.watch_raw(req).await?;
        Ok(raw.map(|r| r.map(|e| e.event)).boxed())
    }

    async fn watch_raw(&self, req: WatchRequest) -> Result<RawWatchStream, SourceError> {
        // Only the first watch (from the list's RV) gets the lines.
        let lines = if req.resource_version.as_str() == "10" {
            self.lines.clone()
        } else {
            Vec::new()
        };
        let events: Vec<Result<RawWatchEvent, SourceError>> = lines
            .into_iter()
            .map(|l| {
                Ok(RawWatchEvent {
                    event: decode_watch_line(l.as_bytes()).unwrap(),
                    line: Some(Bytes::from_static(l.as_bytes())),
                })
            })
            .collect();
        Ok(futures::stream::iter(events).chain(futures::stream::pending()).boxed())
    }

    async fn cluster_identity(&self) -> Result<Option<String>, SourceError> {
        Ok(None)
    }

    fn resource(&self) -> String {
        "pods".into()
    }

    fn scope(&self) -> ScopeSpec {
        ScopeSpec {
            group: String::new(),
            version: "v1".into(),
            resource: "pods".into(),
            namespace: None,
            label_selector: None,
            field_selector: None,
            metadata_only: false,
        }
    }
}

/// A Pod BOOKMARK keeps its hollow object (`"spec":{"containers":null}`) and its field order,
/// and a non-410 ERROR is written, instead of both being re-encoded from decoded events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_recorder_writes_the_servers_lines_as_received() {
    let script = vec![
        r#"{"type":"ADDED","object":{"kind":"Pod","apiVersion":"v1","metadata":{"name":"a","namespace":"ns","resourceVersion":"11"},"spec":{"containers":[]}}}"#,
        r#"{"type":"BOOKMARK","object":{"kind":"Pod","apiVersion":"v1","metadata":{"resourceVersion":"12","creationTimestamp":null},"spec":{"containers":null},"status":{}}}"#,
        r#"{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"etcd is slow","reason":"InternalError","code":500}}"#,
    ];
    let dir = tempfile::tempdir().unwrap();
    let recorder = Recorder::new(
        Scripted { lines: script.clone() },
        RecorderConfig::new(dir.path().join("rec.jsonl")),
    );
    let mut progress = recorder.progress();
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(recorder.run(stop_rx));
    tokio::time::timeout(Duration::from_secs(10), progress.wait_for(|p| p.lines == 4))
        .await
        .expect("the recorder wrote the scripted lines")
        .unwrap();
    stop.send(true).unwrap();
    let report = task.await.unwrap().unwrap();

    let lines = lines_of(&report.files);
    // The initial-events-end bookmark of the (empty) list, then the server's lines unchanged.
    assert!(lines[0].starts_with(br#"{"type":"BOOKMARK""#));
    let rest: Vec<Vec<u8>> = lines[1..].iter().map(|l| without_received_at(l)).collect();
    let want: Vec<Vec<u8>> = script.iter().map(|l| l.as_bytes().to_vec()).collect();
    assert!(
        rest == want,
        "recorded {:#?}",
        rest.iter().map(|l| String::from_utf8_lossy(l)).collect::<Vec<_>>()
    );

    let db = DurableStore::open(StoreConfig::new(dir.path().join("db.redb")).durable(false)).unwrap();
    let replayed = replay_into(
        &db,
        ReplaySource::open(&report.files[0], ReplayOptions::default()).unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(replayed.last_rv.as_str(), "12");
    assert_eq!(replayed.error_events, 1);
    assert_eq!(stored(&db).await, BTreeMap::from([("ns/a".to_owned(), 11)]));
}

/// An expired watch no longer ends the recording: the 410 is written, then the state a relist
/// finds. A delete that no watch saw (it happened while none was open) reaches the replayed
/// store only through that relist. A non-410 ERROR is written and skipped by replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_watch_is_recorded_with_its_relist_and_replays_to_the_servers_state() {
    let fake = Fake::new();
    for i in 0..10 {
        fake.upsert(&format!("cm-{i}"), "v0");
    }
    let dir = tempfile::tempdir().unwrap();
    let recorder = Recorder::new(fake.clone(), RecorderConfig::new(dir.path().join("rec.jsonl")));
    let mut progress = recorder.progress();
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(recorder.run(stop_rx));
    settle(&fake, &mut progress).await;
    // The list's bookmark settles it before the first watch is open; a fault queued then would
    // go to that watch. The recorder publishes `watches == 1` once the watch is open and idle.
    tokio::time::timeout(Duration::from_secs(10), progress.wait_for(|p| p.watches == 1))
        .await
        .expect("the first watch opens")
        .expect("the recorder runs");

    // The next watch sends an ERROR 500 (written and flushed, then a re-watch after a 1 s
    // backoff), the one after that answers 410. The delete happens during the backoff, while no watch is
    // open, so only the relist sees it.
    fake.fault(Fault::WatchError {
        after: 0,
        status: status(500, "InternalError", "etcd is slow"),
    });
    fake.drop_watches();
    let written = tokio::time::timeout(Duration::from_secs(10), progress.wait_for(|p| p.watches == 2))
        .await
        .is_ok();
    assert!(
        written,
        "no second watch: {:?} {:?}",
        *progress.borrow(),
        fake.requests()
    );
    fake.fault(Fault::Watch(status(410, "Expired", "too old resource version")));
    fake.delete("cm-3");
    fake.upsert("cm-4", "late");
    settle(&fake, &mut progress).await;
    fake.upsert("cm-5", "after");
    settle(&fake, &mut progress).await;
    stop.send(true).unwrap();
    let report = task.await.unwrap().unwrap();
    // The first, the one with the ERROR 500, the one answered 410, the one after the relist.
    assert_eq!(report.watches, 4);

    let lines = lines_of(&report.files);
    let types: Vec<String> = lines
        .iter()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_slice(l).unwrap();
            let code = v["object"]["code"]
                .as_u64()
                .map(|c| format!(" {c}"))
                .unwrap_or_default();
            format!("{}{code}", v["type"].as_str().unwrap())
        })
        .collect();
    let gone = types
        .iter()
        .position(|t| t == "ERROR 410")
        .expect("the 410 is recorded");
    assert!(types.iter().any(|t| t == "ERROR 500"), "{types:?}");
    // The relist follows the 410: the 9 objects left, then its initial-events-end bookmark.
    assert!(types[gone + 1..gone + 10].iter().all(|t| t == "ADDED"), "{types:?}");
    assert_eq!(types[gone + 10], "BOOKMARK");
    let end: serde_json::Value = serde_json::from_slice(&lines[gone + 10]).unwrap();
    assert_eq!(
        end["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );

    let db = DurableStore::open(StoreConfig::new(dir.path().join("db.redb")).durable(false)).unwrap();
    let replayed = replay_into(
        &db,
        ReplaySource::open_all(report.files.clone(), ReplayOptions::default()).unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(replayed.relists, 1);
    assert_eq!(replayed.error_events, 1);
    assert_eq!(replayed.last_rv.as_str(), fake.current_rv().to_string());
    assert_eq!(stored(&db).await, fake.objects());
}

/// `InitialState::Watch` records from a watch without an RV (no LIST), and a `.zst` path
/// gives a zstd file; both replay to the server's state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zstd_recording_started_from_a_watch_replays_to_the_servers_state() {
    let fake = Fake::new();
    for i in 0..30 {
        fake.upsert(&format!("cm-{i}"), "v0");
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rec.jsonl.zst");
    let recorder = Recorder::new(fake.clone(), RecorderConfig::new(&path).initial(InitialState::Watch));
    let mut progress = recorder.progress();
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(recorder.run(stop_rx));
    settle(&fake, &mut progress).await;
    for i in 0..50 {
        fake.upsert(&format!("cm-{}", i % 35), &format!("v{i}"));
        if i % 6 == 0 {
            fake.delete(&format!("cm-{}", i % 11));
        }
    }
    settle(&fake, &mut progress).await;
    stop.send(true).unwrap();
    let report = task.await.unwrap().unwrap();
    assert_eq!(report.files, std::slice::from_ref(&path));
    assert!(
        fake.requests().iter().all(|r| !r.starts_with("list")),
        "{:?}",
        fake.requests()
    );
    assert!(fake.requests()[0].starts_with("watch rv="), "{:?}", fake.requests());
    assert!(std::fs::read(&path).unwrap().starts_with(&[0x28, 0xB5, 0x2F, 0xFD]));
    let lines = lines_of(&report.files);
    assert!(lines[0].starts_with(br#"{"type":"ADDED""#));
    assert_eq!(lines.len() as u64, report.lines);

    let db = DurableStore::open(StoreConfig::new(dir.path().join("db.redb")).durable(false)).unwrap();
    let replayed = replay_into(&db, ReplaySource::open(&path, ReplayOptions::default()).unwrap())
        .await
        .unwrap();
    assert!(!replayed.truncated_tail);
    assert_eq!(replayed.last_rv.as_str(), fake.current_rv().to_string());
    assert_eq!(stored(&db).await, fake.objects());
}
