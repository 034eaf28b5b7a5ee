//! The store's metric family (a section of [`crate::metrics`]).

use std::path::Path;
use std::sync::OnceLock;

#[cfg(feature = "metrics")]
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet};

use crate::metrics::prom::{Counter, Family, Gauge};
#[cfg(feature = "metrics")]
use crate::metrics::{add_section, encode_family};

/// Labels: database file.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
#[cfg_attr(feature = "metrics", derive(EncodeLabelSet))]
pub(crate) struct DatabaseLabels {
    /// The database file's name: its directory is a deployment detail (a volume mount), and
    /// a full path would change the series when the volume moves.
    database: String,
}

fn db_size() -> &'static Family<DatabaseLabels, Gauge> {
    static FAMILY: OnceLock<Family<DatabaseLabels, Gauge>> = OnceLock::new();
    FAMILY.get_or_init(|| {
        #[cfg(feature = "metrics")]
        add_section("store", encode);
        Family::default()
    })
}

fn scopes_dropped() -> &'static Family<DatabaseLabels, Counter> {
    static FAMILY: OnceLock<Family<DatabaseLabels, Counter>> = OnceLock::new();
    FAMILY.get_or_init(|| {
        db_size();
        Family::default()
    })
}

fn damaged_rows() -> &'static Family<DatabaseLabels, Counter> {
    static FAMILY: OnceLock<Family<DatabaseLabels, Counter>> = OnceLock::new();
    FAMILY.get_or_init(|| {
        db_size();
        Family::default()
    })
}

fn budget_exceeded() -> &'static Family<DatabaseLabels, Gauge> {
    static FAMILY: OnceLock<Family<DatabaseLabels, Gauge>> = OnceLock::new();
    FAMILY.get_or_init(|| {
        db_size();
        Family::default()
    })
}

fn storage_errors() -> &'static Family<DatabaseLabels, Counter> {
    static FAMILY: OnceLock<Family<DatabaseLabels, Counter>> = OnceLock::new();
    FAMILY.get_or_init(|| {
        db_size();
        Family::default()
    })
}

fn reopens() -> &'static Family<DatabaseLabels, Counter> {
    static FAMILY: OnceLock<Family<DatabaseLabels, Counter>> = OnceLock::new();
    FAMILY.get_or_init(|| {
        db_size();
        Family::default()
    })
}

fn labels(path: &Path) -> DatabaseLabels {
    let database = path
        .file_name()
        .map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
    DatabaseLabels { database }
}

/// Records the size of the database file at `path` (`durable_informer_database_bytes`).
pub(crate) fn observe_db_size(path: &Path) {
    if let Ok(m) = std::fs::metadata(path) {
        db_size()
            .get_or_create(&labels(path))
            .set(i64::try_from(m.len()).unwrap_or(i64::MAX));
    }
}

/// Counts a scope dropped for being unused (`durable_informer_scopes_dropped_total`).
pub(crate) fn scope_dropped(path: &Path) {
    scopes_dropped().get_or_create(&labels(path)).inc();
}

/// Records that the parts of the memory budget that cannot give way exceed it
/// (`durable_informer_memory_budget_exceeded`).
pub(crate) fn memory_budget_exceeded(path: &Path) {
    budget_exceeded().get_or_create(&labels(path)).set(1);
}

/// Counts a damaged stored row that a reader or the writer went past
/// (`durable_informer_damaged_rows_skipped_total`).
pub(crate) fn damaged_row_skipped(path: &Path) {
    damaged_rows().get_or_create(&labels(path)).inc();
}

/// Counts an I/O error the writer met, in any commit, its own maintenance ones included
/// (`durable_informer_storage_errors_total`).
pub(crate) fn storage_error(path: &Path) {
    storage_errors().get_or_create(&labels(path)).inc();
}

/// Counts a reopen of the file after an I/O error (`durable_informer_database_reopens_total`).
pub(crate) fn reopened(path: &Path) {
    reopens().get_or_create(&labels(path)).inc();
}

#[cfg(feature = "metrics")]
fn encode(e: &mut DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
    encode_family(e, "durable_informer_database_bytes", "Database file size", db_size())?;
    encode_family(
        e,
        "durable_informer_scopes_dropped",
        "Scopes dropped for being unused longer than StoreConfig::drop_unused_scopes_after",
        scopes_dropped(),
    )?;
    encode_family(
        e,
        "durable_informer_damaged_rows_skipped",
        "Damaged stored rows (objects, log entries) a reader or the writer went past; DurableStore::check lists those still damaged",
        damaged_rows(),
    )?;
    encode_family(
        e,
        "durable_informer_memory_budget_exceeded",
        "1 when redb's page cache, the informers' keys, metadata and postings and the change stream's and syncs' bounds alone exceed StoreConfig::memory_budget",
        budget_exceeded(),
    )?;
    encode_family(
        e,
        "durable_informer_storage_errors",
        "I/O errors the writer met (failed writes, fsyncs, a full disk), in any commit, its own maintenance commits included",
        storage_errors(),
    )?;
    encode_family(
        e,
        "durable_informer_database_reopens",
        "Reopens of the database file after an I/O error; each takes back the commits the file lacks",
        reopens(),
    )
}
