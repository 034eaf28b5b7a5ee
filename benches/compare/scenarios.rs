//! The scenarios of `benches/compare.rs`: durable-informer against kube-runtime's reflector on
//! the same simulated API server, over real HTTP. Shared with `tests/bench_smoke.rs`, which runs
//! them at a tiny size and checks only sanity (never speed).

#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[path = "../../tests/common/churn.rs"]
mod churn;
use churn::LeaseChurn;
use durable_informer::informer::{handler_fn, Event, HandlerOptions, Informer, Lister, Registration};
use durable_informer::selector::LabelSelector;
use durable_informer::sim::workload::{Churn, WorkloadGen};
use durable_informer::sim::{Counters, Prebuilt, Sim, SimConfig};
use durable_informer::source::KubeSource;
use durable_informer::store::{DurableStore, Indexer, StoreConfig};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::watcher;
use kube::Api;

/// Objects per namespace once N is large enough (so "list one namespace" lists 1,000 objects
/// at N >= 10,000).
pub const PER_NAMESPACE: usize = 1_000;
/// Fewest namespaces the generated Pods are spread over.
pub const MIN_NAMESPACES: usize = 10;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// Result of the scenarios.
pub type Res<T> = Result<T, BoxError>;

/// How long any wait may take before the scenario fails (a bench must not hang).
const TIMEOUT: Duration = Duration::from_secs(1_800);

/// Pause of the task consuming kube-runtime's stream after it yields an error.
const ERROR_PAUSE: Duration = Duration::from_millis(10);

/// Pods generated per `bulk_load` call. A generated Pod is about 40 KB as a `serde_json::Value`
/// (4 KB stored), and what a chunk frees glibc does not give back: at 10,000 a chunk left the
/// parent 1.6× larger (100,000 Pods: 1,052 against 674 MiB), room the peers need at 1,000,000.
const LOAD_CHUNK: usize = 1_000;

/// Namespaces for N objects: `max(10, N / 1000)`.
pub fn namespace_count(n: usize) -> usize {
    (n / PER_NAMESPACE).max(MIN_NAMESPACES)
}

/// Namespace names of the workload for N objects.
pub fn namespaces(n: usize) -> Vec<String> {
    WorkloadGen::new(42).namespaces(namespace_count(n)).namespace_names()
}

/// Starts the sim with `n` generated ~4 KB Pods named `pod-{i}`, round-robin over
/// [`namespaces`]`(n)` (the same objects as `WorkloadGen::pods`, generated in chunks).
pub fn start_sim(n: usize) -> Res<Sim> {
    let sim = Sim::start(SimConfig::default().history_max_events(2_000_000))?;
    let mut gen = WorkloadGen::new(42).namespaces(namespace_count(n));
    let ns = gen.namespace_names();
    sim.bulk_load("namespaces", gen.namespace_objects())?;
    let mut i = 0;
    while i < n {
        let end = (i + LOAD_CHUNK).min(n);
        let chunk: Vec<_> = (i..end)
            .map(|k| gen.pod(&ns[k % ns.len()], &format!("pod-{k}")))
            .collect();
        sim.bulk_load("pods", chunk)?;
        i = end;
    }
    Ok(sim)
}

/// Namespace and name of the `i`-th generated Pod.
fn pod_ref(ns: &[String], i: usize) -> (&str, String) {
    (&ns[i % ns.len()], format!("pod-{i}"))
}

/// What the sim served between two counter snapshots.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct Served {
    /// LIST requests.
    pub list_requests: u64,
    /// Objects in LIST responses.
    pub list_objects: u64,
    /// WATCH requests.
    pub watch_requests: u64,
    /// Watch events (including streaming-list initial events).
    pub watch_events: u64,
    /// Response bytes.
    pub bytes: u64,
}

impl Served {
    /// `after - before`.
    pub fn between(before: &Counters, after: &Counters) -> Self {
        Self {
            list_requests: after.list_requests - before.list_requests,
            list_objects: after.list_objects - before.list_objects,
            watch_requests: after.watch_requests - before.watch_requests,
            watch_events: after.watch_events - before.watch_events,
            bytes: after.bytes_served - before.bytes_served,
        }
    }
    /// Objects served by LIST or WATCH.
    pub fn objects(&self) -> u64 {
        self.list_objects + self.watch_events
    }
}

/// One timed phase: how long it took, what the sim served, and how many handler events.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct Phase {
    /// Seconds.
    pub secs: f64,
    /// Sim traffic.
    pub served: Served,
    /// Events delivered to handlers (ours: non-initial handler events; theirs: InitApply,
    /// Apply and Delete).
    pub events: u64,
    /// Objects in the store afterwards.
    pub objects: u64,
}

/// What both systems expose to the churn and latency scenario: the highest resourceVersion
/// delivered to the consumer (ours: the volatile handler; theirs: the event leaving
/// `reflector`), and the receive time per resourceVersion.
#[derive(Debug, Clone, Default)]
pub struct Probe {
    /// Highest RV delivered.
    pub max_rv: Arc<AtomicU64>,
    /// Receive times per RV (updates only).
    pub seen: Arc<Mutex<HashMap<u64, Instant>>>,
}

impl Probe {
    fn record(&self, rv: u64) {
        let now = Instant::now();
        self.max_rv.fetch_max(rv, Ordering::Relaxed);
        self.seen.lock().expect("probe lock").insert(rv, now);
    }

    /// The highest RV delivered.
    pub fn applied(&self) -> u64 {
        self.max_rv.load(Ordering::Relaxed)
    }
}

