//! Metadata-only informers (`Informer<PartialObjectMeta<K>>`) against the simulated cluster:
//! the server answers kube's metadata requests, the informer stores metadata only, in a scope
//! apart from the full objects, and a restart resumes without a LIST.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use durable_informer::informer::Informer;
use durable_informer::sim::{Sim, SimConfig};
use durable_informer::source::{ClusterIdentity, KubeSource};
use durable_informer::store::{DurableStore, StoreConfig};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, ListParams, WatchEvent, WatchParams};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;

const PODS: usize = 30;

#[path = "common/pods_sim.rs"]
mod pods_sim;

fn sim() -> Sim {
    pods_sim::sim_with_pods(11, PODS)
}

fn meta_pods<'a>(
    db: &'a DurableStore,
    sim: &Sim,
) -> durable_informer::informer::InformerBuilder<'a, PartialObjectMeta<Pod>, KubeSource> {
    Informer::<PartialObjectMeta<Pod>>::builder(
        db,
        KubeSource::typed::<Pod>(sim.client().unwrap(), &sim.url()).metadata_only(),
    )
}

/// The total size of what a scope stores.
fn stored_bytes<K: serde::de::DeserializeOwned + Send + Sync + 'static>(informer: &Informer<K>) -> usize {
    informer
        .store()
        .snapshot()
        .unwrap()
        .list()
        .unwrap()
        .iter()
        .map(|o| o.bytes.len())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sim_answers_kubes_metadata_requests() {
    let sim = tokio::task::spawn_blocking(sim).await.unwrap();
    let api = Api::<Pod>::all(sim.client().unwrap());
    let list = api.list_metadata(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), PODS);
    let rv = list.metadata.resource_version.clone().unwrap();
    for p in &list.items {
        assert!(p.metadata.name.is_some() && p.metadata.uid.is_some());
        let types = p.types.as_ref().expect("kind and apiVersion");
        assert_eq!(
            (types.kind.as_str(), types.api_version.as_str()),
            ("PartialObjectMetadata", "meta.k8s.io/v1")
        );
    }
    // The raw list has no spec: metadata only.
    let raw = sim
        .client()
        .unwrap()
        .request_text(
            http::Request::get("/api/v1/pods")
                .header(
                    "Accept",
                    "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1",
                )
                .body(Vec::new())
                .unwrap(),
        )
        .await
        .unwrap();
    assert!(
        raw.contains("PartialObjectMetadataList") && !raw.contains("\"spec\""),
        "{}",
        &raw[..200.min(raw.len())]
    );
    // A watch from the list's revision sees a delete as metadata.
    let victim = list.items[0].clone();
    let events = api
        .watch_metadata(&WatchParams::default().timeout(5), &rv)
        .await
        .unwrap();
    sim.delete(
        "pods",
        victim.metadata.namespace.as_deref(),
        victim.metadata.name.as_deref().unwrap(),
    )
    .unwrap();
    let first = events
        .try_filter(|e| futures::future::ready(!matches!(e, WatchEvent::Bookmark(_))))
        .boxed()
        .next()
        .await
        .unwrap()
        .unwrap();
    match first {
        WatchEvent::Deleted(p) => assert_eq!(p.metadata.name, victim.metadata.name),
        other => panic!("expected the delete, got {other:?}"),
    }
    // A single object too.
    let ns_api = Api::<Pod>::namespaced(
        sim.client().unwrap(),
        list.items[1].metadata.namespace.as_deref().unwrap(),
    );
    let got = ns_api
        .get_metadata(list.items[1].metadata.name.as_deref().unwrap())
        .await
        .unwrap();
    assert_eq!(got.metadata.uid, list.items[1].metadata.uid);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metadata_informer_stores_metadata_apart_and_resumes_without_a_list() {
    let sim = tokio::task::spawn_blocking(sim).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.redb");
    let (full_bytes, meta_bytes, names) = {
        let db = DurableStore::open(StoreConfig::new(&path)).unwrap();
        let meta = meta_pods(&db, &sim).build().await.unwrap();
        let full = Informer::<Pod>::builder(&db, KubeSource::typed::<Pod>(sim.client().unwrap(), &sim.url()))
            .build()
            .await
            .unwrap();
        assert_ne!(meta.scope(), full.scope(), "a scope of its own");
        let reader = meta.reader();
        meta.start();
        full.start();
        full.wait_for_sync().await.unwrap();
        tokio::time::timeout(Duration::from_secs(20), reader.wait_until_ready())
            .await
            .unwrap()
            .unwrap();
        let state = reader.state();
        assert_eq!(state.len(), PODS);
        let names: BTreeSet<String> = state.iter().map(|p| p.name_any()).collect();
        let full_names: BTreeSet<String> = full.lister().state().unwrap().iter().map(|p| p.name_any()).collect();
        assert_eq!(names, full_names);
        let p = &state[3];
        let again =
            reader.get(&ObjectRef::<PartialObjectMeta<Pod>>::new(&p.name_any()).within(&p.namespace().unwrap()));
        assert_eq!(again.map(|a| a.metadata.uid.clone()), Some(p.metadata.uid.clone()));
        assert!(!p.labels().is_empty(), "labels kept");
        // Stored: metadata only.
        for o in meta.store().snapshot().unwrap().list().unwrap() {
            let v: serde_json::Value = serde_json::from_slice(&o.bytes).unwrap();
            assert!(v.get("spec").is_none() && v.get("status").is_none(), "{v}");
            assert_eq!(v["kind"], "PartialObjectMetadata");
        }
        let sizes = (stored_bytes(&full), stored_bytes(&meta), names);
        meta.shutdown().await.unwrap();
        full.shutdown().await.unwrap();
        drop((meta, full));
        tokio::task::spawn_blocking(move || db.close()).await.unwrap().unwrap();
        sizes
    };
    assert!(
        meta_bytes < full_bytes,
        "metadata {meta_bytes} B < full objects {full_bytes} B"
    );

    // A change while down, then a restart: the watch resumes, no LIST of objects.
    let gone = names.iter().next().unwrap().clone();
    let api = Api::<Pod>::all(sim.client().unwrap());
    let ns = api
        .list_metadata(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|p| p.name_any() == gone)
        .and_then(|p| p.metadata.namespace)
        .unwrap();
    sim.delete("pods", Some(&ns), &gone).unwrap();
    sim.reset_counters();
    let db = DurableStore::open(StoreConfig::new(&path)).unwrap();
    let meta = meta_pods(&db, &sim).build().await.unwrap();
    assert!(meta.is_restored());
    let reader = meta.reader();
    meta.start();
    tokio::time::timeout(Duration::from_secs(20), reader.wait_until_ready())
        .await
        .unwrap()
        .unwrap();
    let mut ok = false;
    for _ in 0..100 {
        if reader.len() == PODS - 1 {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(ok, "the delete made while down arrived: {} pods", reader.len());
    assert!(reader.find(|p| p.name_any() == gone).is_none());
    let c = sim.counters();
    // The resume's probes are LISTs of one object at most (limit=1); a relist would send all.
    assert!(
        c.list_objects <= c.list_requests && c.list_objects < 5,
        "no full LIST on restart: {c:?}"
    );
    assert!(c.watch_events < PODS as u64, "only the change was watched: {c:?}");
    meta.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_from_api_with_a_named_cluster_and_secrets_without_their_data() {
    let sim = tokio::task::spawn_blocking(|| {
        let sim = Sim::start(SimConfig::default().bookmark_interval(Duration::from_millis(200))).unwrap();
        sim.create(
            "namespaces",
            None,
            serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}),
        )
        .unwrap();
        sim.create(
            "secrets",
            Some("team-a"),
            serde_json::json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "token", "namespace": "team-a", "labels": {"app": "web"}}, "data": {"password": "aHVudGVyMg=="}}),
        )
        .unwrap();
        sim
    })
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let db = DurableStore::open(StoreConfig::new(dir.path().join("s.redb"))).unwrap();
    let secrets = Informer::metadata_from_api(&db, Api::<Secret>::namespaced(sim.client().unwrap(), "team-a"))
        .cluster_identity(ClusterIdentity::named("sim"))
        .build()
        .await
        .expect("metadata of Secrets needs no allow_secrets: it carries no data");
    let reader = secrets.reader();
    sim.reset_counters();
    secrets.start();
    reader.wait_until_ready().await.unwrap();
    let got: Vec<Arc<PartialObjectMeta<Secret>>> = reader.state();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].labels().get("app").map(String::as_str), Some("web"));
    let stored = &secrets.store().snapshot().unwrap().list().unwrap()[0].bytes;
    assert!(
        !String::from_utf8_lossy(stored).contains("aHVudGVyMg"),
        "no Secret data on disk"
    );
    assert_eq!(
        sim.counters().get_requests,
        0,
        "a named cluster needs no identity request"
    );
    assert_eq!(db.cluster_identity().unwrap().as_deref(), Some("name:sim"));
    secrets.shutdown().await.unwrap();
    // The full-object informer of Secrets is still refused without allow_secrets.
    let refused = Informer::from_api(&db, Api::<Secret>::namespaced(sim.client().unwrap(), "team-a"))
        .build()
        .await;
    assert!(refused.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_factory_shares_metadata_scopes_apart_from_full_ones() {
    let sim = tokio::task::spawn_blocking(sim).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let factory = durable_informer::informer::InformerFactory::new(
        DurableStore::open(StoreConfig::new(dir.path().join("f.redb"))).unwrap(),
        sim.client().unwrap(),
        &sim.url(),
    );
    let meta = factory.metadata_informer::<Pod>(None).await.unwrap();
    let again = factory.metadata_informer::<Pod>(None).await.unwrap();
    let full = factory.informer::<Pod>(None).await.unwrap();
    let web = factory
        .informer_with::<Pod>(None, &kube::runtime::watcher::Config::default().labels("tier=frontend"))
        .await
        .unwrap();
    assert_eq!(meta.scope(), again.scope());
    assert_ne!(meta.scope(), full.scope());
    assert_ne!(web.scope(), full.scope(), "the selector is part of the scope");
    factory.start();
    tokio::time::timeout(Duration::from_secs(20), factory.wait_for_cache_sync())
        .await
        .unwrap()
        .unwrap();
    let metas = meta.lister().state().unwrap();
    assert_eq!(metas.len(), PODS);
    assert_eq!(full.lister().state().unwrap().len(), PODS);
    let frontend = web.lister().state().unwrap();
    assert!(!frontend.is_empty() && frontend.len() < PODS);
    assert!(frontend
        .iter()
        .all(|p| p.labels().get("tier").map(String::as_str) == Some("frontend")));
    factory.shutdown().await.unwrap();
}
