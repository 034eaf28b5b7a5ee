//! A controller for a `Mydemo` custom resource (`crddemo.k8s.io/v1`, plural `mydemos`, with
//! `spec.ip` and `spec.port`), after the well-known "crddemo" controller tutorial: an event
//! handler logs every add, update (with the resourceVersion change, old → new) and delete, the
//! reconciler logs the object's address, and the controller's delete hook logs "deleted".
//!
//! ```text
//! cargo run --features sim --example mydemo_controller                         # against the built-in simulated cluster
//! cargo run --features sim --example mydemo_controller -- --kubeconfig ~/.kube/config --db mydemo.redb
//! ```
//! Against a real cluster, the `mydemos.crddemo.k8s.io` CRD must be installed.

#![allow(dead_code)] // shared with tests/example_mydemo_controller.rs, which uses other parts of it
#![allow(missing_docs)] // an example; its items are described in the module docs

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use durable_informer::controller::{default_error_policy, Action, Controller};
use durable_informer::informer::{HandlerFuncs, HandlerOptions, Informer, Lister};
use durable_informer::source::KubeSource;
use durable_informer::store::{DurableStore, StoreConfig};
use futures::StreamExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::CustomResource;
use serde::{Deserialize, Serialize};

/// The spec of the `Mydemo` custom resource (`crddemo.k8s.io/v1`); kube's `CustomResource`
/// derive writes the `Mydemo` type and its `kube::Resource`.
#[derive(CustomResource, Clone, Debug, Default, Serialize, Deserialize)]
#[kube(
    group = "crddemo.k8s.io",
    version = "v1",
    kind = "Mydemo",
    namespaced,
    schema = "disabled"
)]
pub struct MydemoSpec {
    pub ip: String,
    pub port: i32,
}

/// A `Mydemo` with `spec.ip` and `spec.port`, in the default namespace.
#[must_use]
pub fn mydemo(name: &str, ip: &str, port: i32) -> Mydemo {
    Mydemo::new(name, MydemoSpec { ip: ip.into(), port })
}

/// What the handler and the reconciler did, line by line (for the demo output and the tests).
#[derive(Default)]
pub struct Log(Mutex<Vec<String>>);

impl Log {
    pub fn push(&self, line: String) {
        println!("{line}");
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(line);
    }

    #[must_use]
    pub fn lines(&self) -> Vec<String> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}

/// What the reconciler needs, and what was done.
pub struct Ctx {
    pub mydemos: Lister<Mydemo>,
    pub log: Log,
}

fn describe(m: &Mydemo) -> (String, String) {
    let key = format!(
        "{}/{}",
        m.metadata.namespace.as_deref().unwrap_or_default(),
        m.metadata.name.as_deref().unwrap_or_default()
    );
    (key, m.metadata.resource_version.clone().unwrap_or_default())
}

/// Logs adds, updates (old RV → new RV) and deletes, as the tutorial's `AddFunc`,
/// `UpdateFunc` and `DeleteFunc` do.
fn event_logger(ctx: &Arc<Ctx>) -> HandlerFuncs<Mydemo> {
    let (c1, c2, c3) = (ctx.clone(), ctx.clone(), ctx.clone());
    HandlerFuncs::new()
        .on_add(move |m, _initial| {
            let (key, rv) = describe(&m);
            c1.log.push(format!("add {key} rv {rv}"));
        })
        .on_update(move |old, new| {
            let (key, new_rv) = describe(&new);
            let (_, old_rv) = describe(&old);
            if old_rv == new_rv {
                // A periodic resync, not a change (client-go's handlers compare RVs the same way).
                return;
            }
            c2.log.push(format!("update {key} rv {old_rv} -> {new_rv}"));
        })
        .on_delete(move |m, final_state_unknown| {
            let (key, rv) = describe(&m);
            let how = if final_state_unknown {
                " (final state unknown)"
            } else {
                ""
            };
            c3.log.push(format!("delete {key} rv {rv}{how}"));
        })
}

/// The sync handler (a deleted object reaches the delete hook instead).
pub async fn reconcile(m: Arc<Mydemo>, ctx: Arc<Ctx>) -> Result<Action, std::convert::Infallible> {
    let (key, _) = describe(&m);
    if m.spec.ip.parse::<std::net::IpAddr>().is_err() || !(1..=65535).contains(&m.spec.port) {
        // An invalid spec: retrying will not make it valid.
        ctx.log
            .push(format!("sync {key}: invalid address {}:{}", m.spec.ip, m.spec.port));
        return Ok(Action::await_change());
    }
    ctx.log.push(format!("sync {key}: {}:{}", m.spec.ip, m.spec.port));
    Ok(Action::await_change())
}

