//! One memory budget per process (issue #36): twenty informers of 10,000 ConfigMaps each in
//! one process, on one `DurableStore`, against the simulated API server over real HTTP.
//!
//! `cargo bench --features sim --bench memory` (plain `main`, `harness = false`; a few
//! minutes). `BENCH_INFORMERS` (20) and `BENCH_PER_INFORMER` (10,000) set the sizes,
//! `BENCH_BUDGETS` the `StoreConfig::memory_budget` values to run, in MiB (`max`: no limit;
//! default `0,64,256,max`), `BENCH_REDB_CACHE_MIB` redb's page cache (32).
//!
//! Each run is a child process (this binary re-executed with `MEMORY_CHILD=1`; the simulated
//! server stays in the parent, so it does not count): it syncs every informer, then reads
//! every object through the listers twice (decoding them, filling the caches up to what the
//! budget allows), and reports its peak RSS (`VmHWM`), what the caches charge, and the
//! bytes per object. A first child with no informer gives the process's baseline. The
//! budget holds when the peak RSS stays within `baseline + memory_budget + redb cache`, plus
//! 10%; each line says whether it did.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use durable_informer::informer::Informer;
use durable_informer::store::{DurableStore, StoreConfig};
use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::{json, Value};

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

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
    let config = StoreConfig::new(db).memory_budget(budget).cache_bytes(redb_cache);
    let store = tokio::task::spawn_blocking(move || DurableStore::open(config)).await??;
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
    let (used, limit) = store.memory_usage();
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
        "used": used, "limit": limit, "held": held, "charged": charged,
        "with_json": with_json, "objects": objects, "synced_secs": synced,
        "db_bytes": std::fs::metadata(db)?.len(),
    });
    for inf in &all {
        inf.shutdown().await?;
    }
    Ok(report)
}

fn run_child(url: &str, informers: usize, per: usize, budget: usize, redb_cache: usize, db: &Path) -> Res<Value> {
    let out = std::process::Command::new(std::env::current_exe()?)
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
    let redb_cache = env_usize("BENCH_REDB_CACHE_MIB", 32)? << 20;
    let budgets: Vec<usize> = std::env::var("BENCH_BUDGETS")
        .unwrap_or_else(|_| "0,64,256,max".into())
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
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("memory.redb");
    let url = sim.url();
    let base = run_child(&url, 0, per, usize::MAX, redb_cache, &db)?;
    let base_kib = base["vm_hwm_kib"].as_u64().unwrap_or(0);
    let n = informers * per;
    println!(
        "memory: {informers} informers x {per} ConfigMaps (~{json_bytes} B of JSON each), redb cache {} MiB, baseline peak RSS {} MiB",
        redb_cache >> 20,
        base_kib >> 10
    );
    println!(
        "{:>10} {:>10} {:>10} {:>12} {:>10} {:>11} {:>11} {:>9} {:>8}",
        "budget", "peak MiB", "bound MiB", "charged MiB", "held B/obj", "JSON held", "RSS B/obj", "db B/obj", "within"
    );
    for budget in budgets {
        let r = run_child(&url, informers, per, budget, redb_cache, &db)?;
        let hwm = r["vm_hwm_kib"].as_u64().unwrap_or(0) << 10;
        let used = r["used"].as_u64().unwrap_or(0);
        let held = r["held"].as_u64().unwrap_or(0);
        let with_json = r["with_json"].as_u64().unwrap_or(0);
        let db_bytes = r["db_bytes"].as_u64().unwrap_or(0);
        let base = base_kib << 10;
        let bound = (budget != usize::MAX).then(|| base + budget as u64 + redb_cache as u64);
        let within = bound.map_or("-".to_owned(), |b| {
            if hwm as f64 <= b as f64 * 1.1 {
                "yes".to_owned()
            } else {
                format!("NO ({:.2}x)", hwm as f64 / b as f64)
            }
        });
        println!(
            "{:>10} {:>10} {:>10} {:>12} {:>10} {:>11} {:>11} {:>9} {:>8}",
            if budget == usize::MAX {
                "none".to_owned()
            } else {
                format!("{} MiB", budget >> 20)
            },
            hwm >> 20,
            bound.map_or("-".to_owned(), |b| (b >> 20).to_string()),
            used >> 20,
            held / n as u64,
            format!("{:.0}%", 100.0 * with_json as f64 / n as f64),
            hwm.saturating_sub(base) / n as u64,
            db_bytes / n as u64,
            within
        );
        println!("  raw: {r}");
    }
    Ok(())
}
