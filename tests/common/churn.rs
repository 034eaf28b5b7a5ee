//! Another resource changing all the time, as node and leader-election Leases do in every real
//! cluster: the cluster-wide resourceVersion runs ahead while the watched resource is quiet.
//! Shared by the busy-restart tests and benches (`#[path]`-included there).
#![allow(dead_code)] // Each user takes a part.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, Patch, PatchParams, PostParams};

/// A Lease renewed (patched) every `every` until [`stop`](Self::stop).
pub struct LeaseChurn {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<Result<u64, kube::Error>>,
}

impl LeaseChurn {
    /// Creates the Lease `namespace/holder` (the namespace must exist on a real server; an
    /// existing Lease is reused) and starts renewing it.
    pub async fn start(client: kube::Client, namespace: &str, every: Duration) -> Result<Self, kube::Error> {
        let api: Api<Lease> = Api::namespaced(client, namespace);
        let lease: Lease = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "holder", "namespace": namespace},
            "spec": {"holderIdentity": "someone", "leaseDurationSeconds": 15}
        }))
        .expect("a Lease");
        match api.create(&PostParams::default(), &lease).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(e),
        }
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(async move {
            let mut renewals = 0u64;
            while !*stopped.borrow() {
                renewals += 1;
                let patch = serde_json::json!({"spec": {"leaseTransitions": renewals}});
                api.patch("holder", &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
                tokio::select! {
                    () = tokio::time::sleep(every) => {}
                    _ = stopped.changed() => {}
                }
            }
            Ok(renewals)
        });
        Ok(Self { stop, task })
    }

    /// Stops renewing; returns how many renewals were made.
    pub async fn stop(self) -> Result<u64, kube::Error> {
        self.stop.send_replace(true);
        self.task.await.expect("the churn task")
    }
}
