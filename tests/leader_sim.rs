//! Leader election over HTTP against the simulated API server's Leases (optimistic concurrency
//! on the resourceVersion), and a controller that reconciles only while it leads.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use durable_informer::controller::{Action, Controller};
use durable_informer::informer::Informer;
use durable_informer::leader::{KubeLeaseLock, LeaderElectionConfig, LeaderElector, LeaderError};
use durable_informer::object::ObjectKey;
use durable_informer::sim::{Sim, SimConfig};
use durable_informer::source::KubeSource;
use durable_informer::store::{DurableStore, StoreConfig};
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::json;
use tokio::sync::watch;

fn fast() -> LeaderElectionConfig {
    LeaderElectionConfig {
        lease_duration: Duration::from_millis(1500),
        renew_deadline: Duration::from_millis(1000),
        retry_period: Duration::from_millis(200),
        release_on_cancel: true,
    }
}

struct Replica {
    name: String,
    leading: watch::Receiver<bool>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<Result<(), LeaderError>>,
}

fn replica(sim: &Sim, name: &str) -> Replica {
    let lock = KubeLeaseLock::new(sim.client().unwrap(), "kube-system", "the-controller", name);
    let elector = LeaderElector::new(lock, fast());
    let leading = elector.leadership();
    let (stop, rx) = watch::channel(false);
    let task = tokio::spawn(elector.run(rx));
    Replica {
        name: name.to_owned(),
        leading,
        stop,
        task,
    }
}

fn leaders(replicas: &[Replica]) -> Vec<String> {
    replicas
        .iter()
        .filter(|r| !r.task.is_finished() && *r.leading.borrow())
        .map(|r| r.name.clone())
        .collect()
}

