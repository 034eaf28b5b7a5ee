//! The simulated server reads Kubernetes protobuf bodies (`application/vnd.kubernetes.protobuf`,
//! the `k8s\0` envelope around `runtime.Unknown`), as current kubectl sends them from its
//! `create` generators, and answers protobuf when the client asks for it first (`Accept`),
//! JSON otherwise. Bodies are built here with the typed messages of `k8s-rs-pb`, independently
//! of the server's reflective conversion.

mod sim_common;

use std::time::Duration;

use durable_informer::sim::{ResourceDef, Sim, SimConfig};
use k8s_rs_pb::api::apps::v1::Deployment;
use k8s_rs_pb::api::autoscaling::v1::Scale;
use k8s_rs_pb::api::batch::v1::Job;
use k8s_rs_pb::api::core::v1::{ConfigMap, Container, Namespace, Secret, ServiceAccount};
use k8s_rs_pb::api::rbac::v1::{PolicyRule, Role};
use k8s_rs_pb::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_rs_pb::apimachinery::pkg::runtime::{TypeMeta, Unknown};
use protobuf::{Message, MessageField};
use serde_json::{json, Value};
use sim_common::*;

const PB: &str = "application/vnd.kubernetes.protobuf";
const T: Duration = Duration::from_secs(10);

fn meta(name: &str) -> MessageField<ObjectMeta> {
    let mut m = ObjectMeta::new();
    m.name = Some(name.into());
    // What Go's encoder writes for unset non-pointer fields.
    m.generateName = Some(String::new());
    m.namespace = Some(String::new());
    m.uid = Some(String::new());
    m.resourceVersion = Some(String::new());
    m.generation = Some(0);
    m.labels.insert("app".into(), name.into());
    MessageField::some(m)
}

fn envelope(api_version: &str, kind: &str, msg: &dyn protobuf::MessageDyn) -> Vec<u8> {
    let mut tm = TypeMeta::new();
    tm.apiVersion = Some(api_version.into());
    tm.kind = Some(kind.into());
    let mut u = Unknown::new();
    u.typeMeta = MessageField::some(tm);
    u.raw = Some(msg.write_to_bytes_dyn().expect("encode"));
    u.contentEncoding = Some(String::new());
    u.contentType = Some(String::new());
    let mut out = b"k8s\0".to_vec();
    out.extend(u.write_to_bytes().expect("encode envelope"));
    out
}

/// The typed message inside a protobuf answer.
fn unwrap_envelope<M: Message>(r: &RawResponse, kind: &str) -> M {
    assert_eq!(r.headers.get("content-type").map(String::as_str), Some(PB), "{r:?}");
    let rest = r.body.strip_prefix(b"k8s\0").expect("magic prefix");
    let u = Unknown::parse_from_bytes(rest).expect("envelope decodes");
    assert_eq!(u.typeMeta.kind(), kind);
    M::parse_from_bytes(u.raw()).expect("message decodes")
}

fn deployment(name: &str, image: &str) -> Deployment {
    let mut d = Deployment::new();
    d.metadata = meta(name);
    let spec = d.spec.mut_or_insert_default();
    spec.replicas = Some(2);
    spec.selector.mut_or_insert_default().matchLabels.insert("app".into(), name.into());
    let tpl = spec.template.mut_or_insert_default();
    tpl.metadata = meta(name);
    let mut c = Container::new();
    c.name = Some("main".into());
    c.image = Some(image.into());
    tpl.spec.mut_or_insert_default().containers.push(c);
    d
}

async fn post_pb(sim: &Sim, path: &str, body: &[u8]) -> RawResponse {
    request_accept(sim.addr(), "POST", path, "application/json", Some((PB, body)), T).await
}

