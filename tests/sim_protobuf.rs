//! The simulated server reads Kubernetes protobuf bodies (`application/vnd.kubernetes.protobuf`,
//! the `k8s\0` envelope around `runtime.Unknown`), as current kubectl sends them from its
//! `create` generators, and answers protobuf when the client asks for it first (`Accept`),
//! JSON otherwise. Bodies are built and answers read here with the typed messages of `k8s-pb`
//! (prost), independently of the server's reflective conversion.

mod sim_common;

use std::time::Duration;

use durable_informer::sim::{ResourceDef, Sim, SimConfig};
use k8s_pb::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_pb::api::autoscaling::v1::Scale;
use k8s_pb::api::batch::v1::{Job, JobSpec};
use k8s_pb::api::core::v1::{
    ConfigMap, Container, Namespace, NamespaceStatus, PodSpec, PodTemplateSpec, Secret, ServiceAccount,
};
use k8s_pb::api::rbac::v1::{PolicyRule, Role};
use k8s_pb::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, Time};
use k8s_pb::apimachinery::pkg::runtime::{TypeMeta, Unknown};
use prost::Message;
use serde_json::{json, Value};
use sim_common::*;

const PB: &str = "application/vnd.kubernetes.protobuf";
const T: Duration = Duration::from_secs(10);

/// Metadata as Go's encoder writes it: unset non-pointer fields present but empty.
fn meta(name: &str) -> Option<ObjectMeta> {
    Some(ObjectMeta {
        name: Some(name.into()),
        generate_name: Some(String::new()),
        namespace: Some(String::new()),
        self_link: Some(String::new()),
        uid: Some(String::new()),
        resource_version: Some(String::new()),
        generation: Some(0),
        creation_timestamp: Some(Time::default()),
        labels: [("app".to_string(), name.to_string())].into(),
        ..ObjectMeta::default()
    })
}

fn envelope(api_version: &str, kind: &str, msg: &impl Message) -> Vec<u8> {
    let u = Unknown {
        type_meta: Some(TypeMeta {
            api_version: Some(api_version.into()),
            kind: Some(kind.into()),
        }),
        raw: Some(msg.encode_to_vec()),
        content_encoding: Some(String::new()),
        content_type: Some(String::new()),
    };
    let mut out = b"k8s\0".to_vec();
    out.extend(u.encode_to_vec());
    out
}

/// The typed message inside a protobuf answer.
fn unwrap_envelope<M: Message + Default>(r: &RawResponse, kind: &str) -> M {
    assert_eq!(r.headers.get("content-type").map(String::as_str), Some(PB), "{r:?}");
    let rest = r.body.strip_prefix(b"k8s\0").expect("magic prefix");
    let u = Unknown::decode(rest).expect("envelope decodes");
    assert_eq!(u.type_meta.and_then(|t| t.kind).as_deref(), Some(kind));
    M::decode(u.raw.unwrap_or_default().as_slice()).expect("message decodes")
}

fn container(name: &str, image: &str) -> Container {
    Container {
        name: Some(name.into()),
        image: Some(image.into()),
        ..Container::default()
    }
}

fn deployment(name: &str, image: &str) -> Deployment {
    Deployment {
        metadata: meta(name),
        spec: Some(DeploymentSpec {
            replicas: Some(2),
            selector: Some(LabelSelector {
                match_labels: [("app".to_string(), name.to_string())].into(),
                ..LabelSelector::default()
            }),
            template: Some(PodTemplateSpec {
                metadata: meta(name),
                spec: Some(PodSpec {
                    containers: vec![container("main", image)],
                    ..PodSpec::default()
                }),
            }),
            ..DeploymentSpec::default()
        }),
        status: None,
    }
}

fn meta_of(m: &Option<ObjectMeta>) -> &ObjectMeta {
    m.as_ref().expect("metadata")
}

async fn post_pb(sim: &Sim, path: &str, body: &[u8]) -> RawResponse {
    request_accept(sim.addr(), "POST", path, "application/json", Some((PB, body)), T).await
}

