//! How an informer names its cluster (`ClusterIdentity`) and takes kube's `watcher::Config`,
//! against the simulated cluster.

use std::time::Duration;

use durable_informer::informer::{Informer, InformerError};
use durable_informer::reflector::ReflectorError;
use durable_informer::sim::workload::WorkloadGen;
use durable_informer::sim::{Sim, SimConfig};
use durable_informer::source::ClusterIdentity;
use durable_informer::store::{DurableStore, StoreConfig};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, ListParams};
use kube::runtime::watcher;
use kube::ResourceExt;

/// A server without `kube-system` (as a namespace-scoped operator sees it: 404 and 403 are
/// treated alike), whose `team-a` namespace publishes `ca` as the root CA.
fn cluster(ca: &str) -> Sim {
    let sim = Sim::start(
        SimConfig::default()
            .seed_namespaces(false)
            .bookmark_interval(Duration::from_millis(200)),
    )
    .unwrap();
    sim.create(
        "namespaces",
        None,
        serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}),
    )
    .unwrap();
    sim.create(
        "configmaps",
        Some("team-a"),
        serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "kube-root-ca.crt", "namespace": "team-a"}, "data": {"ca.crt": ca}}),
    )
    .unwrap();
    sim.create(
        "configmaps",
        Some("team-a"),
        serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings", "namespace": "team-a"}, "data": {"k": "v"}}),
    )
    .unwrap();
    sim
}

/// Runs an informer of team-a's ConfigMaps built from an `Api` alone over `db` until it syncs
/// or stops; returns the outcome.
async fn run_once(db: &DurableStore, sim: &Sim, identity: Option<ClusterIdentity>) -> Result<(), InformerError> {
    let mut b = Informer::from_api(db, Api::<ConfigMap>::namespaced(sim.client().unwrap(), "team-a"));
    if let Some(id) = identity {
        b = b.cluster_identity(id);
    }
    let informer = b.build().await?;
    informer.start();
    let synced = tokio::time::timeout(Duration::from_secs(20), informer.wait_for_sync())
        .await
        .expect("synced or stopped in time");
    informer.shutdown().await.ok();
    synced
}

