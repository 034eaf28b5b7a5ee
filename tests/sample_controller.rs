//! sample-controller end to end against the simulated cluster, over HTTP with kube::Client:
//! create, scale, status copied back, a Deployment scaled by hand restored, refuse a foreign
//! Deployment (an Event posted, the error retried), delete through the finalizer (the owned
//! Deployment deleted first, a foreign one kept), and a restart midway that resumes
//! without a full LIST and converges.

#[path = "../examples/sample_controller.rs"]
#[allow(unused_imports, clippy::all)]
mod sample;

use std::sync::Arc;
use std::time::Duration;

use durable_informer::sim::{ResourceDef, Sim, SimConfig};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use sample::{Ctx, Foo, FooSpec};

async fn eventually<T>(what: &str, mut f: impl AsyncFnMut() -> Option<T>) -> T {
    for _ in 0..200 {
        if let Some(v) = f().await {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for {what}");
}

fn foo(name: &str, deployment: &str, replicas: i32) -> Foo {
    Foo {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: FooSpec {
            deployment_name: deployment.into(),
            replicas: Some(replicas),
        },
        status: None,
    }
}

struct Running {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<Result<(), Box<dyn std::error::Error + Send + Sync>>>,
    ctx: Arc<Ctx>,
}

async fn start(sim: &Sim, db: &std::path::Path) -> Running {
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let (tx, rx) = tokio::sync::oneshot::channel();
    let client = sim.client().unwrap();
    let url = sim.url();
    let db = db.to_owned();
    let task = tokio::spawn(async move { sample::run(client, &url, &db, stop_rx, tx).await });
    let ctx = match rx.await {
        Ok(ctx) => ctx,
        Err(_) => panic!("the controller failed to start: {:?}", task.await),
    };
    Running { stop, task, ctx }
}

async fn replicas(api: &Api<Deployment>, name: &str) -> Option<i32> {
    api.get_opt(name)
        .await
        .ok()
        .flatten()
        .and_then(|d| d.spec)
        .and_then(|s| s.replicas)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sample_controller_converges_refuses_foreign_deployments_and_resumes_without_a_list() {
    let sim = tokio::task::spawn_blocking(|| {
        Sim::start(
            SimConfig::default()
                .bookmark_interval(Duration::from_millis(500))
                .with_resource(ResourceDef::custom(
                    "samplecontroller.k8s.io",
                    "v1alpha1",
                    "Foo",
                    "foos",
                ))
                .with_resource(ResourceDef::custom("events.k8s.io", "v1", "Event", "events")),
        )
        .unwrap()
    })
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ctrl.redb");
    let client = sim.client().unwrap();
    let foos: Api<Foo> = Api::namespaced(client.clone(), "default");
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");

    let r = start(&sim, &db).await;
    // Create → a Deployment with the right replicas, owned by the Foo.
    let created = foos
        .create(&PostParams::default(), &foo("web", "web-deploy", 1))
        .await
        .unwrap();
    let d = eventually("the deployment", async || {
        deployments.get_opt("web-deploy").await.ok().flatten()
    })
    .await;
    assert_eq!(d.spec.and_then(|s| s.replicas), Some(1));
    let owner = &d.metadata.owner_references.unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), Some(&owner.uid)),
        ("Foo", created.metadata.uid.as_ref())
    );
    assert_eq!(owner.controller, Some(true));
    // The Foo carries the controller's finalizer (added before the Deployment was made).
    let f = foos.get("web").await.unwrap();
    assert_eq!(f.metadata.finalizers, Some(vec![sample::FINALIZER.to_string()]));

    // Scale.
    foos.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"replicas": 3}})),
    )
    .await
    .unwrap();
    eventually("3 replicas", async || {
        (replicas(&deployments, "web-deploy").await == Some(3)).then_some(())
    })
    .await;

    // The Deployment's status changes → its owner is reconciled (owns) → the Foo's status.
    sim.patch_status(
        "deployments",
        Some("default"),
        "web-deploy",
        &serde_json::json!({"status": {"availableReplicas": 3}}),
    )
    .unwrap();
    eventually("Foo status.availableReplicas 3", async || {
        let foo = foos.get("web").await.ok()?;
        (foo.status?.available_replicas == 3).then_some(())
    })
    .await;

    // Scaled by hand → restored to the Foo's replicas.
    deployments
        .patch(
            "web-deploy",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"replicas": 10}})),
        )
        .await
        .unwrap();
    eventually("replicas restored to 3", async || {
        (replicas(&deployments, "web-deploy").await == Some(3)).then_some(())
    })
    .await;

    // A Deployment the Foo does not own is not adopted; the error is reported as an Event.
    deployments
        .create(&PostParams::default(), &serde_json::from_value(serde_json::json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "foreign"},
            "spec": {"replicas": 7, "selector": {"matchLabels": {"a": "b"}}, "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}}
        })).unwrap())
        .await
        .unwrap();
    foos.create(&PostParams::default(), &foo("thief", "foreign", 1))
        .await
        .unwrap();
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let event = eventually("an ErrResourceExists Event", async || {
        let list = events.list(&Default::default()).await.ok()?;
        list.items.into_iter().find(|e| {
            e.reason.as_deref() == Some("ErrResourceExists")
                && e.note.as_deref().is_some_and(|m| m.contains("\"foreign\""))
        })
    })
    .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    // kube-runtime's recorder: the Event names the Foo it is about, as a real server requires.
    let regarding = event.regarding.expect("regarding");
    assert_eq!(
        (
            regarding.kind.as_deref(),
            regarding.name.as_deref(),
            regarding.namespace.as_deref()
        ),
        (Some("Foo"), Some("thief"), Some("default"))
    );
    assert_eq!(event.reporting_controller.as_deref(), Some("sample-controller"));
    let ctx = r.ctx.clone();
    eventually("the error retried", async || {
        let errors = ctx.errors.lock().unwrap();
        let n = errors.iter().filter(|e| e.starts_with("default/thief: ")).count();
        (n >= 2).then_some(())
    })
    .await;
    let foreign = deployments.get("foreign").await.unwrap();
    assert!(
        foreign.metadata.owner_references.unwrap_or_default().is_empty(),
        "not adopted"
    );
    assert_eq!(foreign.spec.and_then(|s| s.replicas), Some(7), "not scaled");

    // Stop midway; change the Foo while the controller is down; restart on the same database.
    r.stop.send(true).unwrap();
    r.task.await.unwrap().unwrap();
    foos.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"replicas": 5}})),
    )
    .await
    .unwrap();
    let before = sim.counters();
    let r = start(&sim, &db).await;
    eventually("5 replicas after restart", async || {
        (replicas(&deployments, "web-deploy").await == Some(5)).then_some(())
    })
    .await;
    let after = sim.counters();
    assert!(
        after.list_objects - before.list_objects <= 2,
        "a restart lists at most one object per informer (the RV probes), listed {}",
        after.list_objects - before.list_objects
    );

    // Delete → handled.
    foos.delete("web", &DeleteParams::default()).await.unwrap();
    let ctx = r.ctx.clone();
    eventually("the delete", async || {
        ctx.events
            .lock()
            .unwrap()
            .iter()
            .any(|e| e == "Deleted: default/web")
            .then_some(())
    })
    .await;
    // The finalizer's cleanup deleted the owned Deployment before the Foo went (the simulated
    // cluster has no garbage collector: nothing else deletes it).
    assert!(deployments.get_opt("web-deploy").await.unwrap().is_none());
    {
        let events = ctx.events.lock().unwrap();
        let cleanup = events.iter().position(|e| e.starts_with("Cleanup: ") && e.contains("web-deploy"));
        let deleted = events.iter().position(|e| e == "Deleted: default/web");
        assert!(cleanup.is_some() && cleanup < deleted, "{events:?}");
    }
    // Deleting the thief leaves the Deployment it never owned.
    foos.delete("thief", &DeleteParams::default()).await.unwrap();
    eventually("the thief gone", async || foos.get_opt("thief").await.unwrap().is_none().then_some(())).await;
    assert!(deployments.get_opt("foreign").await.unwrap().is_some());
    r.stop.send(true).unwrap();
    r.task.await.unwrap().unwrap();
}
