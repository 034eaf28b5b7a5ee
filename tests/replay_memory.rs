//! A long generated recording replays with memory bounded independently of its length: the
//! peak RSS added by a recording ten times longer stays under a fixed bound.
//!
//! One test only: peak RSS is per process, so a second test running alongside would blur the
//! measurement. It compares 40,000 with 400,000 events (about 15 s in a debug build);
//! `REPLAY_MEMORY_EVENTS=1000000 cargo test --test replay_memory` runs the one-million-event
//! version (about 35 s in debug: 30 MiB peak after 100,000 events, 41 MiB after 1,000,000).

use std::io::Write;
use std::path::Path;

use durable_informer::replay::{replay_into, ReplayOptions, ReplaySource};
use durable_informer::store::{DurableStore, StoreConfig};

/// Writes `events` ConfigMap-sized events (ADDEDs of 1,000 objects, then MODIFIEDs cycling over
/// them), streaming through zstd: the file is never held in memory.
fn generate(path: &Path, events: u64) {
    let file = std::fs::File::create(path).unwrap();
    let mut out = zstd::stream::write::Encoder::new(std::io::BufWriter::new(file), 1).unwrap();
    let pad = "x".repeat(200);
    for i in 0..events {
        let kind = if i < 1000 { "ADDED" } else { "MODIFIED" };
        writeln!(
            out,
            r#"{{"type":"{kind}","object":{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"cm-{}","namespace":"load","uid":"00000000-0000-0000-0000-{:012}","resourceVersion":"{}","labels":{{"app":"load"}}}},"data":{{"v":"{i}","pad":"{pad}"}}}},"receivedAt":{}}}"#,
            i % 1000,
            i % 1000,
            1000 + i,
            1_700_000_000_000u64 + i
        )
        .unwrap();
    }
    out.finish().unwrap().flush().unwrap();
}

/// Peak resident set size of this process, in KiB.
fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

async fn replay(dir: &Path, name: &str, events: u64) -> u64 {
    let rec = dir.join(format!("{name}.jsonl.zst"));
    generate(&rec, events);
    let db = DurableStore::open(
        StoreConfig::new(dir.join(format!("{name}.redb")))
            .durable(false)
            .cache_bytes(16 << 20),
    )
    .unwrap();
    let report = replay_into(&db, ReplaySource::open(&rec, ReplayOptions::default()).unwrap())
        .await
        .unwrap();
    assert_eq!(report.initial_objects + report.events, events);
    assert_eq!(report.last_rv.as_u64(), Some(1000 + events - 1));
    db.close().unwrap();
    std::fs::remove_file(&rec).unwrap();
    std::fs::remove_file(dir.join(format!("{name}.redb"))).unwrap();
    peak_rss_kib()
}

async fn bounded(short: u64, long: u64) {
    let dir = tempfile::tempdir().unwrap();
    let before = peak_rss_kib();
    let after_short = replay(dir.path(), "short", short).await;
    let after_long = replay(dir.path(), "long", long).await;
    let growth = after_long.saturating_sub(after_short);
    eprintln!(
        "peak RSS: {before} KiB at start, {after_short} KiB after {short} events, {after_long} KiB after {long} events"
    );
    // Ten times the events (about 300 bytes each) may not cost more than 48 MiB of extra peak.
    assert!(
        growth < 48 << 10,
        "peak RSS grew by {growth} KiB between {short} and {long} events"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_memory_does_not_grow_with_the_recording() {
    let long: u64 = std::env::var("REPLAY_MEMORY_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400_000)
        .max(20_000);
    bounded(long / 10, long).await;
}
