//! Scopes have a lifecycle: listed with their size, last use and selector; dropped on request
//! (never one a process uses); dropped when unused for a configured period; and a selector
//! change says which old scope it leaves behind.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

#[path = "common/cli_bin.rs"]
mod cli_bin;

use cli_bin::run;
use durable_informer::informer::{Informer, InformerIssue};
use durable_informer::object::{RawObject, ScopeSpec};
use durable_informer::source::KubeSource;
use durable_informer::store::{Batch, DeltaKind, DurableStore, ScopeId, StoreConfig, StoreError};
use k8s_openapi::api::core::v1::Pod;
use serde_json::Value;

fn scopes_json(db: &Path) -> Vec<Value> {
    let (code, stdout, stderr) = run(&["scopes", "-o", "json"], db);
    assert_eq!(code, 0, "{stderr}");
    let v: Value = serde_json::from_str(&stdout).unwrap();
    v["scopes"].as_array().unwrap().clone()
}

fn pod(name: &str, rv: u64, app: &str) -> RawObject {
    RawObject::from_json(
        format!(
            r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"{name}","namespace":"prod","resourceVersion":"{rv}","labels":{{"app":"{app}"}}}},"spec":{{"containers":[]}}}}"#
        )
        .into_bytes(),
    )
    .unwrap()
}

fn pods(app: &str) -> ScopeSpec {
    ScopeSpec::new("", "v1", "pods")
        .namespace("prod")
        .labels(&format!("app={app}"))
}

/// A store clock the test moves: `base` plus what `offset` holds, in milliseconds.
fn clock(base: SystemTime, offset: &Arc<AtomicU64>) -> durable_informer::store::Clock {
    let offset = offset.clone();
    Arc::new(move || base + Duration::from_millis(offset.load(Ordering::Relaxed)))
}

fn ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

/// Fills a database with two scopes of Pods (app=old: 3 objects, app=new: 1) and closes it.
fn two_scopes(path: &Path, config: impl Fn(StoreConfig) -> StoreConfig) -> (ScopeId, ScopeId) {
    let db = DurableStore::open(config(StoreConfig::new(path))).unwrap();
    let w = db.writer();
    let old = w.register_scope_blocking(&pods("old")).unwrap();
    let new = w.register_scope_blocking(&pods("new")).unwrap();
    w.apply_blocking(
        Batch::new(old)
            .delta(DeltaKind::Added, pod("a", 1, "old"))
            .delta(DeltaKind::Added, pod("b", 2, "old"))
            .delta(DeltaKind::Added, pod("c", 3, "old"))
            .rv("3"),
    )
    .unwrap();
    w.apply_blocking(Batch::new(new).delta(DeltaKind::Added, pod("d", 4, "new")).rv("4"))
        .unwrap();
    db.close().unwrap();
    (old, new)
}

#[test]
fn scopes_are_listed_with_objects_size_last_use_and_selector() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db.redb");
    let base = SystemTime::now() - Duration::from_secs(3 * 3600);
    let offset = Arc::new(AtomicU64::new(0));
    let (old, new) = two_scopes(&path, |c| c.clock(clock(base, &offset)));
    let scopes = scopes_json(&path);
    assert_eq!(scopes.len(), 2, "{scopes:?}");
    let by_id = |id: ScopeId| scopes.iter().find(|s| s["id"] == id.0).unwrap().clone();
    let (o, n) = (by_id(old), by_id(new));
    assert_eq!(o["objects"], 3);
    assert_eq!(n["objects"], 1);
    assert_eq!(o["labelSelector"], "app=old");
    assert_eq!(o["namespace"], "prod");
    assert_eq!(o["resource"], "pods");
    assert_eq!(o["logEntries"], 3);
    assert_eq!(n["logEntries"], 1);
    assert!(o["objectBytes"].as_u64().unwrap() > 0);
    assert!(
        o["logBytes"].as_u64().unwrap() > n["logBytes"].as_u64().unwrap(),
        "three entries weigh more than one: {o} {n}"
    );
    // Last use: when the writer closed, by its clock.
    assert_eq!(o["lastUsedAtMs"].as_u64(), Some(ms(base)));
    let (code, table, stderr) = run(&["scopes"], &path);
    assert_eq!(code, 0, "{stderr}");
    let lines: Vec<&str> = table.lines().collect();
    assert!(
        lines[0].starts_with("SCOPE") && lines[0].contains("LAST-USED"),
        "{table}"
    );
    let old_row = lines.iter().find(|l| l.contains("app=old")).unwrap();
    assert!(old_row.contains("pods (v1)") && old_row.contains("prod"), "{old_row}");
    assert!(old_row.contains("3h ago") || old_row.contains("3h1m ago"), "{old_row}");
}

#[test]
fn a_scope_is_dropped_on_request_and_its_id_never_comes_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db.redb");
    let (old, new) = two_scopes(&path, |c| c);
    // The highest id is dropped: a new scope must not get it, or its log entries (kept until
    // retention) would read as the new scope's.
    let (code, stdout, stderr) = run(&["scopes", "drop", &new.0.to_string()], &path);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains(&format!("dropped scope {}", new.0)), "{stdout}");
    assert!(
        stdout.contains("1 objects") && stdout.contains("1 log entries stay"),
        "{stdout}"
    );
    let scopes = scopes_json(&path);
    assert_eq!(scopes.len(), 1);
    assert_eq!(scopes[0]["id"], old.0);
    let (code, report, stderr) = run(&["check"], &path);
    assert_eq!(code, 0, "{report} {stderr}");
    // An unknown id is a usage error naming the ones there are.
    let (code, _, stderr) = run(&["scopes", "drop", "99"], &path);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains(&format!("it holds: {}", old.0)), "{stderr}");

    let db = DurableStore::open(StoreConfig::new(&path)).unwrap();
    let again = db.writer().register_scope_blocking(&pods("new")).unwrap();
    assert!(again.0 > new.0, "the dropped id {new} came back as {again}");
    assert!(db.store(again).list().unwrap().is_empty());
    // The history of the new scope does not show the dropped one's entries.
    let log = db
        .log()
        .read_after(durable_informer::store::Seq(0), 100, Some(again))
        .unwrap();
    assert!(log.is_empty(), "{log:?}");
    db.close().unwrap();
}

