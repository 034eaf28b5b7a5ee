//! Informers against the simulated cluster: the factory over three resource types, listers
//! compared with the server's own selector answers, and a `kube::runtime::Controller` driven
//! through the adaptor.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use durable_informer::informer::{handler_fn, watcher_stream, Event, EventHandler, HandlerOptions, InformerFactory};
use durable_informer::sim::workload::{Churn, WorkloadGen};
use durable_informer::sim::{Sim, SimConfig};
use durable_informer::store::{DurableStore, StoreConfig};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, ListParams, WatchEvent, WatchParams};
use kube::core::ApiResource;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::{reflector, WatchStreamExt};

async fn sim() -> Sim {
    tokio::task::spawn_blocking(|| {
        let sim = Sim::start(SimConfig::default().bookmark_interval(Duration::from_millis(300))).unwrap();
        let mut gen = WorkloadGen::new(3).namespaces(3);
        sim.bulk_load("namespaces", gen.namespace_objects()).unwrap();
        sim.bulk_load("pods", gen.pods(60)).unwrap();
        sim.bulk_load("configmaps", gen.configmaps(20)).unwrap();
        sim.bulk_load("deployments", gen.deployments(10)).unwrap();
        sim
    })
    .await
    .unwrap()
}

fn names<K: kube::Resource>(items: impl IntoIterator<Item = K>) -> Vec<String> {
    let mut v: Vec<String> = items
        .into_iter()
        .map(|o| {
            format!(
                "{}/{}",
                o.meta().namespace.clone().unwrap_or_default(),
                o.meta().name.clone().unwrap_or_default()
            )
        })
        .collect();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_factory_shares_scopes_syncs_three_types_and_shuts_down_cleanly() {
    let sim = sim().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("factory.redb");
    let factory = InformerFactory::new(
        DurableStore::open(StoreConfig::new(&path)).unwrap(),
        sim.client().unwrap(),
        &sim.url(),
    );
    let pods = factory.informer::<Pod>(None).await.unwrap();
    let pods_again = factory.informer::<Pod>(None).await.unwrap();
    assert_eq!(
        pods.scope(),
        pods_again.scope(),
        "the same scope gives the same informer"
    );
    // The shared Pod scope alone first: one reflector, so one identity GET, the pods sent once
    // (its streaming initial list) and at most two WATCH requests (that list, then its watch).
    // Two reflectors would double each.
    sim.reset_counters();
    factory.start();
    tokio::time::timeout(Duration::from_secs(20), factory.wait_for_cache_sync())
        .await
        .unwrap()
        .expect("cache synced");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let c = sim.counters();
    assert_eq!(c.get_requests, 1, "{c:?}");
    assert!(c.watch_requests <= 2 && c.list_requests == 0, "{c:?}");
    assert_eq!(c.watch_events, 60, "the pods were sent once: {c:?}");

    let configmaps = factory.informer::<ConfigMap>(None).await.unwrap();
    let deployments = factory.informer::<Deployment>(None).await.unwrap();
    assert_ne!(pods.scope(), configmaps.scope());
    factory.start();
    tokio::time::timeout(Duration::from_secs(20), factory.wait_for_cache_sync())
        .await
        .unwrap()
        .expect("cache synced");
    assert!(pods.has_synced() && configmaps.has_synced() && deployments.has_synced());

    // Listers answer like the server for the same selector; each selector picks some pods but
    // not all, so a lister that ignores it (or negates it) differs.
    let client = sim.client().unwrap();
    for selector in [
        "tier=frontend",
        "app in (web,api),tier!=backend",
        "app notin (web)",
        "tier,app!=db",
    ] {
        let ours = names(
            pods.lister()
                .list(&selector.parse().unwrap())
                .unwrap()
                .iter()
                .map(|p| (**p).clone()),
        );
        let theirs = names(
            Api::<Pod>::all(client.clone())
                .list(&ListParams::default().labels(selector))
                .await
                .unwrap()
                .items,
        );
        assert!(
            !theirs.is_empty() && theirs.len() < 60,
            "{selector:?} discriminates: {}",
            theirs.len()
        );
        assert_eq!(ours, theirs, "selector {selector:?}");
        for ns in WorkloadGen::new(3).namespaces(3).namespace_names() {
            let ours = names(
                pods.lister()
                    .namespace(&ns)
                    .list(&selector.parse().unwrap())
                    .unwrap()
                    .iter()
                    .map(|p| (**p).clone()),
            );
            let theirs = names(
                Api::<Pod>::namespaced(client.clone(), &ns)
                    .list(&ListParams::default().labels(selector))
                    .await
                    .unwrap()
                    .items,
            );
            assert_eq!(ours, theirs, "selector {selector:?} in {ns}");
        }
    }
    let ns = WorkloadGen::new(3).namespaces(3).namespace_names()[0].clone();
    let ours = names(
        deployments
            .lister()
            .namespace(&ns)
            .list(&Default::default())
            .unwrap()
            .iter()
            .map(|d| (**d).clone()),
    );
    let theirs = names(
        Api::<Deployment>::namespaced(client.clone(), &ns)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items,
    );
    assert!(!theirs.is_empty());
    assert_eq!(ours, theirs);
    // get: a present name gives the server's object (same RV), an absent one None like the
    // server's 404; the present name is absent from the other namespaces.
    let present = theirs[0].split('/').nth(1).unwrap().to_owned();
    let server = Api::<Deployment>::namespaced(client.clone(), &ns)
        .get_opt(&present)
        .await
        .unwrap()
        .unwrap();
    let ours = deployments.lister().namespace(&ns).get(&present).unwrap().unwrap();
    assert_eq!(ours.metadata.resource_version, server.metadata.resource_version);
    assert_eq!(ours.metadata.uid, server.metadata.uid);
    for (ns, name) in [(ns.as_str(), "no-such-deployment"), ("ns-1", present.as_str())] {
        let server = Api::<Deployment>::namespaced(client.clone(), ns)
            .get_opt(name)
            .await
            .unwrap();
        assert!(server.is_none(), "{ns}/{name} is absent on the server");
        assert!(
            deployments.lister().namespace(ns).get(name).unwrap().is_none(),
            "{ns}/{name}"
        );
    }
    assert_eq!(configmaps.store().list().unwrap().len(), 20);

    // A copy taken while the database is open needs redb's repair: the check below can fail.
    let open_copy = dir.path().join("open-copy.redb");
    std::fs::copy(&path, &open_copy).unwrap();
    assert!(needs_repair(&open_copy), "a file copied while open needs repair");

    drop((pods, pods_again, configmaps, deployments));
    factory.shutdown().await.unwrap();
    // Shut down cleanly: redb opens the file without repair, and it passes `check`.
    assert!(!needs_repair(&path), "the shut-down database needed repair");
    let db = DurableStore::open(StoreConfig::new(&path).check_integrity(true)).unwrap();
    assert!(db.check().unwrap().is_ok());
    assert_eq!(db.scopes().unwrap().len(), 3);
}

/// Whether redb runs its repair when opening `path` (a file not closed cleanly).
fn needs_repair(path: &std::path::Path) -> bool {
    let repaired = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = repaired.clone();
    let db = redb::Database::builder()
        .set_repair_callback(move |_| flag.store(true, Ordering::SeqCst))
        .open(path)
        .unwrap();
    drop(db);
    repaired.load(Ordering::SeqCst)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kube_runtime_controller_reconciles_through_the_adaptor() {
    let sim = sim().await;
    let dir = tempfile::tempdir().unwrap();
    let factory = InformerFactory::new(
        DurableStore::open(StoreConfig::new(dir.path().join("c.redb"))).unwrap(),
        sim.client().unwrap(),
        &sim.url(),
    );
    let configmaps = factory.informer::<ConfigMap>(None).await.unwrap();
    factory.start();
    configmaps.wait_for_sync().await.expect("cache synced");

    let (reader, writer) = reflector::store::<ConfigMap>();
    let stream = reflector(writer, watcher_stream(&configmaps)).applied_objects();
    let reconciled: Arc<Mutex<HashSet<String>>> = Arc::default();
    let controller = Controller::for_stream(stream, reader)
        .run(
            |cm: Arc<ConfigMap>, ctx: Arc<Mutex<HashSet<String>>>| async move {
                ctx.lock().unwrap().insert(names([(*cm).clone()]).remove(0));
                Ok::<_, std::convert::Infallible>(Action::await_change())
            },
            |_, _, _| Action::requeue(Duration::from_secs(1)),
            reconciled.clone(),
        )
        .for_each(|_| async {});
    let task = tokio::spawn(controller);
    let want = names(
        Api::<ConfigMap>::all(sim.client().unwrap())
            .list(&ListParams::default())
            .await
            .unwrap()
            .items,
    );
    assert_eq!(want.len(), 20);
    eventually("every ConfigMap reconciled", || {
        reconciled.lock().unwrap().len() >= want.len()
    })
    .await;
    let got: Vec<String> = {
        let mut v: Vec<String> = reconciled.lock().unwrap().iter().cloned().collect();
        v.sort();
        v
    };
    assert_eq!(got, want, "each ConfigMap reconciled, by name");

    // A ConfigMap created after the start reaches the controller through the live log.
    tokio::task::block_in_place(|| {
        sim.create(
            "configmaps",
            Some("ns-2"),
            serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "created-later", "namespace": "ns-2"}, "data": {"k": "v"}}),
        )
    })
    .unwrap();
    eventually("the new ConfigMap reconciled", || {
        reconciled.lock().unwrap().contains("ns-2/created-later")
    })
    .await;
    assert_eq!(reconciled.lock().unwrap().len(), 21);
    task.abort();
    drop(configmaps);
    factory.shutdown().await.unwrap();
}

