//! The controller test harness (`durable_informer::testing`) on the sample controller and its
//! planted-bug variants (examples/testing_sample_controller.rs), over
//! tests/data/recordings/foos.jsonl.

#![allow(clippy::disallowed_names)] // `Foo` is the resource sample-controller is about

// The shipped-controller example includes the sample (examples/testing_sample_controller.rs).
#[path = "../examples/testing_controller.rs"]
#[allow(unreachable_pub)]
mod shipped;

use durable_informer::testing::{Fault, FaultKinds, HarnessError, Oracle, Restart, Schedule};
use shipped::sample::{ha_harness, harness, Variant};

const RECORDING: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/recordings/foos.jsonl");

#[path = "common/backend.rs"]
mod backend;

/// A disk whose every write takes 10 ms (a loaded CI machine starves the store's writer as
/// long): what the controller was sent reaches its store well after it was sent.
#[derive(Debug)]
struct SlowWrites;

impl backend::Hooks for SlowWrites {
    fn write(&self, file: &redb::backends::FileBackend, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
        std::thread::sleep(std::time::Duration::from_millis(10));
        redb::StorageBackend::write(file, offset, data)
    }
}

/// Schedules per check in CI; the ignored test runs 1,000.
const CI_SCHEDULES: u64 = 100;

fn faulty_schedule(seed: u64) -> Schedule {
    Schedule {
        seed,
        faults: vec![
            Fault::Delay {
                at: 5,
                informer: 1,
                steps: 20,
            },
            Fault::Crash {
                at: 30,
                restart: Restart::FromDatabase,
            },
            Fault::Relist { at: 45, informer: 0 },
            Fault::Duplicate {
                at: 60,
                informer: 1,
                events: 2,
            },
            Fault::CrashAfterWrite {
                write: 9,
                restart: Restart::TimeTravel { behind: 6 },
            },
        ],
    }
}

#[test]
fn one_seed_gives_one_trace_100_times_out_of_100() {
    let h = harness(Variant::Correct, RECORDING).expect("harness");
    let (first, failure) = h.run(&faulty_schedule(7)).expect("run");
    assert!(failure.is_none(), "{failure:?}");
    for needle in [
        "FAULT",
        "reconcile",
        "write #",
        "release",
        "deliver",
        "CRASH after write #9",
    ] {
        assert!(first.contains(needle), "the trace has no {needle:?}:\n{first}");
    }
    for run in 1..100 {
        let (again, _) = h.run(&faulty_schedule(7)).expect("run");
        assert!(again == first, "run {run} gave another trace");
    }
    // Another seed interleaves differently: the trace is not a constant.
    let (other, _) = h.run(&faulty_schedule(8)).expect("run");
    assert_ne!(other, first);
}

#[test]
fn the_correct_controller_passes_sampled_schedules() {
    let report = harness(Variant::Correct, RECORDING)
        .expect("harness")
        .check(CI_SCHEDULES)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(report.schedules, CI_SCHEDULES + 1);
    assert!(report.faults >= CI_SCHEDULES, "{report}");
}

/// A time budget stops a check from starting schedules once it has passed and says how many
/// it skipped; which ran is always the first ones in seed order.
#[test]
fn a_time_budget_bounds_a_check_and_says_what_it_skipped() {
    use std::time::Duration;
    // No time at all: only the fault-free run, so a bug that needs a fault is not reached.
    let report = harness(Variant::StaleCache, RECORDING)
        .expect("harness")
        .time_budget(Duration::ZERO)
        .check(50)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((report.schedules, report.not_run, report.faults), (1, 50, 0));
    assert!(
        report.to_string().ends_with("; 50 not run: the time budget ran out"),
        "{report}"
    );
    // Cut short on the way: far more schedules than 200 ms can run.
    let report = harness(Variant::Correct, RECORDING)
        .expect("harness")
        .time_budget(Duration::from_millis(200))
        .check(1_000)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(report.not_run > 0, "{report}");
    assert_eq!(report.schedules - 1 + report.not_run, 1_000, "{report}");
    // Room to spare: every schedule runs.
    let report = harness(Variant::Correct, RECORDING)
        .expect("harness")
        .time_budget(Duration::from_secs(3600))
        .check(10)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((report.schedules, report.not_run), (11, 0));
    assert!(!report.to_string().contains("not run"), "{report}");
}

