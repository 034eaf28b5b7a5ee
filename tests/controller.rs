//! kube-runtime's `Controller` shapes on durable informers, over the scripted in-memory server:
//! `owns` (every owner reference, or the controlling one), `watches` mappers, predicates on the
//! primary and on related objects, concurrency, `reconcile_on` / `reconcile_all_on`, graceful
//! shutdown, the `Action` kube's `finalizer()` returns, the stream's items (errors included),
//! deletions (only through finalizers, or the opt-in hook, durable across restarts), and the
//! reconcile span. The debounce is unit-tested on paused time in `src/controller/schedule.rs`.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::fake::Fake;
use durable_informer::controller::{
    default_error_policy, predicates, requeue_rate_limited, Action, Config, Controller, Error, Relation,
};
use durable_informer::informer::Informer;
use durable_informer::store::{DurableStore, StoreConfig};
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::reflector::ObjectRef;

/// Opens a database in `dir` and builds an informer of `fake`'s ConfigMaps, not started. Each
/// fake gets its own database: they would share a scope in one.
async fn informer(dir: &tempfile::TempDir, file: &str, fake: &Fake) -> (DurableStore, Informer<ConfigMap>) {
    let db = DurableStore::open(StoreConfig::new(dir.path().join(file))).unwrap();
    let inf = Informer::<ConfigMap>::builder(&db, fake.clone()).build().await.unwrap();
    (db, inf)
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Fail(String);

type Outcome = Result<(String, Action), String>;

/// Reconciles of a run, by name, with their start and end; and the stream's items.
#[derive(Default)]
struct Seen {
    started: Mutex<Vec<(String, Instant)>>,
    finished: Mutex<Vec<String>>,
    items: Mutex<Vec<Outcome>>,
    in_flight: Mutex<(usize, usize)>,
}

impl Seen {
    fn count(&self, name: &str) -> usize {
        self.started.lock().unwrap().iter().filter(|(n, _)| n == name).count()
    }
    fn total(&self) -> usize {
        self.started.lock().unwrap().len()
    }
    fn items(&self) -> Vec<Outcome> {
        self.items.lock().unwrap().clone()
    }
}

fn name_of(cm: &ConfigMap) -> String {
    cm.metadata.name.clone().unwrap_or_default()
}

async fn note(cm: Arc<ConfigMap>, seen: Arc<Seen>) -> Result<Action, Fail> {
    seen.started.lock().unwrap().push((name_of(&cm), Instant::now()));
    Ok(Action::await_change())
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

/// A controller's stream, consumed by a task that records its items in `seen`; `stop()` shuts
/// it down gracefully and waits (at most 10 s) until the stream ended.
struct Running {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("the stream ends after a graceful shutdown")
            .unwrap();
    }
}

fn run_with<F, Fut, P>(controller: Controller<ConfigMap>, seen: &Arc<Seen>, reconcile: F, error_policy: P) -> Running
where
    F: Fn(Arc<ConfigMap>, Arc<Seen>) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<Action, Fail>> + Send + 'static,
    P: Fn(Arc<ConfigMap>, &Fail, Arc<Seen>) -> Action + Send + Sync + 'static,
{
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let stream = controller
        .graceful_shutdown_on(async move {
            let _ = stopped.await;
        })
        .run(reconcile, error_policy, seen.clone());
    let s = seen.clone();
    let task = tokio::spawn(stream.for_each(move |item| {
        let item = match item {
            Ok((r, a)) => Ok((r.name, a)),
            Err(e) => Err(e.to_string()),
        };
        s.items.lock().unwrap().push(item);
        async {}
    }));
    Running { stop: Some(stop), task }
}

fn run(controller: Controller<ConfigMap>, seen: &Arc<Seen>) -> Running {
    run_with(controller, seen, note, default_error_policy)
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
async fn owns_follows_every_matching_owner_reference_as_kube_does() {
    let (parents, children) = (Fake::new(), Fake::new());
    for p in ["p1", "p2", "p3"] {
        parents.upsert(p, "");
    }
    let dir = tempfile::tempdir().unwrap();
    let (_db1, primary) = informer(&dir, "parents.redb", &parents).await;
    let (_db2, owned) = informer(&dir, "children.redb", &children).await;
    let seen = Arc::new(Seen::default());
    let running = run(
        Controller::for_informer(primary).owns_informer(owned, Relation::new()),
        &seen,
    );
    eventually("the initial reconciles", || {
        (1..=3).all(|i| seen.count(&format!("p{i}")) == 1)
    })
    .await;
    // p3 is a non-controlling owner: kube's `owns` follows it too.
    children.upsert_raw("c", &owned_by(&[("p1", true), ("p3", false)]), "{}");
    eventually("both owners", || seen.count("p1") == 2 && seen.count("p3") == 2).await;
    // The child moves from p1 to p2: the old owner and the new one.
    children.upsert_raw("c", &owned_by(&[("p2", true)]), "{}");
    eventually("both owners after the move", || {
        seen.count("p1") == 3 && seen.count("p2") == 2
    })
    .await;
    children.delete_raw("c", &owned_by(&[("p2", true)]), "{}");
    eventually("the owner of a deleted child", || seen.count("p2") == 3).await;
    assert_eq!(seen.count("c"), 0, "children are not primaries");
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owns_controller_only_skips_non_controlling_owners() {
    let (parents, children) = (Fake::new(), Fake::new());
    for p in ["p1", "p3", "marker"] {
        parents.upsert(p, "");
    }
    let dir = tempfile::tempdir().unwrap();
    let (_db1, primary) = informer(&dir, "parents.redb", &parents).await;
    let (_db2, owned) = informer(&dir, "children.redb", &children).await;
    let seen = Arc::new(Seen::default());
    let running = run(
        Controller::for_informer(primary).owns_informer(owned, Relation::new().controller_only()),
        &seen,
    );
    eventually("the initial reconciles", || seen.total() == 3).await;
    children.upsert_raw("c", &owned_by(&[("p3", false), ("p1", true)]), "{}");
    // Events reach the queue in order: once the marker's child is seen, c's was too.
    children.upsert_raw("m", &owned_by(&[("marker", true)]), "{}");
    eventually("the controlling owners", || {
        seen.count("p1") == 2 && seen.count("marker") == 2
    })
    .await;
    assert_eq!(seen.count("p3"), 1, "a non-controlling owner is not enqueued");
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_reconciles_what_the_mapper_names_before_and_after_a_change() {
    let (primaries, related) = (Fake::new(), Fake::new());
    for p in ["a", "b"] {
        primaries.upsert(p, "");
    }
    let dir = tempfile::tempdir().unwrap();
    let (_db1, primary) = informer(&dir, "primary.redb", &primaries).await;
    let (_db2, other) = informer(&dir, "related.redb", &related).await;
    // A related ConfigMap names its primary in `data.v`.
    let mapper = |cm: ConfigMap| {
        let v = cm.data.and_then(|d| d.get("v").cloned());
        v.map(|name| ObjectRef::<ConfigMap>::new(&name).within("ns"))
    };
    let seen = Arc::new(Seen::default());
    let running = run(
        Controller::for_informer(primary).watches_informer(other, mapper, Relation::new()),
        &seen,
    );
    eventually("the initial reconciles", || {
        seen.count("a") == 1 && seen.count("b") == 1
    })
    .await;
    related.upsert("r", "a");
    eventually("a through r", || seen.count("a") == 2).await;
    // r now points at b: a (old state) and b (new state).
    related.upsert("r", "b");
    eventually("both", || seen.count("a") == 3 && seen.count("b") == 2).await;
    related.delete_raw("r", "", r#"{"v":"b"}"#);
    eventually("b through the deleted r", || seen.count("b") == 3).await;
    // A mapper naming an object that does not exist: an item of the stream, as in kube.
    related.upsert("r2", "ghost");
    eventually("ObjectNotFound", || {
        seen.items()
            .iter()
            .any(|i| matches!(i, Err(e) if e.contains("ghost") && e.contains("not found")))
    })
    .await;
    running.stop().await;
}

fn generation(g: i64) -> String {
    format!(r#","generation":{g}"#)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn predicates_filter_updates_of_the_primary_and_of_related_objects() {
    let (primaries, related) = (Fake::new(), Fake::new());
    primaries.upsert_raw("a", &generation(1), r#"{"v":"1"}"#);
    primaries.upsert_raw("marker", &generation(1), "{}");
    let dir = tempfile::tempdir().unwrap();
    let (_db1, primary) = informer(&dir, "primary.redb", &primaries).await;
    let (_db2, other) = informer(&dir, "related.redb", &related).await;
    let mapper = |cm: ConfigMap| {
        let v = cm.data.and_then(|d| d.get("v").cloned());
        v.map(|name| ObjectRef::<ConfigMap>::new(&name).within("ns"))
    };
    let seen = Arc::new(Seen::default());
    let controller = Controller::for_informer(primary)
        .with_predicate(predicates::generation)
        .watches_informer(other, mapper, Relation::new().predicate(predicates::generation));
    let running = run(controller, &seen);
    eventually("the initial reconciles", || {
        seen.count("a") == 1 && seen.count("marker") == 1
    })
    .await;
    // A status-like write (same generation), then a spec change of the marker; events reach the
    // queue in order, so once the marker is reconciled, a's update was seen.
    primaries.upsert_raw("a", &generation(1), r#"{"v":"2"}"#);
    primaries.upsert_raw("marker", &generation(2), "{}");
    eventually("the marker's spec change", || seen.count("marker") == 2).await;
    assert_eq!(seen.count("a"), 1, "an update with the same generation is filtered out");
    primaries.upsert_raw("a", &generation(2), r#"{"v":"2"}"#);
    eventually("a's spec change", || seen.count("a") == 2).await;

    // The related object's own predicate: its add passes, a same-generation update does not.
    related.upsert_raw("r", &generation(1), r#"{"v":"a"}"#);
    eventually("a through r's add", || seen.count("a") == 3).await;
    related.upsert_raw("r", &generation(1), r#"{"v":"a","x":"status"}"#);
    related.upsert_raw("r2", &generation(1), r#"{"v":"marker"}"#);
    eventually("the marker through r2", || seen.count("marker") == 3).await;
    assert_eq!(seen.count("a"), 3, "r's same-generation update is filtered out");
    related.upsert_raw("r", &generation(2), r#"{"v":"a"}"#);
    eventually("a through r's spec change", || seen.count("a") == 4).await;
    running.stop().await;
}

/// A reconcile that takes `ms` and records how many ran at once.
fn slow(
    ms: u64,
) -> impl Fn(Arc<ConfigMap>, Arc<Seen>) -> futures::future::BoxFuture<'static, Result<Action, Fail>> + Send + Sync {
    move |cm, seen| {
        Box::pin(async move {
            seen.started.lock().unwrap().push((name_of(&cm), Instant::now()));
            {
                let mut f = seen.in_flight.lock().unwrap();
                f.0 += 1;
                f.1 = f.1.max(f.0);
            }
            tokio::time::sleep(Duration::from_millis(ms)).await;
            seen.in_flight.lock().unwrap().0 -= 1;
            seen.finished.lock().unwrap().push(name_of(&cm));
            Ok(Action::await_change())
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_bounds_the_reconciles_in_flight_and_zero_means_no_bound() {
    let fake = Fake::new();
    for i in 0..8 {
        fake.upsert(&format!("o{i}"), "");
    }
    let dir = tempfile::tempdir().unwrap();
    let (_db, primary) = informer(&dir, "db.redb", &fake).await;
    for (concurrency, want) in [(2_u16, 2_usize), (0, 8)] {
        let seen = Arc::new(Seen::default());
        let controller = Controller::for_informer(primary.clone())
            .name(&format!("concurrency-{concurrency}"))
            .with_config(Config::default().concurrency(concurrency));
        let running = run_with(controller, &seen, slow(300), default_error_policy);
        eventually("every object", || seen.finished.lock().unwrap().len() == 8).await;
        let peak = seen.in_flight.lock().unwrap().1;
        assert_eq!(peak, want, "concurrency {concurrency}");
        running.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_on_and_reconcile_all_on_enqueue_from_outside() {
    let fake = Fake::new();
    for p in ["a", "b", "c"] {
        fake.upsert(p, "");
    }
    let dir = tempfile::tempdir().unwrap();
    let (_db, primary) = informer(&dir, "db.redb", &fake).await;
    let (one_tx, one_rx) = futures::channel::mpsc::unbounded::<ObjectRef<ConfigMap>>();
    let (all_tx, all_rx) = futures::channel::mpsc::unbounded::<()>();
    let seen = Arc::new(Seen::default());
    let controller = Controller::for_informer(primary)
        .reconcile_on(one_rx)
        .reconcile_all_on(all_rx);
    let running = run(controller, &seen);
    eventually("the initial reconciles", || seen.total() == 3).await;
    one_tx.unbounded_send(ObjectRef::new("b").within("ns")).unwrap();
    eventually("b on demand", || seen.count("b") == 2).await;
    assert_eq!((seen.count("a"), seen.count("c")), (1, 1));
    all_tx.unbounded_send(()).unwrap();
    eventually("all on demand", || {
        ["a", "b", "c"].iter().all(|n| seen.count(n) >= 2) && seen.count("b") == 3
    })
    .await;
    one_tx.unbounded_send(ObjectRef::new("ghost").within("ns")).unwrap();
    eventually("ObjectNotFound for a missing object", || {
        seen.items().iter().any(|i| matches!(i, Err(e) if e.contains("ghost")))
    })
    .await;
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_lets_reconciles_in_flight_finish_and_starts_no_more() {
    let fake = Fake::new();
    for p in ["a", "b", "c"] {
        fake.upsert(p, "");
    }
    let dir = tempfile::tempdir().unwrap();
    let (_db, primary) = informer(&dir, "db.redb", &fake).await;
    let seen = Arc::new(Seen::default());
    let controller = Controller::for_informer(primary).with_config(Config::default().concurrency(1));
    let running = run_with(controller, &seen, slow(1000), default_error_policy);
    eventually("the first reconcile started", || seen.total() == 1).await;
    let started = Instant::now();
    running.stop().await;
    assert!(
        started.elapsed() >= Duration::from_millis(500),
        "the stream waited for the reconcile"
    );
    assert_eq!(
        seen.finished.lock().unwrap().len(),
        1,
        "the reconcile in flight finished"
    );
    assert_eq!(seen.total(), 1, "no reconcile started after the shutdown");
    let items = seen.items();
    assert_eq!(items.len(), 1, "its result is on the stream: {items:?}");
    assert!(items[0].is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_action_kubes_finalizer_returns_is_honoured() {
    use kube::runtime::finalizer::{finalizer, Event as Finalizer};
    let fake = Fake::new();
    // The finalizer is there already and no deletion is under way: finalizer() calls the
    // apply branch without a request to the server.
    fake.upsert_raw("a", r#","finalizers":["test.example.com/cleanup"]"#, "{}");
    let dir = tempfile::tempdir().unwrap();
    let (_db, primary) = informer(&dir, "db.redb", &fake).await;
    let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
    let api: kube::Api<ConfigMap> = kube::Api::namespaced(kube::Client::try_from(config).unwrap(), "ns");
    let api = Arc::new(api);
    let reconcile = move |cm: Arc<ConfigMap>, seen: Arc<Seen>| {
        let api = api.clone();
        async move {
            finalizer(&api, "test.example.com/cleanup", cm, |ev| async move {
                match ev {
                    Finalizer::Apply(cm) => {
                        seen.started.lock().unwrap().push((name_of(&cm), Instant::now()));
                        Ok::<_, Fail>(Action::requeue(Duration::from_millis(300)))
                    }
                    Finalizer::Cleanup(_) => Ok(Action::await_change()),
                }
            })
            .await
            .map_err(|e| Fail(e.to_string()))
        }
    };
    let seen = Arc::new(Seen::default());
    let running = run_with(
        Controller::for_informer(primary),
        &seen,
        reconcile,
        default_error_policy,
    );
    eventually("three reconciles", || seen.count("a") >= 3).await;
    let times: Vec<Instant> = seen.started.lock().unwrap().iter().map(|(_, t)| *t).collect();
    for w in times.windows(2) {
        assert!(
            w[1] - w[0] >= Duration::from_millis(290),
            "requeued after 300 ms: {:?}",
            w[1] - w[0]
        );
    }
    let items = seen.items();
    assert_eq!(items[0], Ok(("a".into(), Action::requeue(Duration::from_millis(300)))));
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_and_panics_are_stream_items_and_the_error_policy_decides_the_retry() {
    let fake = Fake::new();
    fake.upsert("flaky", "");
    fake.upsert("fragile", "");
    let dir = tempfile::tempdir().unwrap();
    let (_db, primary) = informer(&dir, "db.redb", &fake).await;
    let policy: Arc<Mutex<Vec<String>>> = Arc::default();
    let p = policy.clone();
    let reconcile = |cm: Arc<ConfigMap>, seen: Arc<Seen>| async move {
        let name = name_of(&cm);
        let first = {
            let mut s = seen.started.lock().unwrap();
            s.push((name.clone(), Instant::now()));
            s.iter().filter(|(n, _)| *n == name).count() == 1
        };
        match (name.as_str(), first) {
            ("flaky", true) => Err(Fail("flaky fails once".into())),
            ("fragile", true) => panic!("fragile breaks once"),
            _ => Ok(Action::await_change()),
        }
    };
    let error_policy = move |cm: Arc<ConfigMap>, e: &Fail, _seen: Arc<Seen>| {
        p.lock().unwrap().push(format!("{}: {e}", name_of(&cm)));
        Action::requeue(Duration::from_millis(200))
    };
    let seen = Arc::new(Seen::default());
    let running = run_with(
        Controller::for_informer(primary).name("flaky-controller"),
        &seen,
        reconcile,
        error_policy,
    );
    eventually("both retried", || {
        seen.count("flaky") == 2 && seen.count("fragile") == 2
    })
    .await;
    eventually("four items", || seen.items().len() == 4).await;
    let items = seen.items();
    let has = |f: &dyn Fn(&Outcome) -> bool| items.iter().any(f);
    assert!(
        has(&|i| matches!(i, Err(e) if e.contains("flaky fails once") && e.contains("flaky"))),
        "{items:?}"
    );
    assert!(
        has(&|i| matches!(i, Err(e) if e.contains("panicked") && e.contains("fragile breaks once"))),
        "{items:?}"
    );
    assert!(
        has(&|i| *i == Ok(("flaky".into(), Action::await_change()))),
        "{items:?}"
    );
    assert!(
        has(&|i| *i == Ok(("fragile".into(), Action::await_change()))),
        "{items:?}"
    );
    assert_eq!(
        *policy.lock().unwrap(),
        ["flaky: flaky fails once"],
        "a panic is not the reconcile's error"
    );
    // The controller's metrics, under its name (its queue's while it runs).
    #[cfg(feature = "metrics")]
    let text = durable_informer::metrics::encode();
    running.stop().await;
    #[cfg(feature = "metrics")]
    for want in [
        r#"durable_informer_reconcile_total{controller="flaky-controller",result="error"} 1"#,
        r#"durable_informer_reconcile_total{controller="flaky-controller",result="panic"} 1"#,
        r#"durable_informer_reconcile_total{controller="flaky-controller",result="success"} 2"#,
        r#"workqueue_adds_total{name="flaky-controller",controller="flaky-controller"}"#,
    ] {
        assert!(text.contains(want), "{want} in\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletions_reach_reconcile_only_while_a_finalizer_holds_the_object() {
    let fake = Fake::new();
    fake.upsert("plain", "");
    fake.upsert_raw("held", r#","finalizers":["x/y"]"#, "{}");
    let dir = tempfile::tempdir().unwrap();
    let (_db, primary) = informer(&dir, "db.redb", &fake).await;
    let seen = Arc::new(Seen::default());
    let running = run(Controller::for_informer(primary), &seen);
    eventually("the initial reconciles", || seen.total() == 2).await;
    fake.delete("plain");
    // A deletion held by a finalizer: an update with a deletionTimestamp.
    fake.upsert_raw(
        "held",
        r#","finalizers":["x/y"],"deletionTimestamp":"2026-01-01T00:00:00Z""#,
        "{}",
    );
    eventually("the deletion under way", || seen.count("held") == 2).await;
    assert_eq!(seen.count("plain"), 1, "a deleted object is not reconciled");
    assert!(
        seen.items().iter().all(Result::is_ok),
        "and no ObjectNotFound for it: {:?}",
        seen.items()
    );
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_delete_hook_sees_the_last_state_also_of_deletions_made_while_stopped() {
    let fake = Fake::new();
    fake.upsert("a", "1");
    fake.upsert("b", "1");
    let dir = tempfile::tempdir().unwrap();
    let deleted: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let hook = |deleted: Arc<Mutex<Vec<(String, String)>>>| {
        move |cm: Arc<ConfigMap>| {
            let deleted = deleted.clone();
            async move {
                let v = cm.data.as_ref().and_then(|d| d.get("v").cloned()).unwrap_or_default();
                deleted.lock().unwrap().push((name_of(&cm), v));
                Ok::<(), Fail>(())
            }
        }
    };
    {
        let (db, primary) = informer(&dir, "db.redb", &fake).await;
        let seen = Arc::new(Seen::default());
        let running = run(
            Controller::for_informer(primary.clone()).on_delete(hook(deleted.clone())),
            &seen,
        );
        eventually("the initial reconciles", || seen.total() == 2).await;
        fake.delete_raw("a", "", r#"{"v":"last"}"#);
        eventually("a's hook", || deleted.lock().unwrap().len() == 1).await;
        assert_eq!(deleted.lock().unwrap()[0], ("a".into(), "last".into()));
        assert_eq!(seen.count("a"), 1, "reconcile never sees the deletion");
        running.stop().await;
        let items = seen.items();
        assert!(
            items.iter().all(Result::is_ok),
            "no ObjectNotFound after the hook: {items:?}"
        );
        primary.shutdown().await.unwrap();
        drop(primary);
        db.close().unwrap();
    }
    // Deleted while no controller runs: the durable handler delivers it at the next start.
    fake.delete_raw("b", "", r#"{"v":"final"}"#);
    let (_db, primary) = informer(&dir, "db.redb", &fake).await;
    let seen = Arc::new(Seen::default());
    let running = run(
        Controller::for_informer(primary).on_delete(hook(deleted.clone())),
        &seen,
    );
    eventually("b's hook after the restart", || deleted.lock().unwrap().len() == 2).await;
    assert_eq!(deleted.lock().unwrap()[1], ("b".into(), "final".into()));
    assert_eq!(deleted.lock().unwrap().len(), 2, "a's deletion is not delivered twice");
    running.stop().await;
}

/// The delete hook's calls by name; the hook of `hold` waits until `gate` opens and notes
/// when it started.
#[derive(Default)]
struct Hooks {
    told: Mutex<Vec<String>>,
    holding: std::sync::atomic::AtomicBool,
    gate: tokio::sync::Notify,
}

impl Hooks {
    fn times(&self, name: &str) -> usize {
        self.told.lock().unwrap().iter().filter(|n| *n == name).count()
    }

    fn hook(
        self: &Arc<Self>,
        hold: &'static str,
    ) -> impl Fn(Arc<ConfigMap>) -> futures::future::BoxFuture<'static, Result<(), Fail>> {
        let hooks = self.clone();
        move |cm: Arc<ConfigMap>| {
            let hooks = hooks.clone();
            Box::pin(async move {
                let name = name_of(&cm);
                if name == hold {
                    let open = hooks.gate.notified();
                    hooks.holding.store(true, std::sync::atomic::Ordering::SeqCst);
                    open.await;
                }
                hooks.told.lock().unwrap().push(name);
                Ok(())
            })
        }
    }
}

/// Deletions made while no controller ran reach the durable handler together; a graceful
/// shutdown while the hook of one of them runs (a later one already waiting for its turn)
/// must end the stream, and across the restart each deletion is told to the hook once: none
/// lost, none told again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletes_around_a_graceful_shutdown_are_told_once_across_a_restart() {
    let fake = Fake::new();
    for name in ["keep", "x", "y", "z"] {
        fake.upsert(name, "1");
    }
    let dir = tempfile::tempdir().unwrap();
    let hooks = Arc::new(Hooks::default());
    let controller = |primary: Informer<ConfigMap>, hooks: &Arc<Hooks>| {
        Controller::for_informer(primary)
            .with_config(Config::default().concurrency(1))
            .on_delete(hooks.hook("y"))
    };
    {
        let (db, primary) = informer(&dir, "db.redb", &fake).await;
        let seen = Arc::new(Seen::default());
        let running = run(controller(primary.clone(), &hooks), &seen);
        eventually("the initial reconciles", || seen.total() == 4).await;
        running.stop().await;
        primary.shutdown().await.unwrap();
        drop(primary);
        db.close().unwrap();
    }
    for name in ["x", "y", "z"] {
        fake.delete(name);
    }
    {
        let (db, primary) = informer(&dir, "db.redb", &fake).await;
        let seen = Arc::new(Seen::default());
        let running = run(controller(primary.clone(), &hooks), &seen);
        eventually("y's hook started", || {
            hooks.holding.load(std::sync::atomic::Ordering::SeqCst)
        })
        .await;
        assert_eq!(hooks.times("x"), 1, "x's hook ran before y's");
        // Shut down while y's hook runs, then let it finish.
        let Running { stop, task } = running;
        let _ = stop.map(|s| s.send(()));
        tokio::time::sleep(Duration::from_millis(50)).await;
        hooks.gate.notify_one();
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("the stream ends after a graceful shutdown, with a deletion waiting for its hook")
            .unwrap();
        primary.shutdown().await.unwrap();
        drop(primary);
        db.close().unwrap();
    }
    let (_db, primary) = informer(&dir, "db.redb", &fake).await;
    let seen = Arc::new(Seen::default());
    let running = run(controller(primary, &hooks), &seen);
    eventually("z's hook after the restart", || hooks.times("z") >= 1).await;
    // Time for a deletion told again to arrive.
    tokio::time::sleep(Duration::from_millis(500)).await;
    running.stop().await;
    let told = hooks.told.lock().unwrap().clone();
    for name in ["x", "y", "z"] {
        assert_eq!(hooks.times(name), 1, "{name} told once: {told:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_that_never_syncs_ends_the_stream_with_an_error_and_no_reconcile() {
    let fake = Fake::new();
    fake.upsert("a", "");
    let dir = tempfile::tempdir().unwrap();
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
    let seen = Arc::new(Seen::default());
    let items: Vec<_> = tokio::time::timeout(
        Duration::from_secs(20),
        Controller::for_informer(primary)
            .run(note, default_error_policy, seen.clone())
            .collect::<Vec<_>>(),
    )
    .await
    .expect("the stream ends instead of waiting for ever");
    assert_eq!(items.len(), 1);
    let Err(e @ Error::Informer(_)) = &items[0] else {
        panic!("{:?}", items[0].as_ref().map(|(r, _)| r.to_string()))
    };
    assert!(e.to_string().contains("another"), "{e}");
    assert_eq!(seen.total(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requeue_rate_limited_backs_off_per_object() {
    let fake = Fake::new();
    fake.upsert("a", "");
    let dir = tempfile::tempdir().unwrap();
    let (_db, primary) = informer(&dir, "db.redb", &fake).await;
    let reconcile = |cm: Arc<ConfigMap>, seen: Arc<Seen>| async move {
        let n = {
            let mut s = seen.started.lock().unwrap();
            s.push((name_of(&cm), Instant::now()));
            s.len()
        };
        Ok(if n < 6 {
            requeue_rate_limited()
        } else {
            Action::await_change()
        })
    };
    let seen = Arc::new(Seen::default());
    let running = run_with(
        Controller::for_informer(primary),
        &seen,
        reconcile,
        default_error_policy,
    );
    eventually("six reconciles", || seen.total() == 6).await;
    let times: Vec<Instant> = seen.started.lock().unwrap().iter().map(|(_, t)| *t).collect();
    let gaps: Vec<Duration> = times.windows(2).map(|w| w[1] - w[0]).collect();
    // 5, 10, 20, 40, 80 ms: client-go's per-item exponential limiter.
    for (gap, want) in gaps.iter().zip([5_u64, 10, 20, 40, 80]) {
        assert!(*gap >= Duration::from_millis(want), "{gaps:?}");
    }
    running.stop().await;
}

/// Records the spans opened, with their fields.
#[derive(Clone, Default)]
struct Spans(Arc<Mutex<Vec<SpanSeen>>>);

/// A span's name and fields.
type SpanSeen = (String, HashMap<String, String>);

struct Fields<'a>(&'a mut HashMap<String, String>);

impl tracing::field::Visit for Fields<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Spans {
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        _id: &tracing::span::Id,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut fields = HashMap::new();
        attrs.record(&mut Fields(&mut fields));
        self.0
            .lock()
            .unwrap()
            .push((attrs.metadata().name().to_owned(), fields));
    }
}

// The process's default subscriber, not a thread's: with one thread-local subscriber alone,
// tracing caches a callsite first hit on another test's thread as disabled everywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_reconcile_runs_in_kubes_span_under_the_controllers_name() {
    use tracing_subscriber::layer::SubscriberExt;
    static SPANS: std::sync::OnceLock<Spans> = std::sync::OnceLock::new();
    let spans = SPANS.get_or_init(|| {
        let spans = Spans::default();
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(spans.clone()))
            .expect("no other test sets the global subscriber");
        spans
    });
    let fake = Fake::new();
    fake.upsert("spanned-a", "");
    let dir = tempfile::tempdir().unwrap();
    let (_db, primary) = informer(&dir, "db.redb", &fake).await;
    let seen = Arc::new(Seen::default());
    let running = run(Controller::for_informer(primary).name("spanned"), &seen);
    eventually("spanned-a", || seen.count("spanned-a") == 1).await;
    running.stop().await;
    // Other tests' spans are recorded too: this test's are told by their names.
    let spans = spans.0.lock().unwrap().clone();
    assert!(
        spans
            .iter()
            .any(|(n, f)| n == "controller" && f.get("controller").map(String::as_str) == Some("spanned")),
        "a controller span"
    );
    let rec = spans
        .iter()
        .find(|(n, f)| {
            n == "reconciling object" && f.get("object.ref").map(String::as_str) == Some("ConfigMap.v1./spanned-a.ns")
        })
        .expect("a reconcile span");
    assert_eq!(rec.1.get("object.reason").map(String::as_str), Some("object updated"));
}
