//! Where an informer's always-held memory goes, per object (issues #35 and #36): the "floor"
//! that every object costs whatever the byte budget, measured as live heap with a counting
//! allocator, part by part.
//!
//! ```text
//! cargo bench --features sim --bench cache_floor                 # N = 100,000 Pods, about a minute
//! BENCH_N=20000 cargo bench --features sim --bench cache_floor
//! ```
//!
//! One process, the simulated server in it. The heap live (allocated and not yet freed, as
//! asked of the allocator: its own per-chunk overhead is not in it) is read once things have
//! settled:
//!
//! * **parts**, each built alone from the same N generated Pods (`WorkloadGen`, as
//!   `benches/metadata_informer.rs`) and held in a `Vec`: the extracted `ObjectMeta`, its
//!   labels, annotations and owner references alone, and an `Arc<ObjectKey>`;
//! * **informers**: a full-object and a metadata-only informer of the Pods, each on its own
//!   store with a 4 MiB redb page cache (so redb's share is small and known), synced, its cache
//!   loaded and the change stream drained; then restarted on its database (the cache then holds
//!   no JSON: the floor itself). Each line gives the heap held per object, what the cache holds
//!   (`cache_stats`) and the always-held part as the budget charges it (`held_bytes`).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use durable_informer::informer::{CacheStats, Informer};
use durable_informer::object::{extract_meta, ObjectKey};
use durable_informer::sim::workload::WorkloadGen;
use durable_informer::sim::{Sim, SimConfig};
use durable_informer::source::ClusterIdentity;
use durable_informer::store::{DurableStore, StoreConfig};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

#[path = "common/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::live;

const TIMEOUT: Duration = Duration::from_secs(900);
/// redb's page cache for the informers' stores: small and fixed, so it hardly counts.
const REDB_CACHE: usize = 4 << 20;

fn per(bytes: isize, n: usize) -> String {
    format!("{:>7.0}", bytes as f64 / n as f64)
}

/// Holds what `make` builds from every Pod and returns the heap it takes per object.
fn part<T>(pods: &[Vec<u8>], make: impl Fn(&[u8]) -> T) -> (isize, Vec<T>) {
    let before = live();
    let held: Vec<T> = pods.iter().map(|p| make(p)).collect();
    // The Vec's own buffer is not the part's.
    let vec = held.capacity() * std::mem::size_of::<T>();
    ((live() as isize) - (before as isize) - vec as isize, held)
}

/// Waits until the informer's cache holds `n` objects and the store's stream and list pages are
/// drained, then a little more for freed buffers.
/// Starts `informer`, lets it settle, and says what its cache holds and the heap live then.
async fn held<K>(informer: Informer<K>, store: &DurableStore, n: usize) -> Res<(CacheStats, usize)>
where
    K: kube::Resource<DynamicType = ()> + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    informer.start();
    tokio::time::timeout(TIMEOUT, informer.wait_for_sync()).await??;
    settle(&informer, store, n).await?;
    let held = (informer.cache_stats(), live());
    informer.shutdown().await?;
    Ok(held)
}