#[test]
fn a_scope_in_use_is_never_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db.redb");
    let (old, _) = two_scopes(&path, |c| c);
    let db = DurableStore::open(StoreConfig::new(&path).live_inspection(true)).unwrap();
    // Beside a live writer (one that shares the file with readers), the listing works and dropping is refused (the file is in use).
    assert_eq!(scopes_json(&path).len(), 2);
    let (code, _, stderr) = run(&["scopes", "drop", &old.0.to_string()], &path);
    assert_eq!(code, 4, "{stderr}");
    assert!(stderr.contains("locked"), "{stderr}");
    // In the process itself: a scope an informer registered is refused.
    let id = db.writer().register_scope_blocking(&pods("old")).unwrap();
    assert_eq!(id, old);
    let err = db.writer().drop_scope_blocking(old).unwrap_err();
    assert!(matches!(err, StoreError::ScopeInUse(s) if s == old), "{err}");
    assert_eq!(db.scopes().unwrap().len(), 2);
    db.close().unwrap();
}

#[test]
fn scopes_unused_for_the_period_are_dropped_and_those_in_use_are_kept() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db.redb");
    let base = SystemTime::now();
    let offset = Arc::new(AtomicU64::new(0));
    let (old, new) = two_scopes(&path, |c| c.clock(clock(base, &offset)));
    // The writer looks every period / 10 (real time; at least every second): a short period
    // keeps the test short, the store's clock jumps by hours.
    let period = Duration::from_secs(10);
    let db = DurableStore::open(
        StoreConfig::new(&path)
            .clock(clock(base, &offset))
            .drop_unused_scopes_after(Some(period)),
    )
    .unwrap();
    // Right after open both were used (at the last close) within the period: both stay.
    db.writer().register_scope_blocking(&pods("new")).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(db.scopes().unwrap().len(), 2);
    // Two hours later by the store's clock: the old scope has been unused for longer than the
    // period; the new one is registered by this process, so it is in use.
    offset.store(2 * 3600 * 1000, Ordering::Relaxed);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while db.scopes().unwrap().len() == 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "the unused scope was never dropped"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let left: Vec<ScopeId> = db.scopes().unwrap().into_iter().map(|(id, _)| id).collect();
    assert_eq!(left, [new], "{old} should be gone, {new} kept");
    let metrics = durable_informer::metrics::encode();
    assert!(
        metrics.contains(r#"durable_informer_scopes_dropped_total{database="db.redb"} 1"#),
        "{metrics}"
    );
    db.close().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_selector_change_reports_the_scope_it_leaves_behind() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db.redb");
    let sim = tokio::task::spawn_blocking(|| durable_informer::sim::Sim::start(Default::default()).unwrap())
        .await
        .unwrap();
    let client = sim.client().unwrap();
    let open = |path: std::path::PathBuf| async move {
        tokio::task::spawn_blocking(move || DurableStore::open(StoreConfig::new(path)).unwrap())
            .await
            .unwrap()
    };
    let db = open(path.clone()).await;
    let first: Informer<Pod> = Informer::builder(
        &db,
        KubeSource::typed::<Pod>(client.clone(), &sim.url())
            .namespace("prod")
            .labels("app=old"),
    )
    .build()
    .await
    .unwrap();
    assert!(first.issues().is_empty(), "{:?}", first.errors());
    // Two informers of one resource in one process: neither leaves the other behind.
    let second: Informer<Pod> = Informer::builder(
        &db,
        KubeSource::typed::<Pod>(client.clone(), &sim.url())
            .namespace("prod")
            .labels("app=other"),
    )
    .build()
    .await
    .unwrap();
    assert!(second.issues().is_empty(), "{:?}", second.errors());
    let old = first.scope();
    drop((first, second));
    tokio::task::spawn_blocking(move || db.close().unwrap()).await.unwrap();

    // The next run changed the selector: the new informer names both scopes it leaves behind.
    let db = open(path.clone()).await;
    let changed: Informer<Pod> = Informer::builder(
        &db,
        KubeSource::typed::<Pod>(client.clone(), &sim.url())
            .namespace("prod")
            .labels("app=new"),
    )
    .build()
    .await
    .unwrap();
    let left: Vec<ScopeId> = changed
        .issues()
        .iter()
        .filter_map(|i| match i {
            InformerIssue::ScopeLeftBehind { old, .. } => Some(*old),
            _ => None,
        })
        .collect();
    assert_eq!(left.len(), 2, "{:?}", changed.errors());
    assert!(left.contains(&old));
    let text = changed.errors().join("\n");
    assert!(text.contains("app=old") && text.contains("scopes drop"), "{text}");
    // Built again (the scope exists now), it reports nothing new.
    let again: Informer<Pod> = Informer::builder(
        &db,
        KubeSource::typed::<Pod>(client, &sim.url())
            .namespace("prod")
            .labels("app=new"),
    )
    .build()
    .await
    .unwrap();
    assert!(again.issues().is_empty(), "{:?}", again.errors());
    drop((changed, again));
    tokio::task::spawn_blocking(move || db.close().unwrap()).await.unwrap();
}
