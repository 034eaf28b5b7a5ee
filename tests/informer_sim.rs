//! Informers against the simulated cluster: the factory over three resource types, listers
//! compared with the server's own selector answers, and a `kube::runtime::Controller` driven
//! through the adaptor.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use durable_informer::informer::{watcher_stream, InformerFactory};
use durable_informer::sim::workload::WorkloadGen;
use durable_informer::sim::{Sim, SimConfig};
use durable_informer::store::{DurableStore, StoreConfig};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, ListParams};
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
    let configmaps = factory.informer::<ConfigMap>(None).await.unwrap();
    let deployments = factory.informer::<Deployment>(None).await.unwrap();
    assert_ne!(pods.scope(), configmaps.scope());
    factory.start();
    tokio::time::timeout(Duration::from_secs(20), factory.wait_for_cache_sync())
        .await
        .unwrap();
    assert!(pods.has_synced() && configmaps.has_synced() && deployments.has_synced());

    // Listers answer like the server for the same selector.
    let client = sim.client().unwrap();
    for selector in ["app", "!app", "tier in (web,cache)", "app!=web"] {
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
        assert_eq!(ours, theirs, "selector {selector:?}");
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
    assert_eq!(ours, theirs);
    assert_eq!(configmaps.store().list().unwrap().len(), 20);

    drop((pods, pods_again, configmaps, deployments));
    factory.shutdown().await.unwrap();
    // Shut down cleanly: the file opens at once, passes an integrity check and `check`.
    let db = DurableStore::open(StoreConfig::new(&path).check_integrity(true)).unwrap();
    assert!(db.check().unwrap().is_ok());
    assert_eq!(db.scopes().unwrap().len(), 3);
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
    configmaps.wait_for_sync().await;

    let (reader, writer) = reflector::store::<ConfigMap>();
    let stream = reflector(writer, watcher_stream(&configmaps)).applied_objects();
    let reconciled = Arc::new(AtomicUsize::new(0));
    let counter = reconciled.clone();
    let controller = Controller::for_stream(stream, reader)
        .run(
            move |_cm: Arc<ConfigMap>, ctx: Arc<AtomicUsize>| async move {
                ctx.fetch_add(1, Ordering::SeqCst);
                Ok::<_, std::convert::Infallible>(Action::await_change())
            },
            |_, _, _| Action::requeue(Duration::from_secs(1)),
            counter,
        )
        .for_each(|_| async {});
    let task = tokio::spawn(controller);
    for _ in 0..200 {
        if reconciled.load(Ordering::SeqCst) >= 20 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(
        reconciled.load(Ordering::SeqCst) >= 20,
        "every ConfigMap reconciled: {}",
        reconciled.load(Ordering::SeqCst)
    );
    task.abort();
    drop(configmaps);
    factory.shutdown().await.unwrap();
}

/// The factory shares by scope, not by Rust type: a typed and a dynamic informer of the same
/// resource, namespace and selectors are one informer with one reflector.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_typed_and_a_dynamic_informer_of_one_scope_share_one_reflector() {
    use kube::core::{ApiResource, DynamicObject};
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
        .unwrap();
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
