//! A controller over `DynamicObject` with an `ApiResource` (kube-runtime's `Controller::new_with`)
//! on the simulated cluster: it reconciles a custom resource known only at run time, owns a
//! typed child (its owner references matched by the `ApiResource`'s group and kind), yields
//! object references carrying the `ApiResource`, and restarts without listing objects.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use durable_informer::controller::{Action, Controller};
use durable_informer::informer::Informer;
use durable_informer::sim::{ResourceDef, Sim, SimConfig};
use durable_informer::store::{DurableStore, StoreConfig};
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ObjectMeta, Patch, PatchParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use serde_json::json;

fn widgets() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("example.com", "v1", "Widget"), "widgets")
}

fn sim() -> Sim {
    let sim =
        Sim::start(SimConfig::default().with_resource(ResourceDef::custom("example.com", "v1", "Widget", "widgets")))
            .unwrap();
    for (name, size) in [("small", 1), ("large", 9)] {
        sim.create(
            "widgets",
            Some("default"),
            json!({"apiVersion": "example.com/v1", "kind": "Widget",
                   "metadata": {"name": name, "namespace": "default"}, "spec": {"size": size}}),
        )
        .unwrap();
    }
    sim
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Error(String);

struct Ctx {
    client: kube::Client,
    ar: ApiResource,
    /// Each reconcile: the widget's name and the `size` it saw.
    seen: Mutex<Vec<(String, i64)>>,
}

/// Applies a ConfigMap holding the widget's size, owned (controller) by the widget.
async fn reconcile(w: Arc<DynamicObject>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let name = w.name_any();
    let size = w.data["spec"]["size"]
        .as_i64()
        .ok_or_else(|| Error(format!("{name}: no spec.size")))?;
    ctx.seen.lock().unwrap().push((name.clone(), size));
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some(format!("{name}-size")),
            owner_references: Some(w.controller_owner_ref(&ctx.ar).into_iter().collect()),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([("size".to_owned(), size.to_string())])),
        ..ConfigMap::default()
    };
    Api::<ConfigMap>::namespaced(ctx.client.clone(), "default")
        .patch(
            &format!("{name}-size"),
            &PatchParams::apply("widget-controller").force(),
            &Patch::Apply(&cm),
        )
        .await
        .map_err(|e| Error(e.to_string()))?;
    Ok(Action::await_change())
}

fn error_policy(_w: Arc<DynamicObject>, _e: &Error, _ctx: Arc<Ctx>) -> Action {
    Action::requeue(Duration::from_millis(200))
}

async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..300 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting until {what}");
}

/// Runs the controller until `stop`, collecting the references it yields.
fn start(
    db: &Arc<DurableStore>,
    ctx: Arc<Ctx>,
    refs: Arc<Mutex<Vec<ObjectRef<DynamicObject>>>>,
) -> (tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    let ar = ctx.ar.clone();
    let client = ctx.client.clone();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let stream = Controller::new_with(
        db,
        Api::<DynamicObject>::namespaced_with(client.clone(), "default", &ar),
        watcher::Config::default(),
        ar,
    )
    .owns(
        Api::<ConfigMap>::namespaced(client, "default"),
        watcher::Config::default(),
    )
    .graceful_shutdown_on(async move {
        let _ = stopped.await;
    })
    .run(reconcile, error_policy, ctx);
    let task = tokio::spawn(stream.for_each(move |r| {
        if let Ok((obj, _)) = r {
            refs.lock().unwrap().push(obj);
        }
        async {}
    }));
    (stop, task)
}

