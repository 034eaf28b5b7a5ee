//! `examples/sample_controller.rs` against real kube-apiservers, v1.20.2 and v1.37.2 (issues
//! #11 and #34): the Foo CRD installed through apiextensions.k8s.io/v1, then create, scale,
//! refuse a foreign Deployment, status, a restart that resumes without a full list, and delete.
//!
//! There is no controller-manager: Deployments get no status and no Pods, so the test asserts
//! what sample-controller itself does. Ignored by default: run `scripts/envtest-install`,
//! then `cargo test --all-features --test 'envtest_*' -- --ignored`.

mod envtest;

#[path = "../examples/sample_controller.rs"]
#[allow(unused_imports, clippy::all)]
mod sample;

use std::sync::Arc;
use std::time::Duration;

use envtest::{eventually, on_servers, EnvTest, Server};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use sample::{Ctx, Foo};

/// The user the controller authenticates as.
const CONTROLLER: &str = "controller";

/// sample-controller's CRD (artifacts/examples/crd-status-subresource.yaml), in
/// apiextensions.k8s.io/v1 with its structural schema.
fn foo_crd() -> CustomResourceDefinition {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": "foos.samplecontroller.k8s.io",
            // *.k8s.io is a protected group: upstream's CRD carries this annotation too.
            "annotations": {"api-approved.kubernetes.io": "unapproved, experimental-only; please get an approval from Kubernetes API reviewers if you're trying to develop a CRD in the *.k8s.io or *.kubernetes.io groups"}
        },
        "spec": {
            "group": "samplecontroller.k8s.io",
            "scope": "Namespaced",
            "names": {"kind": "Foo", "plural": "foos", "singular": "foo", "listKind": "FooList"},
            "versions": [{
                "name": "v1alpha1",
                "served": true,
                "storage": true,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "properties": {
                        "spec": {
                            "type": "object",
                            "properties": {
                                "deploymentName": {"type": "string"},
                                "replicas": {"type": "integer", "minimum": 1, "maximum": 10}
                            }
                        },
                        "status": {
                            "type": "object",
                            "properties": {"availableReplicas": {"type": "integer"}}
                        }
                    }
                }}
            }]
        }
    }))
    .unwrap()
}

async fn install_crd(client: &kube::Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), &foo_crd()).await.unwrap();
    eventually("the Foo CRD to be established", 60, async || {
        let crd = crds.get("foos.samplecontroller.k8s.io").await.ok()?;
        let established = crd
            .status?
            .conditions?
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        established.then_some(())
    })
    .await;
    // Established is reported a moment before the REST endpoint serves.
    let foos: Api<Foo> = Api::namespaced(client.clone(), "default");
    eventually("the foos endpoint", 30, async || {
        foos.list(&Default::default()).await.ok()
    })
    .await;
}

/// Creates a Foo. The example's `Foo` type carries no `apiVersion`/`kind` (it only reads
/// Foos and patches their status), and a real apiserver refuses a create without them, so the
/// Foo is posted as a `DynamicObject` and read back as a `Foo`.
async fn create_foo(client: &kube::Client, name: &str, deployment: &str, replicas: i32) -> Foo {
    let ar = ApiResource::erase::<Foo>(&());
    let obj: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "samplecontroller.k8s.io/v1alpha1",
        "kind": "Foo",
        "metadata": {"name": name},
        "spec": {"deploymentName": deployment, "replicas": replicas}
    }))
    .unwrap();
    let created = Api::<DynamicObject>::namespaced_with(client.clone(), "default", &ar)
        .create(&PostParams::default(), &obj)
        .await
        .unwrap();
    serde_json::from_value(serde_json::to_value(created).unwrap()).unwrap()
}

struct Running {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<Result<(), Box<dyn std::error::Error + Send + Sync>>>,
    ctx: Arc<Ctx>,
}

async fn start(env: &EnvTest, db: &std::path::Path) -> Running {
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let (tx, rx) = tokio::sync::oneshot::channel();
    let client = env.client_as(CONTROLLER).await;
    let url = env.url();
    let db = db.to_owned();
    let task = tokio::spawn(async move { sample::run(client, &url, &db, stop_rx, tx).await });
    let ctx = match rx.await {
        Ok(ctx) => ctx,
        Err(_) => panic!("the controller failed to start: {:?}", task.await),
    };
    Running { stop, task, ctx }
}

impl Running {
    async fn stop(self) {
        self.stop.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(60), self.task)
            .await
            .expect("the controller stops")
            .unwrap()
            .unwrap();
    }

    async fn event(&self, what: &str, pred: impl Fn(&str) -> bool) {
        let ctx = self.ctx.clone();
        eventually(what, 60, async || {
            ctx.events.lock().unwrap().iter().any(|e| pred(e)).then_some(())
        })
        .await;
    }
}

