//! durable-informer against kube-runtime's reflector, client-go's SharedIndexInformer and
//! controller-runtime's cache, on the same simulated API server, over real HTTP, in one run
//! (issues #9 and #34).
//!
//! `cargo bench --features sim --bench compare` (plain `main`, `harness = false`). Sizes: N = 10,000
//! generated ~4 KB Pods; `BENCH_LARGE=1` adds 100,000; `BENCH_N=1000,10000,…` replaces the list;
//! `-- --quick` or `BENCH_QUICK=1` runs N = 200 and 1,000 with a short ladder as a smoke run.
//! `BENCH_REPS` repetitions (3 by default, 1 in quick mode); in each repetition every scenario
//! runs for ours, then for each peer in turn, so the systems alternate through the run.
//!
//! Peers (`BENCH_PEERS`, a list; default `kube-runtime,client-go,controller-runtime`):
//! kube-runtime runs in this process; the Go peers are one binary built from `benches/peers/`
//! by `scripts/build-peers` (cached outside the checkout; `BENCH_PEER_BIN` names a binary to
//! use instead), each run as a child process driven over a line protocol on stdin/stdout
//! (`peers.rs`, docs/bench/peers.md). `client-go-protobuf` is refused on the simulated server,
//! which answers lists and watches in JSON only.
//!
//! Scenarios (numbered as in issue #9):
//!
//! 1. cold initial sync of N objects: time to synced, and what the sim served;
//! 2. restart to synced: ours reopens the database and resumes (one `limit=1` LIST probe),
//!    the peers relist from scratch; peak RSS of a restart in a child process;
//! 3. steady churn: a ladder of producer rates (label patches), the highest rate whose lag
//!    does not grow, and write → handler latency p50/p99 at every rate (1k and 10k/s always);
//! 4. relist after compaction with 1% of the objects changed while down: time and the events
//!    delivered to handlers;
//! 5. peak RSS (`VmHWM`) of each system synced with N objects, each in its own child process
//!    (this binary re-executed with `COMPARE_CHILD=ours|theirs`, or a Go peer), the sim staying
//!    in the parent; `BENCH_HUGE=1` adds ours alone at 1,000,000 objects (`BENCH_HUGE_N`);
//! 6. reads: get by key, list one namespace, select by label; over every object, then over a
//!    hot set (the first 1,000 objects and one namespace, read twice before they are timed).
//!
//! `BENCH_MEMORY_ONLY=1` runs only the child processes (scenarios 5 and 2's peak RSS);
//! `BENCH_ONLY=reads,steady` runs only the named parts (`lifecycle` for 1, 2 and 4, `steady`,
//! `reads`, `memory`), for working on one of them. `BENCH_OBJECT_CACHE_BYTES` sets ours'
//! object cache budget per informer (0: no object JSON held), `BENCH_REDB_CACHE_MIB` its redb
//! page cache and `BENCH_FSYNC_DELAY_MS` its `fsync_delay` (`off`: none), in every scenario.
//! For looking into memory: `BENCH_MEMORY_STATS=1` makes ours' memory child print
//! `DurableStore::memory_stats` once synced, and `BENCH_WRAP` names a command the Rust memory
//! children run under (a wrapper script writing `heaptrack -o …-$COMPARE_RESTART`, so that the
//! restart's child does not overwrite the cold sync's profile).
//!
//! Large clusters (issue #34): `BENCH_SCALE=10000,100000,1000000` (with `BENCH_N=none` to run
//! it alone) runs one system at a time per N, each in child processes: cold sync (time, rate,
//! peak RSS, ours' database bytes per object), restart, relist with 1% changed, and the
//! ingest rate of a burst of updates through each system's reflector to its handler. A system
//! whose peak RSS, extrapolated from a smaller N of the same run, would not fit in the memory
//! available is reported as not run, with the estimate. `BENCH_SCALE_COLD_ONLY_FROM=N` runs
//! only the peers' cold sync from that N on (their restart and relist are each a full list
//! again, as the smaller N show).
//!
//! Prints a table per N (median and min–max over the repetitions, ratios of the medians ours /
//! each peer) and writes, into a directory of its own per run (`BENCH_OUT`, default
//! `target/bench-results/compare-<unix time>/`), `compare.json` (every repetition's raw values,
//! the machine and the command) and SVG charts of what this run measured only (a chart or
//! panel whose figures were not measured is not drawn). `target/bench-results/compare.json` is
//! a copy of the latest run's JSON.

#[path = "compare/charts.rs"]
mod charts;
#[path = "common/child.rs"]
mod child;
#[path = "compare/peers.rs"]
mod peers;
#[path = "compare/scenarios.rs"]
mod scenarios;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use peers::GoKind;
use scenarios::{ChildReport, Ladder, Lifecycle, Reads, Res, Steady};
use serde_json::{json, Value};

/// Fixed rates whose latency the issue asks for (always run by the ladder).
const LATENCY_RATES: [u64; 2] = [1_000, 10_000];

/// One system under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sys {
    Ours,
    KubeRuntime,
    Go(GoKind),
}

impl Sys {
    fn label(self) -> &'static str {
        match self {
            Sys::Ours => "durable-informer",
            Sys::KubeRuntime => "kube-runtime",
            Sys::Go(k) => k.label,
        }
    }

    /// Its name in `BENCH_PEERS` and in the child-process protocol.
    fn key(self) -> &'static str {
        match self {
            Sys::Ours => "ours",
            Sys::KubeRuntime => "kube-runtime",
            Sys::Go(k) if k == peers::CLIENT_GO_PROTOBUF => "client-go-protobuf",
            Sys::Go(k) => k.system,
        }
    }
}

const PEER_NAMES: [&str; 4] = ["kube-runtime", "client-go", "client-go-protobuf", "controller-runtime"];

fn parse_peers() -> Res<Vec<Sys>> {
    let list = std::env::var("BENCH_PEERS").unwrap_or_else(|_| "kube-runtime,client-go,controller-runtime".into());
    let mut out = vec![Sys::Ours];
    for name in list.split(',').map(str::trim).filter(|p| !p.is_empty() && *p != "none") {
        let sys = match name {
            "kube-runtime" => Sys::KubeRuntime,
            "client-go" => Sys::Go(peers::CLIENT_GO),
            "controller-runtime" => Sys::Go(peers::CONTROLLER_RUNTIME),
            "client-go-protobuf" => {
                return Err(
                    "BENCH_PEERS: client-go-protobuf: the simulated server answers lists and watches in \
                            JSON only (src/sim/mod.rs, \"What is not emulated\"), so a protobuf column would \
                            measure JSON; it is measured against a real kube-apiserver only"
                        .into(),
                )
            }
            other => {
                return Err(format!("BENCH_PEERS: unknown peer {other:?} (one of {})", PEER_NAMES.join(", ")).into())
            }
        };
        if !out.contains(&sys) {
            out.push(sys);
        }
    }
    Ok(out)
}

