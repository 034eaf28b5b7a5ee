//! The kube-shaped reader (`Informer::reader`) against the simulated cluster: it answers as
//! kube's `reflector::Store` does, an informer nobody started is an error rather than stale
//! data, and its reads never touch redb on a runtime thread, even right after a restart that
//! left every object on disk.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;
use std::time::Duration;

use durable_informer::informer::{Informer, InformerError};
use durable_informer::sim::Sim;
use durable_informer::source::KubeSource;
use durable_informer::store::{DurableStore, StoreConfig, StoreError};
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;
use redb::backends::FileBackend;
use redb::StorageBackend;

#[path = "common/backend.rs"]
mod backend;
use backend::{hooked, Hooks};

const PODS: usize = 40;

#[path = "common/pods_sim.rs"]
mod pods_sim;

fn sim() -> Sim {
    pods_sim::sim_with_pods(7, PODS)
}

async fn pods(db: &DurableStore, sim: &Sim) -> Informer<Pod> {
    Informer::<Pod>::builder(db, KubeSource::typed::<Pod>(sim.client().unwrap(), &sim.url()))
        .build()
        .await
        .unwrap()
}

fn keys(pods: &[Arc<Pod>]) -> BTreeSet<String> {
    pods.iter()
        .map(|p| format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any()))
        .collect()
}