/// Samples every 20 ms for `d`; fails on two leaders at once; returns who led last.
async fn watch_leaders(replicas: &[Replica], d: Duration) -> Vec<String> {
    let end = tokio::time::Instant::now() + d;
    let mut last = Vec::new();
    while tokio::time::Instant::now() < end {
        last = leaders(replicas);
        assert!(last.len() <= 1, "two leaders at once: {last:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    last
}

fn lease_holder(sim: &Sim) -> Option<String> {
    sim.get("leases", Some("kube-system"), "the-controller")
        .ok()
        .and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_owned))
        .filter(|h| !h.is_empty())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_one_leader_a_killed_leader_is_replaced_after_the_lease_expires() {
    let sim = Sim::start(SimConfig::default()).unwrap();
    let mut replicas: Vec<Replica> = ["a", "b", "c"].iter().map(|n| replica(&sim, n)).collect();
    let first = watch_leaders(&replicas, Duration::from_secs(2)).await;
    assert_eq!(first.len(), 1, "one leader");
    assert_eq!(lease_holder(&sim), Some(first[0].clone()));
    // SIGKILL-like: the leader's task vanishes without releasing anything.
    let i = replicas.iter().position(|r| r.name == first[0]).unwrap();
    let killed = replicas.remove(i);
    killed.task.abort();
    let killed_at = tokio::time::Instant::now();
    let mut next = Vec::new();
    while next.is_empty() && killed_at.elapsed() < Duration::from_secs(5) {
        next = watch_leaders(&replicas, Duration::from_millis(100)).await;
    }
    assert_eq!(next.len(), 1, "a new leader");
    assert_ne!(next[0], first[0]);
    let took = killed_at.elapsed();
    assert!(
        took >= Duration::from_millis(1000),
        "the Lease was not taken before it expired: {took:?}"
    );
    assert_eq!(lease_holder(&sim), Some(next[0].clone()));
    for r in replicas {
        r.stop.send(true).unwrap();
        r.task.await.unwrap().unwrap();
    }
    assert_eq!(lease_holder(&sim), None, "the last leader released the Lease");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cleanly_stopped_leader_releases_and_another_takes_over_within_a_retry_period() {
    let sim = Sim::start(SimConfig::default()).unwrap();
    let mut replicas: Vec<Replica> = ["a", "b"].iter().map(|n| replica(&sim, n)).collect();
    let first = watch_leaders(&replicas, Duration::from_secs(1)).await;
    assert_eq!(first.len(), 1);
    let i = replicas.iter().position(|r| r.name == first[0]).unwrap();
    let stopped = replicas.remove(i);
    stopped.stop.send(true).unwrap();
    stopped.task.await.unwrap().unwrap();
    assert!(!*stopped.leading.borrow());
    let at = tokio::time::Instant::now();
    let mut next = Vec::new();
    while next.is_empty() && at.elapsed() < Duration::from_secs(3) {
        next = watch_leaders(&replicas, Duration::from_millis(20)).await;
    }
    assert_eq!(next.len(), 1);
    // Within one jittered retry period (≤ 2.2 × 200 ms), far below the lease duration.
    assert!(at.elapsed() < Duration::from_millis(1000), "{:?}", at.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_reconciles_only_while_it_leads_and_catches_up_on_winning() {
    let sim = Sim::start(SimConfig::default()).unwrap();
    for i in 0..3 {
        sim.create(
            "configmaps",
            Some("ns"),
            json!({"metadata": {"name": format!("cm-{i}"), "namespace": "ns"}}),
        )
        .unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let db = DurableStore::open(StoreConfig::new(dir.path().join("db.redb"))).unwrap();
    let informer =
        Informer::<ConfigMap>::builder(&db, KubeSource::typed::<ConfigMap>(sim.client().unwrap(), &sim.url()))
            .build()
            .await
            .unwrap();
    let (lead, leading) = watch::channel(false);
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let s2 = seen.clone();
    let reconcile = move |cm: Arc<ConfigMap>, _ctx: Arc<()>| {
        let seen = s2.clone();
        async move {
            let key = ObjectKey {
                namespace: cm.metadata.namespace.clone(),
                name: cm.metadata.name.clone().unwrap_or_default(),
            };
            seen.lock().unwrap().push(key.to_string());
            Ok::<_, std::io::Error>(Action::await_change())
        }
    };
    let (stop_tx, stop) = tokio::sync::oneshot::channel::<()>();
    let controller = Controller::for_informer(informer.clone())
        .leader_election(leading)
        .graceful_shutdown_on(async move {
            let _ = stop.await;
        });
    let run = tokio::spawn(
        controller
            .run(
                reconcile,
                durable_informer::controller::default_error_policy,
                Arc::new(()),
            )
            .collect::<Vec<_>>(),
    );
    informer.wait_for_sync().await.expect("cache synced");
    // A warm follower: synced and queued, reconciling nothing.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        seen.lock().unwrap().is_empty(),
        "a follower reconciled: {:?}",
        seen.lock().unwrap()
    );
    lead.send_replace(true);
    let all: BTreeSet<String> = (0..3).map(|i| format!("ns/cm-{i}")).collect();
    let wait_for = |want: BTreeSet<String>| {
        let seen = seen.clone();
        async move {
            for _ in 0..200 {
                if want.iter().all(|k| seen.lock().unwrap().contains(k)) {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            panic!("not reconciled: {want:?}, got {:?}", seen.lock().unwrap());
        }
    };
    wait_for(all.clone()).await;
    // Leadership lost: a change is queued but not reconciled.
    lead.send_replace(false);
    tokio::time::sleep(Duration::from_millis(100)).await;
    seen.lock().unwrap().clear();
    sim.update(
        "configmaps",
        Some("ns"),
        json!({"metadata": {"name": "cm-1", "namespace": "ns"}, "data": {"v": "2"}}),
    )
    .unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(
        seen.lock().unwrap().is_empty(),
        "reconciled without leading: {:?}",
        seen.lock().unwrap()
    );
    // Won again: every key once more (what the other leader did is unknown), the change included.
    lead.send_replace(true);
    wait_for(all).await;
    stop_tx.send(()).unwrap();
    let items = run.await.unwrap();
    assert!(
        items.iter().all(Result::is_ok),
        "caches synced, every reconcile succeeded"
    );
    informer.shutdown().await.unwrap();
}