#[test]
#[ignore = "long: 1,000 schedules (90 s in a debug build); CI runs the_correct_controller_passes_sampled_schedules"]
fn the_correct_controller_passes_1000_schedules() {
    let report = harness(Variant::Correct, RECORDING)
        .expect("harness")
        .check(1000)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(report.schedules, 1001);
}

/// Checks `variant` with 200 schedules: it must fail one of `oracles`, shrunk to at most 3
/// faults, and the saved failure must replay to the same trace.
fn planted_bug_is_found(variant: Variant, oracles: &[Oracle]) -> Box<durable_informer::testing::Failure> {
    planted_bug_is_found_by(variant, harness(variant, RECORDING).expect("harness"), oracles)
}

fn planted_bug_is_found_by(
    variant: Variant,
    h: durable_informer::testing::Harness<shipped::sample::Foo, shipped::sample::Ctx, shipped::sample::Error>,
    oracles: &[Oracle],
) -> Box<durable_informer::testing::Failure> {
    let dir = tempfile::tempdir().expect("tempdir");
    let h = h.save_to(dir.path(), variant.name());
    let failure = match h.check(200) {
        Err(HarnessError::Failed(f)) => f,
        Err(e) => panic!("{}: harness error {e}", variant.name()),
        Ok(report) => panic!("{}: the planted bug was not found: {report}", variant.name()),
    };
    eprintln!("{}: {failure}", variant.name());
    assert!(
        oracles.contains(&failure.oracle),
        "{}: failed {:?}, expected one of {oracles:?}: {failure}",
        variant.name(),
        failure.oracle
    );
    assert!(failure.schedule.faults.len() <= 3, "{failure}");
    assert!(failure.schedule.faults.len() <= failure.faults_before_shrinking);
    // Sampled schedules and shrinking run without a trace; the failure is run again with it.
    assert!(
        failure.trace_tail.iter().any(|l| l.contains("FAIL")),
        "{}: no trace with the failure: {failure}",
        variant.name()
    );
    let saved = failure.saved.clone().expect("saved");
    let again = h.replay(&saved).unwrap_or_else(|e| panic!("replay: {e}"));
    assert_eq!(again.oracle, failure.oracle);
    assert_eq!(again.detail, failure.detail);
    failure
}

#[test]
fn planted_bug_stale_cache_is_found() {
    planted_bug_is_found(Variant::StaleCache, &[Oracle::Invariant]);
}

#[test]
fn planted_bug_crash_create_is_found() {
    planted_bug_is_found(Variant::CrashCreate, &[Oracle::Invariant]);
}

#[test]
fn planted_bug_missed_delete_is_found() {
    planted_bug_is_found(Variant::MissedDelete, &[Oracle::Eventually, Oracle::EndState]);
}

#[test]
fn planted_bug_status_overwrite_is_found() {
    planted_bug_is_found(Variant::StatusOverwrite, &[Oracle::LostUpdate]);
}

#[test]
fn the_correct_controller_survives_a_crash_at_every_boundary() {
    let kinds = FaultKinds {
        crash: true,
        crash_after_write: true,
        time_travel: false,
        delay: false,
        relist: false,
        duplicate: false,
        hand_over: false,
    };
    let report = harness(Variant::Correct, RECORDING)
        .expect("harness")
        .faults(kinds)
        .check_every_boundary()
        .unwrap_or_else(|e| panic!("{e}"));
    // Two restarts before each step and after each write of the fault-free run (> 40 steps).
    assert!(report.schedules > 2 * 40, "{report}");
}

#[test]
#[ignore = "long: every fault kind at every boundary (773 schedules, 50 s in a debug build); CI runs the crashes"]
fn the_correct_controller_passes_a_fault_at_every_boundary() {
    let report = harness(Variant::Correct, RECORDING)
        .expect("harness")
        .check_every_boundary()
        .unwrap_or_else(|e| panic!("{e}"));
    // Each step of the fault-free run gets 3 restarts and 3 faults per informer (2).
    let per_step = 3 + 3 * 2;
    assert!(report.schedules > per_step * 40, "{report}");
}

