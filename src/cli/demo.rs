//! `demo`: the whole story on a built-in simulated cluster, with figures.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use durable_informer::informer::{handler_fn, Event, HandlerOptions, Informer};
use durable_informer::sim::workload::{Churn, ChurnStats, WorkloadGen};
use durable_informer::sim::{Counters, Sim, SimConfig};
use durable_informer::source::KubeSource;
use durable_informer::store::{DurableStore, Indexer, StoreConfig};
use indicatif::ProgressBar;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use serde_json::json;

use super::output::Format;
use super::progress::bar;
use super::{CliError, CliResult, Size};

#[derive(Default)]
struct Tally {
    adds: AtomicU64,
    updates: AtomicU64,
    deletes: AtomicU64,
    unknown_deletes: AtomicU64,
}

impl Tally {
    fn total(&self) -> u64 {
        self.adds.load(Ordering::Relaxed) + self.updates.load(Ordering::Relaxed) + self.deletes.load(Ordering::Relaxed)
    }
    fn reset(&self) {
        for c in [&self.adds, &self.updates, &self.deletes, &self.unknown_deletes] {
            c.store(0, Ordering::Relaxed);
        }
    }
    fn get(&self) -> (u64, u64, u64, u64) {
        (
            self.adds.load(Ordering::Relaxed),
            self.updates.load(Ordering::Relaxed),
            self.deletes.load(Ordering::Relaxed),
            self.unknown_deletes.load(Ordering::Relaxed),
        )
    }
}

struct Plan {
    pods: usize,
    namespaces: usize,
    churn: usize,
    down: usize,
}

fn plan(size: Size) -> Plan {
    match size {
        Size::Small => Plan {
            pods: 1_000,
            namespaces: 5,
            churn: 300,
            down: 200,
        },
        Size::Medium => Plan {
            pods: 20_000,
            namespaces: 50,
            churn: 2_000,
            down: 1_000,
        },
        Size::Large => Plan {
            pods: 100_000,
            namespaces: 100,
            churn: 5_000,
            down: 2_000,
        },
    }
}

fn sim_err(e: impl std::fmt::Display) -> CliError {
    CliError::runtime(format!("simulated cluster: {e}"))
}

struct Running {
    db: DurableStore,
    informer: Informer<Pod>,
}

async fn start(path: &std::path::Path, sim: &Sim, tally: &Arc<Tally>) -> CliResult<Running> {
    let p = path.to_owned();
    let db = tokio::task::spawn_blocking(move || DurableStore::open(StoreConfig::new(p)))
        .await
        .map_err(CliError::runtime)??;
    let client = sim.client().map_err(sim_err)?;
    let source = KubeSource::typed::<Pod>(client, &sim.url());
    let informer = Informer::<Pod>::builder(&db, source)
        .indexer(Indexer::labels())
        .build()
        .await?;
    let t = tally.clone();
    informer.add_event_handler(
        handler_fn(move |ev: Event<Pod>| -> Result<(), std::convert::Infallible> {
            match ev {
                Event::Add { .. } => t.adds.fetch_add(1, Ordering::Relaxed),
                Event::Update { .. } => t.updates.fetch_add(1, Ordering::Relaxed),
                Event::Delete {
                    final_state_unknown, ..
                } => {
                    if final_state_unknown {
                        t.unknown_deletes.fetch_add(1, Ordering::Relaxed);
                    }
                    t.deletes.fetch_add(1, Ordering::Relaxed)
                }
            };
            Ok(())
        }),
        HandlerOptions::durable("demo-audit"),
    );
    informer.start();
    Ok(Running { db, informer })
}

async fn stop(r: Running) -> CliResult {
    r.informer.shutdown().await.map_err(CliError::runtime)?;
    drop(r.informer);
    let db = r.db;
    tokio::task::spawn_blocking(move || db.close())
        .await
        .map_err(CliError::runtime)??;
    Ok(())
}

