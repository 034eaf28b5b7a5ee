//! durable-informer against kube-runtime's reflector, on the same simulated API server, over
//! real HTTP, in one run (issue #9).
//!
//! `cargo bench --features sim --bench compare` (plain `main`, `harness = false`). Sizes: N = 10,000
//! generated ~4 KB Pods; `BENCH_LARGE=1` adds 100,000; `BENCH_N=1000,10000,…` replaces the list;
//! `-- --quick` or `BENCH_QUICK=1` runs N = 200 and 1,000 with a short ladder as a smoke run.
//! `BENCH_REPS` repetitions (3 by default, 1 in quick mode); in each repetition every scenario
//! runs for ours, then for kube-runtime's, so the two alternate through the run. Scenarios
//! (numbered as in the issue):
//!
//! 1. cold initial sync of N objects: time to synced, and what the sim served;
//! 2. restart to synced: ours reopens the database and resumes (one `limit=1` LIST probe),
//!    kube-runtime relists from scratch; peak RSS of a restart in a child process;
//! 3. steady churn: a ladder of producer rates (label patches), the highest rate whose lag
//!    does not grow, and write → handler latency p50/p99 at every rate (1k and 10k/s always);
//! 4. relist after compaction with 1% of the objects changed while down: time and the events
//!    delivered to handlers;
//! 5. peak RSS (`VmHWM`) of each system synced with N objects, each in its own child process
//!    (this binary re-executed with `COMPARE_CHILD=ours|theirs`), the sim staying in the parent;
//!    `BENCH_HUGE=1` adds ours alone at 1,000,000 objects (`BENCH_HUGE_N` to change it);
//! 6. reads: get by key, list one namespace, select by label.
//!
//! `BENCH_MEMORY_ONLY=1` runs only the child processes (scenarios 5 and 2's peak RSS);
//! `BENCH_ONLY=reads,steady` runs only the named parts (`lifecycle` for 1, 2 and 4, `steady`,
//! `reads`, `memory`), for working on one of them; a results table comes from a full run.
//!
//! Prints a table (median and min–max over the repetitions, ratio of the medians ours /
//! theirs) and writes `target/bench-results/compare.json` (every repetition's raw values, the
//! machine and the command) and `throughput.svg`, `latency.svg`, `memory.svg` next to it.

#[path = "compare/charts.rs"]
mod charts;
#[path = "compare/scenarios.rs"]
mod scenarios;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use scenarios::{ChildReport, Ladder, Lifecycle, Reads, Res, Steady};
use serde_json::{json, Value};

/// Fixed rates whose latency the issue asks for (always run by the ladder).
const LATENCY_RATES: [u64; 2] = [1_000, 10_000];

