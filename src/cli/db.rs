//! Commands over a database file: get, list, history, stats, check, compact.

use std::path::Path;

use durable_informer::object::ObjectKey;
use durable_informer::selector::LabelSelector;
use durable_informer::store::{DeltaKind, DurableStore, ScopeId, ScopeRecord, Seq, Store, StoreConfig, StoredObject};
use serde_json::{json, Value};

use super::progress::spinner;
use super::{CliError, CliResult, Output};

pub fn open(path: &Path) -> CliResult<DurableStore> {
    if !path.exists() {
        return Err(CliError::new(
            4,
            format!(
                "{}: no such database; create one with `durable-informer watch --db …` or `replay`",
                path.display()
            ),
        ));
    }
    Ok(DurableStore::open(StoreConfig::new(path))?)
}

/// Splits `plural[.group]`.
pub fn split_resource(resource: &str) -> (String, String) {
    match resource.split_once('.') {
        Some((plural, group)) => (plural.to_owned(), group.to_owned()),
        None => (resource.to_owned(), String::new()),
    }
}

/// The parts of a canonical scope spec: (group, version, resource, namespace, labels, fields).
pub fn parse_spec(spec: &str) -> (String, String, String, String, String, String) {
    let (path, query) = spec.split_once('?').unwrap_or((spec, ""));
    let mut parts = path.splitn(3, '/');
    let group = parts.next().unwrap_or_default().to_owned();
    let version = parts.next().unwrap_or_default().to_owned();
    let resource = parts.next().unwrap_or_default().to_owned();
    let mut ns = String::new();
    let mut labels = String::new();
    let mut fields = String::new();
    // Values may themselves contain '&' only inside selectors, which are last; split on the
    // known keys instead.
    if let Some(rest) = query.strip_prefix("ns=") {
        let (n, rest) = rest.split_once("&labels=").unwrap_or((rest, ""));
        ns = n.to_owned();
        let (l, f) = rest.split_once("&fields=").unwrap_or((rest, ""));
        labels = l.to_owned();
        fields = f.to_owned();
    }
    (group, version, resource, ns, labels, fields)
}

/// The scope of `resource` in the database (preferring the one for `namespace`, then the
/// all-namespaces one).
pub fn find_scope(db: &DurableStore, resource: &str, namespace: Option<&str>) -> CliResult<(ScopeId, ScopeRecord)> {
    let (plural, group) = split_resource(resource);
    let scopes = db.scopes()?;
    let mut candidates: Vec<(ScopeId, ScopeRecord)> = scopes
        .into_iter()
        .filter(|(_, r)| {
            let (g, _, res, _, _, _) = parse_spec(&r.spec);
            g == group && res == plural
        })
        .collect();
    if candidates.is_empty() {
        return Err(CliError::new(
            5,
            format!(
                "{}: no scope for resource {resource:?} in this database (see `durable-informer stats`)",
                db.path().display()
            ),
        ));
    }
    candidates.sort_by_key(|(_, r)| {
        let (_, _, _, ns, labels, fields) = parse_spec(&r.spec);
        let ns_rank = match namespace {
            Some(want) if ns == want => 0,
            _ if ns.is_empty() => 1,
            _ => 2,
        };
        (ns_rank, !labels.is_empty() || !fields.is_empty())
    });
    Ok(candidates.remove(0))
}

fn pretty(v: &Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
}

fn to_value(o: &StoredObject) -> Value {
    serde_json::from_slice(&o.bytes).unwrap_or(Value::Null)
}

