//! The findings of the reliability review (`F1`–`F14`; F15 is in `store_damaged_rows.rs`), one
//! test each, written before the fix and seen failing on the code the review read (`0ccc960`).
//! Each test name says the behaviour that must hold; the doc comment names the finding.

mod common;
#[path = "common/faults.rs"]
mod faults;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::fake::Fake;
use durable_informer::informer::{async_handler_fn, handler_fn, Event, HandlerOptions, Informer};
use durable_informer::object::{RawObject, ResourceVersion};
use durable_informer::reflector::{BackoffConfig, ReflectorConfig};
use durable_informer::store::{Batch, Compression, DeltaKind, DurableStore, ScopeId, StoreConfig, StoreError};
use faults::{config, Faults};
use k8s_openapi::api::core::v1::ConfigMap;
use tokio::sync::Notify;

/// A ConfigMap in namespace `ns`.
fn cm(name: &str, rv: u64, value: &str) -> RawObject {
    RawObject::from_json(
        format!(
            r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"{name}","namespace":"ns","resourceVersion":"{rv}"}},"data":{{"v":"{value}"}}}}"#
        )
        .into_bytes(),
    )
    .expect("object")
}

fn fast() -> ReflectorConfig {
    ReflectorConfig {
        page_size: 50,
        backoff: BackoffConfig {
            initial: Duration::from_millis(5),
            max: Duration::from_millis(50),
            ..BackoffConfig::default()
        },
        ..ReflectorConfig::default()
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// What a handler was told, replayed: name → resourceVersion of the state it holds.
#[derive(Default, Clone)]
struct Replay(Arc<Mutex<BTreeMap<String, String>>>, Arc<Mutex<Vec<String>>>);

impl Replay {
    fn apply(&self, ev: &Event<ConfigMap>) {
        let name = |c: &ConfigMap| c.metadata.name.clone().unwrap_or_default();
        let rv = |c: &ConfigMap| c.metadata.resource_version.clone().unwrap_or_default();
        let mut state = self.0.lock().expect("replay");
        let line = match ev {
            Event::Add { object, .. } => {
                state.insert(name(object), rv(object));
                format!("add {}@{}", name(object), rv(object))
            }
            Event::Update { new, .. } => {
                state.insert(name(new), rv(new));
                format!("update {}@{}", name(new), rv(new))
            }
            Event::Delete { object, .. } => {
                state.remove(&name(object));
                format!("delete {}", name(object))
            }
        };
        self.1.lock().expect("log").push(line);
    }

    fn state(&self) -> BTreeMap<String, String> {
        self.0.lock().expect("replay").clone()
    }

    fn log(&self) -> Vec<String> {
        self.1.lock().expect("log").clone()
    }
}

/// The scope's objects as name → resourceVersion, read from redb (retried while the writer
/// reopens the file after an I/O error).
fn stored(db: &DurableStore, scope: ScopeId) -> BTreeMap<String, String> {
    for _ in 0..500 {
        match db.store(scope).list() {
            Ok(list) => {
                return list
                    .into_iter()
                    .map(|o| (o.key.name.clone(), o.meta.resource_version.to_string()))
                    .collect()
            }
            Err(StoreError::Closed { .. }) => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => panic!("read: {e}"),
        }
    }
    panic!("the store stayed closed");
}

/// Polls `done` every 10 ms for up to `limit`.
async fn eventually(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if done() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    done()
}

/// A handler that replays what it is told and, while `hold` is set, blocks in its first event
/// whose object name starts with `prefix` until `release` is notified.
fn holding_handler(
    replay: &Replay,
    prefix: &'static str,
    hold: Arc<AtomicBool>,
    blocked: Arc<Notify>,
    release: Arc<Notify>,
) -> impl durable_informer::informer::EventHandler<ConfigMap> {
    let replay = replay.clone();
    async_handler_fn(move |ev: Event<ConfigMap>| {
        let replay = replay.clone();
        let (hold, blocked, release) = (hold.clone(), blocked.clone(), release.clone());
        async move {
            let name = ev.object().metadata.name.clone().unwrap_or_default();
            if name.starts_with(prefix) && hold.swap(false, Ordering::SeqCst) {
                blocked.notify_one();
                release.notified().await;
            }
            replay.apply(&ev);
            Ok::<(), std::convert::Infallible>(())
        }
    })
}

/// Fails the next durable commit with a full disk, then lets the writer reopen the file: the
/// commits not yet on disk are lost.
async fn lose_deferred_commits(db: &DurableStore, faults: &Faults) {
    faults.disk_full.store(true, Ordering::SeqCst);
    let failed = db.writer().flush().await;
    assert!(failed.is_err(), "the durable commit should fail on a full disk");
    faults.disk_full.store(false, Ordering::SeqCst);
    for _ in 0..200 {
        if db.writer().flush().await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the writer did not recover after the disk had space again");
}

/// An informer over a fake server with no objects, built but never started: the test writes
/// through the database's writer itself.
async fn idle_informer(db: &DurableStore) -> Informer<ConfigMap> {
    Informer::<ConfigMap>::builder(db, Fake::new())
        .reflector_config(fast())
        .build()
        .await
        .expect("informer")
}

/// Waits until the informer's in-memory read model is loaded.
async fn loaded(inf: &Informer<ConfigMap>) {
    assert!(
        eventually(Duration::from_secs(10), || inf.cache_stats().loaded).await,
        "the read model loads"
    );
}

/// F1: two rollbacks close together (a failed deferred fsync, a refetch, another failed one)
/// must not make a volatile handler skip what was committed in between.
#[test]
fn f1_a_volatile_handler_misses_nothing_committed_between_two_rollbacks() {
    let dir = tempfile::tempdir().expect("tempdir");
    let faults = Arc::new(Faults::default());
    let db =
        DurableStore::open(config(&dir.path().join("db.redb"), &faults).fsync_delay(Some(Duration::from_secs(3600))))
            .expect("open");
    runtime().block_on(async {
        let inf = idle_informer(&db).await;
        let scope = inf.scope();
        let w = db.writer();
        w.apply(Batch::new(scope).delta(DeltaKind::Added, cm("base", 1, "0")).rv("1"))
            .await
            .expect("base");
        loaded(&inf).await;
        let replay = Replay::default();
        let (hold, blocked, release) = (
            Arc::new(AtomicBool::new(true)),
            Arc::new(Notify::new()),
            Arc::new(Notify::new()),
        );
        let _reg = inf.add_event_handler(
            holding_handler(&replay, "g1-", hold.clone(), blocked.clone(), release.clone()),
            HandlerOptions::volatile(),
        );
        // G1, deferred: the handler is told and blocks in its first event.
        let mut g1 = Batch::new(scope).rv("2").requires("1").deferred_fsync();
        for i in 0..10 {
            g1 = g1.delta(DeltaKind::Added, cm(&format!("g1-{i}"), 2, "1"));
        }
        w.apply(g1).await.expect("G1 acknowledged");
        tokio::time::timeout(Duration::from_secs(10), blocked.notified())
            .await
            .expect("the handler is told of G1 and blocks");
        lose_deferred_commits(&db, &faults).await;
        assert!(!stored(&db, scope).contains_key("g1-0"), "G1 was lost");
        // G2, durable, then G3, deferred and lost too.
        let mut g2 = Batch::new(scope).rv("3").requires("1");
        for i in 0..5 {
            g2 = g2.delta(DeltaKind::Added, cm(&format!("g2-{i}"), 3, "2"));
        }
        w.apply(g2).await.expect("G2");
        let mut g3 = Batch::new(scope).rv("4").requires("3").deferred_fsync();
        for i in 0..3 {
            g3 = g3.delta(DeltaKind::Added, cm(&format!("g3-{i}"), 4, "3"));
        }
        w.apply(g3).await.expect("G3 acknowledged");
        lose_deferred_commits(&db, &faults).await;
        release.notify_one();
        let want = stored(&db, scope);
        assert!(want.contains_key("g2-4"), "G2 is on disk");
        let caught_up = eventually(Duration::from_secs(10), || replay.state() == want).await;
        assert!(
            caught_up,
            "the handler's replayed state is not the store's:\nhandler {:?}\nstore {want:?}\nevents {:?}",
            replay.state(),
            replay.log()
        );
    });
}

/// F2: an add told before its commit failed, of an object deleted on the server while the
/// disk was full, must be taken back even when the refetch is a relist (410).
#[cfg(feature = "sim")]
#[test]
fn f2_a_volatile_handler_is_told_to_delete_a_rolled_back_add_after_a_relist() {
    use durable_informer::sim::{Sim, SimConfig};
    use durable_informer::source::KubeSource;
    use serde_json::json;

    let sim = Sim::start(SimConfig::default()).expect("sim");
    let make = |name: &str| {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "ns"}, "data": {"v": "0"}})
    };
    for i in 0..3 {
        sim.create("configmaps", Some("ns"), make(&format!("cm-{i}")))
            .expect("create");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let faults = Arc::new(Faults::default());
    let db = DurableStore::open(config(&dir.path().join("db.redb"), &faults)).expect("open");
    runtime().block_on(async {
        let source = KubeSource::typed::<ConfigMap>(sim.client().expect("client"), &sim.url());
        let inf = Informer::<ConfigMap>::builder(&db, source)
            .reflector_config(fast())
            .build()
            .await
            .expect("informer");
        let replay = Replay::default();
        let r2 = replay.clone();
        let _reg = inf.add_event_handler(
            handler_fn(move |ev: Event<ConfigMap>| -> Result<(), std::convert::Infallible> {
                r2.apply(&ev);
                Ok(())
            }),
            HandlerOptions::volatile(),
        );
        inf.start();
        inf.wait_for_sync().await.expect("synced");
        faults.disk_full.store(true, Ordering::SeqCst);
        sim.create("configmaps", Some("ns"), make("x")).expect("create x");
        let told = eventually(Duration::from_secs(10), || replay.state().contains_key("x")).await;
        if told {
            // While the disk is still full (x's commit, or its fsync, fails), x goes away on
            // the server and the history that holds it is compacted: the refetch is a relist.
            sim.delete("configmaps", Some("ns"), "x").expect("delete x");
            sim.compact();
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        faults.disk_full.store(false, Ordering::SeqCst);
        assert!(
            told,
            "the handler was told of x before its commit (events: {:?})",
            replay.log()
        );
        let scope = inf.scope();
        let api: kube::Api<ConfigMap> = kube::Api::namespaced(sim.client().expect("client"), "ns");
        let server: BTreeMap<String, String> = api
            .list(&Default::default())
            .await
            .expect("list")
            .items
            .into_iter()
            .map(|c| {
                (
                    c.metadata.name.unwrap_or_default(),
                    c.metadata.resource_version.unwrap_or_default(),
                )
            })
            .collect();
        let server = || server.clone();
        let caught_up = eventually(Duration::from_secs(30), || {
            stored(&db, scope) == server() && replay.state() == server()
        })
        .await;
        assert!(
            caught_up,
            "after the relist the handler holds {:?}, the server {:?} (events {:?}, issues {:?})",
            replay.state(),
            server(),
            replay.log(),
            inf.errors()
        );
        inf.shutdown().await.expect("shutdown");
    });
}

/// F3: a durable handler's initial adds must come from what is on disk, and its persisted
/// cursor must never lie past the log.
#[test]
fn f3_a_durable_handlers_first_cursor_is_never_past_the_log() {
    let dir = tempfile::tempdir().expect("tempdir");
    let faults = Arc::new(Faults::default());
    let db =
        DurableStore::open(config(&dir.path().join("db.redb"), &faults).fsync_delay(Some(Duration::from_secs(3600))))
            .expect("open");
    runtime().block_on(async {
        let inf = idle_informer(&db).await;
        let scope = inf.scope();
        let w = db.writer();
        w.apply(Batch::new(scope).delta(DeltaKind::Added, cm("a", 1, "0")).rv("1"))
            .await
            .expect("base");
        w.apply(
            Batch::new(scope)
                .delta(DeltaKind::Added, cm("x", 2, "0"))
                .rv("2")
                .requires("1")
                .deferred_fsync(),
        )
        .await
        .expect("x acknowledged, not on disk");
        let replay = Replay::default();
        let (hold, blocked, release) = (
            Arc::new(AtomicBool::new(true)),
            Arc::new(Notify::new()),
            Arc::new(Notify::new()),
        );
        let reg = inf.add_event_handler(
            holding_handler(&replay, "", hold.clone(), blocked.clone(), release.clone()),
            HandlerOptions::durable("h"),
        );
        // Blocked in its first event, or not told anything yet.
        let _ = tokio::time::timeout(Duration::from_secs(2), blocked.notified()).await;
        lose_deferred_commits(&db, &faults).await;
        hold.store(false, Ordering::SeqCst);
        release.notify_one();
        let want = stored(&db, scope);
        // The informer is not started, so never synced: the handler is done once its cursor
        // reaches the log's end.
        let log = db.log();
        let end = *db.writer().committed().borrow();
        let caught_up = eventually(Duration::from_secs(10), || {
            reg.cursor() >= end && replay.state() == want
        })
        .await;
        let cursor = log.cursor(scope, "h").expect("cursor");
        let last = log.bounds().expect("bounds").map(|(_, last)| last);
        assert!(
            cursor.is_none_or(|c| last.is_some_and(|l| c <= l)),
            "the persisted cursor {cursor:?} is past the log's last entry {last:?}"
        );
        assert!(
            caught_up,
            "the handler holds {:?}, the store {want:?} (events {:?})",
            replay.state(),
            replay.log()
        );
    });
}

/// F4: after a deferred commit is lost on a quiet resource, the store must get it back without
/// waiting for the next event, bookmark or watch timeout.
#[cfg(feature = "sim")]
#[test]
fn f4_a_lost_deferred_commit_is_fetched_again_on_a_quiet_resource() {
    use durable_informer::sim::{Sim, SimConfig};
    use durable_informer::source::KubeSource;
    use serde_json::json;

    let sim = Sim::start(SimConfig::default().bookmark_interval(Duration::from_secs(3600))).expect("sim");
    let dir = tempfile::tempdir().expect("tempdir");
    let faults = Arc::new(Faults::default());
    let db =
        DurableStore::open(config(&dir.path().join("db.redb"), &faults).fsync_delay(Some(Duration::from_secs(3600))))
            .expect("open");
    runtime().block_on(async {
        let source = KubeSource::typed::<ConfigMap>(sim.client().expect("client"), &sim.url());
        let inf = Informer::<ConfigMap>::builder(&db, source)
            .reflector_config(fast())
            .build()
            .await
            .expect("informer");
        inf.start();
        inf.wait_for_sync().await.expect("synced");
        let obj = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "x", "namespace": "ns"}, "data": {"v": "0"}});
        sim.create("configmaps", Some("ns"), obj).expect("create");
        let scope = inf.scope();
        assert!(
            eventually(Duration::from_secs(10), || stored(&db, scope).contains_key("x")).await,
            "x is stored"
        );
        lose_deferred_commits(&db, &faults).await;
        let back = eventually(Duration::from_secs(5), || stored(&db, scope).contains_key("x")).await;
        assert!(
            back,
            "x, lost with its deferred commit, was not fetched again within 5 s"
        );
        inf.shutdown().await.expect("shutdown");
    });
}

