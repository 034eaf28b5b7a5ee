//! Failures that used to go unnoticed (issue #36): a store dropped under live informers, a
//! compatibility stream over a store that cannot be read, a process's object caches sharing
//! one memory budget.

mod common;

use std::time::Duration;

use common::fake::Fake;
use durable_informer::informer::{watcher_stream, Informer};
use durable_informer::object::ObjectKey;
use durable_informer::store::{DurableStore, StoreConfig};
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;

async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_store_under_a_live_informer_keeps_its_writes_going() {
    let fake = Fake::new();
    fake.upsert("a", "1");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db.redb");
    let db = DurableStore::open(StoreConfig::new(&path)).unwrap();
    let inf = Informer::<ConfigMap>::builder(&db, fake.clone()).build().await.unwrap();
    inf.start();
    inf.wait_for_sync().await.unwrap();
    drop(db);
    // The informer still writes what the server sends.
    fake.upsert("b", "2");
    let lister = inf.lister();
    eventually("b is written after the store was dropped", || {
        matches!(lister.get_by_key(&ObjectKey::namespaced("ns", "b")), Ok(Some(_)))
    })
    .await;
    let store = inf.store();
    eventually("b is in the database, not only in the cache", || {
        matches!(store.get(&ObjectKey::namespaced("ns", "b")), Ok(Some(_)))
    })
    .await;
    drop(store);
    // The last informer gone, the writer stops and the file is free again.
    inf.shutdown().await.unwrap();
    drop(lister);
    drop(inf);
    // At once: the open waits for the writer's last commit on the closing thread.
    let reopened = tokio::task::spawn_blocking(move || DurableStore::open(StoreConfig::new(path)))
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("reopening after the last informer was dropped: {e}"));
    let scopes = reopened.scopes().unwrap();
    let store = reopened.store(scopes[0].0);
    assert!(store.get(&ObjectKey::namespaced("ns", "b")).unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watcher_stream_yields_store_errors_as_items() {
    let fake = Fake::new();
    fake.upsert("a", "1");
    let dir = tempfile::tempdir().unwrap();
    let db = DurableStore::open(StoreConfig::new(dir.path().join("db.redb"))).unwrap();
    let inf = Informer::<ConfigMap>::builder(&db, fake.clone()).build().await.unwrap();
    inf.start();
    inf.wait_for_sync().await.unwrap();
    // Closed on purpose: every read of the store fails from now on.
    tokio::task::spawn_blocking(move || db.close()).await.unwrap().unwrap();
    let mut stream = Box::pin(watcher_stream(&inf));
    for n in 0..2 {
        let item = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .unwrap_or_else(|_| panic!("item {n}: no item within 10 s"))
            .expect("the stream goes on");
        let err = item.expect_err("an error item, not an event");
        assert!(
            matches!(err, kube::runtime::watcher::Error::InitialListFailed(_)),
            "{err}"
        );
        assert!(err.to_string().contains("closed"), "names the cause: {err}");
    }
}

/// The aim of issue #36: a controller stopped while the log moved far past its retention
/// reconciles, on restart, every key deleted meanwhile. Its delete hook reads through a durable
/// handler (`<name>-deletes`) whose cursor holds compaction back, so nothing it has not seen
/// is compacted away however long it is stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_stopped_past_the_retention_window_hears_of_every_deletion() {
    use durable_informer::controller::{Action, Controller};
    use std::sync::{Arc, Mutex};
    let fake = Fake::new();
    for i in 0..6 {
        fake.upsert(&format!("o{i}"), "1");
    }
    let dir = tempfile::tempdir().unwrap();
    let db = DurableStore::open(StoreConfig::new(dir.path().join("db.redb")).retention_entries(Some(5))).unwrap();
    let inf = Informer::<ConfigMap>::builder(&db, fake.clone()).build().await.unwrap();
    let deleted: Arc<Mutex<Vec<String>>> = Arc::default();
    let reconciled: Arc<Mutex<usize>> = Arc::default();
    let start = |inf: Informer<ConfigMap>| {
        let (d, r) = (deleted.clone(), reconciled.clone());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let stream = Controller::for_informer(inf)
            .name("retention")
            .on_delete(move |cm: Arc<ConfigMap>| {
                let d = d.clone();
                async move {
                    d.lock().unwrap().push(cm.metadata.name.clone().unwrap_or_default());
                    Ok::<(), std::io::Error>(())
                }
            })
            .graceful_shutdown_on(async move {
                let _ = stopped.await;
            })
            .run(
                move |_: Arc<ConfigMap>, _: Arc<()>| {
                    *r.lock().unwrap() += 1;
                    async { Ok::<Action, std::io::Error>(Action::await_change()) }
                },
                |_, _, _| Action::await_change(),
                Arc::new(()),
            );
        (stop, tokio::spawn(stream.for_each(|_| async {})))
    };
    let (stop, task) = start(inf.clone());
    eventually("the initial reconciles", || *reconciled.lock().unwrap() >= 6).await;
    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .unwrap()
        .unwrap();

    // Stopped: three deletions, then far more changes than the retention keeps, compacted.
    for i in 0..3 {
        fake.delete(&format!("o{i}"));
    }
    for round in 0..20 {
        fake.upsert("o5", &round.to_string());
    }
    fake.upsert("marker", "1");
    let store = inf.store();
    eventually("the informer wrote every change", || {
        matches!(store.get(&ObjectKey::namespaced("ns", "marker")), Ok(Some(_)))
    })
    .await;
    db.writer().compact(Some(5)).await.unwrap();
    let (first, last) = db.log().bounds().unwrap().expect("a log");
    // More than the 5 entries retention keeps: the stopped controller's cursor holds them.
    assert!(
        last.0 - first.0 + 1 > 5,
        "the controller is behind the retention window: log {first:?}..={last:?}"
    );
    assert!(deleted.lock().unwrap().is_empty());

    let (stop, task) = start(inf.clone());
    eventually("every deletion made while stopped reaches the hook", || {
        let mut d = deleted.lock().unwrap().clone();
        d.sort();
        d == ["o0", "o1", "o2"]
    })
    .await;
    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .unwrap()
        .unwrap();
}
