//! Controller mode ([`Harness::for_controller`]): the user's own [`Controller`] runs against
//! the simulated server, its informers in a real redb database file that a crash leaves
//! behind and a restart opens again. The harness does not pick each step here (the
//! controller's tasks and its store's writer thread do): it releases one recorded change,
//! waits until the controller is idle (queue empty, nothing in flight, nothing served for a
//! while), and injects the faults at those boundaries.
//!
//! [`Controller`]: crate::controller::Controller

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;

use super::{lock, Run, CLOCK_BASE};
use crate::object::ObjectKey;
use crate::queue::WorkQueue;
use crate::store::{DurableStore, StoreConfig, StoreError};
use crate::testing::client::InProcess;
use crate::testing::{Env, Fault, Oracle, Reconciled, Restart};

/// How often the harness looks whether the controller is idle (real time).
const POLL: Duration = Duration::from_millis(1);
/// Idle for this many polls in a row: settled.
const QUIET_POLLS: u32 = 8;
/// Work queued but nothing moving for this many polls, with an informer held: the controller
/// waits for it (longer than an error policy's retry in controller mode).
const WAIT_POLLS: u32 = 50;
/// A boundary that does not settle within this (real time) fails the run as stuck.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(20);

/// A directory for the run's database files, removed with the run.
pub(crate) struct ScratchDir(pub PathBuf);