/// A small YAML emitter for JSON values (block style, strings quoted when needed).
pub fn yaml(v: &Value) -> String {
    fn scalar(v: &Value) -> String {
        match v {
            Value::Null => "null".into(),
            Value::Bool(b) => b.to_string(),
            Value::Number(n) => n.to_string(),
            Value::String(s) => {
                let plain = !s.is_empty()
                    && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
                    && !matches!(s.as_str(), "true" | "false" | "null" | "yes" | "no" | "on" | "off")
                    && s.parse::<f64>().is_err();
                if plain {
                    s.clone()
                } else {
                    serde_json::to_string(s).unwrap_or_default()
                }
            }
            Value::Array(a) if a.is_empty() => "[]".into(),
            Value::Object(o) if o.is_empty() => "{}".into(),
            _ => String::new(),
        }
    }
    fn is_block(v: &Value) -> bool {
        matches!(v, Value::Array(a) if !a.is_empty()) || matches!(v, Value::Object(o) if !o.is_empty())
    }
    fn emit(v: &Value, indent: usize, out: &mut String) {
        let pad = " ".repeat(indent);
        match v {
            Value::Object(o) if !o.is_empty() => {
                for (k, val) in o {
                    let key = scalar(&Value::String(k.clone()));
                    if is_block(val) {
                        out.push_str(&format!("{pad}{key}:\n"));
                        emit(val, indent + 2, out);
                    } else {
                        out.push_str(&format!("{pad}{key}: {}\n", scalar(val)));
                    }
                }
            }
            Value::Array(a) if !a.is_empty() => {
                for item in a {
                    if is_block(item) {
                        let mut inner = String::new();
                        emit(item, indent + 2, &mut inner);
                        let trimmed = inner.trim_start_matches(' ');
                        out.push_str(&format!("{pad}- {trimmed}"));
                    } else {
                        out.push_str(&format!("{pad}- {}\n", scalar(item)));
                    }
                }
            }
            other => out.push_str(&format!("{pad}{}\n", scalar(other))),
        }
    }
    let mut out = String::new();
    emit(v, 0, &mut out);
    out
}

pub fn get(path: &Path, resource: &str, key: &str, output: Output) -> CliResult {
    let db = open(path)?;
    let key: ObjectKey = key
        .parse()
        .map_err(|e| CliError::new(2, format!("bad key {key:?}: {e}")))?;
    let (scope, _) = find_scope(&db, resource, key.namespace.as_deref())?;
    let Some(obj) = db.store(scope).get(&key)? else {
        return Err(CliError::runtime(format!(
            "{resource} {key} not found in {}",
            path.display()
        )));
    };
    match output {
        Output::Yaml => outp!("{}", yaml(&to_value(&obj)))?,
        _ => outln!("{}", pretty(&to_value(&obj)))?,
    }
    Ok(())
}

fn age(meta_created: Option<&str>) -> String {
    meta_created.map(str::to_owned).unwrap_or_else(|| "-".into())
}

pub fn list(
    path: &Path,
    resource: &str,
    namespace: Option<&str>,
    selector: Option<&str>,
    index: Option<&str>,
    output: Output,
) -> CliResult {
    let db = open(path)?;
    let (scope, record) = find_scope(&db, resource, namespace)?;
    let store: Store = db.store(scope);
    let selector: LabelSelector = match selector {
        Some(s) => s
            .parse()
            .map_err(|e| CliError::new(2, format!("bad label selector {s:?}: {e}")))?,
        None => LabelSelector::default(),
    };
    let objects = match (index, namespace) {
        (Some(ix), _) => {
            let (name, value) = ix
                .split_once('=')
                .ok_or_else(|| CliError::new(2, format!("--index takes NAME=VALUE, got {ix:?}")))?;
            store.by_index(name, value)?
        }
        (None, Some(ns)) => store.list_namespace(ns)?,
        (None, None) => store.list()?,
    };
    let objects: Vec<StoredObject> = objects
        .into_iter()
        .filter(|o| namespace.is_none_or(|ns| o.meta.namespace.as_deref() == Some(ns)))
        .filter(|o| selector.matches(&o.meta.labels))
        .collect();
    match output {
        Output::Json | Output::Yaml => {
            let list = json!({
                "apiVersion": "v1",
                "kind": "List",
                "metadata": {"resourceVersion": record.rv.map(|r| r.0).unwrap_or_default()},
                "items": objects.iter().map(to_value).collect::<Vec<_>>(),
            });
            if output == Output::Json {
                outln!("{}", pretty(&list))?;
            } else {
                outp!("{}", yaml(&list))?;
            }
        }
        Output::Table | Output::Wide => {
            let wide = output == Output::Wide;
            let mut rows = vec![if wide {
                vec!["NAMESPACE", "NAME", "RESOURCE-VERSION", "CREATED", "LABELS", "OWNER"]
                    .into_iter()
                    .map(String::from)
                    .collect::<Vec<_>>()
            } else {
                vec![
                    "NAMESPACE".into(),
                    "NAME".into(),
                    "RESOURCE-VERSION".into(),
                    "CREATED".into(),
                ]
            }];
            for o in &objects {
                let v = to_value(o);
                let created = v["metadata"]["creationTimestamp"].as_str().map(str::to_owned);
                let mut row = vec![
                    o.meta.namespace.clone().unwrap_or_default(),
                    o.meta.name.clone(),
                    o.meta.resource_version.0.clone(),
                    age(created.as_deref()),
                ];
                if wide {
                    row.push(
                        o.meta
                            .labels
                            .iter()
                            .map(|(k, v)| format!("{k}={v}"))
                            .collect::<Vec<_>>()
                            .join(","),
                    );
                    row.push(
                        o.meta
                            .owner_references
                            .first()
                            .map(|r| format!("{}/{}", r.kind, r.name))
                            .unwrap_or_default(),
                    );
                }
                rows.push(row);
            }
            print_table(&rows)?;
        }
    }
    Ok(())
}

