//! The controller_manager example end to end against the simulated cluster: three controllers
//! from one factory and one database share the Pod informer; replica-counter annotates the
//! Deployment with its running Pods, pod-gc deletes finished Pods, configmap-hasher annotates
//! ConfigMaps with the hash of their data and follows changes.

#[path = "../examples/controller_manager.rs"]
#[allow(unused_imports, clippy::all)]
mod example;

use std::collections::BTreeMap;
use std::time::Duration;

use durable_informer::sim::{Sim, SimConfig};
use example::{DATA_HASH, RUNNING_PODS};

async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..150 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    panic!("timed out waiting for {what}");
}

fn pod(name: &str, app: &str, phase: &str) -> serde_json::Value {
    serde_json::json!({
        "metadata": {"name": name, "namespace": "default", "labels": {"app": app}},
        "spec": {"containers": [{"name": "main", "image": "nginx"}]},
        "status": {"phase": phase}
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_manager_runs_three_controllers_sharing_the_pod_informer() {
    let sim = tokio::task::spawn_blocking(|| Sim::start(SimConfig::default()).unwrap())
        .await
        .unwrap();
    sim.create("deployments", Some("default"), example::demo_deployment("web", "web"))
        .unwrap();
    sim.create("pods", Some("default"), pod("web-0", "web", "Running"))
        .unwrap();
    sim.create("pods", Some("default"), pod("web-1", "web", "Pending"))
        .unwrap();
    sim.create("pods", Some("default"), pod("web-2", "web", "Failed"))
        .unwrap();
    sim.create("pods", Some("default"), pod("other-0", "other", "Running"))
        .unwrap();
    sim.create(
        "configmaps",
        Some("default"),
        serde_json::json!({"metadata": {"name": "settings"}, "data": {"a": "1", "b": "2"}}),
    )
    .unwrap();

    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("kcm.redb");
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let (tx, rx) = tokio::sync::oneshot::channel();
    let client = sim.client().unwrap();
    let url = sim.url();
    let task = tokio::spawn(async move { example::run(client, &url, &db, stop, tx).await });
    let ctx = rx.await.unwrap();
    assert_eq!(
        ctx.pod_scopes.0, ctx.pod_scopes.1,
        "both controllers got the same Pod informer"
    );

    let annotation = |resource: &str, name: &str, key: &str| {
        sim.get(resource, Some("default"), name).unwrap()["metadata"]["annotations"][key]
            .as_str()
            .map(str::to_string)
    };
    eventually("2 running web pods counted", || {
        annotation("deployments", "web", RUNNING_PODS).as_deref() == Some("2")
    })
    .await;
    eventually("the failed pod deleted", || {
        sim.get("pods", Some("default"), "web-2").is_err()
    })
    .await;
    assert!(
        sim.get("pods", Some("default"), "web-0").is_ok(),
        "running pods are kept"
    );
    let data = BTreeMap::from([("a".to_string(), "1".to_string()), ("b".to_string(), "2".to_string())]);
    let first_hash = example::data_hash(Some(&data));
    eventually("the configmap hashed", || {
        annotation("configmaps", "settings", DATA_HASH).as_deref() == Some(first_hash.as_str())
    })
    .await;

    // A new web pod is counted; a pod that finishes is collected and no longer counted.
    sim.create("pods", Some("default"), pod("web-3", "web", "Running"))
        .unwrap();
    eventually("3 running web pods", || {
        annotation("deployments", "web", RUNNING_PODS).as_deref() == Some("3")
    })
    .await;
    sim.patch_status(
        "pods",
        Some("default"),
        "web-0",
        &serde_json::json!({"status": {"phase": "Succeeded"}}),
    )
    .unwrap();
    eventually("web-0 collected and 2 counted", || {
        sim.get("pods", Some("default"), "web-0").is_err()
            && annotation("deployments", "web", RUNNING_PODS).as_deref() == Some("2")
    })
    .await;

    // Changed data → a new hash.
    sim.patch(
        "configmaps",
        Some("default"),
        "settings",
        &serde_json::json!({"data": {"b": "3"}}),
    )
    .unwrap();
    let data = BTreeMap::from([("a".to_string(), "1".to_string()), ("b".to_string(), "3".to_string())]);
    let second_hash = example::data_hash(Some(&data));
    assert_ne!(first_hash, second_hash);
    eventually("the configmap rehashed", || {
        annotation("configmaps", "settings", DATA_HASH).as_deref() == Some(second_hash.as_str())
    })
    .await;

    let log = ctx.log();
    assert!(
        log.contains(&"pod-gc: deleted finished pod default/web-2".to_string()),
        "{log:?}"
    );
    assert!(
        !log.iter().any(|l| l.contains("other-0")),
        "other pods are left alone: {log:?}"
    );
    stop_tx.send(true).unwrap();
    task.await.unwrap().unwrap();
}
