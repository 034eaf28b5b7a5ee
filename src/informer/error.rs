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
    /// [`wait_for_sync`](super::Informer::wait_for_sync) (or a reader's `wait_until_ready`) on
    /// an informer nobody started: it would never sync.
    #[error("the informer of {resource} was not started within {grace:?} of waiting for its sync; call start() (or run()) first")]
    NotStarted {
        /// The resource (`pods`, `deployments.apps`).
        resource: String,
        /// How long the wait gave it to start.
        grace: std::time::Duration,
    },
    /// A handler stopped (removed, or its informer dropped) before it synced.
    #[error("the handler stopped before it synced")]
    HandlerStopped,
}

/// Something that went wrong while an informer ran: what [`Informer::issues`](super::Informer::issues)
/// keeps (the last 100). The informer goes on after each (the reflector retries; a handler
/// gets the next event) unless the reflector met a fatal error.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum InformerIssue {
    /// The reflector met an error.
    #[error(transparent)]
    Reflector(#[from] ReflectorError),
    /// Building the informer created a new scope beside another of the same resource and
    /// namespace that no informer of this process uses: a selector, version or namespace
    /// change leaves the old scope in the file until it is dropped.
    #[error("{old} ({spec}, {objects} objects) is another scope of this resource that no informer of this process uses (a selector change leaves the old scope behind); drop it with `durable-informer scopes drop` or Writer::drop_scope, or set StoreConfig::drop_unused_scopes_after")]
    ScopeLeftBehind {
        /// The other scope.
        old: crate::store::ScopeId,
        /// Its canonical spec.
        spec: String,
        /// How many objects it holds.
        objects: u64,
    },
    /// A handler failed, panicked, or could not be given an event.
    #[error("{handler}{problem}")]
    Handler {
        /// The handler's cursor name, or `volatile handler`.
        handler: String,
        /// What happened.
        problem: HandlerProblem,
    },
}

/// What went wrong for one handler.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum HandlerProblem {
    /// The handler returned an error (its own, through [`HandlerError::downcast_ref`](super::HandlerError::downcast_ref)).
    #[error(" failed: {0}")]
    Failed(super::HandlerError),
    /// The handler panicked (the panic's message).
    #[error(" panicked: {0}")]
    Panicked(String),
    /// A stored object does not decode as the handler's type; the event was skipped.
    #[error(": {key}{}: does not decode: {message}", seq.map(|s| format!(" at seq {}", s.0)).unwrap_or_default())]
    Undecodable {
        /// The object.
        key: crate::object::ObjectKey,
        /// Its log position, for a logged change (none for the synthetic adds of a store scan).
        seq: Option<crate::store::Seq>,
        /// The decoder's message.
        message: String,
    },
    /// A volatile handler fell more than `limit` changes behind: until it catches up it is
    /// told each changed object's newest state (its intermediate states are skipped; memory
    /// stays bounded).
    #[error(" fell more than {limit} changes behind; it is told each object's newest state until it catches up")]
    FellBehind {
        /// The most changes told one by one.
        limit: usize,
    },
    /// A log entry of a durable handler does not decode (a damaged row in the database,
    /// which `durable-informer check` lists): the handler skipped it rather than stop there,
    /// and what it may have missed was told again, as `recovery` says.
    #[error(": log entry {} is damaged and was skipped ({message}); {recovery}", seq.0)]
    DamagedLogEntry {
        /// The entry's seq.
        seq: crate::store::Seq,
        /// Its object, when its header still decodes (`None`: any object of the scope).
        key: Option<crate::object::ObjectKey>,
        /// What does not decode.
        message: String,
        /// What the handler was told instead.
        recovery: &'static str,
    },
    /// A store that does not fsync (`StoreConfig::durable(false)`) took back, on a reopen
    /// after an I/O error, commits the durable handler had been told of, and it had been told
    /// of more keys since the file last held them than are tracked: it was told every stored
    /// object again, but an object it was told of that no longer exists stays in its state.
    #[error(
        " was told of commits the store took back (to seq {}), beyond the {kept} keys tracked; \
         it was told every stored object again, but not the deletes of what it was told only in those commits",
        to.0
    )]
    RollbackNotTracked {
        /// What the store went back to.
        to: crate::store::Seq,
        /// The most keys tracked.
        kept: usize,
    },
    /// Reading the log, the store or the cursor failed, or persisting the cursor did.
    #[error(": {context}{error}")]
    Store {
        /// What the dispatcher was doing (`reading the log: `), or empty.
        context: &'static str,
        /// The store's error.
        error: std::sync::Arc<StoreError>,
    },
}