fn rv_of(p: &Pod) -> u64 {
    p.metadata
        .resource_version
        .as_deref()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// Polls `get` until it reaches `target`, or fails after `timeout`.
async fn wait_rv(get: impl Fn() -> u64, target: u64, timeout: Duration) -> Res<()> {
    let start = Instant::now();
    while get() < target {
        if start.elapsed() > timeout {
            return Err(format!("never reached RV {target} (at {})", get()).into());
        }
        tokio::time::sleep(Duration::from_micros(500)).await;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// ours

/// A running durable informer with a volatile handler counting events (not the synthetic
/// initial adds) and recording the receive time per resourceVersion.
pub struct Ours {
    /// The database.
    pub db: DurableStore,
    /// The informer.
    pub informer: Informer<Pod>,
    /// The handler's registration.
    pub reg: Registration,
    /// Events counted by the handler.
    pub events: Arc<AtomicU64>,
    /// What the handler received.
    pub probe: Probe,
}

/// Each informer's object cache budget for every scenario, from `BENCH_OBJECT_CACHE_BYTES`
/// (0: no object JSON held in memory, for an A/B of its cost). `BENCH_HOT_TIER_BYTES`, its
/// name before the hot tier gave way to the object cache (issue #33), is still read.
fn object_cache_bytes() -> Res<Option<usize>> {
    let Some((name, v)) = ["BENCH_OBJECT_CACHE_BYTES", "BENCH_HOT_TIER_BYTES"]
        .into_iter()
        .find_map(|name| std::env::var(name).ok().map(|v| (name, v)))
    else {
        return Ok(None);
    };
    if name == "BENCH_HOT_TIER_BYTES" {
        static WARNED: std::sync::Once = std::sync::Once::new();
        WARNED.call_once(|| eprintln!("BENCH_HOT_TIER_BYTES is deprecated: set BENCH_OBJECT_CACHE_BYTES"));
    }
    let bytes = v.trim().parse().map_err(|e| format!("{name}={v:?}: {e}"))?;
    Ok(Some(bytes))
}

/// Our store's configuration: the defaults, with [`object_cache_bytes`] when set, and
/// `BENCH_FSYNC_DELAY_MS` as `fsync_delay` (`off`: every watch batch fsynced first).
pub fn store_config(path: PathBuf) -> Res<StoreConfig> {
    let mut config = StoreConfig::new(path);
    if let Some(bytes) = object_cache_bytes()? {
        config = config.object_cache_bytes(bytes);
    }
    if let Some(bytes) = crate::child::redb_cache_bytes()? {
        config = config.cache_bytes(bytes);
    }
    Ok(match std::env::var("BENCH_FSYNC_DELAY_MS").ok().as_deref() {
        Some("off") => config.fsync_delay(None),
        Some(ms) => {
            let ms = ms.parse().map_err(|e| format!("BENCH_FSYNC_DELAY_MS={ms:?}: {e}"))?;
            config.fsync_delay(Some(Duration::from_millis(ms)))
        }
        None => config,
    })
}

/// Opens (or reopens) the database at `path`, builds the informer with the label index,
/// registers the counting handler and starts it. Does not wait for sync.
pub async fn ours_start(sim: &Sim, path: &Path) -> Res<Ours> {
    let config = store_config(path.to_path_buf())?;
    let db = tokio::task::spawn_blocking(move || DurableStore::open(config)).await??;
    let source = KubeSource::typed::<Pod>(sim.client()?, &sim.url());
    let informer = Informer::<Pod>::builder(&db, source)
        .indexer(Indexer::labels())
        .build()
        .await?;
    let events = Arc::new(AtomicU64::new(0));
    let probe = Probe::default();
    let (e2, p2) = (events.clone(), probe.clone());
    let reg = informer.add_event_handler(
        handler_fn(move |ev: Event<Pod>| -> Result<(), std::convert::Infallible> {
            if let Event::Add { initial: true, .. } = ev {
                return Ok(());
            }
            e2.fetch_add(1, Ordering::Relaxed);
            p2.record(rv_of(ev.object()));
            Ok(())
        }),
        HandlerOptions::volatile(),
    );
    informer.start();
    Ok(Ours {
        db,
        informer,
        reg,
        events,
        probe,
    })
}

impl Ours {
    /// Waits until synced.
    pub async fn synced(&self) -> Res<()> {
        tokio::time::timeout(TIMEOUT, self.informer.wait_for_sync()).await??;
        Ok(())
    }

    /// Waits until the handler has processed everything committed so far.
    pub async fn handler_caught_up(&self) -> Res<()> {
        let target = self.informer.store().snapshot()?.position()?;
        let start = Instant::now();
        while self.reg.cursor() < target {
            if start.elapsed() > TIMEOUT {
                return Err("handler did not catch up".into());
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        Ok(())
    }

    /// Waits until synced, the store holds the sim's current revision and the handler has
    /// caught up (after a restart the informer may be synced from disk and still resuming).
    pub async fn caught_up(&self, sim: &Sim) -> Res<()> {
        self.synced().await?;
        wait_rv(|| self.committed_rv(), sim.current_rv(), TIMEOUT).await?;
        self.handler_caught_up().await
    }

    /// The committed RV as a number.
    pub fn committed_rv(&self) -> u64 {
        self.informer
            .last_synced_resource_version()
            .and_then(|rv| rv.0.parse().ok())
            .unwrap_or(0)
    }

    /// Objects in the store.
    pub fn object_count(&self) -> Res<u64> {
        Ok(self.informer.store().snapshot()?.len()?)
    }

    /// Shuts down and closes the database (so it can be reopened).
    pub async fn stop(self) -> Res<()> {
        self.informer.shutdown().await?;
        drop(self.informer);
        drop(self.reg);
        let db = self.db;
        tokio::task::spawn_blocking(move || db.close()).await??;
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// theirs

/// A running kube-runtime reflector (watcher + reflector + store) consumed by a task that
/// counts the events it yields.
pub struct Theirs {
    /// The reflector's store.
    pub store: reflector::Store<Pod>,
    /// `InitApply` + `Apply` + `Delete` events yielded.
    pub events: Arc<AtomicU64>,
    /// `InitDone` events seen.
    pub init_done: tokio::sync::watch::Receiver<u64>,
    /// What left the reflector (`max_rv` counts every event, `seen` only `Apply`).
    pub probe: Probe,
    task: tokio::task::JoinHandle<()>,
}

/// Starts `reflector(store::writer, watcher(Api::<Pod>::all, Config::default()))`.
pub fn theirs_start(sim: &Sim) -> Res<Theirs> {
    let api: Api<Pod> = Api::all(sim.client()?);
    let (store, writer) = reflector::store::<Pod>();
    let stream = reflector::reflector(writer, watcher(api, watcher::Config::default()));
    let events = Arc::new(AtomicU64::new(0));
    let probe = Probe::default();
    let (tx, init_done) = tokio::sync::watch::channel(0u64);
    let (e2, p2) = (events.clone(), probe.clone());
    let task = tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(watcher::Event::Apply(p)) => {
                    e2.fetch_add(1, Ordering::Relaxed);
                    p2.record(rv_of(&p));
                }
                Ok(watcher::Event::Delete(p)) => {
                    e2.fetch_add(1, Ordering::Relaxed);
                    p2.max_rv.fetch_max(rv_of(&p), Ordering::Relaxed);
                }
                Ok(watcher::Event::InitApply(p)) => {
                    e2.fetch_add(1, Ordering::Relaxed);
                    p2.max_rv.fetch_max(rv_of(&p), Ordering::Relaxed);
                }
                Ok(watcher::Event::InitDone) => tx.send_modify(|n| *n += 1),
                Ok(watcher::Event::Init) => {}
                Err(e) => {
                    // `watcher` retries at once (no backoff configured): pause so an error
                    // loop cannot keep this task from yielding (or from being aborted)
                    eprintln!("kube-runtime watcher error: {e}");
                    tokio::time::sleep(ERROR_PAUSE).await;
                }
            }
        }
    });
    Ok(Theirs {
        store,
        events,
        init_done,
        probe,
        task,
    })
}

impl Theirs {
    /// Waits for the first `InitDone`.
    pub async fn synced(&mut self) -> Res<()> {
        tokio::time::timeout(TIMEOUT, self.init_done.wait_for(|n| *n >= 1)).await??;
        Ok(())
    }

    /// Stops the watcher (drops the store).
    pub fn stop(self) {
        self.task.abort();
    }
}

// ---------------------------------------------------------------------------------------------
// scenarios 1, 2 and 4: cold sync, restart, relist after compaction

/// Results of the lifecycle scenarios for one system.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Lifecycle {
    /// 1. cold initial sync.
    pub cold: Phase,
    /// 2. restart to synced (no changes while down).
    pub restart: Phase,
    /// 2b. the same while another resource (a Lease) changes 200 times a second, as node and
    /// leader Leases do in every cluster: the global resourceVersion runs ahead of the Pods'.
    pub restart_busy: Phase,
    /// 4. relist after compaction with `changed` objects changed while down.
    pub relist: Phase,
    /// Objects changed while down in 4.
    pub changed: u64,
}

/// A Lease renewed every 5 ms through the API, after the global revision ran ahead a little.
pub async fn lease_churn(sim: &Sim) -> Res<LeaseChurn> {
    let churn = LeaseChurn::start(sim.client()?, "kube-node-lease", Duration::from_millis(5)).await?;
    tokio::time::sleep(Duration::from_millis(100)).await;
    Ok(churn)
}

/// Changes 1% of the objects (at least one): updates of existing Pods' labels or status.
/// `seed` varies per repetition so each one changes other objects.
pub fn change_one_percent(sim: &Sim, n: usize, seed: u64) -> Res<u64> {
    let k = (n / 100).max(1);
    let mut churn = Churn::new(seed, "pods", namespaces(n)).mix(0, 1, 0);
    churn.adopt_existing(sim)?;
    let s = churn.step(sim, k)?;
    // an update may hit the same object twice; this counts operations
    Ok(s.updates)
}

/// Scenarios 1, 2 and 4 for durable-informer, with the database in `dir`; `rep` seeds the
/// changes made while down.
pub async fn ours_lifecycle(sim: &Sim, n: usize, dir: &Path, rep: u64) -> Res<Lifecycle> {
    let path: PathBuf = dir.join("compare.redb");
    let _ = std::fs::remove_file(&path);
    let mut out = Lifecycle::default();

    // 1. cold
    let before = sim.counters();
    let t = Instant::now();
    let ours = ours_start(sim, &path).await?;
    ours.synced().await?;
    out.cold.secs = t.elapsed().as_secs_f64();
    out.cold.served = Served::between(&before, &sim.counters());
    ours.handler_caught_up().await?;
    out.cold.events = ours.events.load(Ordering::Relaxed);
    out.cold.objects = ours.object_count()?;
    ours.stop().await?;

    // 2. restart, nothing changed
    let before = sim.counters();
    let t = Instant::now();
    let ours = ours_start(sim, &path).await?;
    ours.synced().await?;
    out.restart.secs = t.elapsed().as_secs_f64();
    out.restart.served = Served::between(&before, &sim.counters());
    ours.handler_caught_up().await?;
    out.restart.events = ours.events.load(Ordering::Relaxed);
    out.restart.objects = ours.object_count()?;
    ours.stop().await?;

    // 2b. restart, nothing changed, other resources churning
    let churn = lease_churn(sim).await?;
    let before = sim.counters();
    let t = Instant::now();
    let ours = ours_start(sim, &path).await?;
    ours.synced().await?;
    out.restart_busy.secs = t.elapsed().as_secs_f64();
    out.restart_busy.served = Served::between(&before, &sim.counters());
    churn.stop().await?;
    ours.handler_caught_up().await?;
    out.restart_busy.events = ours.events.load(Ordering::Relaxed);
    out.restart_busy.objects = ours.object_count()?;
    ours.stop().await?;

    // 4. 1% changed while down, history compacted: 410 → relist as a diff
    out.changed = tokio::task::block_in_place(|| change_one_percent(sim, n, 7 + 1_000 * rep))?;
    sim.compact();
    let before = sim.counters();
    let t = Instant::now();
    let ours = ours_start(sim, &path).await?;
    ours.synced().await?;
    ours.handler_caught_up().await?;
    out.relist.secs = t.elapsed().as_secs_f64();
    out.relist.served = Served::between(&before, &sim.counters());
    out.relist.events = ours.events.load(Ordering::Relaxed);
    out.relist.objects = ours.object_count()?;
    ours.stop().await?;
    Ok(out)
}

/// Scenarios 1, 2 and 4 for kube-runtime: its "restart" is a new watcher + store (it has
/// nothing to resume from), and after compaction the same.
pub async fn theirs_lifecycle(sim: &Sim, n: usize, rep: u64) -> Res<Lifecycle> {
    let mut out = Lifecycle::default();
    for step in 0..4 {
        if step == 3 {
            out.changed = tokio::task::block_in_place(|| change_one_percent(sim, n, 8 + 1_000 * rep))?;
            sim.compact();
        }
        let churn = if step == 2 { Some(lease_churn(sim).await?) } else { None };
        let before = sim.counters();
        let t = Instant::now();
        let mut theirs = theirs_start(sim)?;
        theirs.synced().await?;
        if let Some(c) = churn {
            c.stop().await?;
        }
        let ph = Phase {
            secs: t.elapsed().as_secs_f64(),
            served: Served::between(&before, &sim.counters()),
            events: theirs.events.load(Ordering::Relaxed),
            objects: theirs.store.len() as u64,
        };
        theirs.stop();
        match step {
            0 => out.cold = ph,
            1 => out.restart = ph,
            2 => out.restart_busy = ph,
            _ => out.relist = ph,
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// scenario 3: steady churn (rate ladder) and event → handler latency

/// The producer-rate ladder of scenario 3.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Ladder {
    /// Target rates (updates/s), increasing.
    pub rates: Vec<u64>,
    /// How long each rate is held.
    pub step: Duration,
    /// Rates up to this one are always run (they carry the fixed-rate latency figures); above
    /// it the ladder stops after the first step the consumer did not sustain or the producer
    /// could not reach.
    pub always_up_to: u64,
    /// How long the consumer may take to catch up after a step before the ladder stops.
    pub drain_timeout: Duration,
    /// Lag sampling interval.
    pub sample_every: Duration,
}

/// A step is producer-bound when the producer wrote less than this share of its target.
pub const PRODUCER_SHARE: f64 = 0.9;
/// A step is sustained when the lag (last written RV − last delivered RV) grew by at most this
/// share of the target rate per second over the second half of the step…
pub const MAX_LAG_SLOPE_SHARE: f64 = 0.05;
/// …and the lag at the end of the step is at most this many seconds of events.
pub const MAX_END_LAG_SECS: f64 = 1.0;

/// One rate of the ladder.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct RateStep {
    /// Target rate (updates/s).
    pub target: u64,
    /// Updates written.
    pub written: u64,
    /// Seconds the producer ran.
    pub secs: f64,
    /// Rate the producer achieved (updates/s).
    pub achieved: f64,
    /// Least-squares slope of the lag (events) over the second half of the step, events/s.
    pub lag_slope: f64,
    /// Lag at the end of the step (events).
    pub lag_end: u64,
    /// Highest lag sampled (events).
    pub lag_max: u64,
    /// Lag samples: (seconds since the step started, events behind).
    pub lag_samples: Vec<(f64, u64)>,
    /// Seconds from the end of the step until the consumer had everything.
    pub drain_secs: f64,
    /// Whether the consumer caught up within the drain timeout.
    pub drained: bool,
    /// The producer reached less than [`PRODUCER_SHARE`] of the target.
    pub producer_bound: bool,
    /// The consumer kept up: lag did not grow (slope and end lag within bounds) and drained.
    pub kept_up: bool,
    /// Write → delivery latency, p50 (ms).
    pub p50_ms: f64,
    /// p99 (ms).
    pub p99_ms: f64,
    /// Maximum (ms).
    pub max_ms: f64,
    /// Updates whose delivery was observed.
    pub samples: u64,
}

/// Scenario 3 for one system.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Steady {
    /// Every step run, in order.
    pub steps: Vec<RateStep>,
    /// Highest achieved rate of a step the consumer kept up with (0 if none).
    pub max_sustained: f64,
    /// Why the ladder ended: "consumer" (a step was not sustained), "producer" (the producer
    /// could not reach the target, so `max_sustained` is a lower bound) or "top" (every rate
    /// was sustained: a lower bound too).
    pub ended_by: String,
}

impl Steady {
    /// The step run at `target`, if any.
    pub fn at(&self, target: u64) -> Option<&RateStep> {
        self.steps.iter().find(|s| s.target == target)
    }
}

/// What one producer run wrote.
struct Produced {
    sent: HashMap<u64, Instant>,
    written: u64,
    secs: f64,
    last_rv: u64,
    lag: Vec<(f64, u64)>,
}

/// Writes label patches to the generated Pods at `rate` per second for `dur`, on the calling
/// thread (run it under `block_in_place`), recording the start time of each write per RV and
/// sampling the lag against `applied`. `seq` numbers the patches across calls.
/// One pre-built template per generated Pod, with the `latency` label as the hole: the
/// producer's writes then parse no JSON (`Sim::write_prebuilt`).
fn templates(sim: &Sim, n: usize) -> Res<Vec<Prebuilt>> {
    let ns = namespaces(n);
    (0..n)
        .map(|i| {
            let (namespace, name) = pod_ref(&ns, i);
            Ok(sim.prebuild("pods", Some(namespace), &name, "latency")?)
        })
        .collect()
}

#[allow(clippy::too_many_arguments)] // private; one call per ladder step
fn produce(
    sim: &Sim,
    pre: &[Prebuilt],
    n: usize,
    rate: u64,
    dur: Duration,
    every: Duration,
    seq: &mut u64,
    applied: &AtomicU64,
) -> Res<Produced> {
    let mut sent = HashMap::with_capacity(((rate as f64 * dur.as_secs_f64() * 1.1) as usize).min(1 << 20));
    let mut lag = Vec::new();
    let mut last_rv = sim.current_rv();
    let mut written: u64 = 0;
    let mut next_sample = Duration::ZERO;
    let start = Instant::now();
    loop {
        let el = start.elapsed();
        if el >= next_sample {
            lag.push((
                el.as_secs_f64(),
                last_rv.saturating_sub(applied.load(Ordering::Relaxed)),
            ));
            next_sample += every;
        }
        if el >= dur {
            break;
        }
        let due = (el.as_secs_f64() * rate as f64) as u64 + 1;
        if written < due {
            let i = *seq;
            *seq += 1;
            let t = Instant::now();
            let rv = sim.write_prebuilt(&pre[(i as usize).wrapping_mul(7919) % n], &i.to_string())?;
            sent.insert(rv, t);
            last_rv = last_rv.max(rv);
            written += 1;
            continue;
        }
        // ahead of schedule: sleep until the next write is due (at most 1 ms, to keep sampling)
        let next_at = Duration::from_secs_f64(written as f64 / rate as f64);
        std::thread::sleep(next_at.saturating_sub(el).min(Duration::from_millis(1)));
    }
    Ok(Produced {
        sent,
        written,
        secs: start.elapsed().as_secs_f64(),
        last_rv,
        lag,
    })
}

/// The producer alone, with no informer or watcher attached: label patches as fast as one
/// thread can write them for `dur` (updates/s). The ladder's producer cannot go faster than
/// this; with a consumer sharing the CPU it goes slower. Compacts the sim's history afterwards.
pub fn producer_ceiling(sim: &Sim, n: usize, dur: Duration) -> Res<f64> {
    let applied = AtomicU64::new(0);
    let mut seq = u64::MAX / 2; // other label values than the ladder's
    let pre = templates(sim, n)?;
    let run = produce(sim, &pre, n, 100_000_000, dur, dur, &mut seq, &applied)?;
    sim.compact();
    Ok(run.written as f64 / run.secs)
}

/// Least-squares slope of `y` over `x`.
fn slope(points: &[(f64, u64)]) -> f64 {
    let k = points.len() as f64;
    if points.len() < 2 {
        return 0.0;
    }
    let mx = points.iter().map(|p| p.0).sum::<f64>() / k;
    let my = points.iter().map(|p| p.1 as f64).sum::<f64>() / k;
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 as f64 - my)).sum();
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    if sxx == 0.0 {
        0.0
    } else {
        sxy / sxx
    }
}