struct Cfg {
    quick: bool,
    reps: usize,
    sizes: Vec<usize>,
    huge: Option<usize>,
    /// The large-cluster table's sizes (`BENCH_SCALE`).
    scale: Vec<usize>,
    /// From this N on, the peers run only the cold sync of the large-cluster table
    /// (`BENCH_SCALE_COLD_ONLY_FROM`): their restart and relist are each a full list again.
    scale_cold_only_from: Option<usize>,
    memory_only: bool,
    /// The parts to run (`BENCH_ONLY`); every part when empty.
    only: Vec<String>,
    ladder: Ladder,
    gets: usize,
    lists: usize,
    /// Ours first, then the peers.
    systems: Vec<Sys>,
    /// The Go peers' binary, when a Go peer runs.
    peer_bin: Option<PathBuf>,
}

fn env_flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| v == "1")
}

fn env_usize(name: &str) -> Res<Option<usize>> {
    match std::env::var(name) {
        Ok(v) => Ok(Some(
            v.trim()
                .replace('_', "")
                .parse()
                .map_err(|e| format!("{name}={v:?}: {e}"))?,
        )),
        Err(_) => Ok(None),
    }
}

/// A comma-separated list of sizes; empty or `none` for none.
fn env_sizes(name: &str) -> Res<Option<Vec<usize>>> {
    let Ok(list) = std::env::var(name) else {
        return Ok(None);
    };
    if list.trim().is_empty() || list.trim() == "none" {
        return Ok(Some(Vec::new()));
    }
    let sizes: Vec<usize> = list
        .split(',')
        .map(|s| {
            s.trim()
                .replace('_', "")
                .parse::<usize>()
                .map_err(|e| format!("{name}: {s:?}: {e}"))
        })
        .collect::<Result<_, _>>()?;
    if sizes.contains(&0) {
        return Err(format!("{name}: sizes must be at least 1").into());
    }
    Ok(Some(sizes))
}

fn config() -> Res<Cfg> {
    let quick = std::env::args().any(|a| a == "--quick") || env_flag("BENCH_QUICK");
    let reps = env_usize("BENCH_REPS")?.unwrap_or(if quick { 1 } else { 3 }).max(1);
    let mut sizes = if quick { vec![200, 1_000] } else { vec![10_000] };
    if env_flag("BENCH_LARGE") && !quick {
        sizes.push(100_000);
    }
    if let Some(list) = env_sizes("BENCH_N")? {
        sizes = list;
    }
    let scale = env_sizes("BENCH_SCALE")?.unwrap_or_default();
    let huge = match env_usize("BENCH_HUGE_N")? {
        Some(n) if n > 0 => Some(n),
        Some(_) => return Err("BENCH_HUGE_N must be at least 1".into()),
        None => env_flag("BENCH_HUGE").then_some(1_000_000),
    };
    let ladder = if quick {
        Ladder {
            rates: LATENCY_RATES.to_vec(),
            step: Duration::from_millis(500),
            always_up_to: 10_000,
            drain_timeout: Duration::from_secs(30),
            sample_every: Duration::from_millis(50),
        }
    } else {
        Ladder {
            rates: vec![1_000, 2_000, 5_000, 10_000, 20_000, 50_000],
            step: Duration::from_secs(4),
            always_up_to: 10_000,
            drain_timeout: Duration::from_secs(60),
            sample_every: Duration::from_millis(50),
        }
    };
    let systems = parse_peers()?;
    let peer_bin = if systems.iter().any(|s| matches!(s, Sys::Go(_))) && (!sizes.is_empty() || !scale.is_empty()) {
        eprintln!("building the Go peers (scripts/build-peers; BENCH_PEERS=kube-runtime to run without them)...");
        Some(peers::build()?)
    } else {
        None
    };
    Ok(Cfg {
        quick,
        reps,
        sizes,
        huge,
        scale,
        scale_cold_only_from: env_usize("BENCH_SCALE_COLD_ONLY_FROM")?,
        memory_only: env_flag("BENCH_MEMORY_ONLY"),
        only: parse_only()?,
        ladder,
        gets: if quick { 500 } else { 200_000 },
        lists: if quick { 5 } else { 20 },
        systems,
        peer_bin,
    })
}

const PARTS: [&str; 4] = ["lifecycle", "steady", "reads", "memory"];

fn parse_only() -> Res<Vec<String>> {
    let Ok(list) = std::env::var("BENCH_ONLY") else {
        return Ok(Vec::new());
    };
    let parts: Vec<String> = list
        .split(',')
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
        .collect();
    if let Some(bad) = parts.iter().find(|p| !PARTS.contains(&p.as_str())) {
        return Err(format!("BENCH_ONLY: unknown part {bad:?} (one of {})", PARTS.join(", ")).into());
    }
    Ok(parts)
}

impl Cfg {
    fn runs(&self, part: &str) -> bool {
        if self.memory_only {
            return part == "memory";
        }
        self.only.is_empty() || self.only.iter().any(|p| p == part)
    }

    fn bin(&self) -> Res<&Path> {
        self.peer_bin
            .as_deref()
            .ok_or_else(|| "the Go peers are not built".into())
    }
}

fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
}

// ---------------------------------------------------------------------------------------------
// child processes

/// Runs one Rust system in a child process (cold sync, or ours' restart from `db`).
fn child_run(system: &str, url: &str, n: usize, db: &Path, restart: bool) -> Res<ChildReport> {
    let out = child::child_command(&std::env::current_exe()?)
        .env("COMPARE_CHILD", system)
        .env("COMPARE_URL", url)
        .env("COMPARE_N", n.to_string())
        .env("COMPARE_DB", db)
        .env("COMPARE_RESTART", if restart { "1" } else { "0" })
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.success() && !stderr.trim().is_empty() {
        eprintln!(
            "memory child {system} (restart: {restart}) stderr:\n{}",
            stderr.trim_end()
        );
    }
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("CHILD_REPORT="))
        .and_then(|v| serde_json::from_str::<Value>(v).ok())
        .and_then(|v| {
            Some(ChildReport {
                vm_hwm_kib: v["vm_hwm_kib"].as_u64()?,
                secs: v["secs"].as_f64()?,
            })
        })
        .ok_or_else(|| {
            format!(
                "memory child {system} (restart: {restart}) failed: {}\n{stdout}\n{stderr}",
                out.status
            )
            .into()
        })
}

fn child(system: &str) -> Res<()> {
    let var = |k: &str| std::env::var(k).map_err(|e| format!("{k}: {e}"));
    let url = var("COMPARE_URL")?;
    let n: u64 = var("COMPARE_N")?.parse()?;
    let db = PathBuf::from(var("COMPARE_DB")?);
    let restart = var("COMPARE_RESTART")? == "1";
    let r = runtime()?.block_on(scenarios::memory_child(system, &url, n, &db, restart))?;
    println!("CHILD_REPORT={}", serde_json::to_string(&r)?);
    std::io::Write::flush(&mut std::io::stdout())?;
    // Exit without dropping the runtime: its shutdown would wait for the aborted watcher.
    std::process::exit(0)
}

/// Peak RSS of a cold sync and of a restart. Ours restarts from the database its cold child
/// left; the peers have nothing to resume from, so their restart is another full list.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
struct Memory {
    cold: ChildReport,
    restart: ChildReport,
}

