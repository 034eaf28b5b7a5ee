//! Commands over a database file: get, list, history, stats, check, compact.

use std::path::Path;

use durable_informer::object::ObjectKey;
use durable_informer::selector::{FieldSelector, LabelSelector};
use durable_informer::store::{
    DeltaKind, DurableStore, ReadOnlyStore, ScopeId, ScopeRecord, Seq, Store, StoreConfig, StoreError, StoredObject,
};
use serde_json::{json, Value};

use super::columns;
use super::output::{self, age, print_data, print_table, Format};
use super::progress::spinner;
use super::resource::{builtin_kind, builtin_lookup, name_prefix, Wanted};
use super::{CliError, CliResult, PrintArgs, QueryArgs};

fn must_exist(path: &Path) -> CliResult {
    if path.exists() {
        return Ok(());
    }
    Err(CliError::new(
        4,
        format!(
            "{}: no such database; create one with `durable-informer watch --db …` or `replay`",
            path.display()
        ),
    ))
}

/// Opens a database for an inspection command: read-only, at one commit, beside the process
/// that writes it (if any); never written, migrated or recovered (see docs/cli.md).
pub fn open(path: &Path) -> CliResult<ReadOnlyStore> {
    must_exist(path)?;
    ReadOnlyStore::open(path).map_err(|e| {
        let locked = matches!(e, StoreError::Locked { .. });
        let mut err = CliError::from(e);
        if locked {
            // A writer in redb's exclusive mode excludes readers too.
            err.message = format!(
                "{}: the process that has this database open does not share it with readers: it was opened without StoreConfig::live_inspection(true) (or by a build older than it, or another program); stop it, or open it with live inspection on",
                path.display()
            );
        }
        err
    })
}

/// Opens a database for a command that writes it (`compact`): it must not be open elsewhere.
pub fn open_writable(path: &Path) -> CliResult<DurableStore> {
    must_exist(path)?;
    Ok(DurableStore::open(StoreConfig::new(path))?)
}