struct Cfg {
    quick: bool,
    reps: usize,
    sizes: Vec<usize>,
    huge: Option<usize>,
    memory_only: bool,
    /// The parts to run (`BENCH_ONLY`); every part when empty.
    only: Vec<String>,
    ladder: Ladder,
    gets: usize,
    lists: usize,
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

fn config() -> Res<Cfg> {
    let quick = std::env::args().any(|a| a == "--quick") || env_flag("BENCH_QUICK");
    let reps = env_usize("BENCH_REPS")?.unwrap_or(if quick { 1 } else { 3 }).max(1);
    let mut sizes = if quick { vec![200, 1_000] } else { vec![10_000] };
    if env_flag("BENCH_LARGE") && !quick {
        sizes.push(100_000);
    }
    if let Ok(list) = std::env::var("BENCH_N") {
        sizes = if list.trim().is_empty() || list.trim() == "none" {
            Vec::new()
        } else {
            list.split(',')
                .map(|s| {
                    s.trim()
                        .replace('_', "")
                        .parse::<usize>()
                        .map_err(|e| format!("BENCH_N: {s:?}: {e}"))
                })
                .collect::<Result<_, _>>()?
        };
    }
    if sizes.contains(&0) {
        return Err("BENCH_N: sizes must be at least 1".into());
    }
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
    Ok(Cfg {
        quick,
        reps,
        sizes,
        huge,
        memory_only: env_flag("BENCH_MEMORY_ONLY"),
        only: parse_only()?,
        ladder,
        gets: if quick { 500 } else { 200_000 },
        lists: if quick { 5 } else { 20 },
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
}

fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
}

// ---------------------------------------------------------------------------------------------
// child processes

/// Runs one system in a child process (cold sync, or ours' restart from `db`).
fn child_run(system: &str, url: &str, n: usize, db: &Path, restart: bool) -> Res<ChildReport> {
    let exe = std::env::current_exe()?;
    let out = std::process::Command::new(exe)
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
/// left; theirs has nothing to resume from, so its restart is another full relist.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
struct Memory {
    cold: ChildReport,
    restart: ChildReport,
}

fn memory(system: &str, url: &str, n: usize, dir: &Path) -> Res<Memory> {
    let db = dir.join(format!("memory-{system}.redb"));
    let cold = child_run(system, url, n, &db, false)?;
    let restart = child_run(system, url, n, &db, true)?;
    let _ = std::fs::remove_file(&db);
    Ok(Memory { cold, restart })
}

// ---------------------------------------------------------------------------------------------
// one repetition

#[derive(Debug, Clone, Default, serde::Serialize)]
struct SystemRep {
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
    ours: SystemRep,
    theirs: SystemRep,
}

fn run_rep(cfg: &Cfg, sim: &durable_informer::sim::Sim, n: usize, rep: usize, dir: &Path) -> Res<Rep> {
    let rt = runtime()?;
    let mut out = Rep {
        rep,
        producer_ceiling: f64::NAN,
        ..Rep::default()
    };
    let tag = format!("N = {n}, repetition {}/{}", rep + 1, cfg.reps);
    if cfg.runs("lifecycle") {
        eprintln!("{tag}: 1, 2, 4 lifecycle (ours, then kube-runtime)...");
        out.ours.lifecycle = Some(rt.block_on(scenarios::ours_lifecycle(sim, n, dir, rep as u64))?);
        out.theirs.lifecycle = Some(rt.block_on(scenarios::theirs_lifecycle(sim, n, rep as u64))?);
    }
    if cfg.runs("steady") {
        eprintln!("{tag}: 3 producer alone, then the steady churn ladder...");
        out.producer_ceiling = scenarios::producer_ceiling(sim, n, cfg.ladder.step.min(Duration::from_secs(2)))?;
        out.ours.steady = Some(rt.block_on(scenarios::ours_steady(sim, n, &cfg.ladder, dir))?);
        out.theirs.steady = Some(rt.block_on(scenarios::theirs_steady(sim, n, &cfg.ladder))?);
    }
    if cfg.runs("reads") {
        eprintln!("{tag}: 6 reads...");
        out.ours.reads = Some(rt.block_on(scenarios::ours_reads(sim, n, cfg.gets, cfg.lists, dir))?);
        out.theirs.reads = Some(rt.block_on(scenarios::theirs_reads(sim, n, cfg.gets, cfg.lists))?);
    }
    if cfg.runs("memory") {
        eprintln!("{tag}: 5 and 2 peak RSS (child processes)...");
        out.ours.memory = Some(memory("ours", &sim.url(), n, dir)?);
        out.theirs.memory = Some(memory("theirs", &sim.url(), n, dir)?);
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
            m("6 reads", "hot tier off: get by key (µs)", c.get_us);
            m("6 reads", "hot tier off: list one namespace (µs)", c.list_ns_us);
            m("6 reads", "hot tier off: select app=web (µs)", c.by_label_us);
            m("6 reads", "decode one Pod's JSON alone (µs)", c.decode_us);
        }
        if let Some(mib) = r.hot_tier_mib {
            m("6 reads", "hot tier held, as charged (MiB)", mib);
        }
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

/// One row of the table: a metric over all repetitions, for both systems.
struct Row {
    scenario: &'static str,
    name: String,
    higher_is_better: bool,
    ours: Vec<f64>,
    theirs: Vec<f64>,
    ours_lower_bound: Vec<bool>,
    theirs_lower_bound: Vec<bool>,
}

impl Row {
    fn json(&self) -> Value {
        let (o, t) = (stats(&self.ours), stats(&self.theirs));
        json!({
            "scenario": self.scenario,
            "metric": self.name,
            "higher_is_better": self.higher_is_better,
            "ours": {"median": o.median, "min": o.min, "max": o.max, "values": self.ours,
                     "lower_bound": self.ours_lower_bound},
            "theirs": {"median": t.median, "min": t.min, "max": t.max, "values": self.theirs,
                       "lower_bound": self.theirs_lower_bound},
            "ratio_of_medians": ratio(o.median, t.median),
        })
    }
}

fn rows(reps: &[Rep]) -> Vec<Row> {
    let mut rows: Vec<Row> = Vec::new();
    let mut index: BTreeMap<(String, String), usize> = BTreeMap::new();
    for rep in reps {
        for (theirs, sys) in [(false, &rep.ours), (true, &rep.theirs)] {
            for m in metrics(sys) {
                let key = (m.scenario.to_string(), m.name.clone());
                let i = *index.entry(key).or_insert_with(|| {
                    rows.push(Row {
                        scenario: m.scenario,
                        name: m.name.clone(),
                        higher_is_better: m.higher_is_better,
                        ours: Vec::new(),
                        theirs: Vec::new(),
                        ours_lower_bound: Vec::new(),
                        theirs_lower_bound: Vec::new(),
                    });
                    rows.len() - 1
                });
                if theirs {
                    rows[i].theirs.push(m.value);
                    rows[i].theirs_lower_bound.push(m.lower_bound);
                } else {
                    rows[i].ours.push(m.value);
                    rows[i].ours_lower_bound.push(m.lower_bound);
                }
            }
        }
    }
    rows
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

fn print_table(title: &str, rows: &[Row]) {
    println!("\n### {title}\n");
    println!("| scenario | metric | durable-informer | kube-runtime | ours / theirs |");
    println!("|---|---|---:|---:|---:|");
    for r in rows {
        let ratio = ratio(stats(&r.ours).median, stats(&r.theirs).median);
        println!(
            "| {} | {} | {} | {} | {} |",
            r.scenario,
            r.name,
            cell(&r.ours, &r.ours_lower_bound),
            cell(&r.theirs, &r.theirs_lower_bound),
            fmt(ratio)
        );
    }
}

/// The producer's own ceiling and where each system's ladder ended, under the table.
fn print_ladder_notes(reps: &[Rep]) {
    let ceiling: Vec<f64> = reps.iter().map(|r| r.producer_ceiling).collect();
    if ceiling.iter().any(|c| c.is_finite()) {
        println!(
            "\nproducer alone (no consumer attached): {} updates/s; \"≥\": the ladder ended because the \
             producer fell short of its target (or at the top rate), so the consumer's limit is higher",
            cell(&ceiling, &[])
        );
    }
    for (label, pick) in [
        (
            "durable-informer",
            (|r: &Rep| r.ours.steady.clone()) as fn(&Rep) -> Option<Steady>,
        ),
        ("kube-runtime", |r: &Rep| r.theirs.steady.clone()),
    ] {
        let notes: Vec<String> = reps
            .iter()
            .filter_map(|r| {
                let st = pick(r)?;
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
            println!("\n{label} ladder: {}", notes.join("; "));
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

fn series_vs_n(sizes: &[SizeResult], scenario: &str, metric: &str, theirs: bool) -> Vec<charts::Point> {
    sizes
        .iter()
        .filter_map(|s| {
            let r = s.rows.iter().find(|r| r.scenario == scenario && r.name == metric)?;
            let v = if theirs { &r.theirs } else { &r.ours };
            (!v.is_empty()).then(|| point_of(s.n as f64, v))
        })
        .collect()
}

fn both(sizes: &[SizeResult], scenario: &str, metric: &str) -> Vec<charts::Series> {
    vec![
        charts::Series {
            label: "durable-informer".into(),
            points: series_vs_n(sizes, scenario, metric, false),
            color: 0,
            secondary: false,
        },
        charts::Series {
            label: "kube-runtime".into(),
            points: series_vs_n(sizes, scenario, metric, true),
            color: 1,
            secondary: false,
        },
    ]
}

/// p50 and p99 against the ladder's target rate, over the repetitions.
fn latency_series(reps: &[Rep], theirs: bool, p99: bool) -> Vec<charts::Point> {
    let mut by_rate: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
    for r in reps {
        let st = if theirs { &r.theirs.steady } else { &r.ours.steady };
        for step in st.iter().flat_map(|s| &s.steps) {
            by_rate
                .entry(step.target)
                .or_default()
                .push(if p99 { step.p99_ms } else { step.p50_ms });
        }
    }
    by_rate.iter().map(|(rate, v)| point_of(*rate as f64, v)).collect()
}

fn write_charts(out: &Path, sizes: &[SizeResult], huge: Option<&HugeResult>) -> Res<Vec<PathBuf>> {
    let mut written = Vec::new();
    let full: Vec<&SizeResult> = sizes
        .iter()
        .filter(|s| s.reps.iter().any(|r| r.ours.lifecycle.is_some()))
        .collect();
    if !full.is_empty() {
        let path = out.join("throughput.svg");
        charts::write(
            &path,
            &[
                charts::Panel {
                    title: "1 cold sync".into(),
                    x_desc: "N objects".into(),
                    y_desc: "objects/s (median, min–max)".into(),
                    series: both(sizes, "1 cold sync", "throughput (objects/s)"),
                },
                charts::Panel {
                    title: "3 highest sustained update rate".into(),
                    x_desc: "N objects".into(),
                    y_desc: "events/s (median, min–max)".into(),
                    series: both(sizes, "3 steady churn", "highest sustained rate (events/s)"),
                },
            ],
        )?;
        written.push(path);
        let panels: Vec<charts::Panel> = full
            .iter()
            .map(|s| charts::Panel {
                title: format!("3 write → handler latency, N = {}", s.n),
                x_desc: "producer rate (updates/s)".into(),
                y_desc: "ms (median, min–max)".into(),
                series: vec![
                    charts::Series {
                        label: "durable-informer p50".into(),
                        points: latency_series(&s.reps, false, false),
                        color: 0,
                        secondary: false,
                    },
                    charts::Series {
                        label: "durable-informer p99".into(),
                        points: latency_series(&s.reps, false, true),
                        color: 0,
                        secondary: true,
                    },
                    charts::Series {
                        label: "kube-runtime p50".into(),
                        points: latency_series(&s.reps, true, false),
                        color: 1,
                        secondary: false,
                    },
                    charts::Series {
                        label: "kube-runtime p99".into(),
                        points: latency_series(&s.reps, true, true),
                        color: 1,
                        secondary: true,
                    },
                ],
            })
            .collect();
        let path = out.join("latency.svg");
        charts::write(&path, &panels)?;
        written.push(path);
    }
    if !sizes.is_empty() || huge.is_some() {
        let mut cold = both(sizes, "5 memory", "peak RSS after cold sync (MiB)");
        let mut restart = both(sizes, "2 restart", "peak RSS, child process (MiB)");
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
        let path = out.join("memory.svg");
        charts::write(
            &path,
            &[
                charts::Panel {
                    title: "5 peak RSS after a cold sync".into(),
                    x_desc: "N objects".into(),
                    y_desc: "MiB (median, min–max)".into(),
                    series: cold,
                },
                charts::Panel {
                    title: "2 peak RSS of a restart".into(),
                    x_desc: "N objects".into(),
                    y_desc: "MiB (median, min–max)".into(),
                    series: restart,
                },
            ],
        )?;
        written.push(path);
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

fn run_huge(n: usize, reps: usize) -> Res<HugeResult> {
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
        out.push(memory("ours", &sim.url(), n, dir.path())?);
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

fn main() -> Res<()> {
    if let Ok(system) = std::env::var("COMPARE_CHILD") {
        return child(&system);
    }
    let cfg = config()?;
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
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
        let rows = rows(&reps);
        let title = format!(
            "N = {n}, {} repetition{}: median (min–max); ratio of the medians",
            cfg.reps,
            if cfg.reps == 1 { "" } else { "s" }
        );
        print_table(&title, &rows);
        print_ladder_notes(&reps);
        sizes_json.push(json!({
            "n": n,
            "namespaces": scenarios::namespace_count(n),
            "summary": rows.iter().map(Row::json).collect::<Vec<_>>(),
            "repetitions": reps,
        }));
        sizes.push(SizeResult { n, reps, rows });
    }
    let huge = cfg.huge.map(|n| run_huge(n, 1)).transpose()?;
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench-results");
    std::fs::create_dir_all(&out)?;
    let file = out.join("compare.json");
    let doc = json!({
        "bench": "compare",
        "started_unix": started,
        "wall_secs": t_all.elapsed().as_secs_f64(),
        "quick": cfg.quick,
        "repetitions": cfg.reps,
        "order": "every scenario runs for durable-informer, then for kube-runtime, in each repetition",
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
    });
    std::fs::write(&file, serde_json::to_string_pretty(&doc)?)?;
    println!("\nresults written to {}", file.display());
    for p in write_charts(&out, &sizes, huge.as_ref())? {
        println!("chart written to {}", p.display());
    }
    Ok(())
}
