//! Smoke test of `benches/compare.rs`: runs its scenario functions at N = 200 so CI exercises
//! the harness. Checks only sanity (counts, no full LIST on our restart), never speed.

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

    let ours = scenarios::ours_lifecycle(&sim, N, dir.path()).await.unwrap();
    assert_eq!(ours.cold.objects, n);
    assert_eq!(ours.cold.served.objects(), n, "cold sync served each object once");
    assert_eq!(ours.restart.objects, n);
    assert_eq!(
        ours.restart.served.list_requests, 1,
        "restart: only the one-object RV probe"
    );
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

    let theirs = scenarios::theirs_lifecycle(&sim, N).await.unwrap();
    assert_eq!(theirs.cold.objects, n);
    assert!(
        theirs.restart.served.list_objects >= n,
        "kube-runtime relists from scratch"
    );
    assert!(theirs.relist.events >= n, "kube-runtime re-applies everything");

    let d = Duration::from_millis(300);
    let so = scenarios::ours_steady(&sim, 50, 50, d, N, dir.path()).await.unwrap();
    let st = scenarios::theirs_steady(&sim, 50, 50, d, N).await.unwrap();
    assert!(so.events_per_sec > 0.0 && st.events_per_sec > 0.0);
    assert!(so.latency_samples > 0 && st.latency_samples > 0);

    let ro = scenarios::ours_reads(&sim, N, 50, 2, dir.path()).await.unwrap();
    let rt = scenarios::theirs_reads(&sim, N, 50, 2).await.unwrap();
    assert_eq!(ro.list_ns_len, n / scenarios::NAMESPACES as u64);
    assert_eq!(ro.list_ns_len, rt.list_ns_len);
    assert_eq!(ro.by_label_len, rt.by_label_len);
    assert!(ro.by_label_len > 0);
}
