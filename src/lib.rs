//! durable-informer: Kubernetes informers whose cache lives in an embedded, crash-safe
//! database ([redb](https://docs.rs/redb)) instead of process memory.
//!
//! The pipeline, one module per stage (see `design.md`):
//!
//! * [`store`] — the redb schema, codec, the single writer thread and the read handles;
//! * [`sim`] — a simulated Kubernetes API server for tests, benches and the demo;
//! * [`queue`] — client-go style rate-limited workqueue;
//! * [`replay`] — recording live watch traffic, replaying it offline, export and time travel.
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod controller;
pub mod error;
pub mod informer;
pub mod metrics;
pub mod object;
pub mod reflector;
pub mod replay;
pub mod selector;
pub mod source;
pub mod store;

#[cfg(feature = "sim")]
pub mod sim;

pub mod queue;

pub use error::{Error, Result};
