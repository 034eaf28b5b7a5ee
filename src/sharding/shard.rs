//! The shard's side: reconcile only the objects assigned to this shard, and acknowledge a drain
//! by removing both labels instead of reconciling.
//!
//! The acknowledgement runs inside the controller's worker for that key, so it never overlaps
//! a reconcile of the key on this shard (the workqueue gives a key to one worker at a time);
//! the sharder assigns the object to its new shard only after it sees both labels gone. So no
//! key is reconciled by two shards at once, as long as each shard also reconciles only while
//! it holds its Lease ([`shard_lease`](super::shard_lease)).

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::FutureExt;
use kube::api::{Api, Patch, PatchParams};
use kube::core::{ApiResource, DynamicObject, Resource};
use serde_json::json;

use super::ShardingError;
use crate::controller::{requeue_rate_limited, Action};
use crate::informer::Informer;
use crate::informer::Metadata;
use crate::object::ObjectKey;
use crate::selector::RingMember;
use crate::store::StoreError;

/// How many times an acknowledgement that met a conflict reads the object again and retries.
const CONFLICT_RETRIES: usize = 5;

/// What a shard should do with a key, judged from its own cache
/// ([`RingShard::responsibility`]).
///
/// ```no_run
/// # async fn f(shard: durable_informer::sharding::RingShard, informer: durable_informer::informer::Informer<k8s_openapi::api::core::v1::ConfigMap>, key: durable_informer::object::ObjectKey) -> Result<(), Box<dyn std::error::Error>> {
/// use durable_informer::sharding::Responsibility;
/// use k8s_openapi::api::core::v1::ConfigMap;
/// let configmaps = kube::core::ApiResource::erase::<ConfigMap>(&());
/// match shard.responsibility(&informer.metadata(), &key)? {
///     Responsibility::Reconcile => println!("reconcile {key}"),
///     Responsibility::Drain { resource_version } => {
///         shard.acknowledge_drain(&configmaps, &key, &resource_version).await?;
///     }
///     Responsibility::NotOurs => {}
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Responsibility {
    /// Assigned to this shard: reconcile it.
    Reconcile,
    /// Assigned to this shard and being drained: acknowledge (remove both labels), do not
    /// reconcile. Carries the resourceVersion the decision was made on.
    Drain {
        /// The cached object's resourceVersion.
        resource_version: String,
    },
    /// Not in the cache (deleted, or moved away: both come as deletes through the shard's
    /// label-selected watch) or assigned elsewhere: leave it alone.
    NotOurs,
}

/// One shard of a ring, on the shard's side.
///
/// ```no_run
/// use std::sync::Arc;
/// use durable_informer::controller::{default_error_policy, Action, Controller};
/// use durable_informer::informer::Informer;
/// use durable_informer::leader::LeaderElectionConfig;
/// use durable_informer::selector::RingLabels;
/// use durable_informer::sharding::{shard_lease, RingShard};
/// use durable_informer::store::{DurableStore, StoreConfig};
/// use futures::StreamExt;
/// use k8s_openapi::api::apps::v1::Deployment;
///
/// async fn reconcile(d: Arc<Deployment>, _ctx: Arc<()>) -> Result<Action, std::io::Error> {
///     println!("reconcile {:?}", d.metadata.name);
///     Ok(Action::await_change())
/// }
///
/// # async fn f(client: kube::Client, pod_name: &str) -> Result<(), Box<dyn std::error::Error>> {
/// let me = RingLabels::new("web")?.member(pod_name)?;
/// let db = DurableStore::open(StoreConfig::new("deployments.redb"))?;
/// // Only the Deployments assigned to this shard, cached across restarts.
/// let deployments = Informer::from_api(&db, kube::Api::<Deployment>::all(client.clone()))
///     .ring_shard(&me)
///     .build()
///     .await?;
/// let shard = RingShard::new(client.clone(), me.clone());
/// let lease = shard_lease(client, "default", &me, LeaderElectionConfig::default());
/// let controller = Controller::for_informer(deployments.clone()).leader_election(lease.fenced_leadership());
/// let (stop_tx, stop) = tokio::sync::watch::channel(false);
/// let lease_task = tokio::spawn(lease.run(stop)); // stop the controller first: the Lease is released last
/// controller
///     .shutdown_on_signal()
///     .run(shard.guard(&deployments, reconcile), default_error_policy, Arc::new(()))
///     .for_each(|_| async {})
///     .await;
/// stop_tx.send(true)?;
/// lease_task.await??;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RingShard {
    client: kube::Client,
    member: RingMember,
    acknowledged: Arc<AtomicU64>,
}

impl std::fmt::Debug for RingShard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The client holds credentials: never print it.
        f.debug_struct("RingShard")
            .field("member", &self.member)
            .field("acknowledged", &self.drains_acknowledged())
            .finish_non_exhaustive()
    }
}

impl RingShard {
    /// Shard `member`, writing its acknowledgements through `client`.
    #[must_use]
    pub fn new(client: kube::Client, member: RingMember) -> Self {
        Self {
            client,
            member,
            acknowledged: Arc::default(),
        }
    }

    /// The ring and shard id.
    #[must_use]
    pub fn member(&self) -> &RingMember {
        &self.member
    }

    /// Drains this shard acknowledged so far.
    #[must_use]
    pub fn drains_acknowledged(&self) -> u64 {
        self.acknowledged.load(Ordering::Relaxed)
    }

