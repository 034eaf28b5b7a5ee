//! The scheduler's Pod informer: only non-terminal Pods (field selector
//! `status.phase!=Succeeded,status.phase!=Failed`), listed per namespace (built in: the store
//! is keyed by namespace) and per node through a custom `node` index on `spec.nodeName`, whose
//! function decodes only that field of the stored JSON.
//!
//! ```text
//! cargo run --features sim --example pod_informer                         # against the built-in simulated cluster
//! cargo run --features sim --example pod_informer -- --kubeconfig ~/.kube/config --db pods.redb
//! ```
//! Against the simulated cluster it generates Pods over three namespaces and four nodes, makes
//! some Succeeded or Failed, prints the Pods per node, then finishes one more Pod and shows it
//! leave the cache.

#![allow(dead_code)] // shared with tests/example_pod_informer.rs, which uses other parts of it
#![allow(missing_docs)] // an example; its items are described in the module docs

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use durable_informer::informer::{HandlerFuncs, HandlerOptions, Informer};
use durable_informer::source::KubeSource;
use durable_informer::store::{DurableStore, Indexer, StoreConfig, StoreError};
use k8s_openapi::api::core::v1::Pod;
use serde::Deserialize;

/// The scheduler's field selector: Pods that still need or hold a node.
pub const NON_TERMINAL: &str = "status.phase!=Succeeded,status.phase!=Failed";

/// The name of the custom index on `spec.nodeName`.
pub const NODE_INDEX: &str = "node";

/// Just the part of a Pod the index needs; serde skips everything else without building it.
#[derive(Deserialize)]
struct NodeNameOnly {
    #[serde(default)]
    spec: NodeNameSpec,
}

#[derive(Deserialize, Default)]
struct NodeNameSpec {
    #[serde(default, rename = "nodeName")]
    node_name: Option<String>,
}

/// Indexes a Pod under its node; an unscheduled Pod (or undecodable JSON) is not indexed.
#[must_use]
pub fn node_indexer() -> Indexer {
    Indexer::new(NODE_INDEX, |_meta, json| {
        serde_json::from_slice::<NodeNameOnly>(json)
            .ok()
            .and_then(|p| p.spec.node_name)
            .filter(|n| !n.is_empty())
            .into_iter()
            .collect()
    })
}

/// The informer and the queries the example prints.
#[derive(Clone)]
pub struct PodCache {
    pub informer: Informer<Pod>,
}

impl PodCache {
    /// `node → ["namespace/name", …]`, from the `node` index.
    pub fn pods_per_node(&self) -> Result<BTreeMap<String, Vec<String>>, StoreError> {
        let store = self.informer.indexer();
        let mut out = BTreeMap::new();
        for node in store.list_index_values(NODE_INDEX)? {
            let pods = store.by_index(NODE_INDEX, &node)?;
            out.insert(node, pods.into_iter().map(|o| o.key.to_string()).collect());
        }
        Ok(out)
    }

    /// Names of the cached Pods of one namespace, through the typed lister.
    pub fn pods_in_namespace(&self, ns: &str) -> Result<Vec<String>, StoreError> {
        Ok(self
            .informer
            .lister()
            .namespace(ns)
            .list(&Default::default())?
            .iter()
            .filter_map(|p| p.metadata.name.clone())
            .collect())
    }

    /// Prints the Pods per node.
    pub fn print(&self) -> Result<(), StoreError> {
        let per_node = self.pods_per_node()?;
        println!("{} non-terminal pods cached", self.informer.store().list_keys()?.len());
        for (node, pods) in per_node {
            println!("  {node}: {}", pods.join(", "));
        }
        Ok(())
    }
}

