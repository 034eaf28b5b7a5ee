//! The controller runner with real informers over the scripted in-memory server: informers the
//! controller starts itself, caches synced before the first reconcile, and a panicking
//! reconcile that neither stalls the controller nor its shutdown. The worker loop's timing
//! (requeue_after, backoff, concurrency, drain) is unit-tested on paused time in
//! `src/controller/mod.rs`.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::fake::Fake;
use durable_informer::controller::{default_error_policy, Action, Controller, ControllerError, RunSummary};
use durable_informer::informer::{Informer, Lister};
use durable_informer::object::ObjectKey;
use durable_informer::store::{DurableStore, StoreConfig};
use k8s_openapi::api::core::v1::ConfigMap;
use tokio::sync::watch;

/// Opens a database in `dir` and builds an informer of `fake`'s ConfigMaps, not started. Each
/// fake gets its own database: they would share a scope in one.
async fn informer(dir: &tempfile::TempDir, file: &str, fake: &Fake) -> (DurableStore, Informer<ConfigMap>) {
    let db = DurableStore::open(StoreConfig::new(dir.path().join(file))).unwrap();
    let inf = Informer::<ConfigMap>::builder(&db, fake.clone()).build().await.unwrap();
    (db, inf)
}

/// A secondary ConfigMap points at its primary by name in `data.v`.
fn primary_of(cm: &ConfigMap) -> Vec<ObjectKey> {
    let v = cm.data.as_ref().and_then(|d| d.get("v"));
    v.map(|name| ObjectKey::namespaced("ns", name)).into_iter().collect()
}

struct Ctx {
    children: Lister<ConfigMap>,
    /// (key, names of the children in the secondary cache at the time).
    calls: Mutex<Vec<(String, Vec<String>)>>,
    errors: Mutex<Vec<String>>,
}

impl Ctx {
    fn calls_of(&self, name: &str) -> Vec<Vec<String>> {
        let calls = self.calls.lock().unwrap();
        calls
            .iter()
            .filter(|(k, _)| k == name)
            .map(|(_, c)| c.clone())
            .collect()
    }
}

/// Stops a controller's `run` and returns its summary once it returned (within 10 s).
async fn stopped(
    stop_tx: watch::Sender<bool>,
    run: tokio::task::JoinHandle<Result<RunSummary, ControllerError>>,
) -> RunSummary {
    stop_tx.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .expect("run returns after stop")
        .unwrap()
        .expect("the caches synced")
}

async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..500 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for {what}");
}

