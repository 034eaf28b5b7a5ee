//! The scenarios of `benches/compare.rs`: durable-informer against kube-runtime's reflector on
//! the same simulated API server, over real HTTP. Shared with `tests/bench_smoke.rs`, which runs
//! them at a tiny size and checks only sanity (never speed).

#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use durable_informer::informer::{handler_fn, Event, HandlerOptions, Informer, Registration};
use durable_informer::selector::LabelSelector;
use durable_informer::sim::workload::{Churn, WorkloadGen};
use durable_informer::sim::{Counters, Sim, SimConfig};
use durable_informer::source::KubeSource;
use durable_informer::store::{DurableStore, Indexer, StoreConfig};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::watcher;
use kube::Api;

/// Namespaces the generated Pods are spread over.
pub const NAMESPACES: usize = 10;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// Result of the scenarios.
pub type Res<T> = Result<T, BoxError>;

/// How long any wait may take before the scenario fails (a bench must not hang).
const TIMEOUT: Duration = Duration::from_secs(600);

/// Starts the sim with `n` generated ~4 KB Pods over [`NAMESPACES`] namespaces.
pub fn start_sim(n: usize) -> Res<Sim> {
    let sim = Sim::start(SimConfig::default().history_max_events(2_000_000))?;
    let mut gen = WorkloadGen::new(42).namespaces(NAMESPACES);
    sim.bulk_load("namespaces", gen.namespace_objects())?;
    sim.bulk_load("pods", gen.pods(n))?;
    Ok(sim)
}

/// Namespace names of the workload.
pub fn namespaces() -> Vec<String> {
    WorkloadGen::new(42).namespaces(NAMESPACES).namespace_names()
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
    /// Receive times per RV (for latency).
    pub seen: Arc<Mutex<HashMap<u64, Instant>>>,
}