/// F5: a batch that requires a resourceVersion the scope does not hold is refused for opaque
/// (non-integer) resourceVersions too.
#[test]
fn f5_a_batch_requiring_an_opaque_rv_the_scope_does_not_hold_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = DurableStore::open(StoreConfig::new(dir.path().join("db.redb"))).expect("open");
    let w = db.writer();
    let scope = w
        .register_scope_blocking(&durable_informer::object::ScopeSpec::new("", "v1", "configmaps"))
        .expect("scope");
    w.apply_blocking(Batch::new(scope).delta(DeltaKind::Added, cm("a", 1, "0")).rv("a0"))
        .expect("first batch");
    let refused = w.apply_blocking(
        Batch::new(scope)
            .delta(DeltaKind::Deleted, cm("a", 1, "0"))
            .rv("b2")
            .requires("b1"),
    );
    assert!(
        matches!(refused, Err(StoreError::PredecessorMissing { .. })),
        "committed over a missing predecessor: {refused:?}"
    );
    assert_eq!(
        db.store(scope).resource_version().expect("rv"),
        Some(ResourceVersion::from("a0"))
    );
}

/// F6: after a rollback drops a dictionary, a new dictionary under the same id must be read
/// with its own bytes, not a stale cached one.
#[test]
fn f6_a_dictionary_trained_again_after_a_rollback_reads_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let faults = Arc::new(Faults::default());
    let db = DurableStore::open(
        config(&dir.path().join("db.redb"), &faults)
            .compression(Compression::ZstdDict(1))
            .fsync_delay(Some(Duration::from_secs(3600))),
    )
    .expect("open");
    let w = db.writer();
    let scope = w
        .register_scope_blocking(&durable_informer::object::ScopeSpec::new("", "v1", "configmaps"))
        .expect("scope");
    let pad = |i: u64, kind: &str| format!("{kind}-{}", "abcdefgh".repeat(20 + (i % 7) as usize));
    let mut b = Batch::new(scope).rv("255");
    for i in 0..255 {
        b = b.delta(DeltaKind::Added, cm(&format!("base-{i}"), 1 + i, &pad(i, "alpha")));
    }
    w.apply_blocking(b).expect("base");
    // Ten more in a deferred batch: the dictionary is trained in this relaxed commit.
    let mut lost = Batch::new(scope).rv("300").deferred_fsync();
    for i in 0..10 {
        lost = lost.delta(DeltaKind::Added, cm(&format!("lost-{i}"), 290 + i, &pad(i, "alpha")));
    }
    w.apply_blocking(lost).expect("deferred batch");
    let key = durable_informer::ObjectKey::namespaced("ns", "lost-3");
    db.store(scope).get(&key).expect("read through the new dictionary");
    runtime().block_on(lose_deferred_commits(&db, &faults));
    assert!(db.store(scope).get(&key).expect("read").is_none(), "the batch was lost");
    // Other objects train a new dictionary, which the lost one's id is handed out to again.
    let mut b = Batch::new(scope).rv("900");
    for i in 0..300 {
        b = b.delta(
            DeltaKind::Added,
            cm(&format!("new-{i}"), 400 + i, &pad(i, "omega-zulu")),
        );
    }
    w.apply_blocking(b).expect("new objects");
    let got = db
        .store(scope)
        .get(&durable_informer::ObjectKey::namespaced("ns", "new-299"));
    assert!(
        matches!(got, Ok(Some(_))),
        "reading an object of the new dictionary: {got:?}"
    );
}

