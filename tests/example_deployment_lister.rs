//! The deployment_lister example end to end against the simulated cluster: the handler prints
//! adds, updates (replicas old → new) and deletes; the lister lists `default` only; after a
//! restart the durable handler receives only what changed while it was away.

#[path = "../examples/deployment_lister.rs"]
#[allow(unused_imports, clippy::all)]
mod example;

use std::sync::Arc;
use std::time::Duration;

use durable_informer::sim::{workload::WorkloadGen, Sim, SimConfig};

async fn eventually(what: &str, ctx: &Arc<example::Ctx>, line: &str) {
    for _ in 0..100 {
        if ctx.events().iter().any(|e| e == line) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    panic!("timed out waiting for {what}: {:?}", ctx.events());
}

type Task = tokio::task::JoinHandle<Result<(), Box<dyn std::error::Error + Send + Sync>>>;

async fn start(sim: &Sim, db: &std::path::Path) -> (tokio::sync::watch::Sender<bool>, Task, Arc<example::Ctx>) {
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let (tx, rx) = tokio::sync::oneshot::channel();
    let client = sim.client().unwrap();
    let url = sim.url();
    let db = db.to_owned();
    let task = tokio::spawn(async move { example::run(client, &url, &db, stop, tx).await });
    (stop_tx, task, rx.await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deployment_lister_prints_changes_lists_default_and_resumes_where_it_stopped() {
    let sim = tokio::task::spawn_blocking(|| Sim::start(SimConfig::default()).unwrap())
        .await
        .unwrap();
    let mut gen = WorkloadGen::new(1);
    let d0 = gen.deployment("default", "web");
    let web_replicas = d0["spec"]["replicas"].as_i64().unwrap();
    sim.create("deployments", Some("default"), d0).unwrap();
    sim.create("deployments", Some("default"), gen.deployment("default", "api"))
        .unwrap();
    sim.create(
        "deployments",
        Some("kube-system"),
        gen.deployment("kube-system", "coredns"),
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("deployments.redb");

    let (stop, task, ctx) = start(&sim, &db).await;
    let events = ctx.events();
    assert_eq!(events.len(), 3, "one add per deployment: {events:?}");
    assert!(events.contains(&format!("add default/web replicas {web_replicas}")));
    assert!(events.iter().any(|e| e.starts_with("add kube-system/coredns ")));
    let mut listed = example::list_default(&ctx.deployments).unwrap();
    listed.sort();
    assert_eq!(listed.len(), 2);
    assert!(listed[0].starts_with("api (") && listed[1] == format!("web ({web_replicas})"));

    sim.patch(
        "deployments",
        Some("default"),
        "web",
        &serde_json::json!({"spec": {"replicas": 9}}),
    )
    .unwrap();
    eventually(
        "the update",
        &ctx,
        &format!("update default/web replicas {web_replicas} -> 9"),
    )
    .await;
    sim.delete("deployments", Some("default"), "api").unwrap();
    eventually("the delete", &ctx, "delete default/api").await;
    assert_eq!(
        example::list_default(&ctx.deployments).unwrap(),
        vec!["web (9)".to_string()]
    );
    stop.send(true).unwrap();
    task.await.unwrap().unwrap();

    // While it is down: one new Deployment. After the restart, that is all the handler hears of.
    sim.create("deployments", Some("default"), gen.deployment("default", "late"))
        .unwrap();
    let (stop, task, ctx) = start(&sim, &db).await;
    let events = ctx.events();
    assert_eq!(events.len(), 1, "only the change made while stopped: {events:?}");
    assert!(events[0].starts_with("add default/late replicas "));
    let mut listed = example::list_default(&ctx.deployments).unwrap();
    listed.sort();
    assert_eq!(listed.len(), 2);
    assert!(listed[0].starts_with("late (") && listed[1] == "web (9)");
    stop.send(true).unwrap();
    task.await.unwrap().unwrap();
}