/// One child-process sync of `sys` (ours from `db`).
fn sync_child(cfg: &Cfg, sys: Sys, url: &str, n: usize, db: &Path, restart: bool) -> Res<ChildReport> {
    match sys {
        Sys::Ours => child_run("ours", url, n, db, restart),
        Sys::KubeRuntime => child_run("theirs", url, n, db, restart),
        Sys::Go(k) => peers::memory_child(cfg.bin()?, k, url, n),
    }
}

fn memory(cfg: &Cfg, sys: Sys, url: &str, n: usize, dir: &Path) -> Res<Memory> {
    let db = dir.join(format!("memory-{}.redb", sys.key()));
    let cold = sync_child(cfg, sys, url, n, &db, false)?;
    let restart = sync_child(cfg, sys, url, n, &db, true)?;
    let _ = std::fs::remove_file(&db);
    Ok(Memory { cold, restart })
}

// ---------------------------------------------------------------------------------------------
// one repetition

#[derive(Debug, Clone, Default, serde::Serialize)]
struct SystemRep {
    system: &'static str,
    lifecycle: Option<Lifecycle>,
    steady: Option<Steady>,
    reads: Option<Reads>,
    memory: Option<Memory>,
}

#[derive(Debug, Clone, Default, serde::Serialize)]
struct Rep {
    rep: usize,
    /// Updates/s of the producer alone, measured before the ladders (NaN when not run).
    producer_ceiling: f64,
    /// One per system, in the order of `Cfg::systems`.
    systems: Vec<SystemRep>,
}

fn run_rep(cfg: &Cfg, sim: &durable_informer::sim::Sim, n: usize, rep: usize, dir: &Path) -> Res<Rep> {
    let rt = runtime()?;
    let mut out = Rep {
        rep,
        producer_ceiling: f64::NAN,
        systems: cfg
            .systems
            .iter()
            .map(|s| SystemRep {
                system: s.label(),
                ..SystemRep::default()
            })
            .collect(),
    };
    let tag = format!("N = {n}, repetition {}/{}", rep + 1, cfg.reps);
    let seed = rep as u64;
    if cfg.runs("lifecycle") {
        for (i, &sys) in cfg.systems.iter().enumerate() {
            eprintln!("{tag}: 1, 2, 4 lifecycle, {}...", sys.label());
            out.systems[i].lifecycle = Some(match sys {
                Sys::Ours => rt.block_on(scenarios::ours_lifecycle(sim, n, dir, seed))?,
                Sys::KubeRuntime => rt.block_on(scenarios::theirs_lifecycle(sim, n, seed))?,
                Sys::Go(k) => rt.block_on(peers::lifecycle(cfg.bin()?, k, sim, n, seed))?,
            });
        }
    }
    if cfg.runs("steady") {
        eprintln!("{tag}: 3 producer alone...");
        out.producer_ceiling = scenarios::producer_ceiling(sim, n, cfg.ladder.step.min(Duration::from_secs(2)))?;
        for (i, &sys) in cfg.systems.iter().enumerate() {
            eprintln!("{tag}: 3 steady churn ladder, {}...", sys.label());
            out.systems[i].steady = Some(match sys {
                Sys::Ours => rt.block_on(scenarios::ours_steady(sim, n, &cfg.ladder, dir))?,
                Sys::KubeRuntime => rt.block_on(scenarios::theirs_steady(sim, n, &cfg.ladder))?,
                Sys::Go(k) => rt.block_on(peers::steady(cfg.bin()?, k, sim, n, &cfg.ladder))?,
            });
        }
    }
    if cfg.runs("reads") {
        for (i, &sys) in cfg.systems.iter().enumerate() {
            eprintln!("{tag}: 6 reads, {}...", sys.label());
            out.systems[i].reads = Some(match sys {
                Sys::Ours => rt.block_on(scenarios::ours_reads(sim, n, cfg.gets, cfg.lists, dir))?,
                Sys::KubeRuntime => rt.block_on(scenarios::theirs_reads(sim, n, cfg.gets, cfg.lists))?,
                Sys::Go(k) => rt.block_on(peers::reads(cfg.bin()?, k, sim, n, cfg.gets, cfg.lists))?,
            });
        }
    }
    if cfg.runs("memory") {
        for (i, &sys) in cfg.systems.iter().enumerate() {
            eprintln!("{tag}: 5 and 2 peak RSS (child processes), {}...", sys.label());
            out.systems[i].memory = Some(memory(cfg, sys, &sim.url(), n, dir)?);
        }
    }
    Ok(out)
}
// ---------------------------------------------------------------------------------------------
// metrics and statistics

/// One figure of one system in one repetition.
struct Metric {
    scenario: &'static str,
    name: String,
    higher_is_better: bool,
    value: f64,
    /// The true value is at least this (the ladder did not find the consumer's limit).
    lower_bound: bool,
}

fn metrics(s: &SystemRep) -> Vec<Metric> {
    let mut v = Vec::new();
    let mut m = |scenario, name: &str, value: f64| {
        v.push(Metric {
            scenario,
            name: name.to_string(),
            higher_is_better: name.contains("/s)"),
            value,
            lower_bound: false,
        })
    };
    let mb = |b: u64| b as f64 / 1e6;
    let mib = |kib: u64| kib as f64 / 1024.0;
    if let Some(l) = &s.lifecycle {
        m("1 cold sync", "time to synced (s)", l.cold.secs);
        m(
            "1 cold sync",
            "throughput (objects/s)",
            l.cold.objects as f64 / l.cold.secs,
        );
        m("1 cold sync", "objects served", l.cold.served.objects() as f64);
        m("1 cold sync", "MB served", mb(l.cold.served.bytes));
    }
    if let Some(l) = &s.lifecycle {
        m("2 restart", "time to synced (s)", l.restart.secs);
        m("2 restart", "LIST requests", l.restart.served.list_requests as f64);
        m(
            "2 restart",
            "objects listed (LIST + initial events)",
            l.restart.served.objects() as f64,
        );
        m("2 restart", "MB served", mb(l.restart.served.bytes));
        m(
            "2b restart, other resources churning",
            "time to synced (s)",
            l.restart_busy.secs,
        );
        m(
            "2b restart, other resources churning",
            "objects listed (LIST + initial events)",
            l.restart_busy.served.objects() as f64,
        );
    }
    if let Some(mem) = &s.memory {
        m(
            "2 restart",
            "peak RSS, child process (MiB)",
            mib(mem.restart.vm_hwm_kib),
        );
    }
    if let Some(st) = &s.steady {
        m("3 steady churn", "highest sustained rate (events/s)", st.max_sustained);
        for rate in LATENCY_RATES {
            let step = st.at(rate);
            let f = |g: fn(&scenarios::RateStep) -> f64| step.map_or(f64::NAN, g);
            m(
                "3 steady churn",
                &format!("latency p50 at {rate}/s (ms)"),
                f(|s| s.p50_ms),
            );
            m(
                "3 steady churn",
                &format!("latency p99 at {rate}/s (ms)"),
                f(|s| s.p99_ms),
            );
            m(
                "3 steady churn",
                &format!("producer achieved at {rate}/s (events/s)"),
                f(|s| s.achieved),
            );
        }
    }
    if let Some(st) = &s.steady {
        if let Some(x) = v.iter_mut().find(|x| x.name == "highest sustained rate (events/s)") {
            x.lower_bound = st.ended_by != "consumer";
        }
    }
    let mut m = |scenario, name: &str, value: f64| {
        v.push(Metric {
            scenario,
            name: name.to_string(),
            higher_is_better: name.contains("/s)"),
            value,
            lower_bound: false,
        })
    };
    if let Some(l) = &s.lifecycle {
        m("4 relist 1%", "objects changed while down", l.changed as f64);
        m("4 relist 1%", "time to synced + delivered (s)", l.relist.secs);
        m("4 relist 1%", "handler events", l.relist.events as f64);
        m("4 relist 1%", "MB served", mb(l.relist.served.bytes));
    }
    if let Some(mem) = &s.memory {
        m("5 memory", "peak RSS after cold sync (MiB)", mib(mem.cold.vm_hwm_kib));
    }
    if let Some(r) = &s.reads {
        m("6 reads", "get by key (µs)", r.get_us);
        m("6 reads", "list one namespace (µs)", r.list_ns_us);
        m("6 reads", "objects in the namespace", r.list_ns_len as f64);
        m("6 reads", "select app=web (µs)", r.by_label_us);
        m("6 reads", "objects selected", r.by_label_len as f64);
        if let Some(c) = &r.cold {
            m("6 reads", "no JSON cached: get by key (µs)", c.get_us);
            m("6 reads", "no JSON cached: list one namespace (µs)", c.list_ns_us);
            m("6 reads", "no JSON cached: select app=web (µs)", c.by_label_us);
            m("6 reads", "decode one Pod's JSON alone (µs)", c.decode_us);
        }
        if let Some(mib) = r.object_cache_mib {
            m("6 reads", "object cache held, as charged (MiB)", mib);
        }
        m("6 reads, hot set", "get by key, 1,000 objects (µs)", r.hot.get_us);
        m("6 reads, hot set", "list the first namespace (µs)", r.hot.list_ns_us);
        m("6 reads, hot set", "objects in it", r.hot.list_ns_len as f64);
        m("6 reads, hot set", "select app=web in it (µs)", r.hot.select_us);
        m("6 reads, hot set", "objects selected in it", r.hot.select_len as f64);
    }
    v
}

