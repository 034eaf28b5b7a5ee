//! The watch-stream property checker (`tests/common/stream_check.rs`) applied to informers with a
//! durable handler against the scripted fake server: the delivered sequence is ordered by RV per
//! key, has no duplicates and no gaps compared with the server's event list, and a stream resumed
//! after restarts equals an uninterrupted one. One uninterrupted stream is also ordered by RV across
//! keys.

mod common;
#[path = "common/stream_check.rs"]
mod stream_check;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::fake::Fake;
use durable_informer::informer::{handler_fn, Event, HandlerOptions, Informer};
use durable_informer::reflector::{BackoffConfig, ReflectorConfig};
use durable_informer::store::{DurableStore, StoreConfig};
use k8s_openapi::api::core::v1::ConfigMap;
use stream_check::{Ev, Kind, Opts};

type Seen = Arc<Mutex<Vec<Ev>>>;

fn cfg() -> ReflectorConfig {
    ReflectorConfig {
        page_size: 3,
        backoff: BackoffConfig {
            initial: Duration::from_millis(5),
            max: Duration::from_millis(50),
            ..BackoffConfig::default()
        },
        ..ReflectorConfig::default()
    }
}

fn ev_of(e: &Event<ConfigMap>) -> Ev {
    let (o, kind) = match e {
        Event::Add { object, .. } => (object, Kind::Add),
        Event::Update { new, .. } => (new, Kind::Update),
        Event::Delete { object, .. } => (object, Kind::Delete),
    };
    let key = format!(
        "{}/{}",
        o.metadata.namespace.clone().unwrap_or_default(),
        o.metadata.name.clone().unwrap_or_default()
    );
    let rv = o
        .metadata
        .resource_version
        .as_deref()
        .and_then(|r| r.parse().ok())
        .unwrap_or(0);
    Ev::new(key, rv, kind)
}

/// Drives the fake and records the server's event list as it goes.
struct Server {
    fake: Fake,
    events: Vec<Ev>,
    live: std::collections::BTreeSet<String>,
}

impl Server {
    fn new() -> Self {
        Self {
            fake: Fake::new(),
            events: Vec::new(),
            live: Default::default(),
        }
    }

    /// Step `i` of a deterministic script of creates, updates and deletes over 7 names.
    fn step(&mut self, i: u64) {
        let name = format!("c{}", (i * 5) % 7);
        if i % 4 == 3 && self.live.contains(&name) {
            self.fake.delete(&name);
            self.live.remove(&name);
            self.events
                .push(Ev::new(format!("ns/{name}"), self.fake.current_rv(), Kind::Delete));
        } else {
            let kind = if self.live.insert(name.clone()) {
                Kind::Add
            } else {
                Kind::Update
            };
            self.fake.upsert(&name, &i.to_string());
            self.events
                .push(Ev::new(format!("ns/{name}"), self.fake.current_rv(), kind));
        }
    }
}

async fn run_informer(db: &DurableStore, fake: &Fake, seen: &Seen) -> Informer<ConfigMap> {
    let inf = Informer::<ConfigMap>::builder(db, fake.clone())
        .reflector_config(cfg())
        .build()
        .await
        .unwrap();
    let s = seen.clone();
    inf.add_event_handler(
        handler_fn(move |e: Event<ConfigMap>| -> Result<(), std::convert::Infallible> {
            s.lock().unwrap().push(ev_of(&e));
            Ok(())
        }),
        HandlerOptions::durable("audit"),
    );
    inf.start();
    inf.wait_for_sync().await.expect("cache synced");
    inf
}

async fn wait_for(seen: &Seen, server: &Server) {
    for _ in 0..500 {
        let got = stream_check::dedup(&seen.lock().unwrap());
        if got.len() >= server.events.len() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[test]
fn the_checker_catches_reorders_duplicates_gaps_and_inventions() {
    stream_check::self_test();
}

/// An uninterrupted informer: ordered per key, no duplicates, no gaps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uninterrupted_stream_is_ordered_complete_and_duplicate_free() {
    let mut server = Server::new();
    let dir = tempfile::tempdir().unwrap();
    let db = DurableStore::open(StoreConfig::new(dir.path().join("db.redb"))).unwrap();
    let seen = Seen::default();
    let inf = run_informer(&db, &server.fake, &seen).await;
    for i in 0..60 {
        server.step(i);
        if i % 10 == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    wait_for(&seen, &server).await;
    inf.shutdown().await.unwrap();
    let got = seen.lock().unwrap().clone();
    stream_check::check(&got, &server.events, Opts::default()).unwrap();
    stream_check::check_globally_ordered(&got).unwrap();
}

/// The same script with three clean restarts (informer and store closed and reopened) equals,
/// after dropping at-least-once redeliveries, the uninterrupted stream; it is ordered and
/// complete, and without a crash it has no duplicates either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_resumed_after_restarts_equals_an_uninterrupted_one() {
    // Uninterrupted reference run.
    let mut reference = Server::new();
    let dir = tempfile::tempdir().unwrap();
    let db = DurableStore::open(StoreConfig::new(dir.path().join("ref.redb"))).unwrap();
    let seen_ref = Seen::default();
    let inf = run_informer(&db, &reference.fake, &seen_ref).await;
    for i in 0..80 {
        reference.step(i);
    }
    wait_for(&seen_ref, &reference).await;
    inf.shutdown().await.unwrap();
    db.close().unwrap();
    let uninterrupted = seen_ref.lock().unwrap().clone();
    stream_check::check(&uninterrupted, &reference.events, Opts::default()).unwrap();
    stream_check::check_globally_ordered(&uninterrupted).unwrap();

    // Restarted run: same script, the informer is down for parts of it.
    let mut server = Server::new();
    let path = dir.path().join("resumed.redb");
    let seen = Seen::default();
    // (steps while up, then steps while down: caught up on resume)
    for (from, up_to, down_to) in [(0u64, 20u64, 23u64), (23, 45, 48), (48, 60, 63), (63, 80, 80)] {
        let db = DurableStore::open(StoreConfig::new(&path)).unwrap();
        let inf = run_informer(&db, &server.fake, &seen).await;
        for i in from..up_to {
            server.step(i);
        }
        inf.shutdown().await.unwrap();
        db.close().unwrap();
        for i in up_to..down_to {
            server.step(i);
        }
    }
    assert_eq!(server.events, reference.events, "the two runs must see the same script");
    let db = DurableStore::open(StoreConfig::new(&path)).unwrap();
    let inf = run_informer(&db, &server.fake, &seen).await;
    wait_for(&seen, &server).await;
    inf.shutdown().await.unwrap();
    let resumed = seen.lock().unwrap().clone();
    // Clean shutdowns acknowledge everything delivered: no redelivery.
    stream_check::check(&resumed, &server.events, Opts::default()).unwrap();
    stream_check::assert_resumed_equals_uninterrupted(&resumed, &uninterrupted);
}
