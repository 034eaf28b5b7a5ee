//! Label-ring sharding over HTTP against the simulated server: shards holding their own Leases,
//! a sharder labelling ConfigMaps with the shard the ring assigns, controllers reconciling only
//! their shard's objects, the drain handshake when a shard joins, reassignment when a shard dies
//! or leaves, conflicts retried, and a shard restarted on its database without a LIST.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use durable_informer::controller::{default_error_policy, Action, Config, Controller};
use durable_informer::informer::{handler_fn, Event, HandlerOptions, Informer};
use durable_informer::leader::{LeaderElectionConfig, LeaderError};
use durable_informer::object::ObjectKey;
use durable_informer::selector::{RingLabels, RingMember};
use durable_informer::sharding::{
    ring_key, shard_lease, HashRing, RingShard, ShardState, ShardedResource, Sharder, SharderStatus, SHARDER_IDENTITY,
};
use durable_informer::sim::{Sim, SimConfig};
use durable_informer::source::KubeSource;
use durable_informer::store::{DurableStore, StoreConfig};
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams};
use kube::core::ApiResource;
use kube::ResourceExt;
use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinHandle;

const NS: &str = "ns";
const LEASES: &str = "default";
const RING: &str = "cms";

fn fast() -> LeaderElectionConfig {
    LeaderElectionConfig {
        lease_duration: Duration::from_millis(1500),
        renew_deadline: Duration::from_millis(1000),
        retry_period: Duration::from_millis(200),
        release_on_cancel: true,
    }
}

fn labels() -> RingLabels {
    RingLabels::new(RING).unwrap()
}

fn member(id: &str) -> RingMember {
    labels().member(id).unwrap()
}

fn sim_with(configmaps: usize) -> Sim {
    let sim = Sim::start(SimConfig::default().bookmark_interval(Duration::from_millis(300))).unwrap();
    for i in 0..configmaps {
        sim.create(
            "configmaps",
            Some(NS),
            json!({"metadata": {"name": format!("cm-{i}"), "namespace": NS}, "data": {"v": "0"}}),
        )
        .unwrap();
    }
    sim
}

/// Who reconciles what, and any moment two shards reconciled one key at once.
#[derive(Default)]
struct Tracker {
    in_flight: Mutex<BTreeMap<String, String>>,
    overlaps: Mutex<Vec<String>>,
    reconciled: Mutex<BTreeMap<String, BTreeSet<String>>>,
}

impl Tracker {
    async fn reconcile(&self, shard: &str, key: &ObjectKey) {
        let key = key.to_string();
        {
            let mut f = self.in_flight.lock().unwrap();
            if let Some(other) = f.insert(key.clone(), shard.to_owned()) {
                self.overlaps
                    .lock()
                    .unwrap()
                    .push(format!("{key}: {other} and {shard}"));
            }
        }
        self.reconciled
            .lock()
            .unwrap()
            .entry(shard.to_owned())
            .or_default()
            .insert(key.clone());
        // Long enough for a drain to arrive in the middle of a reconcile.
        tokio::time::sleep(Duration::from_millis(15)).await;
        let mut f = self.in_flight.lock().unwrap();
        if f.get(&key).map(String::as_str) == Some(shard) {
            f.remove(&key);
        }
    }

    fn reconciled_by(&self, shard: &str) -> BTreeSet<String> {
        self.reconciled.lock().unwrap().get(shard).cloned().unwrap_or_default()
    }
}

/// One replica: its Lease, its informer (own database), its controller.
struct ShardProc {
    id: String,
    informer: Informer<ConfigMap>,
    shard: RingShard,
    stop: watch::Sender<bool>,
    lease_stop: watch::Sender<bool>,
    controller: JoinHandle<()>,
    lease: JoinHandle<Result<(), LeaderError>>,
    /// The database lives as long as the replica.
    _db: DurableStore,
}

