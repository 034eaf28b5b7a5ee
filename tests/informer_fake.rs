//! Informers and handlers against the scripted in-memory server: exact event sequences,
//! durable cursors across restarts, late volatile handlers, removal, resync, listers, and the
//! kube-runtime adaptor.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::fake::Fake;
use durable_informer::informer::{handler_fn, watcher_stream, Event, Filtering, HandlerOptions, Informer};
use durable_informer::reflector::{BackoffConfig, ReflectorConfig};
use durable_informer::store::{DurableStore, StoreConfig};
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;

type Seen = Arc<Mutex<Vec<String>>>;

fn describe(ev: &Event<ConfigMap>) -> String {
    let name = |c: &ConfigMap| c.metadata.name.clone().unwrap_or_default();
    let val = |c: &ConfigMap| c.data.as_ref().and_then(|d| d.get("v").cloned()).unwrap_or_default();
    match ev {
        Event::Add { object, initial } => format!(
            "add {} {}{}",
            name(object),
            val(object),
            if *initial { " (initial)" } else { "" }
        ),
        Event::Update { old, new, resync } => {
            format!(
                "update {} {}->{}{}",
                name(new),
                val(old),
                val(new),
                if *resync { " (resync)" } else { "" }
            )
        }
        Event::Delete {
            object,
            final_state_unknown,
        } => {
            format!(
                "delete {}{}",
                name(object),
                if *final_state_unknown { " (unknown)" } else { "" }
            )
        }
    }
}

fn recorder(seen: &Seen) -> impl durable_informer::informer::EventHandler<ConfigMap> {
    let seen = seen.clone();
    handler_fn(move |ev: Event<ConfigMap>| -> Result<(), std::convert::Infallible> {
        seen.lock().unwrap().push(describe(&ev));
        Ok(())
    })
}

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

async fn informer(db: &DurableStore, fake: &Fake) -> Informer<ConfigMap> {
    Informer::<ConfigMap>::builder(db, fake.clone())
        .reflector_config(cfg())
        .indexer(durable_informer::store::Indexer::labels())
        .build()
        .await
        .unwrap()
}

/// A cluster of ConfigMaps `a` and `b` (value 1), a new database, and an informer not started.
async fn two_config_maps() -> (Fake, tempfile::TempDir, DurableStore, Informer<ConfigMap>) {
    let fake = Fake::new();
    fake.upsert("a", "1");
    fake.upsert("b", "1");
    let dir = tempfile::tempdir().unwrap();
    let db = DurableStore::open(StoreConfig::new(dir.path().join("db.redb"))).unwrap();
    let inf = informer(&db, &fake).await;
    (fake, dir, db, inf)
}

