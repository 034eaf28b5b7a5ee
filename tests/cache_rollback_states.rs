//! What a volatile handler is told as an update's previous state when a rollback takes a change
//! back and the writer hands its seq out again (issue #33: "seqs that a rollback hands out again
//! are never confused with the ones taken back").
//!
//! The informer's cache holds no JSON here (`object_cache_bytes(0)`), so a state the handler
//! was told is read back from redb when it has to be told as an update's `old`. Reading back a
//! state by the seq of the change that replaced it (`LogRecord::old` of that seq) is only right
//! while that seq still names that change.

mod common;
#[path = "common/faults.rs"]
mod faults;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::fake::Fake;
use durable_informer::informer::{async_handler_fn, Event, HandlerOptions, Informer};
use durable_informer::object::{RawObject, ScopeSpec};
use durable_informer::reflector::ReflectorConfig;
use durable_informer::store::{Batch, DeltaKind, DurableStore, Seq};
use faults::{config, Faults};
use k8s_openapi::api::core::v1::ConfigMap;
use tokio::sync::Notify;

/// A ConfigMap in namespace `ns` at resourceVersion `rv`.
fn cm(name: &str, rv: u64) -> RawObject {
    RawObject::from_json(
        format!(
            r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"{name}","namespace":"ns","resourceVersion":"{rv}"}},"data":{{"v":"{rv}"}}}}"#
        )
        .into_bytes(),
    )
    .expect("object")
}

fn rv_of(c: &ConfigMap) -> String {
    c.metadata.resource_version.clone().unwrap_or_default()
}

fn name_of(c: &ConfigMap) -> String {
    c.metadata.name.clone().unwrap_or_default()
}

/// What a handler was told, replayed (name → resourceVersion), and every update whose previous
/// state was not the one the handler had been told last.
#[derive(Default, Clone)]
struct Told {
    state: Arc<Mutex<BTreeMap<String, String>>>,
    wrong_old: Arc<Mutex<Vec<String>>>,
    log: Arc<Mutex<Vec<String>>>,
}

impl Told {
    fn apply(&self, ev: &Event<ConfigMap>) {
        let mut state = self.state.lock().expect("told");
        let line = match ev {
            Event::Add { object, .. } => {
                state.insert(name_of(object), rv_of(object));
                format!("add {}@{}", name_of(object), rv_of(object))
            }
            Event::Update { old, new, .. } => {
                let held = state.insert(name_of(new), rv_of(new));
                if held.as_deref() != Some(rv_of(old).as_str()) {
                    self.wrong_old.lock().expect("told").push(format!(
                        "update of {} to {}: old is @{}, the handler was told @{}",
                        name_of(new),
                        rv_of(new),
                        rv_of(old),
                        held.unwrap_or_default()
                    ));
                }
                format!("update {}@{}->@{}", name_of(new), rv_of(old), rv_of(new))
            }
            Event::Delete { object, .. } => {
                state.remove(&name_of(object));
                format!("delete {}", name_of(object))
            }
        };
        self.log.lock().expect("told").push(line);
    }
}

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

