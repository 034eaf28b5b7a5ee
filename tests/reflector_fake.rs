//! The reflector's protocol handling against a scripted in-memory server: which requests it
//! makes (the exact RVs), and what reaches the store and its log.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::fake::{status, Fake, Fault};
use common::reflector::{open, stored, Running};
use durable_informer::object::ScopeSpec;
use durable_informer::reflector::{
    BackoffConfig, ListReason, OversizePolicy, Phase, ReflectorConfig, Transform, TransformFn,
};
use durable_informer::store::{DeltaKind, DurableStore, ScopeId, Seq};

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

fn start(fake: &Fake, db: &DurableStore, scope: ScopeId, config: ReflectorConfig) -> Running {
    common::reflector::start(fake.clone(), db, scope, config)
}

/// Opens a fresh store, starts a reflector on it and waits until it reports synced.
async fn running(fake: &Fake, dir: &tempfile::TempDir, config: ReflectorConfig) -> (DurableStore, ScopeId, Running) {
    let (db, scope) = open(dir);
    let mut r = start(fake, &db, scope, config);
    r.synced().await;
    (db, scope, r)
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
    let (db, scope, r) = running(&fake, &dir, config()).await;
    // The sync point is the commit that completed the list: the five listed objects.
    assert_eq!(r.status.borrow().synced_seq, Some(Seq(5)));
    assert_eq!(last_seq(&db), Seq(5));
    fake.upsert("c9", "new");
    fake.delete("c0");
    converge(&db, scope, &fake).await;
    assert_eq!(
        fake.requests_without_timeouts()[..5],
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
    let (db, scope, r) = running(&fake, &dir, config()).await;
    converge(&db, scope, &fake).await;
    for _ in 0..200 {
        if fake.requests().len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        fake.requests_without_timeouts()[..2],
        ["watch rv= initial-events", "watch rv=105"]
    );
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
    let (db, scope, r) = running(&fake, &dir, config()).await;
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
    // Synced once the three missed changes were committed, at the last of them.
    assert_eq!(r.status.borrow().synced_seq, Some(Seq(before_restart.0 + 3)));
    let after: Vec<String> = fake.requests_without_timeouts()[requests_before..].to_vec();
    // The cache's revision first (a consistent LIST would move it on a v1.34+ server), then
    // the cluster's RV, then the watch.
    assert_eq!(
        after[..3],
        [
            "list rv=0 revision-only".to_string(),
            "list rv= limit=1 continue=".to_string(),
            format!("watch rv={persisted}")
        ]
    );
    // Not caught up when it opened: the resumed watch is short, so a watch cache sends its
    // bookmark within about a second (it sends one 2 s before a watch's timeout).
    assert!(
        fake.requests()[requests_before + 2].ends_with(" timeout=3"),
        "{:?}",
        fake.requests()
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
    let (db, scope, r) = running(&fake, &dir, config()).await;
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
    assert!(matches!(st.last_list_reason, Some(ListReason::Gone(_))));
    r.stop().await;
    assert!(db.check().unwrap().is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_410_while_watching_relists_and_an_ended_watch_rewatches_without_listing() {
    let fake = Fake::new();
    fake.upsert("a", "1");
    let dir = tempfile::tempdir().unwrap();
    let (db, scope, r) = running(&fake, &dir, config()).await;
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
    let (db, scope, r) = running(&fake, &dir, config()).await;
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
        .is_some_and(|r| matches!(r, ListReason::AheadOfServer { .. })));
    assert!(db.store(scope).get(&"ns/c9".parse().unwrap()).unwrap().is_none());
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_504_too_large_rv_relists_once_and_does_not_loop() {
    let fake = Fake::new();
    fake.upsert("a", "1");
    let dir = tempfile::tempdir().unwrap();
    let (db, scope, r) = running(&fake, &dir, config()).await;
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
async fn an_expired_continue_token_restarts_the_list_and_diffs_against_what_the_first_attempt_wrote() {
    let fake = Fake::new();
    for i in 0..5 {
        fake.upsert(&format!("c{i}"), "v");
    }
    let dir = tempfile::tempdir().unwrap();
    let (db, scope) = open(&dir);
    // Between page 1 (c0, c1, written directly into the empty scope) and page 2, c0 is deleted
    // and the history compacted: page 2's token expires and the list restarts.
    fake.fault(Fault::ListContinueExpired { delete: "c0".into() });
    let mut r = start(&fake, &db, scope, config());
    r.synced().await;
    converge(&db, scope, &fake).await;
    let lists: Vec<String> = fake.requests().into_iter().filter(|r| r.starts_with("list")).collect();
    assert_eq!(
        lists,
        [
            "list rv= limit=2 continue=",
            "list rv= limit=2 continue=105:c1",
            "list rv= limit=2 continue=",
            "list rv= limit=2 continue=106:c2",
        ]
    );
    assert_eq!(r.status.borrow().lists, 1, "a restart within one list");
    assert!(db.store(scope).get(&"ns/c0".parse().unwrap()).unwrap().is_none());
    // The retry was diffed: c0 arrives as a delete of the directly written object.
    assert_eq!(
        log_after(&db, scope, Seq(0))
            .into_iter()
            .filter(|(_, k, _)| k == "ns/c0")
            .collect::<Vec<_>>(),
        [
            (DeltaKind::Added, "ns/c0".into(), false),
            (DeltaKind::Deleted, "ns/c0".into(), true)
        ]
    );
    r.stop().await;
    assert!(db.check().unwrap().is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streaming_list_failing_after_direct_pages_is_reported_diffed_and_streaming_is_kept() {
    let fake = Fake::new();
    fake.set_streaming(true);
    for i in 0..5 {
        fake.upsert(&format!("c{i}"), "v");
    }
    let dir = tempfile::tempdir().unwrap();
    let (db, scope) = open(&dir);
    // A transient 500 after one page (c0, c1) went directly into the store; c0 is deleted before
    // the paginated fallback lists.
    fake.fault(Fault::WatchErrorAfterDelete {
        after: 3,
        status: status(500, "InternalError", "etcd leader changed"),
        delete: "c0".into(),
    });
    let mut r = start(&fake, &db, scope, config());
    r.synced().await;
    converge(&db, scope, &fake).await;
    assert_eq!(
        fake.requests_without_timeouts()[..2],
        ["watch rv= initial-events", "list rv= limit=2 continue="]
    );
    assert!(db.store(scope).get(&"ns/c0".parse().unwrap()).unwrap().is_none());
    // A 410 later: the relist streams again (a 500 does not mean the server cannot).
    fake.fault(Fault::WatchError {
        after: 0,
        status: status(410, "Expired", "too old resource version"),
    });
    fake.drop_watches();
    fake.upsert("c9", "v");
    converge(&db, scope, &fake).await;
    for _ in 0..200 {
        if r.status.borrow().lists >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(r.status.borrow().lists, 2);
    let streaming = fake.requests().iter().filter(|r| r.contains("initial-events")).count();
    assert_eq!(streaming, 2, "{:?}", fake.requests());
    assert_eq!(fake.full_lists(), 1);
    let errors = r.stop().await;
    assert_eq!(
        errors,
        [r#"configmaps: HTTP 500 InternalError: etcd leader changed (resourceVersion "")"#],
        "the 500 reaches the error hook, whole"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relist_stopped_midway_leaves_nothing_that_brings_back_deleted_objects() {
    let fake = Fake::new();
    fake.set_streaming(true);
    for i in 0..6 {
        fake.upsert(&format!("c{i}"), "v");
    }
    let dir = tempfile::tempdir().unwrap();
    let (db, scope, r) = running(&fake, &dir, config()).await;
    converge(&db, scope, &fake).await;
    r.stop().await;
    // Compacted while down: the restart relists, and that relist stalls after two staged pages
    // (c0..c3); it is stopped there.
    fake.upsert("c5", "changed");
    fake.compact();
    fake.fault(Fault::WatchStall { after: 4 });
    let r = start(&fake, &db, scope, config());
    for _ in 0..500 {
        let streams = fake.requests().iter().filter(|r| r.contains("initial-events")).count();
        if streams >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(r.status.borrow().phase, Phase::Listing);
    r.stop().await;
    assert!(db.store(scope).get(&"ns/c1".parse().unwrap()).unwrap().is_some());
    // Deleted while down, then the next relist.
    fake.delete("c1");
    fake.compact();
    let mut r = start(&fake, &db, scope, config());
    r.synced().await;
    converge(&db, scope, &fake).await;
    assert!(db.store(scope).get(&"ns/c1".parse().unwrap()).unwrap().is_none());
    r.stop().await;
    assert!(db.check().unwrap().is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_back_off_and_resume_from_the_last_committed_rv_losing_nothing() {
    let fake = Fake::new();
    fake.upsert("a", "1");
    let dir = tempfile::tempdir().unwrap();
    let (db, scope, r) = running(&fake, &dir, config()).await;
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
    let (db, scope, r) = running(&fake, &dir, config()).await;
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
    let (db, scope, r) = running(&fake, &dir, config()).await;
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

/// A watch-cache-served watch with a selector (labels, fields, shard) counts the events it
/// filtered out as sent, and sends no bookmark at the revision of the last one: a filtered
/// resume whose target is such a revision falls back to the quiet period.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filtered_resume_whose_revision_no_bookmark_reaches_syncs_after_the_quiet_period() {
    let fake = Fake::new();
    fake.upsert("a", "1");
    let dir = tempfile::tempdir().unwrap();
    let (db, scope, r) = running(&fake, &dir, config()).await;
    r.stop().await;
    fake.set_label_selector("app=web");
    // A change the selector hides: the revision moves, nothing reaches the watch.
    fake.bump_rv();
    let mut r = start(&fake, &db, scope, cfg_quiet(200));
    r.synced().await;
    r.stop().await;
    // Unfiltered, the same revision is exact: only a bookmark syncs it.
    let fake = Fake::new();
    fake.upsert("a", "1");
    let dir = tempfile::tempdir().unwrap();
    let (db, scope, r) = running(&fake, &dir, config()).await;
    r.stop().await;
    fake.bump_rv();
    let r = start(&fake, &db, scope, cfg_quiet(200));
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(!r.status.borrow().synced, "an exact target waits for the bookmark");
    r.stop().await;
}

fn cfg_quiet(ms: u64) -> ReflectorConfig {
    ReflectorConfig {
        resume_quiet_period: Some(Duration::from_millis(ms)),
        ..config()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_resumed_watch_reports_synced_after_the_quiet_period() {
    let fake = Fake::new();
    fake.upsert("a", "1");
    let dir = tempfile::tempdir().unwrap();
    let (db, scope, r) = running(&fake, &dir, config()).await;
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

async fn wait_rv(db: &DurableStore, scope: ScopeId, rv: u64) {
    for _ in 0..500 {
        if db.store(scope).resource_version().unwrap().and_then(|r| r.as_u64()) == Some(rv) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("store RV never reached {rv}");
}

fn json_of(bytes: &[u8]) -> serde_json::Value {
    serde_json::from_slice(bytes).unwrap()
}

/// Objects over the size limit on the watch path: not stored, a stored older version deleted
/// (as a relist would), the final state of deletes transformed; returns the reported errors.
async fn oversize_on_the_watch_path(policy: OversizePolicy) -> Vec<String> {
    let fake = Fake::new();
    fake.upsert("a", "small");
    fake.upsert("b", "small");
    let dir = tempfile::tempdir().unwrap();
    let (db, scope) = open(&dir);
    let cfg = ReflectorConfig {
        transform: Transform {
            max_object_bytes: 300,
            oversize: policy,
            ..Transform::default()
        },
        ..config()
    };
    let mut r = start(&fake, &db, scope, cfg);
    r.synced().await;
    converge(&db, scope, &fake).await;
    let mark = last_seq(&db);
    let big = "x".repeat(1000);
    fake.upsert("a", &big); // 103: MODIFIED, over the limit
    fake.delete("b"); // 104
    fake.upsert("c", &big); // 105: ADDED, over the limit
    fake.upsert("d", "small"); // 106
    wait_rv(&db, scope, 106).await;
    let mut want = fake.objects();
    want.remove("ns/a");
    want.remove("ns/c");
    assert_eq!(stored(&db, scope), want);
    assert_eq!(
        log_after(&db, scope, mark),
        [
            (DeltaKind::Deleted, "ns/a".into(), false),
            (DeltaKind::Deleted, "ns/b".into(), false),
            (DeltaKind::Added, "ns/d".into(), false)
        ]
    );
    let records = db.log().read_after(mark, usize::MAX, Some(scope)).unwrap();
    // a's final state is only its identity, at the version that was refused.
    assert_eq!(
        json_of(records[0].object.as_deref().unwrap()),
        serde_json::json!({"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","namespace":"ns","resourceVersion":"103"}})
    );
    // b's final state went through the transform: no managedFields.
    let b = json_of(records[1].object.as_deref().unwrap());
    assert_eq!(b["data"]["v"], "gone");
    assert!(b["metadata"].get("managedFields").is_none(), "{b}");
    r.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversize_object_on_the_watch_path_is_reported_with_the_error_policy() {
    let errors = oversize_on_the_watch_path(OversizePolicy::Error).await;
    assert_eq!(errors.len(), 2, "{errors:?}");
    for (e, (key, rv)) in errors.iter().zip([("ns/a", 103), ("ns/c", 105)]) {
        assert!(e.starts_with(&format!("configmaps: {key}: object is ")), "{e}");
        assert!(
            e.ends_with(&format!(
                " bytes, more than the limit of 300; it was not stored (resourceVersion \"{rv}\")"
            )),
            "{e}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversize_object_on_the_watch_path_is_skipped_quietly_with_the_skip_policy() {
    let errors = oversize_on_the_watch_path(OversizePolicy::Skip).await;
    assert!(errors.is_empty(), "{errors:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_transform_that_drops_or_fails_on_an_object_removes_the_stored_version() {
    let fake = Fake::new();
    fake.upsert("a", "public"); // 101
    let dir = tempfile::tempdir().unwrap();
    let (db, scope) = open(&dir);
    let func: TransformFn = Arc::new(|json: &[u8]| {
        let text = String::from_utf8_lossy(json);
        if text.contains("secret") {
            Ok(None)
        } else if text.contains("unparsable") {
            Err("cannot parse".into())
        } else {
            Ok(Some(text.replace("public", "seen").into_bytes()))
        }
    });
    let cfg = ReflectorConfig {
        transform: Transform {
            func: Some(func),
            ..Transform::default()
        },
        ..config()
    };
    let mut r = start(&fake, &db, scope, cfg);
    r.synced().await;
    converge(&db, scope, &fake).await;
    let mark = last_seq(&db);
    fake.upsert("a", "secret"); // 102: dropped by the function
    wait_rv(&db, scope, 102).await;
    assert!(db.store(scope).get(&"ns/a".parse().unwrap()).unwrap().is_none());
    fake.upsert("a", "public again"); // 103
    fake.upsert("e", "unparsable"); // 104: the function fails
    fake.upsert("e", "fine"); // 105
    converge(&db, scope, &fake).await;
    assert_eq!(
        log_after(&db, scope, mark),
        [
            (DeltaKind::Deleted, "ns/a".into(), false),
            (DeltaKind::Added, "ns/a".into(), false),
            (DeltaKind::Added, "ns/e".into(), false)
        ]
    );
    let a = db.store(scope).get(&"ns/a".parse().unwrap()).unwrap().unwrap();
    assert_eq!(
        json_of(&a.bytes)["data"]["v"],
        "seen again",
        "the function's output is stored"
    );
    let errors = r.stop().await;
    assert_eq!(
        errors,
        [r#"configmaps: ns/e: transform failed: cannot parse (resourceVersion "104")"#]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_retry_after_is_waited_even_when_the_backoff_is_shorter() {
    let fake = Fake::new();
    fake.upsert("a", "1");
    let dir = tempfile::tempdir().unwrap();
    let (db, scope, r) = running(&fake, &dir, config()).await; // backoff starts at 5 ms
    converge(&db, scope, &fake).await;
    let before = fake.timed_requests().len();
    let mut throttled = status(429, "TooManyRequests", "slow down");
    throttled.retry_after = Some(Duration::from_millis(300));
    fake.fault(Fault::Watch(throttled));
    fake.drop_watches();
    fake.upsert("b", "1");
    converge(&db, scope, &fake).await;
    let after = fake.timed_requests()[before..].to_vec();
    assert!(after.len() >= 2, "{after:?}");
    assert!(
        after[0].1.starts_with("watch") && after[1].1.starts_with("watch"),
        "{after:?}"
    );
    let gap = after[1].0 - after[0].0;
    assert!(
        gap >= Duration::from_millis(300),
        "re-watched {gap:?} after a 429 asking for 300 ms"
    );
    let errors = r.stop().await;
    assert_eq!(
        errors,
        [r#"configmaps: HTTP 429 TooManyRequests: slow down (resourceVersion "101")"#]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_410_http_status_on_a_watch_relists_exactly_once() {
    let fake = Fake::new();
    fake.upsert("a", "1");
    let dir = tempfile::tempdir().unwrap();
    let (db, scope, r) = running(&fake, &dir, config()).await;
    converge(&db, scope, &fake).await;
    fake.fault(Fault::Watch(status(410, "Gone", "too old resource version: 101 (102)")));
    fake.drop_watches();
    fake.upsert("b", "1");
    converge(&db, scope, &fake).await;
    for _ in 0..200 {
        if fake.full_lists() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(fake.full_lists(), 2, "{:?}", fake.requests());
    assert_eq!(r.status.borrow().relists, 1);
    assert!(matches!(r.status.borrow().last_list_reason, Some(ListReason::Gone(_))));
    let errors = r.stop().await;
    assert!(errors.is_empty(), "a 410 is routine: {errors:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_timeouts_are_random_between_five_and_ten_minutes() {
    let fake = Fake::new();
    fake.upsert("a", "1");
    let dir = tempfile::tempdir().unwrap();
    let (db, scope, r) = running(&fake, &dir, config()).await;
    for i in 0..12 {
        fake.drop_watches();
        fake.upsert(&format!("w{i}"), "1");
        converge(&db, scope, &fake).await;
    }
    r.stop().await;
    let timeouts = fake.watch_timeouts();
    assert!(timeouts.len() >= 12, "{timeouts:?}");
    assert!(timeouts.iter().all(|t| (300..=600).contains(t)), "{timeouts:?}");
    let distinct: std::collections::BTreeSet<_> = timeouts.iter().collect();
    assert!(distinct.len() > 1, "not randomized: {timeouts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_list_page_names_the_list_rv_and_continue_token() {
    let fake = Fake::new();
    for i in 0..5 {
        fake.upsert(&format!("c{i}"), "v");
    }
    let dir = tempfile::tempdir().unwrap();
    let (db, scope) = open(&dir);
    fake.fault(Fault::ListContinue(status(500, "InternalError", "boom")));
    let mut r = start(&fake, &db, scope, config());
    r.synced().await;
    converge(&db, scope, &fake).await;
    let errors = r.stop().await;
    assert_eq!(
        errors,
        [r#"configmaps: HTTP 500 InternalError: boom (resourceVersion "105", continue "105:c1")"#]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_scope_keeps_committing_while_one_scope_relists_staged() {
    let (fa, fb) = (Fake::new(), Fake::new());
    fa.set_streaming(true);
    for i in 0..6 {
        fa.upsert(&format!("c{i}"), "v");
    }
    let dir = tempfile::tempdir().unwrap();
    let (db, a) = open(&dir);
    let b = db
        .writer()
        .register_scope_blocking(&ScopeSpec::new("", "v1", "secrets"))
        .unwrap();
    let mut ra = start(&fa, &db, a, config());
    ra.synced().await;
    ra.stop().await;
    // Compacted while down: the restart relists into the staging table and stalls after four
    // objects, so the relist stays open; c0, among them, changed (a direct write would show).
    fa.upsert("c0", "changed");
    fa.compact();
    fa.fault(Fault::WatchStall { after: 4 });
    let ra = start(&fa, &db, a, config());
    for _ in 0..500 {
        if fa.requests().iter().filter(|r| r.contains("initial-events")).count() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(ra.status.borrow().phase, Phase::Listing);
    let a_before = stored(&db, a);
    let mut rb = start(&fb, &db, b, config());
    rb.synced().await;
    for i in 0..20 {
        fb.upsert(&format!("s{i}"), "1");
    }
    converge(&db, b, &fb).await;
    assert_eq!(fb.objects().len(), 20);
    // The relist is still open and readers of its scope see the state from before it.
    assert_eq!(ra.status.borrow().phase, Phase::Listing);
    assert_eq!(stored(&db, a), a_before);
    rb.stop().await;
    ra.stop().await;
    assert!(db.check().unwrap().is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bookmark_persists_its_rv_without_a_log_entry() {
    let fake = Fake::new();
    fake.upsert("a", "1");
    let dir = tempfile::tempdir().unwrap();
    let (db, scope, r) = running(&fake, &dir, config()).await;
    converge(&db, scope, &fake).await;
    let mark = last_seq(&db);
    let before = db.store(scope).resource_version().unwrap().and_then(|v| v.as_u64());
    // Other resources move the cluster RV; only a bookmark tells this watch.
    fake.bump_rv();
    fake.bump_rv();
    assert_ne!(before, Some(fake.current_rv()));
    // Sent until it lands: the watch may not be open yet when the list has committed.
    for _ in 0..500 {
        fake.bookmark();
        if db.store(scope).resource_version().unwrap().and_then(|v| v.as_u64()) == Some(fake.current_rv()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    wait_rv(&db, scope, fake.current_rv()).await;
    assert_eq!(last_seq(&db), mark, "a bookmark adds no log entry");
    assert!(log_after(&db, scope, mark).is_empty());
    r.stop().await;
    // And the persisted RV is what a restart resumes from.
    let watches_before = fake.requests().iter().filter(|q| q.starts_with("watch")).count();
    let r = start(&fake, &db, scope, config());
    for _ in 0..500 {
        if fake.requests().iter().filter(|q| q.starts_with("watch")).count() > watches_before {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    r.stop().await;
    let watches: Vec<String> = fake.requests().into_iter().filter(|q| q.starts_with("watch")).collect();
    assert!(
        watches
            .last()
            .unwrap()
            .starts_with(&format!("watch rv={} ", fake.current_rv())),
        "{watches:?}"
    );
}

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Capture {
    type Writer = Capture;
    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

// One thread: the subscriber is this thread's default, and every reflector task runs here;
// one process (see `in_own_process`): no other test's thread can disable a callsite meanwhile.
#[test]
fn a_probe_regression_relist_is_logged_at_warn_and_the_first_list_at_info() {
    if !common::alone::in_own_process("a_probe_regression_relist_is_logged_at_warn_and_the_first_list_at_info") {
        return;
    }
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(probe_regression_logs());
}

async fn probe_regression_logs() {
    let capture = Capture::default();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .with_writer(capture.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let fake = Fake::new();
    for i in 0..4 {
        fake.upsert(&format!("c{i}"), "v");
    }
    let dir = tempfile::tempdir().unwrap();
    let (db, scope, r) = running(&fake, &dir, config()).await;
    fake.upsert("c9", "late");
    converge(&db, scope, &fake).await;
    r.stop().await;
    fake.restore_backup_to(102);
    let mut r = start(&fake, &db, scope, config());
    r.synced().await;
    r.stop().await;
    let text = String::from_utf8(capture.0.lock().unwrap().clone()).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("INFO") && l.contains("initial list") && l.contains("listing")),
        "{text}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("WARN") && l.contains("ahead of the server") && l.contains("relisting")),
        "{text}"
    );
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
    let ghost = durable_informer::object::RawObject::from_json(
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
