//! Discovery: `/version`, API groups and resource lists, and minimal OpenAPI documents.

use serde_json::{json, Value};

use super::super::store::State;
use super::super::Shared;

pub(super) fn version_body(shared: &Shared) -> Value {
    let (minor, git) = if shared.config.old_server {
        ("20", "v1.20.2")
    } else {
        ("33", "v1.33.0")
    };
    json!({"major": "1", "minor": minor, "gitVersion": git, "gitCommit": "durable-informer-sim",
           "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.24",
           "compiler": "gc", "platform": "linux/amd64"})
}

pub(super) fn api_versions() -> Value {
    json!({"kind": "APIVersions", "versions": ["v1"],
           "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]})
}

pub(super) fn groups(st: &State) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    for d in st.resources.iter().filter(|d| !d.group.is_empty()) {
        match out.iter_mut().find(|(g, _)| *g == d.group) {
            Some((_, vs)) => {
                if !vs.contains(&d.version) {
                    vs.push(d.version.clone());
                }
            }
            None => out.push((d.group.clone(), vec![d.version.clone()])),
        }
    }
    out
}

pub(super) fn group_value(g: &str, versions: &[String]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{g}/{v}"), "version": v}))
        .collect();
    json!({"name": g, "versions": vs, "preferredVersion": vs.first().cloned().unwrap_or(Value::Null)})
}

pub(super) fn api_groups(st: &State) -> Value {
    let gs: Vec<Value> = groups(st).iter().map(|(g, vs)| group_value(g, vs)).collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": gs})
}

pub(super) fn api_group(st: &State, g: &str) -> Option<Value> {
    groups(st).iter().find(|(name, _)| name == g).map(|(name, vs)| {
        let mut v = group_value(name, vs);
        if let Some(o) = v.as_object_mut() {
            o.insert("kind".into(), json!("APIGroup"));
            o.insert("apiVersion".into(), json!("v1"));
        }
        v
    })
}

pub(super) fn has_group_version(st: &State, g: &str, v: &str) -> bool {
    st.resources.iter().any(|d| d.group == g && d.version == v)
}

pub(super) fn resource_list(st: &State, g: &str, v: &str) -> Value {
    let mut resources = Vec::new();
    for d in st.resources.iter().filter(|d| d.group == g && d.version == v) {
        let mut r = json!({
            "name": d.plural, "singularName": d.kind.to_lowercase(), "namespaced": d.namespaced,
            "kind": d.kind,
            "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
        });
        if !d.short_names.is_empty() {
            if let Some(o) = r.as_object_mut() {
                o.insert("shortNames".into(), json!(d.short_names));
            }
        }
        resources.push(r);
        if d.status_subresource {
            resources.push(json!({"name": format!("{}/status", d.plural), "singularName": "",
                "namespaced": d.namespaced, "kind": d.kind, "verbs": ["get", "patch", "update"]}));
        }
        if d.has_scale() {
            resources.push(json!({"name": format!("{}/scale", d.plural), "singularName": "",
                "namespaced": d.namespaced, "group": "autoscaling", "version": "v1", "kind": "Scale",
                "verbs": ["get", "patch", "update"]}));
        }
    }
    let gv = if g.is_empty() {
        v.to_string()
    } else {
        format!("{g}/{v}")
    };
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources})
}

/// Minimal OpenAPI v3 discovery: enough for `kubectl` to see that the server validates fields
/// itself (`fieldValidation` on PATCH), so it skips client-side schema validation. No schemas.
pub(super) fn openapi_root(st: &State) -> Value {
    let mut paths = serde_json::Map::new();
    paths.insert(
        "api/v1".into(),
        json!({"serverRelativeURL": "/openapi/v3/api/v1?hash=sim"}),
    );
    for (g, vs) in groups(st) {
        for v in vs {
            paths.insert(
                format!("apis/{g}/{v}"),
                json!({"serverRelativeURL": format!("/openapi/v3/apis/{g}/{v}?hash=sim")}),
            );
        }
    }
    json!({"paths": paths})
}

pub(super) fn openapi_gv(st: &State, g: &str, v: &str) -> Value {
    let mut paths = serde_json::Map::new();
    let params = json!([
        {"name": "fieldValidation", "in": "query", "schema": {"type": "string"}},
        {"name": "fieldManager", "in": "query", "schema": {"type": "string"}},
        {"name": "dryRun", "in": "query", "schema": {"type": "string"}}
    ]);
    for d in st.resources.iter().filter(|d| d.group == g && d.version == v) {
        let base = if g.is_empty() {
            format!("/api/{v}")
        } else {
            format!("/apis/{g}/{v}")
        };
        let path = if d.namespaced {
            format!("{base}/namespaces/{{namespace}}/{}/{{name}}", d.plural)
        } else {
            format!("{base}/{}/{{name}}", d.plural)
        };
        let gvk = json!({"group": d.group, "version": d.version, "kind": d.kind});
        paths.insert(
            path,
            json!({
                "patch": {"x-kubernetes-group-version-kind": gvk, "parameters": params, "responses": {}},
                "put": {"x-kubernetes-group-version-kind": gvk, "parameters": params, "responses": {}}
            }),
        );
    }
    json!({"openapi": "3.0.0", "info": {"title": "Kubernetes (durable-informer sim)", "version": "v1.33.0"}, "paths": paths})
}
