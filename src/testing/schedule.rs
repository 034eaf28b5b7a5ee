//! Schedules: a seed for the interleaving plus the faults injected at event boundaries; how
//! they are sampled, shrunk, written out and read back.

use std::fmt;
use std::path::Path;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// How a crashed controller comes back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Restart {
    /// From its database: the informers' caches and resourceVersions survive, the watches
    /// resume where they were; the work queue, timers and the context are lost.
    FromDatabase,
    /// From an empty database: the informers list the current state.
    Empty,
    /// From an empty database, against an API server whose view is `behind` revisions
    /// behind the current one (an HA server's lagging watch cache: Sieve's "time travel").
    /// The informers list that old state, then catch up event by event.
    TimeTravel {
        /// How many revisions behind.
        behind: u64,
    },
}

/// One fault, injected at an event boundary (before step `at` of the run, or right after a
/// controller write).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "fault")]
pub enum Fault {
    /// The controller crashes before step `at` and restarts.
    Crash {
        /// The step.
        at: u64,
        /// How it restarts.
        restart: Restart,
    },
    /// The controller crashes right after its `write`-th write (counted over the whole run)
    /// reached the server: the write happened, its answer is lost.
    CrashAfterWrite {
        /// The write.
        write: u64,
        /// How it restarts.
        restart: Restart,
    },
    /// Informer `informer` (0 = the primary resource, then the others in the order they were
    /// added) delivers nothing for `steps` steps from step `at` (its cache goes stale while the
    /// others move on). The delay ends early when nothing else can happen.
    Delay {
        /// The step.
        at: u64,
        /// The informer.
        informer: usize,
        /// For how many steps.
        steps: u64,
    },
    /// Informer `informer`'s watch is dropped before step `at` and its history is gone (410):
    /// it relists, so the states between are never seen, deletions included.
    Relist {
        /// The step.
        at: u64,
        /// The informer.
        informer: usize,
    },
    /// Informer `informer`'s watch restarts `events` events back before step `at`: those
    /// events are delivered again.
    Duplicate {
        /// The step.
        at: u64,
        /// The informer.
        informer: usize,
        /// How many events again.
        events: u64,
    },
    /// With a standby ([`Harness::leader_election`](super::Harness::leader_election)): before
    /// step `at`, the leader is cut off from the server, its Lease runs out and the standby
    /// takes over with what its own caches hold; the old leader is the standby from then on.
    HandOver {
        /// The step.
        at: u64,
    },
    /// With a standby: the leader is cut off right after its `write`-th write reached the
    /// server, in the middle of that reconcile (the answer and its Lease renewals are held
    /// up). Its Lease runs out, the standby takes over and runs `steps` steps, then the
    /// answer arrives and the deposed leader's reconcile goes on.
    HandOverAfterWrite {
        /// The write.
        write: u64,
        /// Steps the new leader runs before the old one's reconcile goes on.
        steps: u64,
    },
}

impl Fault {
    /// The step it fires at (`None` for a crash after a write).
    pub fn step(&self) -> Option<u64> {
        match *self {
            Fault::Crash { at, .. }
            | Fault::Delay { at, .. }
            | Fault::Relist { at, .. }
            | Fault::Duplicate { at, .. }
            | Fault::HandOver { at } => Some(at),
            Fault::CrashAfterWrite { .. } | Fault::HandOverAfterWrite { .. } => None,
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::Crash { at, restart } => write!(f, "crash before step {at}, restart {restart:?}"),
            Fault::CrashAfterWrite { write, restart } => {
                write!(f, "crash after write #{write}, restart {restart:?}")
            }
            Fault::Delay { at, informer, steps } => {
                write!(f, "informer {informer} delayed {steps} steps from step {at}")
            }
            Fault::Relist { at, informer } => write!(f, "informer {informer} relists (410) before step {at}"),
            Fault::Duplicate { at, informer, events } => {
                write!(
                    f,
                    "informer {informer} gets its last {events} events again before step {at}"
                )
            }
            Fault::HandOver { at } => write!(f, "leader cut off before step {at}, the standby takes over"),
            Fault::HandOverAfterWrite { write, steps } => write!(
                f,
                "leader cut off after write #{write}, the standby takes over and runs {steps} steps before the answer arrives"
            ),
        }
    }
}

/// The kinds of fault a check samples from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FaultKinds {
    /// Crash and restart from the database, or from an empty one.
    pub crash: bool,
    /// Crash right after a write (the answer lost).
    pub crash_after_write: bool,
    /// Restart against a server view behind.
    pub time_travel: bool,
    /// One informer behind the others.
    pub delay: bool,
    /// A dropped watch and a 410 relist.
    pub relist: bool,
    /// Events delivered again.
    pub duplicate: bool,
    /// A leader hand-over to the standby, at a step or in the middle of a reconcile (only with
    /// [`Harness::leader_election`](super::Harness::leader_election)).
    pub hand_over: bool,
}

