//! The umbrella [`Error`]: one type for callers that do not care which stage failed.
//!
//! Each stage owns its error enum ([`crate::store::StoreError`],
//! [`crate::reflector::ReflectorError`], [`crate::informer::InformerError`], …); nothing in the
//! crate imports this one, so it can wrap them all without a cycle. Credentials never appear in
//! any message.

use crate::informer::InformerError;
use crate::object::ObjectError;
use crate::reflector::ReflectorError;
use crate::sharding::ShardingError;
use crate::source::SourceError;
use crate::store::StoreError;

/// The umbrella error of the crate.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An object's JSON is not a Kubernetes object.
    #[error(transparent)]
    Object(#[from] ObjectError),
    /// The durable store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Talking to the API server failed.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// A reflector stopped with an error.
    #[error(transparent)]
    Reflector(#[from] ReflectorError),
    /// Building or shutting down an informer failed.
    #[error(transparent)]
    Informer(#[from] InformerError),
    /// Label-ring sharding failed.
    #[error(transparent)]
    Sharding(#[from] ShardingError),
    /// An I/O error outside the database.
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
}

/// Result with the crate's [`Error`] by default.
pub type Result<T, E = Error> = std::result::Result<T, E>;
