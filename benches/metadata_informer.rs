//! Metadata-only informers against full-object ones (issue #35's aim: at N = 100,000 Pods the
//! metadata-only informer's peak RSS is at most half the full-object informer's, and it
//! restarts without a LIST), on the simulated server over HTTP.
//!
//! ```text
//! cargo bench --features sim --bench metadata_informer            # N = 100,000, about 2 minutes
//! BENCH_N=20000 cargo bench --features sim --bench metadata_informer
//! BENCH_KUBE=1 …    # adds kube-runtime's watcher of Pods and of PartialObjectMeta<Pod>
//! BENCH_REDB_CACHE_MIB=32 …   # redb's page cache for ours (default: the store's share of the budget)
//! BENCH_WRAP='heaptrack -o /tmp/m' …  # each child under a command
//! ```
//!
//! The sim (in this process) serves N generated ~4 KB Pods (`WorkloadGen`, as `benches/compare`).
//! Each system runs in a child process (this binary re-executed with `MI_CHILD=…`), so neither
//! the sim nor another system counts in its peak RSS (`VmHWM`):
//!
//! * **cold**: an empty database, `Informer::from_api` (full objects) or
//!   `Informer::metadata_from_api`, default `StoreConfig`; peak RSS when synced; then a
//!   [`Reader`](durable_informer::informer::Reader) is taken and every object read through
//!   `state()` (kube's `Store`: every object in memory, decoded), and the peak RSS again;
//! * **restart**: the same database reopened, synced again; the parent counts the LIST
//!   requests the sim answered during the child and the objects they carried (the aim: no
//!   LIST of the objects; a resume's two probes are a revision-only LIST and a `limit=1` one)
//!   and the child's peak RSS.
//!
//! A first child with no informer gives the baseline (the runtime, the client, the binary).

#[path = "common/child.rs"]
mod child;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use durable_informer::informer::Informer;
use durable_informer::sim::workload::WorkloadGen;
use durable_informer::sim::{Sim, SimConfig};
use durable_informer::source::ClusterIdentity;
use durable_informer::store::{DurableStore, StoreConfig};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::core::PartialObjectMeta;
use kube::runtime::{reflector, watcher, WatchStreamExt};
use kube::Api;
use serde_json::{json, Value};

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const TIMEOUT: Duration = Duration::from_secs(900);
/// Pods generated per `bulk_load` call.
const LOAD_CHUNK: usize = 10_000;

fn vm_kib(field: &str) -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    s.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

fn hwm() -> Res<u64> {
    vm_kib("VmHWM:").ok_or_else(|| "no VmHWM in /proc/self/status".into())
}

