//! How fast the simulated API server streams watch events to one watcher over loopback.
//!
//! `cargo bench --bench sim_watch` (plain `main`, `harness = false`). Prints events/s and MB/s
//! for: a watch replaying history (ConfigMaps, then ~4 KB Pods) and a live watch while a
//! writer creates objects as fast as it can. The goal is >= 100,000 events/s, so the sim is
//! never the bottleneck of the informer benchmarks.

use std::time::{Duration, Instant};

use durable_informer::sim::workload::WorkloadGen;
use durable_informer::sim::{Sim, SimConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Open a raw watch and read until `want` events arrived; returns (events, bytes).
async fn watch_count(addr: std::net::SocketAddr, path: &str, want: u64) -> (u64, u64) {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.set_nodelay(true).expect("nodelay");
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: application/json\r\n\r\n");
    s.write_all(req.as_bytes()).await.expect("write");
    let mut buf = vec![0u8; 1 << 20];
    let (mut events, mut bytes, mut prev) = (0u64, 0u64, 0u8);
    while events < want {
        let n = s.read(&mut buf).await.expect("read");
        if n == 0 {
            break;
        }
        bytes += n as u64;
        for &b in &buf[..n] {
            // an event line ends with "\n" not preceded by "\r" (chunk framing uses "\r\n")
            if b == b'\n' && prev != b'\r' {
                events += 1;
            }
            prev = b;
        }
    }
    (events, bytes)
}

fn report(name: &str, events: u64, bytes: u64, took: Duration) {
    let secs = took.as_secs_f64();
    println!(
        "{name:<40} {events:>8} events in {:>7.3} s = {:>10.0} events/s, {:>7.1} MB/s",
        secs,
        events as f64 / secs,
        bytes as f64 / secs / 1e6
    );
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
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
            gen.configmaps(10_000)
                .into_iter()
                .enumerate()
                .map(|(i, mut v)| {
                    v["metadata"]["name"] = format!("cm-{chunk}-{i}").into();
                    v
                }),
        )?;
    }
    let path = format!("/api/v1/configmaps?watch=1&resourceVersion={start_rv}&timeoutSeconds=600");
    let t = Instant::now();
    let (ev, bytes) = rt.block_on(watch_count(sim.addr(), &path, n));
    report(
        "history replay, ConfigMaps (~0.4 KB)",
        ev,
        bytes,
        t.elapsed(),
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
    let t = Instant::now();
    let (ev, bytes) = rt.block_on(watch_count(sim.addr(), &path, n));
    report("history replay, Pods (~4 KB)", ev, bytes, t.elapsed());

    // 3. the same Pods as synthetic ADDED events (watch without resourceVersion)
    let t = Instant::now();
    let (ev, bytes) = rt.block_on(watch_count(
        sim.addr(),
        "/api/v1/pods?watch=1&timeoutSeconds=600",
        n,
    ));
    report("initial events, Pods (~4 KB)", ev, bytes, t.elapsed());
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
    let t = Instant::now();
    let (ev, bytes) = std::thread::scope(|s| {
        s.spawn(|| {
            for o in objs {
                let ns = o["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or("default")
                    .to_string();
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
    );
    Ok(())
}
