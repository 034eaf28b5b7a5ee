//! The exposition's shape across informers and queues: one series per label set, names that
//! do not carry paths, series removed with their handler. A binary of its own: the registry is
//! process-wide, and `informer_metrics` counts exact values.

mod common;

use std::sync::Arc;

use common::fake::Fake;
use common::metrics_text::{eventually, sample};
use durable_informer::informer::{async_handler_fn, Event, HandlerOptions, Informer};
use durable_informer::store::{DurableStore, StoreConfig};
use k8s_openapi::api::core::v1::ConfigMap;

/// Every series of the exposition: (name, sorted labels) → how often it appears.
fn series(text: &str) -> std::collections::BTreeMap<String, usize> {
    let mut seen = std::collections::BTreeMap::new();
    for l in text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let (s, _) = l.rsplit_once(' ').unwrap_or((l, ""));
        *seen.entry(s.to_owned()).or_insert(0) += 1;
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unnamed_handlers_same_named_queues_and_database_names_give_valid_distinct_series() {
    let fake = Fake::new();
    fake.upsert("a", "1");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("named.redb");
    let db = DurableStore::open(StoreConfig::new(&path)).unwrap();
    let inf = Informer::<ConfigMap>::builder(&db, fake.clone()).build().await.unwrap();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    // Two unnamed handlers, both stuck: each has a lag series of its own.
    let regs: Vec<_> = (0..2)
        .map(|_| {
            let g = gate.clone();
            inf.add_event_handler(
                async_handler_fn(move |_: Event<ConfigMap>| {
                    let g = g.clone();
                    async move {
                        g.acquire().await.map(|p| p.forget()).ok();
                        Ok::<(), std::convert::Infallible>(())
                    }
                }),
                HandlerOptions::default(),
            )
        })
        .collect();
    inf.start();
    inf.wait_for_sync().await.expect("cache synced");
    eventually("two unnamed handlers have two lag series", |t| {
        t.lines()
            .filter(|l| l.starts_with("durable_informer_handler_lag_entries{") && l.contains("handler=\"volatile-"))
            .count()
            >= 2
    })
    .await;

    // Two queues of one name (two controllers left unnamed alike): one series per name.
    let q1 = durable_informer::queue::WorkQueue::<String>::builder()
        .name("twin")
        .build();
    let q2 = durable_informer::queue::WorkQueue::<String>::builder()
        .name("twin")
        .build();
    q1.add("x".to_owned());
    q2.add("y".to_owned());
    q2.add("z".to_owned());
    let text = durable_informer::metrics::encode();
    let twin = [("name", "twin"), ("controller", "twin")];
    assert_eq!(sample(&text, "workqueue_adds_total", &twin), Some(3.0), "{text}");
    assert_eq!(sample(&text, "workqueue_depth", &twin), Some(3.0), "{text}");

    // The database is named by its file, not its directory.
    eventually("database_bytes is labelled with the file's name", |t| {
        sample(t, "durable_informer_database_bytes", &[("database", "named.redb")]).is_some()
    })
    .await;
    let text = durable_informer::metrics::encode();
    assert!(!text.contains(&dir.path().display().to_string()), "{text}");
    let dupes: Vec<_> = series(&text).into_iter().filter(|(_, n)| *n > 1).collect();
    assert!(dupes.is_empty(), "duplicate series {dupes:?}\n{text}");

    // A handler that is gone leaves no series.
    gate.add_permits(1000);
    for r in regs {
        r.remove().await;
    }
    inf.shutdown().await.unwrap();
    eventually("stopped handlers' lag series are removed", |t| {
        !t.contains("handler=\"volatile-")
    })
    .await;
}