fn rv_of(p: &Pod) -> u64 {
    p.metadata
        .resource_version
        .as_deref()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// Opens (or reopens) the database at `path`, builds the informer with the label index,
/// registers the counting handler and starts it. Does not wait for sync.
pub async fn ours_start(sim: &Sim, path: &Path) -> Res<Ours> {
    let p = path.to_path_buf();
    let db = tokio::task::spawn_blocking(move || DurableStore::open(StoreConfig::new(p))).await??;
    let source = KubeSource::typed::<Pod>(sim.client()?, &sim.url());
    let informer = Informer::<Pod>::builder(&db, source)
        .indexer(Indexer::labels())
        .build()
        .await?;
    let events = Arc::new(AtomicU64::new(0));
    let seen: Arc<Mutex<HashMap<u64, Instant>>> = Arc::default();
    let (e2, s2) = (events.clone(), seen.clone());
    let reg = informer.add_event_handler(
        handler_fn(move |ev: Event<Pod>| -> Result<(), std::convert::Infallible> {
            if let Event::Add { initial: true, .. } = ev {
                return Ok(());
            }
            e2.fetch_add(1, Ordering::Relaxed);
            let now = Instant::now();
            s2.lock().unwrap().insert(rv_of(ev.object()), now);
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
        seen,
    })
}

impl Ours {
    /// Waits until synced.
    pub async fn synced(&self) -> Res<()> {
        tokio::time::timeout(TIMEOUT, self.informer.wait_for_sync()).await?;
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
    /// Highest RV applied.
    pub max_rv: Arc<AtomicU64>,
    /// Receive times per RV of `Apply` events (for latency).
    pub seen: Arc<Mutex<HashMap<u64, Instant>>>,
    task: tokio::task::JoinHandle<()>,
}

/// Starts `reflector(store::writer, watcher(Api::<Pod>::all, Config::default()))`.
pub fn theirs_start(sim: &Sim) -> Res<Theirs> {
    let api: Api<Pod> = Api::all(sim.client()?);
    let (store, writer) = reflector::store::<Pod>();
    let stream = reflector::reflector(writer, watcher(api, watcher::Config::default()));
    let events = Arc::new(AtomicU64::new(0));
    let max_rv = Arc::new(AtomicU64::new(0));
    let seen: Arc<Mutex<HashMap<u64, Instant>>> = Arc::default();
    let (tx, init_done) = tokio::sync::watch::channel(0u64);
    let (e2, m2, s2) = (events.clone(), max_rv.clone(), seen.clone());
    let task = tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(watcher::Event::Apply(p)) => {
                    e2.fetch_add(1, Ordering::Relaxed);
                    let rv = rv_of(&p);
                    s2.lock().unwrap().insert(rv, Instant::now());
                    m2.fetch_max(rv, Ordering::Relaxed);
                }
                Ok(watcher::Event::Delete(p)) => {
                    e2.fetch_add(1, Ordering::Relaxed);
                    m2.fetch_max(rv_of(&p), Ordering::Relaxed);
                }
                Ok(watcher::Event::InitApply(p)) => {
                    e2.fetch_add(1, Ordering::Relaxed);
                    m2.fetch_max(rv_of(&p), Ordering::Relaxed);
                }
                Ok(watcher::Event::InitDone) => tx.send_modify(|n| *n += 1),
                Ok(watcher::Event::Init) => {}
                Err(e) => eprintln!("kube-runtime watcher error: {e}"),
            }
        }
    });
    Ok(Theirs {
        store,
        events,
        init_done,
        max_rv,
        seen,
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
// scenarios

/// Results of scenarios 1–3 for one system.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Lifecycle {
    /// 1. cold initial sync.
    pub cold: Phase,
    /// 2. restart to synced (no changes while down).
    pub restart: Phase,
    /// 3. relist after compaction with `changed` objects changed while down.
    pub relist: Phase,
    /// Objects changed while down in 3.
    pub changed: u64,
}

/// Changes 1% of the objects (at least one): updates of existing Pods' labels.
fn change_one_percent(sim: &Sim, n: usize, seed: u64) -> Res<u64> {
    let k = (n / 100).max(1);
    let mut churn = Churn::new(seed, "pods", namespaces()).mix(0, 1, 0);
    churn.adopt_existing(sim)?;
    let s = churn.step(sim, k)?;
    // an update may hit the same object twice; count distinct changes conservatively as ops
    Ok(s.updates)
}

/// Scenarios 1–3 for durable-informer, with the database in `dir`.
pub async fn ours_lifecycle(sim: &Sim, n: usize, dir: &Path) -> Res<Lifecycle> {
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

    // 3. 1% changed while down, history compacted: 410 → relist as a diff
    out.changed = tokio::task::block_in_place(|| change_one_percent(sim, n, 7))?;
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

/// Scenarios 1–3 for kube-runtime: its "restart" is a new watcher + store (it has nothing
/// to resume from), and after compaction the same.
pub async fn theirs_lifecycle(sim: &Sim, n: usize) -> Res<Lifecycle> {
    let mut out = Lifecycle::default();
    for step in 0..3 {
        if step == 2 {
            out.changed = tokio::task::block_in_place(|| change_one_percent(sim, n, 8))?;
            sim.compact();
        }
        let before = sim.counters();
        let t = Instant::now();
        let mut theirs = theirs_start(sim)?;
        theirs.synced().await?;
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
            _ => out.relist = ph,
        }
    }
    Ok(out)
}

/// Scenario 4: steady ingest and latency.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Steady {
    /// Updates applied.
    pub updates: u64,
    /// Seconds the producer took to apply them.
    pub produce_secs: f64,
    /// Seconds from the first update until the store reflected the last RV.
    pub ingest_secs: f64,
    /// Updates per second into the store (updates / ingest_secs).
    pub events_per_sec: f64,
    /// Fixed-rate latency run: rate (updates/s).
    pub latency_rate: u64,
    /// Update → handler latency p50 (ms).
    pub latency_p50_ms: f64,
    /// p99 (ms).
    pub latency_p99_ms: f64,
    /// Updates whose delivery was observed in the latency run.
    pub latency_samples: u64,
}

async fn wait_rv(get: impl Fn() -> u64, target: u64) -> Res<()> {
    let start = Instant::now();
    while get() < target {
        if start.elapsed() > TIMEOUT {
            return Err(format!("store never reached RV {target} (at {})", get()).into());
        }
        tokio::time::sleep(Duration::from_micros(500)).await;
    }
    Ok(())
}

/// Applies `k` updates (Churn, updates only) in a blocking thread; returns (seconds, last RV).
async fn churn_updates(sim: &Sim, k: usize, seed: u64) -> Res<(f64, u64)> {
    let t = Instant::now();
    tokio::task::block_in_place(|| -> Res<()> {
        let mut churn = Churn::new(seed, "pods", namespaces()).mix(0, 1, 0);
        churn.adopt_existing(sim)?;
        churn.step(sim, k)?;
        Ok(())
    })?;
    Ok((t.elapsed().as_secs_f64(), sim.current_rv()))
}