/// Fails the next durable commit with a full disk, then lets the writer reopen the file: the
/// commits not yet on disk are lost, and their seqs are handed out again.
async fn lose_deferred_commits(db: &DurableStore, faults: &Faults) {
    faults.disk_full.store(true, Ordering::SeqCst);
    assert!(
        db.writer().flush().await.is_err(),
        "the durable commit should fail on a full disk"
    );
    faults.disk_full.store(false, Ordering::SeqCst);
    for _ in 0..200 {
        if db.writer().flush().await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the writer did not recover after the disk had space again");
}

/// An update taken back by a rollback is told as an update from the state taken back (the one
/// the handler was told) to the restored one, never from the state some later change that
/// reuses the taken-back seq replaced.
#[test]
fn a_rolled_back_update_is_told_from_the_state_taken_back_not_from_a_reissued_seq() {
    let dir = tempfile::tempdir().expect("tempdir");
    let faults = Arc::new(Faults::default());
    // Deferred batches reach the disk only with an explicit flush.
    let db =
        DurableStore::open(config(&dir.path().join("db.redb"), &faults).fsync_delay(Some(Duration::from_secs(3600))))
            .expect("open");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let w = db.writer();
        let scope = w
            .register_scope(&ScopeSpec::new("", "v1", "configmaps"))
            .await
            .expect("scope");
        // seq 1: k@1, on disk, before the informer: its cache loads it from a snapshot.
        w.apply(Batch::new(scope).delta(DeltaKind::Added, cm("k", 1)).rv("1"))
            .await
            .expect("base");
        // Never started: the test writes through the writer itself.
        let inf = Informer::<ConfigMap>::builder(&db, Fake::new())
            .reflector_config(ReflectorConfig::default())
            .object_cache_bytes(0)
            .build()
            .await
            .expect("informer");
        assert_eq!(inf.scope(), scope);
        assert!(
            eventually(Duration::from_secs(10), || inf.cache_stats().loaded).await,
            "the cache loads"
        );

        // The handler blocks in its first event (the initial add of k) until released, so
        // everything below queues up for it.
        let told = Told::default();
        let (hold, blocked, release) = (
            Arc::new(AtomicBool::new(true)),
            Arc::new(Notify::new()),
            Arc::new(Notify::new()),
        );
        let handler = {
            let (told, hold, blocked, release) = (told.clone(), hold.clone(), blocked.clone(), release.clone());
            async_handler_fn(move |ev: Event<ConfigMap>| {
                let (told, hold, blocked, release) = (told.clone(), hold.clone(), blocked.clone(), release.clone());
                async move {
                    if hold.swap(false, Ordering::SeqCst) {
                        blocked.notify_one();
                        release.notified().await;
                    }
                    told.apply(&ev);
                    Ok::<(), std::convert::Infallible>(())
                }
            })
        };
        let _reg = inf.add_event_handler(handler, HandlerOptions::volatile());
        tokio::time::timeout(Duration::from_secs(10), blocked.notified())
            .await
            .expect("the handler is told of k and blocks");

        // Deferred (acknowledged, not on disk): seq 2 adds p, seq 3 updates k to @3.
        w.apply(
            Batch::new(scope)
                .delta(DeltaKind::Added, cm("p", 2))
                .delta(DeltaKind::Updated, cm("k", 3))
                .rv("3")
                .requires("1")
                .deferred_fsync(),
        )
        .await
        .expect("deferred k@3");
        // seq 4, deferred too: the cache applies it after k@3 committed.
        w.apply(
            Batch::new(scope)
                .delta(DeltaKind::Added, cm("x", 4))
                .rv("4")
                .requires("3")
                .deferred_fsync(),
        )
        .await
        .expect("deferred x@4");
        assert!(
            eventually(Duration::from_secs(10), || inf.cache_stats().seq >= Seq(4)).await,
            "the cache applies seq 4"
        );

        // Lost: the cache takes seqs 2..=4 back (k back to @1), and the handler is to hear of
        // k going from @3 back to @1.
        lose_deferred_commits(&db, &faults).await;
        // The refetch reuses seqs 2 and 3, for k@5 and k@6.
        w.apply(
            Batch::new(scope)
                .delta(DeltaKind::Updated, cm("k", 5))
                .rv("5")
                .requires("1"),
        )
        .await
        .expect("k@5");
        w.apply(
            Batch::new(scope)
                .delta(DeltaKind::Updated, cm("k", 6))
                .rv("6")
                .requires("5"),
        )
        .await
        .expect("k@6");
        let reissued = db.log().record(Seq(3), scope).expect("read the log").expect("seq 3");
        assert_eq!(
            (reissued.key.name.as_str(), reissued.rv.to_string()),
            ("k", "6".to_string()),
            "the scenario: seq 3, once k@3, now names k@6 (whose previous state is k@5)"
        );

        release.notify_one();
        let want: BTreeMap<String, String> = [("k".to_string(), "6".to_string())].into();
        let caught_up = eventually(Duration::from_secs(10), || *told.state.lock().expect("told") == want).await;
        let log = told.log.lock().expect("told").clone();
        assert!(
            caught_up,
            "the handler, replayed, ends at the store's state; told {log:?}"
        );
        let wrong = told.wrong_old.lock().expect("told").clone();
        assert!(
            wrong.is_empty(),
            "updates told with a previous state the handler never held:\n{}\nevents told: {log:?}",
            wrong.join("\n")
        );
        assert!(
            log.iter().any(|l| l == "update k@3->@1"),
            "the rollback is told as k going from @3 back to @1; told {log:?}"
        );
    });
}

/// A gate the writer thread waits at (in an index function) while it is closed.
#[derive(Default)]
struct Gate {
    closed: Mutex<bool>,
    cv: std::sync::Condvar,
    /// Someone waited at it.
    reached: AtomicBool,
}