impl ScratchDir {
    fn new() -> std::io::Result<Self> {
        static N: AtomicU64 = AtomicU64::new(0);
        let p = std::env::temp_dir().join(format!(
            "durable-informer-testing-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&p)?;
        Ok(Self(p))
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One lifetime of the controller process.
struct Live {
    db: Arc<DurableStore>,
    queue: WorkQueue<ObjectKey>,
    task: tokio::task::JoinHandle<()>,
}

impl<K, Ctx, E> Run<'_, K, Ctx, E>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::Scope: 'static,
    Ctx: Send + Sync + 'static,
    E: std::fmt::Display + Send + 'static,
{
    /// Opens the database (the same file after a crash, a new one for an empty restart) and
    /// starts the user's controller on it.
    async fn start_controller(&mut self, dir: &ScratchDir, restart: Restart, generation: &mut u32) -> Option<Live> {
        let build = self.h.controller.clone()?;
        {
            let mut sh = lock(&self.shared);
            sh.reads.iter_mut().for_each(|r| r.clear());
            sh.crashed = false;
            // The old process's requests and watches died with it.
            sh.inflight = 0;
            sh.watches.clear();
            // A time-travel restart reaches a server whose watch cache is behind (never
            // before the recording's initial state).
            sh.lagging = match restart {
                Restart::TimeTravel { behind } => Some((
                    self.sim.current_rv().saturating_sub(behind).max(self.start_rv),
                    foldhash::HashSet::default(),
                )),
                _ => None,
            };
        }
        // A delayed informer was the crashed process's: the new one's watches are not held.
        self.release_all();
        if restart != Restart::FromDatabase {
            *generation += 1;
        }
        let path = dir.0.join(format!("controller-{generation}.redb"));
        // The crashed process's last informer closes the file on a thread of its own: a
        // reopen may find it still locked for a moment.
        let mut tries = 0;
        let configure = self.h.store_config.clone();
        let opened = loop {
            let p = path.clone();
            let configure = configure.clone();
            let r = tokio::task::spawn_blocking(move || {
                let config = StoreConfig::new(p);
                DurableStore::open(match &configure {
                    Some(f) => f(config),
                    None => config,
                })
            })
            .await;
            match r {
                Ok(Err(StoreError::Locked { .. })) if tries < 2_000 => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                other => break other,
            }
        };
        let db = match opened {
            Ok(Ok(db)) => Arc::new(db),
            Ok(Err(e)) => {
                self.fail(Oracle::Harness, format!("opening the controller's database: {e}"));
                return None;
            }
            Err(e) => {
                self.fail(Oracle::Harness, format!("opening the controller's database: {e}"));
                return None;
            }
        };
        let client = kube::Client::new(
            InProcess {
                sim: self.sim.clone(),
                shared: self.shared.clone(),
                replica: 0,
                elector: false,
            },
            "default",
        );
        let env = Env {
            client,
            stores: Arc::default(),
            db: Some(db.clone()),
            leadership: crate::leader::Leadership::from(tokio::sync::watch::channel(true).1),
        };
        let (queue, mut stream) = match build(env).await {
            Ok(built) => built,
            Err(e) => {
                self.fail(Oracle::Harness, format!("setting up the controller: {e}"));
                return None;
            }
        };
        let shared = self.shared.clone();
        let task = tokio::spawn(async move {
            while let Some(r) = stream.next().await {
                lock(&shared).reconciled.push(r);
            }
        });
        self.trace(|| format!("start controller {restart:?}: database {generation}"));
        Some(Live { db, queue, task })
    }

    /// The process dies: its tasks stop, its database is closed as a crash leaves it.
    async fn stop_controller(&mut self, live: Live) {
        live.task.abort();
        let _ = live.task.await;
        // The aborted tasks drop their handles of the store as the runtime gets to them.
        for _ in 0..10_000 {
            if Arc::strong_count(&live.db) == 1 {
                break;
            }
            tokio::time::sleep(POLL).await;
        }
        match Arc::try_unwrap(live.db) {
            Ok(db) => drop(tokio::task::spawn_blocking(move || drop(db)).await),
            Err(_) => self.fail(
                Oracle::Harness,
                "the controller's database is still in use after its controller stopped".into(),
            ),
        }
    }

    /// Waits until the controller is idle: nothing queued or processing, no request in
    /// flight, and nothing served for [`QUIET_POLLS`] polls. False when it does not settle or
    /// crashed.
    async fn settle(&mut self, live: &Live) -> bool {
        let deadline = std::time::Instant::now() + SETTLE_TIMEOUT;
        let mut last = None;
        let mut quiet = 0;
        let mut waiting = 0;
        let mut flushed_at = None;
        loop {
            tokio::time::sleep(POLL).await;
            let m = live.queue.metrics();
            let (served, inflight, crashed, done, caught_up) = {
                let sh = lock(&self.shared);
                let caught_up = sh.watches_caught_up(&self.sim);
                (sh.served, sh.inflight, sh.crashed, sh.reconciled.len(), caught_up)
            };
            if crashed {
                return false;
            }
            let now = (m.adds, served, done);
            // An informer waiting to watch again (after a 410, in its backoff) sends and
            // queues nothing, but is not done.
            let still = m.processing == 0 && inflight == 0 && last == Some(now);
            if m.depth == 0 && still && caught_up {
                quiet += 1;
                if quiet >= QUIET_POLLS {
                    if flushed_at == Some(now) {
                        return true;
                    }
                    // Sent is not stored: an event the informer took may still wait for the
                    // store's writer (a commit is a disk sync, and a loaded machine starves its
                    // thread longer than the quiet polls). A flush returns after everything
                    // submitted before it; then the controller must stay quiet once more.
                    let left = deadline.saturating_duration_since(std::time::Instant::now());
                    match tokio::time::timeout(left, live.db.writer().flush()).await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => {
                            self.fail(Oracle::Harness, format!("flushing the controller's database: {e}"));
                            return false;
                        }
                        // A wedged writer is a boundary that does not settle.
                        Err(_) => return false,
                    }
                    flushed_at = Some(now);
                    quiet = 0;
                }
            } else if still && !self.held_until.is_empty() {
                // Work queued but nothing moves: the controller waits for a held informer (its
                // caches must sync before it reconciles). As in the harness-driven mode, the
                // delay ends early when nothing else can happen.
                quiet = 0;
                waiting += 1;
                if waiting >= WAIT_POLLS {
                    self.trace(|| "  the controller waits for a held informer: the delay ends early".into());
                    self.release_all();
                    waiting = 0;
                }
            } else {
                quiet = 0;
                waiting = 0;
            }
            last = Some(now);
            if std::time::Instant::now() > deadline {
                return false;
            }
            self.check_reconciled();
            if self.failed() {
                return false;
            }
        }
    }

    /// Reads what the controller's stream reported: a panic fails the run, and so does an
    /// object reconciled too often since the last change from the world.
    fn check_reconciled(&mut self) {
        let items: Vec<Reconciled> = std::mem::take(&mut lock(&self.shared).reconciled);
        for r in items {
            match r {
                Reconciled::Ok(obj) => {
                    self.reconciles += 1;
                    self.trace(|| format!("reconciled {obj}"));
                    let c = self.counts.entry(obj.clone()).or_insert(0);
                    *c += 1;
                    if *c > self.h.max_reconciles_per_trigger {
                        let n = *c;
                        self.fail(
                            Oracle::HotLoop,
                            format!(
                                "{obj} reconciled {n} times without a change from the world (limit {})",
                                self.h.max_reconciles_per_trigger
                            ),
                        );
                    }
                }
                Reconciled::Failed(obj, e) => {
                    self.reconciles += 1;
                    self.trace(|| format!("reconcile of {obj} failed: {e}"));
                    let c = self.counts.entry(obj.clone()).or_insert(0);
                    *c += 1;
                    if *c > self.h.max_reconciles_per_trigger {
                        let n = *c;
                        self.fail(
                            Oracle::HotLoop,
                            format!("{obj} failed {n} times without a change from the world: {e}"),
                        );
                    }
                }
                Reconciled::Panicked(obj, m) => {
                    self.fail(Oracle::Panic, format!("reconcile of {obj} panicked: {m}"));
                }
                Reconciled::Other(m) => self.trace(|| format!("controller: {m}")),
            }
        }
    }

    /// A boundary: wait until idle (restarting after a crash after a write), then collect
    /// garbage and wait again.
    async fn boundary(&mut self, dir: &ScratchDir, live: &mut Option<Live>, generation: &mut u32) {
        loop {
            let Some(l) = live.as_ref() else {
                return;
            };
            let settled = self.settle(l).await;
            self.check_reconciled();
            if self.failed() {
                return;
            }
            if lock(&self.shared).crashed {
                let n = lock(&self.shared).writes;
                let restart = self
                    .faults
                    .iter()
                    .find_map(|f| match f {
                        Fault::CrashAfterWrite { write, restart } if *write == n => Some(*restart),
                        _ => None,
                    })
                    .unwrap_or(Restart::FromDatabase);
                if let Some(l) = live.take() {
                    self.stop_controller(l).await;
                }
                self.arm_crash();
                *live = self.start_controller(dir, restart, generation).await;
                continue;
            }
            if !settled {
                self.fail(
                    Oracle::Stuck,
                    format!("the controller did not settle within {SETTLE_TIMEOUT:?} (real time)"),
                );
                return;
            }
            if !self.orphans() {
                return;
            }
            let victims = self.gc_pending.iter().cloned().collect();
            self.collect_garbage(victims).await;
        }
    }

    /// Informer `i`'s resource in controller mode: the primary resource first, then the
    /// others the controller watched in this run, by name (the order its tasks open them in
    /// varies, and a process just restarted may not have opened them yet).
    fn informer_resource(&self, i: usize) -> Option<String> {
        let primary = crate::testing::sim_resource::<K>();
        let sh = lock(&self.shared);
        let others = sh.watched.iter().filter(|r| **r != primary).cloned();
        std::iter::once(primary.clone()).chain(others).nth(i)
    }

    fn release_held(&mut self, resource: &str) {
        if self.held_until.remove(resource).is_some() {
            self.trace(|| format!("  {resource}: watch events flow again"));
        }
        lock(&self.shared).release(resource);
    }

    fn release_all(&mut self) {
        let held: Vec<String> = self.held_until.keys().cloned().collect();
        for r in held {
            self.release_held(&r);
        }
    }

    /// The next crash after a write, if the schedule has one.
    fn arm_crash(&self) {
        let mut sh = lock(&self.shared);
        sh.crash_after_write = self.faults.iter().find_map(|f| match f {
            Fault::CrashAfterWrite { write, .. } if *write > sh.writes => Some(*write),
            _ => None,
        });
    }

    /// The run in controller mode: start, then per step the faults due, one recorded change,
    /// and a boundary; the end state once the recording is done and the controller idle.
    pub(super) async fn go_controller(
        mut self,
        baseline: Option<&std::collections::BTreeMap<String, serde_json::Value>>,
    ) -> super::Outcome {
        let dir = match ScratchDir::new() {
            Ok(d) => d,
            Err(e) => {
                self.fail(Oracle::Harness, format!("a directory for the database: {e}"));
                return self.finish(baseline);
            }
        };
        let mut generation = 0;
        self.arm_crash();
        let mut live = self.start_controller(&dir, Restart::Empty, &mut generation).await;
        self.boundary(&dir, &mut live, &mut generation).await;
        while !self.failed() && live.is_some() {
            self.step += 1;
            self.sim.set_clock(CLOCK_BASE + self.step);
            let due = self.due_faults();
            let ending: Vec<String> = self
                .held_until
                .iter()
                .filter(|(_, until)| **until <= self.step)
                .map(|(r, _)| r.clone())
                .collect();
            for r in ending {
                self.release_held(&r);
            }
            for f in due {
                self.trace(|| format!("FAULT {f}"));
                match f {
                    Fault::Crash { restart, .. } => {
                        if let Some(l) = live.take() {
                            self.stop_controller(l).await;
                        }
                        self.counts.clear();
                        live = self.start_controller(&dir, restart, &mut generation).await;
                    }
                    Fault::Relist { .. } => {
                        // Every watch ends and the history is gone: each informer's next watch
                        // gets 410 and lists again.
                        self.sim.compact();
                        self.sim.restart();
                        self.gc_seen = self.sim.current_rv();
                    }
                    Fault::Delay { informer, steps, .. } => match self.informer_resource(informer) {
                        Some(r) => {
                            let until = self.step + steps;
                            self.trace(|| format!("  {r}: watch events held until step {until}"));
                            lock(&self.shared).hold(&r);
                            self.held_until.insert(r, until);
                        }
                        None => self.trace(|| "  (not injected: no such informer)".into()),
                    },
                    _ => self.trace(|| "  (not injected in controller mode)".into()),
                }
            }
            if self.world.is_empty() {
                // Nothing else will happen: the delays end.
                self.release_all();
                break;
            }
            self.counts.clear();
            self.release();
            self.boundary(&dir, &mut live, &mut generation).await;
        }
        if !self.failed() {
            self.boundary(&dir, &mut live, &mut generation).await;
        }
        if let Some(l) = live.take() {
            self.stop_controller(l).await;
        }
        self.finish(baseline)
    }
}
