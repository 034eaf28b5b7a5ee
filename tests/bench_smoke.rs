//! Smoke test of `benches/compare.rs`: runs its scenario functions at N = 200 with a short rate
//! ladder so CI exercises the harness. Checks only sanity (counts, no full LIST on our restart,
//! the ladder's bookkeeping), never speed. The Go peers (client-go, controller-runtime) are
//! built through `scripts/build-peers` and driven over their line protocol the same way.

#[path = "../benches/compare/charts.rs"]
mod charts;
// `scenarios` reads the redb cache knob from here; the child command is the bench's alone.
#[allow(dead_code)]
#[path = "../benches/common/child.rs"]
mod child;
#[path = "../benches/compare/peers.rs"]
mod peers;
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

/// The Go toolchain the peers build with, if there is one (`GO`, or `go` on PATH).
fn go_toolchain() -> Option<String> {
    let go = std::env::var("GO").unwrap_or_else(|_| "go".into());
    let ok = std::process::Command::new(&go)
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success());
    ok.then_some(go)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_peers_speak_the_protocol() {
    if go_toolchain().is_none() && std::env::var("BENCH_PEER_BIN").is_err() {
        // Not a pass in disguise: say loudly what was not checked.
        eprintln!(
            "SKIPPED go_peers_speak_the_protocol: no Go toolchain (GO or `go` on PATH), so \
             scripts/build-peers cannot build the client-go and controller-runtime peers"
        );
        return;
    }
    let bin = tokio::task::spawn_blocking(peers::build).await.unwrap().unwrap();
    let sim = tokio::task::spawn_blocking(|| scenarios::start_sim(N).unwrap())
        .await
        .unwrap();
    let n = N as u64;
    let ladder = scenarios::Ladder {
        rates: vec![100, 200],
        step: Duration::from_millis(300),
        always_up_to: 200,
        drain_timeout: Duration::from_secs(60),
        sample_every: Duration::from_millis(50),
    };
    for kind in [peers::CLIENT_GO, peers::CONTROLLER_RUNTIME] {
        let who = kind.label;
        let lc = peers::lifecycle(&bin, kind, &sim, N, 0).await.unwrap();
        for (phase, ph) in [("cold", &lc.cold), ("restart", &lc.restart), ("relist", &lc.relist)] {
            assert_eq!(ph.objects, n, "{who} {phase}: {ph:?}");
            assert!(
                ph.events >= n,
                "{who} {phase}: every object reaches the handler: {ph:?}"
            );
            assert!(ph.served.objects() >= n, "{who} {phase}: a full list each time: {ph:?}");
            assert!(ph.secs > 0.0);
        }
        assert_eq!(lc.restart_busy.objects, n, "{who}: {:?}", lc.restart_busy);
        assert_eq!(lc.changed, 2);

        let st = peers::steady(&bin, kind, &sim, N, &ladder).await.unwrap();
        assert_eq!(st.steps.len(), 2, "{who}: {st:?}");
        for step in &st.steps {
            assert!(step.written > 0, "{who}: {step:?}");
            assert!(step.drained, "{who}: the peer caught up at {}/s: {step:?}", step.target);
            assert_eq!(step.samples, step.written, "{who}: every update timed: {step:?}");
            assert!(step.p50_ms > 0.0 && step.p50_ms < 10_000.0, "{who}: {step:?}");
        }

        let r = peers::reads(&bin, kind, &sim, N, 50, 2).await.unwrap();
        assert_eq!(r.list_ns_len, n / scenarios::namespace_count(N) as u64, "{who}: {r:?}");
        assert!(r.by_label_len > 0, "{who}: {r:?}");
        assert!(
            r.get_us > 0.0 && r.list_ns_us > 0.0 && r.by_label_us > 0.0,
            "{who}: {r:?}"
        );

        let url = sim.url();
        let b = bin.clone();
        let m = tokio::task::spawn_blocking(move || peers::memory_child(&b, kind, &url, N))
            .await
            .unwrap()
            .unwrap();
        assert!(m.vm_hwm_kib > 1024 && m.secs > 0.0, "{who}: {m:?}");
    }
    // Both Go peers select the same objects as kube-runtime's store does.
    let theirs = scenarios::theirs_reads(&sim, N, 10, 1).await.unwrap();
    let cg = peers::reads(&bin, peers::CLIENT_GO, &sim, N, 10, 1).await.unwrap();
    assert_eq!(cg.by_label_len, theirs.by_label_len);
}

/// A chart shows only what was measured: a panel with nothing to draw reports no data (the
/// harness leaves it out), and a system with no point is not in the legend.
#[test]
fn charts_draw_only_what_was_measured() {
    let point = |x: f64, y: f64| charts::Point {
        x,
        med: y,
        min: y,
        max: y,
    };
    let series = |label: &str, points: Vec<charts::Point>, color| charts::Series {
        label: label.into(),
        points,
        color,
        secondary: false,
    };
    let empty = charts::Panel {
        title: "not measured".into(),
        x_desc: "N".into(),
        y_desc: "s".into(),
        series: vec![
            series("durable-informer", vec![], 0),
            series("client-go", vec![point(1000.0, f64::NAN)], 2),
        ],
    };
    assert!(!empty.has_data());
    let measured = charts::Panel {
        title: "measured".into(),
        x_desc: "N".into(),
        y_desc: "s".into(),
        series: vec![
            series("durable-informer", vec![point(1000.0, 0.5)], 0),
            series("kube-runtime", vec![], 1),
            series("client-go", vec![point(1000.0, 0.7)], 2),
        ],
    };
    assert!(measured.has_data());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.svg");
    charts::write(&path, &[measured]).unwrap();
    let svg = std::fs::read_to_string(&path).unwrap();
    assert!(svg.contains("durable-informer") && svg.contains("client-go"), "{svg}");
    assert!(
        !svg.contains("kube-runtime"),
        "a system with no point is not in the legend"
    );
}