/// Median, minimum and maximum of the finite values (NaN when there are none).
#[derive(Debug, Clone, Copy, serde::Serialize)]
struct Stats {
    median: f64,
    min: f64,
    max: f64,
}

fn stats(values: &[f64]) -> Stats {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return Stats {
            median: f64::NAN,
            min: f64::NAN,
            max: f64::NAN,
        };
    }
    v.sort_by(f64::total_cmp);
    let k = v.len();
    let median = if k % 2 == 1 {
        v[k / 2]
    } else {
        (v[k / 2 - 1] + v[k / 2]) / 2.0
    };
    Stats {
        median,
        min: v[0],
        max: v[k - 1],
    }
}

fn ratio(a: f64, b: f64) -> f64 {
    if b == 0.0 {
        f64::NAN
    } else {
        a / b
    }
}

/// One row of the table: a metric over all repetitions, for every system.
struct Row {
    scenario: &'static str,
    name: String,
    higher_is_better: bool,
    /// Per system (the order of `Cfg::systems`): the value of each repetition that had it.
    values: Vec<Vec<f64>>,
    lower_bound: Vec<Vec<bool>>,
}

impl Row {
    fn json(&self, systems: &[Sys]) -> Value {
        let mut per = serde_json::Map::new();
        let mut ratios = serde_json::Map::new();
        let ours = stats(&self.values[0]).median;
        for (i, sys) in systems.iter().enumerate() {
            let s = stats(&self.values[i]);
            per.insert(
                sys.label().into(),
                json!({"median": s.median, "min": s.min, "max": s.max, "values": self.values[i],
                       "lower_bound": self.lower_bound[i]}),
            );
            if i > 0 {
                ratios.insert(format!("ours / {}", sys.label()), json!(ratio(ours, s.median)));
            }
        }
        json!({
            "scenario": self.scenario,
            "metric": self.name,
            "higher_is_better": self.higher_is_better,
            "systems": per,
            "ratios_of_medians": ratios,
        })
    }
}

fn rows(reps: &[Rep], k: usize) -> Vec<Row> {
    let mut rows: Vec<Row> = Vec::new();
    let mut index: BTreeMap<(String, String), usize> = BTreeMap::new();
    for rep in reps {
        for (i, sys) in rep.systems.iter().enumerate() {
            for m in metrics(sys) {
                let key = (m.scenario.to_string(), m.name.clone());
                let r = *index.entry(key).or_insert_with(|| {
                    rows.push(Row {
                        scenario: m.scenario,
                        name: m.name.clone(),
                        higher_is_better: m.higher_is_better,
                        values: vec![Vec::new(); k],
                        lower_bound: vec![Vec::new(); k],
                    });
                    rows.len() - 1
                });
                rows[r].values[i].push(m.value);
                rows[r].lower_bound[i].push(m.lower_bound);
            }
        }
    }
    rows
}

fn print_table(title: &str, systems: &[Sys], rows: &[Row]) {
    println!("\n### {title}\n");
    let names: Vec<&str> = systems.iter().map(|s| s.label()).collect();
    let ratio_heads: Vec<String> = names[1..].iter().map(|p| format!("ours / {p}")).collect();
    println!(
        "| scenario | metric | {} | {} |",
        names.join(" | "),
        ratio_heads.join(" | ")
    );
    println!(
        "|---|---|{}{}",
        "---:|".repeat(names.len()),
        "---:|".repeat(ratio_heads.len())
    );
    for r in rows {
        let ours = stats(&r.values[0]).median;
        let cells: Vec<String> = (0..names.len())
            .map(|i| {
                if r.values[i].is_empty() {
                    String::new()
                } else {
                    cell(&r.values[i], &r.lower_bound[i])
                }
            })
            .collect();
        let ratios: Vec<String> = (1..names.len())
            .map(|i| {
                if r.values[i].is_empty() || r.values[0].is_empty() {
                    String::new()
                } else {
                    fmt(ratio(ours, stats(&r.values[i]).median))
                }
            })
            .collect();
        println!(
            "| {} | {} | {} | {} |",
            r.scenario,
            r.name,
            cells.join(" | "),
            ratios.join(" | ")
        );
    }
}

