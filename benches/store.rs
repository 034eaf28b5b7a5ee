//! Store benchmarks, one group per stage: metadata extraction against a typed decode
//! (`decode`), compression and decompression (`codec`), label-index queries (`index`), durable
//! batch apply of ~5 KB Pods in batches of 1, 100 and 1000 with a label index (`ingest`), and
//! reads: point get, a namespace list, a label-index query (`read`), and what
//! `StoreConfig::live_inspection(true)` costs the writer against the default (`live_inspection`).
//!
//! `cargo bench --bench store` (about 4 minutes). Filter with criterion's usual argument, e.g.
//! `cargo bench --bench store -- ingest/zstd-dict`. Besides criterion's timings it prints bytes
//! written per event and the database size against the JSON ingested, for each compression.

#![allow(missing_docs)] // criterion_group! generates an undocumented function

use std::hint::black_box;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use durable_informer::object::{extract_meta, ObjectKey, RawObject, ScopeSpec};
use durable_informer::store::{Batch, Compression, DeltaKind, DurableStore, Indexer, StoreConfig, LABELS};

/// Objects per namespace in the read benchmarks (and the ingest key space per namespace).
const PER_NS: u64 = 2_000;
/// Namespaces in the ingest key space.
const NAMESPACES: u64 = 5;