async fn wait_len(seen: &Seen, n: usize) -> Vec<String> {
    for _ in 0..500 {
        if seen.lock().unwrap().len() >= n {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let v = seen.lock().unwrap().clone();
    assert!(v.len() >= n, "only {} of {n} events: {v:?}", v.len());
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_receives_exactly_the_servers_event_sequence() {
    let (fake, _dir, _db, inf) = two_config_maps().await;
    let seen = Seen::default();
    let reg = inf.add_event_handler(recorder(&seen), HandlerOptions::volatile());
    inf.start();
    inf.wait_for_sync().await.expect("cache synced");
    reg.wait_for_sync().await.expect("handler synced");
    fake.upsert("a", "2");
    fake.upsert("c", "1");
    fake.delete("b");
    fake.upsert("a", "3");
    let got = wait_len(&seen, 6).await;
    assert_eq!(
        got,
        [
            "add a 1 (initial)",
            "add b 1 (initial)",
            "update a 1->2",
            "add c 1",
            "delete b",
            "update a 2->3"
        ]
    );
    inf.shutdown().await.unwrap();
}

/// Each watch event is decoded once per informer: every handler receives the same `Arc`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handlers_of_one_informer_share_each_decoded_event() {
    type Ptrs = Arc<Mutex<Vec<(String, usize, usize)>>>;
    fn pointers(into: &Ptrs) -> impl durable_informer::informer::EventHandler<ConfigMap> {
        let into = into.clone();
        handler_fn(move |ev: Event<ConfigMap>| -> Result<(), std::convert::Infallible> {
            let addr = |c: &Arc<ConfigMap>| Arc::as_ptr(c) as usize;
            if let Event::Update { old, new, .. } = &ev {
                into.lock().unwrap().push((describe(&ev), addr(old), addr(new)));
            }
            Ok(())
        })
    }
    let fake = Fake::new();
    fake.upsert("a", "1");
    let dir = tempfile::tempdir().unwrap();
    let db = DurableStore::open(StoreConfig::new(dir.path().join("db.redb"))).unwrap();
    let inf = informer(&db, &fake).await;
    let (first, second) = (Ptrs::default(), Ptrs::default());
    let regs = [
        inf.add_event_handler(pointers(&first), HandlerOptions::volatile()),
        inf.add_event_handler(pointers(&second), HandlerOptions::volatile()),
    ];
    inf.start();
    inf.wait_for_sync().await.expect("cache synced");
    for r in &regs {
        r.wait_for_sync().await.expect("handler synced");
    }
    fake.upsert("a", "2");
    fake.upsert("a", "3");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while (first.lock().unwrap().len() < 2 || second.lock().unwrap().len() < 2)
        && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (first, second) = (first.lock().unwrap().clone(), second.lock().unwrap().clone());
    assert_eq!(first.len(), 2, "{first:?}");
    assert_eq!(first, second, "both handlers got the very same old and new objects");
    assert_eq!(first[0].0, "update a 1->2");
    // The lister serves the handlers' object for the key's current state: no third decode.
    let listed = inf.lister().namespace("ns").get("a").unwrap().expect("stored");
    assert_eq!(
        Arc::as_ptr(&listed) as usize,
        first[1].2,
        "the lister got the handlers' Arc"
    );
    inf.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_handler_gets_what_was_committed_while_it_was_away() {
    let fake = Fake::new();
    fake.upsert("a", "1");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db.redb");
    {
        let db = DurableStore::open(StoreConfig::new(&path)).unwrap();
        let inf = informer(&db, &fake).await;
        let seen = Seen::default();
        inf.add_event_handler(recorder(&seen), HandlerOptions::durable("audit"));
        inf.start();
        inf.wait_for_sync().await.expect("cache synced");
        fake.upsert("b", "1");
        assert_eq!(wait_len(&seen, 2).await, ["add a 1 (initial)", "add b 1"]);
        inf.shutdown().await.unwrap();
        db.close().unwrap();
    }
    // Down: the cluster changes.
    fake.upsert("a", "2");
    fake.delete("b");
    let db = DurableStore::open(StoreConfig::new(&path)).unwrap();
    let inf = informer(&db, &fake).await;
    assert!(inf.is_restored());
    let seen = Seen::default();
    inf.add_event_handler(recorder(&seen), HandlerOptions::durable("audit"));
    inf.start();
    inf.wait_for_sync().await.expect("cache synced");
    // No initial adds for a durable handler with a cursor: exactly the missed changes.
    assert_eq!(wait_len(&seen, 2).await, ["update a 1->2", "delete b"]);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(seen.lock().unwrap().len(), 2);
    assert_eq!(fake.full_lists(), 1, "the restart made no full LIST");
    inf.shutdown().await.unwrap();
}

/// A durable handler registered before `start` is told this run's changes one by one from the
/// first, as client-go tells a handler added before `Run`. It used to take its first view
/// whenever its task first ran, and then told a later state as initial adds: here its task
/// cannot look (the runtime's one blocking thread is held) while the informer lists and the
/// cluster changes, so without the fix it would tell `add a 2` alone.
#[test]
fn a_durable_handler_registered_before_start_is_told_every_change_of_the_first_run() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(1)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (fake, _dir, db, inf) = two_config_maps().await;
        let (release, gate) = std::sync::mpsc::channel::<()>();
        let held = tokio::task::spawn_blocking(move || gate.recv_timeout(Duration::from_secs(30)));
        let seen = Seen::default();
        inf.add_event_handler(recorder(&seen), HandlerOptions::durable("audit"));
        inf.start();
        // Whatever the informer can do meanwhile: list, sync, take the cluster's changes.
        let synced = tokio::time::timeout(Duration::from_millis(500), inf.wait_for_sync()).await;
        fake.upsert("a", "2");
        fake.delete("b");
        tokio::time::sleep(Duration::from_millis(300)).await;
        release.send(()).unwrap();
        held.await.unwrap().unwrap();
        inf.wait_for_sync().await.expect("synced");
        // The handler is told what the log holds for the scope, one event per entry.
        let log = db.log();
        let scope = inf.scope();
        let want = loop {
            let records = tokio::task::spawn_blocking({
                let log = log.clone();
                move || log.read_after(durable_informer::store::Seq(0), 100, Some(scope))
            })
            .await
            .unwrap()
            .unwrap();
            let want: Vec<String> = records
                .iter()
                .filter_map(|r| {
                    let verb = match r.kind {
                        durable_informer::store::DeltaKind::Added => "add",
                        durable_informer::store::DeltaKind::Updated => "update",
                        durable_informer::store::DeltaKind::Deleted => "delete",
                        _ => return None,
                    };
                    Some(format!("{verb} {}", r.key.name))
                })
                .collect();
            // Until the cluster's last change is in.
            if want.last().is_some_and(|w| w == "delete b") || want == ["add a"] {
                break want;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        let got: Vec<String> = wait_len(&seen, want.len())
            .await
            .iter()
            .map(|e| e.split(' ').take(2).collect::<Vec<_>>().join(" "))
            .collect();
        assert_eq!(got, want, "synced while the handler had not looked: {}", synced.is_ok());
        inf.shutdown().await.unwrap();
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_volatile_handlers_get_the_whole_store_and_removed_ones_get_nothing_more() {
    let fake = Fake::new();
    for n in ["a", "b", "c"] {
        fake.upsert(n, "1");
    }
    let dir = tempfile::tempdir().unwrap();
    let db = DurableStore::open(StoreConfig::new(dir.path().join("db.redb"))).unwrap();
    let inf = informer(&db, &fake).await;
    inf.start();
    inf.wait_for_sync().await.expect("cache synced");
    let late = Seen::default();
    let reg = inf.add_event_handler(recorder(&late), HandlerOptions::volatile());
    reg.wait_for_sync().await.expect("handler synced");
    assert!(reg.has_synced());
    assert_eq!(
        wait_len(&late, 3).await,
        ["add a 1 (initial)", "add b 1 (initial)", "add c 1 (initial)"]
    );
    reg.remove().await;
    fake.upsert("d", "1");
    let other = Seen::default();
    let _keep = inf.add_event_handler(recorder(&other), HandlerOptions::volatile());
    wait_len(&other, 4).await;
    assert_eq!(late.lock().unwrap().len(), 3, "a removed handler receives nothing more");
    inf.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filtering_handlers_turn_updates_into_adds_and_deletes() {
    let fake = Fake::new();
    fake.upsert("a", "keep");
    let dir = tempfile::tempdir().unwrap();
    let db = DurableStore::open(StoreConfig::new(dir.path().join("db.redb"))).unwrap();
    let inf = informer(&db, &fake).await;
    let seen = Seen::default();
    let filter = |c: &ConfigMap| c.data.as_ref().and_then(|d| d.get("v")).is_some_and(|v| v == "keep");
    inf.add_event_handler(Filtering::new(filter, recorder(&seen)), HandlerOptions::volatile());
    inf.start();
    inf.wait_for_sync().await.expect("cache synced");
    fake.upsert("a", "drop");
    fake.upsert("a", "keep");
    fake.upsert("b", "drop");
    assert_eq!(
        wait_len(&seen, 3).await,
        ["add a keep (initial)", "delete a", "add a keep"]
    );
    inf.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_is_reported_and_does_not_stop_the_others() {
    let fake = Fake::new();
    fake.upsert("a", "1");
    let dir = tempfile::tempdir().unwrap();
    let db = DurableStore::open(StoreConfig::new(dir.path().join("db.redb"))).unwrap();
    let inf = informer(&db, &fake).await;
    inf.add_event_handler(
        handler_fn(|_: Event<ConfigMap>| -> Result<(), String> { panic!("boom in handler") }),
        HandlerOptions::volatile(),
    );
    inf.add_event_handler(
        handler_fn(|_: Event<ConfigMap>| -> Result<(), String> { Err("refused".into()) }),
        HandlerOptions::volatile(),
    );
    inf.add_event_handler(
        handler_fn(|_: Event<ConfigMap>| -> Result<(), QuotaError> { Err(QuotaError { left: 0 }) }),
        HandlerOptions::volatile(),
    );
    let seen = Seen::default();
    inf.add_event_handler(recorder(&seen), HandlerOptions::volatile());
    inf.start();
    fake.upsert("b", "1");
    wait_len(&seen, 2).await;
    for _ in 0..500 {
        let errors = inf.errors();
        if errors.iter().filter(|e| e.contains("panicked")).count() >= 2
            && errors.iter().any(|e| e.contains("quota exceeded"))
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let errors = inf.errors();
    assert!(
        errors
            .iter()
            .any(|e| e.contains("panicked") && e.contains("boom in handler")),
        "{errors:?}"
    );
    // The same, typed: which handler, and the panic's own message.
    let issues = inf.issues();
    assert!(
        issues.iter().any(|i| matches!(
            i,
            durable_informer::informer::InformerIssue::Handler {
                problem: durable_informer::informer::HandlerProblem::Panicked(msg),
                ..
            } if msg.contains("boom in handler")
        )),
        "{issues:?}"
    );
    assert!(errors.iter().any(|e| e.contains("refused")), "{errors:?}");
    // A handler's own error type comes back out of the issue.
    let quota = issues.iter().find_map(|i| match i {
        durable_informer::informer::InformerIssue::Handler {
            problem: durable_informer::informer::HandlerProblem::Failed(e),
            ..
        } => e.downcast_ref::<QuotaError>(),
        _ => None,
    });
    assert_eq!(quota.map(|q| q.left), Some(0), "{issues:?}");
    inf.shutdown().await.unwrap();
}

#[derive(Debug, thiserror::Error)]
#[error("quota exceeded ({left} left)")]
struct QuotaError {
    left: u32,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resync_redelivers_every_object_at_its_period() {
    let (_fake, _dir, _db, inf) = two_config_maps().await;
    inf.start();
    inf.wait_for_sync().await.expect("cache synced");
    let seen = Seen::default();
    inf.add_event_handler(
        recorder(&seen),
        HandlerOptions::volatile().resync(Duration::from_millis(300)),
    );
    let got = wait_len(&seen, 6).await;
    assert_eq!(
        got[2..6],
        [
            "update a 1->1 (resync)",
            "update b 1->1 (resync)",
            "update a 1->1 (resync)",
            "update b 1->1 (resync)"
        ]
    );
    inf.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listers_select_by_labels_and_namespace() {
    let fake = Fake::new();
    for n in ["a", "b"] {
        fake.upsert(n, "1");
    }
    let dir = tempfile::tempdir().unwrap();
    let db = DurableStore::open(StoreConfig::new(dir.path().join("db.redb"))).unwrap();
    let inf = informer(&db, &fake).await;
    inf.start();
    inf.wait_for_sync().await.expect("cache synced");
    let lister = inf.lister();
    assert_eq!(lister.list(&Default::default()).unwrap().len(), 2);
    assert_eq!(lister.namespace("ns").list(&"!app".parse().unwrap()).unwrap().len(), 2);
    assert!(lister
        .namespace("ns")
        .list(&"app=web".parse().unwrap())
        .unwrap()
        .is_empty());
    assert_eq!(
        lister
            .namespace("ns")
            .get("a")
            .unwrap()
            .unwrap()
            .metadata
            .name
            .as_deref(),
        Some("a")
    );
    assert!(lister.namespace("other").get("a").unwrap().is_none());
    // The informer's cache decodes an unchanged object once, and shares it.
    let cached = inf.lister();
    let first = cached.namespace("ns").get("a").unwrap().unwrap();
    let again = cached.namespace("ns").get("a").unwrap().unwrap();
    assert!(std::sync::Arc::ptr_eq(&first, &again));
    // A cached list answers hits from the cache and decodes only what changed.
    let all: Vec<_> = cached.namespace("ns").list(&Default::default()).unwrap();
    let a = all.iter().find(|c| c.metadata.name.as_deref() == Some("a")).unwrap();
    assert!(std::sync::Arc::ptr_eq(a, &first));
    fake.upsert("a", "2");
    let rv_before = first.metadata.resource_version.clone();
    let mut fresh = None;
    for _ in 0..100 {
        let now = cached.namespace("ns").get("a").unwrap().unwrap();
        if now.metadata.resource_version != rv_before {
            fresh = Some(now);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let fresh = fresh.expect("the update reached the store");
    assert!(!std::sync::Arc::ptr_eq(&fresh, &first));
    let listed = cached.list(&Default::default()).unwrap();
    let a = listed.iter().find(|c| c.metadata.name.as_deref() == Some("a")).unwrap();
    assert!(
        std::sync::Arc::ptr_eq(a, &fresh),
        "the list did not reuse the cached new version"
    );
    assert_eq!(a.data.as_ref().and_then(|d| d.get("v")).map(String::as_str), Some("2"));
    inf.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watcher_adaptor_feeds_a_kube_runtime_reflector() {
    let (fake, _dir, _db, inf) = two_config_maps().await;
    inf.start();
    inf.wait_for_sync().await.expect("cache synced");
    let (reader, writer) = kube::runtime::reflector::store::<ConfigMap>();
    let stream = kube::runtime::reflector(writer, watcher_stream(&inf));
    let mut stream = Box::pin(stream);
    fake.upsert("c", "1");
    fake.delete("a");
    let mut names = Vec::new();
    for _ in 0..50 {
        let _ = tokio::time::timeout(Duration::from_millis(100), stream.next()).await;
        names = reader
            .state()
            .iter()
            .filter_map(|c| c.metadata.name.clone())
            .collect::<Vec<_>>();
        names.sort();
        if names == ["b", "c"] {
            break;
        }
    }
    assert_eq!(names, ["b", "c"]);
    inf.shutdown().await.unwrap();
}

/// Decodes only ConfigMaps whose every value is "1".
#[derive(Clone, Debug, serde::Deserialize)]
struct OnlyOnes {
    metadata: kube::core::ObjectMeta,
    #[allow(dead_code)]
    data: std::collections::BTreeMap<String, One>,
}

#[derive(Clone, Debug, serde::Deserialize)]
enum One {
    #[serde(rename = "1")]
    One,
}

/// The next item of a watcher stream, described.
async fn next_item<S>(stream: &mut S) -> String
where
    S: futures::Stream<Item = Result<kube::runtime::watcher::Event<OnlyOnes>, kube::runtime::watcher::Error>> + Unpin,
{
    use kube::runtime::watcher::Event as W;
    let item = tokio::time::timeout(Duration::from_secs(10), stream.next()).await;
    match item.expect("an item in time").expect("the stream goes on") {
        Ok(W::Init) => "init".to_owned(),
        Ok(W::InitDone) => "done".to_owned(),
        Ok(W::InitApply(o)) => format!("init-apply {}", o.metadata.name.unwrap()),
        Ok(W::Apply(o)) => format!("apply {}", o.metadata.name.unwrap()),
        Ok(W::Delete(o)) => format!("delete {}", o.metadata.name.unwrap()),
        Err(e) => {
            assert!(e.to_string().contains("unknown variant"), "{e}");
            "error".to_owned()
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watcher_adaptor_yields_an_error_for_an_object_that_does_not_decode() {
    let fake = Fake::new();
    fake.upsert("a", "1");
    fake.upsert("b", "not one");
    let dir = tempfile::tempdir().unwrap();
    let db = DurableStore::open(StoreConfig::new(dir.path().join("db.redb"))).unwrap();
    let inf = Informer::<OnlyOnes>::builder(&db, fake.clone())
        .reflector_config(cfg())
        .build()
        .await
        .unwrap();
    inf.start();
    inf.wait_for_sync().await.expect("cache synced");
    let mut stream = Box::pin(watcher_stream(&inf));
    let mut initial = Vec::new();
    for _ in 0..4 {
        initial.push(next_item(&mut stream).await);
    }
    assert_eq!(initial, ["init", "init-apply a", "error", "done"]);
    fake.upsert("c", "2");
    assert_eq!(next_item(&mut stream).await, "error");
    fake.upsert("d", "1");
    assert_eq!(next_item(&mut stream).await, "apply d");
    inf.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_need_an_explicit_opt_in() {
    #[derive(Clone)]
    struct SecretSource(Fake);
    impl durable_informer::source::Source for SecretSource {
        async fn list(
            &self,
            r: durable_informer::source::ListRequest,
        ) -> Result<durable_informer::source::ListPage, durable_informer::source::SourceError> {
            self.0.list(r).await
        }
        async fn watch(
            &self,
            r: durable_informer::source::WatchRequest,
        ) -> Result<durable_informer::source::WatchStream, durable_informer::source::SourceError> {
            self.0.watch(r).await
        }
        async fn cluster_identity(&self) -> Result<Option<String>, durable_informer::source::SourceError> {
            self.0.cluster_identity().await
        }
        fn resource(&self) -> String {
            "secrets".into()
        }
        fn scope(&self) -> durable_informer::object::ScopeSpec {
            durable_informer::object::ScopeSpec::new("", "v1", "secrets")
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let db = DurableStore::open(StoreConfig::new(dir.path().join("db.redb"))).unwrap();
    let refused = Informer::<ConfigMap>::builder(&db, SecretSource(Fake::new()))
        .build()
        .await;
    assert!(matches!(
        refused,
        Err(durable_informer::informer::InformerError::SecretsNotAllowed)
    ));
    assert!(Informer::<ConfigMap>::builder(&db, SecretSource(Fake::new()))
        .allow_secrets()
        .build()
        .await
        .is_ok());
}

/// A volatile handler blocked on the update of `a` while 30 more objects arrive, one is
/// deleted, and retention cuts the log past it; returns once the cut is made, gate closed.
async fn behind_the_retention(
    cache_bytes: usize,
    options: HandlerOptions,
) -> (
    (tempfile::TempDir, DurableStore),
    Informer<ConfigMap>,
    Seen,
    Arc<tokio::sync::Semaphore>,
) {
    let fake = Fake::new();
    fake.upsert("a", "1");
    let dir = tempfile::tempdir().unwrap();
    let db = DurableStore::open(StoreConfig::new(dir.path().join("db.redb")).retention_entries(Some(5))).unwrap();
    let inf = Informer::<ConfigMap>::builder(&db, fake.clone())
        .reflector_config(cfg())
        .indexer(durable_informer::store::Indexer::labels())
        .object_cache_bytes(cache_bytes)
        .build()
        .await
        .unwrap();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let seen = Seen::default();
    let blocked = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (g, s, b) = (gate.clone(), seen.clone(), blocked.clone());
    let _reg = inf.add_event_handler(
        durable_informer::informer::async_handler_fn(move |ev: Event<ConfigMap>| {
            let (g, s, b) = (g.clone(), s.clone(), b.clone());
            async move {
                let line = describe(&ev);
                // Blocks on the update of `a` until the test opens the gate.
                if line == "update a 1->2" {
                    b.store(true, std::sync::atomic::Ordering::SeqCst);
                    g.acquire().await.map(|p| p.forget()).ok();
                }
                s.lock().unwrap().push(line);
                Ok::<(), std::convert::Infallible>(())
            }
        }),
        options,
    );
    inf.start();
    inf.wait_for_sync().await.expect("cache synced");
    wait_len(&seen, 1).await;
    fake.upsert("a", "2"); // the handler blocks on this one
    for _ in 0..500 {
        if blocked.load(std::sync::atomic::Ordering::SeqCst) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(blocked.load(std::sync::atomic::Ordering::SeqCst));
    for i in 0..30 {
        fake.upsert(&format!("n{i}"), "1");
    }
    fake.delete("n0");
    // Wait until everything is committed and retention has cut the log far past the handler.
    let log = db.log();
    for _ in 0..500 {
        let ok = inf.store().snapshot().unwrap().len().unwrap() == 30
            && log.bounds().unwrap().is_some_and(|(first, _)| first.0 > 10);
        if ok {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        log.bounds().unwrap().is_some_and(|(first, _)| first.0 > 10),
        "retention did not run"
    );
    ((dir, db), inf, seen, gate)
}

/// A volatile handler that falls behind (here: past the log's retention) misses nothing: it is
/// told from the informer's cache, every change in order, with the JSON in the cache and with
/// none (read back from redb).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volatile_handler_behind_the_retention_is_told_every_change() {
    for cache_bytes in [64 << 20, 0] {
        let (_dir, inf, seen, gate) = behind_the_retention(cache_bytes, HandlerOptions::volatile()).await;
        gate.add_permits(1_000);
        let got = wait_len(&seen, 2 + 30 + 1).await;
        let mut want = vec!["add a 1 (initial)".to_owned(), "update a 1->2".to_owned()];
        want.extend((0..30).map(|i| format!("add n{i} 1")));
        want.push("delete n0".to_owned());
        assert_eq!(got, want, "cache of {cache_bytes} bytes");
        assert!(inf.errors().is_empty(), "{:?}", inf.errors());
        inf.shutdown().await.unwrap();
    }
}

/// Further behind than its `max_queued` changes, a volatile handler is told each changed
/// object's newest state (an object added and deleted meanwhile: nothing), and an issue says
/// it fell behind; its state still ends equal to the store's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volatile_handler_far_behind_is_told_each_objects_newest_state() {
    let (_dir, inf, seen, gate) = behind_the_retention(64 << 20, HandlerOptions::volatile().max_queued(5)).await;
    gate.add_permits(1_000);
    let got = wait_len(&seen, 2 + 29).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let got_all = seen.lock().unwrap().clone();
    assert_eq!(got_all.len(), got.len(), "nothing more: {got_all:?}");
    assert_eq!(&got[..2], ["add a 1 (initial)", "update a 1->2"]);
    let mut rest: Vec<&String> = got[2..].iter().collect();
    rest.sort();
    let mut want: Vec<String> = (1..30).map(|i| format!("add n{i} 1")).collect();
    want.sort();
    assert_eq!(
        rest,
        want.iter().collect::<Vec<_>>(),
        "n0 was added and deleted meanwhile"
    );
    assert!(
        inf.errors()
            .iter()
            .any(|e| e.contains("fell more than 5 changes behind")),
        "{:?}",
        inf.errors()
    );
    inf.shutdown().await.unwrap();
}

/// A [`Fake`] watched as another scope: two of them are two informers on one database.
#[derive(Clone)]
struct Scoped {
    fake: Fake,
    namespace: &'static str,
}

impl durable_informer::source::Source for Scoped {
    async fn list(
        &self,
        req: durable_informer::source::ListRequest,
    ) -> Result<durable_informer::source::ListPage, durable_informer::source::SourceError> {
        self.fake.list(req).await
    }

    async fn watch(
        &self,
        req: durable_informer::source::WatchRequest,
    ) -> Result<durable_informer::source::WatchStream, durable_informer::source::SourceError> {
        self.fake.watch(req).await
    }

    async fn cluster_identity(&self) -> Result<Option<String>, durable_informer::source::SourceError> {
        self.fake.cluster_identity().await
    }

    fn resource(&self) -> String {
        self.fake.resource()
    }

    fn scope(&self) -> durable_informer::object::ScopeSpec {
        self.fake.scope().namespace(self.namespace)
    }
}

async fn scoped_informer(db: &DurableStore, source: &Scoped) -> Informer<ConfigMap> {
    Informer::<ConfigMap>::builder(db, source.clone())
        .reflector_config(cfg())
        .build()
        .await
        .unwrap()
}

async fn wait_stored(inf: &Informer<ConfigMap>, name: &str, value: &str) {
    for _ in 0..500 {
        let stored = inf.lister().namespace("ns").get(name).unwrap();
        if stored.is_some_and(|c| c.data.as_ref().and_then(|d| d.get("v")).is_some_and(|v| v == value)) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{name}={value} never reached the store");
}

/// Durable cursors belong to (scope, name): two informers on one database whose durable
/// handlers share a name each resume from their own position (neither skips what the other
/// handled past, nor repeats what it acknowledged).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durable_handlers_of_two_scopes_with_one_name_keep_their_own_cursors() {
    let a = Scoped {
        fake: Fake::new(),
        namespace: "team-a",
    };
    let b = Scoped {
        fake: Fake::new(),
        namespace: "team-b",
    };
    a.fake.upsert("a1", "1");
    b.fake.upsert("b1", "1");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db.redb");
    {
        let db = DurableStore::open(StoreConfig::new(&path)).unwrap();
        let (inf_a, inf_b) = (scoped_informer(&db, &a).await, scoped_informer(&db, &b).await);
        assert_ne!(inf_a.scope(), inf_b.scope());
        let (seen_a, seen_b) = (Seen::default(), Seen::default());
        let reg_a = inf_a.add_event_handler(recorder(&seen_a), HandlerOptions::durable("audit"));
        inf_b.add_event_handler(recorder(&seen_b), HandlerOptions::durable("audit"));
        inf_a.start();
        inf_b.start();
        wait_len(&seen_a, 1).await;
        wait_len(&seen_b, 1).await;
        b.fake.upsert("b2", "1");
        wait_len(&seen_b, 2).await;
        a.fake.upsert("a2", "1");
        wait_len(&seen_a, 2).await;
        // A's handler stops after partial delivery; its informer keeps ingesting.
        reg_a.remove().await;
        a.fake.upsert("a3", "1");
        a.fake.upsert("a1", "2");
        wait_stored(&inf_a, "a1", "2").await;
        // B's handler then moves its cursor past A's unhandled entries.
        b.fake.upsert("b3", "1");
        assert_eq!(wait_len(&seen_b, 3).await[2], "add b3 1");
        assert_eq!(seen_a.lock().unwrap().len(), 2);
        inf_a.shutdown().await.unwrap();
        inf_b.shutdown().await.unwrap();
        db.close().unwrap();
    }
    let db = DurableStore::open(StoreConfig::new(&path)).unwrap();
    let (inf_a, inf_b) = (scoped_informer(&db, &a).await, scoped_informer(&db, &b).await);
    let (seen_a, seen_b) = (Seen::default(), Seen::default());
    inf_a.add_event_handler(recorder(&seen_a), HandlerOptions::durable("audit"));
    inf_b.add_event_handler(recorder(&seen_b), HandlerOptions::durable("audit"));
    inf_a.start();
    inf_b.start();
    inf_a.wait_for_sync().await.expect("cache synced");
    inf_b.wait_for_sync().await.expect("cache synced");
    // A gets exactly what it had not handled; B nothing until a new event.
    assert_eq!(wait_len(&seen_a, 2).await, ["add a3 1", "update a1 1->2"]);
    b.fake.upsert("b4", "1");
    assert_eq!(wait_len(&seen_b, 1).await, ["add b4 1"]);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(seen_a.lock().unwrap().len(), 2, "{:?}", seen_a.lock().unwrap());
    assert_eq!(seen_b.lock().unwrap().len(), 1, "{:?}", seen_b.lock().unwrap());
    assert!(db.check().unwrap().is_ok());
    inf_a.shutdown().await.unwrap();
    inf_b.shutdown().await.unwrap();
}

/// client-go's `isInInitialList`: the adds of the informer's first LIST are initial for handlers
/// registered before `start` and before the sync; later adds are not; a late handler's
/// synthetic adds are. A store restored from disk has no initial list: what its resume brings
/// are ordinary events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adds_of_the_initial_list_are_flagged_initial() {
    let fake = Fake::new();
    fake.upsert("a", "1");
    fake.upsert("b", "1");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db.redb");
    {
        let db = DurableStore::open(StoreConfig::new(&path)).unwrap();
        let inf = informer(&db, &fake).await;
        let (early, durable) = (Seen::default(), Seen::default());
        inf.add_event_handler(recorder(&early), HandlerOptions::volatile());
        inf.add_event_handler(recorder(&durable), HandlerOptions::durable("d"));
        inf.start();
        inf.wait_for_sync().await.expect("cache synced");
        fake.upsert("c", "1");
        let want = ["add a 1 (initial)", "add b 1 (initial)", "add c 1"];
        assert_eq!(wait_len(&early, 3).await, want);
        assert_eq!(wait_len(&durable, 3).await, want);
        let late = Seen::default();
        inf.add_event_handler(recorder(&late), HandlerOptions::volatile());
        // Its synthetic adds first: a change arriving before they are taken is one of them.
        wait_len(&late, 3).await;
        fake.upsert("d", "1");
        assert_eq!(
            wait_len(&late, 4).await,
            ["add a 1 (initial)", "add b 1 (initial)", "add c 1 (initial)", "add d 1"]
        );
        assert_eq!(wait_len(&durable, 4).await[3], "add d 1");
        inf.shutdown().await.unwrap();
        db.close().unwrap();
    }
    fake.upsert("e", "1");
    let db = DurableStore::open(StoreConfig::new(&path)).unwrap();
    let inf = informer(&db, &fake).await;
    assert!(inf.is_restored());
    let (early, durable) = (Seen::default(), Seen::default());
    inf.add_event_handler(recorder(&early), HandlerOptions::volatile());
    inf.add_event_handler(recorder(&durable), HandlerOptions::durable("d"));
    inf.start();
    inf.wait_for_sync().await.expect("cache synced");
    assert_eq!(wait_len(&durable, 1).await, ["add e 1"]);
    let mut got = wait_len(&early, 5).await;
    // The restored store as synthetic adds (initial), then the resume's add of `e` (not).
    let last = got.pop();
    if last.as_deref() == Some("add e 1") {
        assert_eq!(
            got,
            [
                "add a 1 (initial)",
                "add b 1 (initial)",
                "add c 1 (initial)",
                "add d 1 (initial)"
            ]
        );
    } else {
        // The handler's snapshot was taken after `e` was committed.
        got.extend(last);
        assert_eq!(
            got,
            [
                "add a 1 (initial)",
                "add b 1 (initial)",
                "add c 1 (initial)",
                "add d 1 (initial)",
                "add e 1 (initial)"
            ]
        );
    }
    inf.shutdown().await.unwrap();
}

/// Resync on virtual time: the builder's period applies to handlers registered without one, a
/// handler's own period overrides it, and a resync fires at its period, not before.
#[tokio::test(start_paused = true)]
async fn resync_fires_at_its_period_on_virtual_time() {
    let fake = Fake::new();
    fake.upsert("a", "1");
    fake.upsert("b", "1");
    let dir = tempfile::tempdir().unwrap();
    let db = DurableStore::open(StoreConfig::new(dir.path().join("db.redb"))).unwrap();
    let inf = Informer::<ConfigMap>::builder(&db, fake.clone())
        .reflector_config(cfg())
        .resync(Duration::from_secs(60))
        .build()
        .await
        .unwrap();
    inf.start();
    inf.wait_for_sync().await.expect("cache synced");
    let (inherits, own) = (Seen::default(), Seen::default());
    let r1 = inf.add_event_handler(recorder(&inherits), HandlerOptions::volatile());
    let r2 = inf.add_event_handler(
        recorder(&own),
        HandlerOptions::volatile().resync(Duration::from_secs(3600)),
    );
    r1.wait_for_sync().await.expect("handler synced");
    r2.wait_for_sync().await.expect("handler synced");
    let initial = ["add a 1 (initial)", "add b 1 (initial)"];
    assert_eq!(wait_len(&inherits, 2).await, initial);
    assert_eq!(wait_len(&own, 2).await, initial);
    let resyncs = |seen: &Seen| seen.lock().unwrap().iter().filter(|l| l.ends_with("(resync)")).count();
    tokio::time::sleep(Duration::from_secs(59)).await;
    assert_eq!(resyncs(&inherits), 0, "no resync before the period");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(resyncs(&inherits), 2, "{:?}", inherits.lock().unwrap());
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(
        inherits.lock().unwrap()[2..],
        [
            "update a 1->1 (resync)",
            "update b 1->1 (resync)",
            "update a 1->1 (resync)",
            "update b 1->1 (resync)"
        ]
    );
    assert_eq!(resyncs(&own), 0, "a handler's own period overrides the builder's");
    inf.shutdown().await.unwrap();
}

/// A delete found by a relist (the history was compacted while the informer was down) reaches a
/// durable handler with `final_state_unknown`, and nothing else is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_found_by_a_relist_has_an_unknown_final_state() {
    let fake = Fake::new();
    fake.upsert("a", "1");
    fake.upsert("b", "1");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db.redb");
    {
        let db = DurableStore::open(StoreConfig::new(&path)).unwrap();
        let inf = informer(&db, &fake).await;
        let seen = Seen::default();
        inf.add_event_handler(recorder(&seen), HandlerOptions::durable("audit"));
        inf.start();
        inf.wait_for_sync().await.expect("cache synced");
        assert_eq!(wait_len(&seen, 2).await, ["add a 1 (initial)", "add b 1 (initial)"]);
        inf.shutdown().await.unwrap();
        db.close().unwrap();
    }
    fake.delete("b");
    fake.compact();
    let db = DurableStore::open(StoreConfig::new(&path)).unwrap();
    let inf = informer(&db, &fake).await;
    let seen = Seen::default();
    inf.add_event_handler(recorder(&seen), HandlerOptions::durable("audit"));
    inf.start();
    assert_eq!(wait_len(&seen, 1).await, ["delete b (unknown)"]);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(seen.lock().unwrap().len(), 1, "{:?}", seen.lock().unwrap());
    assert_eq!(
        inf.status().borrow().relists,
        1,
        "the compacted history forced a relist"
    );
    inf.shutdown().await.unwrap();
}

/// A MODIFIED event with the stored RV (a duplicate) changes nothing and reaches no handler.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_with_an_unchanged_resource_version_is_not_delivered() {
    let fake = Fake::new();
    fake.upsert("a", "1");
    let dir = tempfile::tempdir().unwrap();
    let db = DurableStore::open(StoreConfig::new(dir.path().join("db.redb"))).unwrap();
    let inf = informer(&db, &fake).await;
    let seen = Seen::default();
    let reg = inf.add_event_handler(recorder(&seen), HandlerOptions::volatile());
    inf.start();
    inf.wait_for_sync().await.expect("cache synced");
    reg.wait_for_sync().await.expect("handler synced");
    fake.resend("a");
    fake.upsert("a", "2");
    fake.resend("a");
    fake.upsert("b", "1"); // a marker: everything before it was handled
    assert_eq!(
        wait_len(&seen, 3).await,
        ["add a 1 (initial)", "update a 1->2", "add b 1"]
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(seen.lock().unwrap().len(), 3, "{:?}", seen.lock().unwrap());
    inf.shutdown().await.unwrap();
}

/// A resync over more objects than one page (256) delivers every object exactly once, in key
/// order, from one view.
#[tokio::test(start_paused = true)]
async fn a_resync_larger_than_a_page_delivers_each_object_once() {
    let fake = Fake::new();
    let names: Vec<String> = (0..600).map(|i| format!("o{i:03}")).collect();
    for n in &names {
        fake.upsert(n, "1");
    }
    let dir = tempfile::tempdir().unwrap();
    let db = DurableStore::open(StoreConfig::new(dir.path().join("db.redb"))).unwrap();
    let inf = Informer::<ConfigMap>::builder(&db, fake.clone())
        .reflector_config(ReflectorConfig {
            page_size: 500,
            ..cfg()
        })
        .build()
        .await
        .unwrap();
    inf.start();
    inf.wait_for_sync().await.expect("cache synced");
    let seen = Seen::default();
    let reg = inf.add_event_handler(
        recorder(&seen),
        HandlerOptions::volatile().resync(Duration::from_secs(60)),
    );
    reg.wait_for_sync().await.expect("handler synced");
    assert_eq!(wait_len(&seen, 600).await.len(), 600);
    tokio::time::sleep(Duration::from_secs(61)).await;
    let resyncs = wait_len(&seen, 1200).await[600..].to_vec();
    let want: Vec<String> = names.iter().map(|n| format!("update {n} 1->1 (resync)")).collect();
    assert_eq!(resyncs, want);
    inf.shutdown().await.unwrap();
}

/// A volatile handler hears of a change as soon as the writer decides it, before redb has its
/// rows (the change stream, through the informer's cache): the lister it reads then, and the
/// metadata the sharding guard reads, already answer that version or a newer one, never an older one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volatile_handler_finds_its_lister_at_the_version_it_was_told_of() {
    let fake = Fake::new();
    fake.upsert("a", "0");
    let dir = tempfile::tempdir().unwrap();
    let db = DurableStore::open(StoreConfig::new(dir.path().join("db.redb"))).unwrap();
    let inf = informer(&db, &fake).await;
    let lister = inf.lister();
    let told = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let behind: Seen = Seen::default();
    let rv = |c: &ConfigMap| -> u64 {
        c.metadata
            .resource_version
            .as_deref()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let (t, b) = (told.clone(), behind.clone());
    inf.add_event_handler(
        handler_fn(move |ev: Event<ConfigMap>| -> Result<(), std::convert::Infallible> {
            if let Event::Update { new, .. } = &ev {
                let name = new.metadata.name.clone().unwrap_or_default();
                let listed = lister.namespace("ns").get(&name).unwrap().map_or(0, |c| rv(&c));
                if listed < rv(new) {
                    b.lock()
                        .unwrap()
                        .push(format!("{name}: told {} listed {listed}", rv(new)));
                }
                t.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            Ok(())
        }),
        HandlerOptions::volatile(),
    );
    inf.start();
    inf.wait_for_sync().await.unwrap();
    assert!(inf.cache_stats().loaded, "the informer's cache serves the lister");
    for i in 1..=300 {
        fake.upsert("a", &i.to_string());
        if i % 50 == 0 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    for _ in 0..500 {
        if *inf
            .lister()
            .namespace("ns")
            .get("a")
            .unwrap()
            .unwrap()
            .data
            .as_ref()
            .unwrap()
            .get("v")
            .unwrap()
            == "300"
            && told.load(std::sync::atomic::Ordering::SeqCst) > 0
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        told.load(std::sync::atomic::Ordering::SeqCst) > 0,
        "no update was delivered"
    );
    assert_eq!(*behind.lock().unwrap(), Vec::<String>::new());
    inf.shutdown().await.unwrap();
}