/// Waits until the store's RV reaches the sim's and the handler saw `events` events.
async fn caught_up(r: &Running, sim: &Sim, tally: &Tally, events: u64, pb: &ProgressBar) -> CliResult {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let rv = r
            .informer
            .last_synced_resource_version()
            .and_then(|v| v.as_u64())
            .unwrap_or(0);
        pb.set_position(tally.total().min(pb.length().unwrap_or(u64::MAX)));
        if r.informer.has_synced() && rv >= sim.current_rv() && tally.total() >= events {
            pb.finish_and_clear();
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(CliError::runtime(format!(
                "the informer did not catch up within 10 minutes (store RV {rv}, server RV {}): {:?}",
                sim.current_rv(),
                r.informer.errors()
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// How the server was asked for the full state, from its counters (a probe LIST returns at
/// most one object and is not counted as a list).
fn how_listed(before: Counters, after: Counters) -> String {
    let objects = after.list_objects - before.list_objects;
    let requests = after.list_requests - before.list_requests;
    if objects > 1 {
        format!("paginated LIST of {objects} objects in {requests} requests")
    } else {
        format!(
            "streaming list (one WATCH with sendInitialEvents, {} events)",
            after.watch_events - before.watch_events
        )
    }
}

fn delta(before: Counters, after: Counters) -> serde_json::Value {
    json!({
        "listRequests": after.list_requests - before.list_requests,
        "listedObjects": after.list_objects - before.list_objects,
        "watchRequests": after.watch_requests - before.watch_requests,
        "watchEvents": after.watch_events - before.watch_events,
        "bytesServed": after.bytes_served - before.bytes_served,
    })
}

async fn churn(ch: Churn, sim: &Arc<Sim>, ops: usize) -> CliResult<(Churn, ChurnStats)> {
    let sim = sim.clone();
    tokio::task::spawn_blocking(move || {
        let mut ch = ch;
        let stats = ch.step(&sim, ops).map_err(sim_err)?;
        Ok((ch, stats))
    })
    .await
    .map_err(CliError::runtime)?
}

async fn server_state(sim: &Sim) -> CliResult<BTreeMap<String, String>> {
    let api: Api<Pod> = Api::all(sim.client().map_err(sim_err)?);
    let list = api.list(&ListParams::default()).await.map_err(sim_err)?;
    Ok(list
        .items
        .into_iter()
        .map(|p| {
            (
                format!(
                    "{}/{}",
                    p.metadata.namespace.unwrap_or_default(),
                    p.metadata.name.unwrap_or_default()
                ),
                p.metadata.resource_version.unwrap_or_default(),
            )
        })
        .collect())
}

fn store_state(r: &Running) -> CliResult<BTreeMap<String, String>> {
    Ok(r.informer
        .store()
        .list()?
        .into_iter()
        .map(|o| (o.key.to_string(), o.meta.resource_version.0))
        .collect())
}

/// Counts the differences between two states: (added, changed, deleted).
fn diff(old: &BTreeMap<String, String>, new: &BTreeMap<String, String>) -> (u64, u64, u64) {
    let added = new.keys().filter(|k| !old.contains_key(*k)).count() as u64;
    let deleted = old.keys().filter(|k| !new.contains_key(*k)).count() as u64;
    let changed = new.iter().filter(|(k, v)| old.get(*k).is_some_and(|o| o != *v)).count() as u64;
    (added, changed, deleted)
}

#[allow(clippy::too_many_lines)] // one story, told top to bottom
pub async fn run(size: Size, db: Option<PathBuf>, keep: bool, output: &Format) -> CliResult {
    let plan = plan(size);
    let human = *output != Format::Json;
    let say = |s: String| -> CliResult {
        if human {
            outln!("{s}")?;
        }
        Ok(())
    };
    // A temporary directory only when no --db was given, removed at the end unless --keep.
    let (path, cleanup) = match db {
        Some(p) => (p, TempDir(None)),
        None => {
            let tmp = tempfile_dir()?;
            let path = tmp.join("demo.redb");
            (path, TempDir((!keep).then_some(tmp)))
        }
    };
    let kept = cleanup.0.is_none();

    // The simulated cluster.
    let t0 = Instant::now();
    let sim = tokio::task::spawn_blocking(move || -> Result<Sim, CliError> {
        let sim = Sim::start(SimConfig::default().bookmark_interval(Duration::from_secs(1))).map_err(sim_err)?;
        super::sim::generate(&sim, plan.pods, plan.namespaces)?;
        Ok(sim)
    })
    .await
    .map_err(CliError::runtime)??;
    let sim = Arc::new(sim);
    let ns_names: Vec<String> = WorkloadGen::new(42).namespaces(plan.namespaces).namespace_names();
    say(format!(
        "simulated cluster at {}: {} Pods in {} namespaces (generated in {:.1?})",
        sim.url(),
        plan.pods,
        plan.namespaces,
        t0.elapsed()
    ))?;
    say(format!("database: {}", path.display()))?;

    let tally = Arc::new(Tally::default());
    let mut report = serde_json::Map::new();

    // 1. Cold start: a full LIST into the database.
    let c0 = sim.counters();
    let t = Instant::now();
    let r = start(&path, &sim, &tally).await?;
    let pb = bar(plan.pods as u64, "initial sync");
    caught_up(&r, &sim, &tally, plan.pods as u64, &pb).await?;
    let cold = t.elapsed();
    let c1 = sim.counters();
    say(format!(
        "1. cold start        {:>8.2?}  initial list: {}; handler got {} adds",
        cold,
        how_listed(c0, c1),
        tally.get().0
    ))?;
    report.insert(
        "coldStart".into(),
        json!({"seconds": cold.as_secs_f64(), "server": delta(c0, c1)}),
    );

    // 2. Churn while running.
    let ch = Churn::new(7, "pods", ns_names.clone()).mix(2, 6, 2);
    let mut ch = ch;
    {
        let s = sim.clone();
        ch = tokio::task::spawn_blocking(move || {
            let mut ch = ch;
            ch.adopt_existing(&s).map(|()| ch)
        })
        .await
        .map_err(CliError::runtime)?
        .map_err(sim_err)?;
    }
    tally.reset();
    let t = Instant::now();
    let (ch2, stats) = churn(ch, &sim, plan.churn).await?;
    let ch = ch2;
    let pb = bar(plan.churn as u64, "live churn");
    caught_up(&r, &sim, &tally, plan.churn as u64, &pb).await?;
    say(format!(
        "2. live churn        {:>8.2?}  {} creates, {} updates, {} deletes delivered as {} events",
        t.elapsed(),
        stats.creates,
        stats.updates,
        stats.deletes,
        tally.total()
    ))?;
    stop(r).await?;

    // 3. Changes while the informer is down.
    let before_down = {
        let db = DurableStore::open(StoreConfig::new(&path))?;
        let scope = db
            .scopes()?
            .first()
            .map(|(id, _)| *id)
            .ok_or_else(|| CliError::runtime("no scope"))?;
        let m: BTreeMap<String, String> = db
            .store(scope)
            .list()?
            .into_iter()
            .map(|o| (o.key.to_string(), o.meta.resource_version.0))
            .collect();
        db.close()?;
        m
    };
    let (ch, down) = churn(ch, &sim, plan.down).await?;
    say(format!(
        "3. while down        {} creates, {} updates, {} deletes made on the server",
        down.creates, down.updates, down.deletes
    ))?;

    // 4. Restart: resume from the persisted RV, no LIST.
    tally.reset();
    let c0 = sim.counters();
    let t = Instant::now();
    let r = start(&path, &sim, &tally).await?;
    let readable = t.elapsed();
    let restored = r.informer.is_restored();
    let objects_at_open = r.informer.store().record()?.object_count;
    let want = down.creates + down.updates + down.deletes;
    let pb = bar(want, "resume");
    caught_up(&r, &sim, &tally, want, &pb).await?;
    let resume = t.elapsed();
    let c1 = sim.counters();
    let (a, u, d, _) = tally.get();
    say(format!(
        "4. restart           {:>8.2?}  store readable after {:.2?} ({} objects from disk, restored={})",
        resume, readable, objects_at_open, restored
    ))?;
    say(format!(
        "                               LIST requests: {} (the RV probe and the watch cache's revision, {} object), full LISTs: {}",
        c1.list_requests - c0.list_requests,
        c1.list_objects - c0.list_objects,
        u64::from(c1.list_objects - c0.list_objects > 1)
    ))?;
    say(format!(
        "                               missed changes delivered: {a} adds, {u} updates, {d} deletes ({} expected)",
        want
    ))?;
    if c1.list_objects - c0.list_objects > 1 || tally.total() != want {
        return Err(CliError::runtime(format!(
            "restart check failed: listed {} objects, delivered {} of {want} events",
            c1.list_objects - c0.list_objects,
            tally.total()
        )));
    }
    report.insert(
        "restart".into(),
        json!({"seconds": resume.as_secs_f64(), "readableAfterSeconds": readable.as_secs_f64(), "restored": restored,
               "server": delta(c0, c1), "delivered": {"adds": a, "updates": u, "deletes": d}, "missed": want}),
    );
    let before_compaction = store_state(&r)?;
    stop(r).await?;
    drop(before_down);

    // 5. Changes while down, then the server compacts its history: the resume gets 410.
    let (_ch, down2) = churn(ch, &sim, plan.down).await?;
    sim.compact();
    let after = server_state(&sim).await?;
    let (want_add, want_upd, want_del) = diff(&before_compaction, &after);
    tally.reset();
    let c0 = sim.counters();
    let t = Instant::now();
    let r = start(&path, &sim, &tally).await?;
    let want = want_add + want_upd + want_del;
    let pb = bar(want, "relist after 410");
    caught_up(&r, &sim, &tally, want, &pb).await?;
    let relist = t.elapsed();
    let c1 = sim.counters();
    let (a, u, d, unknown) = tally.get();
    say(format!(
        "5. 410 relist        {:>8.2?}  history compacted while down ({} ops): relisted by {}",
        relist,
        down2.creates + down2.updates + down2.deletes,
        how_listed(c0, c1)
    ))?;
    say(format!(
        "                               handler events: {a} adds, {u} updates, {d} deletes ({unknown} found by the relist) = the {} real differences, not {} objects",
        want,
        after.len()
    ))?;
    report.insert(
        "relist".into(),
        json!({"seconds": relist.as_secs_f64(), "server": delta(c0, c1), "delivered": {"adds": a, "updates": u, "deletes": d},
               "differences": want, "objects": after.len()}),
    );
    let ours = store_state(&r)?;
    let equal = ours == server_state(&sim).await?;
    stop(r).await?;
    say(format!(
        "6. verification                store equals the server's LIST: {}",
        if equal { "yes" } else { "NO" }
    ))?;
    report.insert("storeEqualsServer".into(), json!(equal));
    report.insert(
        "database".into(),
        json!({"path": path.display().to_string(), "kept": kept}),
    );
    if kept {
        say(format!(
            "database kept: {p}\n  look at it with: durable-informer get pods --db {p}   (or list, history, stats, check)",
            p = path.display()
        ))?;
    }
    if !human {
        outln!("{}", serde_json::Value::Object(report))?;
    }
    drop(cleanup);
    if !equal || (a, u, d) != (want_add, want_upd, want_del) {
        return Err(CliError::runtime("the relist did not report exactly the differences"));
    }
    Ok(())
}

/// Removes the demo's temporary directory when dropped.
struct TempDir(Option<PathBuf>);

impl Drop for TempDir {
    fn drop(&mut self) {
        if let Some(d) = &self.0 {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// A new private (0700) temporary directory for the demo's database: never one a kept demo
/// left behind.
fn tempfile_dir() -> CliResult<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let base = std::env::temp_dir();
    let pid = std::process::id();
    for n in 0..1000 {
        let dir = base.join(match n {
            0 => format!("durable-informer-demo-{pid}"),
            _ => format!("durable-informer-demo-{pid}-{n}"),
        });
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(CliError::runtime(format!("{}: {e}", dir.display()))),
        }
    }
    Err(CliError::runtime(format!(
        "no free name for the demo's directory in {}",
        base.display()
    )))
}
