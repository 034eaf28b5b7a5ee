//! durable-informer against kube-runtime's reflector, on the same simulated API server, over
//! real HTTP, in one run (issue #9).
//!
//! `cargo bench --bench compare` (plain `main`, `harness = false`): N = 10,000 generated ~4 KB
//! Pods (and 100,000 with `BENCH_LARGE=1`); `-- --quick` or `BENCH_QUICK=1` runs N = 500 as a
//! smoke run. Scenarios (each run for ours, then for kube-runtime's):
//!
//! 1. cold initial sync of N objects: time to synced, and what the sim served;
//! 2. restart to synced: ours reopens the database and resumes (one `limit=1` LIST probe),
//!    kube-runtime relists from scratch;
//! 3. relist after compaction with 1% of the objects changed while down: time and the events
//!    delivered to handlers;
//! 4. steady churn: K updates, time until the store reflects the last RV; then update→handler
//!    latency p50/p99 at a fixed rate;
//! 5. peak RSS (`VmHWM`) of each system synced with N objects, each in its own child process
//!    (this binary re-executed with `COMPARE_CHILD=ours|theirs`), the sim staying in the parent;
//! 6. reads: get by key, list one namespace, select by label.
//!
//! `BENCH_MEMORY_ONLY=1` runs only scenario 5 (with `BENCH_LARGE=1`: at 10,000 and 100,000).
//!
//! Prints a table of ratios (ours / theirs) and writes `target/bench-results/compare.json`.

#[path = "compare/scenarios.rs"]
mod scenarios;

use std::time::Duration;

use scenarios::{Lifecycle, Reads, Res, Steady};
use serde_json::json;

struct Sizes {
    n: usize,
    updates: usize,
    latency_rate: u64,
    latency_secs: u64,
    gets: usize,
    lists: usize,
}

fn sizes(n: usize, quick: bool) -> Sizes {
    if quick {
        Sizes {
            n,
            updates: 500,
            latency_rate: 100,
            latency_secs: 1,
            gets: 500,
            lists: 5,
        }
    } else {
        Sizes {
            n,
            updates: 10_000,
            latency_rate: 200,
            latency_secs: 5,
            gets: 10_000,
            lists: 20,
        }
    }
}

fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
}

/// Runs one system in a child process and returns its peak RSS in KiB.
fn memory(system: &str, url: &str, n: usize) -> Res<u64> {
    let exe = std::env::current_exe()?;
    let out = std::process::Command::new(exe)
        .env("COMPARE_CHILD", system)
        .env("COMPARE_URL", url)
        .env("COMPARE_N", n.to_string())
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("VMHWM_KIB="))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| {
            format!(
                "memory child {system} failed: {}\n{stdout}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )
            .into()
        })
}

fn child(system: &str) -> Res<()> {
    let url = std::env::var("COMPARE_URL")?;
    let n: u64 = std::env::var("COMPARE_N")?.parse()?;
    let dir = tempfile::tempdir()?;
    let kib = runtime()?.block_on(scenarios::memory_child(system, &url, n, dir.path()))?;
    println!("VMHWM_KIB={kib}");
    Ok(())
}

struct Row {
    scenario: &'static str,
    metric: String,
    ours: f64,
    theirs: f64,
}

fn ratio(a: f64, b: f64) -> f64 {
    if b == 0.0 {
        f64::NAN
    } else {
        a / b
    }
}

#[allow(clippy::too_many_arguments)]
fn rows(
    n: usize,
    ours: &Lifecycle,
    theirs: &Lifecycle,
    so: &Steady,
    st: &Steady,
    mem: (f64, f64),
    ro: &Reads,
    rt: &Reads,
) -> Vec<Row> {
    let r = |scenario, metric: &str, ours: f64, theirs: f64| Row {
        scenario,
        metric: metric.to_string(),
        ours,
        theirs,
    };
    let mb = |b: u64| b as f64 / 1e6;
    vec![
        r("1 cold sync", "time to synced (s)", ours.cold.secs, theirs.cold.secs),
        r(
            "1 cold sync",
            "objects served",
            ours.cold.served.objects() as f64,
            theirs.cold.served.objects() as f64,
        ),
        r(
            "1 cold sync",
            "MB served",
            mb(ours.cold.served.bytes),
            mb(theirs.cold.served.bytes),
        ),
        r(
            "2 restart",
            "time to synced (s)",
            ours.restart.secs,
            theirs.restart.secs,
        ),
        r(
            "2 restart",
            "LIST requests",
            ours.restart.served.list_requests as f64,
            theirs.restart.served.list_requests as f64,
        ),
        r(
            "2 restart",
            "objects listed (LIST + initial events)",
            ours.restart.served.objects() as f64,
            theirs.restart.served.objects() as f64,
        ),
        r(
            "2 restart",
            "MB served",
            mb(ours.restart.served.bytes),
            mb(theirs.restart.served.bytes),
        ),
        r(
            "3 relist 1%",
            "time to synced + delivered (s)",
            ours.relist.secs,
            theirs.relist.secs,
        ),
        r(
            "3 relist 1%",
            &format!("handler events ({}/{} changed)", ours.changed, theirs.changed),
            ours.relist.events as f64,
            theirs.relist.events as f64,
        ),
        r(
            "3 relist 1%",
            "MB served",
            mb(ours.relist.served.bytes),
            mb(theirs.relist.served.bytes),
        ),
        r(
            "4 steady",
            &format!("ingest of {} updates (events/s)", so.updates),
            so.events_per_sec,
            st.events_per_sec,
        ),
        r("4 steady", "producer time (s)", so.produce_secs, st.produce_secs),
        r(
            "4 steady",
            &format!("latency p50 at {}/s (ms)", so.latency_rate),
            so.latency_p50_ms,
            st.latency_p50_ms,
        ),
        r(
            "4 steady",
            &format!("latency p99 at {}/s (ms)", so.latency_rate),
            so.latency_p99_ms,
            st.latency_p99_ms,
        ),
        r("5 memory", &format!("peak RSS, {n} objects (MB)"), mem.0, mem.1),
        r("6 reads", "get by key (µs)", ro.get_us, rt.get_us),
        r(
            "6 reads",
            &format!("list one namespace, {} objects (µs)", ro.list_ns_len),
            ro.list_ns_us,
            rt.list_ns_us,
        ),
        r(
            "6 reads",
            &format!("select app=web, {} objects (µs)", ro.by_label_len),
            ro.by_label_us,
            rt.by_label_us,
        ),
    ]
}