/// Runs the informer on `db_path` until `stop`; sends the cache once it has synced.
pub async fn run(
    client: kube::Client,
    server: &str,
    db_path: &Path,
    mut stop: tokio::sync::watch::Receiver<bool>,
    synced: tokio::sync::oneshot::Sender<PodCache>,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let p = db_path.to_owned();
    let db = tokio::task::spawn_blocking(move || DurableStore::open(StoreConfig::new(p))).await??;
    let source = KubeSource::typed::<Pod>(client, server).fields(NON_TERMINAL);
    let informer = Informer::<Pod>::builder(&db, source)
        .indexer(node_indexer())
        .build()
        .await?;
    let printer = informer.add_event_handler(
        HandlerFuncs::new()
            .on_add(|p: Arc<Pod>, initial| {
                if !initial {
                    println!("pod {} added", name_of(&p));
                }
            })
            .on_delete(|p: Arc<Pod>, _| {
                // Also when a Pod finishes: it no longer matches the field selector.
                println!("pod {} left the cache", name_of(&p));
            }),
        HandlerOptions::volatile(),
    );
    informer.start();
    let stopped = tokio::select! {
        synced = informer.wait_for_sync() => { synced?; false }
        _ = stop.wait_for(|s| *s) => true,
    };
    if !stopped {
        let cache = PodCache {
            informer: informer.clone(),
        };
        cache.print()?;
        let _ = synced.send(cache);
        let _ = stop.wait_for(|s| *s).await;
    }
    printer.remove().await;
    informer.shutdown().await?;
    drop(informer);
    tokio::task::spawn_blocking(move || db.close()).await??;
    Ok(())
}

fn name_of(p: &Pod) -> String {
    format!(
        "{}/{}",
        p.metadata.namespace.as_deref().unwrap_or_default(),
        p.metadata.name.as_deref().unwrap_or_default()
    )
}

/// Pods from the workload generator, made deterministic where the example needs it: pod `i` is
/// on `node-{i % 4}`, every fifth is Succeeded and every seventh Failed, the rest Running.
#[must_use]
pub fn generated_pods(n: usize) -> Vec<serde_json::Value> {
    let mut gen = durable_informer::sim::workload::WorkloadGen::new(7).namespaces(3);
    let mut pods = gen.pods(n);
    for (i, pod) in pods.iter_mut().enumerate() {
        let phase = match i {
            i if i % 5 == 4 => "Succeeded",
            i if i % 7 == 6 => "Failed",
            _ => "Running",
        };
        pod["spec"]["nodeName"] = format!("node-{}", i % 4).into();
        pod["status"]["phase"] = phase.into();
    }
    pods
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
        let db = PathBuf::from(arg("--db").unwrap_or_else(|| "pod-informer.redb".into()));
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
    use durable_informer::sim::{wait_until, Sim, SimConfig};
    let sim = tokio::task::spawn_blocking(|| Sim::start(SimConfig::default())).await??;
    let pods = generated_pods(30);
    let terminal = pods.iter().filter(|p| p["status"]["phase"] != "Running").count();
    println!("generated {} pods, {terminal} of them Succeeded or Failed", pods.len());
    sim.bulk_load("pods", pods)?;
    let dir = std::env::temp_dir().join(format!("pod-informer-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let db = arg("--db").map_or_else(|| dir.join("db.redb"), PathBuf::from);
    let client = sim.client()?;
    let url = sim.url();
    let task = tokio::spawn(async move { run(client, &url, &db, stop, synced_tx).await });
    let cache = synced.await?;
    for ns in ["ns-0", "ns-1", "ns-2"] {
        println!("{ns}: {}", cache.pods_in_namespace(ns)?.join(", "));
    }
    let cached = cache.informer.store().list_keys()?.len();
    println!("pod-0 (ns-0) finishes");
    sim.patch_status(
        "pods",
        Some("ns-0"),
        "pod-0",
        &serde_json::json!({"status": {"phase": "Succeeded"}}),
    )?;
    wait_until(Duration::from_secs(30), async || {
        cache.informer.store().list_keys().is_ok_and(|keys| keys.len() < cached)
    })
    .await;
    cache.print()?;
    let _ = stop_tx.send(true);
    task.await??;
    let _ = std::fs::remove_dir_all(dir);
    Ok(())
}