/// F7: an object's previous version that cannot be decoded must not stop updates of it.
#[test]
fn f7_an_update_succeeds_when_the_old_version_cannot_be_decoded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("db.redb");
    let scope = {
        let db = DurableStore::open(StoreConfig::new(&path).compression(Compression::ZstdDict(1))).expect("open");
        let scope = runtime().block_on(async { idle_informer(&db).await.scope() });
        let mut b = Batch::new(scope).rv("400");
        for i in 0..400u64 {
            b = b.delta(DeltaKind::Added, cm(&format!("p{i}"), 1 + i, &"v".repeat(200)));
        }
        db.writer().apply_blocking(b).expect("objects");
        db.close().expect("close");
        scope
    };
    {
        let raw = redb::Database::open(&path).expect("raw open");
        let txn = raw.begin_write().expect("txn");
        txn.open_table(redb::TableDefinition::<(u32, u32), &[u8]>::new("dicts"))
            .expect("dicts")
            .retain(|_, _| false)
            .expect("drop dictionaries");
        txn.commit().expect("commit");
    }
    let db = DurableStore::open(StoreConfig::new(&path).compression(Compression::ZstdDict(1))).expect("reopen");
    runtime().block_on(async {
        let inf = idle_informer(&db).await;
        assert_eq!(inf.scope(), scope);
        loaded(&inf).await;
        let updated = db
            .writer()
            .apply(
                Batch::new(scope)
                    .delta(DeltaKind::Updated, cm("p300", 500, "new"))
                    .rv("500"),
            )
            .await;
        assert!(updated.is_ok(), "the update failed: {updated:?}");
    });
}

