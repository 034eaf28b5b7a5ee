//! Where an event's delivery time goes on the log path, stage by stage (issue #20): one
//! ~4.5 KB Pod per batch, one batch per millisecond, into a store of N = 10,000 Pods with the
//! label index, as the reflector sends them (`deferred_fsync`), then read back from the log as a
//! durable handler's dispatcher does (on a blocking thread) and decoded: every other event into
//! `Pod`, the others into metadata only; and the same entries' headers alone (keys, as the
//! controller's queue once read them).
//!
//! Since issue #33 volatile handlers and the controller's queue no longer read the log: the
//! informer's object cache tells them (`src/informer/cache/`), and this bench, which builds no
//! informer, does not include it; `benches/compare` times that path end to end.
//!
//! `cargo bench --features sim --bench latency_stages` (`BENCH_EVENTS` events, 3,000 by
//! default). Prints p50 / p90 / p99 of each stage.

use std::time::{Duration, Instant};

use durable_informer::object::{RawObject, ScopeSpec};
use durable_informer::sim::workload::WorkloadGen;
use durable_informer::store::{Batch, DeltaKind, DurableStore, Indexer, StoreConfig};
use k8s_openapi::api::core::v1::Pod;
use serde_json::Value;

/// A decode of the metadata alone, beside the whole Pod's.
#[derive(serde::Deserialize)]
struct MetaOnly {
    #[serde(default)]
    #[allow(dead_code)] // read by the decode only
    metadata: kube::core::ObjectMeta,
}

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const N: usize = 10_000;

fn env_usize(name: &str) -> Res<Option<usize>> {
    match std::env::var(name) {
        Ok(v) => Ok(Some(v.trim().parse().map_err(|e| format!("{name}={v:?}: {e}"))?)),
        Err(_) => Ok(None),
    }
}

/// p50 / p90 / p99 of microsecond samples.
fn percentiles(mut v: Vec<f64>) -> String {
    v.sort_by(f64::total_cmp);
    let at = |q: f64| {
        v.get(((v.len() as f64 - 1.0) * q).round() as usize)
            .copied()
            .unwrap_or(f64::NAN)
    };
    format!(
        "p50 {:>6.0} µs   p90 {:>6.0} µs   p99 {:>6.0} µs",
        at(0.5),
        at(0.9),
        at(0.99)
    )
}

fn raw(pod: &Value, rv: u64) -> Res<RawObject> {
    let mut p = pod.clone();
    p["metadata"]["resourceVersion"] = rv.to_string().into();
    let name = p["metadata"]["name"].as_str().unwrap_or_default().to_owned();
    p["metadata"]["uid"] = format!("uid-{name}").into();
    Ok(RawObject::from_json(serde_json::to_vec(&p)?)?)
}

fn main() -> Res<()> {
    let events = env_usize("BENCH_EVENTS")?.unwrap_or(3_000).max(1);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(run(events))
}

async fn run(events: usize) -> Res<()> {
    let dir = tempfile::tempdir()?;
    let config = StoreConfig::new(dir.path().join("stages.redb"));
    let db = tokio::task::spawn_blocking(move || DurableStore::open(config)).await??;
    let writer = db.writer();
    let scope = writer.register_scope(&ScopeSpec::new("", "v1", "pods")).await?;
    db.register_index(scope, Indexer::labels());
    let pods = WorkloadGen::new(1).namespaces(10).pods(N);
    let mut rv = 1u64;
    for chunk in pods.chunks(500) {
        let mut batch = Batch::new(scope);
        for p in chunk {
            rv += 1;
            batch = batch.delta(DeltaKind::Added, raw(p, rv)?);
        }
        writer.apply(batch.rv(rv.to_string())).await?;
    }
    let log = db.log();
    let mut cursor = *writer.committed().borrow();
    let (mut commit, mut read, mut decode, mut meta) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut heads, mut read_full) = (Vec::new(), Vec::new());
    let started = Instant::now();
    for i in 0..events {
        rv += 1;
        let mut pod = pods[(i * 7919) % pods.len()].clone();
        pod["metadata"]["labels"]["tick"] = i.to_string().into();
        let batch = Batch::new(scope)
            .delta(DeltaKind::Added, raw(&pod, rv)?)
            .rv(rv.to_string())
            .deferred_fsync();
        let t0 = Instant::now();
        writer.submit(batch)?.await??;
        let t1 = Instant::now();
        let l = log.clone();
        let after = cursor;
        // Both reads on one blocking thread, each timed there (without the hop to it), in
        // alternating order so that neither always meets the log pages cold.
        let (records, scanned, full_us, heads_us) = tokio::task::spawn_blocking(move || {
            let timed = |f: &dyn Fn() -> Res<()>| -> Res<f64> {
                let t = Instant::now();
                f()?;
                Ok(t.elapsed().as_secs_f64() * 1e6)
            };
            let read_heads = || -> Res<()> {
                std::hint::black_box(l.read_scope_keys_after_contiguous(after, 64, scope)?);
                Ok(())
            };
            let heads_first = if i % 2 == 0 { Some(timed(&read_heads)?) } else { None };
            let t = Instant::now();
            let (records, scanned) = l.read_scope_after_contiguous(after, 64, scope)?;
            let full = t.elapsed().as_secs_f64() * 1e6;
            let heads = match heads_first {
                Some(h) => h,
                None => timed(&read_heads)?,
            };
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>((records, scanned, full, heads))
        })
        .await??;
        read_full.push(full_us);
        heads.push(heads_us);
        let t2 = Instant::now();
        // Each event is decoded one way only, alternating, so neither decode finds the other's
        // work in the caches.
        for r in &records {
            if let Some(bytes) = &r.object {
                if i % 2 == 0 {
                    std::hint::black_box(serde_json::from_slice::<Pod>(bytes)?);
                } else {
                    std::hint::black_box(serde_json::from_slice::<MetaOnly>(bytes)?);
                }
            }
        }
        let t3 = Instant::now();
        cursor = scanned;
        commit.push((t1 - t0).as_secs_f64() * 1e6);
        read.push((t2 - t1).as_secs_f64() * 1e6);
        let us = (t3 - t2).as_secs_f64() * 1e6;
        if i % 2 == 0 {
            decode.push(us);
        } else {
            meta.push(us);
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    println!(
        "{events} single-Pod batches into {N} Pods, one per ms ({:.1} s):",
        started.elapsed().as_secs_f64()
    );
    println!(
        "  submit → committed (redb commit, fsync deferred)  {}",
        percentiles(commit)
    );
    println!(
        "  both reads below, with the hop to a blocking thread {}",
        percentiles(read)
    );
    println!(
        "    of which the read itself (states)               {}",
        percentiles(read_full)
    );
    println!(
        "    the same entries, headers only (keys)           {}",
        percentiles(heads)
    );
    println!(
        "  decode into Pod (every other event)              {}",
        percentiles(decode)
    );
    println!(
        "  metadata only (the others)                      {}",
        percentiles(meta)
    );
    drop((writer, log));
    tokio::task::spawn_blocking(move || db.close()).await??;
    Ok(())
}
