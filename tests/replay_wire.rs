//! Replays of the real API server traffic in `tests/data/k8s-wire/`: each watch stream replayed
//! onto its list gives exactly the recorded truth, plain `kubectl get --raw` output replays as
//! it is, and replay → export gives back the recorded lines byte for byte.

use std::collections::BTreeMap;
use std::path::Path;

use durable_informer::object::ScopeSpec;
use durable_informer::replay::{encode_list, export_log, replay_into, ReplayOptions, ReplaySource};
use durable_informer::source::decode_list;
use durable_informer::store::{DurableStore, StoreConfig};

const WIRE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/k8s-wire/");

fn wire(name: &str) -> Vec<u8> {
    std::fs::read(format!("{WIRE}{name}")).unwrap()
}

/// `namespace/name` → resourceVersion of a LIST body's items.
fn truth(list: &str, namespace: Option<&str>) -> BTreeMap<String, String> {
    decode_list(&wire(list))
        .unwrap()
        .items
        .into_iter()
        .filter(|o| namespace.is_none() || o.meta.namespace.as_deref() == namespace)
        .map(|o| (o.key().to_string(), o.meta.resource_version.0))
        .collect()
}

fn stored(db: &DurableStore, namespace: Option<&str>) -> BTreeMap<String, String> {
    let (scope, _) = db.scopes().unwrap().into_iter().next().unwrap();
    db.store(scope)
        .list()
        .unwrap()
        .into_iter()
        .filter(|o| namespace.is_none() || o.key.namespace.as_deref() == namespace)
        .map(|o| (o.key.to_string(), o.meta.resource_version.0))
        .collect()
}

fn open_db(dir: &Path) -> DurableStore {
    DurableStore::open(StoreConfig::new(dir.join("db.redb")).durable(false)).unwrap()
}

/// The list as ADDED lines plus the end bookmark, then the watch stream as recorded.
fn list_then_watch(list: &str, watch: &str) -> Vec<u8> {
    let mut rec = Vec::new();
    encode_list(&mut rec, &decode_list(&wire(list)).unwrap(), None);
    rec.extend_from_slice(&wire(watch));
    rec
}