/// Patches at a fixed rate for `duration`, recording the write time per RV.
async fn fixed_rate(sim: &Sim, rate: u64, duration: Duration, n: usize) -> Res<HashMap<u64, Instant>> {
    let ns = namespaces();
    let mut sent = HashMap::new();
    let start = Instant::now();
    let mut i: u64 = 0;
    while start.elapsed() < duration {
        let due = (start.elapsed().as_secs_f64() * rate as f64) as u64;
        while i < due {
            let idx = (i as usize * 7919) % n;
            let namespace = &ns[idx % ns.len()];
            let name = format!("pod-{idx}");
            let t = Instant::now();
            let v = sim.patch(
                "pods",
                Some(namespace),
                &name,
                &serde_json::json!({"metadata": {"labels": {"latency": i.to_string()}}}),
            )?;
            let rv: u64 = v["metadata"]["resourceVersion"]
                .as_str()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            sent.insert(rv, t);
            i += 1;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Ok(sent)
}

fn percentiles(sent: &HashMap<u64, Instant>, seen: &HashMap<u64, Instant>) -> (f64, f64, u64) {
    let mut lat: Vec<f64> = sent
        .iter()
        .filter_map(|(rv, t)| {
            seen.get(rv)
                .map(|s| s.saturating_duration_since(*t).as_secs_f64() * 1e3)
        })
        .collect();
    if lat.is_empty() {
        return (f64::NAN, f64::NAN, 0);
    }
    lat.sort_by(f64::total_cmp);
    let p = |q: f64| lat[((lat.len() as f64 - 1.0) * q).round() as usize];
    (p(0.5), p(0.99), lat.len() as u64)
}

/// Scenario 4 for ours: `k` churn updates, then a fixed-rate latency run.
pub async fn ours_steady(sim: &Sim, k: usize, rate: u64, dur: Duration, n: usize, dir: &Path) -> Res<Steady> {
    let path = dir.join("compare.redb");
    let ours = ours_start(sim, &path).await?;
    ours.synced().await?;
    ours.handler_caught_up().await?;
    let t = Instant::now();
    let (produce, target) = churn_updates(sim, k, 11).await?;
    wait_rv(|| ours.committed_rv(), target).await?;
    let ingest = t.elapsed().as_secs_f64();
    ours.handler_caught_up().await?;
    ours.seen.lock().unwrap().clear();
    let sent = fixed_rate(sim, rate, dur, n).await?;
    wait_rv(|| ours.committed_rv(), sim.current_rv()).await?;
    ours.handler_caught_up().await?;
    let (p50, p99, samples) = percentiles(&sent, &ours.seen.lock().unwrap());
    ours.stop().await?;
    Ok(Steady {
        updates: k as u64,
        produce_secs: produce,
        ingest_secs: ingest,
        events_per_sec: k as f64 / ingest,
        latency_rate: rate,
        latency_p50_ms: p50,
        latency_p99_ms: p99,
        latency_samples: samples,
    })
}

/// Scenario 4 for theirs.
pub async fn theirs_steady(sim: &Sim, k: usize, rate: u64, dur: Duration, n: usize) -> Res<Steady> {
    let mut theirs = theirs_start(sim)?;
    theirs.synced().await?;
    let t = Instant::now();
    let (produce, target) = churn_updates(sim, k, 12).await?;
    let m = theirs.max_rv.clone();
    wait_rv(|| m.load(Ordering::Relaxed), target).await?;
    let ingest = t.elapsed().as_secs_f64();
    theirs.seen.lock().unwrap().clear();
    let sent = fixed_rate(sim, rate, dur, n).await?;
    wait_rv(|| m.load(Ordering::Relaxed), sim.current_rv()).await?;
    let (p50, p99, samples) = percentiles(&sent, &theirs.seen.lock().unwrap());
    theirs.stop();
    Ok(Steady {
        updates: k as u64,
        produce_secs: produce,
        ingest_secs: ingest,
        events_per_sec: k as f64 / ingest,
        latency_rate: rate,
        latency_p50_ms: p50,
        latency_p99_ms: p99,
        latency_samples: samples,
    })
}

/// Scenario 6: reads, in microseconds per operation.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Reads {
    /// Get one Pod by namespace/name (typed).
    pub get_us: f64,
    /// List one namespace (typed), N/10 objects.
    pub list_ns_us: f64,
    /// Select `app=web` across all namespaces (typed).
    pub by_label_us: f64,
    /// Objects returned by one namespace list.
    pub list_ns_len: u64,
    /// Objects returned by the label select.
    pub by_label_len: u64,
}

fn time_per_op(iters: usize, mut f: impl FnMut(usize) -> Res<u64>) -> Res<(f64, u64)> {
    let t = Instant::now();
    let mut last = 0;
    for i in 0..iters {
        last = f(i)?;
    }
    Ok((t.elapsed().as_secs_f64() * 1e6 / iters as f64, last))
}

/// Reads through our lister (gets, namespace lists) and the label index.
pub async fn ours_reads(sim: &Sim, n: usize, gets: usize, lists: usize, dir: &Path) -> Res<Reads> {
    let ours = ours_start(sim, &dir.join("compare.redb")).await?;
    ours.synced().await?;
    let ns = namespaces();
    let lister = ours.informer.lister();
    let store = ours.informer.store();
    let (get_us, _) = tokio::task::block_in_place(|| {
        time_per_op(gets, |i| {
            let idx = (i * 7919) % n;
            let p = lister.namespace(&ns[idx % ns.len()]).get(&format!("pod-{idx}"))?;
            Ok(u64::from(p.is_some()))
        })
    })?;
    let all = LabelSelector::everything();
    let (list_ns_us, list_ns_len) = tokio::task::block_in_place(|| {
        time_per_op(lists, |i| {
            Ok(lister.namespace(&ns[i % ns.len()]).list(&all)?.len() as u64)
        })
    })?;
    let (by_label_us, by_label_len) = tokio::task::block_in_place(|| {
        time_per_op(lists, |_| {
            let v: Vec<Pod> = store
                .by_index("labels", "app=web")?
                .iter()
                .map(|o| o.decode::<Pod>())
                .collect::<Result<_, _>>()?;
            Ok(v.len() as u64)
        })
    })?;
    ours.stop().await?;
    Ok(Reads {
        get_us,
        list_ns_us,
        by_label_us,
        list_ns_len,
        by_label_len,
    })
}

/// Reads through kube-runtime's `reflector::Store` (get by ObjectRef, iteration).
pub async fn theirs_reads(sim: &Sim, n: usize, gets: usize, lists: usize) -> Res<Reads> {
    let mut theirs = theirs_start(sim)?;
    theirs.synced().await?;
    let ns = namespaces();
    let store = theirs.store.clone();
    let (get_us, _) = time_per_op(gets, |i| {
        let idx = (i * 7919) % n;
        let r = ObjectRef::<Pod>::new(&format!("pod-{idx}")).within(&ns[idx % ns.len()]);
        Ok(u64::from(store.get(&r).is_some()))
    })?;
    let (list_ns_us, list_ns_len) = time_per_op(lists, |i| {
        let want = &ns[i % ns.len()];
        Ok(store
            .state_filter(|p| p.metadata.namespace.as_deref() == Some(want.as_str()))
            .len() as u64)
    })?;
    let (by_label_us, by_label_len) = time_per_op(lists, |_| {
        Ok(store
            .state_filter(|p| {
                p.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get("app"))
                    .is_some_and(|v| v == "web")
            })
            .len() as u64)
    })?;
    theirs.stop();
    Ok(Reads {
        get_us,
        list_ns_us,
        by_label_us,
        list_ns_len,
        by_label_len,
    })
}

