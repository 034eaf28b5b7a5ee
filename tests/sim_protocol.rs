//! The simulated API server speaks the list/watch protocol to the real `kube::Client`:
//! pagination, watches, bookmarks, streaming lists, selectors, compaction, restarts, restores,
//! writes, fault injection and counters.

mod sim_common;

use std::time::Duration;

use durable_informer::sim::workload::{Churn, WorkloadGen};
use durable_informer::sim::{Failure, FaultTarget, ResourceDef, Sim, SimConfig};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, VersionMatch, WatchEvent, WatchParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::watcher;
use serde_json::{json, Value};
use sim_common::*;

fn fast() -> SimConfig {
    SimConfig::default()
        .bookmark_before_timeout(Duration::from_millis(300))
        .too_large_rv_wait(Duration::from_millis(200))
}

fn cm(name: &str, labels: Value) -> Value {
    json!({"metadata": {"name": name, "labels": labels}, "data": {"k": name}})
}

/// A client without kube's default retry of 429/503/504, to see those statuses.
fn no_retry_client(sim: &Sim) -> kube::Client {
    let mut config = sim.kube_config().expect("config");
    config.default_retry = false;
    kube::Client::try_from(config).expect("client")
}

fn api_code<T: std::fmt::Debug>(r: Result<T, kube::Error>) -> u16 {
    match r {
        Err(kube::Error::Api(s)) => s.code,
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// Collect a kube watch until it ends (timeoutSeconds) or `max` events arrive.
async fn collect<K: Clone + serde::de::DeserializeOwned + std::fmt::Debug + 'static>(
    api: &Api<K>,
    wp: &WatchParams,
    rv: &str,
    max: usize,
) -> Vec<WatchEvent<K>> {
    let stream = api.watch(wp, rv).await.expect("watch");
    let mut stream = Box::pin(stream);
    let mut out = Vec::new();
    while let Ok(Some(ev)) = tokio::time::timeout(Duration::from_secs(10), stream.next()).await {
        out.push(ev.expect("event decodes"));
        if out.len() >= max {
            break;
        }
    }
    out
}

fn kinds<K>(evs: &[WatchEvent<K>]) -> String {
    evs.iter()
        .map(|e| match e {
            WatchEvent::Added(_) => 'A',
            WatchEvent::Modified(_) => 'M',
            WatchEvent::Deleted(_) => 'D',
            WatchEvent::Bookmark(_) => 'B',
            WatchEvent::Error(_) => 'E',
        })
        .collect()
}

#[tokio::test]
async fn kube_client_pages_through_a_large_list_with_continue_tokens() {
    let sim = Sim::start(fast()).expect("start");
    let mut gen = WorkloadGen::new(1).namespaces(3);
    sim.bulk_load("pods", gen.pods(1_200)).expect("load");
    let api: Api<Pod> = Api::all(sim.client().expect("client"));
    let mut names = Vec::new();
    let mut token: Option<String> = None;
    let mut pages = 0;
    let mut first_rv = None;
    loop {
        let mut lp = ListParams::default().limit(500);
        if let Some(t) = &token {
            lp = lp.continue_token(t);
        }
        let page = api.list(&lp).await.expect("list");
        pages += 1;
        first_rv.get_or_insert(page.metadata.resource_version.clone());
        assert_eq!(
            Some(&page.metadata.resource_version),
            first_rv.as_ref(),
            "every page at the first page's RV"
        );
        names.extend(page.items.iter().map(|p| p.metadata.name.clone().unwrap_or_default()));
        match page.metadata.continue_ {
            Some(t) if !t.is_empty() => {
                assert_eq!(page.metadata.remaining_item_count, Some(1_200 - names.len() as i64));
                token = Some(t);
                // writes between pages do not show up: the list is consistent
                sim.create(
                    "pods",
                    Some("ns-0"),
                    json!({"metadata": {"name": format!("late-{pages}")}, "spec": {"containers": []}}),
                )
                .expect("create");
            }
            _ => break,
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(names.len(), 1_200);
    let mut sorted = names.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), 1_200);
    let c = sim.counters();
    assert_eq!(c.list_requests, 3);
    assert_eq!(c.list_objects, 1_200);

    // resourceVersion=0 is served from the "cache" and ignores limit
    // (kube::Client drops resourceVersion=0 when a limit is set, so this one is raw)
    let all = request(sim.addr(), "GET", "/api/v1/pods?resourceVersion=0&limit=10", None)
        .await
        .json();
    assert_eq!(all["items"].as_array().map(Vec::len), Some(1_202));
    assert!(all["metadata"].get("continue").is_none());
}

#[tokio::test]
async fn kube_watch_from_an_rv_sees_changes_in_order_then_a_bookmark_before_timeout() {
    let sim = Sim::start(fast()).expect("start");
    let api: Api<ConfigMap> = Api::namespaced(sim.client().expect("client"), "default");
    api.create(
        &PostParams::default(),
        &serde_json::from_value(cm("a", json!({}))).expect("cm"),
    )
    .await
    .expect("create");
    let rv = api
        .list(&ListParams::default())
        .await
        .expect("list")
        .metadata
        .resource_version
        .expect("rv");
    let writer = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        sim.create("configmaps", Some("default"), cm("b", json!({})))
            .expect("b");
        sim.patch("configmaps", Some("default"), "a", &json!({"data": {"k": "a2"}}))
            .expect("patch");
        sim.delete("configmaps", Some("default"), "b").expect("delete");
        sim.create("configmaps", Some("other"), cm("c", json!({})))
            .expect("other namespace");
    };
    let wp = WatchParams::default().timeout(1);
    let (evs, ()) = tokio::join!(collect(&api, &wp, &rv, 100), writer);
    assert_eq!(kinds(&evs), "AMDB");
    let rvs: Vec<u64> = evs
        .iter()
        .map(|e| match e {
            WatchEvent::Added(o) | WatchEvent::Modified(o) | WatchEvent::Deleted(o) => {
                o.metadata.resource_version.clone()
            }
            WatchEvent::Bookmark(b) => Some(b.metadata.resource_version.clone()),
            WatchEvent::Error(_) => None,
        })
        .map(|r| r.and_then(|r| r.parse().ok()).expect("rv"))
        .collect();
    assert!(rvs.windows(2).all(|w| w[0] < w[1]), "{rvs:?}");
    // the delete carries the deletion's RV; the bookmark the server's RV
    assert_eq!(rvs[3], sim.current_rv());
}

