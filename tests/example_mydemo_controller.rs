//! The mydemo_controller example end to end against the simulated cluster: the handler logs
//! add, update with the resourceVersion change and delete; the reconciler syncs valid objects,
//! reports invalid ones and logs "deleted" for objects gone from the cache.

#[path = "../examples/mydemo_controller.rs"]
#[allow(unused_imports, clippy::all)]
mod example;

use std::time::Duration;

use durable_informer::sim::{ResourceDef, Sim, SimConfig};
use example::{mydemo, Mydemo};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};

async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..100 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mydemo_controller_logs_rv_changes_and_deletes() {
    let sim = tokio::task::spawn_blocking(|| {
        Sim::start(SimConfig::default().with_resource(ResourceDef::custom("crddemo.k8s.io", "v1", "Mydemo", "mydemos")))
            .unwrap()
    })
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("mydemo.redb");
    let client = sim.client().unwrap();
    let api: Api<Mydemo> = Api::namespaced(client.clone(), "default");
    // One object exists before the controller starts.
    let before = api
        .create(&PostParams::default(), &mydemo("early", "10.0.0.1", 80))
        .await
        .unwrap();

    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let (tx, rx) = tokio::sync::oneshot::channel();
    let url = sim.url();
    let task = tokio::spawn(async move { example::run(client, &url, &db, stop, tx).await });
    let ctx = rx.await.unwrap();
    let has = |line: String| {
        let ctx = ctx.clone();
        move || ctx.log.lines().contains(&line)
    };
    let rv = |m: &Mydemo| m.metadata.resource_version.clone().unwrap();

    eventually("early synced", has("sync default/early: 10.0.0.1:80".into())).await;
    assert!(ctx
        .log
        .lines()
        .contains(&format!("add default/early rv {}", rv(&before))));

    let created = api
        .create(&PostParams::default(), &mydemo("web", "10.0.0.2", 8080))
        .await
        .unwrap();
    eventually("web added", has(format!("add default/web rv {}", rv(&created)))).await;
    let updated = api
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"port": 9090}})),
        )
        .await
        .unwrap();
    assert_ne!(rv(&created), rv(&updated));
    eventually(
        "the update with its RV change",
        has(format!("update default/web rv {} -> {}", rv(&created), rv(&updated))),
    )
    .await;
    eventually("web resynced", has("sync default/web: 10.0.0.2:9090".into())).await;

    api.create(&PostParams::default(), &mydemo("bad", "not-an-ip", 0))
        .await
        .unwrap();
    eventually(
        "the invalid one reported",
        has("sync default/bad: invalid address not-an-ip:0".into()),
    )
    .await;

    api.delete("web", &DeleteParams::default()).await.unwrap();
    eventually("the delete handled", has("sync default/web: deleted".into())).await;
    let lines = ctx.log.lines();
    assert!(
        lines.iter().any(|l| l.starts_with("delete default/web rv ")),
        "the handler saw the delete: {lines:?}"
    );
    assert!(ctx.mydemos.namespace("default").get("web").unwrap().is_none());
    assert!(ctx.mydemos.namespace("default").get("early").unwrap().is_some());

    stop_tx.send(true).unwrap();
    task.await.unwrap().unwrap();
}
