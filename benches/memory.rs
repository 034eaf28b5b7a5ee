//! One memory budget per process (issue #36): twenty informers of 10,000 ConfigMaps each in
//! one process, on one `DurableStore`, against the simulated API server over real HTTP.
//!
//! `cargo bench --profile dev --features sim --bench memory` (plain `main`, `harness = false`;
//! a few minutes). `BENCH_INFORMERS` (20) and `BENCH_PER_INFORMER` (10,000) set the sizes,
//! `BENCH_BUDGETS` the `StoreConfig::memory_budget` values to run, in MiB (`max`: no limit;
//! default `256,512,1024,max`), `BENCH_REDB_CACHE_MIB` redb's page cache (default: the
//! store's share of the budget), `BENCH_WRAP` a command the child runs under (`heaptrack -o /tmp/mem`). glibc's own settings
//! (`MALLOC_ARENA_MAX=2`) reach the child through the environment.
//!
//! Each run is a child process (this binary re-executed with `MEMORY_CHILD=1`; the simulated
//! server stays in the parent, so it does not count): it syncs every informer, then reads
//! every object through the listers twice (decoding them, filling the caches up to what the
//! budget allows), and reports its peak RSS (`VmHWM`), its peak heap (a counting allocator:
//! what is allocated and not yet freed, whatever the allocator keeps on top, sampled every
//! 20 ms), the budget's
//! parts at their largest (`DurableStore::memory_stats`, sampled every 20 ms) and the bytes
//! per object, and what its anonymous memory holds beyond the live heap (the allocator's
//! headers and the free memory it keeps) with its live allocations, per object (`over B/o`).
//! A first child with no informer gives the process's baseline. The budget holds
//! when the peak RSS stays within `baseline + memory_budget`, plus 10%; each line says whether
//! it did.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use durable_informer::informer::Informer;
use durable_informer::store::{DurableStore, StoreConfig};
use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::{json, Value};

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

#[path = "common/child.rs"]
mod child;
#[path = "common/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::{live, live_allocations};

/// The peak of [`live`] as sampled.
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn env_usize(name: &str, default: usize) -> Res<usize> {
    match std::env::var(name) {
        Ok(v) => Ok(v.parse().map_err(|e| format!("{name}={v:?}: {e}"))?),
        Err(_) => Ok(default),
    }
}

/// A ConfigMap of about 1.5 KB of JSON with a few labels and an annotation, as a typical
/// controller's objects.
fn config_map(ns: usize, i: usize) -> Value {
    let data: serde_json::Map<String, Value> = (0..8)
        .map(|k| {
            (
                format!("key-{k}"),
                json!(format!("value-{ns}-{i}-{k}-{}", "x".repeat(120))),
            )
        })
        .collect();
    json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": format!("cm-{i:06}"),
            "namespace": format!("ns-{ns:02}"),
            "labels": {"app": format!("app-{}", i % 50), "tier": "backend", "team": format!("team-{}", i % 7)},
            "annotations": {"example.com/owner": format!("owner-{}", i % 13)},
        },
        "data": data,
    })
}

fn vm(field: &str) -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    s.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
}

