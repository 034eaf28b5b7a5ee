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
//! sample_controller --in-cluster --db /var/lib/sample-controller/cache.redb --health-addr 0.0.0.0:8080
//! ```
//! Against a real cluster, the Foo CRD must be installed (`deploy/base/crd-foo.yaml`).
//! `deploy/` runs it as a StatefulSet (docs/deploying.md) with these options:
//!
//! * `--in-cluster`: kube's inferred configuration, `$KUBECONFIG` or the Pod's service account;
//! * `--health-addr ADDR`: serve `/livez` (the database writer answers), `/readyz` (both
//!   informers synced, and a durable commit within 30 s) and `/metrics`;
//! * `--leader-elect`: reconcile only while holding the Lease `sample-controller` in
//!   `$POD_NAMESPACE`, as `$POD_NAME`; a follower keeps its cache warm;
//! * `--shards N` (`--shard-index I`, else the ordinal ending `$POD_NAME`): cache and reconcile
//!   only shard I of N of the namespaces (KEP-5866 ranges of `metadata.namespace`);
//! * `--retention-entries N`: keep at most N log entries (the store's default is 1,000,000),
//!   which bounds the database's size (docs/deploying.md#sizing);
//! * `--live-inspection`: let `durable-informer get …` read the database while this runs, at
//!   the cost of an fsync per commit (docs/cli.md#inspecting-a-live-database).
//!
//! SIGTERM or SIGINT stops it: the reconciles in flight finish, the Lease is released, the
//! database closed.
//!
//! The reconcile is written as for kube-runtime (`Arc<Foo>` in, kube's `Action` out, through
//! kube's `finalizer` helper, whose `Action` is returned as is); the controller's delete hook
//! records each Foo that is gone.

#![allow(dead_code)] // shared with tests/sample_controller.rs, which uses other parts of it
#![allow(missing_docs)] // an example; its items are described in the module docs
#![allow(clippy::disallowed_names)] // `Foo` is the resource sample-controller is about

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use durable_informer::controller::{requeue_rate_limited, Action, Config, Controller, Relation};
use durable_informer::informer::{Informer, Lister};
use durable_informer::leader::{KubeLeaseLock, LeaderElectionConfig, LeaderElector};
use durable_informer::reflector::{Phase, ReflectorStatus};
use durable_informer::selector::ShardSelector;
use durable_informer::source::KubeSource;
use durable_informer::store::{DurableStore, StoreConfig, StoreError, Writer};
use futures::StreamExt;
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

/// `namespace/name` of a Foo.
fn key_of(foo: &Foo) -> String {
    format!(
        "{}/{}",
        foo.metadata.namespace.as_deref().unwrap_or_default(),
        foo.metadata.name.as_deref().unwrap_or_default()
    )
}

/// Records the failure, then retries through the rate limiter (client-go's policy).
pub fn error_policy(foo: Arc<Foo>, error: &StepError, ctx: Arc<Ctx>) -> Action {
    ctx.errors
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(format!("{}: {error}", key_of(&foo)));
    requeue_rate_limited()
}

/// The finalizer this controller puts on each Foo, so that deleting a Foo waits for
/// [`cleanup`] (kube's finalizer helper adds and removes it).
pub const FINALIZER: &str = "samplecontroller.k8s.io/deployment";

/// A reconcile's failure (kube's finalizer helper wants a `std::error::Error`).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct StepError(String);

impl From<String> for StepError {
    fn from(s: String) -> Self {
        Self(s)
    }
}

/// The reconcile function of sample-controller's `syncHandler`.
pub async fn reconcile(foo: Arc<Foo>, ctx: Arc<Ctx>) -> Result<Action, StepError> {
    let ns = foo.metadata.namespace.clone().unwrap_or_default();
    let foos: Api<Foo> = Api::namespaced(ctx.client.clone(), &ns);
    // Adds the finalizer first (a patch; the change comes back as an event), then either
    // applies the Foo or, once it is being deleted, cleans up and removes the finalizer. The
    // Action chosen inside is the one returned.
    finalizer(&foos, FINALIZER, foo, |event| async {
        match event {
            FinalizerEvent::Apply(foo) => apply(&foo, &ctx).await,
            FinalizerEvent::Cleanup(foo) => cleanup(&foo, &ctx).await,
        }
    })
    .await
    .map_err(|e| StepError(e.to_string()))
}

/// The delete hook: the Foo is gone (its finalizer's cleanup ran before the server let it go).
async fn deleted(foo: Arc<Foo>, ctx: Arc<Ctx>) -> Result<(), Infallible> {
    let key = key_of(&foo);
    println!("foo {key} no longer exists");
    ctx.events
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(format!("Deleted: {key}"));
    Ok(())
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
async fn cleanup(foo: &Foo, ctx: &Ctx) -> Result<Action, StepError> {
    let ns = foo.metadata.namespace.clone().unwrap_or_default();
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
            Err(e) => return Err(StepError(format!("deleting deployment: {e}"))),
        }
        record_event(ctx, foo, "Normal", "Cleanup", &format!("Deployment {name:?} deleted")).await;
    }
    Ok(Action::await_change())
}