/// The CPU time this process has used, in seconds (`/proc/self/stat`).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("stat");
    // The command name may hold spaces: fields are counted after its closing parenthesis.
    let after = &stat[stat.rfind(')').expect("comm") + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = fields[11].parse::<f64>().expect("utime") + fields[12].parse::<f64>().expect("stime");
    ticks / 100.0
}

/// F8: handlers must not spin once the reflector is stopped.
#[test]
fn f8_handlers_use_no_cpu_after_the_informer_is_stopped() {
    if !common::alone::in_own_process("f8_handlers_use_no_cpu_after_the_informer_is_stopped") {
        return;
    }
    let fake = Fake::new();
    fake.upsert("a", "1");
    let dir = tempfile::tempdir().expect("tempdir");
    let db = DurableStore::open(StoreConfig::new(dir.path().join("db.redb"))).expect("open");
    runtime().block_on(async {
        let inf = Informer::<ConfigMap>::builder(&db, fake.clone())
            .reflector_config(fast())
            .build()
            .await
            .expect("informer");
        let _reg = inf.add_event_handler(
            handler_fn(|_ev: Event<ConfigMap>| -> Result<(), std::convert::Infallible> { Ok(()) }),
            HandlerOptions::volatile(),
        );
        inf.start();
        inf.wait_for_sync().await.expect("synced");
        inf.stop().await.expect("stop");
        tokio::time::sleep(Duration::from_millis(200)).await;
        let before = cpu_seconds();
        tokio::time::sleep(Duration::from_secs(1)).await;
        let used = cpu_seconds() - before;
        assert!(used < 0.2, "{used:.2} s of CPU used in the second after stop()");
    });
}