#[tokio::test]
async fn protobuf_creates_of_the_kinds_kubectl_generates_store_their_objects() {
    let sim = Sim::start(SimConfig::default()).expect("start");

    let ns = Namespace {
        metadata: meta("team-a"),
        spec: Some(Default::default()),
        status: Some(NamespaceStatus {
            phase: Some(String::new()),
            ..NamespaceStatus::default()
        }),
    };
    let r = post_pb(&sim, "/api/v1/namespaces", &envelope("v1", "Namespace", &ns)).await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let created = r.json();
    assert_eq!(created["metadata"]["name"], "team-a");
    assert_eq!(created["kind"], "Namespace");
    // Go writes empty non-pointer fields; they are not stored as "" or {}.
    assert!(created["metadata"].get("generateName").is_none(), "{created}");
    assert!(created["metadata"].get("generation").is_none(), "{created}");
    assert_eq!(created["status"]["phase"], "Active");

    let cm = ConfigMap {
        metadata: meta("c"),
        data: [("a".to_string(), "1".to_string())].into(),
        binary_data: [("b".to_string(), vec![0, 1, 2])].into(),
        immutable: None,
    };
    let r = post_pb(
        &sim,
        "/api/v1/namespaces/team-a/configmaps",
        &envelope("v1", "ConfigMap", &cm),
    )
    .await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let stored = sim.get("configmaps", Some("team-a"), "c").expect("stored");
    assert_eq!(stored["data"], json!({"a": "1"}));
    assert_eq!(stored["binaryData"], json!({"b": "AAEC"}));
    assert_eq!(stored["metadata"]["labels"], json!({"app": "c"}));

    let secret = Secret {
        metadata: meta("s"),
        data: [("password".to_string(), b"hunter2".to_vec())].into(),
        r#type: Some("Opaque".into()),
        ..Secret::default()
    };
    let r = post_pb(
        &sim,
        "/api/v1/namespaces/team-a/secrets",
        &envelope("v1", "Secret", &secret),
    )
    .await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let stored = sim.get("secrets", Some("team-a"), "s").expect("stored");
    assert_eq!(stored["data"]["password"], "aHVudGVyMg==");
    assert_eq!(stored["type"], "Opaque");

    let sa = ServiceAccount {
        metadata: meta("robot"),
        automount_service_account_token: Some(false),
        ..ServiceAccount::default()
    };
    let r = post_pb(
        &sim,
        "/api/v1/namespaces/team-a/serviceaccounts",
        &envelope("v1", "ServiceAccount", &sa),
    )
    .await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    // An explicit false is kept.
    assert_eq!(r.json()["automountServiceAccountToken"], false);

    let d = deployment("web", "nginx:1");
    let r = post_pb(
        &sim,
        "/apis/apps/v1/namespaces/team-a/deployments",
        &envelope("apps/v1", "Deployment", &d),
    )
    .await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let stored = sim.get("deployments", Some("team-a"), "web").expect("stored");
    assert_eq!(stored["spec"]["replicas"], 2);
    assert_eq!(stored["spec"]["selector"]["matchLabels"]["app"], "web");
    assert_eq!(stored["spec"]["template"]["spec"]["containers"][0]["image"], "nginx:1");
    assert_eq!(stored["metadata"]["generation"], 1);

    let job = Job {
        metadata: meta("once"),
        spec: Some(JobSpec {
            template: Some(PodTemplateSpec {
                metadata: meta("once"),
                spec: Some(PodSpec {
                    containers: vec![Container {
                        command: vec!["date".into()],
                        ..container("run", "busybox")
                    }],
                    restart_policy: Some("Never".into()),
                    ..PodSpec::default()
                }),
            }),
            ..JobSpec::default()
        }),
        status: None,
    };
    let r = post_pb(
        &sim,
        "/apis/batch/v1/namespaces/team-a/jobs",
        &envelope("batch/v1", "Job", &job),
    )
    .await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(
        r.json()["spec"]["template"]["spec"]["containers"][0]["command"],
        json!(["date"])
    );

    let role = Role {
        metadata: meta("reader"),
        rules: vec![PolicyRule {
            verbs: vec!["get".into(), "list".into()],
            api_groups: vec![String::new()],
            resources: vec!["pods".into()],
            ..PolicyRule::default()
        }],
    };
    let r = post_pb(
        &sim,
        "/apis/rbac.authorization.k8s.io/v1/namespaces/team-a/roles",
        &envelope("rbac.authorization.k8s.io/v1", "Role", &role),
    )
    .await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    // An empty string inside a list is a value (the core API group), not an omitted field.
    assert_eq!(r.json()["rules"][0]["apiGroups"], json!([""]));
    assert_eq!(r.json()["rules"][0]["verbs"], json!(["get", "list"]));
}