/// The producer's own ceiling and where each system's ladder ended, under the table.
fn print_ladder_notes(systems: &[Sys], reps: &[Rep]) {
    let ceiling: Vec<f64> = reps.iter().map(|r| r.producer_ceiling).collect();
    if ceiling.iter().any(|c| c.is_finite()) {
        println!(
            "\nproducer alone (no consumer attached): {} updates/s; \"≥\": the ladder ended because the \
             producer fell short of its target (or at the top rate), so the consumer's limit is higher",
            cell(&ceiling, &[])
        );
    }
    for (i, sys) in systems.iter().enumerate() {
        let notes: Vec<String> = reps
            .iter()
            .filter_map(|r| {
                let st = r.systems.get(i)?.steady.as_ref()?;
                let last = st.steps.last()?;
                Some(format!(
                    "rep {}: ended by {} at {}/s (achieved {:.0}/s, lag slope {:.0}/s, end lag {})",
                    r.rep + 1,
                    st.ended_by,
                    last.target,
                    last.achieved,
                    last.lag_slope,
                    last.lag_end
                ))
            })
            .collect();
        if !notes.is_empty() {
            println!("\n{} ladder: {}", sys.label(), notes.join("; "));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// charts

/// The results of one N, kept for the charts.
struct SizeResult {
    n: usize,
    reps: Vec<Rep>,
    rows: Vec<Row>,
}

fn point_of(x: f64, values: &[f64]) -> charts::Point {
    let s = stats(values);
    charts::Point {
        x,
        med: s.median,
        min: s.min,
        max: s.max,
    }
}

/// One line per system: a metric against N (points only where it was measured).
fn per_system(systems: &[Sys], sizes: &[SizeResult], scenario: &str, metric: &str) -> Vec<charts::Series> {
    systems
        .iter()
        .enumerate()
        .map(|(i, sys)| charts::Series {
            label: sys.label().into(),
            points: sizes
                .iter()
                .filter_map(|s| {
                    let r = s.rows.iter().find(|r| r.scenario == scenario && r.name == metric)?;
                    let v = r.values.get(i)?;
                    (!v.is_empty()).then(|| point_of(s.n as f64, v))
                })
                .collect(),
            color: i,
            secondary: false,
        })
        .collect()
}

/// p50 or p99 against the ladder's target rate, over the repetitions, for system `i`.
fn latency_series(reps: &[Rep], i: usize, p99: bool) -> Vec<charts::Point> {
    let mut by_rate: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
    for r in reps {
        let st = r.systems.get(i).and_then(|s| s.steady.as_ref());
        for step in st.iter().flat_map(|s| &s.steps) {
            by_rate
                .entry(step.target)
                .or_default()
                .push(if p99 { step.p99_ms } else { step.p50_ms });
        }
    }
    by_rate.iter().map(|(rate, v)| point_of(*rate as f64, v)).collect()
}

/// A panel, or nothing when none of its lines has a point to draw.
fn panel(title: String, x_desc: &str, y_desc: &str, series: Vec<charts::Series>) -> Option<charts::Panel> {
    let p = charts::Panel {
        title,
        x_desc: x_desc.into(),
        y_desc: y_desc.into(),
        series,
    };
    p.has_data().then_some(p)
}

/// Writes `name` with the panels that have data; none: no file.
fn chart(out: &Path, name: &str, panels: Vec<Option<charts::Panel>>, written: &mut Vec<PathBuf>) -> Res<()> {
    let panels: Vec<charts::Panel> = panels.into_iter().flatten().collect();
    if panels.is_empty() {
        return Ok(());
    }
    let path = out.join(name);
    charts::write(&path, &panels)?;
    written.push(path);
    Ok(())
}

const MED: &str = "(median, min–max)";

fn write_charts(
    out: &Path,
    systems: &[Sys],
    sizes: &[SizeResult],
    huge: Option<&HugeResult>,
    scale: &[ScaleResult],
) -> Res<Vec<PathBuf>> {
    let mut written = Vec::new();
    let n_axis = "N objects";
    chart(
        out,
        "throughput.svg",
        vec![
            panel(
                "1 cold sync".into(),
                n_axis,
                &format!("objects/s {MED}"),
                per_system(systems, sizes, "1 cold sync", "throughput (objects/s)"),
            ),
            panel(
                "3 highest sustained update rate".into(),
                n_axis,
                &format!("events/s {MED}"),
                per_system(systems, sizes, "3 steady churn", "highest sustained rate (events/s)"),
            ),
        ],
        &mut written,
    )?;
    chart(
        out,
        "restart.svg",
        vec![
            panel(
                "2 restart → synced".into(),
                n_axis,
                &format!("s {MED}"),
                per_system(systems, sizes, "2 restart", "time to synced (s)"),
            ),
            panel(
                "4 relist, 1% changed while down".into(),
                n_axis,
                &format!("s {MED}"),
                per_system(systems, sizes, "4 relist 1%", "time to synced + delivered (s)"),
            ),
        ],
        &mut written,
    )?;
    let latency: Vec<Option<charts::Panel>> = sizes
        .iter()
        .map(|s| {
            let series = systems
                .iter()
                .enumerate()
                .flat_map(|(i, sys)| {
                    [false, true].map(|p99| charts::Series {
                        label: format!("{} {}", sys.label(), if p99 { "p99" } else { "p50" }),
                        points: latency_series(&s.reps, i, p99),
                        color: i,
                        secondary: p99,
                    })
                })
                .collect();
            panel(
                format!("3 write → handler latency, N = {}", s.n),
                "producer rate (updates/s)",
                &format!("ms {MED}"),
                series,
            )
        })
        .collect();
    chart(out, "latency.svg", latency, &mut written)?;
    let reads: Vec<Option<charts::Panel>> = [
        ("6 reads", "get by key", "get by key (µs)"),
        ("6 reads", "list one namespace", "list one namespace (µs)"),
        ("6 reads", "select app=web", "select app=web (µs)"),
        ("6 reads, hot set", "get by key", "get by key, 1,000 objects (µs)"),
        (
            "6 reads, hot set",
            "list its namespace",
            "list the first namespace (µs)",
        ),
        ("6 reads, hot set", "select app=web in it", "select app=web in it (µs)"),
    ]
    .iter()
    .map(|(scenario, title, metric)| {
        panel(
            format!("{scenario}: {title}"),
            n_axis,
            &format!("µs per call {MED}"),
            per_system(systems, sizes, scenario, metric),
        )
    })
    .collect();
    chart(out, "reads.svg", reads, &mut written)?;
    let mut cold = per_system(systems, sizes, "5 memory", "peak RSS after cold sync (MiB)");
    let mut restart = per_system(systems, sizes, "2 restart", "peak RSS, child process (MiB)");
    if let Some(h) = huge {
        let mib = |f: fn(&Memory) -> &ChildReport| {
            h.reps
                .iter()
                .map(|m| f(m).vm_hwm_kib as f64 / 1024.0)
                .collect::<Vec<_>>()
        };
        cold[0].points.push(point_of(h.n as f64, &mib(|m| &m.cold)));
        restart[0].points.push(point_of(h.n as f64, &mib(|m| &m.restart)));
    }
    chart(
        out,
        "memory.svg",
        vec![
            panel(
                "5 peak RSS after a cold sync".into(),
                n_axis,
                &format!("MiB {MED}"),
                cold,
            ),
            panel("2 peak RSS of a restart".into(), n_axis, &format!("MiB {MED}"), restart),
        ],
        &mut written,
    )?;
    if !scale.is_empty() {
        let line = |f: &dyn Fn(&ScaleFigures) -> Option<f64>| -> Vec<charts::Series> {
            systems
                .iter()
                .enumerate()
                .map(|(i, sys)| charts::Series {
                    label: sys.label().into(),
                    points: scale
                        .iter()
                        .filter_map(|s| {
                            let v = f(s.systems.get(i)?.figures.as_ref()?)?;
                            Some(point_of(s.n as f64, &[v]))
                        })
                        .collect(),
                    color: i,
                    secondary: false,
                })
                .collect()
        };
        chart(
            out,
            "scale.svg",
            vec![
                panel(
                    "cold sync".into(),
                    n_axis,
                    "objects/s",
                    line(&|f| Some(f.cold.objects_per_sec)),
                ),
                panel(
                    "peak RSS after cold sync".into(),
                    n_axis,
                    "MiB",
                    line(&|f| Some(f.cold.peak_mib)),
                ),
                panel(
                    "restart → synced".into(),
                    n_axis,
                    "s",
                    line(&|f| f.restart.map(|r| r.secs)),
                ),
                panel(
                    "ingest: a burst through the reflector".into(),
                    n_axis,
                    "events/s",
                    line(&|f| f.ingest.as_ref().map(|i| i.events_per_sec)),
                ),
            ],
            &mut written,
        )?;
    }
    Ok(written)
}

// ---------------------------------------------------------------------------------------------
// ours alone at 1,000,000 objects

struct HugeResult {
    n: usize,
    load_secs: f64,
    /// Peak RSS of the parent (mostly the sim), KiB.
    parent_vm_hwm_kib: Option<u64>,
    reps: Vec<Memory>,
}

fn run_huge(cfg: &Cfg, n: usize, reps: usize) -> Res<HugeResult> {
    eprintln!("ours alone, N = {n}: generating and loading the sim (slow)...");
    let t = Instant::now();
    let sim = scenarios::start_sim(n)?;
    let load_secs = t.elapsed().as_secs_f64();
    let dir = tempfile::tempdir()?;
    let mut out = Vec::new();
    for rep in 0..reps {
        eprintln!(
            "ours alone, N = {n}, repetition {}/{reps}: cold sync and restart in child processes...",
            rep + 1
        );
        out.push(memory(cfg, Sys::Ours, &sim.url(), n, dir.path())?);
    }
    let cell_of = |f: fn(&Memory) -> f64| cell(&out.iter().map(f).collect::<Vec<_>>(), &[]);
    println!("\n### durable-informer alone, N = {n} (BENCH_HUGE)\n");
    println!("| scenario | metric | durable-informer |");
    println!("|---|---|---:|");
    println!(
        "| 5 memory | peak RSS after cold sync (MiB) | {} |",
        cell_of(|m| m.cold.vm_hwm_kib as f64 / 1024.0)
    );
    println!(
        "| 1 cold sync | time to synced in the child (s) | {} |",
        cell_of(|m| m.cold.secs)
    );
    println!(
        "| 2 restart | peak RSS, child process (MiB) | {} |",
        cell_of(|m| m.restart.vm_hwm_kib as f64 / 1024.0)
    );
    println!(
        "| 2 restart | time to synced in the child (s) | {} |",
        cell_of(|m| m.restart.secs)
    );
    let parent_vm_hwm_kib = scenarios::vm_hwm_kib();
    if let Some(kib) = parent_vm_hwm_kib {
        println!(
            "\nsim generated and loaded in {load_secs:.1} s; this (parent) process peaked at {:.0} MiB",
            kib as f64 / 1024.0
        );
    }
    Ok(HugeResult {
        n,
        load_secs,
        parent_vm_hwm_kib,
        reps: out,
    })
}

fn fmt(x: f64) -> String {
    if !x.is_finite() {
        "n/a".to_string()
    } else if x.abs() >= 100.0 || x == x.trunc() {
        format!("{x:.0}")
    } else if x.abs() >= 1.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.3}")
    }
}

/// "median (min–max)", or the value alone; "≥ " first when every repetition is a lower bound.
fn cell(values: &[f64], lower_bound: &[bool]) -> String {
    let s = stats(values);
    let ge = if !lower_bound.is_empty() && lower_bound.iter().all(|b| *b) {
        "≥ "
    } else {
        ""
    };
    if values.len() > 1 && s.min.is_finite() && s.min != s.max {
        format!("{ge}{} ({}–{})", fmt(s.median), fmt(s.min), fmt(s.max))
    } else {
        format!("{ge}{}", fmt(s.median))
    }
}

// ---------------------------------------------------------------------------------------------
// large clusters (BENCH_SCALE): one system at a time, in child processes

/// Updates of the ingest burst: this many, or N if smaller… at most once per object.
const BURST: usize = 50_000;

/// A sync in a child process.
#[derive(Debug, Clone, Copy, serde::Serialize)]
struct SyncFig {
    secs: f64,
    objects_per_sec: f64,
    peak_mib: f64,
}

impl SyncFig {
    fn of(r: ChildReport, n: usize) -> Self {
        Self {
            secs: r.secs,
            objects_per_sec: n as f64 / r.secs,
            peak_mib: r.vm_hwm_kib as f64 / 1024.0,
        }
    }
}

/// A burst of updates written as fast as one thread can while the system watches.
#[derive(Debug, Clone, Copy, serde::Serialize)]
struct IngestFig {
    events: usize,
    /// From the first write until the handler had the last.
    secs: f64,
    events_per_sec: f64,
    /// The producer's own rate during the burst.
    producer_per_sec: f64,
}

#[derive(Debug, Clone, serde::Serialize)]
struct ScaleFigures {
    cold: SyncFig,
    /// `None`: not run (`BENCH_SCALE_COLD_ONLY_FROM`).
    restart: Option<SyncFig>,
    /// After 1% changed while down and the history compacted.
    relist: Option<SyncFig>,
    changed: u64,
    /// Ours: the database file after the cold sync, per object.
    disk_bytes_per_object: Option<f64>,
    ingest: Option<IngestFig>,
}

#[derive(Debug, Clone, serde::Serialize)]
struct ScaleSystem {
    system: &'static str,
    figures: Option<ScaleFigures>,
    /// Why there are no figures (not run, or failed).
    not_run: Option<String>,
}

#[derive(Debug, Clone, serde::Serialize)]
struct ScaleResult {
    n: usize,
    sim_load_secs: f64,
    systems: Vec<ScaleSystem>,
}

fn mem_available_mib() -> Option<f64> {
    std::fs::read_to_string("/proc/meminfo")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<f64>().ok())
        .map(|kib| kib / 1024.0)
}

