//! A small kube-controller-manager: three controllers started from one [`InformerFactory`] over
//! one database, sharing informers.
//!
//! * **replica-counter** — for each Deployment, counts the running Pods its selector matches and
//!   writes the count to the annotation `example.dev/running-pods` (triggered by Deployments
//!   and by Pods);
//! * **pod-gc** — deletes Pods that have finished (`Succeeded` or `Failed`), like
//!   kube-controller-manager's podgc with a threshold of zero;
//! * **configmap-hasher** — writes a hash of each ConfigMap's data to the annotation
//!   `example.dev/data-hash`, so that changed configuration is easy to spot.
//!
//! replica-counter and pod-gc both ask the factory for the Pods of all namespaces: they get the
//! same informer (same scope in the database, one watch, one copy of the Pods).
//!
//! ```text
//! cargo run --features sim --example controller_manager                         # against the built-in simulated cluster
//! cargo run --features sim --example controller_manager -- --kubeconfig ~/.kube/config --db kcm.redb
//! ```

#![allow(dead_code)] // shared with tests/example_controller_manager.rs, which uses other parts of it
#![allow(missing_docs)] // an example; its items are described in the module docs

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use durable_informer::controller::{default_error_policy, Action, Controller, Relation};
use durable_informer::informer::{InformerFactory, Lister};
use durable_informer::selector::LabelSelector;
use durable_informer::store::{DurableStore, ScopeId, StoreConfig};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;

pub const RUNNING_PODS: &str = "example.dev/running-pods";
pub const DATA_HASH: &str = "example.dev/data-hash";
/// How long the demo waits for the controllers to react; past it, the run goes on and what is
/// missing shows in its output.
const SETTLE: Duration = Duration::from_secs(30);

/// Shared by the three controllers: the listers, a client for writes, and what was done.
pub struct Ctx {
    pub client: kube::Client,
    pub deployments: Lister<Deployment>,
    pub pods: Lister<Pod>,
    pub configmaps: Lister<ConfigMap>,
    /// The scopes replica-counter and pod-gc got when they asked for the Pod informer.
    pub pod_scopes: (ScopeId, ScopeId),
    pub log: Mutex<Vec<String>>,
}

impl Ctx {
    fn record(&self, line: String) {
        println!("{line}");
        self.log
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(line);
    }

    #[must_use]
    pub fn log(&self) -> Vec<String> {
        self.log
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

/// A reconcile's failure, as text.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Failed(String);

/// `namespace/name` of an object.
fn key(meta: &kube::core::ObjectMeta) -> String {
    format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default()
    )
}

/// Logs a failed reconcile of any of the controllers.
async fn log_errors<T>(res: Result<T, durable_informer::controller::Error<Failed>>) {
    if let Err(e) = res {
        tracing::warn!(error = %e, "reconcile");
    }
}

fn is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// The Deployment's `matchLabels` as a selector (`None` when it selects nothing by labels).
fn selector_of(d: &Deployment) -> Option<BTreeMap<String, String>> {
    d.spec
        .as_ref()
        .and_then(|s| s.selector.match_labels.clone())
        .filter(|m| !m.is_empty())
}

fn selects(selector: &BTreeMap<String, String>, pod: &Pod) -> bool {
    let labels = pod.metadata.labels.as_ref();
    selector.iter().all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
}

/// replica-counter's reconcile.
pub async fn count_replicas(d: Arc<Deployment>, ctx: Arc<Ctx>) -> Result<Action, Failed> {
    let ns = d.metadata.namespace.clone().unwrap_or_default();
    let name = d.metadata.name.clone().unwrap_or_default();
    let Some(selector) = selector_of(&d) else {
        return Ok(Action::await_change());
    };
    let text: Vec<String> = selector.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let parsed: LabelSelector = text.join(",").parse().map_err(|e| Failed(format!("selector: {e}")))?;
    let running = ctx
        .pods
        .namespace(&ns)
        .list(&parsed)
        .map_err(|e| Failed(e.to_string()))?
        .iter()
        .filter(|p| !is_terminal(p))
        .count()
        .to_string();
    let current = d.metadata.annotations.as_ref().and_then(|a| a.get(RUNNING_PODS));
    if current == Some(&running) {
        return Ok(Action::await_change());
    }
    let patch = serde_json::json!({"metadata": {"annotations": {RUNNING_PODS: running}}});
    Api::<Deployment>::namespaced(ctx.client.clone(), &ns)
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| Failed(format!("annotating deployment: {e}")))?;
    ctx.record(format!(
        "replica-counter: {} has {running} running pods",
        key(&d.metadata)
    ));
    Ok(Action::await_change())
}

