//! The reflector's protocol handling against a scripted in-memory server: which requests it
//! makes (the exact RVs), and what reaches the store and its log.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::fake::{status, Fake, Fault};
use durable_informer::reflector::{BackoffConfig, Reflector, ReflectorConfig, ReflectorError, ReflectorStatus};
use durable_informer::store::{DeltaKind, DurableStore, ScopeId, ScopeSpec, Seq, StoreConfig};
use tokio::sync::watch;

struct Running {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<Result<(), ReflectorError>>,
    status: watch::Receiver<ReflectorStatus>,
    errors: Arc<Mutex<Vec<String>>>,
}

fn config() -> ReflectorConfig {
    ReflectorConfig {
        page_size: 2,
        backoff: BackoffConfig {
            initial: Duration::from_millis(5),
            max: Duration::from_millis(50),
            ..BackoffConfig::default()
        },
        ..ReflectorConfig::default()
    }
}

fn open(dir: &tempfile::TempDir) -> (DurableStore, ScopeId) {
    let db = DurableStore::open(StoreConfig::new(dir.path().join("db.redb"))).unwrap();
    let scope = db
        .writer()
        .register_scope_blocking(&ScopeSpec::new("", "v1", "configmaps"))
        .unwrap();
    (db, scope)
}

fn start(fake: &Fake, db: &DurableStore, scope: ScopeId, config: ReflectorConfig) -> Running {
    let errors = Arc::new(Mutex::new(Vec::new()));
    let e2 = errors.clone();
    let r = Reflector::new(fake.clone(), db.writer(), db.store(scope), config)
        .on_error(Arc::new(move |e| e2.lock().unwrap().push(e.to_string())));
    let status = r.status();
    let (stop, rx) = watch::channel(false);
    let task = tokio::spawn(r.run(rx));
    Running {
        stop,
        task,
        status,
        errors,
    }
}

impl Running {
    async fn synced(&mut self) {
        tokio::time::timeout(Duration::from_secs(10), self.status.wait_for(|s| s.synced))
            .await
            .expect("not synced within 10 s")
            .unwrap();
    }

    async fn stop(self) -> Vec<String> {
        self.stop.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        self.errors.lock().unwrap().clone()
    }
}

fn stored(db: &DurableStore, scope: ScopeId) -> BTreeMap<String, u64> {
    db.store(scope)
        .list()
        .unwrap()
        .into_iter()
        .map(|o| (o.key.to_string(), o.meta.resource_version.as_u64().unwrap()))
        .collect()
}

