//! The sample-controller's logic in kube-runtime's shape (`reconcile(Arc<Foo>, Arc<Ctx>)`),
//! tested by the harness of `durable_informer::testing` against a recording of Foos
//! (`tests/data/recordings/foos.jsonl`), with faults at every event boundary. Besides the
//! correct controller it has four variants, each with one planted bug of a class Sieve
//! (OSDI '22) found in real controllers:
//!
//! * `stale-cache`: finds its Deployment in the informer cache by label and creates one with
//!   a generated name when the cache shows none: a stale cache makes a second one;
//! * `crash-create`: remembers its Deployment's generated name in the Foo's status, written
//!   after the create: a crash between the two makes a second one;
//! * `missed-delete`: no finalizer, no owner reference; deletes the Deployment when the
//!   informer delivers the Foo's deletion: a relist never delivers it;
//! * `status-overwrite`: writes the whole status from its cached Foo without a
//!   resourceVersion: it overwrites a status field set since it read the Foo;
//! * `unfenced` (run as a leader and a standby): checks leadership only when a reconcile
//!   starts (as the controller loop does), not before each write: a leader deposed while it
//!   waited for an answer writes on, next to the new leader.
//!
//! With `ha` after the count, the controller runs as a leader and a warm standby elected
//! over a Lease, and the checks add hand-overs to the standby (mid-reconcile too).
//!
//! ```text
//! cargo run --features testing --example testing_sample_controller -- correct 200
//! cargo run --features testing --example testing_sample_controller -- stale-cache 200
//! cargo run --features testing --example testing_sample_controller -- correct boundaries
//! cargo run --features testing --example testing_sample_controller -- unfenced 200 ha
//! ```

#![allow(missing_docs)] // an example; its items are described in the module docs
#![allow(clippy::disallowed_names)] // `Foo` is the resource sample-controller is about
#![allow(dead_code)] // shared with tests/testing_harness.rs, which uses other parts of it

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use durable_informer::leader::{LeaderElectionConfig, Leadership};
use durable_informer::testing::{Env, Harness, Recording};
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{finalizer, Event as FinalizerEvent};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{CustomResource, Resource, ResourceExt};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// `samplecontroller.k8s.io/v1alpha1` `Foo`: a Deployment of `spec.replicas`.
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

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FooStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available_replicas: Option<i32>,
    /// Set by another party (an auditor, in the recording).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The generated name of the Deployment (`crash-create` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployment: Option<String>,
}

/// Which controller: the correct one or a planted bug.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    Correct,
    StaleCache,
    CrashCreate,
    MissedDelete,
    StatusOverwrite,
    Unfenced,
}

impl Variant {
    pub const ALL: [Variant; 6] = [
        Variant::Correct,
        Variant::StaleCache,
        Variant::CrashCreate,
        Variant::MissedDelete,
        Variant::StatusOverwrite,
        Variant::Unfenced,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Variant::Correct => "correct",
            Variant::StaleCache => "stale-cache",
            Variant::CrashCreate => "crash-create",
            Variant::MissedDelete => "missed-delete",
            Variant::StatusOverwrite => "status-overwrite",
            Variant::Unfenced => "unfenced",
        }
    }
}

pub const FINALIZER: &str = "samplecontroller.k8s.io/cleanup";
pub const LABEL: &str = "samplecontroller.k8s.io/foo";

pub struct Ctx {
    pub client: kube::Client,
    pub deployments: Store<Deployment>,
    pub variant: Variant,
    /// This replica's leadership: checked before each write.
    pub leadership: Leadership,
}

/// The reconcile's error, kept typed as kube-rs controllers do: its text is made only when
/// someone shows it (a refused write is half of this controller's requests).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    Finalizer(#[from] Box<kube::runtime::finalizer::Error<Error>>),
    #[error("leadership lost in the middle of the reconcile")]
    Fenced,
}

