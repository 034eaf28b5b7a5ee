//! Label-ring sharding over shard Leases (timebertt's kubernetes-controller-sharding): each
//! replica holds a Lease of its own, a sharder labels every object with the shard a
//! consistent-hash ring over the live Leases assigns it to, and each replica's informer selects
//! only its label. It owns the ring, the shard states and the label writes; it never touches
//! the store (the shard's informer caches what its label selects).
//!
//! * [`shard_lease`]: a shard's Lease, held and renewed by the leader module's elector, released
//!   on clean shutdown.
//! * [`Sharder`]: watches the ring's Leases ([`ShardLeases`], [`ShardState`]) and the sharded
//!   objects' metadata, assigns unassigned objects and those of dead shards, and moves objects
//!   off live shards through the **drain handshake** (drain label → the shard removes both
//!   labels → the sharder assigns the new shard).
//! * [`RingShard`]: the shard's side; [`RingShard::guard`] wraps a reconcile function so the
//!   shard reconciles only its objects and acknowledges drains instead.
//! * [`InformerBuilder::ring_shard`](crate::informer::InformerBuilder::ring_shard) and
//!   [`InformerFactory::ring_shard`](crate::informer::InformerFactory::ring_shard): informers
//!   that cache only the shard's objects (label selector `shard.…/<ring>=<shard>`). The scope is
//!   persisted with its selector, so a shard restarted with the same id resumes without a LIST.
//!
//! The labels are timebertt's (`alpha.sharding.timebertt.dev`, see
//! [`RingLabels`](crate::selector::RingLabels)), and so is the ring (XXH64, 100 virtual nodes
//! per shard, keys `group/kind/namespace/name` or the controller's): either project's shards
//! and sharder can share a ring.
//!
//! ## Example
//!
//! ```no_run
//! use durable_informer::selector::RingLabels;
//! use durable_informer::sharding::{ShardedResource, Sharder};
//! use k8s_openapi::api::core::v1::ConfigMap;
//!
//! # async fn f(client: kube::Client) -> Result<(), Box<dyn std::error::Error>> {
//! // One replica (say, the leader) runs the sharder of ring "web"…
//! let sharder = Sharder::new(client, "default", RingLabels::new("web")?)
//!     .resource(ShardedResource::of::<ConfigMap>());
//! let (_stop_tx, stop) = tokio::sync::watch::channel(false);
//! sharder.run(stop).await?;
//! // …and every replica runs a shard: see [`RingShard`].
//! # Ok(()) }
//! ```

mod lease;
mod ring;
mod shard;
mod sharder;

pub use lease::{shard_lease, ShardLeases, ShardState, ORPHAN_AFTER, SHARDER_IDENTITY};
pub use ring::{controller_ring_key, ring_key, HashRing, DEFAULT_TOKENS_PER_SHARD};
pub use shard::{Responsibility, RingShard};
pub use sharder::{ShardedResource, Sharder, SharderConfig, SharderStatus};

/// Errors of label-ring sharding.
///
/// ```
/// use durable_informer::sharding::ShardingError;
/// let e = ShardingError::Contended { what: "acknowledging the drain of configmaps ns/cm".into() };
/// assert!(e.to_string().contains("kept changing"));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ShardingError {
    /// The API server refused or failed a request.
    #[error("{what}: {source}")]
    Api {
        /// What was being done.
        what: String,
        /// What the client said.
        #[source]
        source: kube::Error,
    },
    /// A write kept conflicting with other writers after its retries.
    #[error("{what}: the object kept changing (conflicts on every retry)")]
    Contended {
        /// What was being done.
        what: String,
    },
}