    /// What to do with `key`, from the shard's cache (a read of one object's metadata).
    pub fn responsibility(&self, metadata: &Metadata, key: &ObjectKey) -> Result<Responsibility, StoreError> {
        // The state the event that woke the reconcile carried: the informer's cache, which
        // takes a change before redb has it.
        let found = metadata.get(key)?.map(|meta| {
            (
                self.member.owns(&meta.labels),
                self.member.ring().draining(&meta.labels),
                meta.resource_version.as_str().to_owned(),
            )
        });
        Ok(match found {
            Some((true, true, resource_version)) => Responsibility::Drain { resource_version },
            Some((true, false, _)) => Responsibility::Reconcile,
            _ => Responsibility::NotOurs,
        })
    }

    /// Acknowledges the drain of `key` (of `resource`): removes the shard and drain labels,
    /// conditioned on `resource_version`. On a conflict it reads the object again and retries
    /// while it is still this shard's and still draining. Returns whether the labels were
    /// removed by this call.
    pub async fn acknowledge_drain(
        &self,
        resource: &ApiResource,
        key: &ObjectKey,
        resource_version: &str,
    ) -> Result<bool, ShardingError> {
        let api: Api<DynamicObject> = match &key.namespace {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, resource),
            None => Api::all_with(self.client.clone(), resource),
        };
        let ring = self.member.ring();
        let api_err = |source: kube::Error| ShardingError::Api {
            what: format!("acknowledging the drain of {} {key}", resource.plural),
            source,
        };
        let mut rv = resource_version.to_owned();
        for _ in 0..CONFLICT_RETRIES {
            let body = json!({"metadata": {"resourceVersion": rv, "labels": {
                ring.shard_label(): null,
                ring.drain_label(): null,
            }}});
            match api
                .patch(&key.name, &PatchParams::default(), &Patch::Merge(&body))
                .await
            {
                Ok(_) => {
                    self.acknowledged.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(shard = self.member.shard(), object = %key, "drain acknowledged");
                    return Ok(true);
                }
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    let Some(fresh) = api.get_metadata_opt(&key.name).await.map_err(api_err)? else {
                        return Ok(false);
                    };
                    let labels = fresh.metadata.labels.unwrap_or_default();
                    if !self.member.owns(&labels) || !ring.draining(&labels) {
                        return Ok(false);
                    }
                    rv = fresh.metadata.resource_version.unwrap_or_default();
                }
                Err(kube::Error::Api(s)) if s.code == 404 => return Ok(false),
                Err(e) => return Err(api_err(e)),
            }
        }
        Err(ShardingError::Contended {
            what: format!("acknowledging the drain of {} {key}", resource.plural),
        })
    }

    /// `reconcile`, run only for the objects this shard is responsible for: a drained object
    /// is acknowledged instead, one not in the cache or assigned elsewhere is skipped (as
    /// timebertt's shard library does: use finalizers for work on deletion). A failed
    /// acknowledgement is retried through the rate limiter.
    pub fn guard<K, Ctx, F, Fut, E>(
        &self,
        informer: &Informer<K>,
        reconcile: F,
    ) -> impl Fn(Arc<K>, Arc<Ctx>) -> BoxFuture<'static, Result<Action, E>> + Send + Sync + 'static
    where
        K: Resource<DynamicType = ()> + serde::de::DeserializeOwned + Send + Sync + 'static,
        Ctx: Send + Sync + 'static,
        F: Fn(Arc<K>, Arc<Ctx>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Action, E>> + Send + 'static,
        E: Send + 'static,
    {
        self.guard_dynamic(ApiResource::erase::<K>(&()), informer.metadata(), reconcile)
    }

    /// [`guard`](Self::guard) for a resource named at run time, with the informer's metadata.
    pub fn guard_dynamic<K, Ctx, F, Fut, E>(
        &self,
        resource: ApiResource,
        metadata: Metadata,
        reconcile: F,
    ) -> impl Fn(Arc<K>, Arc<Ctx>) -> BoxFuture<'static, Result<Action, E>> + Send + Sync + 'static
    where
        K: Resource + Send + Sync + 'static,
        Ctx: Send + Sync + 'static,
        F: Fn(Arc<K>, Arc<Ctx>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Action, E>> + Send + 'static,
        E: Send + 'static,
    {
        let shard = self.clone();
        let resource = Arc::new(resource);
        move |obj: Arc<K>, ctx: Arc<Ctx>| {
            let meta = obj.meta();
            let key = ObjectKey {
                namespace: meta.namespace.clone(),
                name: meta.name.clone().unwrap_or_default(),
            };
            let decided = shard.responsibility(&metadata, &key);
            match decided {
                Ok(Responsibility::Reconcile) => reconcile(obj, ctx).boxed(),
                Ok(Responsibility::NotOurs) => async { Ok(Action::await_change()) }.boxed(),
                Ok(Responsibility::Drain { resource_version }) => {
                    let (shard, resource) = (shard.clone(), resource.clone());
                    async move {
                        if let Err(e) = shard.acknowledge_drain(&resource, &key, &resource_version).await {
                            tracing::warn!(shard = shard.member.shard(), object = %key, error = %e, "acknowledging a drain failed; retrying");
                            return Ok(requeue_rate_limited());
                        }
                        Ok(Action::await_change())
                    }
                    .boxed()
                }
                Err(e) => {
                    tracing::warn!(object = %key, error = %e, "reading the cache to check the shard failed; retrying");
                    async { Ok(requeue_rate_limited()) }.boxed()
                }
            }
        }
    }
}