#[tokio::test]
async fn malformed_or_mismatched_protobuf_bodies_are_400_statuses() {
    let sim = Sim::start(SimConfig::default()).expect("start");
    let cm = ConfigMap {
        metadata: meta("c"),
        ..ConfigMap::default()
    };
    let good = envelope("v1", "ConfigMap", &cm);
    let path = "/api/v1/namespaces/default/configmaps";
    let mut garbage_inside = b"k8s\0".to_vec();
    garbage_inside.extend([0x0a, 0xff, 0xff, 0xff]);
    let mut truncated = good.clone();
    truncated.truncate(good.len() - 3);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("no magic prefix", good[4..].to_vec()),
        ("garbage after the prefix", garbage_inside),
        ("truncated", truncated),
        (
            "a Secret posted to configmaps",
            envelope("v1", "Secret", &Secret::default()),
        ),
        ("an unknown kind", envelope("example.com/v1", "Thing", &cm)),
    ];
    for (what, body) in cases {
        let r = post_pb(&sim, path, &body).await;
        assert_eq!(r.status, 400, "{what}: {}", String::from_utf8_lossy(&r.body));
        let status = r.json();
        assert_eq!(status["kind"], "Status", "{what}");
        assert_eq!(status["reason"], "BadRequest", "{what}");
        assert!(!status["message"].as_str().unwrap_or("").is_empty(), "{what}");
    }
    assert!(
        sim.get("configmaps", Some("default"), "c").is_err(),
        "nothing was stored"
    );
    // A patch cannot be protobuf (on a real server neither): 415.
    sim.create("configmaps", Some("default"), json!({"metadata": {"name": "p"}}))
        .expect("seed");
    let r = request_accept(
        sim.addr(),
        "PATCH",
        &format!("{path}/p"),
        "application/json",
        Some((PB, &good)),
        T,
    )
    .await;
    assert_eq!(r.status, 415, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["reason"], "UnsupportedMediaType");
}

#[tokio::test]
async fn answers_protobuf_only_when_the_client_asks_for_it_first() {
    let sim =
        Sim::start(SimConfig::default().with_resource(ResourceDef::custom("example.com", "v1", "Widget", "widgets")))
            .expect("start");
    sim.create(
        "configmaps",
        Some("default"),
        json!({"metadata": {"name": "c", "labels": {"x": "y"}}, "data": {"k": "v"}}),
    )
    .expect("seed");
    sim.create(
        "widgets",
        Some("default"),
        json!({"metadata": {"name": "w"}, "spec": {"size": 1}}),
    )
    .expect("seed widget");
    let path = "/api/v1/namespaces/default/configmaps/c";

    // kubectl's typed clients: protobuf first, JSON as a fallback.
    for accept in [PB, "application/vnd.kubernetes.protobuf,application/json"] {
        let r = request_accept(sim.addr(), "GET", path, accept, None, T).await;
        assert_eq!(r.status, 200);
        let cm: ConfigMap = unwrap_envelope(&r, "ConfigMap");
        let m = meta_of(&cm.metadata);
        assert_eq!(m.name.as_deref(), Some("c"));
        assert_eq!(cm.data.get("k").map(String::as_str), Some("v"));
        assert_eq!(m.labels.get("x").map(String::as_str), Some("y"));
        assert!(
            m.creation_timestamp.as_ref().and_then(|t| t.seconds).unwrap_or(0) > 1_600_000_000,
            "timestamps are encoded as Time: {m:?}"
        );
        assert!(m.resource_version.as_deref().is_some_and(|rv| !rv.is_empty()));
    }
    // JSON first, or JSON only, or anything: JSON.
    for accept in [
        "application/json",
        "application/json,application/vnd.kubernetes.protobuf",
        "*/*",
        "",
    ] {
        let r = request_accept(sim.addr(), "GET", path, accept, None, T).await;
        assert_eq!(r.status, 200);
        assert_eq!(
            r.headers.get("content-type").map(String::as_str),
            Some("application/json"),
            "Accept {accept:?}"
        );
        assert_eq!(r.json()["data"]["k"], "v");
    }
    // A create answered in protobuf.
    let cm = ConfigMap {
        metadata: meta("made"),
        data: [("a".to_string(), "1".to_string())].into(),
        ..ConfigMap::default()
    };
    let r = request_accept(
        sim.addr(),
        "POST",
        "/api/v1/namespaces/default/configmaps",
        "application/vnd.kubernetes.protobuf,application/json",
        Some((PB, &envelope("v1", "ConfigMap", &cm))),
        T,
    )
    .await;
    assert_eq!(r.status, 201);
    let made: ConfigMap = unwrap_envelope(&r, "ConfigMap");
    assert_eq!(meta_of(&made.metadata).namespace.as_deref(), Some("default"));
    assert!(meta_of(&made.metadata).uid.as_deref().is_some_and(|u| !u.is_empty()));
    assert_eq!(made.data.get("a").map(String::as_str), Some("1"));

    // A custom resource has no protobuf message: JSON when the client allows it, 406 otherwise.
    let wpath = "/apis/example.com/v1/namespaces/default/widgets/w";
    let r = request_accept(
        sim.addr(),
        "GET",
        wpath,
        "application/vnd.kubernetes.protobuf,application/json",
        None,
        T,
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["spec"]["size"], 1);
    let r = request_accept(sim.addr(), "GET", wpath, PB, None, T).await;
    assert_eq!(r.status, 406, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["reason"], "NotAcceptable");
}

