//! What an informer's cache holds per object (issues #35 and #36): a metadata-only informer
//! holds its metadata once (parsed, for selectors and indexes), and a change's JSON (the same
//! metadata again) only until it is on disk, unless handlers or a reader decode objects;
//! every read still answers as before.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use durable_informer::informer::{handler_fn, Event, HandlerOptions, Informer};
use durable_informer::object::ObjectKey;
use durable_informer::selector::LabelSelector;
use durable_informer::sim::Sim;
use durable_informer::source::KubeSource;
use durable_informer::store::{Compression, DurableStore, StoreConfig};
use k8s_openapi::api::core::v1::Pod;
use kube::core::PartialObjectMeta;
use kube::ResourceExt;

const PODS: usize = 40;

#[path = "common/pods_sim.rs"]
mod pods_sim;

fn sim() -> Sim {
    pods_sim::sim_with_pods(7, PODS)
}

/// Waits until the informer's cache holds every Pod.
async fn loaded<K>(informer: &Informer<K>) -> durable_informer::informer::CacheStats
where
    K: serde::de::DeserializeOwned + Send + Sync + 'static,
{
    loaded_n(informer, PODS).await
}

/// Waits until the informer's cache holds `n` objects.
async fn loaded_n<K>(informer: &Informer<K>, n: usize) -> durable_informer::informer::CacheStats
where
    K: serde::de::DeserializeOwned + Send + Sync + 'static,
{
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let s = informer.cache_stats();
        if s.loaded && s.objects == n {
            return s;
        }
        assert!(Instant::now() < deadline, "the cache never held every Pod: {s:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A metadata-only informer of the sim's Pods on `db`, not started.
async fn metadata_informer(db: &DurableStore, sim: &Sim) -> Informer<PartialObjectMeta<Pod>> {
    Informer::<PartialObjectMeta<Pod>>::builder(
        db,
        KubeSource::typed::<Pod>(sim.client().unwrap(), &sim.url()).metadata_only(),
    )
    .build()
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metadata_informer_keeps_no_json_for_listers_and_answers_the_same() {
    let sim = tokio::task::spawn_blocking(sim).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let db = DurableStore::open(StoreConfig::new(dir.path().join("c.redb"))).unwrap();
    let meta = metadata_informer(&db, &sim).await;
    let full = Informer::<Pod>::builder(&db, KubeSource::typed::<Pod>(sim.client().unwrap(), &sim.url()))
        .build()
        .await
        .unwrap();
    meta.start();
    full.start();
    meta.wait_for_sync().await.unwrap();
    full.wait_for_sync().await.unwrap();
    let (mut m, f) = (loaded(&meta).await, loaded(&full).await);
    // The JSON goes once the changes are on disk (a deferred fsync away).
    let deadline = Instant::now() + Duration::from_secs(20);
    while m.with_json > 0 {
        assert!(
            Instant::now() < deadline,
            "a metadata-only cache keeps no JSON nobody decoded: {m:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
        m = meta.cache_stats();
    }
    assert_eq!(
        f.with_json, PODS,
        "a full-object cache keeps what the changes brought: {f:?}"
    );
    assert!(m.held_bytes > 0 && m.charged_bytes == 0, "{m:?}");

    // Listers answer as the full informer's do, reading the JSON back.
    let (ml, fl) = (meta.lister(), full.lister());
    let some = fl.state().unwrap()[5].clone();
    let key = ObjectKey::namespaced(some.namespace().unwrap(), some.name_any());
    let got = ml.get_by_key(&key).unwrap().expect("the lister finds it");
    assert_eq!(got.metadata.uid, some.metadata.uid);
    assert_eq!(got.labels(), some.labels());
    assert_eq!(got.annotations(), some.annotations());
    assert_eq!(got.owner_references(), some.owner_references());
    assert_eq!(
        meta.cache_stats().with_json,
        1,
        "a read keeps its JSON within the budget"
    );
    let names = |v: Vec<String>| v.into_iter().collect::<BTreeSet<_>>();
    for sel in [
        "tier=frontend",
        "tier!=frontend,app",
        "app.kubernetes.io/part-of=durable-informer-bench",
    ] {
        let sel: LabelSelector = sel.parse().unwrap();
        let want = names(fl.list(&sel).unwrap().iter().map(|p| p.name_any()).collect());
        let have = names(ml.list(&sel).unwrap().iter().map(|p| p.name_any()).collect());
        assert!(!want.is_empty(), "{sel:?} selects some Pods");
        assert_eq!(have, want, "{sel:?}");
    }
    assert_eq!(ml.state().unwrap().len(), PODS);
    meta.shutdown().await.unwrap();
    full.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metadata_informers_handler_and_reader_get_every_object() {
    let sim = tokio::task::spawn_blocking(sim).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let db = DurableStore::open(StoreConfig::new(dir.path().join("h.redb"))).unwrap();
    let meta = metadata_informer(&db, &sim).await;
    let seen: Arc<Mutex<Vec<(String, usize)>>> = Arc::default();
    let s = seen.clone();
    let reg = meta.add_event_handler(
        handler_fn(move |ev: Event<PartialObjectMeta<Pod>>| {
            if let Event::Add { object, .. } | Event::Update { new: object, .. } = &ev {
                s.lock().unwrap().push((object.name_any(), object.labels().len()));
            }
            Ok::<_, std::convert::Infallible>(())
        }),
        HandlerOptions::volatile(),
    );
    meta.start();
    tokio::time::timeout(Duration::from_secs(20), reg.wait_for_sync())
        .await
        .unwrap()
        .unwrap();
    {
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), PODS, "every Pod told once");
        assert!(seen.iter().all(|(_, labels)| *labels == 4), "with its labels: {seen:?}");
    }
    // A change after the sync reaches the handler with its new state.
    let first = seen.lock().unwrap()[0].0.clone();
    let pod = meta
        .lister()
        .state()
        .unwrap()
        .into_iter()
        .find(|p| p.name_any() == first)
        .unwrap();
    let ns = pod.namespace().unwrap();
    sim.patch(
        "pods",
        Some(&ns),
        &first,
        &serde_json::json!({"metadata": {"labels": {"extra": "1"}}}),
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !seen
        .lock()
        .unwrap()
        .iter()
        .any(|(n, labels)| *n == first && *labels == 5)
    {
        assert!(Instant::now() < deadline, "the update never reached the handler");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A reader (kube's Store) holds every object.
    let reader = meta.reader();
    tokio::time::timeout(Duration::from_secs(20), reader.wait_until_ready())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(reader.state().len(), PODS);
    assert_eq!(
        meta.cache_stats().with_json,
        PODS,
        "a reader's cache holds every object's JSON"
    );
    meta.shutdown().await.unwrap();
}

/// A full-object cache keeps each change's object as the database stored it (zstd, with the
/// scope's dictionary once one is trained on its first objects), not its JSON: a fraction of
/// the memory, charged as such; reads and handlers decode the same objects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_keeps_each_changes_compressed_blob_not_its_json() {
    const MANY: usize = 600;
    let sim = tokio::task::spawn_blocking(|| pods_sim::sim_with_pods(11, MANY))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let informer = |name: &str, compression: Compression| {
        let db = DurableStore::open(StoreConfig::new(dir.path().join(name)).compression(compression)).unwrap();
        let source = KubeSource::typed::<Pod>(sim.client().unwrap(), &sim.url());
        async move {
            let i = Informer::<Pod>::builder(&db, source).build().await.unwrap();
            // A volatile handler decodes the cache's entries; a durable one the log's records,
            // sharing the cache's object when it holds the same version.
            let mut seen = Vec::new();
            for options in [HandlerOptions::volatile(), HandlerOptions::durable("d")] {
                let told: Arc<Mutex<Vec<Pod>>> = Arc::default();
                let t = told.clone();
                let reg = i.add_event_handler(
                    handler_fn(move |e: Event<Pod>| {
                        if let Event::Add { object, .. } = e {
                            t.lock().unwrap().push((*object).clone());
                        }
                        Ok::<_, std::convert::Infallible>(())
                    }),
                    options,
                );
                seen.push((reg, told));
            }
            i.start();
            i.wait_for_sync().await.unwrap();
            (db, i, seen)
        }
    };
    let (_p, plain, plain_seen) = informer("plain.redb", Compression::None).await;
    let (_z, packed, packed_seen) = informer("packed.redb", Compression::ZstdDict(1)).await;
    let (p, z) = (loaded_n(&plain, MANY).await, loaded_n(&packed, MANY).await);
    assert_eq!((p.with_json, z.with_json), (MANY, MANY), "{p:?} {z:?}");
    assert!(
        z.json_bytes * 3 < p.json_bytes,
        "the blobs are a fraction of the JSON: {z:?} against {p:?}"
    );
    assert_eq!(
        z.charged_bytes - z.json_bytes,
        p.charged_bytes - p.json_bytes,
        "charged: what holds the objects, and the same estimate of their decoded forms"
    );
    let sorted = |mut v: Vec<Pod>| {
        v.sort_by_key(|p| (p.namespace(), p.name_any()));
        v
    };
    let (pl, zl) = (plain.lister(), packed.lister());
    let want = sorted(pl.state().unwrap().iter().map(|p| (**p).clone()).collect());
    assert_eq!(want.len(), MANY);
    assert_eq!(
        sorted(zl.state().unwrap().iter().map(|p| (**p).clone()).collect()),
        want
    );
    for (reg, told) in plain_seen.iter().chain(&packed_seen) {
        tokio::time::timeout(Duration::from_secs(20), reg.wait_for_sync())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(sorted(told.lock().unwrap().clone()), want);
    }
    plain.shutdown().await.unwrap();
    packed.shutdown().await.unwrap();
}