#[tokio::test]
async fn periodic_bookmarks_are_sent_only_when_allowed() {
    let sim = Sim::start(fast().bookmark_interval(Duration::from_millis(200))).expect("start");
    let api: Api<ConfigMap> = Api::all(sim.client().expect("client"));
    let rv = sim.current_rv().to_string();
    // A bookmark carries the watch cache's revision of the resource and is sent only past the
    // watch's start: one ConfigMap event gives the cache something to report.
    sim.create("configmaps", Some("default"), cm("one", json!({})))
        .expect("create");
    let with = collect(&api, &WatchParams::default().timeout(1), &rv, 100).await;
    assert!(
        kinds(&with).len() >= 4 && kinds(&with).starts_with('A') && kinds(&with)[1..].chars().all(|c| c == 'B'),
        "{}",
        kinds(&with)
    );
    let without = collect(&api, &WatchParams::default().timeout(1).disable_bookmarks(), &rv, 100).await;
    assert_eq!(kinds(&without), "A");
    // Nothing of this resource after the start: no bookmark, however long the watch.
    let now = sim.current_rv().to_string();
    let idle = collect(&api, &WatchParams::default().timeout(1), &now, 100).await;
    assert_eq!(kinds(&idle), "");
    assert!(sim.counters().bookmarks >= 3);
}

#[tokio::test]
async fn kube_runtime_watcher_works_with_streaming_lists_and_with_list_watch() {
    let sim = Sim::start(fast()).expect("start");
    for i in 0..5 {
        sim.create("configmaps", Some("default"), cm(&format!("c{i}"), json!({})))
            .expect("create");
    }
    let api: Api<ConfigMap> = Api::namespaced(sim.client().expect("client"), "default");
    for cfg in [
        watcher::Config::default().streaming_lists(),
        watcher::Config::default().page_size(2),
    ] {
        sim.reset_counters();
        let mut stream = Box::pin(watcher(api.clone(), cfg));
        let mut init = 0;
        loop {
            let ev = tokio::time::timeout(Duration::from_secs(10), stream.try_next())
                .await
                .expect("in time")
                .expect("ok");
            match ev {
                Some(watcher::Event::InitApply(_)) => init += 1,
                Some(watcher::Event::InitDone) => break,
                Some(_) => {}
                None => panic!("stream ended"),
            }
        }
        assert_eq!(init, 5);
        sim.create("configmaps", Some("default"), cm("live", json!({})))
            .expect("create");
        let ev = tokio::time::timeout(Duration::from_secs(10), stream.try_next())
            .await
            .expect("in time")
            .expect("ok");
        assert!(matches!(ev, Some(watcher::Event::Apply(c)) if c.metadata.name.as_deref() == Some("live")));
        let c = sim.counters();
        assert_eq!(c.watch_requests, 1);
        sim.delete("configmaps", Some("default"), "live").expect("delete");
    }
}

#[tokio::test]
async fn selectors_filter_lists_and_watches_and_an_object_leaving_the_selector_is_deleted() {
    let sim = Sim::start(fast()).expect("start");
    sim.create(
        "configmaps",
        Some("default"),
        cm("web-1", json!({"app": "web", "tier": "front", "rank": "10"})),
    )
    .expect("c");
    sim.create(
        "configmaps",
        Some("default"),
        cm("web-2", json!({"app": "web", "rank": "9"})),
    )
    .expect("c");
    sim.create("configmaps", Some("default"), cm("db-1", json!({"app": "db"})))
        .expect("c");
    let api: Api<ConfigMap> = Api::namespaced(sim.client().expect("client"), "default");
    let names = |l: kube::core::ObjectList<ConfigMap>| {
        let mut v: Vec<String> = l.items.into_iter().filter_map(|c| c.metadata.name).collect();
        v.sort();
        v
    };
    let table = [
        ("app=web", vec!["web-1", "web-2"]),
        ("app==db", vec!["db-1"]),
        ("app!=web", vec!["db-1"]),
        ("app in (db, web),tier", vec!["web-1"]),
        ("app notin (web)", vec!["db-1"]),
        ("!tier", vec!["db-1", "web-2"]),
        ("tier", vec!["web-1"]),
        // gt/lt compare integers (10 > 9, not as strings)
        ("rank>9", vec!["web-1"]),
        ("rank<10", vec!["web-2"]),
        ("rank>0,app=web", vec!["web-1", "web-2"]),
    ];
    for (sel, want) in table {
        assert_eq!(
            names(api.list(&ListParams::default().labels(sel)).await.expect(sel)),
            want,
            "{sel}"
        );
    }
    assert_eq!(
        names(
            api.list(&ListParams::default().fields("metadata.name=db-1"))
                .await
                .expect("f")
        ),
        vec!["db-1"]
    );
    assert_eq!(
        names(
            api.list(&ListParams::default().fields("metadata.name!=db-1,metadata.namespace=default"))
                .await
                .expect("f")
        ),
        vec!["web-1", "web-2"]
    );

    let rv = sim.current_rv().to_string();
    let writer = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        sim.patch(
            "configmaps",
            Some("default"),
            "web-2",
            &json!({"metadata": {"labels": {"app": "db"}}}),
        )
        .expect("leave");
        sim.patch(
            "configmaps",
            Some("default"),
            "db-1",
            &json!({"metadata": {"labels": {"app": "web"}}}),
        )
        .expect("enter");
        sim.patch("configmaps", Some("default"), "web-1", &json!({"data": {"x": "y"}}))
            .expect("stay");
        sim.patch("configmaps", Some("default"), "web-2", &json!({"data": {"x": "y"}}))
            .expect("outside");
    };
    let wp = WatchParams::default().labels("app=web").timeout(1).disable_bookmarks();
    let (evs, ()) = tokio::join!(collect(&api, &wp, &rv, 100), writer);
    assert_eq!(kinds(&evs), "DAM");
    if let WatchEvent::Deleted(o) = &evs[0] {
        assert_eq!(o.metadata.name.as_deref(), Some("web-2"));
        assert_eq!(
            o.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("app"))
                .map(String::as_str),
            Some("db")
        );
    }
}

#[tokio::test]
async fn pod_field_selectors_and_unsupported_fields() {
    let sim = Sim::start(fast()).expect("start");
    let mut gen = WorkloadGen::new(9).namespaces(2);
    let pods = gen.pods(60);
    let running = pods.iter().filter(|p| p["status"]["phase"] == "Running").count();
    let on_node_3 = pods.iter().filter(|p| p["spec"]["nodeName"] == "node-3").count();
    sim.bulk_load("pods", pods).expect("load");
    let api: Api<Pod> = Api::all(sim.client().expect("client"));
    let n = |l: kube::core::ObjectList<Pod>| l.items.len();
    assert_eq!(
        n(api
            .list(&ListParams::default().fields("status.phase=Running"))
            .await
            .expect("l")),
        running
    );
    assert_eq!(
        n(api
            .list(&ListParams::default().fields("status.phase!=Running"))
            .await
            .expect("l")),
        60 - running
    );
    assert_eq!(
        n(api
            .list(&ListParams::default().fields("spec.nodeName=node-3"))
            .await
            .expect("l")),
        on_node_3
    );
    assert_eq!(
        n(api
            .list(&ListParams::default().fields("metadata.namespace=ns-1"))
            .await
            .expect("l")),
        30
    );
    assert_eq!(
        api_code(api.list(&ListParams::default().fields("spec.bogus=x")).await),
        400
    );
    let cms: Api<ConfigMap> = Api::all(sim.client().expect("client"));
    assert_eq!(
        api_code(cms.list(&ListParams::default().fields("status.phase=Running")).await),
        400
    );
    // with a selector the page is filled with matches and remainingItemCount is omitted
    let page = api
        .list(&ListParams::default().fields("status.phase=Running").limit(2))
        .await
        .expect("page");
    assert_eq!(page.items.len(), 2.min(running));
    assert_eq!(page.metadata.remaining_item_count, None);
}