fn sizes(ctx: &Ctx) -> BTreeSet<(String, i64)> {
    ctx.seen.lock().unwrap().iter().cloned().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dynamic_object_controller_reconciles_owns_and_restarts_without_listing() {
    let sim = tokio::task::spawn_blocking(sim).await.unwrap();
    let client = sim.client().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db.redb");
    let db = tokio::task::spawn_blocking(move || DurableStore::open(StoreConfig::new(path)))
        .await
        .unwrap()
        .unwrap();
    let db = Arc::new(db);
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        ar: widgets(),
        seen: Mutex::default(),
    });
    let refs = Arc::new(Mutex::new(Vec::new()));
    let (stop, task) = start(&db, ctx.clone(), refs.clone());

    let both = BTreeSet::from([("large".to_owned(), 9), ("small".to_owned(), 1)]);
    eventually("both widgets reconciled", || sizes(&ctx) == both).await;
    eventually("both ConfigMaps applied", || {
        sim.get("configmaps", Some("default"), "small-size").is_ok()
            && sim.get("configmaps", Some("default"), "large-size").is_ok()
    })
    .await;
    // The references carry the ApiResource: kind and group of the widget, not of `()`.
    let r = refs.lock().unwrap()[0].clone();
    assert_eq!(
        (r.dyntype.kind.as_str(), r.dyntype.group.as_str()),
        ("Widget", "example.com")
    );
    assert_eq!(r.to_string(), format!("Widget.v1.example.com/{}.default", r.name));

    // A change of the owned ConfigMap reconciles its owner (matched by the ApiResource's group
    // and kind), which puts the size back.
    let before = ctx.seen.lock().unwrap().len();
    sim.patch(
        "configmaps",
        Some("default"),
        "small-size",
        &json!({"data": {"size": "tampered"}}),
    )
    .unwrap();
    eventually("the owner reconciled again", || {
        ctx.seen.lock().unwrap()[before..].iter().any(|(n, _)| n == "small")
    })
    .await;
    eventually("the size restored", || {
        sim.get("configmaps", Some("default"), "small-size").unwrap()["data"]["size"] == "1"
    })
    .await;
    // A change of the widget itself.
    sim.patch("widgets", Some("default"), "large", &json!({"spec": {"size": 10}}))
        .unwrap();
    eventually("the new size reconciled", || {
        sizes(&ctx).contains(&("large".to_owned(), 10))
    })
    .await;
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .unwrap()
        .unwrap();

    // A restart resumes both informers from the database: no LIST, every widget reconciled.
    sim.patch("widgets", Some("default"), "small", &json!({"spec": {"size": 2}}))
        .unwrap();
    let listed = sim.counters().list_objects;
    let ctx2 = Arc::new(Ctx {
        client,
        ar: widgets(),
        seen: Mutex::default(),
    });
    let (stop, task) = start(&db, ctx2.clone(), Arc::new(Mutex::new(Vec::new())));
    let after = BTreeSet::from([("large".to_owned(), 10), ("small".to_owned(), 2)]);
    eventually("both widgets reconciled after the restart", || {
        sizes(&ctx2).is_superset(&after)
    })
    .await;
    // Each resume probes the server with two LIST requests: the watch cache's revision
    // (matching no object) and a `limit=1` page (one object, to notice an etcd restored from
    // a backup). Relisting the two widgets and two ConfigMaps would serve four.
    assert_eq!(
        sim.counters().list_objects - listed,
        2,
        "a restart lists nothing beyond each informer's one-object probe"
    );
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .unwrap()
        .unwrap();

    // The stored widgets read back as DynamicObjects through `from_api_with`.
    let ar = widgets();
    let informer = Informer::from_api_with(
        &db,
        Api::<DynamicObject>::namespaced_with(sim.client().unwrap(), "default", &ar),
        &ar,
    )
    .build()
    .await
    .unwrap();
    let reader = informer.reader();
    informer.start();
    tokio::time::timeout(Duration::from_secs(20), reader.wait_until_ready())
        .await
        .unwrap()
        .unwrap();
    let large = reader
        .get(&ObjectRef::new_with("large", ar.clone()).within("default"))
        .unwrap();
    assert_eq!(large.data["spec"]["size"], 10);
    assert_eq!(DynamicObject::kind(&ar), "Widget");
    informer.shutdown().await.unwrap();
}
