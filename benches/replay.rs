//! Replay throughput: ConfigMap-sized events (about 550 bytes, with managedFields, like the
//! recorded ones in `tests/data/k8s-wire/`) replayed into a fresh durable store through the reflector.
//!
//! `cargo bench --bench replay` (`REPLAY_EVENTS=…` to change the count, 300,000 by default;
//! `REPLAY_MAX_BATCH=…` for the reflector's batch size, 1000 by default).
//! First a criterion micro-benchmark of the replay decode stage (`replay_decode`: a
//! `RecordingReader` over 10,000 in-memory lines, plain and zstd-compressed), then prints the
//! rate of reading alone, of a replay into a store opened with `durable(false)` (no commit ever
//! waits for the disk), and of one into a store opened with `durable(true)`. `cargo bench
//! --bench replay -- replay_decode` runs the criterion group only.
//!
//! Each replay line also prints the database file's size and the bytes this process made the
//! kernel write to storage, per event. With `durable(true)`, `replay_into` commits its batches
//! without waiting for the disk and makes them durable with one commit at the end (a replay is a
//! bulk load into an empty scope; see its docs), so the two rows differ by that final flush.
//! Figures are in the README (*Benchmarks*, issue #7).

use std::hint::black_box;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};

use durable_informer::replay::{replay_into, RecordingReader, ReplayOptions, ReplaySource};
use durable_informer::store::{DurableStore, StoreConfig};

fn generate(path: &Path, events: u64) {
    let out = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    write_events(out, events);
}

fn write_events(mut out: impl Write, events: u64) {
    let objects = (events / 3).max(1);
    for i in 0..events {
        let kind = if i < objects { "ADDED" } else { "MODIFIED" };
        let n = i % objects;
        writeln!(
            out,
            r#"{{"type":"{kind}","object":{{"kind":"ConfigMap","apiVersion":"v1","metadata":{{"name":"bench-cm-{n}","namespace":"bench-{}","uid":"40cf5b8e-510f-4cd4-b117-{n:012}","resourceVersion":"{}","creationTimestamp":"2026-11-22T09:07:25Z","labels":{{"app":"bench","shard":"{}"}},"managedFields":[{{"manager":"kubectl-create","operation":"Update","apiVersion":"v1","time":"2026-11-22T09:07:25Z","fieldsType":"FieldsV1","fieldsV1":{{"f:data":{{".":{{}},"f:idx":{{}}}}}}}}]}},"data":{{"idx":"{i}","payload":"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}}}},"receivedAt":{}}}"#,
            n % 16,
            1000 + i,
            n % 8,
            1_763_802_445_000u64 + i
        )
        .unwrap();
    }
    out.flush().unwrap();
}

/// Bytes this process caused to be written to storage so far (`write_bytes` of
/// `/proc/self/io`; Linux only).
fn write_bytes() -> Option<u64> {
    let io = std::fs::read_to_string("/proc/self/io").ok()?;
    io.lines()
        .find_map(|l| l.strip_prefix("write_bytes: "))
        .and_then(|v| v.trim().parse().ok())
}

/// Criterion micro-benchmark of the decode stage: envelope + metadata of each line, from memory.
fn replay_decode(c: &mut Criterion) {
    const LINES: u64 = 10_000;
    let mut plain = Vec::new();
    write_events(&mut plain, LINES);
    let packed = zstd::bulk::compress(&plain, 3).expect("zstd");
    let mut g = c.benchmark_group("replay_decode");
    g.sample_size(20);
    g.warm_up_time(Duration::from_millis(500));
    g.measurement_time(Duration::from_secs(3));
    g.throughput(Throughput::Elements(LINES));
    for (label, bytes) in [("plain", plain), ("zstd", packed)] {
        g.bench_function(label, |b| {
            b.iter(|| {
                let reader = RecordingReader::from_reader(label, std::io::Cursor::new(bytes.clone())).expect("reader");
                let mut n = 0u64;
                for ev in reader {
                    black_box(ev.expect("event"));
                    n += 1;
                }
                assert_eq!(n, LINES);
            })
        });
    }
    g.finish();
}

fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    replay_decode(&mut criterion);
    criterion.final_summary();
    if std::env::args().skip(1).any(|a| a == "replay_decode") {
        return;
    }
    let events: u64 = std::env::var("REPLAY_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300_000);
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("bench.jsonl");
    generate(&rec, events);
    let bytes = std::fs::metadata(&rec).unwrap().len();
    println!(
        "replay bench: {events} events, {:.0} bytes/event",
        bytes as f64 / events as f64
    );

    let t = Instant::now();
    let mut n = 0u64;
    for ev in RecordingReader::open(&rec).unwrap() {
        ev.unwrap();
        n += 1;
    }
    let secs = t.elapsed().as_secs_f64();
    println!(
        "read + decode only:        {:>9.0} events/s ({n} in {secs:.2} s)",
        n as f64 / secs
    );

    let mut options = ReplayOptions::default();
    if let Some(b) = std::env::var("REPLAY_MAX_BATCH").ok().and_then(|v| v.parse().ok()) {
        options.max_batch = b;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    for (name, durable) in [
        ("replay, durable(false):   ", false),
        ("replay, durable(true):    ", true),
    ] {
        let db_path = dir.path().join(format!("bench-{durable}.redb"));
        let db = DurableStore::open(StoreConfig::new(&db_path).durable(durable)).unwrap();
        let written = write_bytes();
        let t = Instant::now();
        let report = rt
            .block_on(replay_into(&db, ReplaySource::open(&rec, options.clone()).unwrap()))
            .unwrap();
        let secs = t.elapsed().as_secs_f64();
        let n = report.initial_objects + report.events;
        assert_eq!(n, events);
        let written = write_bytes()
            .zip(written)
            .map(|(after, before)| after.saturating_sub(before));
        let size = std::fs::metadata(&db_path).map(|m| m.len()).unwrap_or(0);
        println!(
            "{name} {:>9.0} events/s ({n} in {secs:.2} s; file {:.0} B/event{})",
            n as f64 / secs,
            size as f64 / n as f64,
            written.map_or(String::new(), |w| format!(
                ", written to disk {:.0} B/event",
                w as f64 / n as f64
            ))
        );
        db.close().unwrap();
        std::fs::remove_file(&db_path).unwrap();
    }
}