async fn converge(db: &DurableStore, scope: ScopeId, fake: &Fake) {
    for _ in 0..500 {
        if stored(db, scope) == fake.objects()
            && db.store(scope).resource_version().unwrap().and_then(|r| r.as_u64()) == Some(fake.current_rv())
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(stored(db, scope), fake.objects(), "store never converged");
    panic!("store RV never reached {}", fake.current_rv());
}

fn log_after(db: &DurableStore, scope: ScopeId, after: Seq) -> Vec<(DeltaKind, String, bool)> {
    db.log()
        .read_after(after, usize::MAX, Some(scope))
        .unwrap()
        .into_iter()
        .map(|r| (r.kind, r.key.to_string(), r.final_state_unknown))
        .collect()
}

fn last_seq(db: &DurableStore) -> Seq {
    db.log().bounds().unwrap().map_or(Seq(0), |b| b.1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn initial_list_is_paginated_then_watched_and_managed_fields_are_dropped() {
    let fake = Fake::new();
    for i in 0..5 {
        fake.upsert(&format!("c{i}"), "v");
    }
    let dir = tempfile::tempdir().unwrap();
    let (db, scope) = open(&dir);
    let mut r = start(&fake, &db, scope, config());
    r.synced().await;
    fake.upsert("c9", "new");
    fake.delete("c0");
    converge(&db, scope, &fake).await;
    assert_eq!(
        fake.requests()[..5],
        [
            "watch rv= initial-events", // refused with 422 by this server
            "list rv= limit=2 continue=",
            "list rv= limit=2 continue=105:c1",
            "list rv= limit=2 continue=105:c3",
            "watch rv=105"
        ]
    );
    let obj = db.store(scope).get(&"ns/c1".parse().unwrap()).unwrap().unwrap();
    assert!(!String::from_utf8_lossy(&obj.bytes).contains("managedFields"));
    assert!(!r.status.borrow().restored);
    r.stop().await;
    assert!(db.check().unwrap().is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_list_is_used_where_the_server_supports_it() {
    let fake = Fake::new();
    fake.set_streaming(true);
    for i in 0..5 {
        fake.upsert(&format!("c{i}"), "v");
    }
    let dir = tempfile::tempdir().unwrap();
    let (db, scope) = open(&dir);
    let mut r = start(&fake, &db, scope, config());
    r.synced().await;
    converge(&db, scope, &fake).await;
    for _ in 0..200 {
        if fake.requests().len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(fake.requests()[..2], ["watch rv= initial-events", "watch rv=105"]);
    assert_eq!(fake.full_lists(), 0);
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_resumes_from_the_persisted_rv_without_a_list_and_delivers_exactly_the_missed_changes() {
    let fake = Fake::new();
    for i in 0..6 {
        fake.upsert(&format!("c{i}"), "v");
    }
    let dir = tempfile::tempdir().unwrap();
    let (db, scope) = open(&dir);
    let mut r = start(&fake, &db, scope, config());
    r.synced().await;
    converge(&db, scope, &fake).await;
    r.stop().await;
    let before_restart = last_seq(&db);
    let requests_before = fake.requests().len();

    // While we are down.
    fake.upsert("c1", "changed");
    fake.delete("c2");
    fake.upsert("c7", "new");
    let persisted = db.store(scope).resource_version().unwrap().unwrap();

    let mut r = start(&fake, &db, scope, config());
    assert!(
        db.store(scope).get(&"ns/c2".parse().unwrap()).unwrap().is_some(),
        "readable at once from disk"
    );
    r.synced().await;
    converge(&db, scope, &fake).await;
    assert!(r.status.borrow().restored);
    let after: Vec<String> = fake.requests()[requests_before..].to_vec();
    assert_eq!(
        after[..2],
        [
            "list rv= limit=1 continue=".to_string(),
            format!("watch rv={persisted}")
        ]
    );
    assert_eq!(fake.full_lists(), 1, "only the first start listed");
    assert_eq!(
        log_after(&db, scope, before_restart),
        vec![
            (DeltaKind::Updated, "ns/c1".into(), false),
            (DeltaKind::Deleted, "ns/c2".into(), false),
            (DeltaKind::Added, "ns/c7".into(), false)
        ]
    );
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_while_down_gives_one_relist_that_reports_only_differences() {
    let fake = Fake::new();
    for i in 0..8 {
        fake.upsert(&format!("c{i}"), "v");
    }
    let dir = tempfile::tempdir().unwrap();
    let (db, scope) = open(&dir);
    let mut r = start(&fake, &db, scope, config());
    r.synced().await;
    converge(&db, scope, &fake).await;
    r.stop().await;
    let mark = last_seq(&db);

    fake.delete("c3");
    fake.upsert("c4", "changed");
    fake.upsert("c8", "new");
    fake.compact();

    let mut r = start(&fake, &db, scope, config());
    r.synced().await;
    converge(&db, scope, &fake).await;
    assert_eq!(fake.full_lists(), 2, "exactly one relist");
    assert_eq!(
        log_after(&db, scope, mark),
        vec![
            (DeltaKind::Updated, "ns/c4".into(), false),
            (DeltaKind::Added, "ns/c8".into(), false),
            (DeltaKind::Deleted, "ns/c3".into(), true)
        ]
    );
    let st = r.status.borrow().clone();
    assert_eq!(st.relists, 1);
    assert!(st.last_list_reason.unwrap().contains("410"));
    r.stop().await;
    assert!(db.check().unwrap().is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_410_while_watching_relists_and_an_ended_watch_rewatches_without_listing() {
    let fake = Fake::new();
    fake.upsert("a", "1");
    let dir = tempfile::tempdir().unwrap();
    let (db, scope) = open(&dir);
    let mut r = start(&fake, &db, scope, config());
    r.synced().await;
    converge(&db, scope, &fake).await;
    // An ended watch: re-watch from the persisted RV, no list.
    fake.drop_watches();
    fake.upsert("b", "1");
    converge(&db, scope, &fake).await;
    assert_eq!(fake.full_lists(), 1);
    // A 410 in the stream: relist.
    fake.fault(Fault::WatchError {
        after: 0,
        status: status(410, "Expired", "too old resource version: 1 (2)"),
    });
    fake.drop_watches();
    fake.upsert("c", "1");
    converge(&db, scope, &fake).await;
    for _ in 0..200 {
        if fake.full_lists() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(fake.full_lists(), 2);
    let errors = r.stop().await;
    assert!(
        errors.iter().all(|e| !e.contains("410")),
        "a 410 is routine, not an error: {errors:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_rv_regression_at_restart_relists_instead_of_waiting_forever() {
    let fake = Fake::new();
    for i in 0..4 {
        fake.upsert(&format!("c{i}"), "v");
    }
    let dir = tempfile::tempdir().unwrap();
    let (db, scope) = open(&dir);
    let mut r = start(&fake, &db, scope, config());
    r.synced().await;
    fake.upsert("c9", "late");
    converge(&db, scope, &fake).await;
    r.stop().await;
    // etcd restored from a backup taken before c9 existed.
    fake.restore_backup_to(102);
    let mut r = start(&fake, &db, scope, config());
    r.synced().await;
    converge(&db, scope, &fake).await;
    assert_eq!(fake.full_lists(), 2);
    assert!(r
        .status
        .borrow()
        .last_list_reason
        .clone()
        .unwrap()
        .contains("ahead of the server"));
    assert!(db.store(scope).get(&"ns/c9".parse().unwrap()).unwrap().is_none());
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_504_too_large_rv_relists_once_and_does_not_loop() {
    let fake = Fake::new();
    fake.upsert("a", "1");
    let dir = tempfile::tempdir().unwrap();
    let (db, scope) = open(&dir);
    let mut r = start(&fake, &db, scope, config());
    r.synced().await;
    converge(&db, scope, &fake).await;
    let mut too_large = status(504, "Timeout", "Too large resource version: 999, current: 101");
    too_large.causes = vec!["ResourceVersionTooLarge".into()];
    fake.fault(Fault::Watch(too_large));
    fake.drop_watches();
    fake.upsert("b", "1");
    converge(&db, scope, &fake).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(fake.full_lists(), 2, "one relist, then watching again");
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_continue_token_restarts_the_list() {
    let fake = Fake::new();
    for i in 0..5 {
        fake.upsert(&format!("c{i}"), "v");
    }
    let dir = tempfile::tempdir().unwrap();
    let (db, scope) = open(&dir);
    // Compaction between page 1 and page 2: the second page gets 410.
    fake.fault(Fault::List(status(
        410,
        "Expired",
        "The provided continue parameter is too old",
    )));
    let mut r = start(&fake, &db, scope, config());
    r.synced().await;
    converge(&db, scope, &fake).await;
    let lists: Vec<String> = fake.requests().into_iter().filter(|r| r.starts_with("list")).collect();
    assert_eq!(lists[0], "list rv= limit=2 continue=");
    assert!(lists.len() >= 4, "{lists:?}");
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_back_off_and_resume_from_the_last_committed_rv_losing_nothing() {
    let fake = Fake::new();
    fake.upsert("a", "1");
    let dir = tempfile::tempdir().unwrap();
    let (db, scope) = open(&dir);
    let mut r = start(&fake, &db, scope, config());
    r.synced().await;
    converge(&db, scope, &fake).await;
    let mut throttled = status(429, "TooManyRequests", "slow down");
    throttled.retry_after = Some(Duration::from_millis(30));
    fake.fault(Fault::Watch(throttled));
    fake.fault(Fault::Watch(status(500, "InternalError", "boom")));
    fake.fault(Fault::WatchMalformed { after: 1 });
    fake.drop_watches();
    for i in 0..5 {
        fake.upsert(&format!("m{i}"), "x");
    }
    converge(&db, scope, &fake).await;
    assert_eq!(fake.full_lists(), 1, "no relist for transient errors");
    let errors = r.stop().await;
    assert!(errors.iter().any(|e| e.contains("429")), "{errors:?}");
    assert!(errors.iter().any(|e| e.contains("500")), "{errors:?}");
    assert!(
        errors.iter().any(|e| e.contains("malformed") && e.contains("line 2")),
        "{errors:?}"
    );
    assert!(errors.iter().all(|e| !e.contains("Bearer")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_clusters_database_is_refused_with_both_identities() {
    let fake = Fake::new();
    fake.upsert("a", "1");
    let dir = tempfile::tempdir().unwrap();
    let (db, scope) = open(&dir);
    let mut r = start(&fake, &db, scope, config());
    r.synced().await;
    r.stop().await;
    fake.set_identity("other-uid@elsewhere");
    let r = start(&fake, &db, scope, config());
    let err = tokio::time::timeout(Duration::from_secs(10), r.task)
        .await
        .unwrap()
        .unwrap()
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("fake-uid@fake") && msg.contains("other-uid@elsewhere"),
        "{msg}"
    );
    // With reset, it rebuilds from this cluster.
    let cfg = ReflectorConfig {
        reset_on_cluster_change: true,
        ..config()
    };
    let mut r = start(&fake, &db, scope, cfg);
    r.synced().await;
    converge(&db, scope, &fake).await;
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_scope_reports_synced_at_the_first_bookmark_after_resume() {
    let fake = Fake::new();
    fake.upsert("a", "1");
    let dir = tempfile::tempdir().unwrap();
    let (db, scope) = open(&dir);
    let mut r = start(&fake, &db, scope, config());
    r.synced().await;
    r.stop().await;
    // The cluster RV moves without touching this scope (another resource changed).
    fake.bump_rv();
    let cfg = ReflectorConfig {
        resume_quiet_period: None,
        ..config()
    };
    let r2 = start(&fake, &db, scope, cfg);
    let mut st = r2.status.clone();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!st.borrow().synced, "not synced before the bookmark");
    tokio::time::sleep(Duration::from_millis(100)).await;
    fake.bookmark();
    tokio::time::timeout(Duration::from_secs(10), st.wait_for(|s| s.synced))
        .await
        .unwrap()
        .unwrap();
    r2.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_resumed_watch_reports_synced_after_the_quiet_period() {
    let fake = Fake::new();
    fake.upsert("a", "1");
    let dir = tempfile::tempdir().unwrap();
    let (db, scope) = open(&dir);
    let mut r = start(&fake, &db, scope, config());
    r.synced().await;
    r.stop().await;
    fake.upsert("zz", "1");
    fake.compact();
    fake.restore_backup_to(fake.current_rv());
    let cfg = ReflectorConfig {
        resume_quiet_period: Some(Duration::from_millis(200)),
        ..config()
    };
    let mut r = start(&fake, &db, scope, cfg);
    r.synced().await;
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_staged_by_a_relist_killed_midway_do_not_survive_the_next_relist() {
    let fake = Fake::new();
    for i in 0..4 {
        fake.upsert(&format!("c{i}"), "v");
    }
    let dir = tempfile::tempdir().unwrap();
    let (db, scope) = open(&dir);
    let mut r = start(&fake, &db, scope, config());
    r.synced().await;
    converge(&db, scope, &fake).await;
    r.stop().await;

    // What a process killed after staging a page leaves: a staged object the server has since
    // deleted (found in the crash harness).
    let ghost = durable_informer::store::RawObject::from_json(
        r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"ghost","namespace":"ns","resourceVersion":"2"}}"#,
    )
    .unwrap();
    db.writer().stage_relist(scope, vec![ghost]).await.unwrap();
    fake.upsert("c4", "new");
    fake.compact();

    // Paged: a failed streaming attempt would clear the staging table anyway.
    let paged = ReflectorConfig {
        streaming_list: false,
        ..config()
    };
    let mut r = start(&fake, &db, scope, paged);
    r.synced().await;
    converge(&db, scope, &fake).await;
    assert!(!stored(&db, scope).contains_key("ns/ghost"));
    r.stop().await;
    assert!(db.check().unwrap().is_ok());
}