#[tokio::test]
async fn malformed_selectors_and_parameters_are_400_bad_request() {
    let sim = Sim::start(fast()).expect("start");
    let table = [
        ("labelSelector=app%20in%20web", "unable to parse requirement"),
        ("labelSelector=app%3D%3D%3Dx", "unable to parse requirement"),
        ("labelSelector=-bad%3Dx", "invalid label key"),
        ("labelSelector=a%3D-x", "invalid label value"),
        ("labelSelector=a%3Db%2C", "unable to parse requirement"),
        ("labelSelector=rank%3Ex", "must be an integer"),
        ("labelSelector=rank%3C1.5", "must be an integer"),
        ("fieldSelector=metadata.name", "can't understand"),
        ("fieldSelector=metadata.name%3Dx%3Dy", "can't understand"),
        ("limit=abc", "limit"),
        ("resourceVersion=abc", "resourceVersion"),
        ("continue=%%%garbage", "continue key is not valid"),
        ("continue=eyJub3QiOiJhIHRva2VuIn0", "continue key is not valid"),
        ("continue=bm90IGpzb24", "continue key is not valid"),
        (
            "continue=eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6MSwic3RhcnQiOiIuLi9ldGMifQ",
            "continue key is not valid",
        ),
    ];
    for (query, fragment) in table {
        for watch in ["", "watch=1&"] {
            if watch == "watch=1&" && (query.starts_with("limit") || query.starts_with("continue")) {
                continue;
            }
            let resp = request(sim.addr(), "GET", &format!("/api/v1/pods?{watch}{query}"), None).await;
            assert_eq!(
                resp.status,
                400,
                "{watch}{query}: {}",
                String::from_utf8_lossy(&resp.body)
            );
            let v = resp.json();
            assert_eq!(v["kind"], "Status");
            assert_eq!(v["reason"], "BadRequest");
            assert_eq!(v["code"], 400);
            assert!(
                v["message"].as_str().is_some_and(|m| m.contains(fragment)),
                "{query}: {}",
                v["message"]
            );
        }
    }
    // and through kube::Client
    let api: Api<Pod> = Api::all(sim.client().expect("client"));
    assert_eq!(
        api_code(api.list(&ListParams::default().labels("app in web")).await),
        400
    );
    assert_eq!(
        api_code(
            api.watch(&WatchParams::default().labels("!").timeout(1), "0")
                .await
                .map(|_| ())
        ),
        400
    );
    // resourceVersionMatch without resourceVersion, and a watch with it but no sendInitialEvents
    assert_eq!(
        request(sim.addr(), "GET", "/api/v1/pods?resourceVersionMatch=Exact", None)
            .await
            .status,
        422
    );
    assert_eq!(
        request(
            sim.addr(),
            "GET",
            "/api/v1/pods?watch=1&resourceVersion=1&resourceVersionMatch=NotOlderThan",
            None
        )
        .await
        .status,
        422
    );
}

#[tokio::test]
async fn history_window_by_count_and_by_age_expires_old_watches() {
    let sim = Sim::start(fast().history_max_events(5)).expect("start");
    let api: Api<ConfigMap> = Api::all(sim.client().expect("client"));
    let start = sim.current_rv();
    for i in 0..10 {
        sim.create("configmaps", Some("default"), cm(&format!("c{i}"), json!({})))
            .expect("c");
    }
    assert_eq!(sim.compacted_rv(), start + 5);
    let evs = collect(&api, &WatchParams::default().timeout(2), &start.to_string(), 10).await;
    assert_eq!(kinds(&evs), "E");
    if let WatchEvent::Error(s) = &evs[0] {
        assert_eq!((s.code, s.reason.as_str()), (410, "Expired"));
    }
    // the newest 5 events are still served
    let evs = collect(
        &api,
        &WatchParams::default().timeout(1).disable_bookmarks(),
        &(start + 5).to_string(),
        10,
    )
    .await;
    assert_eq!(kinds(&evs), "AAAAA");

    let sim = Sim::start(fast().history_max_age(Duration::from_millis(200))).expect("start");
    let start = sim.current_rv();
    sim.create("configmaps", Some("default"), cm("x", json!({})))
        .expect("c");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let resp = request(
        sim.addr(),
        "GET",
        &format!("/api/v1/configmaps?watch=1&resourceVersion={start}"),
        None,
    )
    .await;
    assert_eq!(resp.events()[0]["object"]["code"], 410);
}

#[tokio::test]
async fn restart_ends_open_watches_and_forgets_the_history() {
    let sim = Sim::start(fast()).expect("start");
    let api: Api<ConfigMap> = Api::all(sim.client().expect("client"));
    let rv = sim.current_rv();
    sim.create("configmaps", Some("default"), cm("a", json!({})))
        .expect("c");
    let started = std::time::Instant::now();
    let restarter = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        sim.restart();
    };
    let wp = WatchParams::default().timeout(30);
    let rv_s = rv.to_string();
    let (evs, ()) = tokio::join!(collect(&api, &wp, &rv_s, 100), restarter);
    assert_eq!(kinds(&evs), "A");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the watch ended at the restart"
    );
    let evs = collect(&api, &WatchParams::default().timeout(2), &rv.to_string(), 10).await;
    assert_eq!(kinds(&evs), "E");
    // the objects survived
    assert_eq!(api.list(&ListParams::default()).await.expect("list").items.len(), 1);
}

#[tokio::test]
async fn restoring_an_old_backup_moves_the_rv_back_and_a_later_rv_watch_is_silent() {
    let sim = Sim::start(fast()).expect("start");
    sim.create("configmaps", Some("default"), cm("kept", json!({})))
        .expect("c");
    let backup = sim.backup();
    for i in 0..5 {
        sim.create("configmaps", Some("default"), cm(&format!("lost-{i}"), json!({})))
            .expect("c");
    }
    let seen_rv = sim.current_rv();
    sim.restore_backup(&backup);
    assert_eq!(sim.current_rv(), backup.resource_version());
    assert!(sim.current_rv() < seen_rv);
    let api: Api<ConfigMap> = Api::all(sim.client().expect("client"));
    let l = api.list(&ListParams::default()).await.expect("list");
    assert_eq!(l.items.len(), 1);
    assert_eq!(l.metadata.resource_version, Some(backup.resource_version().to_string()));
    // a client that persisted `seen_rv` gets silence (kubernetes#107457)
    let evs = collect(&api, &WatchParams::default().timeout(1), &seen_rv.to_string(), 10).await;
    assert_eq!(kinds(&evs), "");
    // and new writes reuse RVs the client has already seen
    let again = sim
        .create("configmaps", Some("default"), cm("new", json!({})))
        .expect("c");
    assert!(
        again["metadata"]["resourceVersion"]
            .as_str()
            .and_then(|s| s.parse::<u64>().ok())
            .expect("rv")
            <= seen_rv
    );
}

