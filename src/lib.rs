//! durable-informer: Kubernetes informers whose cache lives in an embedded, crash-safe
//! database ([redb](https://docs.rs/redb)) instead of process memory.
//!
//! The modules, bottom to top; each imports only from the layers below it
//! (`docs/architecture.md` has the picture and the invariants):
//!
//! * floor — [`object`]: the shared vocabulary (`RawObject`, `ObjectMeta`, `ObjectKey`,
//!   `ResourceVersion`, `ScopeSpec`); [`selector`] (label and field selectors) and [`metrics`];
//! * side by side — [`source`]: the list/watch trait, the live `kube::Client` source and the
//!   wire decoder; [`store`]: the redb schema, codec, the single writer thread and the read
//!   handles. Neither imports the other;
//! * [`reflector`]: the list/watch/resume/relist state machine that connects a source to the
//!   store;
//! * [`informer`]: informers, handlers, the dispatcher, listers and the factory; [`queue`]: the
//!   client-go style rate-limited workqueue; [`leader`]: leader election over a Lease;
//!   [`controller`]: the reconcile loop on them; [`sharding`]: label-ring sharding over shard
//!   Leases (on the leader module's elector and the controller's reconcile);
//! * top — [`replay`]: recording, offline replay, export and time travel; [`sim`]: a simulated
//!   Kubernetes API server for tests, benches and the demo; the `durable-informer` binary.
//!
//! [`Error`] wraps every module's own error enum; nothing in the crate imports it.
//!
//! The names most applications need are re-exported here:
//!
//! ```no_run
//! use durable_informer::{DurableStore, Informer, StoreConfig};
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube::{Api, Client};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let client = Client::try_default().await?;
//! let db = tokio::task::spawn_blocking(|| DurableStore::open(StoreConfig::new("cache.redb"))).await??;
//! let configmaps = Informer::from_api(&db, Api::<ConfigMap>::all(client)).build().await?;
//! configmaps.wait_for_sync().await?;
//! println!("{} configmaps", configmaps.lister().state()?.len());
//! # Ok(())
//! # }
//! ```
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "metrics")]
pub mod metrics;
#[cfg(not(feature = "metrics"))]
mod metrics;
pub mod object;
pub mod selector;

pub mod source;
pub mod store;

pub mod reflector;

pub mod controller;
pub mod informer;
pub mod leader;
pub mod queue;
pub mod sharding;

pub mod replay;
#[cfg(feature = "sim")]
pub mod sim;
#[cfg(feature = "testing")]
pub mod testing;

pub mod error;
mod util;

pub use error::{Error, Result};
pub use object::{ObjectKey, ResourceVersion};

// The names an application uses, at the crate root (kube-rs style); each module keeps the rest.
pub use controller::Controller;
pub use informer::{handler_fn, Event, HandlerOptions, Informer, InformerFactory, Lister};
pub use leader::{LeaderElectionConfig, LeaderElector};
pub use queue::WorkQueue;
pub use reflector::ReflectorConfig;
pub use store::{Durability, DurableStore, StoreConfig};

/// The README's and docs/' examples as doc tests.
#[cfg(doctest)]
mod doc_tests;