/// (p50, p99, max, samples) of delivery − write start, in ms.
fn percentiles(sent: &HashMap<u64, Instant>, seen: &HashMap<u64, Instant>) -> (f64, f64, f64, u64) {
    let mut lat: Vec<f64> = sent
        .iter()
        .filter_map(|(rv, t)| {
            seen.get(rv)
                .map(|s| s.saturating_duration_since(*t).as_secs_f64() * 1e3)
        })
        .collect();
    if lat.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN, 0);
    }
    lat.sort_by(f64::total_cmp);
    let p = |q: f64| lat[((lat.len() as f64 - 1.0) * q).round() as usize];
    (p(0.5), p(0.99), p(1.0), lat.len() as u64)
}

/// Runs the ladder against a consumer that is caught up with the sim and whose probe's
/// `max_rv` is at least the sim's current revision.
pub async fn ladder(sim: &Sim, n: usize, cfg: &Ladder, probe: &Probe) -> Res<Steady> {
    let mut out = Steady {
        ended_by: "top".into(),
        ..Steady::default()
    };
    let mut seq: u64 = 0;
    let pre = tokio::task::block_in_place(|| templates(sim, n))?;
    for &rate in &cfg.rates {
        if rate > cfg.always_up_to {
            if let Some(last) = out.steps.last() {
                if !last.kept_up {
                    out.ended_by = "consumer".into();
                    break;
                }
                if last.producer_bound {
                    out.ended_by = "producer".into();
                    break;
                }
            }
        }
        probe.seen.lock().expect("probe lock").clear();
        let applied = probe.max_rv.clone();
        let run = tokio::task::block_in_place(|| {
            produce(sim, &pre, n, rate, cfg.step, cfg.sample_every, &mut seq, &applied)
        })?;
        let t = Instant::now();
        let drained = wait_rv(|| probe.applied(), run.last_rv, cfg.drain_timeout)
            .await
            .is_ok();
        let drain_secs = t.elapsed().as_secs_f64();
        let (p50_ms, p99_ms, max_ms, samples) = percentiles(&run.sent, &probe.seen.lock().expect("probe lock"));
        let half = cfg.step.as_secs_f64() / 2.0;
        let second_half: Vec<(f64, u64)> = run.lag.iter().copied().filter(|p| p.0 >= half).collect();
        let lag_slope = slope(&second_half);
        let lag_end = run.lag.last().map_or(0, |p| p.1);
        let achieved = run.written as f64 / run.secs;
        let kept_up = drained
            && lag_slope <= MAX_LAG_SLOPE_SHARE * rate as f64
            && lag_end as f64 <= MAX_END_LAG_SECS * rate as f64;
        let producer_bound = achieved < PRODUCER_SHARE * rate as f64;
        if kept_up {
            out.max_sustained = out.max_sustained.max(achieved);
        }
        out.steps.push(RateStep {
            target: rate,
            written: run.written,
            secs: run.secs,
            achieved,
            lag_slope,
            lag_end,
            lag_max: run.lag.iter().map(|p| p.1).max().unwrap_or(0),
            lag_samples: run.lag,
            drain_secs,
            drained,
            producer_bound,
            kept_up,
            p50_ms,
            p99_ms,
            max_ms,
            samples,
        });
        if !drained {
            out.ended_by = "consumer".into();
            break;
        }
    }
    if out.ended_by == "top" {
        if let Some(last) = out.steps.last() {
            if !last.kept_up {
                out.ended_by = "consumer".into();
            } else if last.producer_bound {
                out.ended_by = "producer".into();
            }
        }
    }
    Ok(out)
}