async fn replay_onto_list(list: &str, watch: &str, after: &str, resource: &str, bookmark_rv: &str) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rec.jsonl");
    std::fs::write(&path, list_then_watch(list, watch)).unwrap();
    let db = open_db(dir.path());
    let source = ReplaySource::open(&path, ReplayOptions::default()).unwrap();
    let report = replay_into(&db, source).await.unwrap();

    let (_, record) = db.scopes().unwrap().into_iter().next().unwrap();
    assert_eq!(record.spec, ScopeSpec::new("", "v1", resource).canonical());
    // The "after" file is a LIST of namespace `rec` only: the workload's namespace.
    assert_eq!(stored(&db, Some("rec")), truth(after, Some("rec")), "{watch}");
    // Objects outside `rec` are the list's, untouched by the workload.
    let before = truth(list, None);
    let outside: BTreeMap<_, _> = stored(&db, None)
        .into_iter()
        .filter(|(k, _)| !k.starts_with("rec/"))
        .collect();
    let listed_outside: BTreeMap<_, _> = before.into_iter().filter(|(k, _)| !k.starts_with("rec/")).collect();
    assert_eq!(outside, listed_outside);
    // The scope reached the watch's closing bookmark.
    assert_eq!(report.last_rv.as_str(), bookmark_rv, "{watch}");
    assert_eq!(
        db.store(db.scopes().unwrap()[0].0)
            .resource_version()
            .unwrap()
            .unwrap()
            .as_str(),
        bookmark_rv
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configmaps_watch_replayed_onto_its_list_gives_the_recorded_truth() {
    replay_onto_list(
        "configmaps-list.json",
        "configmaps-watch.jsonl",
        "configmaps-rec-list-after.json",
        "configmaps",
        "319",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_watch_replayed_onto_its_list_gives_the_recorded_truth() {
    replay_onto_list(
        "pods-list.json",
        "pods-watch.jsonl",
        "pods-rec-list-after.json",
        "pods",
        "344",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_kubectl_raw_watch_output_replays_as_it_is() {
    // `kubectl get --raw '/api/v1/namespaces/rec/configmaps?watch=1'` after the workload: the
    // current objects as synthetic ADDED events, not in RV order.
    let http = String::from_utf8(wire("watch-from-unset-rv.http")).unwrap();
    let body = &http[http.find("\n{").unwrap() + 1..];
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubectl.jsonl");
    std::fs::write(&path, body).unwrap();
    let db = open_db(dir.path());
    let report = replay_into(&db, ReplaySource::open(&path, ReplayOptions::default()).unwrap())
        .await
        .unwrap();
    assert_eq!(report.initial_objects, 15);
    assert_eq!(stored(&db, None), truth("configmaps-rec-list-after.json", Some("rec")));

    // And a raw watch from an RV, replayed on its own (no list): the workload's objects.
    let dir = tempfile::tempdir().unwrap();
    let db = open_db(dir.path());
    let source = ReplaySource::open(format!("{WIRE}configmaps-watch.jsonl"), ReplayOptions::default()).unwrap();
    replay_into(&db, source).await.unwrap();
    assert_eq!(stored(&db, None), truth("configmaps-rec-list-after.json", Some("rec")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_then_export_gives_back_the_recorded_lines_byte_for_byte() {
    for watch in ["configmaps-watch.jsonl", "pods-watch.jsonl"] {
        let dir = tempfile::tempdir().unwrap();
        let db = open_db(dir.path());
        let source = ReplaySource::open(format!("{WIRE}{watch}"), ReplayOptions::default()).unwrap();
        replay_into(&db, source).await.unwrap();
        let mut out = Vec::new();
        let report = export_log(&db, None, &mut out).unwrap();
        let original: Vec<&[u8]> = wire_lines(watch)
            .into_iter()
            .filter(|l| !l.starts_with(br#"{"type":"BOOKMARK""#))
            .collect();
        let exported: Vec<&[u8]> = out.split(|b| *b == b'\n').filter(|l| !l.is_empty()).collect();
        assert_eq!(report.lines as usize, original.len());
        assert!(exported == original, "{watch}: export differs from the recording");
    }
}

fn wire_lines(name: &str) -> Vec<&'static [u8]> {
    let bytes: &'static [u8] = Box::leak(wire(name).into_boxed_slice());
    bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zstd_recording_replays_like_the_plain_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rec.jsonl.zst");
    let plain = list_then_watch("configmaps-list.json", "configmaps-watch.jsonl");
    std::fs::write(&path, zstd::encode_all(plain.as_slice(), 3).unwrap()).unwrap();
    let db = open_db(dir.path());
    replay_into(&db, ReplaySource::open(&path, ReplayOptions::default()).unwrap())
        .await
        .unwrap();
    assert_eq!(
        stored(&db, Some("rec")),
        truth("configmaps-rec-list-after.json", Some("rec"))
    );
}

/// The LIST path and the default transform together: each recorded item keeps everything but
/// its `managedFields`, and gains the `apiVersion`/`kind` a LIST item lacks.
#[test]
fn recorded_list_items_lose_exactly_their_managed_fields() {
    let body = wire("pods-list.json");
    let list: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let page = decode_list(&body).unwrap();
    let mut cut = 0;
    for (item, original) in page.items.into_iter().zip(list["items"].as_array().unwrap()) {
        let mut want = original.clone();
        let had = want["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("managedFields")
            .is_some();
        cut += usize::from(had);
        want["apiVersion"] = "v1".into();
        want["kind"] = "Pod".into();
        let out = durable_informer::reflector::Transform::default()
            .apply(item)
            .unwrap()
            .unwrap();
        let got: serde_json::Value = serde_json::from_slice(&out.bytes).unwrap();
        assert_eq!(got, want);
        // The stored bytes read back as an object again.
        durable_informer::object::RawObject::from_json(out.bytes.clone()).unwrap();
    }
    assert!(cut > 0, "the recording has managedFields to cut");
}