async fn start_shard(sim: &Sim, dir: &std::path::Path, id: &str, tracker: Arc<Tracker>) -> ShardProc {
    let client = sim.client().unwrap();
    let me = member(id);
    let db = DurableStore::open(StoreConfig::new(dir.join(format!("{id}.redb")))).unwrap();
    let informer = Informer::<ConfigMap>::builder(&db, KubeSource::typed::<ConfigMap>(client.clone(), &sim.url()))
        .ring_shard(&me)
        .build()
        .await
        .unwrap();
    let shard = RingShard::new(client.clone(), me.clone());
    let lease = shard_lease(client, LEASES, &me, fast());
    let holding = lease.fenced_leadership();
    let (lease_stop, lease_rx) = watch::channel(false);
    let lease = tokio::spawn(lease.run(lease_rx));
    let (stop, stop_rx) = watch::channel(false);
    let name = id.to_owned();
    let reconcile = move |cm: Arc<ConfigMap>, _ctx: Arc<()>| {
        let (tracker, name) = (tracker.clone(), name.clone());
        async move {
            let key = ObjectKey {
                namespace: cm.metadata.namespace.clone(),
                name: cm.metadata.name.clone().unwrap_or_default(),
            };
            tracker.reconcile(&name, &key).await;
            // Reconcile again soon: a shard that kept a key it no longer owns would show.
            Ok::<_, std::io::Error>(Action::requeue(Duration::from_millis(100)))
        }
    };
    let mut stop_rx = stop_rx;
    let controller = Controller::for_informer(informer.clone())
        .with_config(Config::default().concurrency(4))
        .leader_election(holding)
        .graceful_shutdown_on(async move {
            let _ = stop_rx.wait_for(|s| *s).await;
        })
        .run(shard.guard(&informer, reconcile), default_error_policy, Arc::new(()));
    let controller = tokio::spawn(controller.for_each(|item| {
        assert!(
            !matches!(item, Err(durable_informer::controller::Error::Informer(_))),
            "caches synced"
        );
        async {}
    }));
    ShardProc {
        id: id.to_owned(),
        informer,
        shard,
        stop,
        lease_stop,
        controller,
        lease,
        _db: db,
    }
}

impl ShardProc {
    /// A clean stop: the controller first, then the Lease (released).
    async fn shutdown(self) {
        self.stop.send(true).unwrap();
        self.controller.await.unwrap();
        self.lease_stop.send(true).unwrap();
        self.lease.await.unwrap().unwrap();
        self.informer.shutdown().await.unwrap();
    }

    /// SIGKILL-like: nothing is released.
    async fn kill(self) {
        self.controller.abort();
        self.lease.abort();
        let _ = self.informer.stop().await;
    }

    fn stored(&self) -> BTreeSet<String> {
        stored(&self.informer)
    }
}

fn stored(informer: &Informer<ConfigMap>) -> BTreeSet<String> {
    informer
        .store()
        .list_keys()
        .unwrap()
        .into_iter()
        .map(|k| k.to_string())
        .collect()
}

/// Starts shards `ids` and waits until each holds its Lease, so a sharder started next assigns
/// every object straight to its final shard.
async fn start_shards(sim: &Sim, dir: &std::path::Path, ids: &[&str], tracker: &Arc<Tracker>) -> Vec<ShardProc> {
    let mut procs = Vec::new();
    for id in ids {
        procs.push(start_shard(sim, dir, id, tracker.clone()).await);
    }
    for id in ids {
        eventually(&format!("shard {id} holds its Lease"), || async {
            sim.get("leases", Some(LEASES), id)
                .is_ok_and(|l| l["spec"]["holderIdentity"] == *id)
        })
        .await;
    }
    procs
}

fn start_sharder(sim: &Sim) -> (watch::Receiver<SharderStatus>, watch::Sender<bool>, JoinHandle<()>) {
    let sharder = Sharder::new(sim.client().unwrap(), LEASES, labels()).resource(ShardedResource::of::<ConfigMap>());
    let status = sharder.status();
    let (stop, rx) = watch::channel(false);
    let task = tokio::spawn(async move { sharder.run(rx).await.unwrap() });
    (status, stop, task)
}

/// Every ConfigMap on the server: key → its shard label.
async fn assignments(sim: &Sim) -> BTreeMap<String, Option<String>> {
    let api: Api<ConfigMap> = Api::namespaced(sim.client().unwrap(), NS);
    let shard_label = labels().shard_label().to_owned();
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|cm| {
            let shard = cm.labels().get(&shard_label).cloned();
            (format!("{NS}/{}", cm.name_any()), shard)
        })
        .collect()
}

/// What the ring over `shards` assigns each ConfigMap.
fn expected(keys: impl IntoIterator<Item = String>, shards: &[&str]) -> BTreeMap<String, Option<String>> {
    let ring = HashRing::new(shards);
    keys.into_iter()
        .map(|k| {
            let name = k.rsplit('/').next().unwrap_or_default().to_owned();
            let owner = ring
                .shard_for(&ring_key("", "ConfigMap", Some(NS), &name))
                .map(str::to_owned);
            (k, owner)
        })
        .collect()
}

