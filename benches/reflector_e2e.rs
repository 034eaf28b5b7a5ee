//! End to end: the simulated API server → `KubeSource` (real `kube::Client`, HTTP over
//! loopback) → `Reflector` → durable store, with ~4 KB Pods from `WorkloadGen`. This is the
//! path the 50,000 Pod events/s aim names; the `store` bench measures the store alone.
//!
//! `cargo bench --features sim --bench reflector_e2e` (plain `main`, `harness = false`); `-- --quick` or
//! `BENCH_QUICK=1` uses 10,000 Pods instead of 100,000 (`BENCH_N` sets any count). Prints
//! events/s for:
//!
//! 1. a watch replaying history: the reflector syncs an empty scope and stops, N Pods are
//!    created, and a restarted reflector resumes (one `limit=1` probe) and receives all N as
//!    watch events until the store's committed RV reaches the server's;
//! 2. a cold initial sync of the same N Pods by paginated LIST (pages of 500) into a new store;
//! 3. the same by streaming list (WATCH with `sendInitialEvents`).
//!
//! Timing starts when the reflector task is spawned and ends when the committed RV (persisted
//! after the durable commit) equals the server's, so every event counted is on disk.
//! `BENCH_METRICS=1` also prints the reflector's batch-size histogram and commit latency after
//! the resumed watch (how many durable commits carried the events).

use std::time::{Duration, Instant};

use durable_informer::object::{ResourceVersion, ScopeSpec};
use durable_informer::reflector::{Reflector, ReflectorConfig, ReflectorError, ReflectorStatus};
use durable_informer::sim::workload::WorkloadGen;
use durable_informer::sim::{Sim, SimConfig};
use durable_informer::source::KubeSource;
use durable_informer::store::{DurableStore, StoreConfig};
use k8s_openapi::api::core::v1::Pod;
use tokio::sync::watch;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

struct Running {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<Result<(), ReflectorError>>,
    status: watch::Receiver<ReflectorStatus>,
}

async fn start(sim: &Sim, db: &DurableStore, config: ReflectorConfig) -> Result<Running, BoxError> {
    let writer = db.writer();
    let scope = writer.register_scope(&ScopeSpec::new("", "v1", "pods")).await?;
    let source = KubeSource::typed::<Pod>(sim.client()?, &sim.url());
    let r = Reflector::new(source, writer, db.store(scope), config);
    let status = r.status();
    let (stop, rx) = watch::channel(false);
    let task = tokio::spawn(r.run(rx));
    Ok(Running { stop, task, status })
}

impl Running {
    /// Waits until the committed RV is the server's `rv`.
    async fn reach(&mut self, rv: u64) -> Result<(), BoxError> {
        let want = Some(ResourceVersion(rv.to_string()));
        tokio::time::timeout(
            Duration::from_secs(600),
            self.status.wait_for(|s| s.committed_rv == want),
        )
        .await??;
        Ok(())
    }

    async fn stop(self) -> Result<(), BoxError> {
        let _ = self.stop.send(true);
        self.task.await??;
        Ok(())
    }
}

fn report(name: &str, events: u64, took: Duration) {
    let secs = took.as_secs_f64();
    println!(
        "{name:<52} {events:>8} events in {secs:>7.3} s = {:>8.0} events/s",
        events as f64 / secs
    );
}

fn load_pods(sim: &Sim, n: usize, seed: u64) -> Result<u64, BoxError> {
    let mut gen = WorkloadGen::new(seed).namespaces(10);
    let mut rv = sim.current_rv();
    for chunk in 0..n.div_ceil(10_000) {
        let count = (n - chunk * 10_000).min(10_000);
        rv = sim.bulk_load(
            "pods",
            gen.pods(count).into_iter().enumerate().map(|(i, mut v)| {
                v["metadata"]["name"] = format!("pod-{chunk}-{i}").into();
                v
            }),
        )?;
    }
    Ok(rv)
}

fn open(dir: &tempfile::TempDir, name: &str) -> Result<DurableStore, BoxError> {
    Ok(DurableStore::open(StoreConfig::new(dir.path().join(name)))?)
}

fn main() -> Result<(), BoxError> {
    let quick = std::env::args().any(|a| a == "--quick") || std::env::var_os("BENCH_QUICK").is_some();
    let n: usize = match std::env::var("BENCH_N") {
        Ok(s) => s.parse()?,
        Err(_) if quick => 10_000,
        Err(_) => 100_000,
    };
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let sim = Sim::start(SimConfig::default().history_max_events(2 * n + 1_000))?;
    let dir = tempfile::tempdir()?;
    let paginated = ReflectorConfig {
        streaming_list: false,
        ..ReflectorConfig::default()
    };

    // 1. history replay through a resumed watch
    let db = open(&dir, "watch.redb")?;
    rt.block_on(async {
        let mut r = start(&sim, &db, paginated.clone()).await?;
        r.reach(sim.current_rv()).await?;
        r.stop().await
    })?;
    let rv = load_pods(&sim, n, 2)?;
    let took = rt.block_on(async {
        let t = Instant::now();
        let mut r = start(&sim, &db, paginated.clone()).await?;
        r.reach(rv).await?;
        let took = t.elapsed();
        let lists = r.status.borrow().lists;
        r.stop().await?;
        if lists != 0 {
            return Err::<_, BoxError>(format!("expected a resumed watch, got {lists} list(s)").into());
        }
        Ok(took)
    })?;
    report("watch replaying history, Pods (~4 KB)", n as u64, took);
    if std::env::var_os("BENCH_METRICS").is_some() {
        for l in durable_informer::metrics::encode().lines().filter(|l| {
            l.contains("batch_size")
                || l.contains("commit_latency_seconds_sum")
                || l.contains("commit_latency_seconds_count")
        }) {
            println!("{l}");
        }
    }
    drop(db);

    // 2. and 3. cold initial syncs of the same Pods
    for (name, file, config) in [
        (
            "initial sync, paginated LIST, Pods (~4 KB)",
            "list.redb",
            paginated.clone(),
        ),
        (
            "initial sync, streaming list, Pods (~4 KB)",
            "stream.redb",
            ReflectorConfig {
                streaming_list: true,
                ..ReflectorConfig::default()
            },
        ),
    ] {
        let db = open(&dir, file)?;
        let took = rt.block_on(async {
            let t = Instant::now();
            let mut r = start(&sim, &db, config).await?;
            r.reach(rv).await?;
            let took = t.elapsed();
            r.stop().await?;
            Ok::<_, BoxError>(took)
        })?;
        report(name, n as u64, took);
    }
    Ok(())
}