async fn replicas(api: &Api<Deployment>, name: &str) -> Option<i32> {
    api.get_opt(name)
        .await
        .ok()
        .flatten()
        .and_then(|d| d.spec)
        .and_then(|s| s.replicas)
}

on_servers!(sample_controller_converges_against_a_real_apiserver);
async fn sample_controller_converges_against_a_real_apiserver(server: Server) {
    let env = EnvTest::start(server).await;
    let client = env.client().await;
    install_crd(&client).await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ctrl.redb");
    let foos: Api<Foo> = Api::namespaced(client.clone(), "default");
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");

    let r = start(&env, &db).await;
    // Create → a Deployment with the right replicas, owned by the Foo; the Foo's status is
    // written through the status subresource (0 available: no controller-manager here).
    let created = create_foo(&client, "web", "web-deploy", 1).await;
    let d = eventually("the deployment", 60, async || {
        deployments.get_opt("web-deploy").await.ok().flatten()
    })
    .await;
    assert_eq!(d.spec.as_ref().and_then(|s| s.replicas), Some(1));
    let owner = &d.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), Some(&owner.uid)),
        ("Foo", created.metadata.uid.as_ref())
    );
    assert_eq!(owner.controller, Some(true));
    // The Foo carries the controller's finalizer (added before the Deployment was made).
    let f = foos.get("web").await.unwrap();
    assert_eq!(f.metadata.finalizers, Some(vec![sample::FINALIZER.to_string()]));
    eventually("the Foo status", 60, async || {
        let f = foos.get("web").await.ok()?;
        (f.status?.available_replicas == 0).then_some(())
    })
    .await;
    r.event("Synced", |e| e.starts_with("Synced") && e.contains("default/web"))
        .await;
    // The controller's Events reached the real events API.
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client.clone(), "default");
    eventually("a Synced Event object", 30, async || {
        let list = events.list(&Default::default()).await.ok()?;
        list.items
            .iter()
            .any(|e| e.reason.as_deref() == Some("Synced") && e.involved_object.name.as_deref() == Some("web"))
            .then_some(())
    })
    .await;

    // Scale.
    foos.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"replicas": 3}})),
    )
    .await
    .unwrap();
    eventually("3 replicas", 60, async || {
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
    create_foo(&client, "thief", "foreign", 1).await;
    r.event("ErrResourceExists", |e| {
        e.starts_with("ErrResourceExists") && e.contains("foreign")
    })
    .await;
    let foreign = deployments.get("foreign").await.unwrap();
    assert!(
        foreign.metadata.owner_references.unwrap_or_default().is_empty(),
        "not adopted"
    );
    assert_eq!(foreign.spec.and_then(|s| s.replicas), Some(7), "not scaled");

    // Stop midway; change the Foo while the controller is down; restart on the same database.
    r.stop().await;
    foos.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"replicas": 5}})),
    )
    .await
    .unwrap();
    let mark = env.audit_events().len();
    let r = start(&env, &db).await;
    eventually("5 replicas after restart", 60, async || {
        (replicas(&deployments, "web-deploy").await == Some(5)).then_some(())
    })
    .await;
    // The restart made no full list: at most the one-object RV probes and the watch cache's
    // revision probes (which match no object), and no streaming list (a watch with
    // sendInitialEvents, which v1.37 serves).
    let full: Vec<String> = env
        .audit_events()
        .into_iter()
        .skip(mark)
        .filter(|e| e["user"]["username"] == CONTROLLER)
        .filter_map(|e| {
            let uri = e["requestURI"].as_str().unwrap_or_default().to_owned();
            let param = |p: &str| uri.split(['?', '&']).any(|q| q == p);
            let full = match e["verb"].as_str() {
                Some("list") => !param("limit=1") && !uri.contains("_revision_probe_"),
                Some("watch") => param("sendInitialEvents=true"),
                _ => false,
            };
            full.then_some(uri)
        })
        .collect();
    assert!(full.is_empty(), "full LISTs after the restart: {full:?}");

    // Delete → the finalizer's cleanup deletes the Deployment (there is no garbage collector
    // here), then the real server lets the Foo go.
    foos.delete("web", &DeleteParams::default()).await.unwrap();
    r.event("the delete", |e| e == "Deleted: default/web").await;
    assert!(deployments.get_opt("web-deploy").await.unwrap().is_none());
    assert!(foos.get_opt("web").await.unwrap().is_none());
    r.stop().await;
}
