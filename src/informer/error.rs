//! The informer's errors: building one, and what stopped it.

use crate::reflector::ReflectorError;
use crate::store::StoreError;

/// Why an informer could not be built or shut down cleanly.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InformerError {
    /// The durable store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A reflector stopped with an error.
    #[error(transparent)]
    Reflector(#[from] ReflectorError),
    /// An informer of Secrets was built without `allow_secrets()`.
    #[error("caching Secrets stores them on disk in the database file; call allow_secrets() on the informer builder to accept that")]
    SecretsNotAllowed,
    /// The reflector stopped before the cache synced (a fatal error such as another cluster's
    /// database, or [`Informer::stop`](super::Informer::stop)): the cache is not a complete view.
    #[error("the informer of {resource} stopped before its cache synced{}", last_error.as_ref().map(|e| format!(": {e}")).unwrap_or_default())]
    NotSynced {
        /// The resource (`pods`, `deployments.apps`).
        resource: String,
        /// The reflector's last error, if it had one.
        last_error: Option<String>,
    },
    /// A blocking task (closing the database) panicked or was cancelled.
    #[error("closing the database: {0}")]
    Join(#[source] tokio::task::JoinError),
}