/// `k` updates (cycling over the first `min(k, n)` Pods) written by one thread as fast as it
/// can; done when the probe has the last one.
async fn burst(sim: &durable_informer::sim::Sim, n: usize, k: usize, probe: &scenarios::Probe) -> Res<IngestFig> {
    let ns = scenarios::namespaces(n);
    let m = k.min(n);
    let pre = tokio::task::block_in_place(|| {
        (0..m)
            .map(|i| sim.prebuild("pods", Some(&ns[i % ns.len()]), &format!("pod-{i}"), "latency"))
            .collect::<Result<Vec<_>, _>>()
    })?;
    let t = Instant::now();
    let last = tokio::task::block_in_place(|| -> Res<u64> {
        let mut last = 0;
        for i in 0..k {
            last = last.max(sim.write_prebuilt(&pre[i % m], &format!("b{i}"))?);
        }
        Ok(last)
    })?;
    let written = t.elapsed().as_secs_f64();
    while probe.max_rv.load(std::sync::atomic::Ordering::Relaxed) < last {
        if t.elapsed() > Duration::from_secs(1_800) {
            return Err("the burst was not delivered within 30 min".into());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let secs = t.elapsed().as_secs_f64();
    Ok(IngestFig {
        events: k,
        secs,
        events_per_sec: k as f64 / secs,
        producer_per_sec: k as f64 / written,
    })
}

/// The ingest burst with `sys` attached, synced and caught up (ours from `db`).
fn ingest(cfg: &Cfg, sys: Sys, sim: &durable_informer::sim::Sim, n: usize, db: &Path) -> Res<IngestFig> {
    let k = BURST.min(n);
    let rt = runtime()?;
    let fig = match sys {
        Sys::Ours => rt.block_on(async {
            let ours = scenarios::ours_start(sim, db).await?;
            ours.caught_up(sim).await?;
            let f = burst(sim, n, k, &ours.probe).await;
            ours.stop().await?;
            f
        })?,
        Sys::KubeRuntime => rt.block_on(async {
            let mut theirs = scenarios::theirs_start(sim)?;
            theirs.synced().await?;
            let f = burst(sim, n, k, &theirs.probe).await;
            theirs.stop();
            f
        })?,
        Sys::Go(kind) => {
            let mut peer = peers::GoPeer::spawn(cfg.bin()?, kind, &sim.url())?;
            peer.start()?;
            peer.synced()?;
            peer.report(true)?;
            let f = rt.block_on(burst(sim, n, k, &peer.probe));
            peer.quit()?;
            f?
        }
    };
    sim.compact();
    Ok(fig)
}

fn scale_system(
    cfg: &Cfg,
    sys: Sys,
    sim: &durable_informer::sim::Sim,
    n: usize,
    dir: &Path,
    seed: u64,
) -> Res<ScaleFigures> {
    let url = sim.url();
    let db = dir.join(format!("scale-{}.redb", sys.key()));
    let _ = std::fs::remove_file(&db);
    eprintln!("N = {n}, {}: cold sync (child)...", sys.label());
    let cold = sync_child(cfg, sys, &url, n, &db, false)?;
    let disk_bytes_per_object = (sys == Sys::Ours)
        .then(|| std::fs::metadata(&db).map(|m| m.len() as f64 / n as f64))
        .transpose()?;
    if sys != Sys::Ours && cfg.scale_cold_only_from.is_some_and(|from| n >= from) {
        eprintln!("N = {n}, {}: cold sync only (BENCH_SCALE_COLD_ONLY_FROM)", sys.label());
        return Ok(ScaleFigures {
            cold: SyncFig::of(cold, n),
            restart: None,
            relist: None,
            changed: 0,
            disk_bytes_per_object,
            ingest: None,
        });
    }
    eprintln!("N = {n}, {}: restart (child)...", sys.label());
    let restart = sync_child(cfg, sys, &url, n, &db, true)?;
    eprintln!("N = {n}, {}: ingest burst of {} updates...", sys.label(), BURST.min(n));
    let ingest = ingest(cfg, sys, sim, n, &db)?;
    eprintln!("N = {n}, {}: relist with 1% changed (child)...", sys.label());
    let changed = scenarios::change_one_percent(sim, n, seed)?;
    sim.compact();
    let relist = sync_child(cfg, sys, &url, n, &db, true)?;
    let _ = std::fs::remove_file(&db);
    Ok(ScaleFigures {
        cold: SyncFig::of(cold, n),
        restart: Some(SyncFig::of(restart, n)),
        relist: Some(SyncFig::of(relist, n)),
        changed,
        disk_bytes_per_object,
        ingest: Some(ingest),
    })
}

fn run_scale(cfg: &Cfg, n: usize, earlier: &[ScaleResult]) -> Res<ScaleResult> {
    eprintln!("large clusters, N = {n}: generating and loading the sim...");
    let t = Instant::now();
    let sim = scenarios::start_sim(n)?;
    let sim_load_secs = t.elapsed().as_secs_f64();
    let dir = tempfile::tempdir()?;
    // Ours last: its ingest burst runs in this process, and the allocator keeps what that
    // frees (at 1,000,000 Pods this process went from 6.5 to 9.3 GB), room a peer's child
    // needs. Results keep the order of `cfg.systems`.
    let mut order: Vec<usize> = (0..cfg.systems.len()).collect();
    order.sort_by_key(|&i| cfg.systems[i] == Sys::Ours);
    let mut slots: Vec<Option<ScaleSystem>> = cfg.systems.iter().map(|_| None).collect();
    for i in order {
        let sys = cfg.systems[i];
        let slot = &mut slots[i];
        // The largest N this system finished earlier in the run, to extrapolate its memory.
        let prior = earlier
            .iter()
            .filter_map(|r| Some((r.n, r.systems.get(i)?.figures.as_ref()?.cold.peak_mib)))
            .max_by_key(|(n0, _)| *n0);
        let available = mem_available_mib();
        let not_run = match (prior, available) {
            (Some((n0, peak)), Some(avail)) if peak * n as f64 / n0 as f64 > 0.9 * avail => Some(format!(
                "not run: needs ≈ {:.0} MiB ({} MiB at N = {n0}, scaled to N), {avail:.0} MiB available with the sim loaded",
                peak * n as f64 / n0 as f64,
                peak.round()
            )),
            _ => None,
        };
        if let Some(why) = not_run {
            eprintln!("N = {n}, {}: {why}", sys.label());
            *slot = Some(ScaleSystem {
                system: sys.label(),
                figures: None,
                not_run: Some(why),
            });
            continue;
        }
        match scale_system(cfg, sys, &sim, n, dir.path(), 11 + i as u64) {
            Ok(f) => {
                *slot = Some(ScaleSystem {
                    system: sys.label(),
                    figures: Some(f),
                    not_run: None,
                })
            }
            Err(e) => {
                eprintln!("N = {n}, {}: did not finish: {e}", sys.label());
                *slot = Some(ScaleSystem {
                    system: sys.label(),
                    figures: None,
                    not_run: Some(format!("did not finish: {e}")),
                });
            }
        }
    }
    Ok(ScaleResult {
        n,
        sim_load_secs,
        systems: slots.into_iter().flatten().collect(),
    })
}

/// A ratio of two optional figures, blank when either was not measured.
fn both(a: Option<SyncFig>, b: Option<SyncFig>, f: impl Fn(SyncFig, SyncFig) -> f64) -> String {
    match (a, b) {
        (Some(a), Some(b)) => fmt(f(a, b)),
        _ => String::new(),
    }
}

fn print_scale(results: &[ScaleResult]) {
    println!("\n### Large clusters: one system at a time, child processes, one run\n");
    println!(
        "| N | system | cold sync (s) | cold sync (objects/s) | peak RSS after cold sync (MiB) | restart → synced (s) | \
         peak RSS of a restart (MiB) | disk (bytes/object) | relist, 1% changed (s) | ingest burst (events/s) |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in results {
        for s in &r.systems {
            match (&s.figures, &s.not_run) {
                (Some(f), _) => println!(
                    "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                    r.n,
                    s.system,
                    fmt(f.cold.secs),
                    fmt(f.cold.objects_per_sec),
                    fmt(f.cold.peak_mib),
                    f.restart.map_or("–".into(), |r| fmt(r.secs)),
                    f.restart.map_or("–".into(), |r| fmt(r.peak_mib)),
                    f.disk_bytes_per_object.map_or("–".into(), fmt),
                    f.relist.map_or("–".into(), |r| fmt(r.secs)),
                    f.ingest.map_or("–".into(), |i| format!(
                        "{} (producer {})",
                        fmt(i.events_per_sec),
                        fmt(i.producer_per_sec)
                    )),
                ),
                (None, why) => println!(
                    "| {} | {} | {} | | | | | | | |",
                    r.n,
                    s.system,
                    why.as_deref().unwrap_or("not run")
                ),
            }
        }
        let Some(ours) = r.systems.first().and_then(|s| s.figures.as_ref()) else {
            continue;
        };
        for s in &r.systems[1..] {
            let Some(f) = &s.figures else { continue };
            println!(
                "| {} | ours / {} | {} | {} | {} | {} | {} | | {} | {} |",
                r.n,
                s.system,
                fmt(ratio(ours.cold.secs, f.cold.secs)),
                fmt(ratio(ours.cold.objects_per_sec, f.cold.objects_per_sec)),
                fmt(ratio(ours.cold.peak_mib, f.cold.peak_mib)),
                both(ours.restart, f.restart, |a, b| ratio(a.secs, b.secs)),
                both(ours.restart, f.restart, |a, b| ratio(a.peak_mib, b.peak_mib)),
                both(ours.relist, f.relist, |a, b| ratio(a.secs, b.secs)),
                match (ours.ingest, f.ingest) {
                    (Some(a), Some(b)) => fmt(ratio(a.events_per_sec, b.events_per_sec)),
                    _ => String::new(),
                },
            );
        }
    }
    for r in results {
        println!("\nN = {}: sim generated and loaded in {:.1} s", r.n, r.sim_load_secs);
    }
}

// ---------------------------------------------------------------------------------------------
// machine and command

fn machine() -> Value {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpuinfo = read("/proc/cpuinfo");
    let cpu_model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string());
    let mem_total_kib = read("/proc/meminfo")
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<u64>().ok());
    json!({
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "cpu_model": cpu_model,
        "kernel": read("/proc/sys/kernel/osrelease").trim(),
        "os": std::env::consts::OS,
        "arch": std::env::consts::ARCH,
        "mem_total_kib": mem_total_kib,
        "loadavg": read("/proc/loadavg").trim(),
    })
}

