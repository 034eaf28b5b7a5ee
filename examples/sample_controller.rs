//! Kubernetes' sample-controller on durable informers: a `Foo` custom resource
//! (`samplecontroller.k8s.io/v1alpha1`, `spec.deploymentName`, `spec.replicas`) owns a
//! Deployment. The controller creates it, keeps its replicas in line with the Foo, refuses to
//! adopt a Deployment it does not own (an Event and an error), copies
//! `status.availableReplicas` back to the Foo, and holds a finalizer on each Foo so that
//! deleting one deletes its Deployment first (kube's `finalizer` helper).
//!
//! ```text
//! cargo run --features sim --example sample_controller                         # against the built-in simulated cluster
//! cargo run --features sim --example sample_controller -- --kubeconfig ~/.kube/config --db foo.redb
//! ```
//! Against a real cluster, the Foo CRD must be installed (see Kubernetes' sample-controller).

#![allow(dead_code)] // shared with tests/sample_controller.rs, which uses other parts of it
#![allow(missing_docs)] // an example; its items are described in the module docs
#![allow(clippy::disallowed_names)] // `Foo` is the resource sample-controller is about

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use durable_informer::controller::{Action, Controller};
use durable_informer::informer::{Informer, Lister};
use durable_informer::object::ObjectKey;
use durable_informer::source::KubeSource;
use durable_informer::store::{DurableStore, StoreConfig};
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::finalizer::{finalizer, Event as FinalizerEvent};
use kube::{CustomResource, Resource as _};
use serde::{Deserialize, Serialize};