/// A deterministic, realistic Pod of about 5 KB: managedFields, labels, ownerReferences,
/// three containers with env, status with conditions and container statuses. `version`
/// changes the RV, a few status fields and the timestamps, as a real update would.
fn pod_json(i: u64, version: u64, rv: u64) -> Vec<u8> {
    let ns = format!("team-{}", i / PER_NS % NAMESPACES);
    let app = format!("app-{}", i % 40);
    let rs = format!("{app}-{:x}", 0x5f7d_9c4b_u64.wrapping_mul(i % 40 + 1) & 0xff_ffff);
    let name = format!("{rs}-{:05x}", i.wrapping_mul(2_654_435_761) & 0xf_ffff);
    let uid = format!(
        "{:08x}-{:04x}-4{:03x}-a{:03x}-{:012x}",
        i.wrapping_mul(0x9e37_79b9) & 0xffff_ffff,
        i & 0xffff,
        (i >> 4) & 0xfff,
        (i >> 8) & 0xfff,
        i.wrapping_mul(0x0001_0000_0193) & 0xffff_ffff_ffff
    );
    let ts = |s: u64| {
        let t = 1_760_000_000 + i * 7 + s;
        format!(
            "2025-10-{:02}T{:02}:{:02}:{:02}Z",
            1 + (t / 86_400) % 28,
            (t / 3600) % 24,
            (t / 60) % 60,
            t % 60
        )
    };
    let containers: Vec<String> = (0..3)
        .map(|c| {
            let env: Vec<String> = (0..6)
                .map(|e| {
                    format!(r#"{{"name":"{}_VAR_{e}","value":"value-{c}-{e}-{}"}}"#, ["LOG", "DB", "CACHE"][c], i % 13)
                })
                .collect();
            format!(
                r#"{{"name":"{}","image":"registry.example.com/{app}/{}:v1.{}.{}","imagePullPolicy":"IfNotPresent","ports":[{{"name":"http","containerPort":{},"protocol":"TCP"}}],"env":[{}],"resources":{{"limits":{{"cpu":"{}m","memory":"{}Mi"}},"requests":{{"cpu":"{}m","memory":"{}Mi"}}}},"volumeMounts":[{{"name":"kube-api-access-{:05x}","readOnly":true,"mountPath":"/var/run/secrets/kubernetes.io/serviceaccount"}}],"livenessProbe":{{"httpGet":{{"path":"/healthz","port":{},"scheme":"HTTP"}},"initialDelaySeconds":10,"timeoutSeconds":1,"periodSeconds":10,"successThreshold":1,"failureThreshold":3}},"terminationMessagePath":"/dev/termination-log","terminationMessagePolicy":"File"}}"#,
                ["main", "sidecar", "metrics"][c],
                ["server", "proxy", "exporter"][c],
                i % 7,
                c,
                8080 + c,
                env.join(","),
                100 * (c + 1),
                128 * (c + 1),
                50 * (c + 1),
                64 * (c + 1),
                i & 0xfffff,
                8080 + c
            )
        })
        .collect();
    let statuses: Vec<String> = (0..3)
        .map(|c| {
            format!(
                r#"{{"name":"{}","state":{{"running":{{"startedAt":"{}"}}}},"lastState":{{}},"ready":true,"restartCount":{},"image":"registry.example.com/{app}/{}:v1.{}.{c}","imageID":"registry.example.com/{app}/{}@sha256:{:016x}{:016x}","containerID":"containerd://{:016x}{:016x}","started":true}}"#,
                ["main", "sidecar", "metrics"][c],
                ts(30 + version),
                version % 3,
                ["server", "proxy", "exporter"][c],
                i % 7,
                ["server", "proxy", "exporter"][c],
                i.wrapping_mul(0x1234_5678_9abc_def1),
                c as u64 ^ 0xdead_beef,
                i.wrapping_mul(0x0fed_cba9_8765_4321) ^ version,
                c as u64
            )
        })
        .collect();
    let conditions: Vec<String> = [
        "PodReadyToStartContainers",
        "Initialized",
        "Ready",
        "ContainersReady",
        "PodScheduled",
    ]
    .iter()
    .enumerate()
    .map(|(k, t)| {
        format!(
            r#"{{"type":"{t}","status":"True","lastProbeTime":null,"lastTransitionTime":"{}"}}"#,
            ts(k as u64 + version)
        )
    })
    .collect();
    let json = format!(
        r#"{{"kind":"Pod","apiVersion":"v1","metadata":{{"name":"{name}","generateName":"{rs}-","namespace":"{ns}","uid":"{uid}","resourceVersion":"{rv}","creationTimestamp":"{}","labels":{{"app":"{app}","pod-template-hash":"{:x}","tier":"{}","version":"v{}"}},"annotations":{{"kubectl.kubernetes.io/restartedAt":"{}","prometheus.io/scrape":"true"}},"ownerReferences":[{{"apiVersion":"apps/v1","kind":"ReplicaSet","name":"{rs}","uid":"{:08x}-0000-4000-8000-{:012x}","controller":true,"blockOwnerDeletion":true}}],"managedFields":[{{"manager":"kube-controller-manager","operation":"Update","apiVersion":"v1","time":"{}","fieldsType":"FieldsV1","fieldsV1":{{"f:metadata":{{"f:generateName":{{}},"f:labels":{{".":{{}},"f:app":{{}},"f:pod-template-hash":{{}}}},"f:ownerReferences":{{".":{{}},"k:{{\"uid\":\"{uid}\"}}":{{}}}}}},"f:spec":{{"f:containers":{{"k:{{\"name\":\"main\"}}":{{".":{{}},"f:env":{{}},"f:image":{{}},"f:imagePullPolicy":{{}},"f:name":{{}},"f:ports":{{}},"f:resources":{{}}}}}},"f:dnsPolicy":{{}},"f:enableServiceLinks":{{}},"f:restartPolicy":{{}},"f:schedulerName":{{}},"f:securityContext":{{}},"f:terminationGracePeriodSeconds":{{}}}}}}}},{{"manager":"kubelet","operation":"Update","apiVersion":"v1","time":"{}","fieldsType":"FieldsV1","fieldsV1":{{"f:status":{{"f:conditions":{{"k:{{\"type\":\"ContainersReady\"}}":{{".":{{}},"f:lastProbeTime":{{}},"f:lastTransitionTime":{{}},"f:status":{{}},"f:type":{{}}}},"k:{{\"type\":\"Ready\"}}":{{".":{{}},"f:lastProbeTime":{{}},"f:lastTransitionTime":{{}},"f:status":{{}},"f:type":{{}}}}}},"f:containerStatuses":{{}},"f:hostIP":{{}},"f:phase":{{}},"f:podIP":{{}},"f:podIPs":{{}},"f:startTime":{{}}}}}},"subresource":"status"}}]}},"spec":{{"volumes":[{{"name":"kube-api-access-{:05x}","projected":{{"sources":[{{"serviceAccountToken":{{"expirationSeconds":3607,"path":"token"}}}},{{"configMap":{{"name":"kube-root-ca.crt","items":[{{"key":"ca.crt","path":"ca.crt"}}]}}}}],"defaultMode":420}}}}],"containers":[{}],"restartPolicy":"Always","terminationGracePeriodSeconds":30,"dnsPolicy":"ClusterFirst","serviceAccountName":"default","serviceAccount":"default","nodeName":"node-{:03}","securityContext":{{}},"schedulerName":"default-scheduler","tolerations":[{{"key":"node.kubernetes.io/not-ready","operator":"Exists","effect":"NoExecute","tolerationSeconds":300}},{{"key":"node.kubernetes.io/unreachable","operator":"Exists","effect":"NoExecute","tolerationSeconds":300}}],"priority":0,"enableServiceLinks":true,"preemptionPolicy":"PreemptLowerPriority"}},"status":{{"phase":"Running","conditions":[{}],"hostIP":"10.0.{}.{}","podIP":"10.244.{}.{}","podIPs":[{{"ip":"10.244.{}.{}"}}],"startTime":"{}","containerStatuses":[{}],"qosClass":"Burstable"}}}}"#,
        ts(0),
        0x5f7d_9c4b_u64.wrapping_mul(i % 40 + 1) & 0xff_ffff,
        ["frontend", "backend", "cache"][(i % 3) as usize],
        version % 4,
        ts(version * 60),
        i % 40,
        i.wrapping_mul(0x2545_f491) & 0xffff_ffff_ffff,
        ts(1),
        ts(20 + version),
        i & 0xfffff,
        containers.join(","),
        i % 97,
        conditions.join(","),
        i % 200,
        i % 250,
        (i / 250) % 250,
        i % 250,
        (i / 250) % 250,
        i % 250,
        ts(2),
        statuses.join(",")
    );
    json.into_bytes()
}

fn pod(i: u64, version: u64, rv: u64) -> RawObject {
    RawObject::from_json(pod_json(i, version, rv)).expect("pod json")
}

fn bench_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("store-bench");
    std::fs::create_dir_all(&dir).expect("bench dir");
    dir
}

