//! Sharding (issue #21): each shard's peak RSS against one unsharded informer's, and what a
//! change from 3 to 4 shards fetches. Every informer runs in its own child process (this
//! binary re-executed with `SHARD_CHILD=1`) against the simulated server in the parent, over
//! HTTP, so a process's peak RSS (`VmHWM`) is the informer's alone.
//!
//! `cargo bench --features sim --bench sharding` (plain `main`, `harness = false`): N = 10,000
//! generated ~4 KB Pods; `BENCH_N=100000` for another size, `BENCH_OBJECT_CACHE_BYTES` for
//! another object cache budget per informer (default 512 MiB; `BENCH_HOT_TIER_BYTES`, its name
//! before issue #33, is still read). Runs, for a server that filters
//! (`shardSelector` honoured) and one that does not (the informer filters):
//!
//! 1. one unsharded informer, then shards 0, 1 and 2 of 3 by UID, each a cold sync into a new
//!    database: peak RSS of each, and the largest shard's over the unsharded one's;
//! 2. (filtering server) the three databases restarted as shards 0, 1, 2 of 4, plus shard 3 of
//!    4 on a new database: objects the server sent to each (LIST items and watch events)
//!    against the objects whose owner changed.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use durable_informer::informer::Informer;
use durable_informer::selector::{ShardField, ShardSelector};
use durable_informer::sim::workload::WorkloadGen;
use durable_informer::sim::{Sim, SimConfig};
use durable_informer::source::KubeSource;
use durable_informer::store::{DurableStore, Indexer, StoreConfig};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::ResourceExt;
use serde_json::{json, Value};

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const TIMEOUT: Duration = Duration::from_secs(600);

fn main() -> Res<()> {
    if std::env::var("SHARD_CHILD").is_ok() {
        return child();
    }
    let n: usize = match std::env::var("BENCH_N") {
        Ok(v) => v.trim().parse().map_err(|e| format!("BENCH_N: {v:?}: {e}"))?,
        Err(_) => 10_000,
    };
    if n == 0 {
        return Err("BENCH_N must be at least 1".into());
    }
    if std::env::var_os("BENCH_HOT_TIER_BYTES").is_some() {
        eprintln!("BENCH_HOT_TIER_BYTES is deprecated: set BENCH_OBJECT_CACHE_BYTES");
    }
    let dir = tempfile::tempdir()?;
    println!("## Sharding, N = {n} Pods\n");
    for server_filters in [true, false] {
        let sim = Sim::start(
            SimConfig::default()
                .sharded_list_watch(server_filters)
                .history_max_events(10_000_000)
                .history_max_age(Duration::from_secs(3600)),
        )?;
        let mut gen = WorkloadGen::new(1).namespaces(10);
        sim.bulk_load("namespaces", gen.namespace_objects())?;
        // In chunks (the generated JSON is larger than what the sim keeps), renamed: the
        // generator names every chunk pod-0, pod-1, …
        for chunk in 0..n.div_ceil(1000) {
            let size = (n - chunk * 1000).min(1000);
            let pods = gen.pods(size).into_iter().enumerate().map(|(i, mut p)| {
                p["metadata"]["name"] = json!(format!("pod-{chunk}-{i}"));
                p
            });
            sim.bulk_load("pods", pods)?;
        }
        let mode = if server_filters {
            "server filters (shardSelector honoured)"
        } else {
            "informer filters (server without the feature)"
        };
        println!("### {mode}\n");
        println!("| informer | objects held | peak RSS (MiB) | ratio to unsharded | synced in (s) |");
        println!("|---|---:|---:|---:|---:|");
        let db = |name: &str| dir.path().join(format!("{server_filters}-{name}.redb"));
        let whole = run_child(&sim, &db("whole"), None, true)?;
        row("unsharded", &whole, &whole);
        let mut largest = 0;
        for i in 0..3 {
            let shard = ShardSelector::by_uid(i, 3)?;
            let r = run_child(&sim, &db(&format!("{i}-of-3")), Some(&shard), true)?;
            largest = largest.max(r.vm_hwm_kib);
            row(&format!("shard {i} of 3"), &r, &whole);
        }
        println!(
            "\nlargest shard's peak RSS / unsharded: **{:.2}** (aim ≤ 0.4)\n",
            largest as f64 / whole.vm_hwm_kib as f64
        );
        if server_filters {
            reshard(&sim, &|name: &str| db(name))?;
        }
    }
    Ok(())
}

fn row(name: &str, r: &Report, whole: &Report) {
    println!(
        "| {name} | {} | {:.1} | {:.2} | {:.2} |",
        r.objects,
        r.vm_hwm_kib as f64 / 1024.0,
        r.vm_hwm_kib as f64 / whole.vm_hwm_kib as f64,
        r.secs
    );
}

