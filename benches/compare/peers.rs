//! The Go peers of `benches/compare.rs` (issue #34): client-go's SharedIndexInformer and
//! controller-runtime's cache, each a child process built from `benches/peers/` by
//! `scripts/build-peers`, driven over a line protocol on its stdin and stdout
//! (docs/bench/peers.md). The harness measures them as it measures the Rust systems: its own
//! clock for sync times, the sim's counters for what was served, `/proc/<pid>/status` for the
//! peak RSS, and the same [`Probe`] for event latency (the peer reports each handler call's
//! resourceVersion and `CLOCK_MONOTONIC` time, the clock behind `Instant` on Linux).

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use durable_informer::sim::Sim;

use crate::scenarios::{self, Ladder, Lifecycle, Phase, Probe, Reads, Res, Served, Steady};

/// How long one command may take before the peer is taken for hung.
const REPLY_TIMEOUT: Duration = Duration::from_secs(1_800);

/// One Go system, as `benches/peers` runs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GoKind {
    /// `-system`.
    pub system: &'static str,
    /// `-content-type`.
    pub content_type: &'static str,
    /// Column name.
    pub label: &'static str,
}

/// client-go's SharedIndexInformer, JSON.
pub const CLIENT_GO: GoKind = GoKind {
    system: "client-go",
    content_type: "json",
    label: "client-go",
};
/// client-go's SharedIndexInformer asking for protobuf (as kube-controller-manager does).
pub const CLIENT_GO_PROTOBUF: GoKind = GoKind {
    system: "client-go",
    content_type: "protobuf",
    label: "client-go (protobuf)",
};
/// controller-runtime's cache with its defaults, given the same JSON configuration as client-go.
pub const CONTROLLER_RUNTIME: GoKind = GoKind {
    system: "controller-runtime",
    content_type: "json",
    label: "controller-runtime",
};

/// Builds the peers through `scripts/build-peers` (cached outside the checkout) and returns
/// the binary. `BENCH_PEER_BIN` names a binary to use instead.
pub fn build() -> Res<PathBuf> {
    if let Ok(bin) = std::env::var("BENCH_PEER_BIN") {
        return Ok(PathBuf::from(bin));
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/build-peers");
    let out = Command::new("bash").arg(&script).stderr(Stdio::inherit()).output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!("{} failed ({}): {}", script.display(), out.status, stdout.trim()).into());
    }
    stdout
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("PEER="))
        .map(PathBuf::from)
        .ok_or_else(|| format!("{} printed no PEER= line", script.display()).into())
}

/// `CLOCK_MONOTONIC` now, in nanoseconds.
fn mono_ns() -> Res<i64> {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)?;
    Ok(ts.tv_sec() * 1_000_000_000 + ts.tv_nsec())
}

/// Maps `CLOCK_MONOTONIC` nanoseconds onto `Instant`s (the same clock on Linux; the anchor
/// pair is read back to back).
#[derive(Clone, Copy)]
struct Anchor {
    at: Instant,
    mono: i64,
}

impl Anchor {
    fn new() -> Res<Self> {
        let at = Instant::now();
        let mono = mono_ns()?;
        Ok(Self { at, mono })
    }

    fn instant(&self, mono: i64) -> Instant {
        let d = mono - self.mono;
        if d >= 0 {
            self.at + Duration::from_nanos(d as u64)
        } else {
            self.at
                .checked_sub(Duration::from_nanos(d.unsigned_abs()))
                .unwrap_or(self.at)
        }
    }
}

/// A running peer process.
pub struct GoPeer {
    /// Which system.
    pub kind: GoKind,
    /// The peer's greeting: system, module version, Go version, content type.
    pub hello: String,
    /// What its handler received (fed while `report on`).
    pub probe: Probe,
    child: Child,
    stdin: ChildStdin,
    replies: mpsc::Receiver<String>,
}