async fn settle<K>(informer: &Informer<K>, store: &DurableStore, n: usize) -> Res<()>
where
    K: kube::Resource<DynamicType = ()> + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let c = informer.cache_stats();
        let m = store.memory_stats();
        if c.loaded && c.objects == n && m.stream == 0 && m.syncing == 0 {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!("not settled: {c:?} {m:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    Ok(())
}

/// One informer's run: cold sync, then a restart on its database. Prints a line for each: the
/// heap live once it settled, less the heap live once it was shut down, its store closed and
/// its tasks gone (so what the simulated server built meanwhile does not count).
async fn informer_run(name: &str, url: &str, n: usize, db: &Path, metadata: bool) -> Res<()> {
    for restart in [false, true] {
        if !restart {
            let _ = std::fs::remove_file(db);
        }
        let client = kube::Client::try_from(kube::Config::new(url.parse()?))?;
        let config = StoreConfig::new(db).cache_bytes(REDB_CACHE);
        let store = tokio::task::spawn_blocking(move || DurableStore::open(config)).await??;
        let api = Api::<Pod>::all(client);
        let id = ClusterIdentity::named("sim");
        let line = |c: durable_informer::informer::CacheStats, held: isize| {
            println!(
                "{:<9} {:<8} heap {} B/obj (cache: {} of {} objects with JSON, JSON {} B/obj charged 3x; always-held charged {} B/obj)",
                name,
                if restart { "restart" } else { "cold" },
                per(held, n),
                c.with_json,
                c.objects,
                per((c.charged_bytes / 3) as isize, n),
                per(c.held_bytes as isize, n),
            );
        };
        let (stats, heap) = if metadata {
            let informer = Informer::metadata_from_api(&store, api)
                .cluster_identity(id)
                .build()
                .await?;
            held(informer, &store, n).await?
        } else {
            held(
                Informer::from_api(&store, api).cluster_identity(id).build().await?,
                &store,
                n,
            )
            .await?
        };
        tokio::task::spawn_blocking(move || store.close()).await??;
        // The caches' tasks let go within a second of their informer's drop.
        tokio::time::sleep(Duration::from_secs(3)).await;
        line(stats, heap as isize - live() as isize);
    }
    Ok(())
}

fn main() -> Res<()> {
    let n: usize = std::env::var("BENCH_N").map_or(Ok(100_000), |v| v.parse())?;
    let mut gen = WorkloadGen::new(42).namespaces((n / 1000).max(10));
    let ns = gen.namespace_names();
    let values: Vec<_> = (0..n)
        .map(|k| gen.pod(&ns[k % ns.len()], &format!("pod-{k}")))
        .collect();
    let pods: Vec<Vec<u8>> = values.iter().map(serde_json::to_vec).collect::<Result<_, _>>()?;

    println!("cache_floor: N = {n} Pods; heap live per object (allocator's own chunk overhead not included)");
    let (meta, metas) = part(&pods, |p| extract_meta(p).ok());
    if metas.iter().any(Option::is_none) {
        return Err("a generated Pod has no metadata".into());
    }
    let metas: Vec<_> = metas.into_iter().flatten().collect();
    let (labels, held) = part(&pods, |p| extract_meta(p).map(|m| m.labels).ok());
    drop(held);
    let (annotations, held) = part(&pods, |p| extract_meta(p).map(|m| m.annotations).ok());
    drop(held);
    let (owners, held) = part(&pods, |p| extract_meta(p).map(|m| m.owner_references).ok());
    drop(held);
    let (keys, held) = part(&pods, |p| extract_meta(p).map(|m| Arc::new(m.key())).ok());
    drop(held);
    println!(
        "parts     ObjectMeta {} B/obj: labels {}, annotations {}, owner references {}; Arc<ObjectKey> {} B/obj",
        per(meta, n),
        per(labels, n),
        per(annotations, n),
        per(owners, n),
        per(keys, n)
    );
    println!(
        "          std::mem::size_of: ObjectMeta {} B, ObjectKey {} B",
        std::mem::size_of::<durable_informer::object::ObjectMeta>(),
        std::mem::size_of::<ObjectKey>()
    );
    drop(metas);
    drop(pods);

    let sim = Sim::start(SimConfig::default().history_max_events(n + 10_000))?;
    sim.bulk_load("namespaces", gen.namespace_objects())?;
    for chunk in values.chunks(10_000) {
        sim.bulk_load("pods", chunk.to_vec())?;
    }
    drop(values);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let dir = tempfile::tempdir()?;
    let url = sim.url();
    runtime.block_on(async {
        informer_run("full", &url, n, &dir.path().join("full.redb"), false).await?;
        informer_run("metadata", &url, n, &dir.path().join("meta.redb"), true).await
    })?;
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("load {}", load.split_whitespace().take(3).collect::<Vec<_>>().join(" "));
    Ok(())
}
