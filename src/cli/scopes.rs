//! `scopes`: what each scope of a database watches, its size and last use; `scopes drop`.

use std::path::Path;

use durable_informer::store::{ScopeId, ScopeUsage, StoreError};
use serde_json::{json, Value};

use super::db::{open, open_writable, time_ms};
use super::output::{age, print_data, print_table, Format};
use super::{CliError, CliResult};

/// `1.2 MiB`-style sizes, as `du -h` prints them.
fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// The resource (`pods`, `deployments.apps`), namespace and selectors of a scope.
fn describe(u: &ScopeUsage) -> (String, String, String) {
    let Some(spec) = &u.spec else {
        return (u.record.spec.clone(), String::new(), String::new());
    };
    let resource = if spec.group.is_empty() {
        format!("{} ({})", spec.resource, spec.version)
    } else {
        format!("{}.{} ({})", spec.resource, spec.group, spec.version)
    };
    let resource = if spec.metadata_only {
        format!("{resource} metadata-only")
    } else {
        resource
    };
    let selector = [spec.label_selector.as_deref(), spec.field_selector.as_deref()]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join(" ");
    (resource, spec.namespace.clone().unwrap_or_else(|| "*".into()), selector)
}

fn to_json(u: &ScopeUsage) -> Value {
    let spec = u.spec.as_ref();
    json!({
        "id": u.scope.0,
        "spec": u.record.spec,
        "group": spec.map(|s| s.group.clone()),
        "version": spec.map(|s| s.version.clone()),
        "resource": spec.map(|s| s.resource.clone()),
        "namespace": spec.and_then(|s| s.namespace.clone()),
        "labelSelector": spec.and_then(|s| s.label_selector.clone()),
        "fieldSelector": spec.and_then(|s| s.field_selector.clone()),
        "objects": u.record.object_count,
        "objectBytes": u.object_bytes,
        "logEntries": u.log_entries,
        "logBytes": u.log_bytes,
        "lastUsedAtMs": u.last_used_ms,
        "lastUsedAt": u.last_used_ms.map(time_ms),
        "resourceVersion": u.record.rv.as_ref().map(|v| v.0.clone()),
    })
}

/// `scopes`: one row per scope.
pub fn list(path: &Path, output: &Format) -> CliResult {
    let db = open(path)?;
    let usage = db.scope_usage()?;
    if *output != Format::Table {
        let v =
            json!({"database": path.display().to_string(), "scopes": usage.iter().map(to_json).collect::<Vec<_>>()});
        return print_data(output, &v, true);
    }
    let mut rows = vec![[
        "SCOPE",
        "RESOURCE",
        "NAMESPACE",
        "SELECTOR",
        "OBJECTS",
        "SIZE",
        "LOG-ENTRIES",
        "LAST-USED",
    ]
    .map(String::from)
    .to_vec()];
    for u in &usage {
        let (resource, namespace, selector) = describe(u);
        rows.push(vec![
            u.scope.0.to_string(),
            resource,
            namespace,
            if selector.is_empty() { "<none>".into() } else { selector },
            u.record.object_count.to_string(),
            human_bytes(u.object_bytes + u.log_bytes),
            u.log_entries.to_string(),
            u.last_used_ms
                .map_or_else(|| "<unknown>".into(), |ms| format!("{} ago", age(Some(&time_ms(ms))))),
        ]);
    }
    print_table(&rows)
}

/// `scopes drop ID…`: removes scopes, in one writer session (refused while another process
/// writes the database).
pub fn drop(path: &Path, ids: &[u32], output: &Format) -> CliResult {
    let db = open_writable(path)?;
    let usage = db.scope_usage()?;
    let mut dropped = Vec::new();
    for id in ids {
        let Some(u) = usage.iter().find(|u| u.scope.0 == *id) else {
            let known: Vec<String> = usage.iter().map(|u| u.scope.0.to_string()).collect();
            return Err(CliError::new(
                2,
                format!(
                    "{}: no scope {id} (it holds: {}); `durable-informer scopes --db …` lists them",
                    path.display(),
                    if known.is_empty() {
                        "none".into()
                    } else {
                        known.join(", ")
                    }
                ),
            ));
        };
        match db.writer().drop_scope_blocking(ScopeId(*id)) {
            Ok(()) => dropped.push(u.clone()),
            Err(e @ StoreError::UnknownScope(_)) => return Err(CliError::new(2, e.to_string())),
            Err(e) => return Err(e.into()),
        }
    }
    db.close()?;
    if *output != Format::Table {
        let v = json!({"dropped": dropped.iter().map(to_json).collect::<Vec<_>>()});
        return print_data(output, &v, true);
    }
    for u in &dropped {
        let (resource, namespace, selector) = describe(u);
        outln!(
            "dropped scope {}: {resource} in {namespace}{}, {} objects{}; its {} log entries stay until retention removes them",
            u.scope.0,
            if selector.is_empty() { String::new() } else { format!(" ({selector})") },
            u.record.object_count,
            u.last_used_ms
                .map_or_else(String::new, |ms| format!(", last used {} ago", age(Some(&time_ms(ms))))),
            u.log_entries
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::human_bytes;

    #[test]
    fn sizes_read_as_du_prints_them() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(5 << 30), "5.0 GiB");
    }
}