/// pod-gc's reconcile.
pub async fn collect_pod(pod: Arc<Pod>, ctx: Arc<Ctx>) -> Result<Action, Failed> {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    if !is_terminal(&pod) || pod.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    match Api::<Pod>::namespaced(ctx.client.clone(), &ns)
        .delete(&name, &DeleteParams::default())
        .await
    {
        Ok(_) => ctx.record(format!("pod-gc: deleted finished pod {}", key(&pod.metadata))),
        // Someone else deleted it first: the goal is reached.
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => return Err(Failed(format!("deleting pod: {e}"))),
    }
    Ok(Action::await_change())
}

/// FNV-1a over the sorted keys and values: stable across processes and platforms.
#[must_use]
pub fn data_hash(data: Option<&BTreeMap<String, String>>) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for (k, v) in data.into_iter().flatten() {
        for b in k.bytes().chain([0]).chain(v.bytes()).chain([0]) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{h:016x}")
}

/// configmap-hasher's reconcile.
pub async fn hash_configmap(cm: Arc<ConfigMap>, ctx: Arc<Ctx>) -> Result<Action, Failed> {
    let ns = cm.metadata.namespace.clone().unwrap_or_default();
    let name = cm.metadata.name.clone().unwrap_or_default();
    let hash = data_hash(cm.data.as_ref());
    if cm.metadata.annotations.as_ref().and_then(|a| a.get(DATA_HASH)) == Some(&hash) {
        return Ok(Action::await_change());
    }
    let patch = serde_json::json!({"metadata": {"annotations": {DATA_HASH: hash}}});
    Api::<ConfigMap>::namespaced(ctx.client.clone(), &ns)
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| Failed(format!("annotating configmap: {e}")))?;
    ctx.record(format!("configmap-hasher: {} data hash {hash}", key(&cm.metadata)));
    Ok(Action::await_change())
}