impl FaultKinds {
    /// Every kind.
    pub const ALL: FaultKinds = FaultKinds {
        crash: true,
        crash_after_write: true,
        time_travel: true,
        delay: true,
        relist: true,
        duplicate: true,
        hand_over: true,
    };
}

impl Default for FaultKinds {
    fn default() -> Self {
        Self::ALL
    }
}

/// One schedule: the seed that decides every interleaving, and the faults.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Schedule {
    /// The scheduler's seed.
    pub seed: u64,
    /// The faults, injected where they say.
    pub faults: Vec<Fault>,
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "seed {}", self.seed)?;
        if self.faults.is_empty() {
            return write!(f, ", no faults");
        }
        for (i, x) in self.faults.iter().enumerate() {
            write!(f, "{}{x}", if i == 0 { ": " } else { "; " })?;
        }
        Ok(())
    }
}

/// The longest delay sampled (2 s of virtual time at 10 ms per step).
const MAX_DELAY_STEPS: u64 = 200;

/// What the fault-free run looked like: the ranges faults are drawn from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Extent {
    pub steps: u64,
    pub writes: u64,
    pub informers: usize,
    pub revisions: u64,
    /// Controller replicas (2 with a standby).
    pub replicas: usize,
}

/// Draws schedule `seed`'s faults: 1 to `max_faults` of the enabled kinds, at steps and
/// writes inside the fault-free run's extent.
pub(crate) fn sample(seed: u64, kinds: FaultKinds, max_faults: usize, extent: Extent) -> Schedule {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5EED_FA17_0000_0000);
    let mut options: Vec<u8> = Vec::new();
    for (on, k) in [
        (kinds.crash, 0u8),
        (kinds.crash_after_write && extent.writes > 0, 1),
        (kinds.time_travel, 2),
        (kinds.delay, 3),
        (kinds.relist, 4),
        (kinds.duplicate, 5),
        (kinds.hand_over && extent.replicas > 1, 6),
    ] {
        if on {
            options.push(k);
        }
    }
    // With a standby, hand-overs are drawn twice as often: they are what its tests are for.
    if kinds.hand_over && extent.replicas > 1 {
        options.push(6);
    }
    let mut faults = Vec::new();
    if !options.is_empty() && max_faults > 0 {
        let n = rng.random_range(1..=max_faults);
        for _ in 0..n {
            let at = rng.random_range(0..extent.steps.max(1));
            let informer = rng.random_range(0..extent.informers.max(1));
            let fault = match options[rng.random_range(0..options.len())] {
                0 => Fault::Crash {
                    at,
                    restart: if rng.random_bool(0.5) {
                        Restart::FromDatabase
                    } else {
                        Restart::Empty
                    },
                },
                1 => Fault::CrashAfterWrite {
                    write: rng.random_range(1..=extent.writes),
                    restart: if rng.random_bool(0.5) {
                        Restart::FromDatabase
                    } else {
                        Restart::Empty
                    },
                },
                2 => Fault::Crash {
                    at,
                    restart: Restart::TimeTravel {
                        behind: rng.random_range(1..=extent.revisions.clamp(1, 50)),
                    },
                },
                3 => Fault::Delay {
                    at,
                    informer,
                    // An informer lags for seconds, not for the whole run (which would only show
                    // the controller's retries).
                    steps: rng.random_range(1..=(extent.steps / 4).clamp(2, MAX_DELAY_STEPS)),
                },
                4 => Fault::Relist { at, informer },
                6 => {
                    // Mostly in the middle of a reconcile, where a deposed leader can write on.
                    if extent.writes > 0 && rng.random_bool(0.75) {
                        Fault::HandOverAfterWrite {
                            write: rng.random_range(1..=extent.writes),
                            // The cut usually heals soon after the takeover.
                            steps: rng.random_range(0..=5),
                        }
                    } else {
                        Fault::HandOver { at }
                    }
                }
                _ => Fault::Duplicate {
                    at,
                    informer,
                    events: rng.random_range(1..=3),
                },
            };
            faults.push(fault);
        }
    }
    Schedule { seed, faults }
}

/// A failure written out: the schedule, what failed, the trace, and the recordings.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Saved {
    pub schedule: Schedule,
    /// The seed of the fault-free run the end state was compared with.
    #[serde(default)]
    pub baseline_seed: u64,
    pub oracle: String,
    pub detail: String,
    /// The recordings' file names in the directory, in order.
    pub recordings: Vec<String>,
}

/// Writes `dir/schedule.json`, `dir/trace.txt` and copies of the recordings.
pub(crate) fn save(dir: &Path, saved: &Saved, trace: &str, recordings: &[&Path]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for (src, name) in recordings.iter().zip(&saved.recordings) {
        let to = dir.join(name);
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::copy(src, to)?;
    }
    std::fs::write(dir.join("trace.txt"), trace)?;
    let json = serde_json::to_string_pretty(saved).map_err(std::io::Error::other)?;
    std::fs::write(dir.join("schedule.json"), json + "\n")
}