async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !check().await {
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the server's labels are the ring's over `shards` and each shard's cache holds
/// exactly its labelled objects; returns the assignment.
async fn converge(sim: &Sim, procs: &[&ShardProc], shards: &[&str]) -> BTreeMap<String, Option<String>> {
    let keys: Vec<String> = assignments(sim).await.into_keys().collect();
    let want = expected(keys, shards);
    eventually("the server's labels follow the ring", || async {
        assignments(sim).await == want
    })
    .await;
    for p in procs {
        let mine: BTreeSet<String> = want
            .iter()
            .filter(|(_, s)| s.as_deref() == Some(p.id.as_str()))
            .map(|(k, _)| k.clone())
            .collect();
        eventually(&format!("shard {} caches its objects", p.id), || {
            let ok = p.stored() == mine;
            async move { ok }
        })
        .await;
    }
    want
}

fn partition_is_exact(procs: &[&ShardProc], all: usize) {
    let mut union = BTreeSet::new();
    let mut total = 0;
    for p in procs {
        let s = p.stored();
        total += s.len();
        union.extend(s);
    }
    assert_eq!(total, all, "shards overlap");
    assert_eq!(union.len(), all, "shards miss objects");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_shards_partition_the_objects_and_a_fourth_takes_about_a_quarter_through_drains() {
    let sim = sim_with(120);
    let dir = tempfile::tempdir().unwrap();
    let tracker = Arc::new(Tracker::default());
    let mut procs = start_shards(&sim, dir.path(), &["a", "b", "c"], &tracker).await;
    let (status, sharder_stop, sharder) = start_sharder(&sim);
    let three = converge(&sim, &procs.iter().collect::<Vec<_>>(), &["a", "b", "c"]).await;
    partition_is_exact(&procs.iter().collect::<Vec<_>>(), 120);
    // Each shard reconciled its own objects and only those.
    for p in &procs {
        let mine: BTreeSet<String> = three
            .iter()
            .filter(|(_, s)| s.as_deref() == Some(p.id.as_str()))
            .map(|(k, _)| k.clone())
            .collect();
        eventually(&format!("shard {} reconciled its objects", p.id), || {
            let ok = tracker.reconciled_by(&p.id) == mine;
            async move { ok }
        })
        .await;
    }
    assert_eq!(status.borrow().drains, 0, "nothing moved from a live shard yet");

    // A fourth shard joins.
    procs.push(start_shard(&sim, dir.path(), "d", tracker.clone()).await);
    let four = converge(&sim, &procs.iter().collect::<Vec<_>>(), &["a", "b", "c", "d"]).await;
    partition_is_exact(&procs.iter().collect::<Vec<_>>(), 120);
    let moved: BTreeSet<&String> = four.keys().filter(|k| three[*k] != four[*k]).collect();
    assert!(
        moved.iter().all(|k| four[*k].as_deref() == Some("d")),
        "objects moved between old shards"
    );
    // About a quarter (the ring's spread with 100 tokens keeps it well inside this).
    assert!((12..=48).contains(&moved.len()), "moved {} of 120", moved.len());
    // Each move from a live shard went through a drain that its old shard acknowledged.
    let acknowledged: u64 = procs.iter().map(|p| p.shard.drains_acknowledged()).sum();
    assert_eq!(acknowledged, moved.len() as u64);
    assert_eq!(status.borrow().drains, moved.len() as u64);
    let moved_keys: BTreeSet<String> = moved.iter().map(|k| (*k).clone()).collect();
    eventually("the new shard reconciled what it took over", || {
        let ok = tracker.reconciled_by("d").is_superset(&moved_keys);
        async move { ok }
    })
    .await;
    assert!(
        tracker.overlaps.lock().unwrap().is_empty(),
        "two shards reconciled one key at once: {:?}",
        tracker.overlaps.lock().unwrap()
    );
    assert_eq!(
        status.borrow().ring,
        vec!["a".to_owned(), "b".into(), "c".into(), "d".into()]
    );
    for p in procs {
        p.shutdown().await;
    }
    sharder_stop.send(true).unwrap();
    sharder.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_shard_is_fenced_after_its_lease_expires_and_its_objects_reassigned() {
    let sim = sim_with(60);
    let dir = tempfile::tempdir().unwrap();
    let tracker = Arc::new(Tracker::default());
    let mut procs = start_shards(&sim, dir.path(), &["a", "b", "c"], &tracker).await;
    let (status, sharder_stop, sharder) = start_sharder(&sim);
    converge(&sim, &procs.iter().collect::<Vec<_>>(), &["a", "b", "c"]).await;
    let drains = status.borrow().drains;
    let killed = procs.remove(1);
    killed.kill().await;
    let mut st = status.clone();
    st.wait_for(|s| s.shards.get("b") == Some(&ShardState::Dead))
        .await
        .unwrap();
    // Fenced: the sharder holds the dead shard's Lease, so it cannot renew unnoticed.
    let lease = sim.get("leases", Some(LEASES), "b").unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], SHARDER_IDENTITY);
    assert_eq!(
        lease["metadata"]["labels"]["alpha.sharding.timebertt.dev/controllerring"], RING,
        "the ring label survives the takeover"
    );
    converge(&sim, &procs.iter().collect::<Vec<_>>(), &["a", "c"]).await;
    partition_is_exact(&procs.iter().collect::<Vec<_>>(), 60);
    let s = status.borrow().clone();
    assert_eq!(s.leases_taken, 1);
    assert_eq!(s.drains, drains, "a dead shard's objects move without a drain");
    for p in procs {
        p.shutdown().await;
    }
    sharder_stop.send(true).unwrap();
    sharder.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cleanly_stopped_shard_releases_its_lease_and_its_objects_move_at_once() {
    let sim = sim_with(60);
    let dir = tempfile::tempdir().unwrap();
    let tracker = Arc::new(Tracker::default());
    let mut procs = start_shards(&sim, dir.path(), &["a", "b"], &tracker).await;
    let (status, sharder_stop, sharder) = start_sharder(&sim);
    converge(&sim, &procs.iter().collect::<Vec<_>>(), &["a", "b"]).await;
    procs.remove(0).shutdown().await;
    let lease = sim.get("leases", Some(LEASES), "a").unwrap();
    assert!(
        lease["spec"]["holderIdentity"].as_str().unwrap_or_default().is_empty(),
        "released: {lease}"
    );
    converge(&sim, &procs.iter().collect::<Vec<_>>(), &["b"]).await;
    let s = status.borrow().clone();
    assert_eq!(s.shards.get("a"), Some(&ShardState::Dead));
    // Released, not expired: the sharder never had to take it.
    assert_eq!(s.leases_taken, 0);
    assert!(tracker.overlaps.lock().unwrap().is_empty());
    for p in procs {
        p.shutdown().await;
    }
    sharder_stop.send(true).unwrap();
    sharder.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sharder_retries_a_label_write_that_met_a_conflict() {
    let sim = sim_with(5);
    let dir = tempfile::tempdir().unwrap();
    let tracker = Arc::new(Tracker::default());
    let (status, sharder_stop, sharder) = start_sharder(&sim);
    let a = start_shard(&sim, dir.path(), "a", tracker.clone()).await;
    converge(&sim, &[&a], &["a"]).await;
    // Every request now waits 300 ms at the server before it is applied, while the object
    // changes every 30 ms: the sharder's write carries a stale resourceVersion.
    sim.faults().delay(Duration::from_millis(300));
    sim.create(
        "configmaps",
        Some(NS),
        json!({"metadata": {"name": "busy", "namespace": NS}, "data": {"v": "0"}}),
    )
    .unwrap();
    let mut st = status.clone();
    for i in 0..60 {
        sim.patch("configmaps", Some(NS), "busy", &json!({"data": {"v": i.to_string()}}))
            .unwrap();
        tokio::time::sleep(Duration::from_millis(30)).await;
        if st.borrow().conflicts > 0 {
            break;
        }
    }
    st.wait_for(|s| s.conflicts > 0).await.unwrap();
    sim.faults().clear();
    converge(&sim, &[&a], &["a"]).await;
    a.shutdown().await;
    sharder_stop.send(true).unwrap();
    sharder.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_acknowledgement_that_met_a_conflict_reads_again_and_retries() {
    let sim = sim_with(0);
    let ring = labels();
    let draining = |shard: &str, v: &str| {
        json!({"metadata": {"name": "cm", "namespace": NS, "labels": {
            ring.shard_label(): shard, ring.drain_label(): "true"}}, "data": {"v": v}})
    };
    let created = sim.create("configmaps", Some(NS), draining("a", "0")).unwrap();
    let stale = created["metadata"]["resourceVersion"].as_str().unwrap().to_owned();
    sim.patch("configmaps", Some(NS), "cm", &json!({"data": {"v": "1"}}))
        .unwrap();
    let shard = RingShard::new(sim.client().unwrap(), member("a"));
    let ar = ApiResource::erase::<ConfigMap>(&());
    let key = ObjectKey {
        namespace: Some(NS.into()),
        name: "cm".into(),
    };
    assert!(shard.acknowledge_drain(&ar, &key, &stale).await.unwrap());
    let now = sim.get("configmaps", Some(NS), "cm").unwrap();
    assert!(
        now["metadata"]["labels"].as_object().is_none_or(|l| l.is_empty()),
        "{now}"
    );
    assert_eq!(now["data"]["v"], "1", "the acknowledgement touched only the labels");
    assert_eq!(shard.drains_acknowledged(), 1);
    // Reassigned meanwhile (to b): the stale acknowledgement must not strip b's label.
    let moved = sim.update("configmaps", Some(NS), draining("b", "2")).unwrap();
    assert!(!shard.acknowledge_drain(&ar, &key, &stale).await.unwrap());
    let after = sim.get("configmaps", Some(NS), "cm").unwrap();
    assert_eq!(
        after["metadata"]["resourceVersion"],
        moved["metadata"]["resourceVersion"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_restarted_with_its_id_resumes_without_a_list_and_hears_moves_as_deletes() {
    let sim = sim_with(0);
    let ring = labels();
    for i in 0..40 {
        let shard = if i % 2 == 0 { "a" } else { "b" };
        sim.create(
            "configmaps",
            Some(NS),
            json!({"metadata": {"name": format!("cm-{i}"), "namespace": NS,
                   "labels": {ring.shard_label(): shard}}}),
        )
        .unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.redb");
    let build = |seen: Arc<Mutex<Vec<(char, String)>>>| {
        let (sim, path) = (&sim, path.clone());
        async move {
            let db = DurableStore::open(StoreConfig::new(path)).unwrap();
            let source = KubeSource::typed::<ConfigMap>(sim.client().unwrap(), &sim.url());
            let informer = Informer::<ConfigMap>::builder(&db, source)
                .ring_shard(&member("a"))
                .build()
                .await
                .unwrap();
            informer.add_event_handler(
                handler_fn(move |ev: Event<ConfigMap>| -> Result<(), std::convert::Infallible> {
                    let (kind, cm) = match &ev {
                        Event::Add { object, .. } => ('A', object),
                        Event::Update { new, .. } => ('U', new),
                        Event::Delete { object, .. } => ('D', object),
                    };
                    seen.lock().unwrap().push((kind, cm.name_any()));
                    Ok(())
                }),
                HandlerOptions::durable("recorder"),
            );
            informer.start();
            informer.wait_for_sync().await.unwrap();
            (informer, db)
        }
    };
    let seen: Arc<Mutex<Vec<(char, String)>>> = Arc::default();
    let (first, db) = build(seen.clone()).await;
    let evens: BTreeSet<String> = (0..40).step_by(2).map(|i| format!("{NS}/cm-{i}")).collect();
    eventually("shard a holds its objects", || {
        let ok = stored(&first) == evens;
        async move { ok }
    })
    .await;
    first.shutdown().await.unwrap();
    // An informer keeps its store's writer (and the file) until it is dropped too.
    drop(first);
    drop(db);
    // While it was away, one of its objects moved to b.
    sim.patch(
        "configmaps",
        Some(NS),
        "cm-0",
        &json!({"metadata": {"labels": {ring.shard_label(): "b"}}}),
    )
    .unwrap();
    seen.lock().unwrap().clear();
    sim.reset_counters();
    let (again, _db) = build(seen.clone()).await;
    let mut want = evens.clone();
    want.remove(&format!("{NS}/cm-0"));
    eventually("the move arrives as a delete", || {
        let ok = stored(&again) == want && seen.lock().unwrap().contains(&('D', "cm-0".to_owned()));
        async move { ok }
    })
    .await;
    assert!(again.is_restored());
    let st = again.status().borrow().clone();
    assert_eq!(st.lists, 0, "no full LIST: {st:?}");
    let c = sim.counters();
    // The resume's probe of one object, and the one delete through the watch.
    assert!(c.list_objects <= 1 && c.watch_events == 1, "{c:?}");
    assert_eq!(seen.lock().unwrap().as_slice(), &[('D', "cm-0".to_owned())]);
    again.shutdown().await.unwrap();
}