pub fn print_table(rows: &[Vec<String>]) -> CliResult {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for r in rows {
        let line: Vec<String> = r
            .iter()
            .enumerate()
            .map(|(i, s)| {
                if i + 1 == r.len() {
                    s.clone()
                } else {
                    format!("{s:<w$}", w = widths[i])
                }
            })
            .collect();
        outln!("{}", line.join("   ").trim_end())?;
    }
    Ok(())
}

pub fn history(path: &Path, resource: &str, key: &str, output: Output) -> CliResult {
    let db = open(path)?;
    let key: ObjectKey = key
        .parse()
        .map_err(|e| CliError::new(2, format!("bad key {key:?}: {e}")))?;
    let (scope, _) = find_scope(&db, resource, key.namespace.as_deref())?;
    let log = db.log();
    let mut cursor = Seq(0);
    let mut entries = Vec::new();
    loop {
        let (batch, scanned) = log.read_scope_after(cursor, 4096, scope)?;
        if batch.is_empty() && scanned == cursor {
            break;
        }
        cursor = scanned;
        entries.extend(batch.into_iter().filter(|r| r.key == key));
    }
    let first = log.bounds()?.map(|(f, _)| f.0).unwrap_or(0);
    match output {
        Output::Json | Output::Yaml => {
            for e in &entries {
                let kind = match e.kind {
                    DeltaKind::Added => "ADDED",
                    DeltaKind::Deleted => "DELETED",
                    _ => "MODIFIED",
                };
                let object: Value = e
                    .object
                    .as_deref()
                    .or(e.old.as_deref())
                    .and_then(|b| serde_json::from_slice(b).ok())
                    .unwrap_or(Value::Null);
                outln!(
                    "{}",
                    json!({"seq": e.seq.0, "type": kind, "resourceVersion": e.rv.0, "object": object})
                )?;
            }
        }
        _ => {
            let mut rows = vec![vec![
                "SEQ".to_string(),
                "EVENT".into(),
                "RESOURCE-VERSION".into(),
                "NOTE".into(),
            ]];
            for e in &entries {
                rows.push(vec![
                    e.seq.0.to_string(),
                    format!("{:?}", e.kind),
                    e.rv.0.clone(),
                    if e.final_state_unknown {
                        "found by a relist (final state unknown)".into()
                    } else {
                        String::new()
                    },
                ]);
            }
            print_table(&rows)?;
            errln!("(history covers the retained log, from seq {first})");
        }
    }
    Ok(())
}