/// Scenario 3 for ours: reopen the database, catch up with the sim, run the ladder.
pub async fn ours_steady(sim: &Sim, n: usize, cfg: &Ladder, dir: &Path) -> Res<Steady> {
    let ours = ours_start(sim, &dir.join("compare.redb")).await?;
    ours.caught_up(sim).await?;
    ours.probe.max_rv.fetch_max(sim.current_rv(), Ordering::Relaxed);
    let out = ladder(sim, n, cfg, &ours.probe).await;
    ours.stop().await?;
    // old object versions stay in the sim's history: drop them
    sim.compact();
    out
}

/// Scenario 3 for theirs: a fresh watcher, synced, then the ladder.
pub async fn theirs_steady(sim: &Sim, n: usize, cfg: &Ladder) -> Res<Steady> {
    let mut theirs = theirs_start(sim)?;
    theirs.synced().await?;
    theirs.probe.max_rv.fetch_max(sim.current_rv(), Ordering::Relaxed);
    let out = ladder(sim, n, cfg, &theirs.probe).await;
    theirs.stop();
    sim.compact();
    out
}

// ---------------------------------------------------------------------------------------------
// scenario 6: reads

/// Scenario 6: reads, in microseconds per operation.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Reads {
    /// Get one Pod by namespace/name (typed).
    pub get_us: f64,
    /// List one namespace (typed).
    pub list_ns_us: f64,
    /// Select `app=web` across all namespaces (typed).
    pub by_label_us: f64,
    /// Objects returned by one namespace list.
    pub list_ns_len: u64,
    /// Objects returned by the label select.
    pub by_label_len: u64,
    /// Ours only: the same reads with no object JSON in the cache (from redb).
    pub cold: Option<ColdReads>,
    /// Ours only: what the object cache holds after the reads (MiB charged).
    pub object_cache_mib: Option<f64>,
    /// The same kinds of reads over a hot set, after those over every object.
    pub hot: HotReads,
}