fn is_mismatch(r: &Result<(), InformerError>) -> bool {
    match r {
        Err(InformerError::NotSynced { last_error, .. }) => {
            last_error.as_deref().is_some_and(|e| e.contains("belongs to cluster"))
        }
        Err(InformerError::Reflector(ReflectorError::ClusterMismatch(_))) => true,
        _ => false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_a_namespaced_operator_is_identified_by_the_root_ca() {
    let (a, b) = tokio::task::spawn_blocking(|| (cluster("CERT-A"), cluster("CERT-B")))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let db = DurableStore::open(StoreConfig::new(dir.path().join("i.redb"))).unwrap();
    run_once(&db, &a, None)
        .await
        .expect("kube-system unreadable: the root CA names the cluster");
    let id = db.cluster_identity().unwrap().unwrap();
    assert!(id.starts_with("ca:"), "{id}");
    // The same cluster again: accepted.
    run_once(&db, &a, None).await.unwrap();
    // Another cluster (another CA) with the same database: refused, with the reason.
    let other = run_once(&db, &b, None).await;
    assert!(is_mismatch(&other), "{other:?}");
    assert_eq!(
        db.cluster_identity().unwrap().as_deref(),
        Some(id.as_str()),
        "unchanged"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_clusters_are_compared_by_name_and_need_no_request() {
    let a = tokio::task::spawn_blocking(|| cluster("CERT-A")).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let db = DurableStore::open(StoreConfig::new(dir.path().join("i.redb"))).unwrap();
    a.reset_counters();
    run_once(&db, &a, Some(ClusterIdentity::named("prod@eu")))
        .await
        .unwrap();
    assert_eq!(a.counters().get_requests, 0, "no identity request");
    assert_eq!(db.cluster_identity().unwrap().as_deref(), Some("name:prod%40eu"));
    run_once(&db, &a, Some(ClusterIdentity::named("prod@eu")))
        .await
        .unwrap();
    // `@` is escaped, so a name is never compared as a UID: prod@us is another cluster.
    let other = run_once(&db, &a, Some(ClusterIdentity::named("prod@us"))).await;
    assert!(is_mismatch(&other), "{other:?}");
    // The root CA form is another name again.
    let ca = run_once(&db, &a, Some(ClusterIdentity::root_ca())).await;
    assert!(is_mismatch(&ca), "{ca:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_access_the_error_says_what_to_grant() {
    let sim = tokio::task::spawn_blocking(|| Sim::start(SimConfig::default().seed_namespaces(false)).unwrap())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let db = DurableStore::open(StoreConfig::new(dir.path().join("i.redb"))).unwrap();
    // KubeSystemUid refuses at once without kube-system; RootCa retries while the ConfigMap is
    // missing. Both name what to grant.
    for (identity, hint) in [
        (ClusterIdentity::KubeSystemUid, "namespaces/kube-system"),
        (ClusterIdentity::root_ca(), "kube-root-ca.crt"),
    ] {
        let informer = Informer::from_api(&db, Api::<ConfigMap>::namespaced(sim.client().unwrap(), "default"))
            .cluster_identity(identity.clone())
            .build()
            .await
            .unwrap();
        informer.start();
        let mut told = false;
        for _ in 0..100 {
            if informer.errors().iter().any(|e| e.contains(hint)) {
                told = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(told, "{identity:?}: {:?}", informer.errors());
        assert!(!informer.has_synced());
        informer.shutdown().await.ok();
    }
    assert_eq!(db.cluster_identity().unwrap(), None, "nothing stored");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_config_sets_selectors_page_size_and_the_list_strategy() {
    let sim = tokio::task::spawn_blocking(|| {
        let sim = Sim::start(SimConfig::default().bookmark_interval(Duration::from_millis(200))).unwrap();
        let mut gen = WorkloadGen::new(5).namespaces(2);
        sim.bulk_load("namespaces", gen.namespace_objects()).unwrap();
        sim.bulk_load("pods", gen.pods(50)).unwrap();
        sim
    })
    .await
    .unwrap();
    let selector = "tier=frontend";
    let expected: Vec<String> = {
        let mut v: Vec<String> = Api::<Pod>::all(sim.client().unwrap())
            .list(&ListParams::default().labels(selector))
            .await
            .unwrap()
            .items
            .iter()
            .map(|p| p.name_any())
            .collect();
        v.sort();
        v
    };
    assert!(
        expected.len() > 3 && expected.len() < 50,
        "{} pods match",
        expected.len()
    );
    for (strategy, wc) in [
        ("list", watcher::Config::default().labels(selector).page_size(3)),
        (
            "streaming",
            watcher::Config::default()
                .labels(selector)
                .page_size(3)
                .streaming_lists(),
        ),
    ] {
        // A fresh database each round: a restored one would resume without listing at all.
        let dir = tempfile::tempdir().unwrap();
        let db = DurableStore::open(StoreConfig::new(dir.path().join("w.redb"))).unwrap();
        sim.reset_counters();
        let informer = Informer::from_api(&db, Api::<Pod>::all(sim.client().unwrap()))
            .cluster_identity(ClusterIdentity::named("sim"))
            .watcher_config(&wc)
            .build()
            .await
            .unwrap();
        informer.start();
        informer.wait_for_sync().await.unwrap();
        let mut got: Vec<String> = informer
            .lister()
            .state()
            .unwrap()
            .iter()
            .map(|p| p.name_any())
            .collect();
        got.sort();
        assert_eq!(got, expected, "{strategy}: the label selector reached the server");
        let c = sim.counters();
        match strategy {
            "list" => {
                assert_eq!(c.list_objects, expected.len() as u64, "{c:?}");
                let pages = expected.len().div_ceil(3) as u64;
                assert!(c.list_requests >= pages, "pages of 3: {c:?}");
            }
            _ => assert_eq!(c.list_objects, 0, "a streaming list: {c:?}"),
        }
        informer.shutdown().await.unwrap();
    }
}