/// Before each write: a leader deposed while it waited for an answer (its term ran out on
/// its own clock, so the standby may lead by now) must not write on.
fn fence(ctx: &Ctx) -> Result<(), Error> {
    if ctx.variant == Variant::Unfenced || ctx.leadership.is_leading() {
        Ok(())
    } else {
        Err(Error::Fenced)
    }
}

pub fn deployment_for(foo: &Foo, name: Option<&str>, owned: bool) -> Deployment {
    let labels = BTreeMap::from([
        ("app".to_string(), "nginx".to_string()),
        (LABEL.to_string(), foo.name_any()),
    ]);
    Deployment {
        metadata: ObjectMeta {
            name: name.map(str::to_owned),
            generate_name: name.is_none().then(|| format!("{}-", foo.name_any())),
            namespace: foo.namespace(),
            labels: Some(labels.clone()),
            owner_references: if owned {
                foo.controller_owner_ref(&()).map(|o| vec![o])
            } else {
                None
            },
            ..Default::default()
        },
        spec: Some(DeploymentSpec {
            replicas: foo.spec.replicas,
            selector: LabelSelector {
                match_labels: Some(labels.clone()),
                ..Default::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    containers: vec![Container {
                        name: "nginx".into(),
                        image: Some("nginx:latest".into()),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        status: None,
    }
}

/// The Deployments in the cache labelled for `foo`, in name order (a store's order is a
/// hash map's).
fn cached_children(ctx: &Ctx, foo: &Foo) -> Vec<Arc<Deployment>> {
    let mut v: Vec<Arc<Deployment>> = ctx
        .deployments
        .state()
        .into_iter()
        .filter(|d| d.namespace() == foo.namespace() && d.labels().get(LABEL) == Some(&foo.name_any()))
        .collect();
    v.sort_by_key(|d| d.name_any());
    v
}

pub async fn reconcile(foo: Arc<Foo>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let ns = foo.namespace().unwrap_or_default();
    let foos: Api<Foo> = Api::namespaced(ctx.client.clone(), &ns);
    match ctx.variant {
        Variant::MissedDelete => apply(foo, &foos, &ctx).await,
        _ => finalizer(&foos, FINALIZER, foo, |event| async {
            match event {
                FinalizerEvent::Apply(foo) => apply(foo, &foos, &ctx).await,
                FinalizerEvent::Cleanup(foo) => cleanup(foo, &ctx).await,
            }
        })
        .await
        .map_err(|e| Error::Finalizer(Box::new(e))),
    }
}

pub fn error_policy(_: Arc<Foo>, _: &Error, _: Arc<Ctx>) -> Action {
    Action::requeue(Duration::from_secs(5))
}

/// The delete handler the `missed-delete` variant relies on.
pub async fn on_delete(foo: Arc<Foo>, ctx: Arc<Ctx>) {
    if ctx.variant == Variant::MissedDelete {
        let _ = cleanup(foo, &ctx).await;
    }
}

async fn cleanup(foo: Arc<Foo>, ctx: &Ctx) -> Result<Action, Error> {
    let ns = foo.namespace().unwrap_or_default();
    let api: Api<Deployment> = Api::namespaced(ctx.client.clone(), &ns);
    let names: Vec<String> = match ctx.variant {
        Variant::Correct => vec![foo.spec.deployment_name.clone()],
        _ => cached_children(ctx, &foo).iter().map(|d| d.name_any()).collect(),
    };
    for name in names {
        fence(ctx)?;
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    // The finalizer's removal comes next: a write too.
    fence(ctx)?;
    Ok(Action::await_change())
}

async fn apply(foo: Arc<Foo>, foos: &Api<Foo>, ctx: &Ctx) -> Result<Action, Error> {
    let ns = foo.namespace().unwrap_or_default();
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &ns);
    if foo.spec.deployment_name.is_empty() {
        return Ok(Action::await_change());
    }
    let deployment: Deployment = match ctx.variant {
        Variant::Correct | Variant::StatusOverwrite | Variant::Unfenced => {
            let key = ObjectRef::new(&foo.spec.deployment_name).within(&ns);
            match ctx.deployments.get(&key) {
                Some(d) => (*d).clone(),
                // A stale cache makes this create fail with AlreadyExists: retried later.
                None => {
                    fence(ctx)?;
                    deployments
                        .create(
                            &PostParams::default(),
                            &deployment_for(&foo, Some(&foo.spec.deployment_name), true),
                        )
                        .await?
                }
            }
        }
        Variant::StaleCache => match cached_children(ctx, &foo).first() {
            Some(d) => (**d).clone(),
            // BUG: the cache may not show the Deployment created a moment ago.
            None => {
                deployments
                    .create(&PostParams::default(), &deployment_for(&foo, None, true))
                    .await?
            }
        },
        Variant::MissedDelete => match cached_children(ctx, &foo).first() {
            Some(d) => (**d).clone(),
            // BUG (with on_delete): no owner reference and no finalizer.
            None => {
                deployments
                    .create(
                        &PostParams::default(),
                        &deployment_for(&foo, Some(&foo.spec.deployment_name), false),
                    )
                    .await?
            }
        },
        Variant::CrashCreate => {
            let fresh = foos.get(&foo.name_any()).await?;
            match fresh.status.as_ref().and_then(|s| s.deployment.clone()) {
                Some(name) => deployments.get(&name).await?,
                None => {
                    // BUG: the name is remembered only after the create; a crash in between
                    // forgets a Deployment that exists.
                    let d = deployments
                        .create(&PostParams::default(), &deployment_for(&foo, None, true))
                        .await?;
                    let patch = json!({"metadata": {"resourceVersion": fresh.resource_version()},
                        "status": {"deployment": d.name_any()}});
                    foos.patch_status(&foo.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
                        .await?;
                    d
                }
            }
        }
    };
    let current = deployment.spec.as_ref().and_then(|s| s.replicas);
    if foo.spec.replicas.is_some() && foo.spec.replicas != current {
        // The resourceVersion read with it: a stale read gets a conflict, not a lost update.
        let patch = json!({"metadata": {"resourceVersion": deployment.resource_version()},
            "spec": {"replicas": foo.spec.replicas}});
        fence(ctx)?;
        deployments
            .patch(&deployment.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    let available = available_of(&deployment);
    if foo.status.as_ref().and_then(|s| s.available_replicas) != Some(available) {
        fence(ctx)?;
        if ctx.variant == Variant::StatusOverwrite {
            // BUG: the whole status from the cached Foo, without its resourceVersion.
            let mut status = foo.status.clone().unwrap_or_default();
            status.available_replicas = Some(available);
            let mut obj = (*foo).clone();
            obj.status = Some(status);
            obj.metadata.resource_version = None;
            obj.metadata.managed_fields = None;
            foos.replace_status(&foo.name_any(), &PostParams::default(), &obj)
                .await?;
        } else {
            patch_available(foos, &foo, available).await?;
        }
    }
    Ok(Action::requeue(Duration::from_secs(300)))
}

/// A Deployment's available replicas (0 before its status has any).
pub fn available_of(deployment: &Deployment) -> i32 {
    deployment
        .status
        .as_ref()
        .and_then(|s| s.available_replicas)
        .unwrap_or(0)
}

/// Writes `available` into the Foo's status, on the version read (a stale read gets a conflict).
pub async fn patch_available(foos: &Api<Foo>, foo: &Foo, available: i32) -> Result<(), kube::Error> {
    let patch = json!({"metadata": {"resourceVersion": foo.resource_version()},
        "status": {"availableReplicas": available}});
    foos.patch_status(&foo.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(|_| ())
}

/// The Deployments labelled for each Foo in a state.
fn children(deployments: &[Arc<Value>]) -> BTreeMap<(String, String), Vec<String>> {
    let mut out: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for d in deployments {
        if let Some((ns, owner, name)) = labelled(d) {
            out.entry((ns.to_string(), owner.to_string()))
                .or_default()
                .push(name.to_string());
        }
    }
    out
}

/// A Deployment's namespace, the Foo its label names, and its name.
fn labelled(d: &Value) -> Option<(&str, &str, &str)> {
    let owner = d["metadata"]["labels"][LABEL].as_str()?;
    Some((
        d["metadata"]["namespace"].as_str().unwrap_or(""),
        owner,
        d["metadata"]["name"].as_str().unwrap_or(""),
    ))
}

/// The harness for `variant` over the Foo recording.
pub fn harness(variant: Variant, recording: &str) -> Result<Harness<Foo, Ctx, Error>, Box<dyn std::error::Error>> {
    let h = Harness::new(reconcile, error_policy, move |env: &Env| Ctx {
        client: env.client(),
        deployments: env.store::<Deployment>(),
        variant,
        leadership: env.leadership(),
    })
    .recording(Recording::open(recording)?)
    .watches::<Deployment, _, _>(|d: Deployment| {
        let owner = d.labels().get(LABEL).cloned();
        owner.map(|o| ObjectRef::new(&o).within(&d.namespace().unwrap_or_default()))
    })
    .on_delete(on_delete);
    Ok(checks(h))
}

/// The harness for `variant` as a leader and a warm standby (client-go's election timings),
/// with hand-overs among the faults.
pub fn ha_harness(variant: Variant, recording: &str) -> Result<Harness<Foo, Ctx, Error>, Box<dyn std::error::Error>> {
    Ok(harness(variant, recording)?.leader_election(LeaderElectionConfig::default()))
}

/// The sample's checks: at most one Deployment per Foo after every write; at the end, each
/// Foo has its Deployment and each Deployment its Foo.
pub fn checks<C, E>(h: Harness<Foo, C, E>) -> Harness<Foo, C, E>
where
    C: Send + Sync + 'static,
    E: std::fmt::Display + Send + 'static,
{
    h
        // Checked after every write, from the Deployments changed since the last check.
        .unique("at most one Deployment per Foo", "deployments.apps", |d| {
            labelled(d).map(|(ns, foo, _)| format!("{ns}/{foo}"))
        })
        .eventually("every Deployment belongs to a Foo, every Foo has its Deployment", |w| {
            let foos: Vec<Foo> = w.objects();
            let kids = children(&w.list("deployments.apps"));
            let live: std::collections::BTreeSet<(String, String)> = foos
                .iter()
                .map(|f| (f.namespace().unwrap_or_default(), f.name_any()))
                .collect();
            for (key, names) in &kids {
                if !live.contains(key) {
                    return Err(format!(
                        "Deployments {names:?} of Foo {}/{}, which is gone",
                        key.0, key.1
                    ));
                }
            }
            for f in &foos {
                let key = (f.namespace().unwrap_or_default(), f.name_any());
                if f.meta().deletion_timestamp.is_none() && !kids.contains_key(&key) {
                    return Err(format!("Foo {}/{} has no Deployment", key.0, key.1));
                }
            }
            Ok(())
        })
}

#[allow(clippy::print_stdout)]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let name = args.next().unwrap_or_else(|| "correct".into());
    let how = args.next().unwrap_or_else(|| "200".into());
    let ha = args.next().as_deref() == Some("ha");
    let variant = Variant::ALL.into_iter().find(|v| v.name() == name).ok_or_else(|| {
        format!(
            "unknown variant {name:?}: one of correct, stale-cache, crash-create, missed-delete, status-overwrite, unfenced"
        )
    })?;
    let recording = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/recordings/foos.jsonl");
    let start = std::time::Instant::now();
    let h = if ha {
        ha_harness(variant, recording)?
    } else {
        harness(variant, recording)?
    };
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