async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..200 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting until {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reader_answers_like_kubes_store_and_follows_changes() {
    let sim = tokio::task::spawn_blocking(sim).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let db = DurableStore::open(StoreConfig::new(dir.path().join("r.redb"))).unwrap();
    let informer = pods(&db, &sim).await;
    let reader = informer.reader();
    assert!(!reader.is_ready());
    assert!(reader.state().is_empty(), "empty before ready, as kube's store");
    informer.start();
    tokio::time::timeout(Duration::from_secs(20), reader.wait_until_ready())
        .await
        .expect("ready in time")
        .expect("ready");
    let state = reader.state();
    assert_eq!(state.len(), PODS);
    assert_eq!(reader.len(), PODS);
    // The same answers as the fallible lister.
    let listed = informer.lister().state().unwrap();
    assert_eq!(keys(&state), keys(&listed));
    let first = state[0].clone();
    let r = ObjectRef::<Pod>::new(&first.name_any()).within(&first.namespace().unwrap());
    assert_eq!(reader.get(&r).map(|p| p.name_any()), Some(first.name_any()));
    assert!(reader.get(&ObjectRef::new("no-such-pod").within("default")).is_none());
    let last = state[PODS - 1].name_any();
    assert_eq!(reader.find(|p| p.name_any() == last).map(|p| p.name_any()), Some(last));
    assert!(reader.find(|_| false).is_none());
    // kube's state_filter and state_filter_selector, against a filter of the whole state.
    let web = |p: &Pod| p.labels().get("app").map(String::as_str) == Some("web");
    let want: Vec<_> = state.iter().filter(|p| web(p)).cloned().collect();
    assert!(!want.is_empty() && want.len() < PODS, "the workload has some web pods");
    assert_eq!(keys(&reader.state_filter(web)), keys(&want));
    let selector: kube::core::Selector = kube::core::Expression::Equal("app".into(), "web".into()).into();
    assert_eq!(keys(&reader.state_filter_selector(&selector)), keys(&want));
    assert_eq!(reader.state_filter_selector(&selector).len(), want.len());
    assert!(!reader.is_empty());

    // A change on the server reaches the reader.
    sim.delete("pods", first.namespace().as_deref(), &first.name_any())
        .unwrap();
    eventually("the deleted pod left the reader", || reader.get(&r).is_none()).await;
    assert_eq!(reader.len(), PODS - 1);
    informer.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_informer_never_started_is_an_error_not_its_last_state() {
    let sim = tokio::task::spawn_blocking(sim).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.redb");
    // A first run stores the pods.
    {
        let db = DurableStore::open(StoreConfig::new(&path)).unwrap();
        let informer = pods(&db, &sim).await;
        informer.start();
        informer.wait_for_sync().await.unwrap();
        assert_eq!(informer.lister().state().unwrap().len(), PODS);
        informer.shutdown().await.unwrap();
        drop(informer);
        tokio::task::spawn_blocking(move || db.close()).await.unwrap().unwrap();
    }
    // The next run forgets start(): the database holds the pods, but nothing serves them.
    let db = DurableStore::open(StoreConfig::new(&path)).unwrap();
    let informer = pods(&db, &sim).await;
    assert!(informer.is_restored());
    match informer.lister().state() {
        Err(StoreError::NotStarted { resource }) => assert_eq!(resource, "pods"),
        other => panic!("expected NotStarted, got {:?}", other.map(|v| v.len())),
    }
    assert!(matches!(
        informer.lister().namespace("default").get("x"),
        Err(StoreError::NotStarted { .. })
    ));
    let waited = tokio::time::timeout(Duration::from_secs(10), informer.wait_for_sync())
        .await
        .expect("wait_for_sync returns instead of waiting for ever");
    assert!(matches!(waited, Err(InformerError::NotStarted { .. })), "{waited:?}");
    let reader = informer.reader();
    let ready = tokio::time::timeout(Duration::from_secs(10), reader.wait_until_ready())
        .await
        .expect("wait_until_ready returns");
    assert!(matches!(ready, Err(InformerError::NotStarted { .. })), "{ready:?}");
    assert!(reader.state().is_empty() && reader.is_empty());

    // Started, both serve the pods.
    informer.start();
    informer.wait_for_sync().await.unwrap();
    reader.wait_until_ready().await.unwrap();
    assert_eq!(informer.lister().state().unwrap().len(), PODS);
    assert_eq!(reader.len(), PODS);
    informer.shutdown().await.unwrap();
}

/// Records the threads that read the database file.
impl Hooks for Mutex<Vec<ThreadId>> {
    fn read(&self, file: &FileBackend, offset: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
        self.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(std::thread::current().id());
        file.read(offset, out)
    }
}

/// On a current-thread runtime the test's thread is the only worker: a redb read on it is a
/// read on a runtime worker. The lister (with no object cache) shows the check catches one; the
/// reader, over the same restored informer, makes none.
#[test]
fn reader_reads_never_touch_redb_on_the_runtime_thread() {
    let sim = sim();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.redb");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // A first run stores the pods.
    rt.block_on(async {
        let db = DurableStore::open(StoreConfig::new(&path)).unwrap();
        let informer = pods(&db, &sim).await;
        informer.start();
        informer.wait_for_sync().await.unwrap();
        informer.shutdown().await.unwrap();
        drop(informer);
        tokio::task::spawn_blocking(move || db.close()).await.unwrap().unwrap();
    });
    let readers: Arc<Mutex<Vec<ThreadId>>> = Arc::default();
    // No redb page cache and no object cache: every lister read of an object goes to the file.
    let config = hooked(StoreConfig::new(&path).cache_bytes(0).object_cache_bytes(0), &readers);
    let me = std::thread::current().id();
    let on_me = |readers: &Mutex<Vec<ThreadId>>| readers.lock().unwrap().iter().filter(|t| **t == me).count();
    rt.block_on(async {
        let db = DurableStore::open(config).unwrap();
        let informer = pods(&db, &sim).await;
        assert!(informer.is_restored());
        informer.start();
        informer.wait_for_sync().await.unwrap();
        // The restored objects are on disk only.
        eventually("the cache loaded", || informer.cache_stats().loaded).await;
        assert_eq!(informer.cache_stats().with_json, 0);
        let lister = informer.lister();
        let some = lister.state().unwrap();
        assert_eq!(some.len(), PODS);
        readers.lock().unwrap().clear();
        // The control: a lister get reads redb on this thread.
        let p = &some[PODS / 2];
        let got = lister.namespace(&p.namespace().unwrap()).get(&p.name_any()).unwrap();
        assert!(got.is_some());
        assert!(
            on_me(&readers) > 0,
            "the check sees a lister's read on the runtime thread"
        );

        let reader = informer.reader();
        reader.wait_until_ready().await.unwrap();
        assert_eq!(informer.cache_stats().with_json, PODS, "the reader pinned every object");
        // No await from here on: nothing but these reads runs on this thread.
        readers.lock().unwrap().clear();
        let state = reader.state();
        assert_eq!(state.len(), PODS);
        for p in &state {
            let r = ObjectRef::<Pod>::new(&p.name_any()).within(&p.namespace().unwrap());
            assert!(reader.get(&r).is_some());
        }
        assert!(reader.find(|p| p.name_any() == "no-such-pod").is_none());
        assert_eq!(on_me(&readers), 0, "no redb read on the runtime thread");
        informer.shutdown().await.unwrap();
    });
}