#[tokio::test]
async fn writes_over_http_through_kube_client() {
    let widget = ResourceDef::custom("example.com", "v1", "Widget", "widgets");
    let sim = Sim::start(fast().with_resource(widget)).expect("start");
    let client = sim.client().expect("client");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod: Pod = serde_json::from_value(
        json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "x"}]}}),
    )
    .expect("pod");
    let created = pods.create(&PostParams::default(), &pod).await.expect("create");
    assert!(created.metadata.uid.is_some() && created.metadata.creation_timestamp.is_some());
    assert_eq!(api_code(pods.create(&PostParams::default(), &pod).await), 409);

    // replace with a stale RV conflicts; with the current one it works
    let mut stale = created.clone();
    stale.metadata.resource_version = Some("1".into());
    assert_eq!(api_code(pods.replace("p", &PostParams::default(), &stale).await), 409);
    let mut fresh = created.clone();
    fresh.metadata.labels = Some([("a".to_string(), "b".to_string())].into());
    let replaced = pods
        .replace("p", &PostParams::default(), &fresh)
        .await
        .expect("replace");
    assert!(replaced.metadata.resource_version > created.metadata.resource_version);

    // merge patch of the main resource ignores status; the status subresource sets it
    let patched = pods
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"c": "d"}}, "status": {"phase": "Failed"}})),
        )
        .await
        .expect("patch");
    assert_eq!(patched.metadata.labels.as_ref().map(|l| l.len()), Some(2));
    assert!(patched.status.as_ref().and_then(|s| s.phase.clone()).is_none());
    let st = pods
        .patch_status(
            "p",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Running"}})),
        )
        .await
        .expect("status");
    assert_eq!(st.status.clone().and_then(|s| s.phase).as_deref(), Some("Running"));
    // PUT /status: the status is replaced, a spec change in the same body is ignored
    let mut body = st.clone();
    body.status.get_or_insert_with(Default::default).phase = Some("Succeeded".into());
    if let Some(spec) = body.spec.as_mut() {
        spec.node_name = Some("changed-through-status".into());
    }
    let put = pods
        .replace_status("p", &PostParams::default(), &body)
        .await
        .expect("replace_status");
    assert_eq!(put.status.and_then(|s| s.phase).as_deref(), Some("Succeeded"));
    assert_eq!(put.spec.and_then(|s| s.node_name), None);
    assert!(put.metadata.resource_version > st.metadata.resource_version);
    let mut stale_status = body.clone();
    stale_status.metadata.resource_version = Some("1".into());
    assert_eq!(
        api_code(pods.replace_status("p", &PostParams::default(), &stale_status).await),
        409
    );
    let strategic = pods
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::Strategic(json!({"metadata": {"labels": {"a": null}}})),
        )
        .await
        .expect("strategic");
    assert_eq!(strategic.metadata.labels.map(|l| l.len()), Some(1));

    // delete returns the object; a second delete is 404
    pods.delete("p", &DeleteParams::default()).await.expect("delete");
    assert_eq!(api_code(pods.get("p").await), 404);
    assert_eq!(
        api_code(pods.delete("p", &DeleteParams::default()).await.map(|_| ())),
        404
    );

    // a custom resource registered at start, through discovery and DynamicObject
    let discovery = kube::Discovery::new(client.clone()).run().await.expect("discovery");
    assert!(discovery.has_group("example.com") && discovery.has_group("apps"));
    let (widget_ar, widget_caps) = discovery
        .resolve_gvk(&GroupVersionKind::gvk("example.com", "v1", "Widget"))
        .expect("Widget is discovered");
    assert_eq!(widget_ar.plural, "widgets");
    assert_eq!(widget_caps.scope, kube::discovery::Scope::Namespaced);
    assert!(widget_caps.subresources.iter().any(|(sub, _)| sub.plural == "status"));
    let (pod_ar, pod_caps) = discovery
        .resolve_gvk(&GroupVersionKind::gvk("", "v1", "Pod"))
        .expect("Pod is discovered");
    assert_eq!(
        (
            pod_ar.group.as_str(),
            pod_ar.api_version.as_str(),
            pod_ar.plural.as_str()
        ),
        ("", "v1", "pods")
    );
    assert_eq!(pod_caps.scope, kube::discovery::Scope::Namespaced);
    let (_, ns_caps) = discovery
        .resolve_gvk(&GroupVersionKind::gvk("", "v1", "Namespace"))
        .expect("Namespace is discovered");
    assert_eq!(ns_caps.scope, kube::discovery::Scope::Cluster);
    let ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("example.com", "v1", "Widget"), "widgets");
    let widgets: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar);
    let w: DynamicObject = serde_json::from_value(json!({"apiVersion": "example.com/v1", "kind": "Widget",
        "metadata": {"name": "w1"}, "spec": {"size": 3}}))
    .expect("widget");
    widgets.create(&PostParams::default(), &w).await.expect("create widget");
    let got = widgets.get("w1").await.expect("get widget");
    assert_eq!(got.data["spec"]["size"], 3);
    assert_eq!(got.metadata.generation, Some(1));
    // server-side apply (approximated as create-or-merge)
    widgets
        .patch(
            "w1",
            &PatchParams::apply("test"),
            &Patch::Apply(json!({"apiVersion": "example.com/v1", "kind": "Widget", "spec": {"size": 4}})),
        )
        .await
        .expect("apply");
    assert_eq!(widgets.get("w1").await.expect("get").metadata.generation, Some(2));

    // registering at run time
    sim.register_crd(ResourceDef::custom("example.com", "v1", "Gadget", "gadgets").cluster_scoped());
    sim.create("gadgets.example.com", None, json!({"metadata": {"name": "g"}}))
        .expect("gadget");
    let resp = request(sim.addr(), "GET", "/apis/example.com/v1/gadgets", None).await;
    assert_eq!(resp.json()["items"].as_array().map(Vec::len), Some(1));
    assert_eq!(sim.counters().write_requests, 13, "HTTP writes only");
}

