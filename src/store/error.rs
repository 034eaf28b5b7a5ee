//! The store's errors: every way opening, writing or reading the database can fail.
//!
//! Messages say what happened and, where the caller can act, what to do; they name no CLI flag
//! and never carry credentials.

use std::path::PathBuf;

use super::codec::CodecError;
use super::{ScopeId, Seq};
use crate::object::{KeyError, ObjectError, ResourceVersion};

/// Errors of the durable store (opening, writing, reading).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The file exists but is not a redb database.
    #[error("{path}: not a durable-informer database (no redb header); pass a new path or remove the file")]
    NotADatabase {
        /// The file.
        path: PathBuf,
    },
    /// Another process (or another handle in this one) has the database open.
    #[error("{path}: the database is locked: another process, or another open store in this one, has it; close it or use another database file")]
    Locked {
        /// The file.
        path: PathBuf,
    },
    /// The database is damaged.
    #[error("{path}: the database is corrupted ({detail}); restore a backup or delete the file to rebuild it from the cluster")]
    Corrupted {
        /// The file.
        path: PathBuf,
        /// What was found.
        detail: String,
    },
    /// Written by a newer release with a schema this build does not know.
    #[error("{path}: database schema version {found} is newer than this build supports ({supported}); upgrade durable-informer or use another file")]
    NewerSchema {
        /// The file.
        path: PathBuf,
        /// The schema version found.
        found: u32,
        /// The newest schema version this build knows.
        supported: u32,
    },
    /// A read-only open found an older schema: reading never migrates (the writing process does
    /// that when it opens the file).
    #[error("{path}: database schema version {found} is older than this build reads ({supported}); a read-only open never upgrades it: open it once with the program that writes it, or use a build of that release")]
    OlderSchema {
        /// The file.
        path: PathBuf,
        /// The schema version found.
        found: u32,
        /// The schema version this build reads.
        supported: u32,
    },
    /// A read-only open found a file a writer left unclean and no live writer recovering it;
    /// recovery writes, which a read-only open never does.
    #[error("{path}: the database was not closed cleanly and needs recovery, which a read-only open never does; start the program that writes it (it recovers on open)")]
    NeedsRecovery {
        /// The file.
        path: PathBuf,
    },
    /// The database was filled from another cluster.
    #[error("database belongs to cluster {stored:?}, but the server is cluster {found:?}; use another database file, or reset it to rebuild from this cluster")]
    ClusterMismatch {
        /// Identity stored in the database.
        stored: String,
        /// Identity of the server now.
        found: String,
    },
    /// An I/O error opening or creating the file.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// redb failed (a full disk shows up here as an I/O error with "No space left on device").
    #[error("{path}: storage error: {source}; the last committed state is intact")]
    Storage {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: redb::Error,
    },
    /// A value in the database or an incoming object does not encode/decode.
    #[error(transparent)]
    Codec(#[from] CodecError),
    /// An object key cannot be stored.
    #[error(transparent)]
    Key(#[from] KeyError),
    /// A batch would move a scope's resourceVersion backwards outside a relist (invariant 2).
    #[error("{scope}: resourceVersion would go backwards from {persisted} to {offered}; relist instead")]
    RvRegression {
        /// The scope.
        scope: ScopeId,
        /// What is persisted.
        persisted: ResourceVersion,
        /// What the batch carried.
        offered: ResourceVersion,
    },
    /// A batch required the scope to be at least at an RV (the one its predecessor in the same
    /// stream reached), and it is not: the predecessor did not commit.
    #[error("{scope}: the previous batch did not commit (persisted resourceVersion {persisted:?}, required {required}); re-watch from the persisted one")]
    PredecessorMissing {
        /// The scope.
        scope: ScopeId,
        /// What is persisted.
        persisted: Option<ResourceVersion>,
        /// What the batch required.
        required: ResourceVersion,
    },
    /// No scope with that id.
    #[error("{0}: no such scope in this database")]
    UnknownScope(ScopeId),
    /// A scope cannot be dropped while an informer of this process uses it (it registered the
    /// scope since the store was opened).
    #[error("{0} is in use by this process (an informer registered it since the database was opened); drop it from a process that does not use it")]
    ScopeInUse(ScopeId),
    /// No index of that name on the scope.
    #[error("{scope}: no index named {name:?} (register it with the informer's indexers)")]
    UnknownIndex {
        /// The scope.
        scope: ScopeId,
        /// The index name.
        name: String,
    },
    /// The index exists but its backfill over the objects the scope already held has not
    /// finished, so its answers would be partial. Retry once [`crate::store::Writer::ensure_index`]
    /// has returned (see [`crate::store::Snapshot::index_status`]).
    #[error("{scope}: index {name:?} is still being backfilled over the scope's existing objects; retry once ensure_index has returned")]
    IndexNotReady {
        /// The scope.
        scope: ScopeId,
        /// The index name.
        name: String,
    },
    /// A consumer without a durable cursor fell behind the log's retention: entries after its
    /// position were compacted before it read them.
    #[error("log entries after seq {after} were compacted before they were read (the oldest retained is {first_retained}); the consumer starts again from the current state. Register the handler with a durable name, or raise StoreConfig::retention_entries")]
    LogCompacted {
        /// The consumer's position.
        after: u64,
        /// The first seq still in the log.
        first_retained: u64,
    },
    /// The database is not open: the store was closed (this handle outlived it), or the
    /// writer is reopening the file after an I/O error (for as long as that keeps failing, on
    /// a full disk until space returns). Retry later.
    #[error("{path}: the database was closed")]
    Closed {
        /// The file.
        path: PathBuf,
    },
    /// The writer thread has stopped (the store was closed, or it failed to start), or it
    /// dropped a command's reply after a panic of its own (it went on; the command was not
    /// committed).
    #[error("the database writer has stopped")]
    WriterGone,
    /// A durable cursor was set past the log's last seq.
    #[error("cursor {cursor} is past the log's last seq {last}")]
    CursorPastLog {
        /// The cursor asked for.
        cursor: Seq,
        /// The last seq handed out.
        last: Seq,
    },
    /// A durable cursor read before a rollback (a reopen after an I/O error took back
    /// commits): the seqs it names may have been handed out again, so it was not persisted.
    #[error("cursor {cursor} was read before a rollback of the log; not persisted")]
    CursorRolledBack {
        /// The cursor asked for.
        cursor: Seq,
    },
    /// User code the writer ran (an index function) panicked: the command's group was not
    /// committed, nothing of it was kept or shown, and the writer went on.
    #[error("{what} panicked: {message}")]
    Panicked {
        /// What panicked.
        what: String,
        /// The panic's message.
        message: String,
    },
    /// The [`StoreConfig`](super::StoreConfig) asks for two things that exclude each other.
    #[error("invalid store configuration: {0}")]
    Config(String),
    /// Another command in the same group commit failed, so this one was not committed.
    #[error("not committed: {0}")]
    Aborted(String),
    /// A lister of an informer that was never started: it would serve the database's last
    /// state as if current.
    #[error("the informer of {resource} was never started, so its lister would serve the database's last state as current; call start() (or run()) first, or read Informer::store() for the stored state as is")]
    NotStarted {
        /// The resource (`pods`, `deployments.apps`).
        resource: String,
    },
}

impl StoreError {
    /// A copy suitable for acknowledging every command of an aborted group commit.
    pub(crate) fn to_aborted(&self) -> StoreError {
        StoreError::Aborted(self.to_string())
    }
}

impl From<ObjectError> for StoreError {
    fn from(e: ObjectError) -> Self {
        StoreError::Codec(CodecError::Object(e))
    }
}
