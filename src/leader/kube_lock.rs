//! [`LeaseLock`] over a `coordination.k8s.io/v1` Lease through `kube::Client`.

use crate::util::Locked;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams, WatchParams};

use super::{LeaderError, LeaseLock, LeaseRecord};

/// A Lease in a namespace, written as `identity`.
#[derive(Clone)]
pub struct KubeLeaseLock {
    api: Api<Lease>,
    namespace: String,
    name: String,
    identity: String,
    /// Labels this lock writes on the Lease (a shard Lease names its ring).
    labels: BTreeMap<String, String>,
    /// The Lease's labels when last read or written: an update replaces the whole object, and
    /// must keep labels others put there.
    seen_labels: Arc<Mutex<BTreeMap<String, String>>>,
}

impl std::fmt::Debug for KubeLeaseLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The client holds credentials: never print it.
        f.debug_struct("KubeLeaseLock")
            .field("lease", &self.describe())
            .field("identity", &self.identity)
            .field("labels", &self.labels)
            .finish_non_exhaustive()
    }
}

impl KubeLeaseLock {
    /// The Lease `namespace/name`, held as `identity` (unique per replica: the Pod name, say).
    ///
    /// ```no_run
    /// # fn f(client: kube::Client) {
    /// use durable_informer::leader::KubeLeaseLock;
    /// let lock = KubeLeaseLock::new(client, "kube-system", "my-controller", "pod-7d9f");
    /// # }
    /// ```
    #[must_use]
    pub fn new(client: kube::Client, namespace: &str, name: &str, identity: &str) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            identity: identity.to_owned(),
            labels: BTreeMap::new(),
            seen_labels: Arc::default(),
        }
    }

    /// Also writes `key=value` on the Lease, at creation and at every renewal (a shard Lease
    /// carries its ring's label; see [`crate::sharding`]). Labels others set are kept.
    ///
    /// ```no_run
    /// # fn f(client: kube::Client) {
    /// use durable_informer::leader::KubeLeaseLock;
    /// let lock = KubeLeaseLock::new(client, "default", "shard-0", "shard-0")
    ///     .label("alpha.sharding.timebertt.dev/controllerring", "web");
    /// # }
    /// ```
    #[must_use]
    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.labels.insert(key.to_owned(), value.to_owned());
        self
    }

    /// Remembers the labels of a Lease just read or written.
    fn saw(&self, lease: &Lease) {
        let labels = lease.metadata.labels.clone().unwrap_or_default();
        *self.seen_labels.locked() = labels;
    }

    /// The labels to write: those last seen, with ours on top.
    fn labels_to_write(&self) -> Option<BTreeMap<String, String>> {
        let mut labels = self.seen_labels.locked().clone();
        labels.extend(self.labels.clone());
        (!labels.is_empty()).then_some(labels)
    }

    fn api_error(&self, e: kube::Error) -> LeaderError {
        match &e {
            kube::Error::Api(s) if s.code == 409 && s.reason == "AlreadyExists" => {
                LeaderError::AlreadyExists { lease: self.describe() }
            }
            kube::Error::Api(s) if s.code == 409 => LeaderError::Conflict { lease: self.describe() },
            _ => LeaderError::Api {
                lease: self.describe(),
                source: e,
            },
        }
    }

    fn to_lease(&self, r: &LeaseRecord) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(self.namespace.clone()),
                resource_version: r.resource_version.clone(),
                labels: self.labels_to_write(),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: r.holder.clone(),
                // Rounded up: a reader must never see a shorter term than the holder keeps.
                lease_duration_seconds: Some(
                    i32::try_from(r.lease_duration.as_millis().div_ceil(1000).max(1)).unwrap_or(i32::MAX),
                ),
                acquire_time: r.acquire_time.map(MicroTime),
                renew_time: r.renew_time.map(MicroTime),
                lease_transitions: Some(r.transitions),
                ..LeaseSpec::default()
            }),
        }
    }
}

/// A Lease's election fields, as [`KubeLeaseLock`] reads them.
impl From<Lease> for LeaseRecord {
    fn from(l: Lease) -> Self {
        let spec = l.spec.unwrap_or_default();
        LeaseRecord {
            holder: spec.holder_identity.filter(|h| !h.is_empty()),
            lease_duration: Duration::from_secs(
                spec.lease_duration_seconds.map_or(0, |s| u64::try_from(s).unwrap_or(0)),
            ),
            acquire_time: spec.acquire_time.map(|t| t.0),
            renew_time: spec.renew_time.map(|t| t.0),
            transitions: spec.lease_transitions.unwrap_or(0),
            resource_version: l.metadata.resource_version,
        }
    }
}

impl LeaseLock for KubeLeaseLock {
    async fn get(&self) -> Result<Option<LeaseRecord>, LeaderError> {
        let lease = self.api.get_opt(&self.name).await.map_err(|e| self.api_error(e))?;
        if let Some(l) = &lease {
            self.saw(l);
        }
        Ok(lease.map(LeaseRecord::from))
    }

    async fn create(&self, record: &LeaseRecord) -> Result<LeaseRecord, LeaderError> {
        let mut lease = self.to_lease(record);
        lease.metadata.resource_version = None;
        let created = self
            .api
            .create(&PostParams::default(), &lease)
            .await
            .map_err(|e| self.api_error(e))?;
        self.saw(&created);
        Ok(LeaseRecord::from(created))
    }

    async fn update(&self, record: &LeaseRecord) -> Result<LeaseRecord, LeaderError> {
        let replaced = self
            .api
            .replace(&self.name, &PostParams::default(), &self.to_lease(record))
            .await
            .map_err(|e| self.api_error(e))?;
        self.saw(&replaced);
        Ok(LeaseRecord::from(replaced))
    }

    async fn changed(&self, resource_version: Option<String>) {
        use futures::StreamExt;
        let Some(rv) = resource_version else {
            return std::future::pending().await;
        };
        let wp = WatchParams::default()
            .fields(&format!("metadata.name={}", self.name))
            .timeout(60);
        match self.api.watch(&wp, &rv).await {
            // Any event (a change, or an error such as 410) means: read the Lease again.
            Ok(stream) => {
                let mut stream = std::pin::pin!(stream);
                if stream.next().await.is_none() {
                    // The watch timed out with no change: the caller's timer decides.
                    std::future::pending::<()>().await;
                }
            }
            // No watch (RBAC without `watch` on leases, say): poll as client-go does.
            Err(e) => {
                tracing::debug!(lease = %self.describe(), error = %e, "watching the lease failed; polling");
                std::future::pending::<()>().await;
            }
        }
    }

    fn identity(&self) -> &str {
        &self.identity
    }

    fn describe(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}