#[tokio::test]
async fn injected_faults_are_observable_by_clients() {
    let sim = Sim::start(fast()).expect("start");
    for i in 0..10 {
        sim.create("configmaps", Some("default"), cm(&format!("c{i}"), json!({})))
            .expect("c");
    }
    let addr = sim.addr();

    // 429 with Retry-After, then 500, each for the next request of its kind only
    sim.faults()
        .fail_next(FaultTarget::List, Failure::TooManyRequests { retry_after_secs: 2 }, 1);
    let r = request(addr, "GET", "/api/v1/configmaps?watch=1&timeoutSeconds=1", None).await;
    assert_eq!(r.status, 200, "a watch is not a list");
    let r = request(addr, "GET", "/api/v1/configmaps", None).await;
    assert_eq!(
        (r.status, r.headers.get("retry-after").map(String::as_str)),
        (429, Some("2"))
    );
    assert_eq!(r.json()["reason"], "TooManyRequests");
    assert_eq!(request(addr, "GET", "/api/v1/configmaps", None).await.status, 200);
    sim.faults().fail_next(FaultTarget::Any, Failure::InternalError, 2);
    assert_eq!(request(addr, "GET", "/api/v1/configmaps", None).await.status, 500);
    assert_eq!(
        request(addr, "GET", "/api/v1/configmaps?watch=1", None).await.status,
        500
    );
    assert_eq!(request(addr, "GET", "/api/v1/configmaps", None).await.status, 200);

    // drop a watch after k events
    sim.faults().drop_watch_after(Some(3));
    let r = request(addr, "GET", "/api/v1/configmaps?watch=1&timeoutSeconds=10", None).await;
    assert_eq!(r.events().len(), 3);
    sim.faults().drop_watch_after(None);

    // cut a chunk in half: the connection is aborted in the middle of an event line
    sim.faults().cut_next_watches(1);
    let r = request(addr, "GET", "/api/v1/configmaps?watch=1&timeoutSeconds=10", None).await;
    assert!(
        !r.body.is_empty() && !r.body.ends_with(b"\n"),
        "partial line: {:?}",
        String::from_utf8_lossy(&r.body)
    );
    assert!(serde_json::from_slice::<Value>(&r.body).is_err());

    // stall: headers, then nothing — not even at timeoutSeconds
    sim.faults().stall_next_watches(1);
    let stalled = tokio::time::timeout(
        Duration::from_millis(1500),
        request(addr, "GET", "/api/v1/configmaps?watch=1&timeoutSeconds=1", None),
    )
    .await;
    assert!(stalled.is_err(), "a stalled watch never ends by itself");

    // delay
    sim.faults().delay(Duration::from_millis(300));
    let t = std::time::Instant::now();
    assert_eq!(request(addr, "GET", "/api/v1/configmaps", None).await.status, 200);
    assert!(t.elapsed() >= Duration::from_millis(300));
    sim.faults().clear();

    // kube::Client retries a 429 after Retry-After by default; without retries it sees the error
    sim.faults()
        .fail_next(FaultTarget::List, Failure::TooManyRequests { retry_after_secs: 1 }, 1);
    sim.reset_counters();
    let api: Api<ConfigMap> = Api::all(sim.client().expect("client"));
    assert_eq!(api.list(&ListParams::default()).await.expect("retried").items.len(), 10);
    assert_eq!(sim.counters().list_requests, 2);
    sim.faults()
        .fail_next(FaultTarget::List, Failure::TooManyRequests { retry_after_secs: 1 }, 1);
    let api: Api<ConfigMap> = Api::all(no_retry_client(&sim));
    assert_eq!(api_code(api.list(&ListParams::default()).await), 429);
}

#[tokio::test]
async fn counters_count_lists_objects_watches_events_and_bytes() {
    let sim = Sim::start(fast()).expect("start");
    for i in 0..4 {
        sim.create("configmaps", Some("default"), cm(&format!("c{i}"), json!({})))
            .expect("c");
    }
    sim.reset_counters();
    let addr = sim.addr();
    let l = request(addr, "GET", "/api/v1/namespaces/default/configmaps?limit=3", None).await;
    let w = request(addr, "GET", "/api/v1/configmaps?watch=1&timeoutSeconds=1", None).await;
    let c = sim.counters();
    assert_eq!(
        (c.list_requests, c.list_objects, c.watch_requests, c.watch_events),
        (1, 3, 1, 4)
    );
    assert_eq!(c.bytes_served, (l.body.len() + w.body.len()) as u64);
    sim.reset_counters();
    assert_eq!(sim.counters(), Default::default());
}

#[tokio::test]
async fn exact_and_not_older_than_lists_through_kube() {
    let sim = Sim::start(fast()).expect("start");
    sim.create("configmaps", Some("default"), cm("a", json!({})))
        .expect("c");
    let rv = sim.current_rv();
    sim.create("configmaps", Some("default"), cm("b", json!({})))
        .expect("c");
    let api: Api<ConfigMap> = Api::all(sim.client().expect("client"));
    let exact = api
        .list(&ListParams::default().at(&rv.to_string()).matching(VersionMatch::Exact))
        .await
        .expect("exact");
    assert_eq!(exact.items.len(), 1);
    let newer = api
        .list(
            &ListParams::default()
                .at(&rv.to_string())
                .matching(VersionMatch::NotOlderThan),
        )
        .await
        .expect("not older");
    assert_eq!(newer.items.len(), 2);
    // too large: 504 after the configured wait, unless the server catches up meanwhile
    let future = sim.current_rv() + 1;
    let future_s = future.to_string();
    let lp = ListParams::default().at(&future_s).matching(VersionMatch::NotOlderThan);
    let list = api.list(&lp);
    let writer = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        sim.create("configmaps", Some("default"), cm("c", json!({})))
            .expect("c");
    };
    let (r, ()) = tokio::join!(list, writer);
    assert_eq!(r.expect("caught up").items.len(), 3);
    let far = (sim.current_rv() + 10).to_string();
    let api: Api<ConfigMap> = Api::all(no_retry_client(&sim));
    assert_eq!(
        api_code(
            api.list(&ListParams::default().at(&far).matching(VersionMatch::NotOlderThan))
                .await
        ),
        504
    );
}

