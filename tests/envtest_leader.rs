//! Leader election against real kube-apiservers, v1.20.2 and v1.37.2 (issues #21 and #34):
//! two electors on one Lease, one leader at a time, a clean hand-over on stop, and a takeover
//! after a killed leader's Lease expired.
//!
//! Ignored by default: run `scripts/envtest-install`, then
//! `cargo test --all-features --test 'envtest_*' -- --ignored`.

mod envtest;

use std::time::Duration;

use durable_informer::leader::{KubeLeaseLock, LeaderElectionConfig, LeaderElector, LeaderError};
use envtest::{eventually, on_servers, EnvTest, Server};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use tokio::sync::watch;

fn fast() -> LeaderElectionConfig {
    LeaderElectionConfig {
        lease_duration: Duration::from_secs(2),
        renew_deadline: Duration::from_millis(1500),
        retry_period: Duration::from_millis(250),
        release_on_cancel: true,
    }
}

struct Replica {
    name: &'static str,
    leading: watch::Receiver<bool>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<Result<(), LeaderError>>,
}

async fn replica(env: &EnvTest, name: &'static str) -> Replica {
    // Each replica is its own user where it can be, as separate Pods would be.
    let user = match name {
        "a" => "informer",
        "b" => "controller",
        _ => envtest::ADMIN,
    };
    let client = env.client_as(user).await;
    let elector = LeaderElector::new(KubeLeaseLock::new(client, "kube-system", "e2e-election", name), fast());
    let leading = elector.leadership();
    let (stop, rx) = watch::channel(false);
    let task = tokio::spawn(elector.run(rx));
    Replica {
        name,
        leading,
        stop,
        task,
    }
}

async fn holder(env: &EnvTest) -> Option<String> {
    let api: Api<Lease> = Api::namespaced(env.client().await, "kube-system");
    api.get_opt("e2e-election")
        .await
        .unwrap()
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty())
}

fn leaders(replicas: &[&Replica]) -> Vec<&'static str> {
    replicas
        .iter()
        .filter(|r| !r.task.is_finished() && *r.leading.borrow())
        .map(|r| r.name)
        .collect()
}

on_servers!(two_electors_on_a_real_apiserver_one_leader_hand_over_and_takeover);
async fn two_electors_on_a_real_apiserver_one_leader_hand_over_and_takeover(server: Server) {
    let env = EnvTest::start(server).await;
    let a = replica(&env, "a").await;
    let b = replica(&env, "b").await;
    let first = eventually("a leader", 10, async || {
        let l = leaders(&[&a, &b]);
        (l.len() == 1).then(|| l[0])
    })
    .await;
    assert_eq!(holder(&env).await.as_deref(), Some(first));
    // Renewals keep the same leader; never two at once.
    for _ in 0..40 {
        let l = leaders(&[&a, &b]);
        assert_eq!(l, vec![first], "one and the same leader");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A clean stop releases the Lease: the other takes it within a few retry periods.
    let (leader, other) = if first == "a" { (a, b) } else { (b, a) };
    leader.stop.send(true).unwrap();
    leader.task.await.unwrap().unwrap();
    let handed = tokio::time::Instant::now();
    eventually("the other replica to lead", 10, async || {
        (*other.leading.borrow()).then_some(())
    })
    .await;
    assert!(
        handed.elapsed() < Duration::from_secs(2),
        "handed over before the lease could expire: {:?}",
        handed.elapsed()
    );
    assert_eq!(holder(&env).await.as_deref(), Some(other.name));
    // Killed (no release): a new replica waits for the Lease to expire, then takes it.
    other.task.abort();
    let killed = tokio::time::Instant::now();
    let c = replica(&env, "c").await;
    eventually("a takeover after expiry", 15, async || {
        (*c.leading.borrow()).then_some(())
    })
    .await;
    assert!(
        killed.elapsed() >= Duration::from_secs(2),
        "taken only after the lease duration: {:?}",
        killed.elapsed()
    );
    c.stop.send(true).unwrap();
    c.task.await.unwrap().unwrap();
    assert_eq!(holder(&env).await, None);
}