/// Objects in the hot set: the first of the gets' stride (all of them below this N).
pub const HOT_SET: usize = 1_000;

/// Reads of the hot set before it is timed. Two: ours' cache, when full, takes in an object
/// read back only the second time (its doorkeeper), so one pass would time that admission.
pub const WARM_PASSES: usize = 2;

/// Reads over a hot set, what a controller rereads while it works: gets of the first
/// [`HOT_SET`] objects of the stride, and the first namespace listed whole and by `app=web`.
/// Each is read [`WARM_PASSES`] times before it is timed, after the reads over every object,
/// so ours' cache holds the hot set decoded whatever N is (its budget holds every object
/// only at small N).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct HotReads {
    pub get_us: f64,
    pub list_ns_us: f64,
    pub list_ns_len: u64,
    /// `app=web` within the first namespace.
    pub select_us: f64,
    pub select_len: u64,
}

/// Times the hot-set reads through three closures: get the `i`th object of the stride, list
/// a namespace whole or by `app=web` (`true`). Every system goes through this one function.
fn hot_reads(
    n: usize,
    gets: usize,
    lists: usize,
    mut get: impl FnMut(usize) -> Res<u64>,
    mut list: impl FnMut(bool) -> Res<u64>,
) -> Res<HotReads> {
    let hot = HOT_SET.clamp(1, n.max(1));
    for _ in 0..WARM_PASSES {
        for i in 0..hot {
            get(i)?;
        }
        list(false)?;
        list(true)?;
    }
    let (get_us, _) = time_per_op(gets, |i| get(i % hot))?;
    let (list_ns_us, list_ns_len) = time_per_op(lists, |_| list(false))?;
    let (select_us, select_len) = time_per_op(lists, |_| list(true))?;
    Ok(HotReads {
        get_us,
        list_ns_us,
        list_ns_len,
        select_us,
        select_len,
    })
}