pub fn stats(path: &Path, output: Output) -> CliResult {
    let db = open(path)?;
    let size = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let bounds = db.log().bounds()?;
    let scopes = db.scopes()?;
    let identity = db.cluster_identity()?;
    if output == Output::Json {
        let v = json!({
            "database": path.display().to_string(),
            "bytes": size,
            "clusterIdentity": identity,
            "log": bounds.map(|(f, l)| json!({"first": f.0, "last": l.0, "entries": l.0 - f.0 + 1})),
            "scopes": scopes.iter().map(|(id, r)| json!({
                "id": id.0,
                "spec": r.spec,
                "objects": r.object_count,
                "resourceVersion": r.rv.as_ref().map(|v| v.0.clone()),
                "synced": r.synced,
                "relists": r.relist_count,
                "lastRelistReason": r.last_relist_reason,
                "lastRelistAtMs": r.last_relist_at_ms,
                "lastRelistAt": r.last_relist_at_ms.map(time_ms),
            })).collect::<Vec<_>>(),
        });
        outln!("{}", pretty(&v))?;
        return Ok(());
    }
    outln!("database      {} ({} bytes)", path.display(), size)?;
    outln!("cluster       {}", identity.unwrap_or_else(|| "-".into()))?;
    match bounds {
        Some((f, l)) => outln!(
            "log           seq {}..{} ({} entries retained)",
            f.0,
            l.0,
            l.0 - f.0 + 1
        )?,
        None => outln!("log           empty")?,
    }
    let mut rows = vec![vec![
        "SCOPE".to_string(),
        "RESOURCE".into(),
        "NAMESPACE".into(),
        "SELECTORS".into(),
        "OBJECTS".into(),
        "RV".into(),
        "SYNCED".into(),
        "RELISTS".into(),
        "LAST-RELIST".into(),
        "LAST-LIST-REASON".into(),
    ]];
    for (id, r) in &scopes {
        let (g, v, res, ns, labels, fields) = parse_spec(&r.spec);
        let resource = if g.is_empty() {
            format!("{res} ({v})")
        } else {
            format!("{res}.{g} ({v})")
        };
        let sel = [labels, fields]
            .into_iter()
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()
            .join(" ");
        rows.push(vec![
            id.0.to_string(),
            resource,
            if ns.is_empty() { "*".into() } else { ns },
            sel,
            r.object_count.to_string(),
            r.rv.as_ref().map(|v| v.0.clone()).unwrap_or_else(|| "-".into()),
            r.synced.to_string(),
            r.relist_count.to_string(),
            r.last_relist_at_ms.map_or_else(|| "-".into(), time_ms),
            r.last_relist_reason.clone().unwrap_or_default(),
        ]);
    }
    print_table(&rows)?;
    Ok(())
}

/// A wall-clock time in milliseconds since the epoch, as RFC 3339 UTC (seconds precision).
fn time_ms(ms: u64) -> String {
    i64::try_from(ms / 1000)
        .ok()
        .and_then(|s| k8s_openapi::jiff::Timestamp::from_second(s).ok())
        .map_or_else(|| format!("{ms}ms"), |t| t.to_string())
}

pub fn check(path: &Path, output: Output) -> CliResult {
    let db = open(path)?;
    let report = db.check()?;
    if output == Output::Json {
        outln!(
            "{}",
            pretty(&json!({
                "ok": report.is_ok(),
                "scopes": report.scopes,
                "objects": report.objects,
                "logEntries": report.log_entries,
                "indexRows": report.index_rows,
                "problems": report.problems,
            }))
        )?;
    } else {
        outln!(
            "checked {} scopes, {} objects, {} log entries, {} index rows",
            report.scopes,
            report.objects,
            report.log_entries,
            report.index_rows
        )?;
        for p in &report.problems {
            outln!("PROBLEM: {p}")?;
        }
        if report.is_ok() {
            outln!("ok: every invariant holds")?;
        }
    }
    if report.is_ok() {
        Ok(())
    } else {
        Err(CliError::new(
            3,
            format!("{} invariant violations in {}", report.problems.len(), path.display()),
        ))
    }
}

pub fn compact(path: &Path, keep: Option<u64>, output: Output) -> CliResult {
    let db = open(path)?;
    let before = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let pb = spinner(&format!("compacting {}", path.display()));
    let report = db.writer().compact_blocking(keep)?;
    pb.set_message(format!("compacting the file {}", path.display()));
    let compacted = db.close_and_compact()?;
    pb.finish_and_clear();
    let after = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    if output == Output::Json {
        return outln!(
            "{}",
            json!({
                "removedEntries": report.removed,
                "inlinedObjects": report.inlined,
                "firstRetainedSeq": report.first_retained.0,
                "bytesBefore": before,
                "bytesAfter": after,
                "fileCompacted": compacted,
            })
        );
    }
    outln!(
        "log: removed {} entries ({} objects kept their bytes), first retained seq {}; file: {} -> {} bytes{}",
        report.removed,
        report.inlined,
        report.first_retained.0,
        before,
        after,
        if compacted { "" } else { " (file compaction not needed)" }
    )
}
