//! How fast the simulated API server streams watch events to one watcher over loopback.
//!
//! `cargo bench --features sim --bench sim_watch` (plain `main`, `harness = false`). Prints events/s and MB/s
//! for: a watch replaying history (ConfigMaps, then ~4 KB Pods) and a live watch while a
//! writer creates objects as fast as it can. The goal is >= 100,000 events/s, so the sim is
//! never the bottleneck of the informer benchmarks.

use std::time::{Duration, Instant};

use durable_informer::sim::workload::WorkloadGen;
use durable_informer::sim::{Sim, SimConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Open a raw watch and read until `want` events arrived; returns (events, bytes).
///
/// The request is HTTP/1.0, so the body is close-delimited rather than chunked and every
/// newline ends an event: counting is a vectorized byte count, so the client stays cheap.
async fn watch_count(addr: std::net::SocketAddr, path: &str, want: u64) -> (u64, u64) {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.set_nodelay(true).expect("nodelay");
    let req = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\nAccept: application/json\r\n\r\n");
    s.write_all(req.as_bytes()).await.expect("write");
    let mut buf = vec![0u8; 4 << 20];
    let (mut events, mut bytes) = (0u64, 0u64);
    let mut in_head = true;
    while events < want {
        let n = s.read(&mut buf).await.expect("read");
        if n == 0 {
            break;
        }
        bytes += n as u64;
        let mut data = &buf[..n];
        if in_head {
            // skip the response head (assumed to arrive in the first read)
            if let Some(p) = data.windows(4).position(|w| w == b"\r\n\r\n") {
                data = &data[p + 4..];
                in_head = false;
            } else {
                continue;
            }
        }
        events += data.iter().filter(|&&b| b == b'\n').count() as u64;
    }
    (events, bytes)
}

/// CPU seconds used by this process so far (user + system), from `/proc/self/stat` (Linux).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<f64> = after.split_whitespace().map(|x| x.parse().unwrap_or(0.0)).collect();
    // fields 14 and 15 (utime, stime) are at 11 and 12 after the command name; 100 ticks/s
    (f.get(11).copied().unwrap_or(0.0) + f.get(12).copied().unwrap_or(0.0)) / 100.0
}

/// The rate the sim should reach so it never limits the informer benchmarks.
const GOAL_EVENTS_PER_SEC: f64 = 100_000.0;

fn report(name: &str, events: u64, bytes: u64, took: Duration, cpu: f64) {
    let secs = took.as_secs_f64();
    let rate = events as f64 / secs;
    // Flag a miss in the output itself: these figures are quoted in the README.
    let flag = if rate < GOAL_EVENTS_PER_SEC {
        "  BELOW GOAL (100k/s)"
    } else {
        ""
    };
    println!(
        "{name:<40} {events:>8} events in {:>7.3} s = {:>9.0} events/s, {:>6.1} MB/s; {:>9.0} events per CPU-second (server + client){flag}",
        secs,
        rate,
        bytes as f64 / secs / 1e6,
        events as f64 / cpu.max(1e-3)
    );
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    println!(
        "sim_watch on {} CPUs (goal: {GOAL_EVENTS_PER_SEC:.0} events/s per row)",
        std::thread::available_parallelism().map_or(0, std::num::NonZeroUsize::get)
    );
    let cfg = || SimConfig::default().history_max_events(2_000_000);

    // 1. replay 300k small ConfigMap events from the history
    let sim = Sim::start(cfg())?;
    let start_rv = sim.current_rv();
    let n = 300_000u64;
    let mut gen = WorkloadGen::new(1).namespaces(10);
    for chunk in 0..(n / 10_000) {
        let _ = chunk;
        sim.bulk_load(
            "configmaps",
            gen.configmaps(10_000).into_iter().enumerate().map(|(i, mut v)| {
                v["metadata"]["name"] = format!("cm-{chunk}-{i}").into();
                v
            }),
        )?;
    }
    let path = format!("/api/v1/configmaps?watch=1&resourceVersion={start_rv}&timeoutSeconds=600");
    let (t, c) = (Instant::now(), cpu_seconds());
    let (ev, bytes) = rt.block_on(watch_count(sim.addr(), &path, n));
    report(
        "history replay, ConfigMaps (~0.4 KB)",
        ev,
        bytes,
        t.elapsed(),
        cpu_seconds() - c,
    );
    drop(sim);

    // 2. replay 100k ~4 KB Pod events from the history
    let sim = Sim::start(cfg())?;
    let start_rv = sim.current_rv();
    let n = 100_000u64;
    let mut gen = WorkloadGen::new(2).namespaces(10);
    for chunk in 0..(n / 10_000) {
        sim.bulk_load(
            "pods",
            gen.pods(10_000).into_iter().enumerate().map(|(i, mut v)| {
                v["metadata"]["name"] = format!("pod-{chunk}-{i}").into();
                v
            }),
        )?;
    }
    let path = format!("/api/v1/pods?watch=1&resourceVersion={start_rv}&timeoutSeconds=600");
    let (t, c) = (Instant::now(), cpu_seconds());
    let (ev, bytes) = rt.block_on(watch_count(sim.addr(), &path, n));
    report(
        "history replay, Pods (~4 KB)",
        ev,
        bytes,
        t.elapsed(),
        cpu_seconds() - c,
    );

    // 3. the same Pods as synthetic ADDED events (watch without resourceVersion)
    let (t, c) = (Instant::now(), cpu_seconds());
    let (ev, bytes) = rt.block_on(watch_count(sim.addr(), "/api/v1/pods?watch=1&timeoutSeconds=600", n));
    report(
        "initial events, Pods (~4 KB)",
        ev,
        bytes,
        t.elapsed(),
        cpu_seconds() - c,
    );
    drop(sim);

    // 4. live: a writer thread creates ConfigMaps while one watcher follows
    let sim = Sim::start(cfg())?;
    let n = 200_000u64;
    let objs: Vec<serde_json::Value> = {
        let mut gen = WorkloadGen::new(3).namespaces(10);
        gen.configmaps(n as usize)
    };
    let rv = sim.current_rv();
    let path = format!("/api/v1/configmaps?watch=1&resourceVersion={rv}&timeoutSeconds=600");
    let (t, c) = (Instant::now(), cpu_seconds());
    let (ev, bytes) = std::thread::scope(|s| {
        s.spawn(|| {
            for o in objs {
                let ns = o["metadata"]["namespace"].as_str().unwrap_or("default").to_string();
                sim.create("configmaps", Some(&ns), o).expect("create");
            }
        });
        rt.block_on(watch_count(sim.addr(), &path, n))
    });
    report(
        "live, ConfigMaps, writer in-process",
        ev,
        bytes,
        t.elapsed(),
        cpu_seconds() - c,
    );
    Ok(())
}