struct Fixture {
    db: DurableStore,
    scope: durable_informer::store::ScopeId,
    path: PathBuf,
    /// Events generated so far (drives keys, versions and RVs).
    events: u64,
    /// Distinct keys: the first `keys` events are adds, later ones cycle through updates.
    keys: u64,
    json_bytes: u64,
}

impl Fixture {
    fn new(name: &str, compression: Compression, keys: u64) -> Self {
        Self::with_config(name, keys, |c| c.compression(compression))
    }

    fn with_config(name: &str, keys: u64, config: impl FnOnce(StoreConfig) -> StoreConfig) -> Self {
        let path = bench_dir().join(format!("{name}.redb"));
        let _ = std::fs::remove_file(&path);
        let db = DurableStore::open(config(StoreConfig::new(&path))).expect("open");
        let scope = db
            .writer()
            .register_scope_blocking(&ScopeSpec::new("", "v1", "pods"))
            .expect("scope");
        db.register_index(scope, Indexer::labels());
        db.writer().ensure_index_blocking(scope, LABELS.into()).expect("index");
        Self {
            db,
            scope,
            path,
            events: 0,
            keys,
            json_bytes: 0,
        }
    }

    /// The next `n` events as one batch: adds while the key space fills, then updates.
    fn next_batch(&mut self, n: u64) -> Batch {
        let mut batch = Batch::new(self.scope);
        for _ in 0..n {
            let e = self.events;
            self.events += 1;
            let i = e % self.keys;
            let version = e / self.keys;
            let rv = 1_000 + e;
            let kind = if version == 0 {
                DeltaKind::Added
            } else {
                DeltaKind::Updated
            };
            let obj = pod(i, version, rv);
            self.json_bytes += obj.bytes.len() as u64;
            batch = batch.delta(kind, obj).rv(rv.to_string());
        }
        batch
    }