/// Runs the three controllers on one database until `stop`; sends the shared context once the
/// informers exist.
pub async fn run(
    client: kube::Client,
    server: &str,
    db_path: &Path,
    stop: tokio::sync::watch::Receiver<bool>,
    started: tokio::sync::oneshot::Sender<Arc<Ctx>>,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let p = db_path.to_owned();
    let db = tokio::task::spawn_blocking(move || DurableStore::open(StoreConfig::new(p))).await??;
    let factory = InformerFactory::new(db, client.clone(), server);

    // replica-counter's informers.
    let deployments = factory.informer::<Deployment>(None).await?;
    let pods_for_counter = factory.informer::<Pod>(None).await?;
    // pod-gc asks for the same scope and gets the same informer.
    let pods_for_gc = factory.informer::<Pod>(None).await?;
    // configmap-hasher's informer.
    let configmaps = factory.informer::<ConfigMap>(None).await?;
    println!(
        "pods informer: replica-counter got scope {:?}, pod-gc got scope {:?} ({})",
        pods_for_counter.scope(),
        pods_for_gc.scope(),
        if pods_for_counter.scope() == pods_for_gc.scope() {
            "shared"
        } else {
            "NOT shared"
        }
    );

    let ctx = Arc::new(Ctx {
        client,
        deployments: deployments.lister(),
        pods: pods_for_counter.lister(),
        configmaps: configmaps.lister(),
        pod_scopes: (pods_for_counter.scope(), pods_for_gc.scope()),
        log: Mutex::new(Vec::new()),
    });
    let _ = started.send(ctx.clone());
    factory.start();

    // Pods → the Deployments of their namespace whose selector matches them.
    let deployment_lister = deployments.lister();
    let owners_of_pod = move |pod: Pod| -> Vec<ObjectRef<Deployment>> {
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let Ok(candidates) = deployment_lister.namespace(&ns).list(&Default::default()) else {
            return Vec::new();
        };
        candidates
            .iter()
            .filter(|d| selector_of(d).is_some_and(|s| selects(&s, &pod)))
            .map(|d| ObjectRef::from_obj(d.as_ref()))
            .collect()
    };
    // Each controller stops with `stop`, and logs what failed.
    let stopped = |mut stop: tokio::sync::watch::Receiver<bool>| async move {
        let _ = stop.wait_for(|s| *s).await;
    };
    let replica_counter = Controller::for_informer(deployments)
        .name("replica-counter")
        .watches_informer(pods_for_counter, owners_of_pod, Relation::new())
        .graceful_shutdown_on(stopped(stop.clone()))
        .run(count_replicas, default_error_policy, ctx.clone())
        .for_each(log_errors);
    let pod_gc = Controller::for_informer(pods_for_gc)
        .name("pod-gc")
        .graceful_shutdown_on(stopped(stop.clone()))
        .run(collect_pod, default_error_policy, ctx.clone())
        .for_each(log_errors);
    let hasher = Controller::for_informer(configmaps)
        .name("configmap-hasher")
        .graceful_shutdown_on(stopped(stop))
        .run(hash_configmap, default_error_policy, ctx.clone())
        .for_each(log_errors);
    tokio::join!(replica_counter, pod_gc, hasher);
    factory.shutdown().await?;
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
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let (started_tx, started) = tokio::sync::oneshot::channel();
    if let Some(kubeconfig) = arg("--kubeconfig") {
        let db = PathBuf::from(arg("--db").unwrap_or_else(|| "controller-manager.redb".into()));
        let kc = kube::config::Kubeconfig::read_from(&kubeconfig)?;
        let config = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
        let server = config.cluster_url.to_string();
        let client = kube::Client::try_from(config)?;
        let task = tokio::spawn(async move { run(client, &server, &db, stop, started_tx).await });
        tokio::signal::ctrl_c().await?;
        let _ = stop_tx.send(true);
        let _ = started.await;
        return task.await?;
    }
    use durable_informer::sim::{wait_until, workload::WorkloadGen, Sim, SimConfig};
    let sim = tokio::task::spawn_blocking(|| Sim::start(SimConfig::default())).await??;
    let mut gen = WorkloadGen::new(11);
    sim.create("deployments", Some("default"), demo_deployment("web", "web"))?;
    for i in 0..3 {
        let mut pod = gen.pod("default", &format!("web-{i}"));
        pod["metadata"]["labels"] = serde_json::json!({"app": "web"});
        pod["status"]["phase"] = if i == 2 { "Failed" } else { "Running" }.into();
        sim.create("pods", Some("default"), pod)?;
    }
    sim.bulk_load("configmaps", gen.configmaps(2))?;
    let dir = std::env::temp_dir().join(format!("controller-manager-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let db = arg("--db").map_or_else(|| dir.join("db.redb"), PathBuf::from);
    let client = sim.client()?;
    let url = sim.url();
    let task = tokio::spawn(async move { run(client, &url, &db, stop, started_tx).await });
    let ctx = started.await?;
    let initial = [
        "replica-counter: default/web has 2 running pods",
        "pod-gc: deleted finished pod default/web-2",
        "configmap-hasher: default/cm-0 data hash ",
        "configmap-hasher: default/cm-1 data hash ",
    ];
    wait_until(SETTLE, async || {
        let log = ctx.log();
        initial.iter().all(|want| log.iter().any(|l| l.starts_with(want)))
    })
    .await;
    println!("one more web pod, and a change to cm-0");
    let mut pod = gen.pod("default", "web-3");
    pod["metadata"]["labels"] = serde_json::json!({"app": "web"});
    pod["status"]["phase"] = "Running".into();
    sim.create("pods", Some("default"), pod)?;
    sim.patch(
        "configmaps",
        Some("default"),
        "cm-0",
        &serde_json::json!({"data": {"LOG_LEVEL": "debug"}}),
    )?;
    wait_until(SETTLE, async || {
        let log = ctx.log();
        let cm0 = "configmap-hasher: default/cm-0 data hash ";
        log.iter()
            .any(|l| l == "replica-counter: default/web has 3 running pods")
            && log.iter().filter(|l| l.starts_with(cm0)).count() >= 2
    })
    .await;
    let _ = stop_tx.send(true);
    task.await??;
    let _ = std::fs::remove_dir_all(dir);
    Ok(())
}

/// A Deployment selecting `app={app}`.
#[must_use]
pub fn demo_deployment(name: &str, app: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": app}},
                 "template": {"metadata": {"labels": {"app": app}},
                              "spec": {"containers": [{"name": "main", "image": "nginx"}]}}}
    })
}
