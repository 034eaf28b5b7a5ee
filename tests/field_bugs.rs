//! Regression tests for reflector bugs seen in the field (client-go), replayed against the
//! scripted fake server of `tests/common/fake.rs`. Each test names the bug and what it guards.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::fake::{status, Fake, Fault};
use common::reflector::{open, stored, Running};
use durable_informer::object::{RawObject, ScopeSpec};
use durable_informer::reflector::{BackoffConfig, ListReason, ReflectorConfig};
use durable_informer::source::{ListPage, ListRequest, Source, SourceError, WatchEvent, WatchRequest, WatchStream};
use durable_informer::store::{DeltaKind, DurableStore, ScopeId, Seq};
use futures::StreamExt;

fn config() -> ReflectorConfig {
    ReflectorConfig {
        page_size: 2,
        backoff: BackoffConfig {
            initial: Duration::from_millis(5),
            max: Duration::from_millis(50),
            ..BackoffConfig::default()
        },
        resume_quiet_period: Some(Duration::from_millis(100)),
        ..ReflectorConfig::default()
    }
}

fn start<S: Source + Clone>(source: &S, db: &DurableStore, scope: ScopeId) -> Running {
    common::reflector::start(source.clone(), db, scope, config())
}

fn persisted_rv(db: &DurableStore, scope: ScopeId) -> u64 {
    db.store(scope)
        .resource_version()
        .unwrap()
        .and_then(|r| r.as_u64())
        .unwrap_or(0)
}

async fn converge(db: &DurableStore, scope: ScopeId, fake: &Fake) {
    for _ in 0..500 {
        if stored(db, scope) == fake.objects() && persisted_rv(db, scope) == fake.current_rv() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(stored(db, scope), fake.objects(), "store never converged");
    panic!(
        "store RV {} never reached {}",
        persisted_rv(db, scope),
        fake.current_rv()
    );
}

/// Full LISTs (not the one-object probe, not continuation pages) with the RV they asked for.
fn full_list_rvs(fake: &Fake) -> Vec<String> {
    fake.requests()
        .iter()
        .filter(|r| r.starts_with("list") && !r.contains("limit=1 ") && r.ends_with("continue="))
        .map(|r| r.split_whitespace().nth(1).unwrap_or("").to_owned())
        .collect()
}

/// kubernetes#107133: after the cluster was rebuilt, the persisted RV is one the server has not
/// reached; a WATCH from it answers 504 "Too large resource version". client-go looped on it.
/// Guards: we relist once, from `resourceVersion=""` (a consistent read, never the bad RV or
/// "0"), then watch from the relist's RV; no further lists follow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k8s_107133_too_large_rv_relists_from_empty_once_and_does_not_loop() {
    let fake = Fake::new();
    for i in 0..3 {
        fake.upsert(&format!("c{i}"), "v");
    }
    let dir = tempfile::tempdir().unwrap();
    let (db, scope) = open(&dir);
    let mut r = start(&fake, &db, scope);
    r.synced().await;
    converge(&db, scope, &fake).await;
    r.stop().await;
    // The server answers the watch from our (to it, future) RV with 504. (The fake's fault is
    // unconditional, so only one: the watch after the relist uses the server's own RV.)
    let mut too_large = status(504, "Timeout", "Too large resource version: 999, current: 103");
    too_large.causes = vec!["ResourceVersionTooLarge".into()];
    fake.fault(Fault::Watch(too_large));
    let mut r = start(&fake, &db, scope);
    r.synced().await;
    fake.upsert("after", "1");
    converge(&db, scope, &fake).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let lists = full_list_rvs(&fake);
    assert_eq!(lists.len(), 2, "one initial list and one relist, no loop: {lists:?}");
    assert_eq!(
        lists[1], "rv=",
        "the relist reads from etcd (resourceVersion=\"\"): {lists:?}"
    );
    r.stop().await;
}

