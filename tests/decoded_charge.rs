//! The memory budget charges a cache entry for its decoded form at what its type takes, not
//! at a fixed multiple of its JSON: a decoded k8s-openapi `Pod` is about eight times its JSON,
//! a `ConfigMap` about two and a half (docs/guarantees.md, "Memory is one budget"). Measured
//! here with a counting allocator: the heap a cache's readers add by decoding every object
//! stays within what the cache charged for those decoded forms, and the charge errs high by
//! at most half.

use std::time::{Duration, Instant};

use durable_informer::informer::{CacheStats, Informer};
use durable_informer::source::KubeSource;
use durable_informer::store::{DurableStore, StoreConfig};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use serde_json::json;

#[allow(dead_code)] // the memory benches use the rest
#[path = "../benches/common/counting_alloc.rs"]
mod counting_alloc;
#[path = "common/pods_sim.rs"]
mod pods_sim;

const N: usize = 400;

/// Waits until the informer's cache holds `N` objects.
async fn loaded<K>(informer: &Informer<K>) -> CacheStats
where
    K: serde::de::DeserializeOwned + Send + Sync + 'static,
{
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let s = informer.cache_stats();
        if s.loaded && s.objects == N && s.with_json == N {
            return s;
        }
        assert!(Instant::now() < deadline, "the cache never held every object: {s:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Decodes every object `informer` holds (each kept in its entry, as readers leave it) and
/// returns the heap that added, and what the cache charges for the decoded forms.
async fn decode_all<K>(informer: &Informer<K>) -> (usize, usize)
where
    K: serde::de::DeserializeOwned + Clone + Send + Sync + 'static,
{
    let before = loaded(informer).await;
    let heap = counting_alloc::live();
    let all = informer.lister().state().unwrap();
    assert_eq!(all.len(), N);
    drop(all);
    let grown = counting_alloc::live().saturating_sub(heap);
    let after = informer.cache_stats();
    assert_eq!(
        after.charged_bytes, before.charged_bytes,
        "a decode is charged up front, with the entry"
    );
    // What the cache charges beyond the bytes holding each object's JSON.
    (grown, before.charged_bytes - before.json_bytes)
}

fn config_map(i: usize) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": format!("cm-{i:05}"), "namespace": "ns",
                        "labels": {"app": format!("a{}", i % 7), "tier": "web"}},
           "data": {"config.yaml": "x".repeat(600 + i % 50), "mode": "on", "level": format!("{i}")}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_charges_decoded_objects_about_what_they_take() {
    let sim = tokio::task::spawn_blocking(|| {
        let sim = pods_sim::sim_with_pods(5, N);
        sim.bulk_load("configmaps", (0..N).map(config_map)).unwrap();
        sim
    })
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let db = DurableStore::open(StoreConfig::new(dir.path().join("d.redb"))).unwrap();
    let pods = Informer::<Pod>::builder(&db, KubeSource::typed::<Pod>(sim.client().unwrap(), &sim.url()))
        .build()
        .await
        .unwrap();
    let maps = Informer::<ConfigMap>::builder(&db, KubeSource::typed::<ConfigMap>(sim.client().unwrap(), &sim.url()))
        .build()
        .await
        .unwrap();
    pods.start();
    maps.start();
    pods.wait_for_sync().await.unwrap();
    maps.wait_for_sync().await.unwrap();
    // One kind at a time: the counting allocator sees the whole process.
    let (pod_heap, pod_charge) = decode_all(&pods).await;
    let (map_heap, map_charge) = decode_all(&maps).await;
    let json = |s: CacheStats| s.json_bytes;
    eprintln!(
        "Pods: {pod_heap} B decoded, {pod_charge} B charged; ConfigMaps: {map_heap} B decoded, {map_charge} B charged ({} and {} B holding their JSON)",
        json(pods.cache_stats()),
        json(maps.cache_stats())
    );
    for (kind, heap, charge) in [("Pods", pod_heap, pod_charge), ("ConfigMaps", map_heap, map_charge)] {
        assert!(
            heap <= charge && charge <= heap + heap / 2,
            "{kind}: decoding added {heap} B to the heap, the cache charges {charge} B for it"
        );
    }
    assert!(
        pod_charge / N > 3 * (map_charge / N),
        "a Pod's decoded form is charged as larger than a ConfigMap's"
    );
    pods.shutdown().await.unwrap();
    maps.shutdown().await.unwrap();
}