/// sample-controller's `syncHandler` for a Foo that is not being deleted.
async fn apply(foo: &Foo, ctx: &Ctx) -> Result<Action, StepError> {
    let ns = foo.metadata.namespace.clone().unwrap_or_default();
    let key = key_of(foo);
    if foo.spec.deployment_name.is_empty() {
        // Invalid object: retrying will not help.
        println!("foo {key}: deployment name must be specified");
        return Ok(Action::await_change());
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
        return Err(StepError(msg));
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
        let name = foo.metadata.name.clone().unwrap_or_default();
        foos.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
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
    Ok(Action::await_change())
}

/// How [`run_with`] runs in a cluster (the options of `main`, see the module docs).
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Serve `/livez`, `/readyz` and `/metrics` here.
    pub health: Option<SocketAddr>,
    /// Reconcile only while holding this Lease.
    pub lease: Option<LeaseOptions>,
    /// Cache and reconcile only this shard.
    pub shard: Option<ShardSelector>,
    /// Keep at most this many log entries (the store's default: 1,000,000).
    pub retention_entries: Option<u64>,
    /// Let `durable-informer get …` read the database while this runs (every commit fsynced).
    pub live_inspection: bool,
}

/// The Lease of `--leader-elect`.
#[derive(Debug, Clone)]
pub struct LeaseOptions {
    pub namespace: String,
    pub name: String,
    pub identity: String,
}

/// Runs the controller on `db` until `stop`; returns its context (what it did).
pub async fn run(
    client: kube::Client,
    server: &str,
    db_path: &Path,
    stop: tokio::sync::watch::Receiver<bool>,
    started: tokio::sync::oneshot::Sender<Arc<Ctx>>,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    run_with(client, server, db_path, RunOptions::default(), stop, started).await
}

/// [`run`] with the options of a deployment (health endpoints, leader election, sharding).
pub async fn run_with(
    client: kube::Client,
    server: &str,
    db_path: &Path,
    options: RunOptions,
    stop: tokio::sync::watch::Receiver<bool>,
    started: tokio::sync::oneshot::Sender<Arc<Ctx>>,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let mut config = StoreConfig::new(db_path).live_inspection(options.live_inspection);
    if let Some(n) = options.retention_entries {
        config = config.retention_entries(Some(n));
    }
    let db = tokio::task::spawn_blocking(move || DurableStore::open(config)).await??;
    let mut foos = Informer::<Foo>::builder(&db, KubeSource::typed::<Foo>(client.clone(), server));
    let mut deployments = Informer::<Deployment>::builder(&db, KubeSource::typed::<Deployment>(client.clone(), server));
    if let Some(shard) = &options.shard {
        println!("shard: {shard}");
        foos = foos.sharding(shard.clone());
        deployments = deployments.sharding(shard.clone());
    }
    let foos = foos.build().await?;
    let deployments = deployments.build().await?;
    let health = match options.health {
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(addr).await?;
            println!("health endpoints on http://{}", listener.local_addr()?);
            let health = Arc::new(Health::new(vec![
                ("foos", foos.status()),
                ("deployments", deployments.status()),
            ]));
            tokio::spawn(watch_writer(health.clone(), db.writer(), stop.clone()));
            Some(tokio::spawn(serve_health(listener, health, stop.clone())))
        }
        None => None,
    };
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "sample-controller".into(),
            instance: None,
        },
    );
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        recorder,
        foos: foos.lister(),
        deployments: deployments.lister(),
        events: Mutex::new(Vec::new()),
        errors: Mutex::new(Vec::new()),
    });
    let _ = started.send(ctx.clone());
    // `run` starts both informers; Deployments whose controlling owner is a Foo (group
    // samplecontroller.k8s.io, from the type) reconcile that Foo.
    let hook_ctx = ctx.clone();
    let mut stopping = stop.clone();
    let mut controller = Controller::for_informer(foos.clone())
        .name("sample-controller")
        .owns_informer(deployments.clone(), Relation::new().controller_only())
        .with_config(Config::default().concurrency(2))
        .on_delete(move |foo| deleted(foo, hook_ctx.clone()))
        .graceful_shutdown_on(async move {
            let _ = stopping.wait_for(|s| *s).await;
        });
    // The elector stops after the controller, so the Lease is released only once no
    // reconcile runs any more.
    let (elector_stop_tx, elector_stop) = tokio::sync::watch::channel(false);
    let elector = match options.lease {
        Some(l) => {
            let lock = KubeLeaseLock::new(client.clone(), &l.namespace, &l.name, &l.identity);
            let elector = LeaderElector::new(lock, LeaderElectionConfig::default());
            controller = controller.leader_election(elector.fenced_leadership());
            let mut leading = elector.leadership();
            tokio::spawn(async move {
                while leading.changed().await.is_ok() {
                    let now = *leading.borrow_and_update();
                    println!("leading: {now}");
                }
            });
            Some(tokio::spawn(elector.run(elector_stop)))
        }
        None => None,
    };
    let (mut reconciled, mut failed) = (0_u64, 0_u64);
    let mut results = std::pin::pin!(controller.run(reconcile, error_policy, ctx));
    let mut fatal = None;
    while let Some(res) = results.next().await {
        match res {
            Ok(_) => reconciled += 1,
            Err(e @ durable_informer::controller::Error::Informer(_)) => fatal = Some(e.to_string()),
            Err(_) => failed += 1,
        }
    }
    let _ = elector_stop_tx.send(true);
    if let Some(elector) = elector {
        elector.await??;
    }
    if let Some(h) = health {
        h.abort();
    }
    if let Some(e) = fatal {
        return Err(e.into());
    }
    println!("reconciled {reconciled} times, {failed} failed");
    foos.shutdown().await?;
    deployments.shutdown().await?;
    drop((foos, deployments));
    tokio::task::spawn_blocking(move || db.close()).await??;
    Ok(())
}