/// kubernetes#107133 (silent variant): servers without the too-large check answer a watch from
/// a future RV with silence. Guards: the resume probe sees the server behind the persisted RV and
/// relists from `""` at once instead of waiting forever on an empty watch; no loop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k8s_107133_silent_watch_from_a_future_rv_relists_instead_of_hanging() {
    let fake = Fake::new();
    for i in 0..3 {
        fake.upsert(&format!("c{i}"), "v");
    }
    let dir = tempfile::tempdir().unwrap();
    let (db, scope) = open(&dir);
    let mut r = start(&fake, &db, scope);
    r.synced().await;
    for i in 3..6 {
        fake.upsert(&format!("c{i}"), "v");
    }
    converge(&db, scope, &fake).await;
    r.stop().await;
    // Rebuilt cluster: counter behind our persisted RV (the fake's watch is silent from a
    // future RV).
    fake.restore_backup_to(103);
    let mut r = start(&fake, &db, scope);
    tokio::time::timeout(Duration::from_secs(5), r.synced())
        .await
        .expect("stuck on a silent watch");
    fake.upsert("new", "1");
    converge(&db, scope, &fake).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let lists = full_list_rvs(&fake);
    assert_eq!(
        lists,
        vec!["rv=".to_owned(), "rv=".to_owned()],
        "exactly one relist from \"\""
    );
    r.stop().await;
}

/// kubernetes#107457: etcd restored from an older backup while we were down; objects created
/// after the backup are gone and the RV went backwards. Guards: the probe detects the
/// regression, the relist diff removes what the server no longer has (and re-adds what it has),
/// the store ends equal to the server, and the persisted RV moved backwards only through that
/// relist.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k8s_107457_rv_regression_after_restore_relists_and_ends_equal_to_the_server() {
    let fake = Fake::new();
    for i in 0..4 {
        fake.upsert(&format!("c{i}"), "v");
    }
    let dir = tempfile::tempdir().unwrap();
    let (db, scope) = open(&dir);
    let mut r = start(&fake, &db, scope);
    r.synced().await;
    let backup_rv = fake.current_rv();
    fake.upsert("lost-1", "x");
    fake.upsert("c0", "changed-after-backup");
    fake.delete("c1");
    converge(&db, scope, &fake).await;
    r.stop().await;
    let before = persisted_rv(&db, scope);
    fake.restore_backup_to(backup_rv);
    // The restored cluster moves on, but stays below our persisted RV.
    fake.upsert("c2", "post-restore");
    assert!(fake.current_rv() < before);
    let mut r = start(&fake, &db, scope);
    r.synced().await;
    converge(&db, scope, &fake).await;
    let reason = r.status.borrow().last_list_reason.clone();
    assert!(
        matches!(reason, Some(ListReason::AheadOfServer { .. })),
        "relist reason: {reason:?}"
    );
    assert_eq!(stored(&db, scope), fake.objects());
    assert!(db.store(scope).get(&"ns/lost-1".parse().unwrap()).unwrap().is_none());
    assert_eq!(db.check().unwrap().problems, Vec::<String>::new());
    assert_eq!(full_list_rvs(&fake).len(), 2, "one relist, no loop");
    r.stop().await;
}

/// A source that replays the fake but gives DELETED events the object's *previous*
/// resourceVersion, as the apiserver watch cache did before kubernetes#58547.
#[derive(Clone)]
struct StaleDeletes {
    fake: Fake,
    last_rv: Arc<Mutex<HashMap<String, u64>>>,
}

impl Source for StaleDeletes {
    async fn list(&self, req: ListRequest) -> Result<ListPage, SourceError> {
        let page = self.fake.list(req).await?;
        let mut m = self.last_rv.lock().unwrap();
        for o in &page.items {
            m.insert(o.meta.name.clone(), o.meta.resource_version.as_u64().unwrap_or(0));
        }
        Ok(page)
    }

    async fn watch(&self, req: WatchRequest) -> Result<WatchStream, SourceError> {
        let last = self.last_rv.clone();
        let stream = self.fake.watch(req).await?;
        Ok(stream
            .map(move |ev| {
                let mut m = last.lock().unwrap();
                match ev {
                    Ok(WatchEvent::Added(o)) => {
                        m.insert(o.meta.name.clone(), o.meta.resource_version.as_u64().unwrap_or(0));
                        Ok(WatchEvent::Added(o))
                    }
                    Ok(WatchEvent::Modified(o)) => {
                        m.insert(o.meta.name.clone(), o.meta.resource_version.as_u64().unwrap_or(0));
                        Ok(WatchEvent::Modified(o))
                    }
                    Ok(WatchEvent::Deleted(o)) => {
                        let stale = m.remove(&o.meta.name).unwrap_or(0);
                        let mut v: serde_json::Value = serde_json::from_slice(&o.bytes).unwrap();
                        v["metadata"]["resourceVersion"] = serde_json::json!(stale.to_string());
                        Ok(WatchEvent::Deleted(
                            RawObject::from_json(serde_json::to_vec(&v).unwrap()).unwrap(),
                        ))
                    }
                    other => other,
                }
            })
            .boxed())
    }

