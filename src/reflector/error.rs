//! The reflector's errors.

use std::sync::Arc;

use super::transform::TransformError;
use crate::object::ResourceVersion;
use crate::source::SourceError;
use crate::store::StoreError;

/// Errors of the reflector. Each names the resource, the RV and what the server said.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ReflectorError {
    /// Talking to the server failed.
    #[error("{source} (resourceVersion \"{rv}\"{})", continue_token.as_ref().map(|t| format!(", continue {t:?}")).unwrap_or_default())]
    Source {
        /// The failure.
        #[source]
        source: SourceError,
        /// The RV the request was made from (for a LIST page after the first, the list's RV;
        /// `""` is a consistent read of the current state).
        rv: ResourceVersion,
        /// The continue token of a LIST page after the first.
        continue_token: Option<String>,
    },
    /// The store refused or failed a write.
    #[error("{resource}: store: {source}")]
    Store {
        /// The resource.
        resource: String,
        /// What the store said (shared: the error is cloned into the status and every report).
        #[source]
        source: Arc<StoreError>,
    },
    /// A paginated LIST kept expiring (410 on its continue token) and was given up.
    #[error("{resource}: list restarted {restarts} times; the last: {source}")]
    ListRestarts {
        /// The resource.
        resource: String,
        /// How many times the list started over.
        restarts: u32,
        /// The last page's failure.
        #[source]
        source: SourceError,
    },
    /// An object was not stored (a stored older version of it is deleted).
    #[error("{resource}: {source} (resourceVersion \"{rv}\")")]
    Transform {
        /// The resource.
        resource: String,
        /// Why.
        #[source]
        source: TransformError,
        /// The object's RV.
        rv: ResourceVersion,
    },
    /// The database belongs to another cluster (fatal: the reflector stops).
    #[error(transparent)]
    ClusterMismatch(Arc<StoreError>),
    /// A list (or a streaming list's end bookmark) carried no resourceVersion. Nothing is
    /// persisted: a watch from `""` starts at "now" and would silently skip every change made
    /// since the list, so the list is retried instead.
    #[error("{resource}: the {what} carried no resourceVersion; nothing is stored as synced")]
    NoResourceVersion {
        /// The resource.
        resource: String,
        /// `list` or `initial-events-end bookmark`.
        what: &'static str,
    },
    /// User code run by the reflector (a transform) panicked: the reflector stops, and the
    /// informer no longer reports synced.
    #[error("{resource}: {what} panicked: {message}")]
    Panicked {
        /// The resource.
        resource: String,
        /// What panicked.
        what: &'static str,
        /// The panic's message.
        message: String,
    },
}
