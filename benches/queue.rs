//! Workqueue throughput: add + get + done with 1 and 4 worker tasks, and dedup-heavy adds.
//!
//! Run with `cargo bench --bench queue`.
// `criterion_group!` generates an undocumented `pub fn`.
#![allow(missing_docs)]

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use durable_informer::queue::WorkQueue;

const ITEMS: u64 = 10_000;

/// Adds `ITEMS` distinct items while `workers` tasks get and done them; drains.
async fn add_get_done(workers: usize) {
    let queue: WorkQueue<u64> = WorkQueue::new();
    let handles: Vec<_> = (0..workers)
        .map(|_| {
            let queue = queue.clone();
            tokio::spawn(async move {
                while let Some(item) = queue.get().await {
                    queue.done(&item);
                }
            })
        })
        .collect();
    for item in 0..ITEMS {
        queue.add(item);
    }
    queue.shutdown_with_drain().await;
    for handle in handles {
        handle.await.expect("worker panicked");
    }
}

fn bench_add_get_done(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("runtime");
    let mut group = c.benchmark_group("add_get_done");
    group.throughput(Throughput::Elements(ITEMS));
    group.measurement_time(Duration::from_secs(5));
    for workers in [1, 4] {
        group.bench_with_input(
            BenchmarkId::from_parameter(format!("{workers}_workers")),
            &workers,
            |b, &workers| b.iter(|| runtime.block_on(add_get_done(workers))),
        );
    }
    group.finish();
}

fn bench_dedup_heavy_adds(c: &mut Criterion) {
    let mut group = c.benchmark_group("dedup_heavy_adds");
    group.throughput(Throughput::Elements(ITEMS));
    group.bench_function("10k_adds_100_keys", |b| {
        b.iter(|| {
            let queue: WorkQueue<u64> = WorkQueue::new();
            for item in 0..ITEMS {
                queue.add(item % 100);
            }
            assert_eq!(queue.len(), 100);
        });
    });
    group.finish();
}

criterion_group!(benches, bench_add_get_done, bench_dedup_heavy_adds);
criterion_main!(benches);