#[test]
fn workload_is_deterministic_and_pods_are_about_4kb() {
    let a = WorkloadGen::new(5).namespaces(3).pods(50);
    let b = WorkloadGen::new(5).namespaces(3).pods(50);
    assert_eq!(a, b);
    assert_ne!(a, WorkloadGen::new(6).namespaces(3).pods(50));
    let avg = a
        .iter()
        .map(|p| serde_json::to_vec(p).expect("json").len())
        .sum::<usize>()
        / a.len();
    assert!((3_500..=5_000).contains(&avg), "pod size {avg}");
    assert!(a[0]["metadata"]["managedFields"].is_array() && a[0]["metadata"]["ownerReferences"].is_array());
    let namespaces: std::collections::BTreeSet<String> = a
        .iter()
        .map(|p| p["metadata"]["namespace"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(namespaces.len(), 3);

    let run = || {
        let sim = Sim::start(fast()).expect("start");
        let gen = WorkloadGen::new(1).namespaces(2);
        let mut churn = Churn::new(3, "configmaps", gen.namespace_names());
        let stats = churn.step(&sim, 300).expect("churn");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("rt");
        let list: Vec<Value> = rt.block_on(async {
            request(sim.addr(), "GET", "/api/v1/configmaps", None).await.json()["items"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        });
        let view: Vec<(Value, Value, Value)> = list
            .iter()
            .map(|o| {
                (
                    o["metadata"]["name"].clone(),
                    o["metadata"]["resourceVersion"].clone(),
                    o["data"].clone(),
                )
            })
            .collect();
        (stats, view, sim.current_rv())
    };
    let (s1, v1, rv1) = run();
    let (s2, v2, rv2) = run();
    assert_eq!((s1, &v1, rv1), (s2, &v2, rv2));
    assert_eq!(s1.creates + s1.updates + s1.deletes, 300);
    assert!(s1.deletes > 0 && s1.updates > 0);
}

#[test]
fn dropping_the_handle_stops_the_server() {
    let sim = Sim::start(fast()).expect("start");
    let addr = sim.addr();
    assert!(std::net::TcpStream::connect(addr).is_ok());
    drop(sim);
    std::thread::sleep(Duration::from_millis(100));
    assert!(std::net::TcpStream::connect(addr).is_err());
}

const STREAMING: &str = "watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true";

fn bookmark_rvs(events: &[Value]) -> Vec<u64> {
    events
        .iter()
        .filter(|e| e["type"] == "BOOKMARK")
        .map(|e| {
            e["object"]["metadata"]["resourceVersion"]
                .as_str()
                .and_then(|s| s.parse().ok())
                .expect("bookmark rv")
        })
        .collect()
}

#[tokio::test]
async fn streaming_list_not_older_than_a_future_rv_waits_for_it_or_is_504() {
    // nobody writes: after the wait the answer is 504 ResourceVersionTooLarge, no stream
    let sim = Sim::start(fast()).expect("start");
    let cur = sim.current_rv();
    let started = std::time::Instant::now();
    let resp = request(
        sim.addr(),
        "GET",
        &format!(
            "/api/v1/configmaps?{STREAMING}&resourceVersion={}&timeoutSeconds=1",
            cur + 3
        ),
        None,
    )
    .await;
    assert!(
        started.elapsed() >= Duration::from_millis(200),
        "waited too_large_rv_wait"
    );
    assert_eq!(resp.status, 504, "{}", String::from_utf8_lossy(&resp.body));
    let v = resp.json();
    assert_eq!(v["reason"], "Timeout");
    assert_eq!(v["details"]["causes"][0]["reason"], "ResourceVersionTooLarge");

    // the revision is reached during the wait: initial state at or after it, bookmarks never below
    let sim = Sim::start(fast().too_large_rv_wait(Duration::from_secs(10))).expect("start");
    let want = sim.current_rv() + 3;
    let writer = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        for i in 0..3 {
            sim.create("configmaps", Some("default"), cm(&format!("w{i}"), json!({})))
                .expect("create");
        }
    };
    let path = format!("/api/v1/configmaps?{STREAMING}&resourceVersion={want}&timeoutSeconds=1");
    let (resp, ()) = tokio::join!(request(sim.addr(), "GET", &path, None), writer);
    assert_eq!(resp.status, 200, "{}", String::from_utf8_lossy(&resp.body));
    let ev = resp.events();
    let added: Vec<&str> = ev
        .iter()
        .filter(|e| e["type"] == "ADDED")
        .filter_map(|e| e["object"]["metadata"]["name"].as_str())
        .collect();
    assert_eq!(added, ["w0", "w1", "w2"], "the initial state is the one at {want}");
    assert_eq!(ev[3]["type"], "BOOKMARK");
    assert_eq!(
        ev[3]["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
    let rvs = bookmark_rvs(&ev);
    assert!(!rvs.is_empty() && rvs.iter().all(|&r| r >= want), "{rvs:?} vs {want}");
}

#[tokio::test]
async fn no_pre_timeout_bookmark_when_the_timeout_is_shorter_than_the_pre_timeout() {
    // default: the last bookmark 2 s before the deadline
    let sim = Sim::start(SimConfig::default()).expect("start");
    let rv = sim.current_rv();
    sim.create("configmaps", Some("default"), cm("one", json!({})))
        .expect("create");
    let cache_rv = sim.current_rv();
    let path =
        |t: u32| format!("/api/v1/configmaps?watch=1&allowWatchBookmarks=true&resourceVersion={rv}&timeoutSeconds={t}");
    let (p1, p3) = (path(1), path(3));
    let (short, long) = tokio::join!(
        request(sim.addr(), "GET", &p1, None),
        request(sim.addr(), "GET", &p3, None)
    );
    assert_eq!(short.status, 200);
    assert_eq!(
        bookmark_rvs(&short.events()),
        Vec::<u64>::new(),
        "a 1 s watch gets no bookmark"
    );
    // control: with room for it, the pre-timeout bookmark is sent (once)
    assert_eq!(bookmark_rvs(&long.events()), vec![cache_rv]);
}

#[tokio::test]
async fn send_initial_events_false_with_not_older_than_is_a_plain_watch() {
    let sim = Sim::start(fast()).expect("start");
    sim.create("configmaps", Some("default"), cm("before", json!({})))
        .expect("create");
    let rv = sim.current_rv();
    let base = "/api/v1/configmaps?watch=1&sendInitialEvents=false&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=1";
    let writer = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        sim.create("configmaps", Some("default"), cm("after", json!({})))
            .expect("create");
    };
    let (at_rv, at_latest) = (
        format!("{base}&resourceVersion={rv}"),
        format!("{base}&resourceVersion="),
    );
    let (from_rv, latest, ()) = tokio::join!(
        request(sim.addr(), "GET", &at_rv, None),
        request(sim.addr(), "GET", &at_latest, None),
        writer
    );
    for resp in [from_rv, latest] {
        assert_eq!(resp.status, 200, "{}", String::from_utf8_lossy(&resp.body));
        let names: Vec<String> = resp
            .events()
            .iter()
            .filter(|e| e["type"] != "BOOKMARK")
            .map(|e| {
                format!(
                    "{} {}",
                    e["type"].as_str().unwrap_or("?"),
                    e["object"]["metadata"]["name"]
                )
            })
            .collect();
        assert_eq!(names, ["ADDED \"after\""], "no synthetic ADDED for the existing object");
    }
    // still invalid without NotOlderThan
    let bad = request(
        sim.addr(),
        "GET",
        "/api/v1/configmaps?watch=1&sendInitialEvents=false&allowWatchBookmarks=true&resourceVersion=1",
        None,
    )
    .await;
    assert_eq!(bad.status, 422);
}

#[test]
fn configmaps_and_deployments_have_their_documented_sizes_and_shapes() {
    let avg = |objs: &[Value]| {
        objs.iter()
            .map(|o| serde_json::to_vec(o).expect("json").len())
            .sum::<usize>()
            / objs.len().max(1)
    };
    let mut gen = WorkloadGen::new(11).namespaces(2);
    let cms = gen.configmaps(40);
    let deps = gen.deployments(40);
    // documented as about 0.2 KB and about 0.6 KB
    assert!((150..=350).contains(&avg(&cms)), "configmap size {}", avg(&cms));
    assert!((450..=800).contains(&avg(&deps)), "deployment size {}", avg(&deps));
    assert!(cms.iter().all(|c| c["data"].as_object().is_some_and(|d| !d.is_empty())));
    assert!(deps
        .iter()
        .all(|d| d["spec"]["template"]["spec"]["containers"].is_array() && d["spec"]["selector"].is_object()));
    // the server accepts them as they are
    let sim = Sim::start(fast()).expect("start");
    sim.bulk_load("configmaps", cms).expect("configmaps load");
    sim.bulk_load("deployments", deps).expect("deployments load");
}

/// With the test clock paused, `Churn::run` paces exactly: 10 ms steps, never ahead of
/// `ops_per_sec × elapsed`, and every counted operation is one revision on the server.
#[tokio::test(start_paused = true)]
async fn churn_run_paces_operations_at_the_requested_rate() {
    let sim = Sim::start(fast()).expect("start");
    for (rate, secs) in [(200u64, 1u64), (50, 2)] {
        // a namespace per run: both churns name their objects churn-1, churn-2, …
        let mut churn = Churn::new(rate, "configmaps", vec![format!("rate-{rate}")]);
        let before = sim.current_rv();
        let s = churn.run(&sim, rate, Duration::from_secs(secs)).await.expect("churn");
        let ops = s.creates + s.updates + s.deletes;
        let budget = rate * secs;
        // the last 10 ms step is not taken: at least 98% of the budget, never more
        assert!(
            ops <= budget && ops * 100 >= budget * 98,
            "{ops} ops at {rate}/s for {secs} s"
        );
        assert_eq!(sim.current_rv() - before, ops, "each operation is one write");
    }
}

/// On the real clock only the upper bound is certain (a slow machine does fewer operations).
#[tokio::test]
async fn churn_run_never_exceeds_the_rate_on_the_real_clock() {
    let sim = Sim::start(fast()).expect("start");
    let mut churn = Churn::new(4, "pods", vec!["default".into()]);
    let before = sim.current_rv();
    let s = churn.run(&sim, 300, Duration::from_millis(500)).await.expect("churn");
    let ops = s.creates + s.updates + s.deletes;
    assert!(ops > 0 && ops <= 150, "{ops} ops");
    assert_eq!(sim.current_rv() - before, ops);
}

/// The keys of a JSON object, sorted.
fn keys(v: &Value) -> Vec<&str> {
    let mut k: Vec<&str> = v
        .as_object()
        .map(|o| o.keys().map(String::as_str).collect())
        .unwrap_or_default();
    k.sort_unstable();
    k
}

#[tokio::test]
async fn namespace_and_node_bookmarks_have_the_go_servers_empty_object_shape() {
    use k8s_openapi::api::core::v1::{Namespace, Node};
    let sim = Sim::start(fast()).expect("start");
    sim.create("nodes", None, json!({"metadata": {"name": "node-a"}}))
        .expect("node");
    let bookmarks = |events: Vec<Value>| -> Vec<Value> {
        let b: Vec<Value> = events
            .into_iter()
            .filter(|e| e["type"] == "BOOKMARK")
            .map(|e| e["object"].clone())
            .collect();
        // The initial-events-end one (a later one only once the resource changes).
        assert!(!b.is_empty(), "{b:?}");
        b
    };
    let ns_path = format!("/api/v1/namespaces?{STREAMING}&timeoutSeconds=1");
    let no_path = format!("/api/v1/nodes?{STREAMING}&timeoutSeconds=1");
    let (ns, no) = tokio::join!(
        request(sim.addr(), "GET", &ns_path, None),
        request(sim.addr(), "GET", &no_path, None)
    );
    let top = vec!["apiVersion", "kind", "metadata", "spec", "status"];
    for ns in bookmarks(ns.events()) {
        assert_eq!(keys(&ns), top, "{ns}");
        assert_eq!(
            (&ns["kind"], &ns["spec"], &ns["status"]),
            (&json!("Namespace"), &json!({}), &json!({}))
        );
        serde_json::from_value::<Namespace>(ns).expect("a Namespace");
    }
    for no in bookmarks(no.events()) {
        assert_eq!(keys(&no), top, "{no}");
        assert_eq!((&no["kind"], &no["spec"]), (&json!("Node"), &json!({})));
        // Structs that Go's omitempty keeps: the empty daemonEndpoints and nodeInfo.
        assert_eq!(keys(&no["status"]), vec!["daemonEndpoints", "nodeInfo"], "{no}");
        assert_eq!(no["status"]["daemonEndpoints"], json!({"kubeletEndpoint": {"Port": 0}}));
        let info = &no["status"]["nodeInfo"];
        assert_eq!(keys(info).len(), 10, "{info}");
        assert!(info.as_object().is_some_and(|o| o.values().all(|v| v == "")), "{info}");
        serde_json::from_value::<Node>(no).expect("a Node");
    }

    // And through kube's watcher with streaming lists: the seeded namespaces, then InitDone.
    let api: Api<Namespace> = Api::all(sim.client().expect("client"));
    let mut stream = Box::pin(watcher(api, watcher::Config::default().streaming_lists()));
    let mut names = Vec::new();
    loop {
        let ev = tokio::time::timeout(Duration::from_secs(10), stream.try_next())
            .await
            .expect("in time")
            .expect("decodes");
        match ev {
            Some(watcher::Event::InitApply(n)) => names.extend(n.metadata.name),
            Some(watcher::Event::InitDone) => break,
            Some(_) => {}
            None => panic!("stream ended"),
        }
    }
    names.sort();
    assert_eq!(names, ["default", "kube-public", "kube-system"]);
}

#[tokio::test]
async fn an_rv0_list_answers_the_watch_caches_revision_which_other_resources_do_not_move() {
    let sim = Sim::start(fast()).expect("start");
    sim.create("configmaps", Some("default"), cm("one", json!({})))
        .expect("create");
    let cm_rv = sim.current_rv();
    for i in 0..3 {
        sim.create(
            "leases",
            Some("kube-node-lease"),
            json!({"metadata": {"name": format!("node-{i}"), "namespace": "kube-node-lease"}}),
        )
        .expect("lease");
    }
    assert_eq!(sim.current_rv(), cm_rv + 3, "one global revision");
    let list_rv = |path: String| {
        let addr = sim.addr();
        async move {
            let r = request(addr, "GET", &path, None).await;
            assert_eq!(r.status, 200);
            let body: Value = serde_json::from_slice(&r.body).expect("json");
            let rv: u64 = body["metadata"]["resourceVersion"]
                .as_str()
                .and_then(|s| s.parse().ok())
                .expect("rv");
            (rv, body["items"].as_array().map_or(0, Vec::len))
        }
    };
    // The probe the reflector sends on a resume: from the cache, matching no object.
    let probe = format!(
        "/api/v1/configmaps?resourceVersion=0&fieldSelector={}",
        durable_informer::source::REVISION_PROBE_SELECTOR.replace('=', "%3D")
    );
    assert_eq!(list_rv(probe).await, (cm_rv, 0));
    // A consistent list reads "etcd": the global revision.
    assert_eq!(list_rv("/api/v1/configmaps".into()).await, (cm_rv + 3, 1));
    // The Leases' own cache is at their last write.
    assert_eq!(
        list_rv("/apis/coordination.k8s.io/v1/leases?resourceVersion=0".into()).await,
        (cm_rv + 3, 3)
    );
}

/// The benchmark's fast write path stores exactly what a merge patch of the same label would,
/// and watchers see it as an ordinary MODIFIED event.
#[tokio::test]
async fn a_prebuilt_write_equals_the_same_label_patch() {
    let sim = Sim::start(fast()).expect("sim");
    for name in ["fast", "slow"] {
        sim.create("configmaps", Some("default"), cm(name, json!({"app": "web"})))
            .expect("create");
    }
    let api: Api<ConfigMap> = Api::namespaced(sim.client().expect("client"), "default");
    let from = sim.current_rv();
    let mut events = api
        .watch(&WatchParams::default(), &from.to_string())
        .await
        .expect("watch")
        .boxed();
    let pre = sim
        .prebuild("configmaps", Some("default"), "fast", "latency")
        .expect("prebuild");
    let mut rvs = Vec::new();
    for value in ["1", "22", "333"] {
        rvs.push(sim.write_prebuilt(&pre, value).expect("write"));
    }
    let patched = sim
        .patch(
            "configmaps",
            Some("default"),
            "slow",
            &json!({"metadata": {"labels": {"latency": "333"}}}),
        )
        .expect("patch");
    let fast = sim.get("configmaps", Some("default"), "fast").expect("get");
    let strip = |mut v: Value| {
        let m = v["metadata"].as_object_mut().expect("metadata");
        for k in ["name", "uid", "resourceVersion", "creationTimestamp"] {
            m.remove(k);
        }
        v["data"] = json!(null);
        v
    };
    assert_eq!(fast["metadata"]["resourceVersion"], json!(rvs[2].to_string()));
    assert_eq!(
        strip(fast),
        strip(patched),
        "the same object but for name, uid, RV and data"
    );
    for (i, value) in ["1", "22", "333"].iter().enumerate() {
        match events.try_next().await.expect("event") {
            Some(WatchEvent::Modified(cm)) => {
                assert_eq!(cm.metadata.resource_version, Some(rvs[i].to_string()));
                assert_eq!(
                    cm.metadata
                        .labels
                        .unwrap_or_default()
                        .get("latency")
                        .map(String::as_str),
                    Some(*value)
                );
            }
            other => panic!("expected MODIFIED, got {other:?}"),
        }
    }
    let selected = api
        .list(&ListParams::default().labels("latency=333"))
        .await
        .expect("list");
    assert_eq!(selected.items.len(), 2, "the label index sees the prebuilt write");
    assert!(sim.write_prebuilt(&pre, "needs\"escaping").is_err());
    sim.delete("configmaps", Some("default"), "fast").expect("delete");
    assert!(
        sim.write_prebuilt(&pre, "4").is_err(),
        "a deleted object is not written back"
    );
}

#[tokio::test]
async fn finalizers_hold_a_deleted_object_until_the_last_one_is_removed() {
    let sim = Sim::start(fast()).expect("start");
    let client = sim.client().expect("client");
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    let mut v = cm("held", json!({}));
    v["metadata"]["finalizers"] = json!(["example.com/a", "example.com/b"]);
    let created = cms
        .create(&PostParams::default(), &serde_json::from_value(v).expect("cm"))
        .await
        .expect("create");
    let rv0 = created.metadata.resource_version.clone().expect("rv");

    // Only a delete sets a deletionTimestamp.
    let early = json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}});
    let r = cms.patch("held", &PatchParams::default(), &Patch::Merge(&early)).await;
    assert_eq!(api_code(r), 422);

    // The delete only marks it: 202 with the object, deletionTimestamp set, still readable.
    let marked = cms.delete("held", &DeleteParams::default()).await.expect("delete");
    let marked = marked.left().expect("a terminating object, not a Status");
    assert!(marked.metadata.deletion_timestamp.is_some(), "{marked:?}");
    let got = cms.get("held").await.expect("still there");
    assert_eq!(got.metadata.deletion_timestamp, marked.metadata.deletion_timestamp);
    // Deleting again changes nothing.
    let again = cms
        .delete("held", &DeleteParams::default())
        .await
        .expect("delete again");
    assert_eq!(
        again.left().expect("object").metadata.resource_version,
        got.metadata.resource_version
    );

    // No new finalizer on a terminating object; its deletionTimestamp cannot be cleared.
    let add = json!({"metadata": {"finalizers": ["example.com/a", "example.com/b", "example.com/c"]}});
    let r = cms.patch("held", &PatchParams::default(), &Patch::Merge(&add)).await;
    assert_eq!(api_code(r), 422);
    let clear = json!({"metadata": {"deletionTimestamp": null, "labels": {"x": "y"}}});
    let kept = cms
        .patch("held", &PatchParams::default(), &Patch::Merge(&clear))
        .await
        .expect("patch labels");
    assert!(kept.metadata.deletion_timestamp.is_some());

    // Removing one finalizer (JSON patch with a test, as kube's finalizer helper does) keeps
    // it; removing the last one deletes it.
    let ops = |i: usize, name: &str| -> json_patch::Patch {
        serde_json::from_value(json!([
            {"op": "test", "path": format!("/metadata/finalizers/{i}"), "value": name},
            {"op": "remove", "path": format!("/metadata/finalizers/{i}")},
        ]))
        .expect("patch")
    };
    cms.patch(
        "held",
        &PatchParams::default(),
        &Patch::Json::<()>(ops(0, "example.com/a")),
    )
    .await
    .expect("remove a");
    assert!(cms.get_opt("held").await.expect("get").is_some());
    cms.patch(
        "held",
        &PatchParams::default(),
        &Patch::Json::<()>(ops(0, "example.com/b")),
    )
    .await
    .expect("remove b");
    assert!(cms.get_opt("held").await.expect("get").is_none());

    // Watchers saw the mark, the label, the first removal as MODIFIED, then one DELETED.
    let evs = collect(&cms, &WatchParams::default().timeout(1), &rv0, 4).await;
    assert_eq!(kinds(&evs), "MMMD", "{evs:?}");

    // kube's helper adds a finalizer with `test` of null on the absent field first.
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(cm("fresh", json!({}))).expect("cm"),
    )
    .await
    .expect("create fresh");
    let add: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/finalizers", "value": null},
        {"op": "add", "path": "/metadata/finalizers", "value": ["example.com/a"]},
    ]))
    .expect("patch");
    let added = cms
        .patch("fresh", &PatchParams::default(), &Patch::Json::<()>(add))
        .await
        .expect("add finalizer");
    assert_eq!(added.metadata.finalizers, Some(vec!["example.com/a".to_string()]));
}
