//! Traffic recorded from a real kube-apiserver (v1.20.2 and v1.37.2) as the controller test
//! harness's input (issue #37): a workload drives Deployments, ReplicaSets and Pods (there is
//! no controller-manager, so the workload writes the ReplicaSets and Pods a Deployment would
//! get, with their owner references), three watches record it as `durable-informer record`
//! would, and the harness checks a controller over the recording with faults.
//!
//! Ignored by default: run `scripts/envtest-install`, then `cargo test --all-features --test
//! 'envtest_*' -- --ignored`.

mod envtest;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use durable_informer::sim::ResourceDef;
use durable_informer::testing::{Harness, Recording, World};
use envtest::{eventually, on_servers, EnvTest, Server};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::core::GroupVersionKind;
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use serde_json::{json, Value};

const NS: &str = "recorded";

/// The controller under test: each Deployment gets a ConfigMap `<name>-replicas`, owned by
/// it, holding its replicas.
struct Ctx {
    client: kube::Client,
}

async fn reconcile(d: Arc<Deployment>, ctx: Arc<Ctx>) -> Result<Action, kube::Error> {
    let ns = d.namespace().unwrap_or_default();
    let name = format!("{}-replicas", d.name_any());
    let replicas = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1).to_string();
    let cms: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ns);
    match cms.get_opt(&name).await? {
        Some(cm) if cm.data.as_ref().and_then(|m| m.get("replicas")) == Some(&replicas) => {}
        Some(_) => {
            let patch = json!({"data": {"replicas": replicas}});
            cms.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
        }
        None => {
            let mut cm = ConfigMap::default();
            cm.metadata.name = Some(name);
            cm.metadata.namespace = Some(ns);
            cm.metadata.owner_references = d.controller_owner_ref(&()).map(|o| vec![o]);
            cm.data = Some(BTreeMap::from([("replicas".to_string(), replicas)]));
            cms.create(&PostParams::default(), &cm).await?;
        }
    }
    Ok(Action::await_change())
}

fn error_policy(_: Arc<Deployment>, _: &kube::Error, _: Arc<Ctx>) -> Action {
    Action::requeue(Duration::from_secs(5))
}

/// The Deployment a summary names as its controller.
fn owner(cm: &Value) -> Option<String> {
    cm["metadata"]["ownerReferences"]
        .as_array()?
        .iter()
        .find(|o| o["controller"] == json!(true) && o["kind"] == "Deployment")
        .and_then(|o| o["name"].as_str())
        .map(str::to_owned)
}

fn summaries_match(w: &World<'_>) -> Result<(), String> {
    let deployments: Vec<Deployment> = w.objects();
    let cms = w.list("configmaps");
    for d in &deployments {
        let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1).to_string();
        let name = format!("{}-replicas", d.name_any());
        let got = cms.iter().find(|c| c["metadata"]["name"] == name.as_str());
        match got.map(|c| c["data"]["replicas"].clone()) {
            Some(v) if v == json!(want) => {}
            other => return Err(format!("{name}: replicas {other:?}, Deployment has {want}")),
        }
    }
    for c in &cms {
        if let Some(o) = owner(c) {
            if !deployments.iter().any(|d| d.name_any() == o) {
                return Err(format!("{:?} outlived its Deployment {o}", c["metadata"]["name"]));
            }
        }
    }
    Ok(())
}

/// Records `plural` into `lines` until aborted; what stops it early is put in `failed`, for
/// the test's waits to report at once instead of timing out.
async fn record(
    client: kube::Client,
    gvk: GroupVersionKind,
    plural: &'static str,
    lines: Arc<Mutex<Vec<String>>>,
    failed: Arc<Mutex<Option<String>>>,
) {
    let why = match record_until_ended(client, gvk, plural, lines).await {
        Ok(()) => format!("the watch of {plural} ended"),
        Err(e) => format!("recording {plural}: {e}"),
    };
    *failed.lock().unwrap() = Some(why);
}

