//! Recorded watch traffic: the recording format, the recorder, the replay source and driver,
//! export of a database's log back to a recording, and time travel over the log.
//!
//! It owns recording files. It reads the store only through its public read handles
//! ([`Store`](crate::store::Store), [`LogReader`](crate::store::LogReader)) and writes it only
//! through a [`Reflector`](crate::reflector::Reflector), so a replay takes exactly the path of
//! live traffic (reflector → writer → store → handlers). It never opens a redb transaction and
//! never talks to a network.
//!
//! ## Recording format
//!
//! JSON Lines, one watch event per line exactly as the API server sends it
//! (`{"type":"ADDED","object":{…}}`), so the output of `kubectl get --raw
//! '/api/v1/pods?watch=1'` is a recording as it is. One optional extra top-level field,
//! `"receivedAt"` ([`RECEIVED_AT`]), holds the unix time in **milliseconds** at which the event
//! was received; paced replay uses it. Files may be zstd-compressed (recognised by their magic
//! bytes; the [`Recorder`] compresses when the path ends in `.zst`). The [`Recorder`] writes
//! the server's lines as received (`BOOKMARK` and `ERROR` lines included) when its source gives
//! them ([`Source::watch_raw`](crate::source::Source::watch_raw)).
//!
//! A recording starts with the state at some point, as ADDED lines: the synthetic ADDEDs of a
//! watch without a resourceVersion, or a LIST turned into ADDED lines followed by a BOOKMARK
//! annotated `k8s.io/initial-events-end: "true"` carrying the list's resourceVersion (what a
//! streaming list sends, and what the [`Recorder`] writes). On replay, that leading run of
//! ADDED lines (up to the end bookmark, or up to the first other event) is the initial list;
//! everything after it is the watch.
//!
//! ## Usage
//!
//! ```no_run
//! use durable_informer::replay::{replay_into, ReplayOptions, ReplaySource};
//! use durable_informer::store::{DurableStore, StoreConfig};
//!
//! # async fn f() -> Result<(), Box<dyn std::error::Error>> {
//! let db = DurableStore::open(StoreConfig::new("replayed.redb"))?;
//! let source = ReplaySource::open("pods.jsonl", ReplayOptions::default())?;
//! let report = replay_into(&db, source).await?;
//! println!("{} events replayed up to resourceVersion {}", report.events, report.last_rv);
//! # Ok(()) }
//! ```
//!
//! To drive your own [`Informer`](crate::informer::Informer) (with handlers) instead, build it
//! over a [`ReplaySource`] and wait with [`ReplayHandle::wait_applied`].
//!
//! ## Byte-exact replay
//!
//! The default reflector transform drops `metadata.managedFields`. [`replay_into`] keeps
//! objects byte for byte (it turns that off: see [`ReplayOptions::transform`]), so export after
//! replay gives back the recorded lines. An informer built by you uses the transform you give it.
//!
//! ## Bad input
//!
//! A line that does not decode is an error naming its file and line
//! ([`ReplayError::Malformed`]), or is skipped and counted with [`MalformedPolicy::Skip`]. An
//! unknown event type is always an error ([`ReplayError::UnknownEventType`]). A truncated last
//! line (no newline, does not decode: a crash while recording) is dropped with a warning and
//! reported ([`ReplayReport::truncated_tail`]); so is the cut end of a zstd file whose frame
//! never ended (every complete line before the cut is replayed). A resourceVersion older than the one before it
//! is an error ([`ReplayError::RvRegression`]) or, with [`RvRegressionPolicy::Warn`], a skipped
//! and counted event. A 410 `ERROR` followed by a new initial state (ADDED lines up to an
//! initial-events-end BOOKMARK: what the [`Recorder`] and [`export_log`] write for a relist)
//! is replayed as a relist from that state; other `ERROR` events are counted and not replayed.
//! Corrupt zstd data is an [`ReplayError::Io`] naming the file, line and decompressed byte
//! offset; the [`Recorder`] and export write a zstd checksum so a flipped bit cannot replay as
//! an altered object.
//!
//! ## Memory usage
//!
//! A replay holds one line being decoded, at most 16 chunks of 256 decoded events in the
//! channel to the reflector, and the reflector's batches (at most two in flight): bounded by
//! the longest line, not by the recording's length.
//!
//! ## Time travel
//!
//! [`state_at`] gives a scope's objects at a past resourceVersion and [`history`] one key's
//! log entries, from the delta log while it is retained. Limits:
//!
//! * only what the log retains is reachable: after compaction (see
//!   [`StoreConfig::retention_entries`](crate::store::StoreConfig::retention_entries)), a
//!   resourceVersion older than the scope's oldest retained entry gives
//!   [`ReplayError::HistoryCompacted`], and [`History::complete`] is false;
//! * log order is taken as time and an entry's resourceVersion as its time (integer RVs); a
//!   relist breaks RV order (its deletes carry the deleted object's last RV), so around a relist
//!   the state is that of the log position of the first entry newer than the RV asked for;
//! * [`state_at`] starts from the current objects and undoes newer entries: it holds the
//!   scope's objects plus the entries newer than the RV asked for in memory;
//! * both are blocking and read the scope's whole retained log.
//!
//! ## Determinism
//!
//! Two replays of one recording into fresh databases give byte-identical `objects` and `log`
//! tables, at any speed and batch size: log seqs are dense and assigned in event order, and the
//! one place where the store's bytes depend on a batch boundary (the batch that brings the
//! scope's 256th object trains the zstd dictionary and is compressed with it as a whole) is
//! pinned: the replay source makes that object start a batch, and the initial list is cut into
//! pages by count. This holds for transforms that keep every object (the default); one that
//! drops objects moves the store's count away from the source's. Only the scope record's
//! `last_relist_at_ms` holds a wall-clock time, and a replay relists only at a recorded 410.