/// Ours' reads with an object cache budget of 0 (every object read from redb), in
/// microseconds per operation.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ColdReads {
    pub get_us: f64,
    pub list_ns_us: f64,
    pub by_label_us: f64,
    /// Decoding one Pod's JSON into `Pod` and dropping it, alone (the floor of a cold read).
    pub decode_us: f64,
}

/// Time budget of one read measurement: it stops after `iters` operations or this long,
/// whichever comes first (but runs at least [`READ_MIN_ITERS`]).
const READ_BUDGET: Duration = Duration::from_secs(3);
/// Fewest operations of one read measurement.
const READ_MIN_ITERS: usize = 3;

/// Mean microseconds per call of `f` and the last result.
fn time_per_op(iters: usize, mut f: impl FnMut(usize) -> Res<u64>) -> Res<(f64, u64)> {
    let t = Instant::now();
    let mut last = 0;
    let mut done = 0;
    for i in 0..iters {
        last = f(i)?;
        done += 1;
        if done >= READ_MIN_ITERS && t.elapsed() > READ_BUDGET {
            break;
        }
    }
    Ok((t.elapsed().as_secs_f64() * 1e6 / done.max(1) as f64, last))
}

/// Gets the `i`th object of the gets' stride through `lister`: 1 if found.
fn lister_get(lister: &Lister<Pod>, ns: &[String], n: usize, i: usize) -> Res<u64> {
    let (namespace, name) = pod_ref(ns, i.wrapping_mul(7919) % n);
    Ok(u64::from(lister.namespace(namespace).get(&name)?.is_some()))
}

