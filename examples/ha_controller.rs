//! Several replicas of one controller: leader election over a `coordination.k8s.io/v1` Lease,
//! warm standbys, and the failover harness behind the README's figures.
//!
//! The controller copies each ConfigMap's `data.gen` to its annotation
//! `ha.example.com/observed`. Every replica runs its informer (a warm cache in its own
//! database); only the leader reconciles. Each replica is a separate process, so the harness
//! can SIGKILL, SIGSTOP and SIGTERM them.
//!
//! ```text
//! cargo run --release --features sim --example ha_controller                      # the failover demo (client-go's timings: lease 15 s)
//! cargo run --release --features sim --example ha_controller -- chaos --rounds 200
//! cargo run --release --features sim --example ha_controller -- replica --server URL --id a --db a.redb
//! ```
//!
//! `failover` (the default) starts the simulated cluster and three replicas, SIGKILLs the
//! leader and times the first reconcile by the next one, restarts it, then stops the new
//! leader cleanly (the Lease is released) and times the takeover again. `chaos` kills, pauses
//! and stops replicas at random (3 to 10 of them) while a writer changes ConfigMaps, then
//! counts the moments two replicas reconciled the same key at once, whether their writes ever
//! interleaved (told by the resourceVersions they wrote), and whether every key converged. Each prints `figure <name> <value>` lines. Options: `--lease-ms`, `--renew-ms`,
//! `--retry-ms`, `--keys`, `--rounds`, `--seed`.

#![allow(missing_docs)] // an example; its items are described in the module docs

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use durable_informer::controller::{default_error_policy, Action, Controller};
use durable_informer::informer::Informer;
use durable_informer::leader::{KubeLeaseLock, LeaderElectionConfig, LeaderElector, Leadership};
use durable_informer::object::ObjectKey;
use durable_informer::store::{DurableStore, StoreConfig};
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use rand::{Rng, SeedableRng};
use serde_json::json;

type Error = Box<dyn std::error::Error + Send + Sync>;

const NS: &str = "default";
const LEASE: &str = "ha-controller";
const OBSERVED: &str = "ha.example.com/observed";

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// `--name value` from the command line.
fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

fn arg_ms(args: &[String], name: &str, default: u64) -> Result<Duration, Error> {
    Ok(Duration::from_millis(match arg(args, name) {
        Some(v) => v.parse().map_err(|e| format!("{name} {v:?}: {e}"))?,
        None => default,
    }))
}

fn timings(args: &[String], lease: u64, renew: u64, retry: u64) -> Result<LeaderElectionConfig, Error> {
    Ok(LeaderElectionConfig {
        lease_duration: arg_ms(args, "--lease-ms", lease)?,
        renew_deadline: arg_ms(args, "--renew-ms", renew)?,
        retry_period: arg_ms(args, "--retry-ms", retry)?,
        release_on_cancel: true,
    })
}

// ---------------------------------------------------------------------------------------------
// One replica.

pub struct Ctx {
    client: kube::Client,
    id: String,
    leadership: Leadership,
}

/// Reconciles one key and prints `R <replica> <key> <start ns> <end ns> <outcome>`.
async fn reconcile(cm: Arc<ConfigMap>, ctx: Arc<Ctx>) -> Result<Action, StepError> {
    let start = now_ns();
    let key = ObjectKey {
        namespace: cm.metadata.namespace.clone(),
        name: cm.metadata.name.clone().unwrap_or_default(),
    };
    let outcome = step(&key, &cm, &ctx).await;
    let word = match &outcome {
        Ok(Some(rv)) => format!("wrote:{rv}"),
        Ok(None) => "noop".into(),
        Err(e) if e.contains("409") || e.contains("onflict") => "conflict".into(),
        Err(_) => "error".into(),
    };
    println!("R {} {key} {start} {} {word}", ctx.id, now_ns());
    outcome.map(|_| Action::await_change()).map_err(StepError)
}

/// A failed step, as text.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct StepError(String);