/// Runs the controller on `db_path` until `stop`; sends its context once the informer exists.
pub async fn run(
    client: kube::Client,
    server: &str,
    db_path: &Path,
    stop: tokio::sync::watch::Receiver<bool>,
    started: tokio::sync::oneshot::Sender<Arc<Ctx>>,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let p = db_path.to_owned();
    let db = tokio::task::spawn_blocking(move || DurableStore::open(StoreConfig::new(p))).await??;
    let mydemos = Informer::<Mydemo>::builder(&db, KubeSource::typed::<Mydemo>(client, server))
        .build()
        .await?;
    let ctx = Arc::new(Ctx {
        mydemos: mydemos.lister(),
        log: Log::default(),
    });
    let logger = mydemos.add_event_handler(event_logger(&ctx), HandlerOptions::volatile());
    let _ = started.send(ctx.clone());
    let on_delete = ctx.clone();
    let mut stop = stop;
    Controller::for_informer(mydemos.clone())
        .name("mydemo")
        .on_delete(move |m: Arc<Mydemo>| {
            let ctx = on_delete.clone();
            async move {
                ctx.log.push(format!("sync {}: deleted", describe(&m).0));
                Ok::<(), std::convert::Infallible>(())
            }
        })
        .graceful_shutdown_on(async move {
            let _ = stop.wait_for(|s| *s).await;
        })
        .run(reconcile, default_error_policy, ctx)
        .for_each(|res| async move {
            if let Err(e) = res {
                eprintln!("{e}");
            }
        })
        .await;
    logger.remove().await;
    mydemos.shutdown().await?;
    drop(mydemos);
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
    let (started_tx, started) = tokio::sync::oneshot::channel();
    if let Some(kubeconfig) = arg("--kubeconfig") {
        let db = PathBuf::from(arg("--db").unwrap_or_else(|| "mydemo-controller.redb".into()));
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
    // The built-in simulated cluster: register the CRD, then create, update and delete a Mydemo.
    use durable_informer::sim::{wait_until, ResourceDef, Sim, SimConfig};
    let sim = tokio::task::spawn_blocking(|| {
        Sim::start(SimConfig::default().with_resource(ResourceDef::custom("crddemo.k8s.io", "v1", "Mydemo", "mydemos")))
    })
    .await??;
    let dir = std::env::temp_dir().join(format!("mydemo-controller-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let db = arg("--db").map_or_else(|| dir.join("db.redb"), PathBuf::from);
    let client = sim.client()?;
    let url = sim.url();
    let ctrl = {
        let client = client.clone();
        tokio::spawn(async move { run(client, &url, &db, stop, started_tx).await })
    };
    let ctx = started.await?;
    // Until both the handler and the reconciler logged a line starting with these prefixes.
    let logged = async |handler: &str, sync: &str| {
        wait_until(Duration::from_secs(30), async || {
            let lines = ctx.log.lines();
            [handler, sync].iter().all(|p| lines.iter().any(|l| l.starts_with(p)))
        })
        .await
    };
    let api: Api<Mydemo> = Api::namespaced(client, "default");
    println!("creating default/example-mydemo (10.0.0.1:8080)");
    api.create(&PostParams::default(), &mydemo("example-mydemo", "10.0.0.1", 8080))
        .await?;
    logged(
        "add default/example-mydemo ",
        "sync default/example-mydemo: 10.0.0.1:8080",
    )
    .await;
    println!("changing its port to 9090");
    let patch = serde_json::json!({"spec": {"port": 9090}});
    api.patch("example-mydemo", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    logged(
        "update default/example-mydemo ",
        "sync default/example-mydemo: 10.0.0.1:9090",
    )
    .await;
    println!("deleting it");
    api.delete("example-mydemo", &DeleteParams::default()).await?;
    logged("delete default/example-mydemo ", "sync default/example-mydemo: deleted").await;
    let _ = stop_tx.send(true);
    ctrl.await??;
    let _ = std::fs::remove_dir_all(dir);
    Ok(())
}