/// F9: a panic on the writer thread (here in a user's index function) must be reported, must
/// not stop the writer, and must leave listers equal to the store.
#[test]
fn f9_a_panicking_index_function_is_reported_and_listers_stay_equal_to_the_store() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = DurableStore::open(StoreConfig::new(dir.path().join("db.redb"))).expect("open");
    runtime().block_on(async {
        let inf = Informer::<ConfigMap>::builder(&db, Fake::new())
            .indexer(durable_informer::store::Indexer::new("boom", |m, _| {
                assert!(m.name != "b", "index function fails on b");
                Vec::new()
            }))
            .build()
            .await
            .expect("informer");
        // Started (listers refuse an informer that never was) on a server with nothing to
        // send: the test writes through the writer itself, above the server's list RV (100).
        inf.start();
        inf.wait_for_sync().await.expect("synced");
        let scope = inf.scope();
        let w = db.writer();
        w.apply(Batch::new(scope).delta(DeltaKind::Added, cm("a", 101, "0")).rv("101"))
            .await
            .expect("a");
        loaded(&inf).await;
        let failed = w
            .apply(
                Batch::new(scope)
                    .delta(DeltaKind::Updated, cm("a", 102, "1"))
                    .delta(DeltaKind::Added, cm("b", 103, "0"))
                    .rv("103")
                    .deferred_fsync(),
            )
            .await;
        let message = format!("{:?}", failed.as_ref().err());
        assert!(
            failed.is_err() && message.contains("index function fails on b"),
            "the panic is not what the writer reports: {message}"
        );
        let lister = inf.lister();
        let listed = lister
            .namespace("ns")
            .get("a")
            .expect("get")
            .and_then(|c| c.metadata.resource_version.clone());
        assert_eq!(
            listed.as_deref(),
            Some("101"),
            "the lister shows a change that was never stored"
        );
        // The writer lives on.
        w.apply(Batch::new(scope).delta(DeltaKind::Updated, cm("a", 104, "2")).rv("104"))
            .await
            .expect("the writer still commits");
        let lister = inf.lister();
        assert!(
            eventually(Duration::from_secs(5), || lister
                .namespace("ns")
                .get("a")
                .ok()
                .flatten()
                .and_then(|c| c.metadata.resource_version.clone())
                .as_deref()
                == Some("104"))
            .await,
            "the lister follows the store again"
        );
    });
}

