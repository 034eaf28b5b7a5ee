//! The controller you ship, under the harness: a Foo controller built with this crate's
//! `Controller` (`controller()` below is what a `main` runs against a cluster), tested by
//! `Harness::for_controller` against the Foo recording. Its informers keep their caches in a
//! real redb file: a crash drops the controller, and the restart opens the same file.
//!
//! Three variants: `correct`, and two with a planted bug each:
//!
//! * `crash-create`, Sieve's class "non-idempotent create after a crash": the Deployment gets
//!   a generated name, remembered in the Foo's status only after the create; a crash in
//!   between forgets a Deployment that exists, and the restarted controller makes a second
//!   one;
//! * `stale-cache`, Sieve's "stale read": the controller builds its Deployment informer
//!   itself (`Harness::for_controller_with`, as a `main` that keeps the informer's reader
//!   does), looks its Deployment up in that cache and creates one with a generated name when
//!   the cache shows none. A delayed Deployment informer, or a restart against a server whose
//!   watch cache is behind (time travel), makes a second one.
//!
//! ```text
//! cargo run --features testing --example testing_controller -- correct 50
//! cargo run --features testing --example testing_controller -- crash-create boundaries
//! cargo run --features testing --example testing_controller -- stale-cache 50
//! ```

#![allow(missing_docs)] // an example; its items are described in the module docs
#![allow(clippy::disallowed_names)] // `Foo` is the resource sample-controller is about
#![allow(dead_code)] // shared with tests/testing_harness.rs

#[path = "testing_sample_controller.rs"]
#[allow(unreachable_pub)]
pub mod sample;

use std::sync::Arc;
use std::time::Duration;

use durable_informer::controller::{Action, Controller, Relation};
use durable_informer::informer::{Informer, Reader};
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
    StaleCache,
}

pub struct Ctx {
    pub client: kube::Client,
    pub bug: Bug,
    /// The Deployment informer's cache (`stale-cache` only).
    pub deployments: Option<Reader<Deployment>>,
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
        Bug::StaleCache => cached(foo, ctx).map(|d| d.name_any()),
    }
}

/// The Deployment labelled for `foo` in the informer's cache (`stale-cache`).
fn cached(foo: &Foo, ctx: &Ctx) -> Option<Arc<Deployment>> {
    let name = foo.name_any();
    ctx.deployments
        .as_ref()?
        .find(|d| d.namespace() == foo.namespace() && d.labels().get(sample::LABEL) == Some(&name))
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
        Bug::None | Bug::StaleCache => foo,
        Bug::CrashCreate => Arc::new(foos.get(&foo.name_any()).await.map_err(err)?),
    };
    let existing = match (ctx.bug, remembered(&foo, ctx)) {
        // BUG: trusts the cache, which may not show the Deployment created a moment ago.
        (Bug::StaleCache, _) => cached(&foo, ctx).map(|d| (*d).clone()),
        (_, Some(name)) => deployments.get_opt(&name).await.map_err(err)?,
        (_, None) => None,
    };
    let deployment = match existing {
        Some(d) => d,
        None if ctx.bug == Bug::StaleCache => deployments
            .create(&PostParams::default(), &sample::deployment_for(&foo, None, true))
            .await
            .map_err(err)?,
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
    if ctx.bug == Bug::StaleCache {
        // The Deployment's state in the Foo's status, as sample-controller keeps it.
        let available = sample::available_of(&deployment);
        if foo.status.as_ref().and_then(|s| s.available_replicas) != Some(available) {
            sample::patch_available(&foos, &foo, available).await.map_err(err)?;
        }
    }
    Ok(Action::requeue(Duration::from_secs(300)))
}

/// The `stale-cache` controller as its `main` builds it: the Deployment informer first, so
/// the context keeps its reader.
pub async fn stale_cache_setup(env: Env) -> Result<(Controller<Foo>, Ctx), Box<dyn std::error::Error + Send + Sync>> {
    let db = env.database().ok_or("no database")?;
    let deployments = Informer::from_api(&db, Api::<Deployment>::all(env.client()))
        .build()
        .await?;
    let ctx = Ctx {
        client: env.client(),
        bug: Bug::StaleCache,
        deployments: Some(deployments.reader()),
    };
    let c = Controller::new(&db, Api::<Foo>::all(env.client()), Default::default())
        .owns_informer(deployments, Relation::default());
    Ok((c, ctx))
}

/// The harness for the controller above, with the sample's checks.
pub fn harness(bug: Bug, recording: &str) -> Result<Harness<Foo, Ctx, Error>, Box<dyn std::error::Error>> {
    let h = match bug {
        Bug::StaleCache => Harness::for_controller_with(stale_cache_setup, reconcile, error_policy),
        _ => Harness::for_controller(controller, reconcile, error_policy, move |env: &Env| Ctx {
            client: env.client(),
            bug,
            deployments: None,
        }),
    };
    let h = h.recording(Recording::open(recording)?);
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
        "stale-cache" => Bug::StaleCache,
        other => return Err(format!("unknown variant {other:?}: correct, crash-create or stale-cache").into()),
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