async fn reconcile(key: ObjectKey, ctx: Arc<Ctx>) -> Result<Action, String> {
    let mut children: Vec<String> = ctx
        .children
        .namespace("ns")
        .list(&Default::default())
        .map_err(|e| e.to_string())?
        .iter()
        .filter_map(|c| c.metadata.name.clone())
        .collect();
    children.sort();
    let first = {
        let mut calls = ctx.calls.lock().unwrap();
        calls.push((key.name.clone(), children));
        calls.iter().filter(|(k, _)| *k == key.name).count() == 1
    };
    if key.name == "fragile" && first {
        panic!("fragile breaks on its first reconcile");
    }
    Ok(Action::await_change())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_starts_a_watched_informer_that_was_never_started_and_reconciles_its_changes() {
    let (primaries, secondaries) = (Fake::new(), Fake::new());
    primaries.upsert("parent", "");
    secondaries.upsert("child0", "parent");
    let dir = tempfile::tempdir().unwrap();
    let (_db1, primary) = informer(&dir, "primary.redb", &primaries).await;
    let (_db2, secondary) = informer(&dir, "secondary.redb", &secondaries).await;
    let ctx = Arc::new(Ctx {
        children: secondary.lister(),
        calls: Mutex::default(),
        errors: Mutex::default(),
    });
    let (stop_tx, stop) = watch::channel(false);
    let run = tokio::spawn(Controller::new(primary).watches(secondary.clone(), primary_of).run(
        reconcile,
        default_error_policy,
        ctx.clone(),
        stop,
    ));

    eventually("the first reconcile", || !ctx.calls_of("parent").is_empty()).await;
    assert!(secondary.has_synced(), "run started the secondary informer");
    assert_eq!(
        ctx.calls_of("parent")[0],
        ["child0"],
        "the first reconcile sees the secondary cache synced"
    );

    // A change to a secondary object reconciles its primary.
    secondaries.upsert("child1", "parent");
    eventually("a reconcile for the new child", || {
        ctx.calls_of("parent").iter().any(|c| c.contains(&"child1".to_owned()))
    })
    .await;

    stopped(stop_tx, run).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_informer_started_before_run_is_not_started_again() {
    let (primaries, secondaries) = (Fake::new(), Fake::new());
    primaries.upsert("parent", "");
    secondaries.upsert("child0", "parent");
    let dir = tempfile::tempdir().unwrap();
    let (_db1, primary) = informer(&dir, "primary.redb", &primaries).await;
    let (_db2, secondary) = informer(&dir, "secondary.redb", &secondaries).await;
    secondary.start();
    secondary.wait_for_sync().await.expect("cache synced");
    let ctx = Arc::new(Ctx {
        children: secondary.lister(),
        calls: Mutex::default(),
        errors: Mutex::default(),
    });
    let (stop_tx, stop) = watch::channel(false);
    let run = tokio::spawn(Controller::new(primary).watches(secondary.clone(), primary_of).run(
        reconcile,
        default_error_policy,
        ctx.clone(),
        stop,
    ));
    eventually("the first reconcile", || !ctx.calls_of("parent").is_empty()).await;
    secondaries.upsert("child1", "parent");
    eventually("a reconcile for the new child", || ctx.calls_of("parent").len() >= 2).await;
    assert_eq!(
        secondaries.full_lists(),
        1,
        "one reflector: {:?}",
        secondaries.requests()
    );
    stopped(stop_tx, run).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_reconcile_is_retried_and_run_still_stops() {
    let fake = Fake::new();
    fake.upsert("fragile", "");
    fake.upsert("sturdy", "");
    let dir = tempfile::tempdir().unwrap();
    let (_db, primary) = informer(&dir, "db.redb", &fake).await;
    let ctx = Arc::new(Ctx {
        children: primary.lister(),
        calls: Mutex::default(),
        errors: Mutex::default(),
    });
    let (stop_tx, stop) = watch::channel(false);
    let policy_ctx = ctx.clone();
    let run = tokio::spawn(Controller::new(primary).run(
        reconcile,
        move |k: &ObjectKey, e: &String, _ctx| {
            policy_ctx.errors.lock().unwrap().push(format!("{k}: {e}"));
            Action::requeue_rate_limited()
        },
        ctx.clone(),
        stop,
    ));
    eventually("fragile retried", || ctx.calls_of("fragile").len() >= 2).await;
    eventually("sturdy reconciled", || ctx.calls_of("sturdy").len() == 1).await;
    let errors = ctx.errors.lock().unwrap().clone();
    assert!(errors.is_empty(), "a panic is not an Err of the reconcile: {errors:?}");

    // Still serving: a change is reconciled after the panic.
    fake.upsert("fragile", "2");
    eventually("fragile after a change", || ctx.calls_of("fragile").len() >= 3).await;

    let summary = stopped(stop_tx, run).await;
    assert_eq!(summary.panicked, 1, "{summary:?}");
    assert_eq!(summary.failed, 0, "{summary:?}");
    assert_eq!(summary.reconciled, 3, "{summary:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_error_policy_decides_the_retry_of_a_failed_reconcile() {
    let fake = Fake::new();
    fake.upsert("flaky", "");
    let dir = tempfile::tempdir().unwrap();
    let (_db, primary) = informer(&dir, "db.redb", &fake).await;
    let calls = Arc::new(Mutex::new(Vec::<std::time::Instant>::new()));
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let (stop_tx, stop) = watch::channel(false);
    let c = calls.clone();
    let s = seen.clone();
    let run = tokio::spawn(Controller::new(primary).name("flaky-controller").run(
        move |_key: ObjectKey, _ctx: Arc<()>| {
            let c = c.clone();
            async move {
                let n = {
                    let mut calls = c.lock().unwrap();
                    calls.push(std::time::Instant::now());
                    calls.len()
                };
                // A typed error: the policy receives it as it was returned.
                if n == 1 {
                    Err(std::io::Error::other("first attempt fails"))
                } else {
                    Ok(Action::await_change())
                }
            }
        },
        move |key: &ObjectKey, e: &std::io::Error, _ctx: Arc<()>| {
            s.lock().unwrap().push(format!("{key}: {e} ({:?})", e.kind()));
            Action::requeue(Duration::from_millis(300))
        },
        Arc::new(()),
        stop,
    ));
    eventually("the retry", || calls.lock().unwrap().len() == 2).await;
    let gap = {
        let calls = calls.lock().unwrap();
        calls[1] - calls[0]
    };
    // The policy's 300 ms, not the rate limiter's 5 ms.
    assert!(gap >= Duration::from_millis(300), "{gap:?}");
    assert_eq!(*seen.lock().unwrap(), ["ns/flaky: first attempt fails (Other)"]);
    let text = durable_informer::metrics::encode();
    assert!(
        text.contains(r#"durable_informer_reconcile_total{controller="flaky-controller",result="error"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"workqueue_adds_total{name="flaky-controller",controller="flaky-controller"}"#),
        "{text}"
    );
    let summary = stopped(stop_tx, run).await;
    assert_eq!((summary.reconciled, summary.failed), (1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_fails_without_reconciling_when_a_cache_never_syncs() {
    let fake = Fake::new();
    fake.upsert("a", "");
    let dir = tempfile::tempdir().unwrap();
    // The database belongs to another cluster: the reflector stops before any sync.
    {
        let (db, inf) = informer(&dir, "db.redb", &fake).await;
        inf.start();
        inf.wait_for_sync().await.expect("cache synced");
        inf.shutdown().await.unwrap();
        drop(inf);
        db.close().unwrap();
    }
    fake.set_identity("another-uid@another");
    let (_db, primary) = informer(&dir, "db.redb", &fake).await;
    let reconciled = Arc::new(Mutex::new(0_u32));
    let r = reconciled.clone();
    let (_stop_tx, stop) = watch::channel(false);
    let result = tokio::time::timeout(
        Duration::from_secs(20),
        Controller::new(primary.clone()).run(
            move |_key: ObjectKey, _ctx: Arc<()>| {
                *r.lock().unwrap() += 1;
                async { Ok::<_, String>(Action::await_change()) }
            },
            default_error_policy,
            Arc::new(()),
            stop,
        ),
    )
    .await
    .expect("run returns instead of waiting for ever");
    let err = result.expect_err("a cache that cannot sync is an error");
    assert!(err.to_string().contains("another"), "{err}");
    assert_eq!(*reconciled.lock().unwrap(), 0);
    let synced = primary.wait_for_sync().await;
    assert!(synced.is_err(), "wait_for_sync reports it too");
}

/// Reconciles of a run, by key name.
#[derive(Default)]
struct Seen(Mutex<Vec<String>>);

impl Seen {
    fn count(&self, name: &str) -> usize {
        self.0.lock().unwrap().iter().filter(|n| *n == name).count()
    }
}

async fn note(key: ObjectKey, seen: Arc<Seen>) -> Result<Action, String> {
    seen.0.lock().unwrap().push(key.name);
    Ok(Action::await_change())
}

/// Runs `controller` until `f` returns; then stops it and checks it stopped cleanly.
async fn running<K, F, Fut>(controller: Controller<K>, seen: Arc<Seen>, f: F)
where
    K: kube::Resource + serde::de::DeserializeOwned + Send + Sync + 'static,
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let (stop_tx, stop) = watch::channel(false);
    let run = tokio::spawn(controller.run(note, default_error_policy, seen, stop));
    f().await;
    stopped(stop_tx, run).await;
}

/// A `creationTimestamp` that is not a time: the store keeps the object (its metadata scan
/// reads no timestamp), but it decodes neither as a `ConfigMap` nor as kube's `ObjectMeta`.
const BAD_TIME: &str = r#","creationTimestamp":"yesterday""#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controller_enqueues_keys_without_decoding_objects() {
    let fake = Fake::new();
    fake.upsert_raw("odd", BAD_TIME, "{}");
    fake.upsert("plain", "x");
    let dir = tempfile::tempdir().unwrap();
    let (_db, primary) = informer(&dir, "db.redb", &fake).await;
    let seen = Arc::new(Seen::default());
    let s = seen.clone();
    running(Controller::new(primary), seen, || async move {
        eventually("both keys reconciled", || s.count("odd") == 1 && s.count("plain") == 1).await;
        // An update of the undecodable object reaches the queue too.
        fake.upsert_raw("odd", BAD_TIME, r#"{"v":"2"}"#);
        eventually("the update reconciled", || s.count("odd") == 2).await;
    })
    .await;
}

fn generation(g: i64) -> String {
    format!(r#","generation":{g}"#)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn predicates_let_through_only_updates_whose_value_changed() {
    use durable_informer::controller::predicates;
    let fake = Fake::new();
    fake.upsert_raw("a", &generation(1), r#"{"v":"1"}"#);
    fake.upsert_raw("marker", &generation(1), "{}");
    let dir = tempfile::tempdir().unwrap();
    let (_db, primary) = informer(&dir, "db.redb", &fake).await;
    let seen = Arc::new(Seen::default());
    let s = seen.clone();
    let controller = Controller::new(primary).with_predicate(predicates::generation());
    running(controller, seen, || async move {
        eventually("the initial reconciles", || s.count("a") == 1 && s.count("marker") == 1).await;
        // A status-like write: same generation. Then a spec change of the marker; events
        // reach the queue in order, so once the marker is reconciled, `a`'s update was seen.
        fake.upsert_raw("a", &generation(1), r#"{"v":"2"}"#);
        fake.upsert_raw("marker", &generation(2), "{}");
        eventually("the marker's spec change", || s.count("marker") == 2).await;
        assert_eq!(s.count("a"), 1, "an update with the same generation is filtered out");
        fake.upsert_raw("a", &generation(2), r#"{"v":"2"}"#);
        eventually("a's spec change", || s.count("a") == 2).await;
        // Metadata that does not decode passes: a reconcile too many, never one too few.
        fake.upsert_raw("a", &format!("{}{BAD_TIME}", generation(2)), r#"{"v":"3"}"#);
        eventually("the undecodable update", || s.count("a") == 3).await;
        // Deletes always pass.
        fake.delete("a");
        eventually("the delete", || s.count("a") == 4).await;
    })
    .await;
}

/// `,"ownerReferences":[…]` naming ConfigMaps `(name, controller)`.
fn owned_by(owners: &[(&str, bool)]) -> String {
    let refs: Vec<String> = owners
        .iter()
        .map(|(name, controller)| {
            format!(
                r#"{{"apiVersion":"v1","kind":"ConfigMap","name":"{name}","uid":"u-{name}","controller":{controller}}}"#
            )
        })
        .collect();
    format!(r#","ownerReferences":[{}]"#, refs.join(","))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owns_reconciles_the_controlling_owner_of_each_state() {
    let (parents, children) = (Fake::new(), Fake::new());
    for p in ["p1", "p2", "p3"] {
        parents.upsert(p, "");
    }
    let dir = tempfile::tempdir().unwrap();
    let (_db1, primary) = informer(&dir, "parents.redb", &parents).await;
    let (_db2, owned) = informer(&dir, "children.redb", &children).await;
    let seen = Arc::new(Seen::default());
    let s = seen.clone();
    let lister = owned.lister();
    running(Controller::new(primary).owns(owned), seen, || async move {
        eventually("the initial reconciles", || {
            (1..=3).all(|i| s.count(&format!("p{i}")) == 1)
        })
        .await;
        // p3 is only a non-controlling owner: never enqueued through the child.
        children.upsert_raw("c", &owned_by(&[("p1", true), ("p3", false)]), "{}");
        eventually("the child in the cache", || {
            lister.namespace("ns").get("c").unwrap().is_some()
        })
        .await;
        eventually("the controlling owner", || s.count("p1") == 2).await;
        // The child moves to p2: the old owner and the new one.
        children.upsert_raw("c", &owned_by(&[("p2", true), ("p3", false)]), "{}");
        eventually("both owners after the move", || {
            s.count("p1") == 3 && s.count("p2") == 2
        })
        .await;
        children.delete_raw("c", &owned_by(&[("p2", true)]), "{}");
        eventually("the owner of a deleted child", || s.count("p2") == 3).await;
        assert_eq!(s.count("p3"), 1, "a non-controlling owner is not enqueued");
        assert_eq!(s.count("c"), 0, "children are not primaries");
    })
    .await;
}