/// F10: a panic in a user transform stops the informer with an error that names it, and the
/// informer no longer says it is synced.
#[test]
fn f10_a_panicking_transform_is_an_error_and_the_informer_is_no_longer_synced() {
    use durable_informer::reflector::Transform;
    let fake = Fake::new();
    fake.upsert("a", "1");
    let dir = tempfile::tempdir().expect("tempdir");
    let db = DurableStore::open(StoreConfig::new(dir.path().join("db.redb"))).expect("open");
    runtime().block_on(async {
        let inf = Informer::<ConfigMap>::builder(&db, fake.clone())
            .reflector_config(fast())
            .transform(Transform {
                func: Some(Arc::new(|json: &[u8]| {
                    let text = String::from_utf8_lossy(json);
                    assert!(!text.contains("boom"), "transform fails on boom");
                    Ok(None)
                })),
                ..Transform::default()
            })
            .build()
            .await
            .expect("informer");
        inf.start();
        inf.wait_for_sync().await.expect("synced");
        fake.upsert("boom", "1");
        let noticed = eventually(Duration::from_secs(5), || !inf.has_synced()).await;
        let issues = inf.errors();
        let stopped = tokio::time::timeout(Duration::from_secs(5), inf.stop())
            .await
            .expect("stop returns");
        assert!(noticed, "the informer still says it is synced");
        assert!(
            issues.iter().any(|i| i.contains("transform fails on boom")),
            "no issue names the panic: {issues:?}"
        );
        assert!(stopped.is_err(), "stop() reports the panic: {stopped:?}");
    });
}

/// F11: a handler registered while the store cannot be read (the writer reopening after an I/O
/// error) must not die: it is served once the store reads again, and its sync is not claimed
/// before that.
#[test]
fn f11_a_handler_added_during_a_storage_fault_is_served_once_it_clears() {
    let fake = Fake::new();
    fake.upsert("a", "1");
    let dir = tempfile::tempdir().expect("tempdir");
    let faults = Arc::new(Faults::default());
    let db = DurableStore::open(config(&dir.path().join("db.redb"), &faults)).expect("open");
    runtime().block_on(async {
        let inf = Informer::<ConfigMap>::builder(&db, fake.clone())
            .reflector_config(fast())
            .build()
            .await
            .expect("informer");
        inf.start();
        inf.wait_for_sync().await.expect("synced");
        // Poison the writer and keep the file unreadable while the disk is full.
        faults.disk_full.store(true, Ordering::SeqCst);
        let _ = db
            .writer()
            .apply(
                Batch::new(inf.scope())
                    .delta(DeltaKind::Added, cm("z", 999, "0"))
                    .rv("999"),
            )
            .await;
        // The writer drops the file to reopen it, and the reopen fails while the disk is full.
        let scope = inf.scope();
        let closed = eventually(Duration::from_secs(5), || {
            matches!(db.store(scope).list(), Err(StoreError::Closed { .. }))
        })
        .await;
        assert!(closed, "the store did not become unreadable");
        let replay = Replay::default();
        let r2 = replay.clone();
        let reg = inf.add_event_handler(
            handler_fn(move |ev: Event<ConfigMap>| -> Result<(), std::convert::Infallible> {
                r2.apply(&ev);
                Ok(())
            }),
            HandlerOptions::volatile(),
        );
        let waited = tokio::time::timeout(Duration::from_millis(500), reg.wait_for_sync()).await;
        let claimed_early = waited.is_ok() && !reg.has_synced();
        faults.disk_full.store(false, Ordering::SeqCst);
        fake.upsert("b", "1");
        let served = eventually(Duration::from_secs(10), || replay.state().contains_key("b")).await;
        assert!(
            !claimed_early,
            "wait_for_sync returned while the handler was not synced"
        );
        assert!(served, "the handler never got b (events {:?})", replay.log());
        inf.shutdown().await.expect("shutdown");
    });
}