/// The child: `informers` informers, one per namespace, on one store with `budget` bytes.
async fn child(url: &str, informers: usize, per: usize, budget: usize, redb_cache: usize, db: &Path) -> Res<Value> {
    let uri: http::Uri = url.parse()?;
    let client = kube::Client::try_from(kube::Config::new(uri))?;
    let _ = std::fs::remove_file(db);
    let mut config = StoreConfig::new(db).memory_budget(budget);
    if redb_cache != usize::MAX {
        config = config.cache_bytes(redb_cache);
    }
    let store = std::sync::Arc::new(tokio::task::spawn_blocking(move || DurableStore::open(config)).await??);
    // Each part of the budget at its largest, and the parts when the total was.
    let sampled = std::sync::Arc::new(std::sync::Mutex::new((store.memory_stats(), [0usize; 4], 0usize)));
    let sampler = {
        let (sampled, store) = (sampled.clone(), store.clone());
        tokio::spawn(async move {
            loop {
                let s = store.memory_stats();
                if let Ok(mut m) = sampled.lock() {
                    let heap = live();
                    PEAK.fetch_max(heap, Ordering::Relaxed);
                    if s.used() > m.0.used() {
                        m.0 = s;
                    }
                    for (max, v) in m.1.iter_mut().zip([s.held, s.objects, s.stream, s.syncing]) {
                        *max = (*max).max(v);
                    }
                    m.2 = m.2.max(heap);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let t = Instant::now();
    let mut all = Vec::new();
    for ns in 0..informers {
        let api = kube::Api::<ConfigMap>::namespaced(client.clone(), &format!("ns-{ns:02}"));
        let inf = Informer::from_api(&store, api).build().await?;
        inf.start();
        all.push(inf);
    }
    for inf in &all {
        tokio::time::timeout(Duration::from_secs(600), inf.wait_for_sync()).await??;
    }
    let synced = t.elapsed().as_secs_f64();
    // The process right after the sync, before the reads decode and fill.
    let after_sync = json!({
        "vm_rss_kib": vm("VmRSS:"), "rss_anon_kib": vm("RssAnon:"), "heap": live(),
        "allocations": live_allocations(),
    });
    // Reads decode and fill what the budget allows, twice (the second finds what stayed).
    let mut read = 0usize;
    for _ in 0..2 {
        for inf in &all {
            let lister = inf.lister();
            read += tokio::task::spawn_blocking(move || lister.list(&Default::default()))
                .await??
                .len();
        }
    }
    if read != 2 * informers * per {
        return Err(format!("read {read} objects, want {}", 2 * informers * per).into());
    }
    // Let the caches' tasks answer any pressure before measuring.
    tokio::time::sleep(Duration::from_millis(500)).await;
    sampler.abort();
    let (at_peak, maxima, _) = *sampled.lock().map_err(|_| "sampler panicked")?;
    let (used, limit) = store.memory_usage();
    let stats = store.memory_stats();
    let (mut held, mut charged, mut with_json, mut objects) = (0, 0, 0, 0);
    for inf in &all {
        let s = inf.cache_stats();
        held += s.held_bytes;
        charged += s.charged_bytes;
        with_json += s.with_json;
        objects += s.objects;
    }
    let report = json!({
        "vm_hwm_kib": vm("VmHWM:").ok_or("no VmHWM")?,
        "vm_rss_kib": vm("VmRSS:").ok_or("no VmRSS")?,
        // What the RSS is made of: anonymous memory (the heap, C libraries' malloc, thread
        // stacks) and mapped files (the binary).
        "rss_anon_kib": vm("RssAnon:"), "rss_file_kib": vm("RssFile:"), "threads": vm("Threads:"),
        "used": used, "limit": limit, "held": held, "charged": charged,
        "with_json": with_json, "objects": objects, "synced_secs": synced,
        "db_bytes": std::fs::metadata(db)?.len(),
        "heap_peak": PEAK.load(Ordering::Relaxed), "heap_end": live(),
        "allocations_end": live_allocations(), "after_sync": after_sync,
        "redb_cache": stats.redb_cache, "budget_peak": stats.peak, "exceeded": stats.exceeded,
        "at_peak": {"held": at_peak.held, "objects": at_peak.objects, "stream": at_peak.stream, "syncing": at_peak.syncing},
        "max": {"held": maxima[0], "objects": maxima[1], "stream": maxima[2], "syncing": maxima[3]},
    });
    for inf in &all {
        inf.shutdown().await?;
    }
    Ok(report)
}

fn run_child(url: &str, informers: usize, per: usize, budget: usize, redb_cache: usize, db: &Path) -> Res<Value> {
    let out = child::child_command(&std::env::current_exe()?)
        .env("MEMORY_CHILD", "1")
        .env("MEMORY_URL", url)
        .env("MEMORY_INFORMERS", informers.to_string())
        .env("MEMORY_PER", per.to_string())
        .env("MEMORY_BUDGET", budget.to_string())
        .env("MEMORY_REDB", redb_cache.to_string())
        .env("MEMORY_DB", db)
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("CHILD_REPORT="))
        .and_then(|v| serde_json::from_str(v).ok())
        .ok_or_else(|| {
            format!(
                "child failed: {}\n{stdout}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )
            .into()
        })
}

/// What a decoded object costs the heap, and in how many allocations (each costs the allocator
/// a header and rounding on top): every one of `pages` decoded and kept, as a cache keeps them.
fn decoded_cost<K: serde::de::DeserializeOwned>(pages: &[Vec<u8>]) -> Res<(usize, f64)> {
    let (heap0, allocs0) = (live(), live_allocations());
    let decoded: Vec<std::sync::Arc<K>> = pages
        .iter()
        .map(|p| serde_json::from_slice(p).map(std::sync::Arc::new))
        .collect::<Result<_, _>>()?;
    let cost = (
        // The simulated server's threads may free meanwhile: never below zero.
        live().saturating_sub(heap0 + decoded.capacity() * 8) / decoded.len(),
        live_allocations().saturating_sub(allocs0 + 1) as f64 / decoded.len() as f64,
    );
    drop(decoded);
    Ok(cost)
}

fn main() -> Res<()> {
    if std::env::var("MEMORY_CHILD").is_ok() {
        let var = |k: &str| std::env::var(k).map_err(|e| format!("{k}: {e}"));
        let r = runtime()?.block_on(child(
            &var("MEMORY_URL")?,
            var("MEMORY_INFORMERS")?.parse()?,
            var("MEMORY_PER")?.parse()?,
            var("MEMORY_BUDGET")?.parse()?,
            var("MEMORY_REDB")?.parse()?,
            &PathBuf::from(var("MEMORY_DB")?),
        ))?;
        println!("CHILD_REPORT={r}");
        std::io::Write::flush(&mut std::io::stdout())?;
        std::process::exit(0);
    }
    let informers = env_usize("BENCH_INFORMERS", 20)?;
    let per = env_usize("BENCH_PER_INFORMER", 10_000)?;
    let redb_cache = child::redb_cache_bytes()?.unwrap_or(usize::MAX);
    let budgets: Vec<usize> = std::env::var("BENCH_BUDGETS")
        .unwrap_or_else(|_| "256,512,1024,max".into())
        .split(',')
        .map(|b| match b.trim() {
            "max" => Ok(usize::MAX),
            mib => mib.parse::<usize>().map(|m| m << 20),
        })
        .collect::<Result<_, _>>()?;
    let sim = durable_informer::sim::Sim::start(
        durable_informer::sim::SimConfig::default().history_max_events(informers * per + 1000),
    )?;
    for ns in 0..informers {
        sim.bulk_load("configmaps", (0..per).map(|i| config_map(ns, i)))?;
    }
    let json_bytes = serde_json::to_vec(&config_map(0, 0))?.len();
    let pages: Vec<Vec<u8>> = (0..1000)
        .map(|i| serde_json::to_vec(&config_map(0, i)))
        .collect::<Result<_, _>>()?;
    let (decoded_bytes, decoded_allocs) = decoded_cost::<ConfigMap>(&pages)?;
    // Decoded sizes differ by type far more than JSON sizes do: the caches measure their own
    // (docs/deploying.md); these are the counting allocator's figures.
    let pods: Vec<Vec<u8>> = durable_informer::sim::workload::WorkloadGen::new(3)
        .pods(1000)
        .iter()
        .map(serde_json::to_vec)
        .collect::<Result<_, _>>()?;
    let (pod_bytes, pod_allocs) = decoded_cost::<k8s_openapi::api::core::v1::Pod>(&pods)?;
    let pod_json = pods.iter().map(Vec::len).sum::<usize>() / pods.len();
    println!(
        "a decoded Pod: {pod_bytes} B in {pod_allocs:.1} allocations for {pod_json} B of JSON ({:.1} times)",
        pod_bytes as f64 / pod_json as f64
    );
    drop((pages, pods));
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("memory.redb");
    let url = sim.url();
    let base = run_child(&url, 0, per, usize::MAX, redb_cache, &db)?;
    let base_kib = base["vm_hwm_kib"].as_u64().unwrap_or(0);
    let n = informers * per;
    let base_heap = base["heap_end"].as_u64().unwrap_or(0);
    println!(
        "memory: {informers} informers x {per} ConfigMaps (~{json_bytes} B of JSON each; decoded {decoded_bytes} B in {decoded_allocs:.1} allocations), redb cache {}, baseline peak RSS {} MiB, heap {} MiB",
        if redb_cache == usize::MAX { "the store's share".to_owned() } else { format!("{} MiB", redb_cache >> 20) },
        base_kib >> 10,
        base_heap >> 20
    );
    println!(
        "{:>9} {:>8} {:>8} {:>9} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8} {:>7} {:>9} {:>10} {:>8}",
        "budget",
        "peak RSS",
        "bound",
        "peak heap",
        "end heap",
        "charged",
        "peak",
        "held",
        "stream",
        "syncing",
        "JSON",
        "held B/o",
        "over B/o",
        "within"
    );
    for budget in budgets {
        let r = run_child(&url, informers, per, budget, redb_cache, &db)?;
        let mib = |v: &Value| v.as_u64().unwrap_or(0) >> 20;
        let hwm = r["vm_hwm_kib"].as_u64().unwrap_or(0) << 10;
        let with_json = r["with_json"].as_u64().unwrap_or(0);
        let base = base_kib << 10;
        let bound = (budget != usize::MAX).then(|| base + budget as u64);
        let within = bound.map_or("-".to_owned(), |b| {
            if hwm as f64 <= b as f64 * 1.1 {
                "yes".to_owned()
            } else {
                format!("NO {:.2}x", hwm as f64 / b as f64)
            }
        });
        // The heap the informers hold at the end, per object, less the baseline's and what
        // the budget says is object JSON: the always-held part as measured.
        let end_heap = r["heap_end"].as_u64().unwrap_or(0);
        let measured_held = end_heap
            .saturating_sub(base_heap)
            .saturating_sub(r["charged"].as_u64().unwrap_or(0));
        // What the process keeps beyond the live heap (the allocator's headers and the free
        // memory it keeps), per object, and the live allocations per object.
        let over = (r["rss_anon_kib"].as_u64().unwrap_or(0) << 10).saturating_sub(end_heap);
        let allocations = r["allocations_end"].as_u64().unwrap_or(0) as f64 / n as f64;
        println!(
            "{:>9} {:>8} {:>8} {:>9} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8} {:>7} {:>9} {:>10} {:>8}",
            if budget == usize::MAX {
                "none".to_owned()
            } else {
                format!("{} MiB", budget >> 20)
            },
            hwm >> 20,
            bound.map_or("-".to_owned(), |b| (b >> 20).to_string()),
            mib(&r["heap_peak"]),
            end_heap >> 20,
            mib(&r["used"]),
            mib(&r["budget_peak"]),
            mib(&r["max"]["held"]),
            mib(&r["max"]["stream"]),
            mib(&r["max"]["syncing"]),
            format!("{:.0}%", 100.0 * with_json as f64 / n as f64),
            format!(
                "{}/{}",
                r["held"].as_u64().unwrap_or(0) / n as u64,
                measured_held / n as u64
            ),
            format!("{}/{allocations:.0}a", over / n as u64),
            within
        );
        println!("  raw: {r}");
    }
    Ok(())
}