// ---------------------------------------------------------------------------------------------
// memory (child processes)

/// Peak RSS of this process in KiB (`VmHWM`), Linux only.
pub fn vm_hwm_kib() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    s.lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

/// Child body: sync one system against the sim at `url` with `n` objects, then print
/// `VMHWM_KIB=<n>`. The sim runs in the parent, so it does not count.
pub async fn memory_child(system: &str, url: &str, n: u64, dir: &Path) -> Res<u64> {
    let uri: http::Uri = url.parse()?;
    let client = kube::Client::try_from(kube::Config::new(uri))?;
    match system {
        "ours" => {
            let db = DurableStore::open(StoreConfig::new(dir.join("mem.redb")))?;
            let informer = Informer::<Pod>::builder(&db, KubeSource::typed::<Pod>(client, url))
                .indexer(Indexer::labels())
                .build()
                .await?;
            informer.start();
            tokio::time::timeout(TIMEOUT, informer.wait_for_sync()).await?;
            let len = informer.store().snapshot()?.len()?;
            if len != n {
                return Err(format!("ours synced {len} objects, want {n}").into());
            }
            informer.shutdown().await?;
        }
        _ => {
            let api: Api<Pod> = Api::all(client);
            let (store, writer) = reflector::store::<Pod>();
            let stream = reflector::reflector(writer, watcher(api, watcher::Config::default()));
            let task = tokio::spawn(async move {
                let mut stream = std::pin::pin!(stream);
                while stream.next().await.is_some() {}
            });
            tokio::time::timeout(TIMEOUT, store.wait_until_ready()).await??;
            let len = store.len() as u64;
            if len != n {
                return Err(format!("kube-runtime synced {len} objects, want {n}").into());
            }
            task.abort();
        }
    }
    vm_hwm_kib().ok_or_else(|| "no VmHWM".into())
}