#[tokio::test]
async fn the_scale_subresource_reads_and_sets_replicas() {
    let sim = Sim::start(SimConfig::default()).expect("start");
    sim.create(
        "deployments",
        Some("default"),
        json!({"metadata": {"name": "web"}, "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "nginx"}]}}}}),
    )
    .expect("seed");
    let path = "/apis/apps/v1/namespaces/default/deployments/web/scale";
    let r = request_accept(sim.addr(), "GET", path, "application/json", None, T).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let s = r.json();
    assert_eq!(
        (s["kind"].as_str(), s["apiVersion"].as_str()),
        (Some("Scale"), Some("autoscaling/v1"))
    );
    assert_eq!(s["spec"]["replicas"], 1);
    assert_eq!(s["status"]["selector"], "app=web");

    let r = request_accept(
        sim.addr(),
        "PATCH",
        path,
        "application/vnd.kubernetes.protobuf,application/json",
        Some(("application/merge-patch+json", br#"{"spec":{"replicas":3}}"#)),
        T,
    )
    .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let scale: Scale = unwrap_envelope(&r, "Scale");
    assert_eq!(scale.spec.and_then(|s| s.replicas), Some(3));
    assert_eq!(scale.status.and_then(|s| s.selector).as_deref(), Some("app=web"));
    let d = sim.get("deployments", Some("default"), "web").expect("deployment");
    assert_eq!(d["spec"]["replicas"], 3);
    assert_eq!(d["metadata"]["generation"], 2);

    let r = request_accept(
        sim.addr(),
        "PATCH",
        path,
        "application/json",
        Some(("application/merge-patch+json", br#"{"spec":{"replicas":-1}}"#)),
        T,
    )
    .await;
    assert_eq!(r.status, 422, "{}", String::from_utf8_lossy(&r.body));
    // Discovery lists the subresource, as kubectl scale looks it up there.
    let r = request_accept(sim.addr(), "GET", "/apis/apps/v1", "application/json", None, T).await;
    let scale_entry = r.json()["resources"]
        .as_array()
        .and_then(|rs| rs.iter().find(|x| x["name"] == "deployments/scale").cloned())
        .expect("deployments/scale in discovery");
    assert_eq!(scale_entry["kind"], "Scale");
    assert_eq!(scale_entry["group"], "autoscaling");
    // ConfigMaps have no /scale.
    let r = request_accept(
        sim.addr(),
        "GET",
        "/api/v1/namespaces/default/configmaps/x/scale",
        "application/json",
        None,
        T,
    )
    .await;
    assert_eq!(r.status, 404);
}

#[tokio::test]
async fn a_strategic_merge_patch_merges_containers_by_name() {
    let sim = Sim::start(SimConfig::default()).expect("start");
    sim.create(
        "deployments",
        Some("default"),
        json!({"metadata": {"name": "web"}, "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [
                {"name": "a", "image": "nginx:1", "ports": [{"containerPort": 80}]},
                {"name": "b", "image": "redis:1"}]}}}}),
    )
    .expect("seed");
    // What `kubectl apply` sends when one container's image changes.
    let patch = json!({"spec": {"template": {"spec": {
        "$setElementOrder/containers": [{"name": "a"}, {"name": "b"}],
        "containers": [{"name": "a", "image": "nginx:2"}, {"name": "b", "$patch": "delete"}]}}}});
    let r = request_accept(
        sim.addr(),
        "PATCH",
        "/apis/apps/v1/namespaces/default/deployments/web",
        "application/json",
        Some((
            "application/strategic-merge-patch+json",
            &serde_json::to_vec(&patch).expect("json"),
        )),
        T,
    )
    .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let containers: Value = sim.get("deployments", Some("default"), "web").expect("stored")["spec"]["template"]["spec"]
        ["containers"]
        .clone();
    assert_eq!(
        containers,
        json!([{"name": "a", "image": "nginx:2", "ports": [{"containerPort": 80}]}])
    );
}