    fn apply(&self, batch: Batch) {
        self.db.writer().apply_blocking(batch).expect("apply");
    }

    fn file_len(&self) -> u64 {
        std::fs::metadata(&self.path).map(|m| m.len()).unwrap_or(0)
    }
}

fn variants() -> Vec<(&'static str, Compression)> {
    let mut v = vec![("none", Compression::None), ("zstd3", Compression::Zstd(3))];
    v.extend(extra_variants());
    v
}

/// Compression settings added after the first version of this bench.
fn extra_variants() -> Vec<(&'static str, Compression)> {
    // zstd3-dict measured the same size as zstd1-dict; left out to keep the run short.
    vec![("zstd1-dict", Compression::ZstdDict(1))]
}

/// Ingest throughput (events/s) at three batch sizes, per compression.
fn ingest(c: &mut Criterion) {
    let mut g = c.benchmark_group("ingest");
    g.sample_size(10);
    g.warm_up_time(Duration::from_millis(500));
    for (label, compression) in variants() {
        for batch in [1u64, 100, 1000] {
            g.throughput(Throughput::Elements(batch));
            g.measurement_time(Duration::from_secs(if batch == 1 { 2 } else { 4 }));
            let mut fx = Fixture::new(&format!("ingest-{label}-{batch}"), compression, 10_000);
            // Fill the key space first so measured batches mix adds and updates realistically.
            let prefill = if batch == 1 { 200 } else { 2_000 };
            let b = fx.next_batch(prefill);
            fx.apply(b);
            g.bench_with_input(BenchmarkId::new(label, batch), &batch, |bch, &n| {
                bch.iter_custom(|iters| {
                    let mut spent = Duration::ZERO;
                    for _ in 0..iters {
                        let b = fx.next_batch(n);
                        let t = Instant::now();
                        fx.apply(b);
                        spent += t.elapsed();
                    }
                    spent
                });
            });
        }
    }
    g.finish();
}

/// What `StoreConfig::live_inspection(true)` costs the writer: watch batches (deferred fsync,
/// as the reflector sends them) of 1 and 100 Pods, and a point read, with the default
/// (exclusive file, fsyncs grouped within `fsync_delay`) and with live inspection (every
/// commit fsynced, byte-range locks for other processes' readers), in one run.
fn live_inspection(c: &mut Criterion) {
    let mut g = c.benchmark_group("live_inspection");
    g.sample_size(10);
    g.warm_up_time(Duration::from_millis(500));
    for (label, live) in [("default", false), ("live", true)] {
        for batch in [1u64, 100] {
            g.throughput(Throughput::Elements(batch));
            g.measurement_time(Duration::from_secs(4));
            let mut fx = Fixture::with_config(&format!("live-{label}-{batch}"), 10_000, |c| c.live_inspection(live));
            let b = fx.next_batch(2_000);
            fx.apply(b);
            g.bench_with_input(
                BenchmarkId::new(format!("watch_batch/{label}"), batch),
                &batch,
                |bch, &n| {
                    bch.iter_custom(|iters| {
                        let mut spent = Duration::ZERO;
                        for _ in 0..iters {
                            let b = fx.next_batch(n).deferred_fsync();
                            let t = Instant::now();
                            fx.apply(b);
                            spent += t.elapsed();
                        }
                        spent
                    });
                },
            );
            if batch == 1 {
                let store = fx.db.store(fx.scope);
                let key = ObjectKey::namespaced("team-0", "probe");
                let keys = store.list_keys().expect("keys");
                let key = keys.first().cloned().unwrap_or(key);
                g.throughput(Throughput::Elements(1));
                g.bench_function(BenchmarkId::new("get", label), |b| {
                    b.iter(|| black_box(store.get(&key).expect("get")));
                });
            }
        }
    }
    g.finish();
}

