//! kubectl's type-specific table columns for the resources people list most (Pods,
//! Deployments); every other resource gets the generic `NAME AGE`.

use serde_json::Value;

/// The columns of a resource: (before AGE, after AGE with `-o wide`).
pub fn headers(plural: &str, group: &str) -> (&'static [&'static str], &'static [&'static str]) {
    match (plural, group) {
        ("pods", "") => (&["READY", "STATUS", "RESTARTS"], &["IP", "NODE"]),
        ("deployments", "apps") => (&["READY", "UP-TO-DATE", "AVAILABLE"], &[]),
        _ => (&[], &[]),
    }
}

fn int(v: &Value) -> i64 {
    v.as_i64().unwrap_or(0)
}

fn text_or_none(v: &Value) -> String {
    v.as_str().filter(|s| !s.is_empty()).unwrap_or("<none>").to_owned()
}

/// A Pod's STATUS as kubectl shows it: terminating, a container's waiting or terminated
/// reason, the Pod's reason, or its phase.
fn pod_status(v: &Value) -> String {
    if !v["metadata"]["deletionTimestamp"].is_null() {
        return "Terminating".into();
    }
    let statuses = v["status"]["containerStatuses"].as_array().cloned().unwrap_or_default();
    for s in &statuses {
        for state in ["waiting", "terminated"] {
            if let Some(reason) = s["state"][state]["reason"].as_str() {
                return reason.to_owned();
            }
        }
    }
    v["status"]["reason"]
        .as_str()
        .or_else(|| v["status"]["phase"].as_str())
        .unwrap_or("Unknown")
        .to_owned()
}

/// The cells of `headers(plural, group)` for object `v`: (before AGE, after AGE).
pub fn cells(plural: &str, group: &str, v: &Value) -> (Vec<String>, Vec<String>) {
    match (plural, group) {
        ("pods", "") => {
            let statuses = v["status"]["containerStatuses"].as_array().cloned().unwrap_or_default();
            let total = v["spec"]["containers"].as_array().map_or(statuses.len(), Vec::len);
            let ready = statuses.iter().filter(|s| s["ready"] == true).count();
            let restarts: i64 = statuses.iter().map(|s| int(&s["restartCount"])).sum();
            (
                vec![format!("{ready}/{total}"), pod_status(v), restarts.to_string()],
                vec![
                    text_or_none(&v["status"]["podIP"]),
                    text_or_none(&v["spec"]["nodeName"]),
                ],
            )
        }
        ("deployments", "apps") => {
            let status = &v["status"];
            // An absent spec.replicas means 1 (the API server's default).
            let want = v["spec"]["replicas"].as_i64().unwrap_or(1);
            (
                vec![
                    format!("{}/{want}", int(&status["readyReplicas"])),
                    int(&status["updatedReplicas"]).to_string(),
                    int(&status["availableReplicas"]).to_string(),
                ],
                Vec::new(),
            )
        }
        _ => (Vec::new(), Vec::new()),
    }
}
