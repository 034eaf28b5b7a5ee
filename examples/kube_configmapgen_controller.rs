//! kube-runtime's `Controller`: a `ConfigMapGenerator` custom resource (`nullable.se/v1`,
//! `spec.content`) owns a ConfigMap of the same name holding that content (after kube-rs'
//! configmapgen_controller example, written anew). `durable_configmapgen_controller.rs` is the
//! same controller on this crate: the two differ only in their imports and the constructor
//! (docs/coming-from-kube-runtime.md; `tests/example_configmapgen_controller.rs` checks it).
//!
//! ```text
//! cargo run --example kube_configmapgen_controller      # against the current kubeconfig's cluster
//! ```

#![allow(dead_code)] // shared with tests/example_configmapgen_controller.rs
#![allow(missing_docs)] // an example; its items are described in the module docs

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ObjectMeta, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Client, CustomResource, Resource};
use serde::{Deserialize, Serialize};

#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize)]
#[kube(
    group = "nullable.se",
    version = "v1",
    kind = "ConfigMapGenerator",
    namespaced,
    schema = "disabled"
)]
pub struct ConfigMapGeneratorSpec {
    pub content: String,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("applying the ConfigMap: {0}")]
    Apply(#[source] kube::Error),
    #[error("{0} has no namespace")]
    NoNamespace(String),
}

pub struct Data {
    pub client: Client,
}

/// Applies the generator's ConfigMap (server-side apply), owned by the generator.
pub async fn reconcile(generator: Arc<ConfigMapGenerator>, ctx: Arc<Data>) -> Result<Action, Error> {
    let name = generator.metadata.name.clone().unwrap_or_default();
    let ns = generator
        .metadata
        .namespace
        .clone()
        .ok_or_else(|| Error::NoNamespace(name.clone()))?;
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            owner_references: Some(generator.controller_owner_ref(&()).into_iter().collect()),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([("content".to_owned(), generator.spec.content.clone())])),
        ..ConfigMap::default()
    };
    Api::<ConfigMap>::namespaced(ctx.client.clone(), &ns)
        .patch(
            &name,
            &PatchParams::apply("configmapgen-controller").force(),
            &Patch::Apply(&cm),
        )
        .await
        .map_err(Error::Apply)?;
    Ok(Action::requeue(Duration::from_secs(300)))
}

pub fn error_policy(_generator: Arc<ConfigMapGenerator>, error: &Error, _ctx: Arc<Data>) -> Action {
    tracing::warn!(%error, "reconcile failed");
    Action::requeue(Duration::from_secs(1))
}

/// Runs the controller until `shutdown` resolves.
pub async fn run(client: Client, shutdown: impl Future<Output = ()> + Send + Sync + 'static) {
    let generators = Api::<ConfigMapGenerator>::all(client.clone());
    let configmaps = Api::<ConfigMap>::all(client.clone());
    Controller::new(generators, watcher::Config::default())
        .owns(configmaps, watcher::Config::default())
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, Arc::new(Data { client }))
        .for_each(|res| async move {
            match res {
                Ok((obj, _)) => tracing::info!(%obj, "reconciled"),
                Err(e) => tracing::warn!(error = %e, "reconcile failed"),
            }
        })
        .await;
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    tracing_subscriber::fmt::init();
    let client = Client::try_default().await?;
    run(client, async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await;
    Ok(())
}