    async fn cluster_identity(&self) -> Result<Option<String>, SourceError> {
        self.fake.cluster_identity().await
    }

    fn resource(&self) -> String {
        self.fake.resource()
    }

    fn scope(&self) -> ScopeSpec {
        self.fake.scope()
    }
}

/// kubernetes#58545: the watch cache sent DELETED events carrying the object's last
/// resourceVersion instead of the deletion's, so a reflector that took "the RV of the last
/// event" as its position went back in time and, after a reconnect, replayed events (or, here,
/// would persist an RV that moves backwards). Guards: the persisted RV never moves backwards on
/// a stale-RV delete (invariant 2), the delete is applied at once (the batch offers the
/// watch's highest RV, not the stale one the writer would refuse), no relist or error loop is
/// triggered, a forced re-watch starts from the persisted RV and redelivers nothing, and a
/// restart resumes and converges without a LIST.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k8s_58545_stale_rv_on_delete_never_moves_the_persisted_rv_backwards() {
    let fake = Fake::new();
    let source = StaleDeletes {
        fake: fake.clone(),
        last_rv: Arc::default(),
    };
    let dir = tempfile::tempdir().unwrap();
    let (db, scope) = open(&dir);
    let mut r = start(&source, &db, scope);
    r.synced().await;
    let mut rvs = Vec::new();
    for i in 0..6 {
        fake.upsert(&format!("c{i}"), "v");
    }
    for _ in 0..100 {
        if stored(&db, scope).len() == 6 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    rvs.push(persisted_rv(&db, scope));
    // Delete the oldest objects: their stale RVs are far below the current one.
    for i in 0..3 {
        fake.delete(&format!("c{i}"));
        for _ in 0..100 {
            if !stored(&db, scope).contains_key(&format!("ns/c{i}")) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        rvs.push(persisted_rv(&db, scope));
    }
    // Force a re-watch: it must start from the persisted RV (not a stale delete's) and bring
    // nothing already applied back into the log.
    assert_eq!(stored(&db, scope).len(), 3, "the stale-RV deletes were applied");
    let mark = db.log().bounds().unwrap().map_or(Seq(0), |b| b.1);
    let resume_rv = persisted_rv(&db, scope);
    let watches = |f: &Fake| -> Vec<String> {
        f.requests_without_timeouts()
            .into_iter()
            .filter(|q| q.starts_with("watch"))
            .collect()
    };
    let watches_before = watches(&fake).len();
    fake.drop_watches();
    for _ in 0..500 {
        if watches(&fake).len() > watches_before {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        watches(&fake)[watches_before..],
        [format!("watch rv={resume_rv}")],
        "one re-watch, from the persisted RV"
    );
    fake.upsert("tail", "v");
    converge(&db, scope, &fake).await;
    rvs.push(persisted_rv(&db, scope));
    let logged: Vec<(DeltaKind, String)> = db
        .log()
        .read_after(mark, usize::MAX, Some(scope))
        .unwrap()
        .into_iter()
        .map(|r| (r.kind, r.key.to_string()))
        .collect();
    assert_eq!(logged, [(DeltaKind::Added, "ns/tail".to_string())], "no redelivery");
    assert!(
        rvs.windows(2).all(|w| w[0] <= w[1]),
        "persisted RV went backwards: {rvs:?}"
    );
    assert_eq!(
        stored(&db, scope),
        fake.objects(),
        "deletes with a stale RV are still applied"
    );
    assert_eq!(full_list_rvs(&fake).len(), 1, "no relist");
    let st = r.status.borrow().clone();
    assert_eq!(st.last_error, None, "a stale RV is not an error");
    assert_eq!(st.watches, 2, "the first watch and the forced re-watch, no retries");
    r.stop().await;
    // Restart: resume from the persisted RV without a list, nothing replayed backwards.
    fake.upsert("after-restart", "v");
    let mut r = start(&source, &db, scope);
    r.synced().await;
    converge(&db, scope, &fake).await;
    assert_eq!(full_list_rvs(&fake).len(), 1, "resume, not relist");
    r.stop().await;
}