/// Timed reads through one lister: get by key, list a namespace, the label index.
fn lister_reads(lister: &Lister<Pod>, n: usize, gets: usize, lists: usize) -> Res<(ColdReads, u64, u64)> {
    let ns = namespaces(n);
    let (get_us, _) = time_per_op(gets, |i| lister_get(lister, &ns, n, i))?;
    let all = LabelSelector::everything();
    let (list_ns_us, list_ns_len) = time_per_op(lists, |i| {
        Ok(lister.namespace(&ns[i % ns.len()]).list(&all)?.len() as u64)
    })?;
    let (by_label_us, by_label_len) = time_per_op(lists, |_| Ok(lister.by_index("labels", "app=web")?.len() as u64))?;
    Ok((
        ColdReads {
            get_us,
            list_ns_us,
            by_label_us,
            decode_us: f64::NAN,
        },
        list_ns_len,
        by_label_len,
    ))
}

/// [`hot_reads`] through our lister.
fn lister_hot_reads(lister: &Lister<Pod>, n: usize, gets: usize, lists: usize) -> Res<HotReads> {
    let ns = namespaces(n);
    let all = LabelSelector::everything();
    let web = LabelSelector::parse("app=web")?;
    hot_reads(
        n,
        gets,
        lists,
        |i| lister_get(lister, &ns, n, i),
        |select| {
            let sel = if select { &web } else { &all };
            Ok(lister.namespace(&ns[0]).list(sel)?.len() as u64)
        },
    )
}

/// Mean µs to decode one stored Pod's JSON into `Pod` and drop it (the JSON read beforehand,
/// outside the timing): what any read that is not served decoded costs at least.
fn decode_alone(store: &durable_informer::store::Store, n: usize) -> Res<f64> {
    let ns = namespaces(n);
    let objects = store.list_namespace(&ns[0])?;
    if objects.is_empty() {
        return Err("no objects to decode".into());
    }
    let mut rounds = 0usize;
    let t = Instant::now();
    while rounds < 3 || t.elapsed() < Duration::from_secs(1) {
        for o in &objects {
            let pod: Pod = serde_json::from_slice(&o.bytes)?;
            std::hint::black_box(pod);
        }
        rounds += 1;
    }
    Ok(t.elapsed().as_secs_f64() * 1e6 / (rounds * objects.len()) as f64)
}

