//! The classic first informer program: event handlers that print each Deployment added,
//! updated (with its replicas, old → new) and deleted, and a lister that lists the `default`
//! namespace from the local cache — no request to the API server.
//!
//! The handler is durable: stopped and restarted on the same database, it receives only what
//! changed while it was away, not a fresh add of every Deployment.
//!
//! ```text
//! cargo run --features sim --example deployment_lister                         # against the built-in simulated cluster
//! cargo run --features sim --example deployment_lister -- --kubeconfig ~/.kube/config --db deployments.redb
//! ```

#![allow(dead_code)] // shared with tests/example_deployment_lister.rs, which uses other parts of it
#![allow(missing_docs)] // an example; its items are described in the module docs

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use durable_informer::informer::{HandlerFuncs, HandlerOptions, Informer, InformerError, Lister};
use durable_informer::source::KubeSource;
use durable_informer::store::{DurableStore, StoreConfig, StoreError};
use k8s_openapi::api::apps::v1::Deployment;

/// What the example shares with its caller once the cache has synced.
pub struct Ctx {
    pub deployments: Lister<Deployment>,
    /// The lines the handler printed.
    pub events: Mutex<Vec<String>>,
}

impl Ctx {
    fn record(&self, line: String) {
        println!("{line}");
        self.events
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(line);
    }

    #[must_use]
    pub fn events(&self) -> Vec<String> {
        self.events
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

fn key(d: &Deployment) -> String {
    format!(
        "{}/{}",
        d.metadata.namespace.as_deref().unwrap_or_default(),
        d.metadata.name.as_deref().unwrap_or_default()
    )
}

fn replicas(d: &Deployment) -> i32 {
    d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1)
}

/// `name (replicas)` of each Deployment of `default`, read from the local cache.
pub fn list_default(lister: &Lister<Deployment>) -> Result<Vec<String>, StoreError> {
    Ok(lister
        .namespace("default")
        .list(&Default::default())?
        .iter()
        .map(|d| format!("{} ({})", d.metadata.name.as_deref().unwrap_or_default(), replicas(d)))
        .collect())
}

/// Runs the informer on `db_path` until `stop`; sends the context once the cache has synced
/// and the handler has seen it.
pub async fn run(
    client: kube::Client,
    server: &str,
    db_path: &Path,
    mut stop: tokio::sync::watch::Receiver<bool>,
    synced: tokio::sync::oneshot::Sender<Arc<Ctx>>,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let p = db_path.to_owned();
    let db = tokio::task::spawn_blocking(move || DurableStore::open(StoreConfig::new(p))).await??;
    let informer = Informer::<Deployment>::builder(&db, KubeSource::typed::<Deployment>(client, server))
        .build()
        .await?;
    let ctx = Arc::new(Ctx {
        deployments: informer.lister(),
        events: Mutex::new(Vec::new()),
    });
    let (c1, c2, c3) = (ctx.clone(), ctx.clone(), ctx.clone());
    let handler = HandlerFuncs::new()
        .on_add(move |d: Arc<Deployment>, _| c1.record(format!("add {} replicas {}", key(&d), replicas(&d))))
        .on_update(move |old: Arc<Deployment>, new: Arc<Deployment>| {
            c2.record(format!(
                "update {} replicas {} -> {}",
                key(&new),
                replicas(&old),
                replicas(&new)
            ));
        })
        .on_delete(move |d: Arc<Deployment>, _| c3.record(format!("delete {}", key(&d))));
    let registration = informer.add_event_handler(handler, HandlerOptions::durable("deployment-printer"));
    informer.start();
    let stopped = tokio::select! {
        synced = async { informer.wait_for_sync().await?; registration.wait_for_sync().await?; Ok::<_, InformerError>(()) } => { synced?; false }
        _ = stop.wait_for(|s| *s) => true,
    };
    if !stopped {
        println!("deployments in default: {:?}", list_default(&ctx.deployments)?);
        let _ = synced.send(ctx);
        let _ = stop.wait_for(|s| *s).await;
    }
    // Drains the handler (it sees everything committed), then stops it; its cursor stays in the db.
    informer.shutdown().await?;
    registration.remove().await;
    drop(informer);
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
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let (synced_tx, synced) = tokio::sync::oneshot::channel();
    if let Some(kubeconfig) = arg("--kubeconfig") {
        let db = PathBuf::from(arg("--db").unwrap_or_else(|| "deployment-lister.redb".into()));
        let kc = kube::config::Kubeconfig::read_from(&kubeconfig)?;
        let config = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
        let server = config.cluster_url.to_string();
        let client = kube::Client::try_from(config)?;
        let task = tokio::spawn(async move { run(client, &server, &db, stop, synced_tx).await });
        tokio::signal::ctrl_c().await?;
        let _ = stop_tx.send(true);
        let _ = synced.await;
        return task.await?;
    }
    use durable_informer::sim::{wait_until, workload::WorkloadGen, Sim, SimConfig};
    let sim = tokio::task::spawn_blocking(|| Sim::start(SimConfig::default())).await??;
    let mut gen = WorkloadGen::new(3);
    sim.bulk_load("deployments", gen.deployments(3))?;
    sim.create(
        "deployments",
        Some("kube-system"),
        gen.deployment("kube-system", "coredns"),
    )?;
    let dir = std::env::temp_dir().join(format!("deployment-lister-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let db = arg("--db").map_or_else(|| dir.join("db.redb"), PathBuf::from);
    let client = sim.client()?;
    let url = sim.url();
    let task = tokio::spawn(async move { run(client, &url, &db, stop, synced_tx).await });
    let ctx = synced.await?;
    sim.patch(
        "deployments",
        Some("default"),
        "deploy-0",
        &serde_json::json!({"spec": {"replicas": 10}}),
    )?;
    sim.delete("deployments", Some("default"), "deploy-1")?;
    // Until the lister shows both changes (a loaded machine may take longer than usual).
    wait_until(Duration::from_secs(30), async || {
        list_default(&ctx.deployments).is_ok_and(|names| {
            names.iter().any(|n| n == "deploy-0 (10)") && !names.iter().any(|n| n.starts_with("deploy-1 "))
        })
    })
    .await;
    println!("deployments in default now: {:?}", list_default(&ctx.deployments)?);
    let _ = stop_tx.send(true);
    task.await??;
    let _ = std::fs::remove_dir_all(dir);
    Ok(())
}
