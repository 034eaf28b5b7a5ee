//! Label-ring sharding, 3 → 4 shards, against the simulated server over HTTP: how many
//! ConfigMaps move (against the ideal quarter), how many drains the old shards acknowledged, and
//! how many objects the server sent while the ring rebalanced.
//!
//! ```text
//! cargo run --features sim --example ring_sharding -- [N]     # N ConfigMaps, default 2000
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use durable_informer::controller::{default_error_policy, Action, Controller};
use durable_informer::informer::Informer;
use durable_informer::leader::LeaderElectionConfig;
use durable_informer::selector::RingLabels;
use durable_informer::sharding::{shard_lease, RingShard, ShardedResource, Sharder, SharderStatus};
use durable_informer::sim::{Sim, SimConfig};
use durable_informer::source::KubeSource;
use durable_informer::store::{DurableStore, StoreConfig};
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::json;
use tokio::sync::watch;

type Error = Box<dyn std::error::Error + Send + Sync>;

const RING: &str = "cms";

struct Shard {
    shard: RingShard,
    stop: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    _db: DurableStore,
}

async fn start_shard(sim: &Sim, dir: &std::path::Path, id: &str) -> Result<Shard, Error> {
    let client = sim.client()?;
    let me = RingLabels::new(RING)?.member(id)?;
    let db = DurableStore::open(StoreConfig::new(dir.join(format!("{id}.redb"))))?;
    let informer = Informer::<ConfigMap>::builder(&db, KubeSource::typed::<ConfigMap>(client.clone(), &sim.url()))
        .ring_shard(&me)
        .build()
        .await?;
    let shard = RingShard::new(client.clone(), me.clone());
    let config = LeaderElectionConfig {
        lease_duration: Duration::from_secs(3),
        renew_deadline: Duration::from_secs(2),
        retry_period: Duration::from_millis(500),
        release_on_cancel: true,
    };
    let lease = shard_lease(client, "default", &me, config);
    let holding = lease.fenced_leadership();
    let (stop, rx) = watch::channel(false);
    let reconcile = |_cm: Arc<ConfigMap>, _ctx: Arc<()>| async { Ok::<_, std::io::Error>(Action::await_change()) };
    let mut stopping = rx.clone();
    let controller = Controller::for_informer(informer.clone())
        .leader_election(holding)
        .graceful_shutdown_on(async move {
            let _ = stopping.wait_for(|s| *s).await;
        })
        .run(shard.guard(&informer, reconcile), default_error_policy, Arc::new(()))
        .for_each(|_| async {});
    let tasks = vec![
        tokio::spawn(async move {
            let _ = lease.run(rx).await;
        }),
        tokio::spawn(async move {
            let _ = controller.await;
        }),
    ];
    Ok(Shard {
        shard,
        stop,
        tasks,
        _db: db,
    })
}

/// Every ConfigMap's shard label and whether it is draining, read in process (the server's
/// counters then count only what the shards and the sharder asked for).
fn labels(sim: &Sim, n: usize) -> Result<BTreeMap<String, (Option<String>, bool)>, Error> {
    let ring = RingLabels::new(RING)?;
    (0..n)
        .map(|i| {
            let name = format!("cm-{i}");
            let cm = sim.get("configmaps", Some("ns"), &name)?;
            let labels = &cm["metadata"]["labels"];
            let shard = labels[ring.shard_label()].as_str().map(str::to_owned);
            Ok((name, (shard, !labels[ring.drain_label()].is_null())))
        })
        .collect()
}

/// Waits until every ConfigMap is labelled with one of `shards`, nothing is draining, and the
/// sharder wrote no drain for half a second.
async fn settle(
    sim: &Sim,
    n: usize,
    shards: &[&str],
    status: &watch::Receiver<SharderStatus>,
) -> Result<BTreeMap<String, Option<String>>, Error> {
    loop {
        let before = status.borrow().drains;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let all = labels(sim, n)?;
        let settled = all
            .values()
            .all(|(s, drain)| !drain && s.as_deref().is_some_and(|s| shards.contains(&s)));
        if settled && status.borrow().drains == before {
            return Ok(all.into_iter().map(|(k, (s, _))| (k, s)).collect());
        }
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Error> {
    let n: usize = std::env::args().nth(1).map_or(Ok(2000), |a| a.parse())?;
    let sim = Sim::start(SimConfig::default())?;
    sim.bulk_load(
        "configmaps",
        (0..n).map(|i| json!({"metadata": {"name": format!("cm-{i}"), "namespace": "ns"}, "data": {"v": "0"}})),
    )?;
    let dir = tempfile::tempdir()?;
    let mut shards = Vec::new();
    for id in ["a", "b", "c"] {
        shards.push(start_shard(&sim, dir.path(), id).await?);
    }
    let sharder =
        Sharder::new(sim.client()?, "default", RingLabels::new(RING)?).resource(ShardedResource::of::<ConfigMap>());
    let status = sharder.status();
    let (sharder_stop, rx) = watch::channel(false);
    let sharder_task = tokio::spawn(sharder.run(rx));
    let three = settle(&sim, n, &["a", "b", "c"], &status).await?;
    let drains_at_three = status.borrow().drains;

    sim.reset_counters();
    let joined = Instant::now();
    shards.push(start_shard(&sim, dir.path(), "d").await?);
    let four = settle(&sim, n, &["a", "b", "c", "d"], &status).await?;
    let took = joined.elapsed();
    let counters = sim.counters();
    let moved = three.iter().filter(|(k, s)| four.get(*k) != Some(*s)).count();
    let to_new = four.values().filter(|s| s.as_deref() == Some("d")).count();
    let acknowledged: u64 = shards.iter().map(|s| s.shard.drains_acknowledged()).sum();
    let s = status.borrow().clone();
    println!("ConfigMaps: {n}");
    println!(
        "moved 3 → 4 shards: {moved} ({:.1}% of all; ideal 25.0%), all to the new shard: {}",
        100.0 * moved as f64 / n as f64,
        moved == to_new
    );
    println!(
        "drains written: {} (before the join: {drains_at_three}), acknowledged by the old shards: {acknowledged}",
        s.drains - drains_at_three
    );
    println!("conflicts retried: {}, write errors: {}", s.conflicts, s.errors);
    println!(
        "server during the rebalance: {} LIST requests ({} objects), {} watch events, {} writes",
        counters.list_requests, counters.list_objects, counters.watch_events, counters.write_requests
    );
    println!(
        "settled {:.1} s after the fourth shard started (polled every 0.5 s)",
        took.as_secs_f64()
    );
    for sh in &shards {
        sh.stop.send_replace(true);
    }
    for sh in shards {
        for t in sh.tasks {
            let _ = t.await;
        }
    }
    sharder_stop.send_replace(true);
    sharder_task.await??;
    Ok(())
}
