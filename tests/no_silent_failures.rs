//! Failures that used to go unnoticed (issue #36): a store dropped under live informers, a
//! compatibility stream over a store that cannot be read, a process's object caches sharing
//! one memory budget.

mod common;

use std::time::Duration;

use common::fake::Fake;
use durable_informer::informer::{watcher_stream, Informer};
use durable_informer::object::ObjectKey;
use durable_informer::store::{DurableStore, StoreConfig, StoreError};
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
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let reopened = loop {
        let p = path.clone();
        match tokio::task::spawn_blocking(move || DurableStore::open(StoreConfig::new(p)))
            .await
            .unwrap()
        {
            Ok(db) => break db,
            Err(StoreError::Locked { .. }) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("reopening after the last informer was dropped: {e}"),
        }
    };
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