impl GoPeer {
    /// Starts `bin` against the server at `url` and reads its greeting.
    pub fn spawn(bin: &Path, kind: GoKind, url: &str) -> Res<Self> {
        let mut child = Command::new(bin)
            .args([
                "-server",
                url,
                "-system",
                kind.system,
                "-content-type",
                kind.content_type,
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("{}: {e}", bin.display()))?;
        let stdin = child.stdin.take().ok_or("peer: no stdin")?;
        let stdout = child.stdout.take().ok_or("peer: no stdout")?;
        let probe = Probe::default();
        let anchor = Anchor::new()?;
        let (tx, replies) = mpsc::channel();
        let p2 = probe.clone();
        std::thread::Builder::new()
            .name(format!("peer-{}", kind.label))
            .spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if let Some(ev) = line.strip_prefix("e ") {
                        record(&p2, &anchor, ev);
                    } else if tx.send(line).is_err() {
                        break;
                    }
                }
            })?;
        let mut peer = Self {
            kind,
            hello: String::new(),
            probe,
            child,
            stdin,
            replies,
        };
        let hello = peer.recv(Duration::from_secs(60))?;
        peer.hello = hello
            .strip_prefix("hello ")
            .ok_or_else(|| format!("peer {}: unexpected greeting {hello:?}", kind.label))?
            .to_string();
        Ok(peer)
    }

    fn recv(&mut self, timeout: Duration) -> Res<String> {
        match self.replies.recv_timeout(timeout) {
            Ok(l) => Ok(l),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                Err(format!("peer {}: no answer within {timeout:?}", self.kind.label).into())
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let status = self.child.try_wait().ok().flatten();
                Err(format!("peer {} exited ({status:?})", self.kind.label).into())
            }
        }
    }

    /// Sends one command and returns the words of its `ok` answer after the first.
    fn cmd(&mut self, line: &str) -> Res<Vec<String>> {
        writeln!(self.stdin, "{line}")?;
        self.stdin.flush()?;
        let reply = self.recv(REPLY_TIMEOUT)?;
        match reply.strip_prefix("ok ") {
            Some(rest) => Ok(rest.split_whitespace().skip(1).map(str::to_string).collect()),
            None => Err(format!("peer {}: {line:?} → {reply}", self.kind.label).into()),
        }
    }

    /// Builds a new informer (an empty store) and starts it.
    pub fn start(&mut self) -> Res<()> {
        self.cmd("start").map(drop)
    }

    /// Waits until the store and the handler have the initial list: (objects, handler calls).
    pub fn synced(&mut self) -> Res<(u64, u64)> {
        two(self.cmd("synced")?)
    }

    /// Objects in the store and handler calls so far.
    pub fn count(&mut self) -> Res<(u64, u64)> {
        two(self.cmd("count")?)
    }

    /// Turns the per-event reports on or off.
    pub fn report(&mut self, on: bool) -> Res<()> {
        self.cmd(if on { "report on" } else { "report off" }).map(drop)
    }

    /// Stops the informer and drops its store.
    pub fn stop(&mut self) -> Res<()> {
        self.cmd("stop").map(drop)
    }

    /// Peak RSS of the peer process (`VmHWM`), KiB.
    pub fn vm_hwm_kib(&self) -> Res<u64> {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))?;
        s.lines()
            .find(|l| l.starts_with("VmHWM:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| "no VmHWM in the peer's /proc status".into())
    }

    /// Timed reads inside the peer (same rules as `scenarios::time_per_op`).
    pub fn reads(&mut self, n: usize, gets: usize, lists: usize, namespaces: &[String]) -> Res<Reads> {
        let hot = scenarios::HOT_SET;
        let w = self.cmd(&format!("reads {n} {gets} {lists} {hot} {}", namespaces.join(" ")))?;
        let f = |i: usize| -> Res<f64> { Ok(w.get(i).ok_or("peer: short reads answer")?.parse::<f64>()?) };
        Ok(Reads {
            get_us: f(0)?,
            list_ns_us: f(1)?,
            list_ns_len: f(2)? as u64,
            by_label_us: f(3)?,
            by_label_len: f(4)? as u64,
            cold: None,
            object_cache_mib: None,
            hot: scenarios::HotReads {
                get_us: f(5)?,
                list_ns_us: f(6)?,
                list_ns_len: f(7)? as u64,
                select_us: f(8)?,
                select_len: f(9)? as u64,
            },
        })
    }

    /// Asks the peer to exit and waits for it.
    pub fn quit(mut self) -> Res<()> {
        self.cmd("quit")?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.child.try_wait()?.is_none() {
            if Instant::now() > deadline {
                return Err(format!("peer {} did not exit", self.kind.label).into());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    }
}

impl Drop for GoPeer {
    fn drop(&mut self) {
        // A peer left running by an error path must not outlive the bench.
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn two(w: Vec<String>) -> Res<(u64, u64)> {
    match (w.first(), w.get(1)) {
        (Some(a), Some(b)) => Ok((a.parse()?, b.parse()?)),
        _ => Err(format!("peer: expected two numbers, got {w:?}").into()),
    }
}

/// One `e KIND RV MONO` report: every kind raises the highest RV delivered, updates get a
/// receive time (as the Rust probes do).
fn record(probe: &Probe, anchor: &Anchor, ev: &str) {
    let mut it = ev.split(' ');
    let (Some(kind), Some(rv), Some(mono)) = (it.next(), it.next(), it.next()) else {
        return;
    };
    let (Ok(rv), Ok(mono)) = (rv.parse::<u64>(), mono.parse::<i64>()) else {
        return;
    };
    probe.max_rv.fetch_max(rv, Ordering::Relaxed);
    if kind == "u" {
        probe.seen.lock().expect("probe lock").insert(rv, anchor.instant(mono));
    }
}

// ---------------------------------------------------------------------------------------------
// scenarios

/// Scenarios 1, 2, 2b and 4 for a Go peer: like kube-runtime's, each "restart" is a new
/// informer with an empty store in the same process (nothing to resume from).
pub async fn lifecycle(bin: &Path, kind: GoKind, sim: &Sim, n: usize, rep: u64) -> Res<Lifecycle> {
    let mut peer = GoPeer::spawn(bin, kind, &sim.url())?;
    let mut out = Lifecycle::default();
    for step in 0..4 {
        if step == 3 {
            out.changed = tokio::task::block_in_place(|| scenarios::change_one_percent(sim, n, 9 + 1_000 * rep))?;
            sim.compact();
        }
        let churn = if step == 2 {
            Some(scenarios::lease_churn(sim).await?)
        } else {
            None
        };
        let before = sim.counters();
        let t = Instant::now();
        let (objects, events) = tokio::task::block_in_place(|| {
            peer.start()?;
            peer.synced()
        })?;
        let secs = t.elapsed().as_secs_f64();
        let served = Served::between(&before, &sim.counters());
        if let Some(c) = churn {
            c.stop().await?;
        }
        tokio::task::block_in_place(|| peer.stop())?;
        let ph = Phase {
            secs,
            served,
            events,
            objects,
        };
        match step {
            0 => out.cold = ph,
            1 => out.restart = ph,
            2 => out.restart_busy = ph,
            _ => out.relist = ph,
        }
    }
    tokio::task::block_in_place(|| peer.quit())?;
    Ok(out)
}

/// Scenario 3 for a Go peer: a fresh informer, synced, reporting on, then the ladder.
pub async fn steady(bin: &Path, kind: GoKind, sim: &Sim, n: usize, cfg: &Ladder) -> Res<Steady> {
    let mut peer = GoPeer::spawn(bin, kind, &sim.url())?;
    tokio::task::block_in_place(|| -> Res<()> {
        peer.start()?;
        peer.synced()?;
        peer.report(true)
    })?;
    peer.probe.max_rv.fetch_max(sim.current_rv(), Ordering::Relaxed);
    let out = scenarios::ladder(sim, n, cfg, &peer.probe).await;
    tokio::task::block_in_place(|| peer.quit())?;
    sim.compact();
    out
}

/// Scenario 6 for a Go peer: reads timed inside the peer process.
pub async fn reads(bin: &Path, kind: GoKind, sim: &Sim, n: usize, gets: usize, lists: usize) -> Res<Reads> {
    tokio::task::block_in_place(|| {
        let mut peer = GoPeer::spawn(bin, kind, &sim.url())?;
        peer.start()?;
        peer.synced()?;
        let r = peer.reads(n, gets, lists, &scenarios::namespaces(n))?;
        peer.quit()?;
        Ok(r)
    })
}

/// Scenario 5 (and 2's peak RSS) for a Go peer: a fresh process syncs `n` objects; its peak
/// RSS once synced, and the seconds from `start` to synced.
pub fn memory_child(bin: &Path, kind: GoKind, url: &str, n: usize) -> Res<scenarios::ChildReport> {
    let mut peer = GoPeer::spawn(bin, kind, url)?;
    let t = Instant::now();
    peer.start()?;
    let (objects, _) = peer.synced()?;
    let secs = t.elapsed().as_secs_f64();
    let vm_hwm_kib = peer.vm_hwm_kib()?;
    if objects != n as u64 {
        return Err(format!("{} synced {objects} objects, want {n}", kind.label).into());
    }
    peer.quit()?;
    Ok(scenarios::ChildReport { vm_hwm_kib, secs })
}