#[tokio::test]
async fn protobuf_creates_of_the_kinds_kubectl_generates_store_their_objects() {
    let sim = Sim::start(SimConfig::default()).expect("start");

    let mut ns = Namespace::new();
    ns.metadata = meta("team-a");
    ns.status.mut_or_insert_default().phase = Some(String::new());
    let r = post_pb(&sim, "/api/v1/namespaces", &envelope("v1", "Namespace", &ns)).await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let created = r.json();
    assert_eq!(created["metadata"]["name"], "team-a");
    assert_eq!(created["kind"], "Namespace");
    // Go writes empty non-pointer fields; they are not stored as "" or {}.
    assert!(created["metadata"].get("generateName").is_none(), "{created}");
    assert!(created["metadata"].get("generation").is_none(), "{created}");
    assert_eq!(created["status"]["phase"], "Active");

    let mut cm = ConfigMap::new();
    cm.metadata = meta("c");
    cm.data.insert("a".into(), "1".into());
    cm.binaryData.insert("b".into(), vec![0, 1, 2]);
    let r = post_pb(&sim, "/api/v1/namespaces/team-a/configmaps", &envelope("v1", "ConfigMap", &cm)).await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let stored = sim.get("configmaps", Some("team-a"), "c").expect("stored");
    assert_eq!(stored["data"], json!({"a": "1"}));
    assert_eq!(stored["binaryData"], json!({"b": "AAEC"}));
    assert_eq!(stored["metadata"]["labels"], json!({"app": "c"}));

    let mut secret = Secret::new();
    secret.metadata = meta("s");
    secret.data.insert("password".into(), b"hunter2".to_vec());
    secret.type_ = Some("Opaque".into());
    let r = post_pb(&sim, "/api/v1/namespaces/team-a/secrets", &envelope("v1", "Secret", &secret)).await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let stored = sim.get("secrets", Some("team-a"), "s").expect("stored");
    assert_eq!(stored["data"]["password"], "aHVudGVyMg==");
    assert_eq!(stored["type"], "Opaque");

    let mut sa = ServiceAccount::new();
    sa.metadata = meta("robot");
    sa.automountServiceAccountToken = Some(false);
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

    let mut job = Job::new();
    job.metadata = meta("once");
    let tpl = job.spec.mut_or_insert_default().template.mut_or_insert_default();
    let mut c = Container::new();
    c.name = Some("run".into());
    c.image = Some("busybox".into());
    c.command = vec!["date".into()];
    let pod = tpl.spec.mut_or_insert_default();
    pod.containers.push(c);
    pod.restartPolicy = Some("Never".into());
    let r = post_pb(&sim, "/apis/batch/v1/namespaces/team-a/jobs", &envelope("batch/v1", "Job", &job)).await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(
        r.json()["spec"]["template"]["spec"]["containers"][0]["command"],
        json!(["date"])
    );

    let mut role = Role::new();
    role.metadata = meta("reader");
    let mut rule = PolicyRule::new();
    rule.verbs = vec!["get".into(), "list".into()];
    rule.apiGroups = vec![String::new()];
    rule.resources = vec!["pods".into()];
    role.rules.push(rule);
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
    let mut cm = ConfigMap::new();
    cm.metadata = meta("c");
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
        ("a Secret posted to configmaps", envelope("v1", "Secret", &Secret::new())),
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
    assert!(sim.get("configmaps", Some("default"), "c").is_err(), "nothing was stored");
    // A patch cannot be protobuf (on a real server neither): 415.
    sim.create("configmaps", Some("default"), json!({"metadata": {"name": "p"}}))
        .expect("seed");
    let r = request_accept(sim.addr(), "PATCH", &format!("{path}/p"), "application/json", Some((PB, &good)), T).await;
    assert_eq!(r.status, 415, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["reason"], "UnsupportedMediaType");
}

#[tokio::test]
async fn answers_protobuf_only_when_the_client_asks_for_it_first() {
    let sim = Sim::start(SimConfig::default().with_resource(ResourceDef::custom(
        "example.com",
        "v1",
        "Widget",
        "widgets",
    )))
    .expect("start");
    sim.create(
        "configmaps",
        Some("default"),
        json!({"metadata": {"name": "c", "labels": {"x": "y"}}, "data": {"k": "v"}}),
    )
    .expect("seed");
    sim.create("widgets", Some("default"), json!({"metadata": {"name": "w"}, "spec": {"size": 1}}))
        .expect("seed widget");
    let path = "/api/v1/namespaces/default/configmaps/c";

    // kubectl's typed clients: protobuf first, JSON as a fallback.
    for accept in [PB, "application/vnd.kubernetes.protobuf,application/json"] {
        let r = request_accept(sim.addr(), "GET", path, accept, None, T).await;
        assert_eq!(r.status, 200);
        let cm: ConfigMap = unwrap_envelope(&r, "ConfigMap");
        assert_eq!(cm.metadata.name(), "c");
        assert_eq!(cm.data.get("k").map(String::as_str), Some("v"));
        assert_eq!(cm.metadata.labels.get("x").map(String::as_str), Some("y"));
        assert!(cm.metadata.creationTimestamp.seconds() > 0, "timestamps are encoded as Time");
        assert!(!cm.metadata.resourceVersion().is_empty());
    }
    // JSON first, or JSON only, or anything: JSON.
    for accept in ["application/json", "application/json,application/vnd.kubernetes.protobuf", "*/*", ""] {
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
    let mut cm = ConfigMap::new();
    cm.metadata = meta("made");
    cm.data.insert("a".into(), "1".into());
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
    assert_eq!(made.metadata.namespace(), "default");
    assert!(!made.metadata.uid().is_empty());

    // A custom resource has no protobuf message: JSON when the client allows it, 406 otherwise.
    let wpath = "/apis/example.com/v1/namespaces/default/widgets/w";
    let r = request_accept(sim.addr(), "GET", wpath, "application/vnd.kubernetes.protobuf,application/json", None, T).await;
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
    assert_eq!((s["kind"].as_str(), s["apiVersion"].as_str()), (Some("Scale"), Some("autoscaling/v1")));
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
    assert_eq!(scale.spec.replicas(), 3);
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
    let containers: Value = sim.get("deployments", Some("default"), "web").expect("stored")["spec"]["template"]
        ["spec"]["containers"]
        .clone();
    assert_eq!(
        containers,
        json!([{"name": "a", "image": "nginx:2", "ports": [{"containerPort": 80}]}])
    );
}