fn print_table(n: usize, rows: &[Row]) {
    println!("\n### N = {n}\n");
    println!("| scenario | metric | durable-informer | kube-runtime | ours / theirs |");
    println!("|---|---|---:|---:|---:|");
    let f = |x: f64| {
        if x.is_nan() {
            "n/a".to_string()
        } else if x.abs() >= 100.0 || x == x.trunc() {
            format!("{x:.0}")
        } else if x.abs() >= 1.0 {
            format!("{x:.2}")
        } else {
            format!("{x:.4}")
        }
    };
    for r in rows {
        println!(
            "| {} | {} | {} | {} | {} |",
            r.scenario,
            r.metric,
            f(r.ours),
            f(r.theirs),
            f(ratio(r.ours, r.theirs))
        );
    }
}

/// Scenario 5 alone (`BENCH_MEMORY_ONLY=1`), for sizes where the full run is too long.
fn memory_only(n: usize) -> Res<serde_json::Value> {
    eprintln!("N = {n}: generating and loading the sim...");
    let sim = scenarios::start_sim(n)?;
    eprintln!("scenario 5 only (child processes)...");
    let mo = memory("ours", &sim.url(), n)? as f64 / 1024.0;
    let mt = memory("theirs", &sim.url(), n)? as f64 / 1024.0;
    println!("\n### N = {n}, memory only\n");
    println!("| scenario | metric | durable-informer | kube-runtime | ours / theirs |");
    println!("|---|---|---:|---:|---:|");
    println!(
        "| 5 memory | peak RSS, {n} objects (MB) | {mo:.1} | {mt:.1} | {:.3} |",
        ratio(mo, mt)
    );
    Ok(json!({"n": n, "memory_mb": {"ours": mo, "theirs": mt}}))
}

fn run_size(s: &Sizes) -> Res<serde_json::Value> {
    let n = s.n;
    if std::env::var("BENCH_MEMORY_ONLY").is_ok_and(|v| v == "1") {
        return memory_only(n);
    }
    eprintln!("N = {n}: generating and loading the sim...");
    let sim = scenarios::start_sim(n)?;
    let dir = tempfile::tempdir()?;
    let rt = runtime()?;
    eprintln!("scenarios 1-3 (ours, then kube-runtime)...");
    let ours = rt.block_on(scenarios::ours_lifecycle(&sim, n, dir.path()))?;
    let theirs = rt.block_on(scenarios::theirs_lifecycle(&sim, n))?;
    eprintln!("scenario 4...");
    let lat = Duration::from_secs(s.latency_secs);
    let so = rt.block_on(scenarios::ours_steady(
        &sim,
        s.updates,
        s.latency_rate,
        lat,
        n,
        dir.path(),
    ))?;
    let st = rt.block_on(scenarios::theirs_steady(&sim, s.updates, s.latency_rate, lat, n))?;
    eprintln!("scenario 6...");
    let ro = rt.block_on(scenarios::ours_reads(&sim, n, s.gets, s.lists, dir.path()))?;
    let rth = rt.block_on(scenarios::theirs_reads(&sim, n, s.gets, s.lists))?;
    eprintln!("scenario 5 (child processes)...");
    let mo = memory("ours", &sim.url(), n)? as f64 / 1024.0;
    let mt = memory("theirs", &sim.url(), n)? as f64 / 1024.0;
    let rows = rows(n, &ours, &theirs, &so, &st, (mo, mt), &ro, &rth);
    print_table(n, &rows);
    Ok(json!({
        "n": n,
        "lifecycle": {"ours": ours, "theirs": theirs},
        "steady": {"ours": so, "theirs": st},
        "memory_mb": {"ours": mo, "theirs": mt},
        "reads": {"ours": ro, "theirs": rth},
        "table": rows.iter().map(|r| json!({
            "scenario": r.scenario, "metric": r.metric, "ours": r.ours, "theirs": r.theirs,
            "ratio": ratio(r.ours, r.theirs),
        })).collect::<Vec<_>>(),
    }))
}

fn main() -> Res<()> {
    if let Ok(system) = std::env::var("COMPARE_CHILD") {
        return child(&system);
    }
    let quick = std::env::args().any(|a| a == "--quick") || std::env::var("BENCH_QUICK").is_ok_and(|v| v == "1");
    let large = std::env::var("BENCH_LARGE").is_ok_and(|v| v == "1");
    let mut ns = if quick { vec![500] } else { vec![10_000] };
    if large && !quick {
        ns.push(100_000);
    }
    let mut results = Vec::new();
    for n in ns {
        results.push(run_size(&sizes(n, quick))?);
    }
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench-results");
    std::fs::create_dir_all(&out)?;
    let file = out.join("compare.json");
    let doc = json!({
        "bench": "compare",
        "quick": quick,
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "results": results,
    });
    std::fs::write(&file, serde_json::to_string_pretty(&doc)?)?;
    println!("\nresults written to {}", file.display());
    Ok(())
}