mod export;
mod format;
mod history;
mod recorder;
mod source;

use std::path::PathBuf;

pub use export::{export_log, export_log_file, ExportReport};
pub use format::{encode_line, encode_list, event_rv, event_type, RecordedEvent, RecordingReader, RECEIVED_AT};
pub use history::{history, state_at, History};
pub use recorder::{InitialState, Recorder, RecorderConfig, RecorderReport};
pub use source::{replay_into, ReplayHandle, ReplayOptions, ReplayReport, ReplaySource, Speed};

use crate::object::{ResourceVersion, ScopeSpec};
use crate::store::StoreError;

/// What to do with a recording line that does not decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MalformedPolicy {
    /// Stop with [`ReplayError::Malformed`] naming the line (default).
    #[default]
    Fail,
    /// Skip the line with a warning and count it ([`ReplayReport::skipped_malformed`]).
    Skip,
}

/// What to do when a recorded event's resourceVersion is older than the one before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RvRegressionPolicy {
    /// Stop with [`ReplayError::RvRegression`] (default).
    #[default]
    Fail,
    /// Skip the event with a warning and count it ([`ReplayReport::rv_regressions`]); the
    /// store would refuse it anyway (its RV never moves backwards outside a relist).
    Warn,
}

/// Errors of recording, replay, export and time travel. Each names the file and line when
/// one is involved.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReplayError {
    /// No recording file was given.
    #[error("no recording file given")]
    NoInput,
    /// Reading or writing a recording failed.
    #[error("{}{}: {source}", path.display(), line.map(|l| format!(":{l}")).unwrap_or_default())]
    Io {
        /// The file.
        path: PathBuf,
        /// The line being read, when reading.
        line: Option<u64>,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A line is not a watch event (and malformed lines are not skipped).
    #[error("{}:{line}: malformed recording line: {detail}", path.display())]
    Malformed {
        /// The file.
        path: PathBuf,
        /// The 1-based line number.
        line: u64,
        /// What is wrong.
        detail: String,
    },
    /// A line has an event type the API server does not send.
    #[error("{}:{line}: unknown watch event type {kind:?} (expected ADDED, MODIFIED, DELETED, BOOKMARK or ERROR)", path.display())]
    UnknownEventType {
        /// The file.
        path: PathBuf,
        /// The 1-based line number.
        line: u64,
        /// The type found.
        kind: String,
    },
    /// An event's resourceVersion is older than the previous one.
    #[error("{}:{line}: resourceVersion goes backwards from {previous} to {found}", path.display())]
    RvRegression {
        /// The file.
        path: PathBuf,
        /// The 1-based line number.
        line: u64,
        /// The resourceVersion before.
        previous: ResourceVersion,
        /// The resourceVersion of this line.
        found: ResourceVersion,
    },
    /// The recording holds no object to tell what resource it is; give the scope explicitly.
    #[error("{}: the recording holds no object to derive the resource from; set ReplayOptions::scope", path.display())]
    NoScope {
        /// The file.
        path: PathBuf,
    },
    /// A replay goes into a fresh scope only.
    #[error("{0}: the scope already holds data; replay into a fresh database (or another scope)")]
    ScopeNotEmpty(String),
    /// The reflector driving the replay failed.
    #[error("replay: {0}")]
    Reflector(Box<crate::reflector::ReflectorError>),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A recording source failed (recorder).
    #[error(transparent)]
    Source(Box<crate::source::SourceError>),
    /// The replay failed (the message says why; the first waiter gets the detailed error).
    #[error("replay failed: {0}")]
    Failed(String),
    /// The requested history is no longer in the log.
    #[error("the log no longer holds that history: its oldest retained entry for the scope is at resourceVersion {first_retained_rv} (raise StoreConfig::retention_entries, or retention_age if set, to keep more)")]
    HistoryCompacted {
        /// resourceVersion of the oldest retained log entry of the scope.
        first_retained_rv: ResourceVersion,
    },
}