/// Restarts the three shards of 3 as shards of 4 and starts the fourth; prints what each
/// fetched against what moved.
fn reshard(sim: &Sim, db: &dyn Fn(&str) -> PathBuf) -> Res<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let uids: Vec<String> = rt.block_on(async {
        // Built inside the runtime: the client's service needs its reactor.
        let api: Api<Pod> = Api::all(sim.client()?);
        let list = api.list(&ListParams::default()).await?;
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(list.items.iter().filter_map(ResourceExt::uid).collect())
    })?;
    let owner = |uid: &str, n: u32| -> u32 {
        (0..n)
            .find(|&i| ShardSelector::by_uid(i, n).is_ok_and(|s| s.matches(|f| (f == ShardField::Uid).then_some(uid))))
            .unwrap_or(u32::MAX)
    };
    let moved = uids.iter().filter(|u| owner(u, 3) != owner(u, 4)).count() as u64;
    println!("### Resharding 3 → 4 (server filters)\n");
    println!("| replica | database | objects held | objects fetched | moved into it | restart (s) |");
    println!("|---|---|---:|---:|---:|---:|");
    let mut total = 0;
    for i in 0..4u32 {
        let shard = ShardSelector::by_uid(i, 4)?;
        let moved_in = uids.iter().filter(|u| owner(u, 4) == i && owner(u, 3) != i).count();
        let (path, fresh) = if i < 3 {
            (db(&format!("{i}-of-3")), false)
        } else {
            (db("3-of-4"), true)
        };
        sim.reset_counters();
        let r = run_child(sim, &path, Some(&shard), fresh)?;
        let c = sim.counters();
        let fetched = c.list_objects + c.watch_events;
        total += fetched;
        println!(
            "| {i} of 4 | {} | {} | {fetched} | {moved_in} | {:.2} |",
            if fresh { "new" } else { "shard {i} of 3's" }.replace("{i}", &i.to_string()),
            r.objects,
            r.secs
        );
    }
    println!(
        "\nobjects fetched in all: {total}, objects that changed owner: {moved}: **{:.3}×** the moved range (aim ≤ 1.05)\n",
        total as f64 / moved.max(1) as f64
    );
    Ok(())
}

struct Report {
    vm_hwm_kib: u64,
    objects: u64,
    secs: f64,
}

fn run_child(sim: &Sim, db: &Path, shard: Option<&ShardSelector>, fresh: bool) -> Res<Report> {
    let out = std::process::Command::new(std::env::current_exe()?)
        .env("SHARD_CHILD", "1")
        .env("SHARD_URL", sim.url())
        .env("SHARD_DB", db)
        .env("SHARD_SELECTOR", shard.map(ToString::to_string).unwrap_or_default())
        .env("SHARD_FRESH", if fresh { "1" } else { "0" })
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("CHILD_REPORT="))
        .and_then(|v| serde_json::from_str::<Value>(v).ok())
        .and_then(|v| {
            Some(Report {
                vm_hwm_kib: v["vm_hwm_kib"].as_u64()?,
                objects: v["objects"].as_u64()?,
                secs: v["secs"].as_f64()?,
            })
        })
        .ok_or_else(|| {
            format!(
                "child failed ({}):\n{stdout}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )
            .into()
        })
}

/// Child body: one informer of Pods (with a label index, as `benches/compare`) synced into
/// `SHARD_DB`, then its peak RSS.
fn child() -> Res<()> {
    let var = |k: &str| std::env::var(k).map_err(|e| format!("{k}: {e}"));
    let url = var("SHARD_URL")?;
    let db = PathBuf::from(var("SHARD_DB")?);
    let shard = match var("SHARD_SELECTOR")? {
        s if s.is_empty() => None,
        s => Some(s.parse::<ShardSelector>()?),
    };
    if var("SHARD_FRESH")? == "1" {
        let _ = std::fs::remove_file(&db);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let report = rt.block_on(async move {
        let t = Instant::now();
        let client = kube::Client::try_from(kube::Config::new(url.parse()?))?;
        let mut config = StoreConfig::new(db);
        // As in benches/compare: the object cache's budget (default 512 MiB per informer).
        let budget = ["BENCH_OBJECT_CACHE_BYTES", "BENCH_HOT_TIER_BYTES"]
            .into_iter()
            .find_map(|name| std::env::var(name).ok().map(|v| (name, v)));
        if let Some((name, v)) = budget {
            config = config.object_cache_bytes(v.trim().parse().map_err(|e| format!("{name}={v:?}: {e}"))?);
        }
        let store = tokio::task::spawn_blocking(move || DurableStore::open(config)).await??;
        let mut builder =
            Informer::<Pod>::builder(&store, KubeSource::typed::<Pod>(client, &url)).indexer(Indexer::labels());
        if let Some(s) = shard {
            builder = builder.sharding(s);
        }
        let informer = builder.build().await?;
        informer.start();
        tokio::time::timeout(TIMEOUT, informer.wait_for_sync()).await??;
        let secs = t.elapsed().as_secs_f64();
        let objects = informer.store().snapshot()?.len()?;
        informer.shutdown().await?;
        drop(informer);
        tokio::task::spawn_blocking(move || store.close()).await??;
        let status = std::fs::read_to_string("/proc/self/status")?;
        let vm_hwm_kib: u64 = status
            .lines()
            .find(|l| l.starts_with("VmHWM:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .ok_or("no VmHWM in /proc/self/status")?;
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(
            json!({"vm_hwm_kib": vm_hwm_kib, "objects": objects, "secs": secs}),
        )
    })?;
    println!("CHILD_REPORT={report}");
    std::io::Write::flush(&mut std::io::stdout())?;
    // Exit without dropping the runtime (its shutdown would wait for background tasks).
    std::process::exit(0)
}