/// Records `plural` in `NS` from now on, as watch lines: the (empty) initial state closed by
/// an `initial-events-end` bookmark, then every event.
async fn record_until_ended(
    client: kube::Client,
    gvk: GroupVersionKind,
    plural: &str,
    lines: Arc<Mutex<Vec<String>>>,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let ar = ApiResource::from_gvk_with_plural(&gvk, plural);
    let api: Api<DynamicObject> = Api::namespaced_with(client, NS, &ar);
    let list = api.list(&ListParams::default()).await?;
    let rv = list.metadata.resource_version.clone().unwrap_or_default();
    let typed = |o: &DynamicObject| -> Result<Value, serde_json::Error> {
        let mut v = serde_json::to_value(o)?;
        v["apiVersion"] = json!(ar.api_version);
        v["kind"] = json!(ar.kind);
        Ok(v)
    };
    {
        let mut l = lines.lock().unwrap();
        for o in &list.items {
            l.push(json!({"type": "ADDED", "object": typed(o)?}).to_string());
        }
        l.push(
            json!({"type": "BOOKMARK", "object": {"apiVersion": ar.api_version, "kind": ar.kind,
                "metadata": {"resourceVersion": rv, "annotations": {"k8s.io/initial-events-end": "true"}}}})
            .to_string(),
        );
    }
    let mut events = Box::pin(api.watch(&WatchParams::default().timeout(120), &rv).await?);
    while let Some(ev) = events.next().await {
        let (kind, o) = match ev? {
            WatchEvent::Added(o) => ("ADDED", o),
            WatchEvent::Modified(o) => ("MODIFIED", o),
            WatchEvent::Deleted(o) => ("DELETED", o),
            WatchEvent::Bookmark(_) | WatchEvent::Error(_) => continue,
        };
        lines
            .lock()
            .unwrap()
            .push(json!({"type": kind, "object": typed(&o)?}).to_string());
    }
    Ok(())
}

fn owned_by(kind: &str, o: &Value) -> Value {
    json!([{"apiVersion": o["apiVersion"], "kind": kind, "name": o["metadata"]["name"],
        "uid": o["metadata"]["uid"], "controller": true, "blockOwnerDeletion": true}])
}

/// What a Deployment's controller-manager would write, written by hand: per Deployment a
/// ReplicaSet and its Pods; then scaling, a template change, a Pod gone, a Deployment gone.
async fn workload(client: &kube::Client) -> [usize; 3] {
    let dyn_api = |gvk: GroupVersionKind, plural: &str| {
        Api::<DynamicObject>::namespaced_with(client.clone(), NS, &ApiResource::from_gvk_with_plural(&gvk, plural))
    };
    let deploys = dyn_api(GroupVersionKind::gvk("apps", "v1", "Deployment"), "deployments");
    let rss = dyn_api(GroupVersionKind::gvk("apps", "v1", "ReplicaSet"), "replicasets");
    let pods = dyn_api(GroupVersionKind::gvk("", "v1", "Pod"), "pods");
    let create = |api: &Api<DynamicObject>, v: Value| {
        let api = api.clone();
        async move {
            let o: DynamicObject = serde_json::from_value(v).expect("object");
            serde_json::to_value(api.create(&PostParams::default(), &o).await.expect("create")).expect("json")
        }
    };
    let template = |app: &str, image: &str| {
        json!({"metadata": {"labels": {"app": app}},
            "spec": {"containers": [{"name": "web", "image": image}]}})
    };
    for i in 0..4 {
        let app = format!("web-{i}");
        let d = create(
            &deploys,
            json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": app, "labels": {"app": app}},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": app}},
                "template": template(&app, "nginx:1.25")}}),
        )
        .await;
        let rs = create(
            &rss,
            json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": format!("{app}-5d4f"), "labels": {"app": app},
                "ownerReferences": owned_by("Deployment", &d)},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": app}},
                "template": template(&app, "nginx:1.25")}}),
        )
        .await;
        for p in 0..2 {
            let mut pod = template(&app, "nginx:1.25");
            pod["apiVersion"] = json!("v1");
            pod["kind"] = json!("Pod");
            pod["metadata"]["name"] = json!(format!("{app}-5d4f-{p}"));
            pod["metadata"]["ownerReferences"] = owned_by("ReplicaSet", &rs);
            create(&pods, pod).await;
        }
    }
    let patch = PatchParams::default();
    deploys
        .patch("web-0", &patch, &Patch::Merge(json!({"spec": {"replicas": 3}})))
        .await
        .expect("scale");
    rss.patch("web-0-5d4f", &patch, &Patch::Merge(json!({"spec": {"replicas": 3}})))
        .await
        .expect("scale rs");
    deploys
        .patch("web-1", &patch, &Patch::Merge(json!({"spec": {"replicas": 2}})))
        .await
        .expect("scale");
    let image = json!({"spec": {"template": {"spec": {"containers": [{"name": "web", "image": "nginx:1.27"}]}}}});
    deploys
        .patch("web-2", &patch, &Patch::Merge(image))
        .await
        .expect("image");
    pods.delete("web-1-5d4f-1", &DeleteParams::default().grace_period(0))
        .await
        .expect("pod");
    deploys
        .delete("web-3", &DeleteParams::default())
        .await
        .expect("deployment");
    // Deployments: 4 created, 3 changed, 1 deleted; ReplicaSets: 4 and 1; Pods: 8 and 1 gone
    // (a Pod deleted with no grace period may also be told as a change first).
    [8, 5, 9]
}