/// Reads through our lister (gets, namespace lists, the label index): with the object cache's
/// default budget after a cold sync (every object read once first, as kube-runtime decoded
/// each during its sync), then from redb (the database reopened with a budget of 0: the cache
/// holds keys, metadata and postings, no JSON).
pub async fn ours_reads(sim: &Sim, n: usize, gets: usize, lists: usize, dir: &Path) -> Res<Reads> {
    let path = dir.join("compare.redb");
    let ours = ours_start(sim, &path).await?;
    ours.caught_up(sim).await?;
    let lister = ours.informer.lister();
    let t = Instant::now();
    while !ours.informer.cache_stats().loaded {
        if t.elapsed() > TIMEOUT {
            return Err("the object cache did not load".into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (hot, list_ns_len, by_label_len) = tokio::task::block_in_place(|| {
        lister.list(&LabelSelector::everything())?;
        lister_reads(&lister, n, gets, lists)
    })?;
    let hot_set = tokio::task::block_in_place(|| lister_hot_reads(&lister, n, gets, lists))?;
    let object_cache_mib = Some(ours.informer.cache_stats().charged_bytes as f64 / f64::from(1 << 20));
    drop(lister);
    ours.stop().await?;
    let p = path.clone();
    let db =
        tokio::task::spawn_blocking(move || DurableStore::open(StoreConfig::new(p).object_cache_bytes(0))).await??;
    let source = KubeSource::typed::<Pod>(sim.client()?, &sim.url());
    // Resumed (a lister of an informer never started refuses to read), with nothing changed
    // meanwhile: every read below is of an object the cache holds no JSON of.
    let informer = Informer::<Pod>::builder(&db, source)
        .indexer(Indexer::labels())
        .build()
        .await?;
    informer.start();
    tokio::time::timeout(TIMEOUT, informer.wait_for_sync()).await??;
    let lister = informer.lister();
    let (mut cold, _, _) = tokio::task::block_in_place(|| lister_reads(&lister, n, gets, lists))?;
    cold.decode_us = tokio::task::block_in_place(|| decode_alone(&informer.store(), n))?;
    drop(lister);
    informer.shutdown().await?;
    drop(informer);
    tokio::task::spawn_blocking(move || db.close()).await??;
    Ok(Reads {
        get_us: hot.get_us,
        list_ns_us: hot.list_ns_us,
        by_label_us: hot.by_label_us,
        list_ns_len,
        by_label_len,
        cold: Some(cold),
        object_cache_mib,
        hot: hot_set,
    })
}

/// Reads through kube-runtime's `reflector::Store` (get by ObjectRef, iteration).
pub async fn theirs_reads(sim: &Sim, n: usize, gets: usize, lists: usize) -> Res<Reads> {
    let mut theirs = theirs_start(sim)?;
    theirs.synced().await?;
    let ns = namespaces(n);
    let store = theirs.store.clone();
    let get = |i: usize| {
        let (namespace, name) = pod_ref(&ns, i.wrapping_mul(7919) % n);
        let r = ObjectRef::<Pod>::new(&name).within(namespace);
        Ok(u64::from(store.get(&r).is_some()))
    };
    let is_web = |p: &Pod| {
        p.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("app"))
            .is_some_and(|v| v == "web")
    };
    let (get_us, _) = time_per_op(gets, get)?;
    let (list_ns_us, list_ns_len) = time_per_op(lists, |i| {
        let want = &ns[i % ns.len()];
        Ok(store
            .state_filter(|p| p.metadata.namespace.as_deref() == Some(want.as_str()))
            .len() as u64)
    })?;
    let (by_label_us, by_label_len) = time_per_op(lists, |_| Ok(store.state_filter(is_web).len() as u64))?;
    let in_first = |p: &Pod| p.metadata.namespace.as_deref() == Some(ns[0].as_str());
    let hot = hot_reads(n, gets, lists, get, |select| {
        Ok(store.state_filter(|p| in_first(p) && (!select || is_web(p))).len() as u64)
    })?;
    theirs.stop();
    Ok(Reads {
        get_us,
        list_ns_us,
        by_label_us,
        list_ns_len,
        by_label_len,
        cold: None,
        object_cache_mib: None,
        hot,
    })
}

// ---------------------------------------------------------------------------------------------
// memory (child processes): scenario 5, and the peak RSS of scenario 2

/// Peak RSS of this process in KiB (`VmHWM`), Linux only.
pub fn vm_hwm_kib() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    s.lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

/// What a memory child reports.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct ChildReport {
    /// Peak RSS (`VmHWM`), KiB.
    pub vm_hwm_kib: u64,
    /// Seconds from start to synced.
    pub secs: f64,
}

/// Child body: sync one system against the sim at `url`, which holds `n` objects, then report
/// its peak RSS. The sim runs in the parent, so it does not count. Ours uses the database at
/// `db`: `restart == false` deletes it first (cold sync), `true` resumes from it. Theirs has
/// nothing to resume from: both are a full LIST into a fresh store.
pub async fn memory_child(system: &str, url: &str, n: u64, db: &Path, restart: bool) -> Res<ChildReport> {
    let uri: http::Uri = url.parse()?;
    let client = kube::Client::try_from(kube::Config::new(uri))?;
    let t = Instant::now();
    match system {
        "ours" => {
            if !restart {
                let _ = std::fs::remove_file(db);
            }
            let config = store_config(db.to_path_buf())?;
            let store = tokio::task::spawn_blocking(move || DurableStore::open(config)).await??;
            let informer = Informer::<Pod>::builder(&store, KubeSource::typed::<Pod>(client, url))
                .indexer(Indexer::labels())
                .build()
                .await?;
            informer.start();
            tokio::time::timeout(TIMEOUT, informer.wait_for_sync()).await??;
            let secs = t.elapsed().as_secs_f64();
            let len = informer.store().snapshot()?.len()?;
            if len != n {
                return Err(format!("ours synced {len} objects, want {n}").into());
            }
            if std::env::var_os("BENCH_MEMORY_STATS").is_some() {
                eprintln!("memory stats at sync: {:?}", store.memory_stats());
            }
            informer.shutdown().await?;
            drop(informer);
            tokio::task::spawn_blocking(move || store.close()).await??;
            let vm_hwm_kib = vm_hwm_kib().ok_or("no VmHWM in /proc/self/status")?;
            Ok(ChildReport { vm_hwm_kib, secs })
        }
        "theirs" => {
            let api: Api<Pod> = Api::all(client);
            let (store, writer) = reflector::store::<Pod>();
            let stream = reflector::reflector(writer, watcher(api, watcher::Config::default()));
            // set once measured: errors of the client being torn down at exit are not news
            let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let done2 = done.clone();
            let task = tokio::spawn(async move {
                let mut stream = std::pin::pin!(stream);
                while let Some(ev) = stream.next().await {
                    if let Err(e) = ev {
                        if !done2.load(Ordering::Relaxed) {
                            eprintln!("kube-runtime watcher error: {e}");
                        }
                        tokio::time::sleep(ERROR_PAUSE).await;
                    }
                }
            });
            tokio::time::timeout(TIMEOUT, store.wait_until_ready()).await??;
            let secs = t.elapsed().as_secs_f64();
            done.store(true, Ordering::Relaxed);
            let len = store.len() as u64;
            if len != n {
                return Err(format!("kube-runtime synced {len} objects, want {n}").into());
            }
            task.abort();
            let vm_hwm_kib = vm_hwm_kib().ok_or("no VmHWM in /proc/self/status")?;
            Ok(ChildReport { vm_hwm_kib, secs })
        }
        other => Err(format!("unknown system {other:?} (want ours or theirs)").into()),
    }
}