/// Syncs one of our informers (`metadata`: metadata-only) from the database at `db`
/// (`restart == false` starts from an empty one), reads every object through a reader on a
/// cold start, and reports.
async fn ours<K>(informer: Informer<K>, n: usize, restart: bool, db: &Path) -> Res<Value>
where
    K: kube::Resource<DynamicType = ()> + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    let t = Instant::now();
    informer.start();
    tokio::time::timeout(TIMEOUT, informer.wait_for_sync()).await??;
    let synced_secs = t.elapsed().as_secs_f64();
    // The informer's cache loads in the background: what it holds counts too.
    let deadline = Instant::now() + TIMEOUT;
    while !(informer.cache_stats().loaded && informer.cache_stats().objects == n) {
        if Instant::now() > deadline {
            return Err(format!("the cache holds {:?}, want {n} objects", informer.cache_stats()).into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let hwm_synced = hwm()?;
    let mut hwm_read = None;
    if !restart {
        // kube's `Store`: every object in memory, decoded once.
        let reader = informer.reader();
        tokio::time::timeout(TIMEOUT, reader.wait_until_ready()).await??;
        let all = reader.state();
        if all.len() != n {
            return Err(format!("the reader has {} objects, want {n}", all.len()).into());
        }
        drop(all);
        hwm_read = Some(hwm()?);
    }
    let stats = informer.cache_stats();
    informer.shutdown().await?;
    Ok(json!({
        "synced_secs": synced_secs, "hwm_synced_kib": hwm_synced, "hwm_read_kib": hwm_read,
        "held_bytes": stats.held_bytes, "charged_bytes": stats.charged_bytes, "with_json": stats.with_json,
        "db_bytes": std::fs::metadata(db)?.len(),
    }))
}

/// kube-runtime's watcher of Pods (`full`) or of `PartialObjectMeta<Pod>` (kube 5's form of
/// `metadata_watcher`) into a reflector store, until ready.
async fn theirs(client: kube::Client, full: bool, n: usize) -> Res<Value> {
    let t = Instant::now();
    let (len, task) = if full {
        let (store, writer) = reflector::store::<Pod>();
        let api: Api<Pod> = Api::all(client);
        let s = reflector::reflector(writer, watcher(api, watcher::Config::default())).applied_objects();
        let task = tokio::spawn(s.for_each(|_| async {}));
        tokio::time::timeout(TIMEOUT, store.wait_until_ready()).await??;
        (store.len(), task)
    } else {
        let (store, writer) = reflector::store::<PartialObjectMeta<Pod>>();
        let api: Api<PartialObjectMeta<Pod>> = Api::all(client);
        let s = reflector::reflector(writer, watcher(api, watcher::Config::default())).applied_objects();
        let task = tokio::spawn(s.for_each(|_| async {}));
        tokio::time::timeout(TIMEOUT, store.wait_until_ready()).await??;
        (store.len(), task)
    };
    let synced_secs = t.elapsed().as_secs_f64();
    task.abort();
    if len != n {
        return Err(format!("kube-runtime synced {len} objects, want {n}").into());
    }
    Ok(json!({"synced_secs": synced_secs, "hwm_synced_kib": hwm()?}))
}

async fn child(system: &str, url: &str, n: usize, db: &Path, restart: bool) -> Res<Value> {
    let client = kube::Client::try_from(kube::Config::new(url.parse()?))?;
    let open = |db: PathBuf| async move {
        if !restart {
            let _ = std::fs::remove_file(&db);
        }
        let mut config = StoreConfig::new(db);
        if let Some(bytes) = child::redb_cache_bytes()? {
            config = config.cache_bytes(bytes);
        }
        let store = tokio::task::spawn_blocking(move || DurableStore::open(config)).await??;
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(store)
    };
    let id = ClusterIdentity::named("sim");
    match system {
        "baseline" => Ok(json!({"hwm_synced_kib": hwm()?})),
        "full" => {
            let store = open(db.to_path_buf()).await?;
            let informer = Informer::from_api(&store, Api::<Pod>::all(client))
                .cluster_identity(id)
                .build()
                .await?;
            ours(informer, n, restart, db).await
        }
        "metadata" => {
            let store = open(db.to_path_buf()).await?;
            let informer = Informer::metadata_from_api(&store, Api::<Pod>::all(client))
                .cluster_identity(id)
                .build()
                .await?;
            ours(informer, n, restart, db).await
        }
        "kube-full" => theirs(client, true, n).await,
        "kube-metadata" => theirs(client, false, n).await,
        other => Err(format!("unknown system {other:?}").into()),
    }
}

fn run_child(system: &str, url: &str, n: usize, db: &Path, restart: bool) -> Res<Value> {
    let out = child::child_command(&std::env::current_exe()?)
        .env("MI_CHILD", system)
        .env("MI_URL", url)
        .env("MI_N", n.to_string())
        .env("MI_DB", db)
        .env("MI_RESTART", if restart { "1" } else { "0" })
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("CHILD_REPORT="))
        .and_then(|v| serde_json::from_str(v).ok())
        .ok_or_else(|| {
            format!(
                "child {system} failed: {}\n{stdout}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )
            .into()
        })
}

fn mib(kib: &Value) -> String {
    kib.as_u64()
        .map_or_else(|| "-".to_owned(), |k| format!("{:.0}", k as f64 / 1024.0))
}

fn ratio(a: &Value, b: &Value) -> String {
    match (a.as_u64(), b.as_u64()) {
        (Some(a), Some(b)) if b > 0 => format!("{:.2}", a as f64 / b as f64),
        _ => "-".to_owned(),
    }
}

fn main() -> Res<()> {
    if let Ok(system) = std::env::var("MI_CHILD") {
        let var = |k: &str| std::env::var(k).map_err(|e| format!("{k}: {e}"));
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        let r = runtime.block_on(child(
            &system,
            &var("MI_URL")?,
            var("MI_N")?.parse()?,
            &PathBuf::from(var("MI_DB")?),
            var("MI_RESTART")? == "1",
        ))?;
        println!("CHILD_REPORT={r}");
        std::io::Write::flush(&mut std::io::stdout())?;
        // The runtime's tasks (a watch in flight) need not wind down.
        std::process::exit(0);
    }
    // `cargo bench` passes `--bench`; the sizes come from the environment.
    let n: usize = std::env::var("BENCH_N").map_or(Ok(100_000), |v| v.parse())?;
    let kube_too = std::env::var("BENCH_KUBE").is_ok_and(|v| v == "1");
    let t = Instant::now();
    let sim = Sim::start(SimConfig::default().history_max_events(n + 10_000))?;
    let mut gen = WorkloadGen::new(42).namespaces((n / 1000).max(10));
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
    let pod_bytes = serde_json::to_vec(&gen.pod("ns-0", "pod-x"))?.len();
    eprintln!("loaded {n} Pods in {:.1} s", t.elapsed().as_secs_f64());
    let dir = tempfile::tempdir()?;
    let url = sim.url();
    let base = run_child("baseline", &url, n, &dir.path().join("base.redb"), false)?;
    let mut systems = vec!["full", "metadata"];
    if kube_too {
        systems.extend(["kube-full", "kube-metadata"]);
    }
    let mut rows = Vec::new();
    for system in systems {
        let db = dir.path().join(format!("{system}.redb"));
        let before = sim.counters();
        let cold = run_child(system, &url, n, &db, false)?;
        let cold_lists = sim.counters().list_requests - before.list_requests;
        let restart = if system.starts_with("kube") {
            Value::Null
        } else {
            let before = sim.counters();
            let mut r = run_child(system, &url, n, &db, true)?;
            let after = sim.counters();
            r["list_requests"] = json!(after.list_requests - before.list_requests);
            r["list_objects"] = json!(after.list_objects - before.list_objects);
            r
        };
        rows.push((system, cold, cold_lists, restart));
    }
    let uptime = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "metadata_informer: N = {n} Pods (~{pod_bytes} B of JSON each as generated), baseline peak RSS {} MiB, load {}",
        mib(&base["hwm_synced_kib"]),
        uptime.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
    );
    println!(
        "{:<14} {:>9} {:>11} {:>14} {:>10} {:>9} {:>13} {:>12} {:>24}",
        "informer",
        "sync s",
        "peak MiB",
        "peak+read MiB",
        "held B/obj",
        "LISTs",
        "restart MiB",
        "restart s",
        "restart LISTs (objects)"
    );
    let full = rows[0].1.clone();
    for (system, cold, cold_lists, restart) in &rows {
        println!(
            "{:<14} {:>9.2} {:>11} {:>14} {:>10} {:>9} {:>13} {:>12} {:>24}",
            system,
            cold["synced_secs"].as_f64().unwrap_or(f64::NAN),
            mib(&cold["hwm_synced_kib"]),
            mib(&cold["hwm_read_kib"]),
            cold["held_bytes"]
                .as_u64()
                .map_or("-".to_owned(), |b| (b / n as u64).to_string()),
            cold_lists,
            mib(&restart["hwm_synced_kib"]),
            restart["synced_secs"]
                .as_f64()
                .map_or("-".to_owned(), |s| format!("{s:.2}")),
            restart["list_requests"]
                .as_u64()
                .map_or("-".to_owned(), |l| format!("{l} ({})", restart["list_objects"])),
        );
    }
    let meta = &rows[1].1;
    println!(
        "metadata / full peak RSS: synced {} (aim <= 0.5), after reading every object {}, restart {}",
        ratio(&meta["hwm_synced_kib"], &full["hwm_synced_kib"]),
        ratio(&meta["hwm_read_kib"], &full["hwm_read_kib"]),
        ratio(&rows[1].3["hwm_synced_kib"], &rows[0].3["hwm_synced_kib"]),
    );
    for (system, cold, _, restart) in &rows {
        println!("  raw {system}: cold {cold} restart {restart}");
    }
    Ok(())
}