impl Gate {
    fn closed() -> Arc<Self> {
        let g = Arc::new(Self::default());
        *g.closed.lock().expect("gate") = true;
        g
    }

    fn pass(&self) {
        self.reached.store(true, Ordering::SeqCst);
        let mut closed = self.closed.lock().expect("gate");
        while *closed {
            closed = self.cv.wait(closed).expect("gate");
        }
    }

    fn open(&self) {
        *self.closed.lock().expect("gate") = false;
        self.cv.notify_all();
    }
}

/// A volatile handler registered while the cache reloads (here: a commit reported failed, its
/// fsync having failed, is found on disk when the writer reopens the file, so every stream
/// reader is sent back to redb) is told every object of the reloaded table as its initial
/// list, not only what the reload changed (found by the handler oracle with
/// `live_inspection`, seed 103: a late handler never heard of three unchanged objects).
#[test]
fn a_volatile_handler_registered_while_the_cache_reloads_hears_of_every_object() {
    let dir = tempfile::tempdir().expect("tempdir");
    let faults = Arc::new(Faults::default());
    let db = DurableStore::open(config(&dir.path().join("db.redb"), &faults)).expect("open");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    // The writer thread waits at `at_x` while it applies x, and at `at_y` while it applies y.
    let (at_x, at_y) = (Gate::closed(), Gate::closed());
    let (gx, gy) = (at_x.clone(), at_y.clone());
    let indexer = durable_informer::store::Indexer::new("gate", move |meta, _| {
        match meta.name.as_str() {
            "x" => gx.pass(),
            "y" => gy.pass(),
            _ => {}
        }
        Vec::new()
    });
    rt.block_on(async {
        let inf = Informer::<ConfigMap>::builder(&db, Fake::new())
            .reflector_config(ReflectorConfig::default())
            .indexer(indexer)
            .build()
            .await
            .expect("informer");
        let scope = inf.scope();
        let w = db.writer();
        let mut base = Batch::new(scope).rv("3");
        for (i, name) in ["a", "b", "c"].iter().enumerate() {
            base = base.delta(DeltaKind::Added, cm(name, i as u64 + 1));
        }
        w.apply(base).await.expect("base");
        assert!(
            eventually(Duration::from_secs(10), || {
                let s = inf.cache_stats();
                s.loaded && s.objects == 3
            })
            .await,
            "the cache loads the base"
        );
        // x's group: the writer waits at the gate while y queues behind it; then x's fsync
        // fails (reported failed, yet on disk), and y's group starts with the reopen that
        // finds x and sends the cache back to redb. The cache's reload then waits behind y,
        // which waits at its gate.
        faults.fail_syncs.store(1, Ordering::SeqCst);
        let x = w
            .submit(
                Batch::new(scope)
                    .delta(DeltaKind::Added, cm("x", 4))
                    .rv("4")
                    .requires("3"),
            )
            .expect("submit x");
        assert!(
            eventually(Duration::from_secs(10), || at_x.reached.load(Ordering::SeqCst)).await,
            "the writer applies x"
        );
        let y = w
            .submit(Batch::new(scope).delta(DeltaKind::Added, cm("y", 5)).rv("5"))
            .expect("submit y");
        at_x.open();
        assert!(x.await.expect("x answered").is_err(), "x's commit is reported failed");
        let reloading = eventually(Duration::from_secs(10), || !inf.cache_stats().loaded).await;
        if !reloading {
            at_y.open();
            panic!("the cache did not reload (x was not found on disk?)");
        }
        let told = Told::default();
        let t2 = told.clone();
        let _reg = inf.add_event_handler(
            async_handler_fn(move |ev: Event<ConfigMap>| {
                t2.apply(&ev);
                async { Ok::<(), std::convert::Infallible>(()) }
            }),
            HandlerOptions::volatile(),
        );
        // Its task registers it while the reload waits.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!inf.cache_stats().loaded, "still reloading");
        at_y.open();
        y.await.expect("y answered").expect("y committed");
        let want: BTreeMap<String, String> = [("a", "1"), ("b", "2"), ("c", "3"), ("x", "4"), ("y", "5")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let heard = eventually(Duration::from_secs(10), || *told.state.lock().expect("told") == want).await;
        assert!(
            heard,
            "the handler registered during the reload holds {:?}; the store holds {want:?}; told {:?}",
            told.state.lock().expect("told").clone(),
            told.log.lock().expect("told").clone()
        );
    });
}
