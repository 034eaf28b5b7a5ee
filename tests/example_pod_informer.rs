//! The pod_informer example end to end against the simulated cluster: terminal Pods are never
//! cached, Pods are listed per namespace and per node (custom index on `spec.nodeName`), and a
//! Pod that finishes or moves leaves or changes its index entry.

#[path = "../examples/pod_informer.rs"]
#[allow(unused_imports, clippy::all)]
mod example;

use std::collections::BTreeMap;
use std::time::Duration;

use durable_informer::sim::{Sim, SimConfig};

fn expected(pods: &[serde_json::Value]) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for p in pods {
        let phase = p["status"]["phase"].as_str().unwrap();
        if phase == "Succeeded" || phase == "Failed" {
            continue;
        }
        let node = p["spec"]["nodeName"].as_str().unwrap().to_string();
        let key = format!(
            "{}/{}",
            p["metadata"]["namespace"].as_str().unwrap(),
            p["metadata"]["name"].as_str().unwrap()
        );
        out.entry(node).or_default().push(key);
    }
    for v in out.values_mut() {
        v.sort();
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_informer_caches_only_non_terminal_pods_indexed_by_node_and_namespace() {
    let sim = tokio::task::spawn_blocking(|| Sim::start(SimConfig::default()).unwrap())
        .await
        .unwrap();
    let mut pods = example::generated_pods(40);
    // One unscheduled Pod: cached, but under no node.
    pods[0]["spec"].as_object_mut().unwrap().remove("nodeName");
    let terminal = pods.iter().filter(|p| p["status"]["phase"] != "Running").count();
    assert!(terminal >= 8, "the workload has terminal pods to exclude");
    sim.bulk_load("pods", pods.clone()).unwrap();

    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("pods.redb");
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let (tx, rx) = tokio::sync::oneshot::channel();
    let client = sim.client().unwrap();
    let url = sim.url();
    let task = tokio::spawn(async move { example::run(client, &url, &db, stop, tx).await });
    let cache = rx.await.unwrap();

    assert_eq!(cache.informer.store().list_keys().unwrap().len(), pods.len() - terminal);
    let mut want = expected(&pods[1..]);
    assert_eq!(cache.pods_per_node().unwrap(), want);
    let ns1: Vec<String> = pods
        .iter()
        .filter(|p| p["metadata"]["namespace"] == "ns-1" && p["status"]["phase"] == "Running")
        .map(|p| p["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    let mut got = cache.pods_in_namespace("ns-1").unwrap();
    got.sort();
    let mut ns1_sorted = ns1.clone();
    ns1_sorted.sort();
    assert_eq!(got, ns1_sorted);
    assert!(cache.pods_in_namespace("default").unwrap().is_empty());

    // pod-1 (ns-1, node-1, Running) finishes: it leaves the cache and its node's list.
    assert_eq!(pods[1]["status"]["phase"], "Running");
    sim.patch_status(
        "pods",
        Some("ns-1"),
        "pod-1",
        &serde_json::json!({"status": {"phase": "Failed"}}),
    )
    .unwrap();
    want.get_mut("node-1").unwrap().retain(|k| k != "ns-1/pod-1");
    let mut last = None;
    for _ in 0..100 {
        let now = cache.pods_per_node().unwrap();
        if now == want {
            break;
        }
        last = Some(now);
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    assert_eq!(cache.pods_per_node().unwrap(), want, "last seen {last:?}");
    assert!(!cache.pods_in_namespace("ns-1").unwrap().contains(&"pod-1".to_string()));

    stop_tx.send(true).unwrap();
    task.await.unwrap().unwrap();
}