/// The options of `main` beyond the cluster and the database (see the module docs); `env`
/// reads the environment (`POD_NAME`, `POD_NAMESPACE`, `HOSTNAME`).
pub fn cluster_options(args: &[String], env: impl Fn(&str) -> Option<String>) -> Result<RunOptions, String> {
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .map(|i| args.get(i + 1).cloned().ok_or(format!("{name} needs a value")))
            .transpose()
    };
    let env = |name: &str| env(name).filter(|v| !v.is_empty());
    let health = arg("--health-addr")?
        .map(|a| a.parse::<SocketAddr>().map_err(|e| format!("--health-addr {a}: {e}")))
        .transpose()?;
    let lease = if args.iter().any(|a| a == "--leader-elect") {
        Some(LeaseOptions {
            namespace: env("POD_NAMESPACE").ok_or("--leader-elect needs POD_NAMESPACE (the Lease's namespace)")?,
            name: "sample-controller".into(),
            identity: env("POD_NAME")
                .or_else(|| env("HOSTNAME"))
                .ok_or("--leader-elect needs POD_NAME (this replica's identity)")?,
        })
    } else {
        None
    };
    let shard = match arg("--shards")? {
        Some(n) => {
            let count: u32 = n.parse().map_err(|e| format!("--shards {n}: {e}"))?;
            let index: u32 = match arg("--shard-index")? {
                Some(i) => i.parse().map_err(|e| format!("--shard-index {i}: {e}"))?,
                // A StatefulSet Pod's name ends in its ordinal: sample-controller-2.
                None => env("POD_NAME")
                    .and_then(|p| p.rsplit('-').next().and_then(|o| o.parse().ok()))
                    .ok_or("--shards needs --shard-index I, or POD_NAME ending in -<ordinal>")?,
            };
            Some(ShardSelector::by_namespace(index, count).map_err(|e| format!("--shards {count}: {e}"))?)
        }
        None => None,
    };
    let retention_entries = arg("--retention-entries")?
        .map(|n| n.parse::<u64>().map_err(|e| format!("--retention-entries {n}: {e}")))
        .transpose()?;
    Ok(RunOptions {
        health,
        lease,
        shard,
        retention_entries,
        live_inspection: args.iter().any(|a| a == "--live-inspection"),
    })
}

