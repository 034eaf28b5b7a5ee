//! The controller you ship, under the harness: a Foo controller built with this crate's
//! `Controller` (`controller()` below is what a `main` runs against a cluster), tested by
//! `Harness::for_controller` against the Foo recording. Its informers keep their caches in a
//! real redb file: a crash drops the controller, and the restart opens the same file.
//!
//! Two variants: `correct`, and `crash-create`, with a planted bug of Sieve's class
//! "non-idempotent create after a crash": the Deployment gets a generated name, remembered in
//! the Foo's status only after the create; a crash in between forgets a Deployment that
//! exists, and the restarted controller makes a second one.
//!
//! ```text
//! cargo run --features testing --example testing_controller -- correct 50
//! cargo run --features testing --example testing_controller -- crash-create boundaries
//! ```

#![allow(missing_docs)] // an example; its items are described in the module docs
#![allow(clippy::disallowed_names)] // `Foo` is the resource sample-controller is about
#![allow(dead_code)] // shared with tests/testing_harness.rs

#[path = "testing_sample_controller.rs"]
#[allow(unreachable_pub)]
pub mod sample;

use std::sync::Arc;
use std::time::Duration;

use durable_informer::controller::{Action, Controller};
use durable_informer::store::DurableStore;
use durable_informer::testing::{Env, Harness, Recording};
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::finalizer::{finalizer, Event as FinalizerEvent};
use kube::ResourceExt;
use serde_json::json;

pub use sample::Foo;

/// Which controller: the correct one or the planted bug.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bug {
    None,
    CrashCreate,
}

pub struct Ctx {
    pub client: kube::Client,
    pub bug: Bug,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Error(String);

fn err(e: impl std::fmt::Display) -> Error {
    Error(e.to_string())
}

/// The controller as `main` builds it: Foos, and the Deployments they own.
pub fn controller(db: &Arc<DurableStore>, client: kube::Client) -> Controller<Foo> {
    Controller::new(db, Api::<Foo>::all(client.clone()), Default::default())
        .owns(Api::<Deployment>::all(client), Default::default())
}

pub async fn reconcile(foo: Arc<Foo>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let ns = foo.namespace().unwrap_or_default();
    let foos: Api<Foo> = Api::namespaced(ctx.client.clone(), &ns);
    finalizer(&foos, sample::FINALIZER, foo, |event| async {
        match event {
            FinalizerEvent::Apply(foo) => apply(foo, &ctx).await,
            FinalizerEvent::Cleanup(foo) => cleanup(foo, &ctx).await,
        }
    })
    .await
    .map_err(err)
}

pub fn error_policy(_: Arc<Foo>, _: &Error, _: Arc<Ctx>) -> Action {
    Action::requeue(Duration::from_secs(5))
}

/// The Deployment's name: the Foo's `spec.deploymentName`, or (`crash-create`) the one its
/// status remembers.
fn remembered(foo: &Foo, ctx: &Ctx) -> Option<String> {
    match ctx.bug {
        Bug::None => Some(foo.spec.deployment_name.clone()),
        Bug::CrashCreate => foo.status.as_ref().and_then(|s| s.deployment.clone()),
    }
}

async fn cleanup(foo: Arc<Foo>, ctx: &Ctx) -> Result<Action, Error> {
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &foo.namespace().unwrap_or_default());
    if let Some(name) = remembered(&foo, ctx) {
        match deployments.delete(&name, &Default::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(err(e)),
        }
    }
    Ok(Action::await_change())
}

async fn apply(foo: Arc<Foo>, ctx: &Ctx) -> Result<Action, Error> {
    let ns = foo.namespace().unwrap_or_default();
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &ns);
    let foos: Api<Foo> = Api::namespaced(ctx.client.clone(), &ns);
    if foo.spec.deployment_name.is_empty() {
        return Ok(Action::await_change());
    }
    // The status as the server has it now (the cached Foo may not show the name yet).
    let foo = match ctx.bug {
        Bug::None => foo,
        Bug::CrashCreate => Arc::new(foos.get(&foo.name_any()).await.map_err(err)?),
    };
    let existing = match remembered(&foo, ctx) {
        Some(name) => deployments.get_opt(&name).await.map_err(err)?,
        None => None,
    };
    let deployment = match existing {
        Some(d) => d,
        None if ctx.bug == Bug::CrashCreate => {
            // BUG: the generated name is remembered only after the create.
            let d = deployments
                .create(&PostParams::default(), &sample::deployment_for(&foo, None, true))
                .await
                .map_err(err)?;
            let patch = json!({"metadata": {"resourceVersion": foo.resource_version()},
                "status": {"deployment": d.name_any()}});
            foos.patch_status(&foo.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(err)?;
            return Ok(Action::requeue(Duration::from_secs(300)));
        }
        // AlreadyExists (a cache behind) is an error: retried.
        None => deployments
            .create(
                &PostParams::default(),
                &sample::deployment_for(&foo, Some(&foo.spec.deployment_name), true),
            )
            .await
            .map_err(err)?,
    };
    let current = deployment.spec.as_ref().and_then(|s| s.replicas);
    if foo.spec.replicas.is_some() && foo.spec.replicas != current {
        let patch = json!({"metadata": {"resourceVersion": deployment.resource_version()},
            "spec": {"replicas": foo.spec.replicas}});
        deployments
            .patch(&deployment.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(err)?;
    }
    Ok(Action::requeue(Duration::from_secs(300)))
}

/// The harness for the controller above, with the sample's checks.
pub fn harness(bug: Bug, recording: &str) -> Result<Harness<Foo, Ctx, Error>, Box<dyn std::error::Error>> {
    let h = Harness::for_controller(controller, reconcile, error_policy, move |env: &Env| Ctx {
        client: env.client(),
        bug,
    })
    .recording(Recording::open(recording)?);
    Ok(sample::checks(h))
}

#[allow(clippy::print_stdout)]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let name = args.next().unwrap_or_else(|| "correct".into());
    let how = args.next().unwrap_or_else(|| "50".into());
    let bug = match name.as_str() {
        "correct" => Bug::None,
        "crash-create" => Bug::CrashCreate,
        other => return Err(format!("unknown variant {other:?}: correct or crash-create").into()),
    };
    let recording = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/recordings/foos.jsonl");
    let start = std::time::Instant::now();
    let h = harness(bug, recording)?;
    let result = match how.as_str() {
        "boundaries" => h.check_every_boundary(),
        n => h.check(n.parse()?),
    };
    match result {
        Ok(report) => println!("{name}: {report} in {:.1?}", start.elapsed()),
        Err(e) => println!("{name}: {e}\n(in {:.1?})", start.elapsed()),
    }
    Ok(())
}