#[test]
fn a_crash_between_create_and_status_is_found_at_its_boundary() {
    let dir = tempfile::tempdir().expect("tempdir");
    let h = harness(Variant::CrashCreate, RECORDING)
        .expect("harness")
        .save_to(dir.path(), "crash-create-boundaries");
    match h.check_every_boundary() {
        Err(HarnessError::Failed(f)) => {
            assert_eq!(f.oracle, Oracle::Invariant, "{f}");
            assert!(
                matches!(f.schedule.faults.as_slice(), [Fault::CrashAfterWrite { .. }]),
                "{f}"
            );
            let again = h.replay(f.saved.as_ref().expect("saved")).expect("replay");
            assert_eq!(again.detail, f.detail);
        }
        other => panic!("not found: {other:?}"),
    }
}

/// Controller mode waits for the controller's store to hold what its informers were sent
/// before it calls a boundary idle: with a slow disk, the quiet polls alone passed while an
/// event waited for its commit, and the run ended (or the next change came) early.
#[test]
fn a_slow_disk_does_not_end_a_boundary_before_the_store_has_what_was_sent() {
    let report = shipped::harness(shipped::Bug::None, RECORDING)
        .expect("harness")
        .store_config(|c| backend::hooked(c, &std::sync::Arc::new(SlowWrites)))
        .check(1)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(report.schedules, 2, "{report}");
}

/// The Foo controller built with this crate's `Controller` (examples/testing_controller.rs),
/// run by the harness on a real redb file per lifetime.
#[test]
fn the_shipped_controller_passes_sampled_schedules() {
    let report = shipped::harness(shipped::Bug::None, RECORDING)
        .expect("harness")
        .check(20)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(report.schedules, 21, "{report}");
    assert!(report.faults >= 20, "{report}");
    // Every recorded change is a boundary; the controller reconciled the Foos.
    assert!(
        report.baseline_trace.matches("release ").count() >= 13,
        "{}",
        report.baseline_trace
    );
    assert!(report.reconciles > 13, "{report}");
}

#[test]
fn a_planted_bug_in_the_shipped_controller_is_found_after_a_restart_from_its_database() {
    let dir = tempfile::tempdir().expect("tempdir");
    let h = shipped::harness(shipped::Bug::CrashCreate, RECORDING)
        .expect("harness")
        .save_to(dir.path(), "shipped-crash-create");
    // At its boundary: a crash right after one of the writes. (Which write is the create
    // depends on the order the controller's tasks ran in, so not which restart comes first.)
    match h.check_every_boundary() {
        Err(HarnessError::Failed(f)) => {
            assert_eq!(f.oracle, Oracle::Invariant, "{f}");
            assert!(
                matches!(f.schedule.faults.as_slice(), [Fault::CrashAfterWrite { .. }]),
                "{f}"
            );
        }
        other => panic!("not found: {other:?}"),
    }
    // Restarting from the database file the crashed process left: found too.
    let found = (1..=20).find_map(|write| {
        let schedule = Schedule {
            seed: 1,
            faults: vec![Fault::CrashAfterWrite {
                write,
                restart: Restart::FromDatabase,
            }],
        };
        let (trace, failure) = h.run(&schedule).expect("run");
        failure.filter(|f| f.oracle == Oracle::Invariant).map(|_| trace)
    });
    let trace = found.expect("a crash after some write makes a second Deployment");
    // The second lifetime opened the first one's file again.
    assert!(trace.contains("start controller FromDatabase: database 1"), "{trace}");
    assert!(trace.contains("hold the same key"), "{trace}");
}

/// Sieve's stale read in the shipped controller: its Deployment informer (informer 1; 0 is
/// the Foos) held back while the Foos move on, so its cache shows no Deployment for a Foo
/// that has one, and the controller creates a second.
#[test]
fn a_stale_cache_bug_in_the_shipped_controller_is_found_by_a_delayed_informer() {
    let h = shipped::harness(shipped::Bug::StaleCache, RECORDING).expect("harness");
    let schedule = Schedule {
        seed: 1,
        faults: vec![Fault::Delay {
            at: 1,
            informer: 1,
            steps: 10,
        }],
    };
    let (trace, failure) = h.run(&schedule).expect("run");
    let f = failure.unwrap_or_else(|| panic!("not found:\n{trace}"));
    assert_eq!(f.oracle, Oracle::Invariant, "{f}");
    assert!(f.detail.contains("at most one Deployment per Foo"), "{f}");
    assert!(
        trace.contains("deployments.apps: watch events held until step 11"),
        "{trace}"
    );
    // (Without a fault it may show too, when a Foo's event overtakes its Deployment's: two
    // informers, two streams. The delay makes it certain.)
    // The correct controller reads its Deployment from the server: the same delay is harmless.
    let correct = shipped::harness(shipped::Bug::None, RECORDING).expect("harness");
    let (trace, failure) = correct.run(&schedule).expect("run");
    assert!(failure.is_none(), "{trace}");
    assert!(trace.contains("watch events flow again"), "{trace}");
}