/// Bytes this process has written to storage (`write_bytes` of `/proc/self/io`), if known.
fn io_written() -> Option<u64> {
    let io = std::fs::read_to_string("/proc/self/io").ok()?;
    io.lines()
        .find_map(|l| l.strip_prefix("write_bytes:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Bytes written per event and database size against the JSON ingested: 20,000 events in
/// batches of 1000 (10,000 adds, then 10,000 updates), every version retained in the log.
fn footprint(_c: &mut Criterion) {
    for (label, compression) in variants() {
        let mut fx = Fixture::new(&format!("footprint-{label}"), compression, 10_000);
        let before = fx.file_len();
        let io_before = io_written();
        let t = Instant::now();
        for _ in 0..20 {
            let b = fx.next_batch(1_000);
            fx.apply(b);
        }
        let secs = t.elapsed().as_secs_f64();
        let grown = fx.file_len() - before;
        let written = io_written().zip(io_before).map_or(f64::NAN, |(a, b)| (a - b) as f64);
        println!(
            "footprint/{label}: {} events, {:.0} events/s, written {:.0} B/event, file grew {} B = {:.0} B/event; JSON {:.0} B/event; db/json = {:.3}",
            fx.events,
            fx.events as f64 / secs,
            written / fx.events as f64,
            grown,
            grown as f64 / fx.events as f64,
            fx.json_bytes as f64 / fx.events as f64,
            fx.file_len() as f64 / fx.json_bytes as f64
        );
        let _ = std::fs::remove_file(&fx.path);
    }
}

/// Point reads, a 2,000-object namespace list and a label query.
fn reads(c: &mut Criterion) {
    let mut g = c.benchmark_group("read");
    g.sample_size(20);
    g.warm_up_time(Duration::from_millis(300));
    g.measurement_time(Duration::from_secs(2));
    for (label, compression) in variants() {
        // Two namespaces of 2,000 Pods each.
        let mut fx = Fixture::new(&format!("read-{label}"), compression, 2 * PER_NS);
        for _ in 0..4 {
            let b = fx.next_batch(1_000);
            fx.apply(b);
        }
        let store = fx.db.store(fx.scope);
        let keys = store.list_keys().expect("keys");
        assert_eq!(keys.len() as u64, 2 * PER_NS);
        let mut k = 0usize;
        g.throughput(Throughput::Elements(1));
        g.bench_function(BenchmarkId::new("get", label), |b| {
            b.iter(|| {
                k = (k + 7919) % keys.len();
                black_box(store.get(&keys[k]).expect("get").expect("present"))
            });
        });
        g.throughput(Throughput::Elements(PER_NS));
        g.bench_function(BenchmarkId::new("list_namespace_2000", label), |b| {
            b.iter(|| {
                let v = store.list_namespace("team-1").expect("list");
                assert_eq!(v.len() as u64, PER_NS);
                black_box(v)
            });
        });
        // app-7 is on 1 in 40 Pods: 100 objects.
        g.throughput(Throughput::Elements(100));
        g.bench_function(BenchmarkId::new("by_index_label_100", label), |b| {
            b.iter(|| {
                let v = store.by_index(LABELS, "app=app-7").expect("index");
                assert_eq!(v.len(), 100);
                black_box(v)
            });
        });
        let _ = black_box(ObjectKey::parse("team-0/x"));
        drop(store);
        let path = fx.path.clone();
        drop(fx);
        let _ = std::fs::remove_file(&path);
    }
    g.finish();
}

/// The codec stage on one ~5 KB Pod: `Compression::compress` (what the writer does per object
/// without a dictionary) at zstd levels 1 and 3, and decompression of the result with zstd's
/// one-shot API (the library's reader path, `codec::decompress`, is not public).
fn codec(c: &mut Criterion) {
    let json = pod_json(12_345, 3, 99_999);
    let mut g = c.benchmark_group("codec");
    g.sample_size(30);
    g.warm_up_time(Duration::from_millis(300));
    g.measurement_time(Duration::from_secs(2));
    g.throughput(Throughput::Bytes(json.len() as u64));
    for level in [1, 3] {
        let compression = Compression::Zstd(level);
        let packed = compression.compress(&json).expect("compress");
        println!(
            "codec: zstd{level} {} -> {} bytes ({:.2})",
            json.len(),
            packed.len(),
            packed.len() as f64 / json.len() as f64
        );
        g.bench_function(BenchmarkId::new("compress", format!("zstd{level}")), |b| {
            b.iter(|| black_box(compression.compress(black_box(&json)).expect("compress")))
        });
        g.bench_function(BenchmarkId::new("decompress", format!("zstd{level}")), |b| {
            b.iter(|| black_box(zstd::bulk::decompress(black_box(&packed), json.len()).expect("decompress")))
        });
    }
    g.bench_function("raw_object_from_json", |b| {
        b.iter(|| black_box(RawObject::from_json(black_box(json.clone())).expect("raw")))
    });
    g.finish();
}

/// Index queries on 4,000 Pods (label index): the matching keys only, and keys plus objects.
fn index_query(c: &mut Criterion) {
    let mut g = c.benchmark_group("index");
    g.sample_size(20);
    g.warm_up_time(Duration::from_millis(300));
    g.measurement_time(Duration::from_secs(2));
    let mut fx = Fixture::new("index", Compression::ZstdDict(1), 2 * PER_NS);
    for _ in 0..4 {
        let b = fx.next_batch(1_000);
        fx.apply(b);
    }
    let store = fx.db.store(fx.scope);
    // app-7 is on 1 in 40 Pods (100 objects); tier=frontend on 1 in 3.
    for (value, want) in [("app=app-7", 100usize), ("tier=frontend", 1_334)] {
        g.throughput(Throughput::Elements(want as u64));
        g.bench_function(BenchmarkId::new("keys", value), |b| {
            b.iter(|| {
                let v = store.index_keys(LABELS, value).expect("index keys");
                assert_eq!(v.len(), want);
                black_box(v)
            });
        });
        g.bench_function(BenchmarkId::new("objects", value), |b| {
            b.iter(|| {
                let v = store.by_index(LABELS, value).expect("index");
                assert_eq!(v.len(), want);
                black_box(v)
            });
        });
    }
    g.bench_function("list_index_values", |b| {
        b.iter(|| black_box(store.list_index_values(LABELS).expect("values")))
    });
    drop(store);
    let path = fx.path.clone();
    drop(fx);
    let _ = std::fs::remove_file(&path);
    g.finish();
}

/// Metadata extraction against decoding the whole Pod into the typed struct.
fn decode(c: &mut Criterion) {
    let json = pod_json(12_345, 3, 99_999);
    println!("pod JSON: {} bytes", json.len());
    let mut g = c.benchmark_group("decode");
    g.sample_size(30);
    g.warm_up_time(Duration::from_millis(300));
    g.measurement_time(Duration::from_secs(2));
    g.throughput(Throughput::Bytes(json.len() as u64));
    g.bench_function("extract_meta", |b| {
        b.iter(|| black_box(extract_meta(black_box(&json)).expect("meta")))
    });
    g.bench_function("typed_pod", |b| {
        b.iter(|| black_box(serde_json::from_slice::<k8s_openapi::api::core::v1::Pod>(black_box(&json)).expect("pod")))
    });
    g.finish();
}

criterion_group!(
    benches,
    decode,
    codec,
    index_query,
    footprint,
    ingest,
    reads,
    live_inspection
);
criterion_main!(benches);