fn command() -> Value {
    let env: BTreeMap<String, String> = std::env::vars().filter(|(k, _)| k.starts_with("BENCH_")).collect();
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let prefix: String = env.iter().map(|(k, v)| format!("{k}={v} ")).collect();
    let suffix = if args.is_empty() {
        String::new()
    } else {
        format!(" -- {}", args.join(" "))
    };
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    json!({
        "command": format!("{prefix}cargo bench --features sim --bench compare{suffix}"),
        "argv": std::env::args().collect::<Vec<_>>(),
        "env": env,
        "git_commit": git(&["rev-parse", "HEAD"]),
        "git_dirty": git(&["status", "--porcelain", "--untracked-files=no"]).map(|s| !s.is_empty()),
    })
}

// ---------------------------------------------------------------------------------------------

/// Each Go peer's greeting (system, module version, Go version, content type).
fn peer_versions(cfg: &Cfg) -> Res<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for sys in &cfg.systems {
        if let Sys::Go(k) = sys {
            // It connects to nothing before `start`.
            let p = peers::GoPeer::spawn(cfg.bin()?, *k, "http://127.0.0.1:1")?;
            out.insert(k.label.to_string(), p.hello.clone());
            p.quit()?;
        }
    }
    Ok(out)
}

fn main() -> Res<()> {
    if let Ok(system) = std::env::var("COMPARE_CHILD") {
        return child(&system);
    }
    let cfg = config()?;
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let versions = peer_versions(&cfg)?;
    for (label, hello) in &versions {
        eprintln!("peer {label}: {hello}");
    }
    let t_all = Instant::now();
    let mut sizes = Vec::new();
    let mut sizes_json = Vec::new();
    for &n in &cfg.sizes {
        eprintln!("N = {n}: generating and loading the sim...");
        let sim = scenarios::start_sim(n)?;
        let dir = tempfile::tempdir()?;
        let mut reps = Vec::new();
        for rep in 0..cfg.reps {
            reps.push(run_rep(&cfg, &sim, n, rep, dir.path())?);
        }
        let rows = rows(&reps, cfg.systems.len());
        let title = format!(
            "N = {n}, {} repetition{}: median (min–max); ratios of the medians",
            cfg.reps,
            if cfg.reps == 1 { "" } else { "s" }
        );
        print_table(&title, &cfg.systems, &rows);
        print_ladder_notes(&cfg.systems, &reps);
        sizes_json.push(json!({
            "n": n,
            "namespaces": scenarios::namespace_count(n),
            "summary": rows.iter().map(|r| r.json(&cfg.systems)).collect::<Vec<_>>(),
            "repetitions": reps,
        }));
        sizes.push(SizeResult { n, reps, rows });
    }
    let huge = cfg.huge.map(|n| run_huge(&cfg, n, 1)).transpose()?;
    let mut scale: Vec<ScaleResult> = Vec::new();
    for &n in &cfg.scale {
        let r = run_scale(&cfg, n, &scale)?;
        scale.push(r);
        print_scale(&scale);
    }
    let results = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench-results");
    let out = match std::env::var("BENCH_OUT") {
        Ok(dir) if !dir.trim().is_empty() => PathBuf::from(dir),
        _ => results.join(format!("compare-{started}")),
    };
    std::fs::create_dir_all(&out)?;
    std::fs::create_dir_all(&results)?;
    let doc = json!({
        "bench": "compare",
        "started_unix": started,
        "wall_secs": t_all.elapsed().as_secs_f64(),
        "quick": cfg.quick,
        "repetitions": cfg.reps,
        "systems": cfg.systems.iter().map(|s| s.label()).collect::<Vec<_>>(),
        "peer_versions": versions,
        "order": "every scenario runs for durable-informer, then for each peer in the order of `systems`, in each repetition",
        "memory_only": cfg.memory_only,
        "only": cfg.only,
        "ladder": cfg.ladder,
        "sustained_rule": {
            "producer_share": scenarios::PRODUCER_SHARE,
            "max_lag_slope_share_of_rate": scenarios::MAX_LAG_SLOPE_SHARE,
            "max_end_lag_secs": scenarios::MAX_END_LAG_SECS,
        },
        "machine": machine(),
        "invocation": command(),
        "sizes": sizes_json,
        "ours_alone": huge.as_ref().map(|h| json!({
            "n": h.n, "sim_load_secs": h.load_secs, "parent_vm_hwm_kib": h.parent_vm_hwm_kib,
            "repetitions": h.reps,
        })),
        "large_clusters": scale,
    });
    let text = serde_json::to_string_pretty(&doc)?;
    std::fs::write(out.join("compare.json"), &text)?;
    std::fs::write(results.join("compare.json"), &text)?;
    println!("\nresults written to {}", out.join("compare.json").display());
    for p in write_charts(&out, &cfg.systems, &sizes, huge.as_ref(), &scale)? {
        println!("chart written to {}", p.display());
    }
    Ok(())
}