/// Sieve's time travel in the shipped controller: restarted from an empty database against a
/// server whose watch cache is behind, it lists Deployments as they were and makes a second
/// one for a Foo whose Deployment the old state does not show.
#[test]
fn a_stale_cache_bug_in_the_shipped_controller_is_found_by_time_travel() {
    let h = shipped::harness(shipped::Bug::StaleCache, RECORDING).expect("harness");
    let correct = shipped::harness(shipped::Bug::None, RECORDING).expect("harness");
    let found = (2..=8).find_map(|at| {
        let schedule = Schedule {
            seed: 1,
            faults: vec![Fault::Crash {
                at,
                restart: Restart::TimeTravel { behind: 6 },
            }],
        };
        let (trace, failure) = correct.run(&schedule).expect("run");
        assert!(failure.is_none(), "{trace}");
        let (trace, failure) = h.run(&schedule).expect("run");
        failure.filter(|f| f.oracle == Oracle::Invariant).map(|_| trace)
    });
    let trace = found.expect("a restart against a server behind makes a second Deployment");
    assert!(
        trace.contains("start controller TimeTravel { behind: 6 }: database 2"),
        "{trace}"
    );
    assert!(
        trace.contains("deployments.apps: listed by a server behind, at rv"),
        "{trace}"
    );
}

/// A leader and a warm standby: a schedule with both kinds of hand-over (one in the middle of
/// a reconcile) and the standby's Deployment informer delayed.
fn hand_over_schedule(seed: u64) -> Schedule {
    Schedule {
        seed,
        faults: vec![
            // Informer 3: the standby's Deployments (informers 0 and 1 are the first replica's).
            Fault::Delay {
                at: 3,
                informer: 3,
                steps: 30,
            },
            Fault::HandOverAfterWrite { write: 4, steps: 5 },
            Fault::HandOver { at: 60 },
            Fault::Crash {
                at: 70,
                restart: Restart::FromDatabase,
            },
        ],
    }
}

#[test]
fn a_hand_over_gives_one_trace_100_times_out_of_100() {
    let h = ha_harness(Variant::Correct, RECORDING).expect("harness");
    let (first, failure) = h.run(&hand_over_schedule(3)).expect("run");
    assert!(failure.is_none(), "{failure:?}\n{first}");
    for needle in [
        "a: acquires the lease",
        "a: renews the lease",
        "STALL after write #4: a is cut off",
        "b: acquires the lease",
        "b: leads after",
        "a: back in touch",
        "a: no longer leads",
        "a: leads after",
        "a: start FromDatabase",
    ] {
        assert!(first.contains(needle), "the trace has no {needle:?}:\n{first}");
    }
    for run in 1..100 {
        let (again, _) = h.run(&hand_over_schedule(3)).expect("run");
        assert!(again == first, "run {run} gave another trace");
    }
    let (other, _) = h.run(&hand_over_schedule(4)).expect("run");
    assert_ne!(other, first);
}

/// The same hand-over in the middle of a reconcile: the correct controller sees that it no
/// longer leads before its next write; the unfenced one writes on.
#[test]
fn a_leader_deposed_mid_reconcile_stops_writing_unless_unfenced() {
    let correct = ha_harness(Variant::Correct, RECORDING).expect("harness");
    let unfenced = ha_harness(Variant::Unfenced, RECORDING).expect("harness");
    let found = (1..=30).find_map(|write| {
        let schedule = Schedule {
            seed: 1,
            faults: vec![Fault::HandOverAfterWrite { write, steps: 3 }],
        };
        let (trace, failure) = correct.run(&schedule).expect("run");
        assert!(failure.is_none(), "{failure:?}\n{trace}");
        trace
            .contains("leadership lost in the middle of the reconcile")
            .then_some(schedule)
    });
    let schedule = found.expect("a hand-over after some write leaves a write to fence");
    let (trace, failure) = unfenced.run(&schedule).expect("run");
    let failure = failure.unwrap_or_else(|| panic!("the deposed leader's write was not caught:\n{trace}"));
    assert_eq!(failure.oracle, Oracle::DeposedWrite, "{failure}");
    assert!(failure.detail.contains("by replica a"), "{failure}");
}