/// What the probes answer from: the informers' status, and what the database writer last
/// did (checked every few seconds by [`watch_writer`], never on the probe's request).
struct Health {
    informers: Vec<(&'static str, tokio::sync::watch::Receiver<ReflectorStatus>)>,
    writer: Mutex<WriterHealth>,
}

#[derive(Default)]
struct WriterHealth {
    /// When the writer last answered a flush, successfully or not.
    answered: Option<Instant>,
    /// When a flush last made everything durable.
    durable: Option<Instant>,
    /// The last flush's error.
    error: Option<String>,
    /// The writer thread is gone (it panicked, or the database was closed).
    gone: bool,
}

/// Readiness wants a durable commit this recent; liveness an answer this recent.
const READY_WITHIN: Duration = Duration::from_secs(30);
const ALIVE_WITHIN: Duration = Duration::from_secs(60);

impl Health {
    fn new(informers: Vec<(&'static str, tokio::sync::watch::Receiver<ReflectorStatus>)>) -> Self {
        Self {
            informers,
            writer: Mutex::new(WriterHealth::default()),
        }
    }

    /// `/livez`: the writer thread is there and answers (a full disk is not a reason to
    /// restart: the writer retries, and readiness reports it).
    fn live(&self) -> Result<(), String> {
        let w = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        if w.gone {
            return Err("the database writer is gone".into());
        }
        match w.answered {
            Some(t) if t.elapsed() > ALIVE_WITHIN => {
                Err(format!("the database writer has not answered for {:.0?}", t.elapsed()))
            }
            _ => Ok(()),
        }
    }

    /// `/readyz`: every informer synced and running, and the database took a durable commit.
    fn ready(&self) -> Result<(), String> {
        for (name, status) in &self.informers {
            let s = status.borrow();
            if s.phase == Phase::Stopped {
                return Err(format!(
                    "{name}: stopped ({})",
                    s.last_error.as_deref().unwrap_or("no error")
                ));
            }
            if !s.synced {
                return Err(format!("{name}: not synced yet ({:?})", s.phase));
            }
        }
        self.live()?;
        let w = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(e) = &w.error {
            return Err(format!("database: {e}"));
        }
        match w.durable {
            Some(t) if t.elapsed() <= READY_WITHIN => Ok(()),
            Some(t) => Err(format!("database: no durable commit for {:.0?}", t.elapsed())),
            None => Err("database: no durable commit yet".into()),
        }
    }

    fn answer(&self, path: &str) -> http::Response<http_body_util::Full<bytes::Bytes>> {
        let (status, content_type, body) = match path {
            "/livez" | "/healthz" => match self.live() {
                Ok(()) => (200, "text/plain", "ok\n".to_string()),
                Err(e) => (503, "text/plain", format!("{e}\n")),
            },
            "/readyz" => match self.ready() {
                Ok(()) => (200, "text/plain", "ok\n".to_string()),
                Err(e) => (503, "text/plain", format!("{e}\n")),
            },
            #[cfg(feature = "metrics")]
            "/metrics" => (
                200,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                durable_informer::metrics::encode(),
            ),
            _ => (404, "text/plain", "not found\n".to_string()),
        };
        http::Response::builder()
            .status(status)
            .header(http::header::CONTENT_TYPE, content_type)
            .body(http_body_util::Full::new(bytes::Bytes::from(body)))
            .unwrap_or_default()
    }
}

/// Every 5 s, asks the writer for a durable commit and records how it went.
async fn watch_writer(health: Arc<Health>, writer: Writer, mut stop: tokio::sync::watch::Receiver<bool>) {
    loop {
        let flushed = tokio::time::timeout(Duration::from_secs(20), writer.flush()).await;
        {
            let mut w = health.writer.lock().unwrap_or_else(PoisonError::into_inner);
            let now = Instant::now();
            match flushed {
                Ok(Ok(())) => {
                    w.answered = Some(now);
                    w.durable = Some(now);
                    w.error = None;
                }
                Ok(Err(StoreError::WriterGone)) => w.gone = true,
                Ok(Err(e)) => {
                    w.answered = Some(now);
                    w.error = Some(e.to_string());
                }
                // No answer: `answered` ages until liveness fails.
                Err(_) => {}
            }
        }
        tokio::select! {
            () = tokio::time::sleep(Duration::from_secs(5)) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// Serves the probes and `/metrics` until `stop`.
async fn serve_health(
    listener: tokio::net::TcpListener,
    health: Arc<Health>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.wait_for(|s| *s) => return,
        };
        let Ok((stream, _)) = accepted else {
            // Out of file descriptors, say: try again shortly rather than spin.
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let health = health.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                let response = health.answer(req.uri().path());
                async move { Ok::<_, Infallible>(response) }
            });
            let io = hyper_util::rt::TokioIo::new(stream);
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(io, svc)
                .await;
        });
    }
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
    let config = if let Some(kubeconfig) = arg("--kubeconfig") {
        let kc = kube::config::Kubeconfig::read_from(&kubeconfig)?;
        Some(kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?)
    } else if args.iter().any(|a| a == "--in-cluster") {
        Some(kube::Config::infer().await?)
    } else {
        None
    };
    if let Some(config) = config {
        // Logs go to stderr (RUST_LOG, default: warnings); stdout carries the example's lines.
        tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
            )
            .with_writer(std::io::stderr)
            .init();
        let options = cluster_options(&args, |name| std::env::var(name).ok())?;
        let server = config.cluster_url.to_string();
        let client = kube::Client::try_from(config)?;
        let mut ctrl = tokio::spawn(async move { run_with(client, &server, &db, options, stop, started_tx).await });
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            // It ended by itself: an informer never synced (another cluster's database, …).
            done = &mut ctrl => return done?,
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        println!("stopping");
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
