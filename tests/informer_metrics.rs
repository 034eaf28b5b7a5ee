//! The metric values an informer produces, read back from the Prometheus text exposition. In a
//! test binary of its own: the registry is process-wide, and no other informer may move it.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::fake::Fake;
use common::metrics_text::{eventually, sample};
use durable_informer::informer::{async_handler_fn, Event, HandlerOptions, Informer};
use durable_informer::store::{DurableStore, StoreConfig};
use k8s_openapi::api::core::v1::ConfigMap;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_informer_reports_events_lists_commits_lag_and_database_size() {
    let fake = Fake::new();
    for n in ["a", "b", "c"] {
        fake.upsert(n, "1");
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db.redb");
    let db = DurableStore::open(StoreConfig::new(&path)).unwrap();
    let inf = Informer::<ConfigMap>::builder(&db, fake.clone()).build().await.unwrap();
    // The handler blocks in its first callback until the gate opens.
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let blocked = Arc::new(AtomicBool::new(false));
    let (g, b) = (gate.clone(), blocked.clone());
    let reg = inf.add_event_handler(
        async_handler_fn(move |_: Event<ConfigMap>| {
            let (g, b) = (g.clone(), b.clone());
            async move {
                b.store(true, Ordering::SeqCst);
                g.acquire().await.map(|p| p.forget()).ok();
                Ok::<(), std::convert::Infallible>(())
            }
        }),
        HandlerOptions::durable("stuck"),
    );
    inf.start();
    inf.wait_for_sync().await.expect("cache synced");
    for i in 0..5 {
        fake.upsert(&format!("n{i}"), "1");
    }
    let committed = db.writer().committed();
    for _ in 0..500 {
        if inf.store().list_keys().unwrap().len() == 8 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(blocked.load(Ordering::SeqCst));
    let stuck = [("resource", "configmaps"), ("handler", "stuck")];
    // Stuck in its first callback, the handler has handled nothing: its lag is everything
    // committed, and follows new commits.
    let last = committed.borrow().0;
    assert!(last >= 8, "{last} entries");
    eventually("the stuck handler's lag equals the log length", |t| {
        sample(t, "durable_informer_handler_lag_entries", &stuck) == Some(last as f64)
    })
    .await;
    assert_eq!(reg.cursor().0, 0);
    gate.add_permits(1000);
    eventually("the lag drops to 0 once the handler caught up", |t| {
        sample(t, "durable_informer_handler_lag_entries", &stuck) == Some(0.0)
    })
    .await;

    let text = durable_informer::metrics::encode();
    let cms = [("resource", "configmaps")];
    let added = sample(
        &text,
        "durable_informer_events_total",
        &[("resource", "configmaps"), ("kind", "ADDED")],
    );
    assert_eq!(added, Some(5.0), "the watch brought 5 adds\n{text}");
    let initial = sample(
        &text,
        "durable_informer_lists_total",
        &[("resource", "configmaps"), ("reason", "initial")],
    );
    assert_eq!(initial, Some(1.0), "{text}");
    assert!(
        sample(&text, "durable_informer_list_requests_total", &cms).is_some_and(|v| v >= 1.0),
        "{text}"
    );
    assert!(
        sample(&text, "durable_informer_watch_requests_total", &cms).is_some_and(|v| v >= 1.0),
        "{text}"
    );
    assert!(
        sample(&text, "durable_informer_commit_latency_seconds_count", &cms).is_some_and(|v| v >= 1.0),
        "{text}"
    );
    assert!(
        sample(&text, "durable_informer_batch_size_count", &cms).is_some_and(|v| v >= 1.0),
        "{text}"
    );

    // Idle, the writer publishes the file's size.
    let size = std::fs::metadata(&path).unwrap().len();
    assert!(size > 0);
    eventually("database_bytes equals the file size", |t| {
        sample(t, "durable_informer_database_bytes", &[]) == Some(size as f64)
    })
    .await;
    inf.shutdown().await.unwrap();
}