#[test]
fn planted_bug_unfenced_is_found_after_a_hand_over() {
    let h = ha_harness(Variant::Unfenced, RECORDING).expect("harness");
    let f = planted_bug_is_found_by(Variant::Unfenced, h, &[Oracle::DeposedWrite]);
    assert!(
        f.schedule
            .faults
            .iter()
            .any(|f| matches!(f, Fault::HandOverAfterWrite { .. })),
        "{f}"
    );
    // Without a standby the same controller passes: the bug is the hand-over's.
    harness(Variant::Unfenced, RECORDING)
        .expect("harness")
        .check(20)
        .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn the_correct_controller_passes_sampled_schedules_with_hand_overs() {
    let report = ha_harness(Variant::Correct, RECORDING)
        .expect("harness")
        .check(CI_SCHEDULES)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(report.schedules, CI_SCHEDULES + 1);
    assert!(
        report.baseline_trace.contains("a: acquires the lease"),
        "{}",
        report.baseline_trace
    );
}

#[test]
fn the_correct_controller_survives_a_hand_over_at_every_boundary() {
    let kinds = FaultKinds {
        crash: false,
        crash_after_write: false,
        time_travel: false,
        delay: false,
        relist: false,
        duplicate: false,
        hand_over: true,
    };
    let report = ha_harness(Variant::Correct, RECORDING)
        .expect("harness")
        .faults(kinds)
        .check_every_boundary()
        .unwrap_or_else(|e| panic!("{e}"));
    // One hand-over before each step and one after each write of the fault-free run.
    assert!(report.schedules > 40, "{report}");
}

#[test]
#[ignore = "long: 1,000 schedules with hand-overs; CI runs the_correct_controller_passes_sampled_schedules_with_hand_overs"]
fn the_correct_controller_passes_1000_schedules_with_hand_overs() {
    let report = ha_harness(Variant::Correct, RECORDING)
        .expect("harness")
        .check(1000)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(report.schedules, 1001);
}

/// Only delays: no restart, so each run builds its context once (the fault-free run first).
const DELAYS_ONLY: FaultKinds = FaultKinds {
    crash: false,
    crash_after_write: false,
    time_travel: false,
    delay: true,
    relist: false,
    duplicate: false,
    hand_over: false,
};

/// A failure that does not come again when its schedule runs again to record a trace: the
/// report says so instead of showing the trace of a run that passed.
#[test]
fn a_failure_that_does_not_come_again_says_so() {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;
    static BUILDS: AtomicU32 = AtomicU32::new(0);
    let dir = tempfile::tempdir().expect("tempdir");
    let h = durable_informer::testing::Harness::new(
        |_: Arc<shipped::Foo>, run: Arc<u32>| async move {
            // Only the sampled schedule's first run (the fault-free run is the first).
            assert_ne!(*run, 2, "a panic in run 2 only");
            Ok::<_, std::io::Error>(durable_informer::controller::Action::await_change())
        },
        |_, _, _| durable_informer::controller::Action::await_change(),
        |_: &durable_informer::testing::Env| BUILDS.fetch_add(1, Ordering::SeqCst) + 1,
    );
    let f = one_panicking_schedule(h, dir.path());
    assert!(
        f.detail
            .contains("gave another result: it passed; the controller or its context is not deterministic"),
        "{f}"
    );
}

/// Checks one sampled schedule (delays only, one thread: the context's builds are counted in
/// order) of a controller that panics: the failure found.
fn one_panicking_schedule<Ctx: Send + Sync + 'static>(
    h: durable_informer::testing::Harness<shipped::Foo, Ctx, std::io::Error>,
    dir: &std::path::Path,
) -> Box<durable_informer::testing::Failure> {
    let h = h
        .recording(durable_informer::testing::Recording::open(RECORDING).expect("recording"))
        .faults(DELAYS_ONLY)
        .threads(1)
        .save_to(dir, "panics");
    match h.check(1) {
        Err(HarnessError::Failed(f)) => {
            assert_eq!(f.oracle, Oracle::Panic, "{f}");
            f
        }
        other => panic!("{other:?}"),
    }
}