impl ReplayError {
    /// A copy of the errors a recording's reader raises (the others hold errors that cannot be
    /// cloned); an I/O error keeps its kind and message.
    pub(crate) fn duplicate(&self) -> Option<Self> {
        Some(match self {
            ReplayError::Io { path, line, source } => ReplayError::Io {
                path: path.clone(),
                line: *line,
                source: std::io::Error::new(source.kind(), source.to_string()),
            },
            ReplayError::Malformed { path, line, detail } => ReplayError::Malformed {
                path: path.clone(),
                line: *line,
                detail: detail.clone(),
            },
            ReplayError::UnknownEventType { path, line, kind } => ReplayError::UnknownEventType {
                path: path.clone(),
                line: *line,
                kind: kind.clone(),
            },
            ReplayError::RvRegression {
                path,
                line,
                previous,
                found,
            } => ReplayError::RvRegression {
                path: path.clone(),
                line: *line,
                previous: previous.clone(),
                found: found.clone(),
            },
            ReplayError::NoScope { path } => ReplayError::NoScope { path: path.clone() },
            ReplayError::Failed(m) => ReplayError::Failed(m.clone()),
            _ => return None,
        })
    }
}

impl From<crate::reflector::ReflectorError> for ReplayError {
    fn from(e: crate::reflector::ReflectorError) -> Self {
        ReplayError::Reflector(Box::new(e))
    }
}

impl From<crate::source::SourceError> for ReplayError {
    fn from(e: crate::source::SourceError) -> Self {
        ReplayError::Source(Box::new(e))
    }
}

/// The plural resource name of a kind by the API server's default rules (lowercase; `-s`,
/// `-es` after s/x/z/ch/sh, consonant + `y` → `-ies`) plus the irregular kinds of the
/// built-in API (`Endpoints`, …). Custom resources may declare any plural: give the scope
/// explicitly for those.
#[must_use]
pub fn plural_of(kind: &str) -> String {
    let lower = kind.to_ascii_lowercase();
    match lower.as_str() {
        "endpoints" | "podmetrics" | "nodemetrics" => return lower,
        _ => {}
    }
    if lower.ends_with('s')
        || lower.ends_with('x')
        || lower.ends_with('z')
        || lower.ends_with("ch")
        || lower.ends_with("sh")
    {
        return format!("{lower}es");
    }
    if let Some(stem) = lower.strip_suffix('y') {
        if !stem.ends_with(['a', 'e', 'i', 'o', 'u']) {
            return format!("{stem}ies");
        }
    }
    format!("{lower}s")
}

/// The scope of a recording from an object's `apiVersion` (`v1`, `apps/v1`) and `kind`.
#[must_use]
pub fn scope_of(api_version: &str, kind: &str) -> ScopeSpec {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    ScopeSpec::new(group, version, &plural_of(kind))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plurals_follow_the_api_server() {
        for (k, p) in [
            ("Pod", "pods"),
            ("ConfigMap", "configmaps"),
            ("Ingress", "ingresses"),
            ("NetworkPolicy", "networkpolicies"),
            ("Endpoints", "endpoints"),
            ("Gateway", "gateways"),
            ("StorageClass", "storageclasses"),
        ] {
            assert_eq!(plural_of(k), p);
        }
        assert_eq!(
            scope_of("apps/v1", "Deployment"),
            ScopeSpec::new("apps", "v1", "deployments")
        );
    }
}