on_servers!(a_recording_from_a_real_server_drives_the_harness);
async fn a_recording_from_a_real_server_drives_the_harness(server: Server) {
    let env = EnvTest::start(server).await;
    let client = env.client().await;
    let ns = Namespace {
        metadata: kube::api::ObjectMeta {
            name: Some(NS.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .expect("namespace");
    let kinds = [
        (GroupVersionKind::gvk("apps", "v1", "Deployment"), "deployments"),
        (GroupVersionKind::gvk("apps", "v1", "ReplicaSet"), "replicasets"),
        (GroupVersionKind::gvk("", "v1", "Pod"), "pods"),
    ];
    let mut recorded = Vec::new();
    let mut tasks = Vec::new();
    let failed = Arc::new(Mutex::new(None));
    for (gvk, plural) in kinds.clone() {
        let lines = Arc::new(Mutex::new(Vec::new()));
        tasks.push(tokio::spawn(record(
            client.clone(),
            gvk,
            plural,
            lines.clone(),
            failed.clone(),
        )));
        recorded.push(lines);
    }
    let recording = || {
        if let Some(why) = failed.lock().unwrap().as_ref() {
            panic!("{why}");
        }
    };
    // Each recorder has listed and bookmarked before the workload starts.
    eventually("the recorders started", 30, async || {
        recording();
        recorded.iter().all(|l| !l.lock().unwrap().is_empty()).then_some(())
    })
    .await;
    let want = workload(&client).await;
    eventually("the workload recorded", 30, async || {
        recording();
        recorded
            .iter()
            .zip(want)
            .all(|(l, n)| l.lock().unwrap().len() > n)
            .then_some(())
    })
    .await;
    for t in &tasks {
        t.abort();
    }
    let dir = tempfile::tempdir().unwrap();
    let mut recordings = Vec::new();
    for ((_, plural), lines) in kinds.iter().zip(&recorded) {
        let path = dir.path().join(format!("{plural}.jsonl"));
        std::fs::write(&path, lines.lock().unwrap().join("\n") + "\n").unwrap();
        let resource = if *plural == "pods" {
            "pods".to_string()
        } else {
            format!("{plural}.apps")
        };
        recordings.push(Recording::open_as(&path, &resource).expect("the recording reads"));
    }
    let changes: usize = recordings.iter().map(Recording::changes_len).sum();
    assert!(
        changes >= want.iter().sum::<usize>(),
        "{changes} changes recorded, {want:?} made"
    );

    let mut h = Harness::new(reconcile, error_policy, |env: &durable_informer::testing::Env| Ctx {
        client: env.client(),
    })
    .resource(ResourceDef::custom("apps", "v1", "ReplicaSet", "replicasets"))
    .owns::<ConfigMap>()
    .unique("one summary per Deployment", "configmaps", owner)
    .eventually("each Deployment has its summary, and only they", summaries_match)
    .threads(2);
    for r in recordings {
        h = h.recording(r);
    }
    let report = tokio::task::spawn_blocking(move || h.check(30))
        .await
        .expect("the harness ran")
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(report.schedules, 31);
}
