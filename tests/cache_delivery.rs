//! The informer's cache as volatile handlers meet it after a restart (issue #33's delivery
//! path): a cache that tells volatile handlers loads the objects' JSON within its budget, so
//! their initial adds and each update's previous state are not read back from redb one by
//! one; a cache with a budget of 0 reads them back, and tells the same events.

mod common;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::fake::Fake;
use durable_informer::informer::{async_handler_fn, Event, HandlerOptions, Informer};
use durable_informer::store::{DurableStore, StoreConfig};
use k8s_openapi::api::core::v1::ConfigMap;
use tokio::sync::Semaphore;

type Seen = Arc<Mutex<Vec<String>>>;

const OBJECTS: usize = 20;

fn describe(ev: &Event<ConfigMap>) -> String {
    let name = |c: &ConfigMap| c.metadata.name.clone().unwrap_or_default();
    let val = |c: &ConfigMap| c.data.as_ref().and_then(|d| d.get("v").cloned()).unwrap_or_default();
    match ev {
        Event::Add { object, initial } => format!("add {} {} {initial}", name(object), val(object)),
        Event::Update { old, new, .. } => format!("update {} {}->{}", name(new), val(old), val(new)),
        Event::Delete { object, .. } => format!("delete {}", name(object)),
    }
}

async fn informer(db: &DurableStore, fake: &Fake, budget: Option<usize>) -> Informer<ConfigMap> {
    let mut b = Informer::<ConfigMap>::builder(db, fake.clone());
    if let Some(bytes) = budget {
        b = b.object_cache_bytes(bytes);
    }
    b.build().await.unwrap()
}

/// Syncs `OBJECTS` objects into a new database at `path` and closes it.
async fn first_run(path: &Path, fake: &Fake) {
    for i in 0..OBJECTS {
        fake.upsert(&format!("o{i:02}"), "1");
    }
    let db = DurableStore::open(StoreConfig::new(path)).unwrap();
    let inf = informer(&db, fake, None).await;
    inf.start();
    inf.wait_for_sync().await.unwrap();
    inf.shutdown().await.unwrap();
    drop(inf);
    db.close().unwrap();
}

async fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..1000 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}

/// Reopens the database with a volatile handler held at its first event until the cache has
/// loaded; returns the cache's JSON count then, and every event told once released, after
/// one more update of `o03`.
async fn restart_with_handler(path: &Path, fake: &Fake, budget: Option<usize>) -> (usize, Vec<String>) {
    let db = DurableStore::open(StoreConfig::new(path)).unwrap();
    let inf = informer(&db, fake, budget).await;
    let gate = Arc::new(Semaphore::new(0));
    let seen = Seen::default();
    let (g, s) = (gate.clone(), seen.clone());
    let reg = inf.add_event_handler(
        async_handler_fn(move |ev: Event<ConfigMap>| {
            let (g, s) = (g.clone(), s.clone());
            async move {
                g.acquire().await.expect("gate open").forget();
                s.lock().unwrap().push(describe(&ev));
                Ok::<(), std::convert::Infallible>(())
            }
        }),
        HandlerOptions::volatile(),
    );
    inf.start();
    inf.wait_for_sync().await.unwrap();
    wait_for("the cache to load", || inf.cache_stats().loaded).await;
    let stats = inf.cache_stats();
    assert_eq!(stats.objects, OBJECTS);
    gate.add_permits(OBJECTS + 1);
    reg.wait_for_sync().await.unwrap();
    fake.upsert("o03", "2");
    wait_for("the update", || seen.lock().unwrap().len() > OBJECTS).await;
    inf.shutdown().await.unwrap();
    drop(inf);
    db.close().unwrap();
    let seen = seen.lock().unwrap().clone();
    (stats.with_json, seen)
}

fn expected() -> Vec<String> {
    let mut want: Vec<String> = (0..OBJECTS).map(|i| format!("add o{i:02} 1 true")).collect();
    want.push("update o03 1->2".into());
    want
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_cache_loads_the_json_its_volatile_handlers_need() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db.redb");
    let fake = Fake::new();
    first_run(&path, &fake).await;
    let (with_json, seen) = restart_with_handler(&path, &fake, None).await;
    // The handler was held at its first event: nothing was read back one by one yet.
    assert_eq!(with_json, OBJECTS, "every object's JSON loaded with the cache");
    let mut sorted = seen.clone();
    sorted[..OBJECTS].sort();
    assert_eq!(sorted, expected());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_budget_the_handler_is_told_the_same_from_redb() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db.redb");
    let fake = Fake::new();
    first_run(&path, &fake).await;
    let (with_json, seen) = restart_with_handler(&path, &fake, Some(0)).await;
    assert_eq!(with_json, 0, "a budget of 0 holds no JSON");
    let mut sorted = seen.clone();
    sorted[..OBJECTS].sort();
    assert_eq!(sorted, expected(), "the update's previous state read back from redb");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_cache_read_by_listers_alone_loads_no_json() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db.redb");
    let fake = Fake::new();
    first_run(&path, &fake).await;
    let db = DurableStore::open(StoreConfig::new(&path)).unwrap();
    let inf = informer(&db, &fake, None).await;
    let lister = inf.lister();
    inf.start();
    inf.wait_for_sync().await.unwrap();
    wait_for("the cache to load", || inf.cache_stats().loaded).await;
    assert_eq!(inf.cache_stats().with_json, 0, "a restart without handlers stays small");
    let got = lister.namespace("ns").get("o05").unwrap().expect("read from redb");
    assert_eq!(
        got.data.as_ref().and_then(|d| d.get("v")).map(String::as_str),
        Some("1")
    );
    inf.shutdown().await.unwrap();
}
