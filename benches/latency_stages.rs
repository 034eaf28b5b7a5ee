//! Where an event's delivery time goes on the log path, stage by stage (issue #20): one
//! ~4.5 KB Pod per batch, one batch per millisecond, into a store of `BENCH_N` Pods (10,000 by
//! default) with the label index, as the reflector sends them (`deferred_fsync`), then read
//! back from the log as a durable handler's dispatcher does (on a blocking thread) and
//! decoded: every other event into `Pod`, the others into metadata only; and the same
//! entries' headers alone (keys, as the controller's queue once read them).
//!
//! Since issue #33 volatile handlers and the controller's queue no longer read the log: the
//! informer's object cache tells them (`src/informer/cache/`). The last part times that path
//! from the writer on: an informer over the same store (never started: the bench writes
//! through the writer, as its reflector would) with one volatile handler; each event's
//! submit → acknowledged and submit → handler called, and the longest of each with when it
//! happened, to find a stall (`benches/compare` times the whole path, the server and the
//! watch included).
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

fn env_usize(name: &str) -> Res<Option<usize>> {
    match std::env::var(name) {
        Ok(v) => Ok(Some(v.trim().parse().map_err(|e| format!("{name}={v:?}: {e}"))?)),
        Err(_) => Ok(None),
    }
}

/// p50 / p90 / p99 / max of microsecond samples.
fn percentiles(mut v: Vec<f64>) -> String {
    v.sort_by(f64::total_cmp);
    let at = |q: f64| {
        v.get(((v.len() as f64 - 1.0) * q).round() as usize)
            .copied()
            .unwrap_or(f64::NAN)
    };
    format!(
        "p50 {:>6.0} µs   p90 {:>6.0} µs   p99 {:>6.0} µs   max {:>7.0} µs",
        at(0.5),
        at(0.9),
        at(0.99),
        at(1.0)
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
    let n = env_usize("BENCH_N")?.unwrap_or(10_000).max(1);
    rt.block_on(run(events, n))
}

async fn run(events: usize, n: usize) -> Res<()> {
    let dir = tempfile::tempdir()?;
    let config = StoreConfig::new(dir.path().join("stages.redb"));
    let db = tokio::task::spawn_blocking(move || DurableStore::open(config)).await??;
    let writer = db.writer();
    let scope = writer.register_scope(&ScopeSpec::new("", "v1", "pods")).await?;
    db.register_index(scope, Indexer::labels());
    let pods = WorkloadGen::new(1).namespaces(10).pods(n);
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
        "{events} single-Pod batches into {n} Pods, one per ms ({:.1} s):",
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
    informer_stage(&db, &pods, &mut rv, events).await?;
    drop((writer, log));
    tokio::task::spawn_blocking(move || db.close()).await??;
    Ok(())
}

/// Writer → change stream → the informer's cache → a volatile handler: `events` single-Pod
/// deferred batches, one per ms, each timed from its submit to its acknowledgement and to the
/// handler's call.
async fn informer_stage(db: &DurableStore, pods: &[Value], rv: &mut u64, events: usize) -> Res<()> {
    use durable_informer::informer::{handler_fn, Event, HandlerOptions, Informer};
    use durable_informer::sim::{Sim, SimConfig};
    use durable_informer::source::KubeSource;
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};

    // The informer is never started: its source is not asked for anything.
    let sim = Sim::start(SimConfig::default())?;
    let informer = Informer::<Pod>::builder(db, KubeSource::typed::<Pod>(sim.client()?, &sim.url()))
        .indexer(Indexer::labels())
        .build()
        .await?;
    let seen: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let s2 = seen.clone();
    let reg = informer.add_event_handler(
        handler_fn(move |ev: Event<Pod>| -> Result<(), std::convert::Infallible> {
            if let Event::Update { new, .. } = ev {
                if let Some(rv) = new.metadata.resource_version.clone() {
                    s2.lock().map(|mut m| m.insert(rv, Instant::now())).ok();
                }
            }
            Ok(())
        }),
        HandlerOptions::volatile(),
    );
    // Timed from when the handler has been told its initial list (every stored Pod).
    let loaded = Instant::now();
    let position = db.store(informer.scope()).snapshot()?.position()?;
    // The cursor alone: `cache_stats` counts the JSON held, O(N) under the table's lock.
    while reg.cursor() < position && loaded.elapsed() < Duration::from_secs(120) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    println!(
        "informer: loaded and {} initial adds told in {:.2} s",
        informer.cache_stats().objects,
        loaded.elapsed().as_secs_f64()
    );
    let writer = db.writer();
    let mut sent = Vec::with_capacity(events);
    let mut acked = Vec::with_capacity(events);
    let started = Instant::now();
    for i in 0..events {
        *rv += 1;
        let mut pod = pods[(i * 7919 + 1) % pods.len()].clone();
        pod["metadata"]["labels"]["tick"] = format!("i{i}").into();
        let batch = Batch::new(informer.scope())
            .delta(DeltaKind::Updated, raw(&pod, *rv)?)
            .rv(rv.to_string())
            .deferred_fsync();
        let t0 = Instant::now();
        writer.submit(batch)?.await??;
        acked.push((t0.elapsed().as_secs_f64() * 1e6, t0 - started));
        sent.push((rv.to_string(), t0));
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while seen.lock().map(|m| m.len()).unwrap_or(0) < events && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let seen = seen.lock().map(|m| m.clone()).unwrap_or_default();
    let told: Vec<(f64, Duration)> = sent
        .iter()
        .filter_map(|(rv, t0)| {
            seen.get(rv)
                .map(|t| (t.duration_since(*t0).as_secs_f64() * 1e6, *t0 - started))
        })
        .collect();
    let worst = |v: &[(f64, Duration)]| {
        v.iter()
            .copied()
            .max_by(|a, b| a.0.total_cmp(&b.0))
            .map_or(String::new(), |(_, at)| {
                format!("(the longest at {:.3} s)", at.as_secs_f64())
            })
    };
    println!(
        "informer: {events} single-Pod updates, one per ms, {} told to a volatile handler:",
        told.len()
    );
    println!(
        "  submit → acknowledged (deferred fsync)            {} {}",
        percentiles(acked.iter().map(|a| a.0).collect()),
        worst(&acked)
    );
    println!(
        "  submit → volatile handler called                  {} {}",
        percentiles(told.iter().map(|a| a.0).collect()),
        worst(&told)
    );
    informer.shutdown().await?;
    Ok(())
}