/// The factory shares by scope, not by Rust type: a typed and a dynamic informer of the same
/// resource, namespace and selectors are one informer with one reflector.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_typed_and_a_dynamic_informer_of_one_scope_share_one_reflector() {
    use kube::core::DynamicObject;
    let sim = sim().await;
    let dir = tempfile::tempdir().unwrap();
    let factory = InformerFactory::new(
        DurableStore::open(StoreConfig::new(dir.path().join("shared.redb"))).unwrap(),
        sim.client().unwrap(),
        &sim.url(),
    );
    let typed = factory.informer::<Pod>(Some("ns-1")).await.unwrap();
    let dynamic = factory
        .informer_for::<DynamicObject>(ApiResource::erase::<Pod>(&()), Some("ns-1"), None, None, Vec::new())
        .await
        .unwrap();
    assert_eq!(typed.scope(), dynamic.scope());
    let want = names(
        Api::<Pod>::namespaced(sim.client().unwrap(), "ns-1")
            .list(&ListParams::default())
            .await
            .unwrap(),
    );
    assert!(!want.is_empty());
    sim.reset_counters();
    factory.start();
    tokio::time::timeout(Duration::from_secs(20), factory.wait_for_cache_sync())
        .await
        .unwrap()
        .expect("cache synced");
    assert!(typed.has_synced() && dynamic.has_synced());
    assert_eq!(
        names(
            dynamic
                .lister()
                .list(&Default::default())
                .unwrap()
                .iter()
                .map(|o| (**o).clone())
        ),
        want
    );
    assert_eq!(
        names(
            typed
                .lister()
                .list(&Default::default())
                .unwrap()
                .iter()
                .map(|o| (**o).clone())
        ),
        want
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    let c = sim.counters();
    // One reflector: one identity GET, one initial list (a streaming list, whose events are
    // the pods once), then its watch. Two would double each.
    assert_eq!(c.get_requests, 1, "{c:?}");
    assert_eq!(c.watch_events, want.len() as u64, "{c:?}");
    assert!(c.list_requests + c.watch_requests <= 2, "{c:?}");
    factory.shutdown().await.unwrap();
}