/// F12: a new durable handler's initial adds must not let compaction drop the entries after
/// its snapshot: a delete committed meanwhile reaches it.
#[test]
fn f12_compaction_waits_for_a_new_durable_handlers_initial_adds() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db =
        DurableStore::open(StoreConfig::new(dir.path().join("db.redb")).retention_entries(Some(100))).expect("open");
    runtime().block_on(async {
        let inf = idle_informer(&db).await;
        let scope = inf.scope();
        let w = db.writer();
        for chunk in 0..20u64 {
            let mut b = Batch::new(scope).rv((chunk * 100 + 100).to_string());
            for i in 0..100 {
                let n = chunk * 100 + i;
                b = b.delta(DeltaKind::Added, cm(&format!("o{n}"), n + 1, "0"));
            }
            w.apply(b).await.expect("objects");
        }
        let replay = Replay::default();
        let (hold, blocked, release) = (
            Arc::new(AtomicBool::new(true)),
            Arc::new(Notify::new()),
            Arc::new(Notify::new()),
        );
        let reg = inf.add_event_handler(
            holding_handler(&replay, "", hold, blocked.clone(), release.clone()),
            HandlerOptions::durable("h"),
        );
        tokio::time::timeout(Duration::from_secs(10), blocked.notified())
            .await
            .expect("the handler blocks in its first add");
        for i in 0..300u64 {
            w.apply(
                Batch::new(scope)
                    .delta(DeltaKind::Updated, cm(&format!("o{}", i % 50), 3000 + i, "1"))
                    .rv((3000 + i).to_string()),
            )
            .await
            .expect("update");
        }
        w.apply(
            Batch::new(scope)
                .delta(DeltaKind::Deleted, cm("o1999", 4000, "0"))
                .rv("4000"),
        )
        .await
        .expect("delete");
        let w2 = w.clone();
        tokio::task::spawn_blocking(move || w2.settle_blocking())
            .await
            .expect("join")
            .expect("retention ran");
        release.notify_one();
        let want = stored(&db, scope);
        let end = *db.writer().committed().borrow();
        let caught_up = eventually(Duration::from_secs(20), || {
            reg.cursor() >= end && replay.state() == want
        })
        .await;
        assert!(
            replay.log().iter().any(|l| l == "delete o1999"),
            "the delete committed during the initial adds never reached the handler; issues {:?}",
            inf.errors()
        );
        assert!(caught_up, "the handler's state is not the store's");
    });
}

/// A source whose LIST pages carry an empty resourceVersion and whose watches fail, as a
/// broken aggregated API server might.
#[derive(Clone)]
struct EmptyListRv(Fake);

impl durable_informer::source::Source for EmptyListRv {
    async fn list(
        &self,
        req: durable_informer::source::ListRequest,
    ) -> Result<durable_informer::source::ListPage, durable_informer::source::SourceError> {
        let mut page = self.0.list(req).await?;
        page.resource_version = ResourceVersion::from("");
        Ok(page)
    }
    async fn watch(
        &self,
        _req: durable_informer::source::WatchRequest,
    ) -> Result<durable_informer::source::WatchStream, durable_informer::source::SourceError> {
        // Its watches fail too: nothing after the list moves the resourceVersion on.
        Err(durable_informer::source::SourceError::Api {
            resource: "configmaps".into(),
            status: common::fake::status(503, "ServiceUnavailable", "broken"),
        })
    }
    async fn cluster_identity(&self) -> Result<Option<String>, durable_informer::source::SourceError> {
        self.0.cluster_identity().await
    }
    fn resource(&self) -> String {
        self.0.resource()
    }
    fn scope(&self) -> durable_informer::object::ScopeSpec {
        self.0.scope()
    }
}

/// F13: an empty list resourceVersion is never persisted, so a restart does not resume "from
/// now" and keep an object deleted while the informer was down.
#[test]
fn f13_an_empty_list_rv_is_never_persisted_and_a_restart_sees_deletes() {
    let fake = Fake::new();
    fake.upsert("a", "1");
    fake.upsert("b", "1");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("db.redb");
    runtime().block_on(async {
        let scope = {
            let db = DurableStore::open(StoreConfig::new(&path)).expect("open");
            let inf = Informer::<ConfigMap>::builder(&db, EmptyListRv(fake.clone()))
                .reflector_config(fast())
                .build()
                .await
                .expect("informer");
            inf.start();
            // The list ran: the informer synced, or refused the list and said why.
            let store = inf.store();
            let listed = eventually(Duration::from_secs(5), || {
                inf.has_synced() || !inf.errors().is_empty() || store.list().is_ok_and(|l| l.len() == 2)
            })
            .await;
            assert!(listed, "the list never ran");
            tokio::time::sleep(Duration::from_millis(100)).await;
            let _ = inf.shutdown().await;
            let persisted = db.store(inf.scope()).resource_version().expect("rv");
            eprintln!(
                "persisted {persisted:?}, synced {}, issues {:?}",
                inf.has_synced(),
                inf.errors()
            );
            assert!(
                persisted.as_ref().is_none_or(|rv| !rv.as_str().is_empty()),
                "an empty resourceVersion was persisted"
            );
            let scope = inf.scope();
            drop(inf);
            db.close().expect("close");
            scope
        };
        fake.delete("b");
        let db = DurableStore::open(StoreConfig::new(&path)).expect("reopen");
        let inf = Informer::<ConfigMap>::builder(&db, fake.clone())
            .reflector_config(fast())
            .build()
            .await
            .expect("informer");
        inf.start();
        inf.wait_for_sync().await.expect("synced");
        let want: Vec<String> = fake
            .objects()
            .keys()
            .map(|k| k.trim_start_matches("ns/").to_owned())
            .collect();
        let same = eventually(Duration::from_secs(5), || {
            stored(&db, scope).keys().cloned().collect::<Vec<_>>() == want
        })
        .await;
        assert!(same, "the store holds {:?}, the server {want:?}", stored(&db, scope));
        inf.shutdown().await.expect("shutdown");
    });
}