/// Splits `plural[.group]` (kubectl's `plural.version.group` too: the version is dropped).
pub fn split_resource(resource: &str) -> (String, String) {
    let w = Wanted::parse(resource);
    // A short name or kind of a standard resource names its plural and group.
    if let Some((plural, group)) = builtin_lookup(&w) {
        return (plural.to_owned(), group.to_owned());
    }
    (w.name, w.group.unwrap_or_default())
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

/// The `kind` of a scope's objects, from one stored object (cheap: the first key only).
fn stored_kind(db: &ReadOnlyStore, scope: ScopeId) -> Option<String> {
    let first = db.store(scope).snapshot().ok()?.list_after(None, 1).ok()?;
    let v: Value = serde_json::from_slice(&first.first()?.bytes).ok()?;
    v["kind"].as_str().map(str::to_owned)
}

/// The scope of `resource` (any of kubectl's spellings) in the database, preferring the one
/// for `namespace`, then the all-namespaces one.
pub fn find_scope(db: &ReadOnlyStore, resource: &str, namespace: Option<&str>) -> CliResult<(ScopeId, ScopeRecord)> {
    let wanted = Wanted::parse(resource);
    let scopes = db.scopes()?;
    let matching = |kinds: bool| -> Vec<(ScopeId, ScopeRecord)> {
        scopes
            .iter()
            .filter(|(id, r)| {
                let (g, v, res, _, _, _) = parse_spec(&r.spec);
                let kind = if kinds { stored_kind(db, *id) } else { None };
                wanted.matches(&res, &g, &v, kind.as_deref())
            })
            .cloned()
            .collect()
    };
    let mut candidates = matching(false);
    if candidates.is_empty() {
        // A kind no rule knows (a custom resource's): ask the stored objects.
        candidates = matching(true);
    }
    if candidates.is_empty() {
        let mut held: Vec<String> = scopes
            .iter()
            .map(|(_, r)| {
                let (g, _, res, _, _, _) = parse_spec(&r.spec);
                if g.is_empty() {
                    res
                } else {
                    format!("{res}.{g}")
                }
            })
            .collect();
        held.sort();
        held.dedup();
        return Err(CliError::new(
            5,
            format!(
                "{}: no scope for resource {resource:?} in this database (it holds: {})",
                db.path().display(),
                if held.is_empty() {
                    "nothing".into()
                } else {
                    held.join(", ")
                }
            ),
        ));
    }
    if wanted.group.is_none() {
        // `events` is core and events.k8s.io: the core one, as kubectl; other clashes are asked.
        let mut groups: Vec<String> = candidates.iter().map(|(_, r)| parse_spec(&r.spec).0).collect();
        groups.sort();
        groups.dedup();
        if groups.len() > 1 {
            if groups.iter().any(String::is_empty) {
                candidates.retain(|(_, r)| parse_spec(&r.spec).0.is_empty());
            } else {
                return Err(CliError::new(
                    2,
                    format!(
                        "{resource:?} is in several groups ({}): name one, e.g. {}.{}",
                        groups.join(", "),
                        wanted.name,
                        groups[0]
                    ),
                ));
            }
        }
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

fn to_value(o: &StoredObject) -> Value {
    serde_json::from_slice(&o.bytes).unwrap_or(Value::Null)
}

/// The value at a dotted path of an object, as a field selector compares it.
fn field_of(v: &Value, path: &str) -> Option<String> {
    let mut cur = v;
    for part in path.split('.') {
        cur = cur.get(part)?;
    }
    match cur {
        Value::String(s) => Some(s.clone()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// What `get`/`list` were asked for: the resource, the names (none: a list), and whether the
/// older `-r` form was used.
fn targets(resource_flag: Option<&str>, args: &[String], command: &str) -> CliResult<(String, Vec<String>, bool)> {
    if let Some(r) = resource_flag {
        return Ok((r.to_owned(), args.to_vec(), true));
    }
    let Some(first) = args.first() else {
        return Err(CliError::new(
            2,
            format!("name a resource: `durable-informer {command} pods [NAME] --db FILE`"),
        ));
    };
    if first.contains('/') {
        // kubectl's TYPE/NAME form: every argument has it, with one type.
        let mut resource: Option<&str> = None;
        let mut names = Vec::new();
        for a in args {
            let Some((t, n)) = a.split_once('/') else {
                return Err(CliError::new(
                    2,
                    format!("{a:?}: with TYPE/NAME every argument is TYPE/NAME"),
                ));
            };
            if resource.is_some_and(|r| r != t) || t.is_empty() || n.is_empty() {
                return Err(CliError::new(
                    2,
                    format!("{a:?}: one resource type at a time (TYPE/NAME …)"),
                ));
            }
            resource = Some(t);
            names.push(n.to_owned());
        }
        return Ok((resource.unwrap_or_default().to_owned(), names, false));
    }
    Ok((first.clone(), args[1..].to_vec(), false))
}

/// The key of `name` in a scope: `NAMESPACE/NAME` as given, in `-n`, cluster-scoped, or the
/// one namespace holding that name.
fn find_key(store: &Store, name: &str, namespace: Option<&str>) -> CliResult<Option<ObjectKey>> {
    if name.contains('/') {
        let key = name
            .parse::<ObjectKey>()
            .map_err(|e| CliError::new(2, format!("bad name {name:?}: {e}")))?;
        return Ok(Some(key));
    }
    if let Some(ns) = namespace {
        return Ok(Some(ObjectKey::namespaced(ns, name)));
    }
    let cluster = ObjectKey::cluster(name);
    if store.get(&cluster)?.is_some() {
        return Ok(Some(cluster));
    }
    let found: Vec<ObjectKey> = store.list_keys()?.into_iter().filter(|k| k.name == name).collect();
    match found.len() {
        0 => Ok(None),
        1 => Ok(found.into_iter().next()),
        _ => Err(CliError::new(
            2,
            format!(
                "{name:?} is in several namespaces ({}): pass -n",
                found
                    .iter()
                    .filter_map(|k| k.namespace.clone())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )),
    }
}

/// All the formats of `get`/`list`.
const OBJECT_FORMATS: &[&str] = &["table", "wide", "name", "json", "yaml", "jsonpath", "custom-columns"];

/// `get` and `list`: named objects, or a list filtered by namespace, selectors and an index.
pub fn get(
    path: &Path,
    resource_flag: Option<&str>,
    args: &[String],
    query: &QueryArgs,
    index: Option<&str>,
    print: &PrintArgs,
    command: &str,
) -> CliResult {
    let (resource, names, old_form) = targets(resource_flag, args, command)?;
    if command == "list" && !names.is_empty() {
        return Err(CliError::new(
            2,
            format!("list takes no names; `durable-informer get {resource} NAME` prints one"),
        ));
    }
    // The older `get -r R KEY` printed JSON; scripts keep getting it.
    let default = if old_form && !names.is_empty() {
        Format::Json
    } else {
        Format::Table
    };
    let format = Format::parse(print.output.as_deref(), command, OBJECT_FORMATS, default)?;
    let labels: LabelSelector = match &query.selector {
        Some(s) => s
            .parse()
            .map_err(|e| CliError::new(2, format!("bad label selector {s:?}: {e}")))?,
        None => LabelSelector::default(),
    };
    let fields = match &query.field_selector {
        Some(s) => FieldSelector::parse(s).map_err(|e| CliError::new(2, format!("bad field selector {s:?}: {e}")))?,
        None => FieldSelector::everything(),
    };
    let namespace = query.namespace.as_deref();
    let db = open(path)?;
    let (scope, record) = find_scope(&db, &resource, namespace)?;
    let store: Store = db.store(scope);
    let single = names.len() == 1;
    let objects: Vec<StoredObject> = if names.is_empty() {
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
        objects
            .into_iter()
            .filter(|o| namespace.is_none_or(|ns| o.meta.namespace.as_deref() == Some(ns)))
            .filter(|o| labels.matches(&o.meta.labels))
            .filter(|o| fields.is_empty() || fields.matches(|p| field_of(&to_value(o), p)))
            .collect()
    } else {
        let mut found = Vec::new();
        for name in &names {
            let obj = match find_key(&store, name, namespace)? {
                Some(key) => store.get(&key)?,
                None => None,
            };
            let Some(obj) = obj else {
                let plural = parse_spec(&record.spec).2;
                return Err(CliError::runtime(format!(
                    "{plural} {name:?} not found{} in {}",
                    namespace.map(|n| format!(" in namespace {n}")).unwrap_or_default(),
                    path.display()
                )));
            };
            found.push(obj);
        }
        found
    };
    let (group, _, plural, _, _, _) = parse_spec(&record.spec);
    let values: Vec<Value> = objects.iter().map(to_value).collect();
    match &format {
        Format::Json | Format::Yaml | Format::JsonPath(_) => {
            // One object prints as itself, several as kubectl's `List`.
            let doc = if single {
                values.into_iter().next().unwrap_or(Value::Null)
            } else {
                json!({
                    "apiVersion": "v1",
                    "kind": "List",
                    "metadata": {"resourceVersion": record.rv.map(|r| r.0).unwrap_or_default()},
                    "items": values,
                })
            };
            match &format {
                Format::Json => outln!(
                    "{}",
                    serde_json::to_string_pretty(&doc).unwrap_or_else(|_| doc.to_string())
                )?,
                Format::Yaml => outp!("{}", output::yaml(&doc)?)?,
                Format::JsonPath(t) => outp!("{}", output::render_template(t, &doc))?,
                _ => {}
            }
        }
        Format::Name => {
            for (o, v) in objects.iter().zip(&values) {
                let kind = v["kind"]
                    .as_str()
                    .or_else(|| builtin_kind(&plural, &group))
                    .unwrap_or(plural.as_str());
                outln!("{}/{}", name_prefix(kind, &group), o.meta.name)?;
            }
        }
        Format::CustomColumns(columns) => {
            let mut rows = Vec::new();
            if !print.no_headers {
                rows.push(columns.iter().map(|(h, _)| h.clone()).collect());
            }
            for v in &values {
                rows.push(columns.iter().map(|(_, q)| output::column_cell(q, v)).collect());
            }
            print_table(&rows)?;
        }
        Format::Table | Format::Wide => {
            if objects.is_empty() {
                // As kubectl: no header for nothing, and the note on stderr.
                errln!(
                    "No resources found{}.",
                    namespace.map(|n| format!(" in {n} namespace")).unwrap_or_default()
                );
                return Ok(());
            }
            let wide = format == Format::Wide;
            // As kubectl with -A: a NAMESPACE column when more than one namespace can show.
            let show_ns = namespace.is_none() && objects.iter().any(|o| o.meta.namespace.is_some());
            let (before_age, after_age) = columns::headers(&plural, &group);
            let mut rows = Vec::new();
            if !print.no_headers {
                let mut header: Vec<&str> = Vec::new();
                if show_ns {
                    header.push("NAMESPACE");
                }
                header.push("NAME");
                header.extend(before_age);
                header.push("AGE");
                if wide {
                    header.extend(after_age);
                    header.extend(["RESOURCE-VERSION", "OWNER"]);
                }
                if print.show_labels {
                    header.push("LABELS");
                }
                rows.push(header.into_iter().map(String::from).collect());
            }
            for (o, v) in objects.iter().zip(&values) {
                let (before, after) = columns::cells(&plural, &group, v);
                let mut row = Vec::new();
                if show_ns {
                    row.push(o.meta.namespace.clone().unwrap_or_default());
                }
                row.push(o.meta.name.clone());
                row.extend(before);
                row.push(age(v["metadata"]["creationTimestamp"].as_str()));
                if wide {
                    row.extend(after);
                    row.push(o.meta.resource_version.0.clone());
                    row.push(
                        o.meta
                            .owner_references
                            .first()
                            .map_or_else(|| "<none>".into(), |r| format!("{}/{}", r.kind, r.name)),
                    );
                }
                if print.show_labels {
                    let labels: Vec<String> = o.meta.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
                    row.push(if labels.is_empty() {
                        "<none>".into()
                    } else {
                        labels.join(",")
                    });
                }
                rows.push(row);
            }
            print_table(&rows)?;
        }
    }
    Ok(())
}

/// `history RESOURCE NAME` (or the older `-r R KEY`): the retained log entries of one object.
pub fn history(
    path: &Path,
    resource_flag: Option<&str>,
    args: &[String],
    namespace: Option<&str>,
    output: &Format,
) -> CliResult {
    let (resource, names, _) = targets(resource_flag, args, "history")?;
    let [name] = names.as_slice() else {
        return Err(CliError::new(
            2,
            format!("history takes one name: `durable-informer history {resource} NAME [-n NS] --db FILE`"),
        ));
    };
    // The object may be gone from the store (deleted): the log is searched by name, in the
    // namespace when one is known.
    let (namespace, name) = match name.split_once('/') {
        Some((ns, n)) => (Some(ns.to_owned()), n.to_owned()),
        None => (namespace.map(str::to_owned), name.clone()),
    };
    let db = open(path)?;
    let (scope, _) = find_scope(&db, &resource, namespace.as_deref())?;
    let log = db.log();
    let mut cursor = Seq(0);
    let mut entries = Vec::new();
    loop {
        let (batch, scanned) = log.read_scope_after(cursor, 4096, scope)?;
        if batch.is_empty() && scanned == cursor {
            break;
        }
        cursor = scanned;
        entries.extend(batch.into_iter().filter(|r| {
            r.key.name == name && namespace.as_ref().is_none_or(|ns| r.key.namespace.as_ref() == Some(ns))
        }));
    }
    let mut namespaces: Vec<String> = entries.iter().filter_map(|e| e.key.namespace.clone()).collect();
    namespaces.sort();
    namespaces.dedup();
    if namespaces.len() > 1 {
        return Err(CliError::new(
            2,
            format!("{name:?} is in several namespaces ({}): pass -n", namespaces.join(", ")),
        ));
    }
    let first = log.bounds()?.map(|(f, _)| f.0).unwrap_or(0);
    match output {
        Format::Json | Format::Yaml => {
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
                let event = json!({"seq": e.seq.0, "type": kind, "resourceVersion": e.rv.0, "object": object});
                if *output == Format::Yaml {
                    // One YAML document an event, as a stream.
                    outp!("---\n{}", output::yaml(&event)?)?;
                } else {
                    outln!("{event}")?;
                }
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

pub fn stats(path: &Path, output: &Format) -> CliResult {
    let db = open(path)?;
    let size = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let bounds = db.log().bounds()?;
    let scopes = db.scopes()?;
    let identity = db.cluster_identity()?;
    if *output != Format::Table {
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
        return print_data(output, &v, true);
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
pub fn time_ms(ms: u64) -> String {
    i64::try_from(ms / 1000)
        .ok()
        .and_then(|s| k8s_openapi::jiff::Timestamp::from_second(s).ok())
        .map_or_else(|| format!("{ms}ms"), |t| t.to_string())
}

pub fn check(path: &Path, output: &Format) -> CliResult {
    let db = open(path)?;
    let report = db.check()?;
    if *output != Format::Table {
        let v = json!({
            "ok": report.is_ok(),
            "scopes": report.scopes,
            "objects": report.objects,
            "logEntries": report.log_entries,
            "indexRows": report.index_rows,
            "problems": report.problems,
        });
        print_data(output, &v, true)?;
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

pub fn compact(path: &Path, keep: Option<u64>, output: &Format) -> CliResult {
    let db = open_writable(path)?;
    let before = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let pb = spinner(&format!("compacting {}", path.display()));
    let report = db.writer().compact_blocking(keep)?;
    pb.set_message(format!("compacting the file {}", path.display()));
    let compacted = db.close_and_compact()?;
    pb.finish_and_clear();
    let after = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    if *output != Format::Table {
        let v = json!({
            "removedEntries": report.removed,
            "inlinedObjects": report.inlined,
            "firstRetainedSeq": report.first_retained.0,
            "bytesBefore": before,
            "bytesAfter": after,
            "fileCompacted": compacted,
        });
        return print_data(output, &v, false);
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
