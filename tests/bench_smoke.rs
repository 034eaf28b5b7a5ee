//! Smoke test of `benches/compare.rs`: runs its scenario functions at N = 200 with a short rate
//! ladder so CI exercises the harness. Checks only sanity (counts, no full LIST on our restart,
//! the ladder's bookkeeping), never speed.

#[path = "../benches/compare/scenarios.rs"]
mod scenarios;

use std::time::Duration;

const N: usize = 200;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compare_scenarios_at_200() {
    let sim = tokio::task::spawn_blocking(|| scenarios::start_sim(N).unwrap())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let n = N as u64;

    let ours = scenarios::ours_lifecycle(&sim, N, dir.path(), 0).await.unwrap();
    assert_eq!(ours.cold.objects, n);
    assert_eq!(ours.cold.served.objects(), n, "cold sync served each object once");
    assert_eq!(ours.restart.objects, n);
    assert_eq!(
        ours.restart.served.list_requests, 2,
        "restart: only the one-object RV probe and the watch cache's revision"
    );
    // 2b: the same while a Lease keeps changing.
    assert_eq!(ours.restart_busy.objects, n);
    assert_eq!(ours.restart_busy.served.list_requests, 2);
    assert!(ours.restart_busy.served.objects() <= 1);
    assert_eq!(ours.restart_busy.events, 0, "the Lease changes are no Pod events");
    assert!(
        ours.restart.served.objects() <= 1,
        "restart listed {:?}",
        ours.restart.served
    );
    assert_eq!(ours.restart.events, 0, "nothing changed while down");
    assert_eq!(ours.changed, 2);
    assert!(
        (1..=ours.changed).contains(&ours.relist.events),
        "relist delivers the differences only: {} events for {} changes",
        ours.relist.events,
        ours.changed
    );
    assert_eq!(ours.relist.objects, n);

    let theirs = scenarios::theirs_lifecycle(&sim, N, 0).await.unwrap();
    assert_eq!(theirs.cold.objects, n);
    assert!(
        theirs.restart.served.list_objects >= n,
        "kube-runtime relists from scratch"
    );
    assert!(theirs.restart_busy.served.list_objects >= n);
    assert!(theirs.relist.events >= n, "kube-runtime re-applies everything");

    let ladder = scenarios::Ladder {
        rates: vec![100, 200, 400],
        step: Duration::from_millis(300),
        always_up_to: 200,
        drain_timeout: Duration::from_secs(60),
        sample_every: Duration::from_millis(50),
    };
    let before = sim.current_rv();
    let so = scenarios::ours_steady(&sim, N, &ladder, dir.path()).await.unwrap();
    let st = scenarios::theirs_steady(&sim, N, &ladder).await.unwrap();
    assert!(sim.current_rv() > before, "the ladder wrote updates");
    for (who, s) in [("ours", &so), ("theirs", &st)] {
        assert!(s.steps.len() >= 2, "{who}: rates up to always_up_to always run: {s:?}");
        assert_eq!(s.steps[0].target, 100);
        assert!(
            ["consumer", "producer", "top"].contains(&s.ended_by.as_str()),
            "{who}: {}",
            s.ended_by
        );
        for step in &s.steps {
            assert!(step.written > 0 && !step.lag_samples.is_empty(), "{who}: {step:?}");
            assert!(step.samples <= step.written, "{who}: {step:?}");
            if step.drained {
                assert_eq!(step.samples, step.written, "{who}: every write observed: {step:?}");
            }
        }
    }

    let ro = scenarios::ours_reads(&sim, N, 50, 2, dir.path()).await.unwrap();
    let rt = scenarios::theirs_reads(&sim, N, 50, 2).await.unwrap();
    assert_eq!(ro.list_ns_len, n / scenarios::namespace_count(N) as u64);
    assert_eq!(ro.list_ns_len, rt.list_ns_len);
    assert_eq!(ro.by_label_len, rt.by_label_len);
    assert!(ro.by_label_len > 0);
}