/// A source whose every watch from at or below `rv` sends `line` first.
#[derive(Clone)]
struct BadLine {
    fake: Fake,
    rv: u64,
    line: &'static [u8],
    sent: Arc<AtomicUsize>,
}

impl durable_informer::source::Source for BadLine {
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
        use futures::StreamExt;
        let from: u64 = req.resource_version.as_str().parse().unwrap_or(0);
        let inner = self.fake.watch(req).await?;
        if from > self.rv {
            return Ok(inner);
        }
        self.sent.fetch_add(1, Ordering::SeqCst);
        let bad = durable_informer::source::decode_watch_line(&bytes::Bytes::from_static(self.line))
            .map_err(|e| durable_informer::source::SourceError::decode("configmaps", Some(1), e));
        assert!(bad.is_err(), "the line is not decoded");
        Ok(futures::stream::iter([bad]).chain(inner).boxed())
    }
    async fn cluster_identity(&self) -> Result<Option<String>, durable_informer::source::SourceError> {
        self.fake.cluster_identity().await
    }
    fn resource(&self) -> String {
        self.fake.resource()
    }
    fn scope(&self) -> durable_informer::object::ScopeSpec {
        self.fake.scope()
    }
}

/// F14: an event of an unknown type is skipped and reported; the events after it are applied
/// (it does not stall the scope until its resourceVersion expires).
#[test]
fn f14_an_unknown_watch_event_type_is_skipped_and_later_events_apply() {
    let fake = Fake::new();
    fake.upsert("a", "1");
    let dir = tempfile::tempdir().expect("tempdir");
    let db = DurableStore::open(StoreConfig::new(dir.path().join("db.redb"))).expect("open");
    runtime().block_on(async {
        let source = BadLine {
            fake: fake.clone(),
            rv: fake.current_rv() + 1000,
            line: br#"{"type":"FUTURE","object":{"metadata":{"name":"q","resourceVersion":"1"}}}"#,
            sent: Arc::default(),
        };
        let inf = Informer::<ConfigMap>::builder(&db, source.clone())
            .reflector_config(fast())
            .build()
            .await
            .expect("informer");
        inf.start();
        inf.wait_for_sync().await.expect("synced");
        fake.upsert("c", "1");
        let scope = inf.scope();
        let applied = eventually(Duration::from_secs(5), || stored(&db, scope).contains_key("c")).await;
        assert!(applied, "c was not stored; issues {:?}", inf.errors());
        assert!(source.sent.load(Ordering::SeqCst) >= 1, "the unknown event was sent");
        assert!(
            inf.errors().iter().any(|e| e.contains("FUTURE")),
            "the skipped event was not reported: {:?}",
            inf.errors()
        );
        inf.shutdown().await.expect("shutdown");
    });
}

/// F14, the other half: a line that may have carried a change and stays unreadable (every
/// watch from the same place sends it) makes the scope relist, after one plain re-watch; the
/// events after it apply.
#[test]
fn f14_a_line_that_stays_unreadable_is_skipped_by_a_relist() {
    let fake = Fake::new();
    fake.upsert("a", "1");
    let dir = tempfile::tempdir().expect("tempdir");
    let db = DurableStore::open(StoreConfig::new(dir.path().join("db.redb"))).expect("open");
    runtime().block_on(async {
        let source = BadLine {
            fake: fake.clone(),
            // Watches from the initial list's RV meet it; those from after a relist do not.
            rv: fake.current_rv(),
            line: br#"{"type":"ADDED","object":{"metadata":{"name":"q","resourceVers"#,
            sent: Arc::default(),
        };
        let inf = Informer::<ConfigMap>::builder(&db, source.clone())
            .reflector_config(fast())
            .build()
            .await
            .expect("informer");
        inf.start();
        inf.wait_for_sync().await.expect("synced");
        fake.bump_rv();
        fake.upsert("c", "1");
        let scope = inf.scope();
        let applied = eventually(Duration::from_secs(5), || stored(&db, scope).contains_key("c")).await;
        assert!(applied, "c was not stored; issues {:?}", inf.errors());
        let status = inf.status().borrow().clone();
        assert_eq!(status.relists, 1, "one relist: {status:?}");
        assert_eq!(
            source.sent.load(Ordering::SeqCst),
            2,
            "re-watched once before the relist"
        );
        assert!(
            status
                .last_list_reason
                .as_ref()
                .is_some_and(|r| r.class() == "skipped_event"),
            "{status:?}"
        );
        inf.shutdown().await.expect("shutdown");
    });
}
