//! This crate's `Controller` against kube-runtime's, on the simulated server over HTTP, in one
//! run (ratios, as these machines are noisy): the time from start until every one of N
//! ConfigMaps was reconciled once (a cold start; for this crate also a restart on the database
//! the first run left), and the latency from a change on the server to its reconcile (median
//! and p90 of `CHANGES` changes, one at a time). The reconcile does nothing but note the time.
//! `ROUNDS` rounds run the three in turn (each cold start on a new database); the table gives
//! each row's median over the rounds and the median of the per-round ratios, so one
//! descheduled run on a shared machine does not decide the figure.
//!
//! ```text
//! cargo bench --features sim --bench controller -- [N] [CHANGES] [ROUNDS]     # default 5000 50 5
//! ```

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use durable_informer::sim::{Sim, SimConfig};
use durable_informer::store::{DurableStore, StoreConfig};
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::watcher;
use kube::Api;
use serde_json::json;

type Error = Box<dyn std::error::Error + Send + Sync>;

/// The names reconciled, and when the last change was seen.
#[derive(Default)]
struct Seen {
    names: Mutex<HashSet<String>>,
    changed: Mutex<Vec<(String, Instant)>>,
}

#[derive(Debug, thiserror::Error)]
#[error("never")]
struct Never;

async fn reconcile(cm: Arc<ConfigMap>, seen: Arc<Seen>) -> Result<kube::runtime::controller::Action, Never> {
    let name = cm.metadata.name.clone().unwrap_or_default();
    let v = cm.data.as_ref().and_then(|d| d.get("v")).cloned().unwrap_or_default();
    if v != "0" {
        seen.changed.lock().unwrap().push((v, Instant::now()));
    }
    seen.names.lock().unwrap().insert(name);
    Ok(kube::runtime::controller::Action::await_change())
}

fn error_policy(_cm: Arc<ConfigMap>, _e: &Never, _seen: Arc<Seen>) -> kube::runtime::controller::Action {
    kube::runtime::controller::Action::await_change()
}

async fn until(mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(300);
    while !f() {
        assert!(Instant::now() < deadline, "timed out");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// What one controller run measured.
struct Run {
    all_once: Duration,
    latencies: Vec<Duration>,
}

/// Starts a controller through `start`, waits until all `n` are reconciled, then makes
/// `changes` changes one at a time and times each one's reconcile.
async fn measure<F, Fut>(sim: &Sim, n: usize, changes: usize, round: usize, start: F) -> Result<Run, Error>
where
    F: FnOnce(Arc<Seen>, tokio::sync::oneshot::Receiver<()>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let seen = Arc::new(Seen::default());
    let (stop, stopped) = tokio::sync::oneshot::channel();
    let t0 = Instant::now();
    let task = tokio::spawn(start(seen.clone(), stopped));
    until(|| seen.names.lock().unwrap().len() >= n).await;
    let all_once = t0.elapsed();
    let mut latencies = Vec::new();
    for i in 0..changes {
        let tag = format!("r{round}-{i}");
        let at = Instant::now();
        sim.patch(
            "configmaps",
            Some("ns"),
            &format!("cm-{}", i % n),
            &json!({"data": {"v": tag}}),
        )?;
        until(|| seen.changed.lock().unwrap().iter().any(|(v, _)| *v == tag)).await;
        let done = seen
            .changed
            .lock()
            .unwrap()
            .iter()
            .find(|(v, _)| *v == tag)
            .map(|(_, t)| *t);
        latencies.push(done.map_or(Duration::ZERO, |t| t - at));
    }
    let _ = stop.send(());
    task.await?;
    Ok(Run { all_once, latencies })
}

fn pct(v: &[Duration], p: f64) -> f64 {
    let mut v: Vec<f64> = v.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
    v.sort_by(f64::total_cmp);
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v.get(i).copied().unwrap_or(0.0)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn main() -> Result<(), Error> {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let n = args.first().copied().unwrap_or(5000);
    let changes = args.get(1).copied().unwrap_or(50);
    let rounds_wanted = args.get(2).copied().unwrap_or(5).max(1);
    // `RUST_LOG=durable_informer=info` shows when the caches synced (where the startup goes).
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let sim = tokio::task::spawn_blocking(|| Sim::start(SimConfig::default())).await??;
        let objects =
            (0..n).map(|i| json!({"metadata": {"name": format!("cm-{i}"), "namespace": "ns"}, "data": {"v": "0"}}));
        sim.bulk_load("configmaps", objects)?;
        let dir = tempfile::tempdir()?;
        let client = sim.client()?;
        // Per round: kube-runtime's, this crate's cold start, and its restart.
        let mut rounds: Vec<[Run; 3]> = Vec::new();
        for r in 0..rounds_wanted {
            let c = client.clone();
            let kube_run = measure(&sim, n, changes, 3 * r, move |seen, stopped| async move {
                kube::runtime::Controller::new(Api::<ConfigMap>::namespaced(c, "ns"), watcher::Config::default())
                    .graceful_shutdown_on(async move {
                        let _ = stopped.await;
                    })
                    .run(reconcile, error_policy, seen)
                    .for_each(|_| async {})
                    .await;
            })
            .await?;
            let path = dir.path().join(format!("db-{r}.redb"));
            let mut ours = Vec::new();
            for round in [3 * r + 1, 3 * r + 2] {
                let p = path.clone();
                let db = Arc::new(tokio::task::spawn_blocking(move || DurableStore::open(StoreConfig::new(p))).await??);
                let (c, d) = (client.clone(), db.clone());
                let run = measure(&sim, n, changes, round, move |seen, stopped| async move {
                    durable_informer::controller::Controller::new(
                        &d,
                        Api::<ConfigMap>::namespaced(c, "ns"),
                        watcher::Config::default(),
                    )
                    .graceful_shutdown_on(async move {
                        let _ = stopped.await;
                    })
                    .run(reconcile, error_policy, seen)
                    .for_each(|_| async {})
                    .await;
                })
                .await?;
                ours.push(run);
                let db = Arc::try_unwrap(db).map_err(|_| "the database is still shared")?;
                tokio::task::spawn_blocking(move || db.close()).await??;
            }
            let (Some(restart), Some(cold)) = (ours.pop(), ours.pop()) else {
                return Err("two runs of this crate's controller".into());
            };
            rounds.push([kube_run, cold, restart]);
        }

        println!(
            "{n} ConfigMaps, {changes} changes one at a time, {rounds_wanted} rounds (medians); sim over HTTP, 2 worker threads"
        );
        println!("| controller | all reconciled once (ms) | ratio | change→reconcile p50 (ms) | p90 (ms) |");
        println!("|---|---|---|---|---|");
        let names = ["kube-runtime Controller", "durable Controller, cold", "durable Controller, restart"];
        for (i, what) in names.iter().enumerate() {
            let ms = |d: Duration| d.as_secs_f64() * 1000.0;
            let all_once: Vec<f64> = rounds.iter().map(|r| ms(r[i].all_once)).collect();
            let ratio: Vec<f64> = rounds
                .iter()
                .map(|r| r[i].all_once.as_secs_f64() / r[0].all_once.as_secs_f64())
                .collect();
            let latencies: Vec<Duration> = rounds.iter().flat_map(|r| r[i].latencies.iter().copied()).collect();
            println!(
                "| {what} | {:.0} | {:.2} | {:.2} | {:.2} |",
                median(all_once),
                median(ratio),
                pct(&latencies, 0.5),
                pct(&latencies, 0.9)
            );
        }
        Ok::<_, Error>(())
    })
}