/// What a handler or a raw watch saw: event type, `namespace/name`, resourceVersion.
type Seen = (String, String, String);

fn seen_of(kind: &str, p: &Pod) -> Seen {
    (
        kind.to_owned(),
        format!(
            "{}/{}",
            p.metadata.namespace.clone().unwrap_or_default(),
            p.metadata.name.clone().unwrap_or_default()
        ),
        p.metadata.resource_version.clone().unwrap_or_default(),
    )
}

/// A handler that records every event with its `initial` flag.
fn recorder(into: Arc<Mutex<Vec<(Seen, bool)>>>) -> impl EventHandler<Pod> {
    handler_fn(move |ev: Event<Pod>| -> Result<(), std::convert::Infallible> {
        let (kind, initial) = match &ev {
            Event::Add { initial, .. } => ("ADDED", *initial),
            Event::Update { .. } => ("MODIFIED", false),
            Event::Delete { .. } => ("DELETED", false),
        };
        let rec = (seen_of(kind, ev.object()), initial);
        into.lock().unwrap().push(rec);
        Ok(())
    })
}

/// The server's own event sequence for a scope: a raw `Api::watch` from `from` (not
/// `watcher`, which may relist), resumed from the last seen RV when the server ends it.
/// `reached` follows the newest RV seen, bookmarks included.
fn raw_watch(api: Api<Pod>, labels: Option<&'static str>, from: u64) -> (Arc<Mutex<Vec<Seen>>>, Arc<AtomicU64>) {
    let events: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let reached = Arc::new(AtomicU64::new(from));
    let (ev, rc) = (events.clone(), reached.clone());
    tokio::spawn(async move {
        let mut wp = WatchParams::default().timeout(30);
        if let Some(l) = labels {
            wp = wp.labels(l);
        }
        loop {
            let rv = rc.load(Ordering::SeqCst).to_string();
            let Ok(stream) = api.watch(&wp, &rv).await else {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            let mut stream = std::pin::pin!(stream);
            while let Some(item) = stream.next().await {
                let (seen, rv) = match item {
                    Ok(WatchEvent::Added(p)) => (Some(seen_of("ADDED", &p)), p.metadata.resource_version),
                    Ok(WatchEvent::Modified(p)) => (Some(seen_of("MODIFIED", &p)), p.metadata.resource_version),
                    Ok(WatchEvent::Deleted(p)) => (Some(seen_of("DELETED", &p)), p.metadata.resource_version),
                    Ok(WatchEvent::Bookmark(b)) => (None, Some(b.metadata.resource_version)),
                    // A gap in the truth would make the comparison meaningless: stop reporting
                    // progress, so the test fails on its deadline.
                    Ok(WatchEvent::Error(e)) => panic!("truth watch failed: {e:?}"),
                    Err(_) => break,
                };
                ev.lock().unwrap().extend(seen);
                if let Some(n) = rv.and_then(|r| r.parse::<u64>().ok()) {
                    rc.fetch_max(n, Ordering::SeqCst);
                }
            }
        }
    });
    (events, reached)
}

async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Every handler, volatile or durable, of every scope (all namespaces, one namespace, a label
/// selector) receives the initial list as `Add { initial: true }` and then exactly the server's
/// watch sequence for its scope, event by event, under churn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_handler_receives_the_sims_event_sequence() {
    let sim = sim().await;
    let dir = tempfile::tempdir().unwrap();
    let factory = InformerFactory::new(
        DurableStore::open(StoreConfig::new(dir.path().join("seq.redb"))).unwrap(),
        sim.client().unwrap(),
        &sim.url(),
    );
    let pod = ApiResource::erase::<Pod>(&());
    let scopes: [(Option<&str>, Option<&'static str>); 3] =
        [(None, None), (Some("ns-1"), None), (None, Some("app=web"))];
    let mut informers = Vec::new();
    let mut recorded = Vec::new();
    for (ns, labels) in scopes {
        let informer = factory
            .informer_for::<Pod>(pod.clone(), ns, labels, None, Vec::new())
            .await
            .unwrap();
        for opts in [HandlerOptions::volatile(), HandlerOptions::durable("seq")] {
            let into: Arc<Mutex<Vec<(Seen, bool)>>> = Arc::default();
            informer.add_event_handler(recorder(into.clone()), opts);
            recorded.push((ns, labels, into));
        }
        informers.push(informer);
    }
    factory.start();
    tokio::time::timeout(Duration::from_secs(60), factory.wait_for_cache_sync())
        .await
        .unwrap()
        .expect("cache synced");

    // Nothing changes before the churn: each scope's initial list is what the server lists now.
    let client = sim.client().unwrap();
    let api = |ns: Option<&str>| match ns {
        Some(ns) => Api::<Pod>::namespaced(client.clone(), ns),
        None => Api::<Pod>::all(client.clone()),
    };
    let from = sim.current_rv();
    let mut truths = Vec::new();
    for (ns, labels) in scopes {
        let mut lp = ListParams::default();
        if let Some(l) = labels {
            lp = lp.labels(l);
        }
        let mut listed: Vec<Seen> = api(ns)
            .list(&lp)
            .await
            .unwrap()
            .items
            .iter()
            .map(|p| seen_of("ADDED", p))
            .collect();
        listed.sort();
        // The narrower scopes are real subsets, so a handler given another scope's events fails.
        if ns.is_some() || labels.is_some() {
            assert!(
                !listed.is_empty() && listed.len() < 60,
                "{ns:?} {labels:?}: {}",
                listed.len()
            );
        }
        truths.push((listed, raw_watch(api(ns), labels, from)));
    }

    let mut churn = Churn::new(11, "pods", WorkloadGen::new(3).namespaces(3).namespace_names());
    tokio::task::block_in_place(|| churn.adopt_existing(&sim)).unwrap();
    for _ in 0..8 {
        tokio::task::block_in_place(|| churn.step(&sim, 25)).unwrap();
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    let target = sim.current_rv();
    for (_, (_, reached)) in &truths {
        eventually("the raw watches to reach the sim's RV", || {
            reached.load(Ordering::SeqCst) >= target
        })
        .await;
    }

    for (i, (ns, labels, into)) in recorded.iter().enumerate() {
        let (listed, (watched, _)) = &truths[i / 2];
        let watched = watched.lock().unwrap().clone();
        assert!(!watched.is_empty(), "the churn touches scope {ns:?} {labels:?}");
        let split = |all: &[(Seen, bool)]| {
            let n = all.iter().take_while(|(_, initial)| *initial).count();
            let mut initial: Vec<Seen> = all[..n].iter().map(|(s, _)| s.clone()).collect();
            initial.sort();
            let rest: Vec<(Seen, bool)> = all[n..].to_vec();
            (initial, rest)
        };
        let want_rest: Vec<(Seen, bool)> = watched.iter().map(|s| (s.clone(), false)).collect();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
        loop {
            let (initial, rest) = split(&into.lock().unwrap());
            if (&initial, &rest) == (listed, &want_rest) || tokio::time::Instant::now() >= deadline {
                assert_eq!(&initial, listed, "initial list of handler {i} ({ns:?} {labels:?})");
                assert_eq!(rest, want_rest, "events of handler {i} ({ns:?} {labels:?})");
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    drop(informers);
    factory.shutdown().await.unwrap();
}

/// An `Informer<DynamicObject>` built directly (no factory) over a grouped resource: its
/// lister matches the server, and its handler gets the initial list then a live update and
/// delete with the server's resourceVersions and the objects' own fields.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dynamic_object_informer_lists_and_delivers_like_a_typed_one() {
    use durable_informer::informer::Informer;
    use durable_informer::source::KubeSource;
    use kube::core::DynamicObject;
    let sim = sim().await;
    let dir = tempfile::tempdir().unwrap();
    let db = DurableStore::open(StoreConfig::new(dir.path().join("dyn.redb"))).unwrap();
    let source =
        KubeSource::new(sim.client().unwrap(), &sim.url(), ApiResource::erase::<Deployment>(&())).namespace("ns-1");
    let informer = Informer::<DynamicObject>::builder(&db, source).build().await.unwrap();
    // (event type, name, resourceVersion, spec.replicas)
    type Got = (String, String, String, Option<i64>);
    let seen: Arc<Mutex<Vec<Got>>> = Arc::default();
    let into = seen.clone();
    informer.add_event_handler(
        handler_fn(
            move |ev: Event<DynamicObject>| -> Result<(), std::convert::Infallible> {
                let kind = match &ev {
                    Event::Add { .. } => "ADDED",
                    Event::Update { .. } => "MODIFIED",
                    Event::Delete { .. } => "DELETED",
                };
                let o = ev.object();
                into.lock().unwrap().push((
                    kind.to_owned(),
                    o.metadata.name.clone().unwrap_or_default(),
                    o.metadata.resource_version.clone().unwrap_or_default(),
                    o.data["spec"]["replicas"].as_i64(),
                ));
                Ok(())
            },
        ),
        HandlerOptions::volatile(),
    );
    informer.start();
    tokio::time::timeout(Duration::from_secs(20), informer.wait_for_sync())
        .await
        .unwrap()
        .expect("cache synced");

    let api = Api::<Deployment>::namespaced(sim.client().unwrap(), "ns-1");
    let listed = api.list(&ListParams::default()).await.unwrap();
    let want = names(listed.items.clone());
    assert!(!want.is_empty() && want.len() < 10, "{want:?}");
    let ours = informer.lister().namespace("ns-1").list(&Default::default()).unwrap();
    assert_eq!(names(ours.iter().map(|o| (**o).clone())), want);
    let first = ours[0].clone();
    assert_eq!(first.types.as_ref().map(|t| t.kind.as_str()), Some("Deployment"));
    assert!(first.data["spec"]["replicas"].is_i64(), "{:?}", first.data);
    let synced = informer
        .last_synced_resource_version()
        .and_then(|rv| rv.as_u64())
        .unwrap();
    assert!(synced >= listed.metadata.resource_version.unwrap().parse::<u64>().unwrap());

    let name = first.metadata.name.clone().unwrap();
    let patched = tokio::task::block_in_place(|| {
        sim.patch(
            "deployments",
            Some("ns-1"),
            &name,
            &serde_json::json!({"spec": {"replicas": 7}}),
        )
    })
    .unwrap();
    let deleted = tokio::task::block_in_place(|| sim.delete("deployments", Some("ns-1"), &name)).unwrap();
    let rv = |v: &serde_json::Value| v["metadata"]["resourceVersion"].as_str().unwrap().to_owned();
    let expected = want.len() + 2;
    eventually("the update and the delete", || seen.lock().unwrap().len() >= expected).await;
    let got = seen.lock().unwrap().clone();
    assert_eq!(got.len(), expected, "{got:?}");
    let mut initial: Vec<String> = got[..want.len()]
        .iter()
        .map(|(kind, n, _, _)| format!("{kind} ns-1/{n}"))
        .collect();
    initial.sort();
    assert_eq!(initial, want.iter().map(|n| format!("ADDED {n}")).collect::<Vec<_>>());
    assert_eq!(
        got[want.len()..],
        [
            ("MODIFIED".to_owned(), name.clone(), rv(&patched), Some(7)),
            ("DELETED".to_owned(), name.clone(), rv(&deleted), Some(7)),
        ]
    );
    informer.shutdown().await.unwrap();
}

/// Deliver before the fsync: with a durable commit an hour away, a volatile handler and the
/// lister see a change at once, a durable handler only once it is on disk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_handler_receives_only_what_is_on_disk() {
    let sim = sim().await;
    let dir = tempfile::tempdir().unwrap();
    let db =
        DurableStore::open(StoreConfig::new(dir.path().join("db.redb")).fsync_delay(Some(Duration::from_secs(3600))))
            .unwrap();
    let source = durable_informer::source::KubeSource::typed::<Pod>(sim.client().unwrap(), &sim.url());
    let informer = durable_informer::informer::Informer::<Pod>::builder(&db, source)
        .build()
        .await
        .unwrap();
    let volatile: Arc<Mutex<Vec<(Seen, bool)>>> = Arc::default();
    let durable: Arc<Mutex<Vec<(Seen, bool)>>> = Arc::default();
    let _v = informer.add_event_handler(recorder(volatile.clone()), HandlerOptions::volatile());
    let _d = informer.add_event_handler(recorder(durable.clone()), HandlerOptions::durable("on-disk"));
    informer.start();
    tokio::time::timeout(Duration::from_secs(20), informer.wait_for_sync())
        .await
        .unwrap()
        .expect("cache synced");
    eventually("both handlers got the initial adds", || {
        volatile.lock().unwrap().len() == 60 && durable.lock().unwrap().len() == 60
    })
    .await;
    let pod = informer
        .lister()
        .list(&durable_informer::selector::LabelSelector::everything())
        .unwrap()
        .remove(0);
    let (ns, name) = (
        pod.metadata.namespace.clone().unwrap(),
        pod.metadata.name.clone().unwrap(),
    );
    // The durable handler's cursor saves and the removal of its initial adds' marker are
    // durable commits: one landing after the update's deferred commit would put that on disk
    // too. So they all land first: its stored cursor is at the last commit (a handler that
    // started before the list was committed gets the 60 adds from the log, and saves its
    // cursor after them; CI lost that race at load 4, and so did one run in seven with twelve
    // runs at a time).
    let writer = db.writer();
    let scope = informer.scope();
    eventually(
        "the durable handler's cursor is stored at the last commit, its marker gone, all on disk",
        || {
            let committed = *writer.committed().borrow();
            db.log().cursor(scope, "on-disk").ok().flatten() == Some(committed)
                && _d.cursor() == committed
                && db.log().cursor(scope, "on-disk#initial-adds").ok() == Some(None)
                && *writer.durable().borrow() == committed
        },
    )
    .await;
    sim.patch(
        "pods",
        Some(&ns),
        &name,
        &serde_json::json!({"metadata": {"labels": {"changed": "yes"}}}),
    )
    .unwrap();
    eventually("the volatile handler got the update", || {
        volatile.lock().unwrap().len() == 61
    })
    .await;
    let seen = informer.lister().namespace(&ns).get(&name).unwrap().unwrap();
    assert_eq!(
        seen.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("changed"))
            .map(String::as_str),
        Some("yes"),
        "the lister has it"
    );
    // The handler may run before the group's (relaxed) commit, which follows at once; the
    // durable commit does not.
    eventually("committed, not on disk yet", || {
        *writer.durable().borrow() < *writer.committed().borrow()
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        durable.lock().unwrap().len(),
        60,
        "the durable handler waits for the disk"
    );
    writer.flush().await.unwrap();
    assert_eq!(*writer.durable().borrow(), *writer.committed().borrow());
    eventually("the durable handler got it once on disk", || {
        durable.lock().unwrap().len() == 61
    })
    .await;
    informer.shutdown().await.unwrap();
}

/// Every request names this crate in its `User-Agent`, after the controller's own agent when
/// one is set, so the API server's audit log and Priority and Fairness can tell them apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_carry_the_user_agent() {
    let sim = sim().await;
    let dir = tempfile::tempdir().unwrap();
    let db = DurableStore::open(StoreConfig::new(dir.path().join("db.redb"))).unwrap();
    let source = durable_informer::source::KubeSource::typed::<Pod>(sim.client().unwrap(), &sim.url())
        .user_agent("my-controller/1.2");
    let informer = durable_informer::informer::Informer::<Pod>::builder(&db, source)
        .build()
        .await
        .unwrap();
    informer.start();
    tokio::time::timeout(Duration::from_secs(20), informer.wait_for_sync())
        .await
        .unwrap()
        .expect("cache synced");
    informer.shutdown().await.unwrap();
    let ours = format!("my-controller/1.2 {}", durable_informer::source::USER_AGENT);
    let seen = sim.user_agents();
    assert!(seen.contains(&ours), "{seen:?}");
    assert!(
        durable_informer::source::USER_AGENT.starts_with("durable-informer/"),
        "{}",
        durable_informer::source::USER_AGENT
    );
    assert!(
        !seen.iter().any(|a| a.contains("my-controller") && a != &ours),
        "one agent for every request of the source: {seen:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_informer_from_a_kube_api_reads_its_namespace_and_shares_the_cluster_identity_with_a_url_source() {
    use durable_informer::informer::Informer;
    use durable_informer::source::KubeSource;

    let sim = sim().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("api.redb");
    let ns = Api::<ConfigMap>::all(sim.client().unwrap())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find_map(|c| c.metadata.namespace)
        .expect("a namespaced ConfigMap");
    let want: Vec<String> = names(
        Api::<ConfigMap>::namespaced(sim.client().unwrap(), &ns)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items,
    );
    {
        let db = DurableStore::open(StoreConfig::new(&path)).unwrap();
        // No server URL anywhere: the type and the namespace come from the Api.
        let informer = Informer::from_api(&db, Api::<ConfigMap>::namespaced(sim.client().unwrap(), &ns))
            .build()
            .await
            .unwrap();
        informer.start();
        tokio::time::timeout(Duration::from_secs(20), informer.wait_for_sync())
            .await
            .unwrap()
            .expect("cache synced");
        let got = names(
            informer
                .lister()
                .state()
                .unwrap()
                .into_iter()
                .map(|c| c.as_ref().clone()),
        );
        assert_eq!(got, want, "exactly the Api's namespace");
        let first = &want[0];
        let name = first.split_once('/').unwrap().1;
        let by_ref = informer
            .lister()
            .get_ref(&kube::runtime::reflector::ObjectRef::<ConfigMap>::new(name).within(&ns))
            .unwrap();
        assert_eq!(by_ref.and_then(|c| c.metadata.name.clone()).as_deref(), Some(name));
        let found = informer
            .lister()
            .find(|c| c.metadata.name.as_deref() == Some(name))
            .unwrap();
        assert_eq!(found.and_then(|c| c.metadata.namespace.clone()), Some(ns.clone()));
        assert!(informer.lister().find(|_| false).unwrap().is_none());
        let by_key = informer
            .lister()
            .get_by_key(&durable_informer::object::ObjectKey::namespaced(&ns, name))
            .unwrap();
        assert!(by_key.is_some());
        informer.shutdown().await.unwrap();
        drop(informer);
        tokio::task::spawn_blocking(move || db.close()).await.unwrap().unwrap();
    }
    // The same database through a URL-based source: one cluster (same kube-system UID), so
    // it resumes instead of being refused as another cluster's.
    let db = DurableStore::open(StoreConfig::new(&path)).unwrap();
    let informer = Informer::<ConfigMap>::builder(
        &db,
        KubeSource::typed::<ConfigMap>(sim.client().unwrap(), &sim.url()).namespace(&ns),
    )
    .build()
    .await
    .unwrap();
    assert!(informer.is_restored());
    informer.start();
    tokio::time::timeout(Duration::from_secs(20), informer.wait_for_sync())
        .await
        .unwrap()
        .expect("the same cluster: resumed, not refused");
    informer.shutdown().await.unwrap();
}
