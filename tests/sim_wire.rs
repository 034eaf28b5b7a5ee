//! The simulated API server, driven into the situations recorded from a real kube-apiserver
//! v1.20.2 (`tests/data/k8s-wire/`), answers with the same status codes and body shapes.

mod sim_common;

use std::time::Duration;

use durable_informer::sim::{Sim, SimConfig};
use serde_json::Value;
use sim_common::*;

fn fast() -> SimConfig {
    SimConfig::default()
        .bookmark_before_timeout(Duration::from_millis(700))
        .too_large_rv_wait(Duration::from_millis(300))
}

fn jsonl(name: &str) -> Vec<Value> {
    wire(name)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect()
}

fn name_of(v: &Value) -> String {
    v.pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string()
}

/// Load a recorded LIST into the sim, then replay the recorded watch as writes while a watch
/// from the list's RV is open. Returns (sim, initial list, sim's events).
async fn replay(resource: &str, list_file: &str, watch_file: &str) -> (Sim, Value, Vec<Value>) {
    let sim = Sim::start(fast()).expect("start");
    let recorded_list: Value = serde_json::from_str(&wire(list_file)).expect("list json");
    for item in recorded_list["items"].as_array().expect("items") {
        let ns = item.pointer("/metadata/namespace").and_then(Value::as_str);
        sim.create(resource, ns, strip_server_fields(item.clone()))
            .expect("load");
    }
    let list = request(sim.addr(), "GET", &format!("/api/v1/{resource}"), None).await;
    assert_eq!(list.status, 200);
    let list = list.json();
    let rv = list["metadata"]["resourceVersion"].as_str().expect("rv").to_string();

    let addr = sim.addr();
    let path = format!("/api/v1/{resource}?watch=true&resourceVersion={rv}&allowWatchBookmarks=true&timeoutSeconds=2");
    let watch = tokio::spawn(async move { request(addr, "GET", &path, None).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    for e in jsonl(watch_file) {
        let obj = strip_server_fields(e["object"].clone());
        let ns = obj
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .map(str::to_string);
        let name = name_of(&obj);
        match e["type"].as_str() {
            Some("ADDED") => {
                sim.create(resource, ns.as_deref(), obj).expect("create");
            }
            Some("MODIFIED") => {
                sim.update(resource, ns.as_deref(), obj).expect("update");
            }
            Some("DELETED") => {
                sim.delete(resource, ns.as_deref(), &name).expect("delete");
            }
            _ => {}
        }
    }
    let resp = watch.await.expect("watch task");
    assert_eq!(resp.status, 200);
    assert_eq!(
        resp.headers.get("content-type").map(String::as_str),
        Some("application/json")
    );
    (sim, list, resp.events())
}

fn check_stream_matches_recording(recorded: &[Value], served: &[Value]) {
    let rec_events: Vec<&Value> = recorded.iter().filter(|e| e["type"] != "BOOKMARK").collect();
    let sim_events: Vec<&Value> = served.iter().filter(|e| e["type"] != "BOOKMARK").collect();
    assert_eq!(rec_events.len(), sim_events.len(), "event count");
    let mut last_rv = 0u64;
    for (r, s) in rec_events.iter().zip(&sim_events) {
        assert_eq!(r["type"], s["type"], "event type of {}", name_of(&r["object"]));
        assert_same_shape(&format!("{} {}", r["type"], name_of(&r["object"])), r, s);
        let rv: u64 = s["object"]["metadata"]["resourceVersion"]
            .as_str()
            .and_then(|x| x.parse().ok())
            .expect("rv");
        assert!(rv > last_rv, "events in RV order");
        last_rv = rv;
    }
    // The recording ends with a bookmark; the sim sends one shortly before timeoutSeconds.
    let rec_bm = recorded.last().expect("recorded bookmark");
    assert_eq!(rec_bm["type"], "BOOKMARK");
    let sim_bm = served.last().expect("served events");
    assert_eq!(sim_bm["type"], "BOOKMARK", "a bookmark shortly before timeoutSeconds");
    assert_same_shape("bookmark", rec_bm, sim_bm);
    assert_eq!(
        sim_bm["object"]["metadata"]["resourceVersion"].as_str(),
        Some(last_rv.to_string().as_str())
    );
}

/// Applying the served watch to the served LIST gives the server's later LIST; and the
/// later LIST has the same items (shape and values) as the recorded `*-after.json`.
async fn check_after(sim: &Sim, resource: &str, list: &Value, events: &[Value], after_file: &str) {
    let applied = apply_events(list["items"].as_array().expect("items"), events);
    let later = request(sim.addr(), "GET", &format!("/api/v1/{resource}"), None)
        .await
        .json();
    let later_items: std::collections::BTreeMap<String, Value> = later["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|o| {
            (
                format!("{}/{}", o["metadata"]["namespace"].as_str().unwrap_or(""), name_of(o)),
                o.clone(),
            )
        })
        .collect();
    assert_eq!(
        applied.keys().collect::<Vec<_>>(),
        later_items.keys().collect::<Vec<_>>()
    );
    for (k, v) in &applied {
        // watch objects carry kind/apiVersion, list items do not; everything else is identical
        assert_eq!(&without_type(v), &later_items[k], "{k}");
    }

    let recorded_after: Value = serde_json::from_str(&wire(after_file)).expect("after json");
    let mut sim_rec: Vec<Value> = later["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter(|o| o["metadata"]["namespace"] == "rec")
        .cloned()
        .collect();
    let mut rec: Vec<Value> = recorded_after["items"].as_array().expect("items").clone();
    sim_rec.sort_by_key(name_of);
    rec.sort_by_key(name_of);
    assert_same_shape("list after workload", &Value::Array(rec), &Value::Array(sim_rec));
    assert_same_shape(
        "list envelope",
        &serde_json::json!({"kind": recorded_after["kind"], "apiVersion": recorded_after["apiVersion"], "metadata": recorded_after["metadata"]}),
        &serde_json::json!({"kind": later["kind"], "apiVersion": later["apiVersion"], "metadata": later["metadata"]}),
    );
}

#[test]
fn recorded_watch_applied_to_recorded_list_gives_recorded_after_list() {
    // Validates `apply_events` itself on real data.
    for (list, watch, after) in [
        (
            "configmaps-list.json",
            "configmaps-watch.jsonl",
            "configmaps-rec-list-after.json",
        ),
        ("pods-list.json", "pods-watch.jsonl", "pods-rec-list-after.json"),
    ] {
        let list: Value = serde_json::from_str(&wire(list)).expect("json");
        let applied = apply_events(list["items"].as_array().expect("items"), &jsonl(watch));
        let after: Value = serde_json::from_str(&wire(after)).expect("json");
        let rec: Vec<Value> = applied
            .into_iter()
            .filter(|(k, _)| k.starts_with("rec/"))
            .map(|(_, v)| without_type(&v))
            .collect();
        let mut want: Vec<Value> = after["items"].as_array().expect("items").clone();
        want.sort_by_key(name_of);
        let mut rec = rec;
        rec.sort_by_key(name_of);
        assert_eq!(rec, want);
    }
}

#[tokio::test]
async fn configmap_list_watch_and_after_list_match_the_recording() {
    let (sim, list, events) = replay("configmaps", "configmaps-list.json", "configmaps-watch.jsonl").await;
    let recorded_list: Value = serde_json::from_str(&wire("configmaps-list.json")).expect("json");
    assert_same_shape("configmaps list", &recorded_list, &list);
    check_stream_matches_recording(&jsonl("configmaps-watch.jsonl"), &events);
    check_after(&sim, "configmaps", &list, &events, "configmaps-rec-list-after.json").await;

    // Pagination over the same state: the continue token encodes the same start key and the
    // same remainingItemCount as the real server's.
    let p5 = request(sim.addr(), "GET", "/api/v1/namespaces/rec/configmaps?limit=5", None).await;
    assert_eq!(p5.status, 200);
    let rec5: Value = serde_json::from_str(&wire("configmaps-rec-list-page1-limit5.json")).expect("json");
    assert_same_shape("page1 limit5", &rec5, &p5.json());
    let tok = decode_token(p5.json()["metadata"]["continue"].as_str().expect("continue"));
    let rec_tok = decode_token(rec5["metadata"]["continue"].as_str().expect("continue"));
    assert_eq!(tok["v"], rec_tok["v"]);
    assert_eq!(tok["start"], rec_tok["start"]);
    assert_eq!(
        tok["rv"].as_u64().map(|r| r.to_string()).as_deref(),
        p5.json()["metadata"]["resourceVersion"].as_str()
    );

    let p1 = request(sim.addr(), "GET", "/api/v1/namespaces/rec/configmaps?limit=2", None)
        .await
        .json();
    assert_same_shape(
        "page1 limit2",
        &serde_json::from_str(&wire("configmaps-rec-page1-limit2.json")).expect("json"),
        &p1,
    );
    let c = p1["metadata"]["continue"].as_str().expect("continue");
    let p2 = request(
        sim.addr(),
        "GET",
        &format!("/api/v1/namespaces/rec/configmaps?limit=2&continue={c}"),
        None,
    )
    .await
    .json();
    let rec2: Value = serde_json::from_str(&wire("configmaps-rec-page2-limit2.json")).expect("json");
    assert_same_shape("page2 limit2", &rec2, &p2);
    assert_eq!(
        decode_token(p2["metadata"]["continue"].as_str().expect("c"))["start"],
        decode_token(rec2["metadata"]["continue"].as_str().expect("c"))["start"]
    );
    // later pages are served at the first page's RV
    assert_eq!(p2["metadata"]["resourceVersion"], p1["metadata"]["resourceVersion"]);

    // The continue token outlives compaction: 410 Expired with an inconsistent token.
    sim.create(
        "configmaps",
        Some("rec"),
        serde_json::json!({"metadata": {"name": "late"}}),
    )
    .expect("create");
    sim.compact();
    let expired = request(
        sim.addr(),
        "GET",
        &format!("/api/v1/namespaces/rec/configmaps?limit=2&continue={c}"),
        None,
    )
    .await;
    let recorded = wire_http("list-410-continue-expired.http");
    assert_eq!(expired.status, recorded.status);
    assert_same_shape("410 continue expired", &recorded.json(), &expired.json());
    let new_tok = decode_token(expired.json()["metadata"]["continue"].as_str().expect("new token"));
    assert_eq!(
        new_tok,
        decode_token(recorded.json()["metadata"]["continue"].as_str().expect("token"))
    );
    // ... and the new token continues, inconsistently, at the current state
    let t = expired.json()["metadata"]["continue"].as_str().expect("t").to_string();
    let rest = request(
        sim.addr(),
        "GET",
        &format!("/api/v1/namespaces/rec/configmaps?limit=100&continue={t}"),
        None,
    )
    .await;
    assert_eq!(rest.status, 200);
    let names: Vec<String> = rest.json()["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(name_of)
        .collect();
    assert_eq!(names.first().map(String::as_str), Some("rec-cm-13"));
    assert!(names.contains(&"late".to_string()) || names.iter().all(|n| n.as_str() > "late"));
}

#[tokio::test]
async fn pod_list_watch_and_after_list_match_the_recording() {
    let (sim, list, events) = replay("pods", "pods-list.json", "pods-watch.jsonl").await;
    let recorded_list: Value = serde_json::from_str(&wire("pods-list.json")).expect("json");
    assert_same_shape("pods list", &recorded_list, &list);
    check_stream_matches_recording(&jsonl("pods-watch.jsonl"), &events);
    check_after(&sim, "pods", &list, &events, "pods-rec-list-after.json").await;
}

#[tokio::test]
async fn list_exact_rv_older_than_compaction_is_410_expired() {
    let sim = Sim::start(fast()).expect("start");
    for i in 0..60 {
        sim.create(
            "configmaps",
            Some("default"),
            serde_json::json!({"metadata": {"name": format!("c{i}")}}),
        )
        .expect("create");
    }
    sim.compact();
    let resp = request(
        sim.addr(),
        "GET",
        "/api/v1/configmaps?resourceVersion=50&resourceVersionMatch=Exact",
        None,
    )
    .await;
    let recorded = wire_http("list-410-exact-rv-too-old.http");
    assert_eq!(resp.status, recorded.status);
    assert_same_shape("410 exact", &recorded.json(), &resp.json());
}

#[tokio::test]
async fn list_exact_rv_inside_the_window_returns_the_old_state() {
    let sim = Sim::start(fast()).expect("start");
    sim.create(
        "configmaps",
        Some("default"),
        serde_json::json!({"metadata": {"name": "a"}, "data": {"v": "1"}}),
    )
    .expect("create");
    let rv = sim.current_rv();
    sim.patch(
        "configmaps",
        Some("default"),
        "a",
        &serde_json::json!({"data": {"v": "2"}}),
    )
    .expect("patch");
    sim.create(
        "configmaps",
        Some("default"),
        serde_json::json!({"metadata": {"name": "b"}}),
    )
    .expect("create");
    let resp = request(
        sim.addr(),
        "GET",
        &format!("/api/v1/configmaps?resourceVersion={rv}&resourceVersionMatch=Exact"),
        None,
    )
    .await;
    assert_eq!(resp.status, 200);
    let v = resp.json();
    assert_eq!(v["metadata"]["resourceVersion"], rv.to_string());
    let items = v["items"].as_array().expect("items");
    assert_eq!(items.len(), 1);
    assert_eq!(items[0]["data"]["v"], "1");
}

#[tokio::test]
async fn list_from_an_rv_the_server_has_not_reached_is_504_too_large() {
    let sim = Sim::start(fast()).expect("start");
    let future = sim.current_rv() + 100_000;
    let started = std::time::Instant::now();
    let resp = request(
        sim.addr(),
        "GET",
        &format!("/api/v1/configmaps?resourceVersion={future}&resourceVersionMatch=NotOlderThan"),
        None,
    )
    .await;
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "waits before answering"
    );
    let recorded = wire_http("list-504-too-large-rv.http");
    assert_eq!(resp.status, recorded.status);
    assert_eq!(resp.headers.get("retry-after"), recorded.headers.get("retry-after"));
    let (r, s) = (recorded.json(), resp.json());
    let mut diff = Vec::new();
    shape_diff("", &r, &s, &mut diff);
    // only the numbers in the message differ
    assert!(diff.iter().all(|d| d.starts_with(".message")), "{diff:?}");
    assert_eq!(
        s["message"],
        format!(
            "Timeout: Too large resource version: {future}, current: {}",
            sim.current_rv()
        )
    );
}

async fn compacted_watch(cfg: SimConfig, recorded: &str) {
    let sim = Sim::start(cfg).expect("start");
    let old = sim.current_rv();
    for i in 0..5 {
        sim.create(
            "configmaps",
            Some("default"),
            serde_json::json!({"metadata": {"name": format!("c{i}")}}),
        )
        .expect("create");
    }
    sim.compact();
    let resp = request(
        sim.addr(),
        "GET",
        &format!("/api/v1/configmaps?watch=true&resourceVersion={old}&timeoutSeconds=5"),
        None,
    )
    .await;
    let rec = wire_http(recorded);
    assert_eq!(resp.status, rec.status);
    let (re, se) = (rec.events(), resp.events());
    assert_eq!(se.len(), 1, "one ERROR event, then the stream ends");
    let mut diff = Vec::new();
    shape_diff("", &re[0], &se[0], &mut diff);
    assert!(diff.iter().all(|d| d.starts_with(".object.message")), "{diff:?}");
    let msg = se[0]["object"]["message"].as_str().expect("message").to_string();
    if rec.events()[0]["object"]["message"]
        .as_str()
        .is_some_and(|m| m.starts_with("too old resource version: "))
    {
        assert_eq!(msg, format!("too old resource version: {old} ({})", sim.compacted_rv()));
    } else {
        assert_eq!(diff, Vec::<String>::new());
    }
}

#[tokio::test]
async fn watch_from_compacted_rv_is_200_with_one_410_error_event() {
    compacted_watch(fast(), "watch-410-watchcache-too-old.http").await;
}

#[tokio::test]
async fn watch_from_compacted_rv_without_watch_cache_reports_etcds_message() {
    compacted_watch(fast().watch_cache(false), "watch-410-etcd-compacted-nocache.http").await;
}

#[tokio::test]
async fn watch_from_a_future_rv_is_silent_until_timeout() {
    let sim = Sim::start(fast().bookmark_interval(Duration::from_millis(100))).expect("start");
    let future = sim.current_rv() + 1000;
    let started = std::time::Instant::now();
    let resp = request(
        sim.addr(),
        "GET",
        &format!("/api/v1/configmaps?watch=true&resourceVersion={future}&allowWatchBookmarks=true&timeoutSeconds=1"),
        None,
    )
    .await;
    let rec = wire_http("watch-future-rv-silent.http");
    assert_eq!(resp.status, rec.status);
    assert!(
        resp.body.is_empty(),
        "no events, no bookmarks: {}",
        String::from_utf8_lossy(&resp.body)
    );
    assert!(started.elapsed() >= Duration::from_millis(900));
}

#[tokio::test]
async fn watch_without_rv_starts_with_synthetic_adds_of_the_current_state() {
    let sim = Sim::start(fast()).expect("start");
    let rec = wire_http("watch-from-unset-rv.http");
    for e in rec.events() {
        let o = strip_server_fields(e["object"].clone());
        sim.create("configmaps", Some("rec"), o).expect("create");
    }
    let resp = request(
        sim.addr(),
        "GET",
        "/api/v1/namespaces/rec/configmaps?watch=true&timeoutSeconds=1",
        None,
    )
    .await;
    assert_eq!(resp.status, rec.status);
    let mut got = resp.events();
    let mut want = rec.events();
    assert_eq!(got.len(), want.len());
    got.sort_by_key(|e| name_of(&e["object"]));
    want.sort_by_key(|e| name_of(&e["object"]));
    for (w, g) in want.iter().zip(&got) {
        assert_eq!(g["type"], "ADDED");
        assert_same_shape("synthetic add", w, g);
    }
}

#[tokio::test]
async fn streaming_list_on_an_old_server_is_422_invalid() {
    let sim = Sim::start(fast().old_server(true)).expect("start");
    let resp = request(
        sim.addr(),
        "GET",
        "/api/v1/configmaps?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true",
        None,
    )
    .await;
    let rec = wire_http("watchlist-on-old-server.http");
    assert_eq!(resp.status, rec.status);
    assert_eq!(resp.json(), rec.json(), "identical Status, message and causes");
}

#[tokio::test]
async fn streaming_list_on_a_new_server_ends_initial_events_with_an_annotated_bookmark() {
    let sim = Sim::start(fast()).expect("start");
    for i in 0..3 {
        sim.create(
            "pods",
            Some("default"),
            serde_json::json!({"metadata": {"name": format!("p{i}")}, "spec": {"containers": []}}),
        )
        .expect("create");
    }
    let rv = sim.current_rv();
    let resp = request(
        sim.addr(),
        "GET",
        "/api/v1/namespaces/default/pods?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=1",
        None,
    )
    .await;
    assert_eq!(resp.status, 200);
    let ev = resp.events();
    assert!(ev[..3].iter().all(|e| e["type"] == "ADDED"));
    let bm = &ev[3];
    assert_eq!(bm["type"], "BOOKMARK");
    assert_eq!(
        bm["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
    assert_eq!(bm["object"]["metadata"]["resourceVersion"], rv.to_string());
    // same shape as a recorded pod bookmark, plus the annotation
    let recorded_bm = jsonl("pods-watch.jsonl").pop().expect("bookmark");
    let mut plain = bm.clone();
    if let Some(m) = plain["object"]["metadata"].as_object_mut() {
        m.remove("annotations");
    }
    assert_same_shape("initial-events-end bookmark", &recorded_bm, &plain);
}

#[tokio::test]
async fn kube_system_namespace_has_the_recorded_shape() {
    let sim = Sim::start(fast()).expect("start");
    let resp = request(sim.addr(), "GET", "/api/v1/namespaces/kube-system", None).await;
    assert_eq!(resp.status, 200);
    let mut rec: Value = serde_json::from_str(&wire("namespace-kube-system.json")).expect("json");
    // managedFields are written by a real server's field manager, which the sim does not emulate
    if let Some(m) = rec["metadata"].as_object_mut() {
        m.remove("managedFields");
    }
    assert_same_shape("kube-system", &rec, &resp.json());
    let uid = resp.json()["metadata"]["uid"].as_str().expect("uid").to_string();
    assert_eq!(uid.len(), 36);
}