/// The resourceVersion written, if it wrote.
async fn step(key: &ObjectKey, cm: &ConfigMap, ctx: &Ctx) -> Result<Option<u64>, String> {
    let gen = cm.data.as_ref().and_then(|d| d.get("gen")).cloned();
    let observed = cm.metadata.annotations.as_ref().and_then(|a| a.get(OBSERVED)).cloned();
    if gen.is_none() || gen == observed {
        return Ok(None);
    }
    // A replica that was paused past its term must not write: the term is checked on the
    // monotonic clock, and the resourceVersion precondition refuses a write over a newer state.
    if !ctx.leadership.is_leading() {
        return Err("no longer leading".into());
    }
    let patch = json!({"metadata": {
        "resourceVersion": cm.metadata.resource_version,
        "annotations": {OBSERVED: gen, "ha.example.com/by": ctx.id},
    }});
    let written = Api::<ConfigMap>::namespaced(ctx.client.clone(), NS)
        .patch(&key.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| e.to_string())?;
    Ok(written.metadata.resource_version.and_then(|rv| rv.parse().ok()))
}

/// Runs one replica until SIGTERM (a clean stop: the Lease is released) or SIGKILL.
async fn replica(args: &[String]) -> Result<(), Error> {
    let server = arg(args, "--server").ok_or("replica: --server URL is required")?;
    let id = arg(args, "--id").ok_or("replica: --id NAME is required")?;
    let db_path = PathBuf::from(arg(args, "--db").ok_or("replica: --db FILE is required")?);
    let config = timings(args, 15_000, 10_000, 2_000)?;
    let uri: http::Uri = server.parse()?;
    let client = kube::Client::try_from(kube::Config::new(uri))?;
    let db = tokio::task::spawn_blocking(move || DurableStore::open(StoreConfig::new(db_path))).await??;
    let configmaps = Informer::from_api(&db, Api::<ConfigMap>::namespaced(client.clone(), NS))
        .build()
        .await?;
    let elector = LeaderElector::new(KubeLeaseLock::new(client.clone(), NS, LEASE, &id), config);
    let leadership = elector.fenced_leadership();
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::spawn(async move {
        term.recv().await;
        let _ = stop_tx.send(true);
    });
    let elector_task = tokio::spawn(elector.run(stop.clone()));
    let mut flag = leadership.flag();
    let who = id.clone();
    tokio::spawn(async move {
        loop {
            let leading = *flag.borrow_and_update();
            println!("L {who} {} {leading}", now_ns());
            if flag.changed().await.is_err() {
                break;
            }
        }
    });
    let synced = configmaps.clone();
    let who = id.clone();
    tokio::spawn(async move {
        if synced.wait_for_sync().await.is_ok() {
            println!("S {who} {}", now_ns());
        }
    });
    let ctx = Arc::new(Ctx {
        client,
        id,
        leadership: leadership.clone(),
    });
    let mut stopping = stop.clone();
    Controller::for_informer(configmaps.clone())
        .name("ha-controller")
        .leader_election(leadership)
        .graceful_shutdown_on(async move {
            let _ = stopping.wait_for(|s| *s).await;
        })
        .run(reconcile, default_error_policy, ctx)
        .for_each(|_| async {})
        .await;
    elector_task.await??;
    configmaps.shutdown().await?;
    drop(configmaps);
    tokio::task::spawn_blocking(move || db.close()).await??;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The harness: a simulated cluster and replica processes.

#[derive(Debug, Clone)]
enum Line {
    /// A reconcile: replica, key, start, end, outcome.
    Reconcile(String, String, u64, u64, String),
    /// Leadership changed: replica, leading.
    Leading(String, bool),
    /// The replica's cache synced.
    Synced,
}

fn parse(line: &str) -> Option<Line> {
    let f: Vec<&str> = line.split_whitespace().collect();
    match f.as_slice() {
        ["R", id, key, start, end, outcome] => Some(Line::Reconcile(
            (*id).to_owned(),
            (*key).to_owned(),
            start.parse().ok()?,
            end.parse().ok()?,
            (*outcome).to_owned(),
        )),
        ["L", id, _at, leading] => Some(Line::Leading((*id).to_owned(), *leading == "true")),
        ["S", _id, _at] => Some(Line::Synced),
        _ => None,
    }
}

struct Fleet {
    exe: PathBuf,
    server: String,
    dir: PathBuf,
    config: LeaderElectionConfig,
    running: BTreeMap<String, Child>,
    paused: Vec<String>,
    log: Arc<Mutex<Vec<Line>>>,
}

impl Fleet {
    fn lines(&self) -> Vec<Line> {
        self.log
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn start(&mut self, id: &str) -> Result<(), Error> {
        let ms = |d: Duration| d.as_millis().to_string();
        let mut child = Command::new(&self.exe)
            .args(["replica", "--server", &self.server, "--id", id, "--db"])
            .arg(self.dir.join(format!("{id}.redb")))
            .args(["--lease-ms", &ms(self.config.lease_duration)])
            .args(["--renew-ms", &ms(self.config.renew_deadline)])
            .args(["--retry-ms", &ms(self.config.retry_period)])
            .stdout(Stdio::piped())
            .spawn()?;
        let out = child.stdout.take().ok_or("no stdout")?;
        let log = self.log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if let Some(l) = parse(&line) {
                    log.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(l);
                }
            }
        });
        self.running.insert(id.to_owned(), child);
        Ok(())
    }

    fn signal(&mut self, id: &str, sig: Signal) -> Result<(), Error> {
        let child = self.running.get(id).ok_or_else(|| format!("no replica {id}"))?;
        let pid = Pid::from_raw(i32::try_from(child.id())?);
        kill(pid, sig)?;
        match sig {
            Signal::SIGSTOP => self.paused.push(id.to_owned()),
            Signal::SIGCONT => self.paused.retain(|p| p != id),
            _ => {}
        }
        Ok(())
    }

    /// Ends a replica (SIGKILL, or SIGTERM and a wait for its clean exit).
    fn end(&mut self, id: &str, sig: Signal) -> Result<(), Error> {
        if self.paused.iter().any(|p| p == id) {
            self.signal(id, Signal::SIGCONT)?;
        }
        self.signal(id, sig)?;
        if let Some(mut child) = self.running.remove(id) {
            child.wait()?;
        }
        Ok(())
    }

    /// The replica whose last leadership line says it leads (a running one).
    fn leader(&self) -> Option<String> {
        let mut last: BTreeMap<String, bool> = BTreeMap::new();
        for l in self.lines() {
            if let Line::Leading(id, leading) = l {
                last.insert(id, leading);
            }
        }
        last.into_iter()
            .find(|(id, leading)| *leading && self.running.contains_key(id) && !self.paused.contains(id))
            .map(|(id, _)| id)
    }

    fn wait_for<T>(&self, what: &str, limit: Duration, mut f: impl FnMut(&Self) -> Option<T>) -> Result<T, Error> {
        let end = Instant::now() + limit;
        loop {
            if let Some(v) = f(self) {
                return Ok(v);
            }
            if Instant::now() > end {
                return Err(format!("timed out waiting for {what}").into());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn first_reconcile_after(&self, t: u64, not_by: &str) -> Option<u64> {
        self.lines().into_iter().find_map(|l| match l {
            Line::Reconcile(id, _, start, _, _) if start > t && id != not_by => Some(start),
            _ => None,
        })
    }

    fn stop_all(&mut self) -> Result<(), Error> {
        let ids: Vec<String> = self.running.keys().cloned().collect();
        for id in ids {
            self.end(&id, Signal::SIGTERM)?;
        }
        Ok(())
    }
}

struct Cluster {
    sim: durable_informer::sim::Sim,
    keys: usize,
}

impl Cluster {
    fn start(keys: usize) -> Result<Self, Error> {
        let sim = durable_informer::sim::Sim::start(durable_informer::sim::SimConfig::default())?;
        for i in 0..keys {
            sim.create(
                "configmaps",
                Some(NS),
                json!({"metadata": {"name": format!("cm-{i}")}, "data": {"gen": "0"}}),
            )?;
        }
        Ok(Self { sim, keys })
    }

    fn bump(&self, i: usize, gen: u64) -> Result<(), Error> {
        self.sim.patch(
            "configmaps",
            Some(NS),
            &format!("cm-{i}"),
            &json!({"data": {"gen": gen.to_string()}}),
        )?;
        Ok(())
    }

    /// Keys whose observed annotation differs from their `gen`.
    fn unreconciled(&self) -> Result<usize, Error> {
        let mut n = 0;
        for i in 0..self.keys {
            let cm = self.sim.get("configmaps", Some(NS), &format!("cm-{i}"))?;
            if cm.pointer("/data/gen") != cm.pointer(&format!("/metadata/annotations/{}", OBSERVED.replace('/', "~1")))
            {
                n += 1;
            }
        }
        Ok(n)
    }
}

fn fleet(cluster: &Cluster, config: LeaderElectionConfig, dir: &Path) -> Result<Fleet, Error> {
    Ok(Fleet {
        exe: std::env::current_exe()?,
        server: cluster.sim.url(),
        dir: dir.to_owned(),
        config,
        running: BTreeMap::new(),
        paused: Vec::new(),
        log: Arc::new(Mutex::new(Vec::new())),
    })
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

/// SIGKILL the leader, restart it, then stop the next leader cleanly; times each takeover.
fn failover(args: &[String]) -> Result<(), Error> {
    let config = timings(args, 15_000, 10_000, 2_000)?;
    let keys = arg(args, "--keys").map_or(Ok(100), |k| k.parse())?;
    let cluster = Cluster::start(keys)?;
    let dir = tempfile::tempdir()?;
    let mut f = fleet(&cluster, config, dir.path())?;
    let patience = config.lease_duration * 4 + Duration::from_secs(30);
    for id in ["a", "b", "c"] {
        f.start(id)?;
    }
    f.wait_for("three synced replicas", patience, |f| {
        (f.lines().iter().filter(|l| matches!(l, Line::Synced)).count() == 3).then_some(())
    })?;
    let first = f.wait_for("a leader", patience, Fleet::leader)?;
    f.wait_for("the first pass", patience, |_| {
        (cluster.unreconciled().ok()? == 0).then_some(())
    })?;
    println!("leader {first}; every ConfigMap reconciled");

    // 1. The leader is SIGKILLed: its Lease runs out, a warm standby takes over.
    let before = cluster.sim.counters();
    let t_kill = now_ns();
    f.end(&first, Signal::SIGKILL)?;
    cluster.bump(0, 1)?;
    let t_first = f.wait_for("a reconcile by the next leader", patience, |f| {
        f.first_reconcile_after(t_kill, &first)
    })?;
    f.wait_for("the change reconciled", patience, |_| {
        (cluster.unreconciled().ok()? == 0).then_some(())
    })?;
    let after = cluster.sim.counters();
    // A replica prints that it leads from its elector task, which may come after its first
    // reconcile's line: wait for it rather than read it once.
    let second = f.wait_for("the new leader", patience, Fleet::leader)?;
    println!(
        "SIGKILL {first}: {second} reconciled {:.0} ms later (lease {} ms), with {} LIST requests",
        ms(t_first - t_kill),
        config.lease_duration.as_millis(),
        after.list_requests - before.list_requests
    );
    println!("figure kill_to_first_reconcile_ms {:.0}", ms(t_first - t_kill));
    println!(
        "figure kill_lists_by_new_leader {}",
        after.list_requests - before.list_requests
    );

    // The killed replica comes back on its database: warm, a `limit=1` probe at most.
    let before = cluster.sim.counters();
    let synced_before = f.lines().iter().filter(|l| matches!(l, Line::Synced)).count();
    f.start(&first)?;
    f.wait_for("the restarted replica synced", patience, |f| {
        (f.lines().iter().filter(|l| matches!(l, Line::Synced)).count() > synced_before).then_some(())
    })?;
    let after = cluster.sim.counters();
    println!(
        "{first} restarted on its database: {} LIST requests, {} objects listed",
        after.list_requests - before.list_requests,
        after.list_objects - before.list_objects
    );
    println!(
        "figure restart_list_objects {}",
        after.list_objects - before.list_objects
    );

    // 2. The leader stops cleanly: it releases the Lease, a standby takes it at once.
    let t_stop = now_ns();
    f.end(&second, Signal::SIGTERM)?;
    let t_released = now_ns();
    cluster.bump(1, 1)?;
    let t_first = f.wait_for("a reconcile by the next leader", patience, |f| {
        f.first_reconcile_after(t_released, &second)
    })?;
    f.wait_for("the change reconciled", patience, |_| {
        (cluster.unreconciled().ok()? == 0).then_some(())
    })?;
    println!(
        "SIGTERM {second}: exited in {:.0} ms (Lease released); {} reconciled {:.0} ms after the exit",
        ms(t_released - t_stop),
        f.wait_for("the next leader", patience, Fleet::leader)?,
        ms(t_first - t_released)
    );
    println!("figure release_to_first_reconcile_ms {:.0}", ms(t_first - t_released));
    f.stop_all()?;
    Ok(())
}

/// The resourceVersion a reconcile wrote (`wrote:<rv>`).
fn written(outcome: &str) -> Option<u64> {
    outcome.strip_prefix("wrote:")?.parse().ok()
}

/// Reconciles of one key by different replicas that overlap in time: a description, and
/// whether their writes interleaved (the one that started first wrote after the other did).
fn overlaps(lines: &[Line]) -> Vec<(String, bool)> {
    let mut by_key: BTreeMap<&str, Vec<(u64, u64, &str, &str)>> = BTreeMap::new();
    for l in lines {
        if let Line::Reconcile(id, key, start, end, outcome) = l {
            by_key.entry(key).or_default().push((*start, *end, id, outcome));
        }
    }
    let mut out = Vec::new();
    for (key, mut v) in by_key {
        v.sort_unstable();
        // Sweep: the reconcile reaching furthest so far.
        let mut reach: Option<(u64, u64, &str, &str)> = None;
        for (start, end, id, outcome) in v {
            if let Some((r_start, r_end, r_id, r_outcome)) = reach {
                if start < r_end && r_id != id {
                    out.push((
                        format!(
                            "{key}: {r_id} {:.0} ms ({r_outcome}) overlaps {id} {:.0} ms ({outcome}), by {:.0} ms",
                            ms(r_end - r_start),
                            ms(end - start),
                            ms(r_end - start)
                        ),
                        written(r_outcome).zip(written(outcome)).is_some_and(|(a, b)| a > b),
                    ));
                }
            }
            if reach.is_none_or(|(_, r_end, _, _)| end > r_end) {
                reach = Some((start, end, id, outcome));
            }
        }
    }
    out
}

/// Random kills, pauses and clean stops across 3 to 10 replicas while a writer runs.
fn chaos(args: &[String]) -> Result<(), Error> {
    let config = timings(args, 2_000, 1_500, 300)?;
    let keys: usize = arg(args, "--keys").map_or(Ok(100), |k| k.parse())?;
    let rounds: usize = arg(args, "--rounds").map_or(Ok(200), |k| k.parse())?;
    let seed: u64 = arg(args, "--seed").map_or(Ok(1), |k| k.parse())?;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let cluster = Arc::new(Cluster::start(keys)?);
    let dir = tempfile::tempdir()?;
    let mut f = fleet(&cluster, config, dir.path())?;
    let patience = config.lease_duration * 4 + Duration::from_secs(30);
    let mut next_id = 0;
    let mut new_id = || {
        next_id += 1;
        format!("r{next_id}")
    };
    for _ in 0..3 {
        f.start(&new_id())?;
    }
    f.wait_for("a leader", patience, Fleet::leader)?;

    // The writer: 50 changes a second to random keys, until the rounds are over.
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (cluster, done) = (cluster.clone(), done.clone());
        std::thread::spawn(move || -> Result<u64, String> {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ 0x5eed);
            let mut gen = 0u64;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                gen += 1;
                cluster
                    .bump(rng.random_range(0..cluster.keys), gen)
                    .map_err(|e| e.to_string())?;
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(gen)
        })
    };
    let lease = config.lease_duration;
    let (mut kills, mut pauses, mut stops) = (0, 0, 0);
    for round in 0..rounds {
        let ids: Vec<String> = f.running.keys().cloned().collect();
        // The leader is the usual victim: that is where a takeover happens.
        let victim = match f.leader() {
            Some(l) if rng.random_bool(0.7) => l,
            _ => ids[rng.random_range(0..ids.len())].clone(),
        };
        match rng.random_range(0..3) {
            0 => {
                kills += 1;
                f.end(&victim, Signal::SIGKILL)?;
            }
            1 => {
                // Up to twice the lease: long enough for another replica to take over.
                pauses += 1;
                f.signal(&victim, Signal::SIGSTOP)?;
                std::thread::sleep(lease.mul_f64(rng.random_range(0.1..2.0)));
                f.signal(&victim, Signal::SIGCONT)?;
            }
            _ => {
                stops += 1;
                f.end(&victim, Signal::SIGTERM)?;
            }
        }
        // Keep 3 to 10 replicas: bring the victim back (warm, on its database) or add one.
        if !f.running.contains_key(&victim) && (f.running.len() < 3 || rng.random_bool(0.8)) {
            f.start(&victim)?;
        }
        if f.running.len() < 10 && rng.random_bool(0.15) {
            f.start(&new_id())?;
        }
        while f.running.len() < 3 {
            f.start(&new_id())?;
        }
        std::thread::sleep(lease.mul_f64(rng.random_range(0.1..1.0)));
        if round % 20 == 19 {
            println!("round {}: {} replicas", round + 1, f.running.len());
        }
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let writes = writer.join().map_err(|_| "the writer panicked")??;
    let t_last_write = Instant::now();
    let converged = f.wait_for("every key reconciled", patience, |_| {
        (cluster.unreconciled().ok()? == 0).then_some(())
    });
    let unreconciled = cluster.unreconciled()?;
    let lines = f.lines();
    let bad = overlaps(&lines);
    for (b, _) in bad.iter().take(10) {
        println!("overlap {b}");
    }
    let reconciles = lines.iter().filter(|l| matches!(l, Line::Reconcile(..))).count();
    let conflicts = lines
        .iter()
        .filter(|l| matches!(l, Line::Reconcile(.., o) if o == "conflict"))
        .count();
    let takeovers = lines.iter().filter(|l| matches!(l, Line::Leading(_, true))).count();
    println!(
        "{rounds} rounds ({kills} SIGKILL, {pauses} SIGSTOP/SIGCONT, {stops} SIGTERM), {writes} writes, {reconciles} reconciles, {takeovers} terms"
    );
    if converged.is_ok() {
        println!(
            "converged {:.1} s after the last write",
            t_last_write.elapsed().as_secs_f64()
        );
    }
    println!("figure chaos_rounds {rounds}");
    println!("figure chaos_terms {takeovers}");
    println!("figure chaos_overlaps {}", bad.len());
    println!(
        "figure chaos_interleaved_writes {}",
        bad.iter().filter(|(_, w)| *w).count()
    );
    println!("figure chaos_conflicts {conflicts}");
    println!("figure chaos_unreconciled {unreconciled}");
    f.stop_all()?;
    Ok(())
}

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("replica") => tokio::runtime::Runtime::new()?.block_on(replica(&args)),
        Some("chaos") => chaos(&args),
        None | Some("failover") => failover(&args),
        Some(other) => Err(format!("unknown mode {other:?}: failover, chaos or replica").into()),
    }
}