/// In controller mode (real time) a failure that comes again with another detail (here the
/// run's number; there the order of the writes) is the same failure: its rerun's trace is shown.
#[test]
fn in_controller_mode_the_same_oracle_is_the_same_failure() {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;
    static BUILDS: AtomicU32 = AtomicU32::new(0);
    let dir = tempfile::tempdir().expect("tempdir");
    let h = durable_informer::testing::Harness::for_controller(
        |db, client| {
            durable_informer::controller::Controller::new(
                db,
                kube::Api::<shipped::Foo>::all(client),
                Default::default(),
            )
        },
        |_: Arc<shipped::Foo>, run: Arc<u32>| async move {
            assert!(*run < 2, "a panic in run {run}");
            Ok::<_, std::io::Error>(durable_informer::controller::Action::await_change())
        },
        |_, _, _| durable_informer::controller::Action::await_change(),
        |_: &durable_informer::testing::Env| BUILDS.fetch_add(1, Ordering::SeqCst) + 1,
    );
    let f = one_panicking_schedule(h, dir.path());
    assert!(f.detail.contains("a panic in run"), "{f}");
    assert!(!f.detail.contains("gave another result"), "{f}");
    assert!(!f.trace_tail.is_empty(), "{f}");
}

/// A delay of the primary informer right after a restart: the controller waits for that cache
/// to sync before it reconciles anything, so nothing moves until the delay ends. The delay
/// ends early then (found by 1,000 sampled schedules as a run stuck for 20 s).
#[test]
fn a_delay_the_restarted_controller_waits_on_ends_early() {
    let trace = passes_a_crash_then_a_delay(252, 10, 0);
    assert!(
        trace.contains("the controller waits for a held informer: the delay ends early"),
        "{trace}"
    );
}

/// The correct shipped controller crashed before step `at` (restarting from its database) and
/// informer `informer` delayed 3 steps from the same step: it passes; the trace.
fn passes_a_crash_then_a_delay(seed: u64, at: u64, informer: usize) -> String {
    let h = shipped::harness(shipped::Bug::None, RECORDING).expect("harness");
    let schedule = Schedule {
        seed,
        faults: vec![
            Fault::Crash {
                at,
                restart: Restart::FromDatabase,
            },
            Fault::Delay { at, informer, steps: 3 },
        ],
    };
    let (trace, failure) = h.run(&schedule).expect("run");
    assert!(failure.is_none(), "{failure:?}\n{trace}");
    trace
}

/// A delay right after a restart names the informer the restarted process has not opened yet:
/// the resources the run watched so far count, not only the new process's watches.
#[test]
fn a_delay_right_after_a_restart_holds_the_informer_it_names() {
    let trace = passes_a_crash_then_a_delay(1, 5, 1);
    assert!(
        trace.contains("deployments.apps: watch events held until step 8"),
        "{trace}"
    );
}

/// A setup that fails fails the run with what it said, instead of a run without a controller.
#[test]
fn a_failing_controller_setup_is_reported() {
    use std::sync::Arc;
    let h = durable_informer::testing::Harness::for_controller_with(
        |_: durable_informer::testing::Env| async {
            Err::<(durable_informer::controller::Controller<shipped::Foo>, ()), _>("no cluster here")
        },
        |_: Arc<shipped::Foo>, _: Arc<()>| async {
            Ok::<_, std::io::Error>(durable_informer::controller::Action::await_change())
        },
        |_, _, _| durable_informer::controller::Action::await_change(),
    )
    .recording(durable_informer::testing::Recording::open(RECORDING).expect("recording"));
    let (trace, failure) = h
        .run(&Schedule {
            seed: 1,
            faults: vec![],
        })
        .expect("run");
    let f = failure.unwrap_or_else(|| panic!("passed:\n{trace}"));
    assert_eq!(f.oracle, Oracle::Harness, "{f}");
    assert!(f.detail.contains("setting up the controller: no cluster here"), "{f}");
}