/// The spec of the `Foo` custom resource (`samplecontroller.k8s.io/v1alpha1`); kube's
/// `CustomResource` derive writes the `Foo` type itself (metadata, spec, status, `apiVersion`
/// and `kind` on every write, and its `kube::Resource`).
#[derive(CustomResource, Clone, Debug, Default, Serialize, Deserialize)]
#[kube(
    group = "samplecontroller.k8s.io",
    version = "v1alpha1",
    kind = "Foo",
    namespaced,
    status = "FooStatus",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct FooSpec {
    pub deployment_name: String,
    pub replicas: Option<i32>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FooStatus {
    pub available_replicas: i32,
}

/// What the reconciler needs, and what it did (for tests and the demo output).
pub struct Ctx {
    pub client: kube::Client,
    pub foos: Lister<Foo>,
    pub deployments: Lister<Deployment>,
    /// Events recorded (`reason: message`), also published as `events.k8s.io/v1` Events.
    pub events: Mutex<Vec<String>>,
    /// kube-runtime's event recorder: each Event names the Foo it is about (`regarding`).
    pub recorder: Recorder,
    /// Failed reconciles (`key: error`), each requeued through the rate limiter.
    pub errors: Mutex<Vec<String>>,
}

const MESSAGE_RESOURCE_EXISTS: &str = "already exists and is not managed by Foo";

async fn record_event(ctx: &Ctx, foo: &Foo, kind: &str, reason: &str, message: &str) {
    println!("event {kind} {reason}: {message}");
    ctx.events
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(format!("{reason}: {message}"));
    let ev = Event {
        type_: if kind == "Warning" {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: reason.into(),
        note: Some(message.into()),
        action: "Reconciling".into(),
        secondary: None,
    };
    // Best effort: a cluster without the events API still gets the log line above.
    if let Err(e) = ctx.recorder.publish(&ev, &foo.object_ref(&())).await {
        println!("event not published: {e}");
    }
}

fn new_deployment(foo: &Foo) -> Deployment {
    let labels = std::collections::BTreeMap::from([
        ("app".to_string(), "nginx".to_string()),
        ("controller".to_string(), foo.metadata.name.clone().unwrap_or_default()),
    ]);
    Deployment {
        metadata: ObjectMeta {
            name: Some(foo.spec.deployment_name.clone()),
            namespace: foo.metadata.namespace.clone(),
            owner_references: Some(vec![OwnerReference {
                api_version: "samplecontroller.k8s.io/v1alpha1".into(),
                kind: "Foo".into(),
                name: foo.metadata.name.clone().unwrap_or_default(),
                uid: foo.metadata.uid.clone().unwrap_or_default(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            ..ObjectMeta::default()
        },
        spec: Some(DeploymentSpec {
            replicas: foo.spec.replicas,
            selector: LabelSelector {
                match_labels: Some(labels.clone()),
                ..LabelSelector::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    containers: vec![Container {
                        name: "nginx".into(),
                        image: Some("nginx:latest".into()),
                        ..Container::default()
                    }],
                    ..PodSpec::default()
                }),
            },
            ..DeploymentSpec::default()
        }),
        status: None,
    }
}

/// The reconcile function of sample-controller's `syncHandler`.
/// Records the failure, then retries through the rate limiter (client-go's policy).
pub fn error_policy(key: &ObjectKey, error: &String, ctx: Arc<Ctx>) -> Action {
    ctx.errors
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(format!("{key}: {error}"));
    Action::requeue_rate_limited()
}

/// The finalizer this controller puts on each Foo, so that deleting a Foo waits for
/// [`cleanup`] (kube's finalizer helper adds and removes it).
pub const FINALIZER: &str = "samplecontroller.k8s.io/deployment";

/// A reconcile step's failure (kube's finalizer helper wants a `std::error::Error`).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct StepError(String);

impl From<String> for StepError {
    fn from(s: String) -> Self {
        Self(s)
    }
}

pub async fn reconcile(key: ObjectKey, ctx: Arc<Ctx>) -> Result<Action, String> {
    let ns = key.namespace.clone().unwrap_or_default();
    let Some(foo) = ctx.foos.namespace(&ns).get(&key.name).map_err(|e| e.to_string())? else {
        // Gone from the cache: the finalizer's cleanup ran before the server let it go.
        println!("foo {key} no longer exists");
        ctx.events
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(format!("Deleted: {key}"));
        return Ok(Action::await_change());
    };
    let foos: Api<Foo> = Api::namespaced(ctx.client.clone(), &ns);
    // Adds the finalizer first (a patch; the change comes back as an event), then either
    // applies the Foo or, once it is being deleted, cleans up and removes the finalizer.
    finalizer(&foos, FINALIZER, foo, |event| async {
        match event {
            FinalizerEvent::Apply(foo) => apply(&key, &foo, &ctx).await?,
            FinalizerEvent::Cleanup(foo) => cleanup(&key, &foo, &ctx).await?,
        }
        Ok::<_, StepError>(kube::runtime::controller::Action::await_change())
    })
    .await
    .map_err(|e| e.to_string())?;
    Ok(Action::await_change())
}

fn owns(foo: &Foo, deployment: &Deployment) -> bool {
    deployment
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && o.kind == "Foo" && Some(&o.uid) == foo.metadata.uid.as_ref())
}

/// A Foo being deleted: delete the Deployment it owns (a cluster's garbage collector would do
/// it too, after the Foo is gone; the finalizer makes it happen before, and on the simulated
/// cluster, which has no collector, at all).
async fn cleanup(key: &ObjectKey, foo: &Foo, ctx: &Ctx) -> Result<(), String> {
    let ns = key.namespace.clone().unwrap_or_default();
    let name = &foo.spec.deployment_name;
    let owned = ctx
        .deployments
        .namespace(&ns)
        .get(name)
        .map_err(|e| e.to_string())?
        .is_some_and(|d| owns(foo, &d));
    if owned {
        let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &ns);
        match deployments.delete(name, &DeleteParams::background()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(format!("deleting deployment: {e}")),
        }
        record_event(ctx, foo, "Normal", "Cleanup", &format!("Deployment {name:?} deleted")).await;
    }
    Ok(())
}

/// sample-controller's `syncHandler` for a Foo that is not being deleted.
async fn apply(key: &ObjectKey, foo: &Foo, ctx: &Ctx) -> Result<(), String> {
    let ns = key.namespace.clone().unwrap_or_default();
    if foo.spec.deployment_name.is_empty() {
        // Invalid object: retrying will not help.
        println!("foo {key}: deployment name must be specified");
        return Ok(());
    }
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &ns);
    let deployment = match ctx
        .deployments
        .namespace(&ns)
        .get(&foo.spec.deployment_name)
        .map_err(|e| e.to_string())?
    {
        Some(d) => (*d).clone(),
        None => deployments
            .create(&PostParams::default(), &new_deployment(foo))
            .await
            .map_err(|e| format!("creating deployment: {e}"))?,
    };
    if !owns(foo, &deployment) {
        let msg = format!("Resource {:?} {MESSAGE_RESOURCE_EXISTS}", foo.spec.deployment_name);
        record_event(ctx, foo, "Warning", "ErrResourceExists", &msg).await;
        return Err(msg);
    }
    let current = deployment.spec.as_ref().and_then(|s| s.replicas);
    let deployment = if foo.spec.replicas.is_some() && foo.spec.replicas != current {
        println!(
            "foo {key}: replicas {:?}, deployment replicas {:?}",
            foo.spec.replicas, current
        );
        let patch = serde_json::json!({"spec": {"replicas": foo.spec.replicas}});
        deployments
            .patch(
                &foo.spec.deployment_name,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .map_err(|e| format!("updating deployment: {e}"))?
    } else {
        deployment
    };
    let available = deployment
        .status
        .as_ref()
        .and_then(|s| s.available_replicas)
        .unwrap_or(0);
    if foo.status.as_ref().map(|s| s.available_replicas) != Some(available) {
        let foos: Api<Foo> = Api::namespaced(ctx.client.clone(), &ns);
        let patch = serde_json::json!({"status": {"availableReplicas": available}});
        foos.patch_status(&key.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| format!("updating foo status: {e}"))?;
    }
    if ctx
        .events
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .iter()
        .all(|e| !e.contains(&format!("{key} synced")))
    {
        record_event(ctx, foo, "Normal", "Synced", &format!("Foo {key} synced successfully")).await;
    }
    Ok(())
}

/// Runs the controller on `db` until `stop`; returns its context (what it did).
pub async fn run(
    client: kube::Client,
    server: &str,
    db_path: &Path,
    stop: tokio::sync::watch::Receiver<bool>,
    started: tokio::sync::oneshot::Sender<Arc<Ctx>>,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let p = db_path.to_owned();
    let db = tokio::task::spawn_blocking(move || DurableStore::open(StoreConfig::new(p))).await??;
    let foos = Informer::<Foo>::builder(&db, KubeSource::typed::<Foo>(client.clone(), server))
        .build()
        .await?;
    let deployments = Informer::<Deployment>::builder(&db, KubeSource::typed::<Deployment>(client.clone(), server))
        .build()
        .await?;
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "sample-controller".into(),
            instance: None,
        },
    );
    let ctx = Arc::new(Ctx {
        client,
        recorder,
        foos: foos.lister(),
        deployments: deployments.lister(),
        events: Mutex::new(Vec::new()),
        errors: Mutex::new(Vec::new()),
    });
    let _ = started.send(ctx.clone());
    // `run` starts both informers; Deployments whose controlling owner is a Foo (group
    // samplecontroller.k8s.io, from the type) reconcile that Foo.
    let summary = Controller::new(foos.clone())
        .name("sample-controller")
        .owns(deployments.clone())
        .workers(2)
        .run(reconcile, error_policy, ctx, stop)
        .await?;
    println!("reconciled {} times, {} failed", summary.reconciled, summary.failed);
    foos.shutdown().await?;
    deployments.shutdown().await?;
    drop((foos, deployments));
    tokio::task::spawn_blocking(move || db.close()).await??;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let db = PathBuf::from(arg("--db").unwrap_or_else(|| "sample-controller.redb".into()));
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let (started_tx, started) = tokio::sync::oneshot::channel();
    if let Some(kubeconfig) = arg("--kubeconfig") {
        let kc = kube::config::Kubeconfig::read_from(&kubeconfig)?;
        let config = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
        let server = config.cluster_url.to_string();
        let client = kube::Client::try_from(config)?;
        let ctrl = tokio::spawn(async move { run(client, &server, &db, stop, started_tx).await });
        tokio::signal::ctrl_c().await?;
        let _ = stop_tx.send(true);
        let _ = started.await;
        return ctrl.await?;
    }
    // The built-in simulated cluster: register the CRD, create a Foo and a foreign Deployment.
    use durable_informer::sim::{wait_until, ResourceDef, Sim, SimConfig};
    let sim = tokio::task::spawn_blocking(|| {
        Sim::start(
            SimConfig::default()
                .with_resource(ResourceDef::custom(
                    "samplecontroller.k8s.io",
                    "v1alpha1",
                    "Foo",
                    "foos",
                ))
                .with_resource(ResourceDef::custom("events.k8s.io", "v1", "Event", "events")),
        )
    })
    .await??;
    let dir = std::env::temp_dir().join(format!("sample-controller-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let db = dir.join("db.redb");
    let client = sim.client()?;
    let url = sim.url();
    let ctrl = {
        let client = client.clone();
        tokio::spawn(async move { run(client, &url, &db, stop, started_tx).await })
    };
    let ctx = started.await?;
    // Waits for what the controller does, not a fixed time, which a loaded machine can outlast.
    let settle = Duration::from_secs(30);
    let lines = |m: &Mutex<Vec<String>>| m.lock().unwrap_or_else(PoisonError::into_inner).clone();
    let foos: Api<Foo> = Api::namespaced(client.clone(), "default");
    let foo = Foo {
        metadata: ObjectMeta {
            name: Some("example-foo".into()),
            ..ObjectMeta::default()
        },
        spec: FooSpec {
            deployment_name: "example-foo".into(),
            replicas: Some(1),
        },
        status: None,
    };
    foos.create(&PostParams::default(), &foo).await?;
    wait_until(settle, async || {
        lines(&ctx.events)
            .iter()
            .any(|e| e.starts_with("Synced: Foo default/example-foo"))
    })
    .await;
    foos.patch(
        "example-foo",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"replicas": 3}})),
    )
    .await?;
    wait_until(settle, async || {
        let d = ctx.deployments.namespace("default").get("example-foo");
        d.ok().flatten().and_then(|d| d.spec.as_ref()?.replicas) == Some(3)
    })
    .await;
    let deployments = Api::<Deployment>::namespaced(client, "default");
    let d = deployments.get("example-foo").await?;
    println!(
        "deployment example-foo has {:?} replicas",
        d.spec.and_then(|s| s.replicas)
    );
    // A Deployment no Foo owns, claimed by a second Foo: not adopted, an Event and a retry.
    let foreign = serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "foreign", "namespace": "default"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "foreign"}},
                 "template": {"metadata": {"labels": {"app": "foreign"}},
                              "spec": {"containers": [{"name": "c", "image": "nginx"}]}}}
    });
    deployments
        .create(&PostParams::default(), &serde_json::from_value(foreign)?)
        .await?;
    let thief = Foo {
        metadata: ObjectMeta {
            name: Some("thief".into()),
            ..ObjectMeta::default()
        },
        spec: FooSpec {
            deployment_name: "foreign".into(),
            replicas: Some(1),
        },
        status: None,
    };
    foos.create(&PostParams::default(), &thief).await?;
    wait_until(settle, async || {
        !lines(&ctx.errors).is_empty() && lines(&ctx.events).iter().any(|e| e.starts_with("ErrResourceExists"))
    })
    .await;
    let failures = ctx
        .errors
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .len();
    println!("foo default/thief: {failures} failed reconciles, each retried with backoff");
    let _ = stop_tx.send(true);
    ctrl.await??;
    println!(
        "events: {:?}",
        ctx.events.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    );
    let _ = std::fs::remove_dir_all(dir);
    Ok(())
}
