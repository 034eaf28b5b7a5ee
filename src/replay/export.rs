//! Export: a database's delta log written back out as a recording.

use std::io::{BufWriter, Write};
use std::path::Path;

use super::ReplayError;
use crate::store::{DeltaKind, DurableStore, ScopeId, Seq};

/// What an export wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExportReport {
    /// Lines written.
    pub lines: u64,
    /// Resync entries left out (they change nothing).
    pub syncs: u64,
    /// Deletes found by a relist, whose final state is unknown: written as DELETED with the
    /// last known state.
    pub unknown_final_state: u64,
    /// The last log seq exported.
    pub last_seq: Seq,
}

const PAGE: usize = 4096;

/// Writes the retained log of one scope (or of all scopes, interleaved in log order) to `out`
/// as a recording: `{"type":"ADDED|MODIFIED|DELETED","object":<stored bytes>}` per entry, in
/// log order. An update is a MODIFIED; resyncs are left out. No receive time is written (the
/// log does not keep one), and bookmarks are not in the log.
///
/// Record → replay (with [`replay_into`](super::replay_into), which keeps objects byte for
/// byte) → export gives back the recorded ADDED/MODIFIED/DELETED lines, without their
/// `receivedAt` field. Entries already compacted out of the log cannot be exported; a replay
/// of an export of a compacted log therefore starts from the first retained entry. A recording
/// replays into one scope: export one scope to replay it.
///
/// Blocking (it reads the database in pages of 4096 entries).
///
/// ```no_run
/// use durable_informer::replay::export_log;
/// use durable_informer::store::{DurableStore, StoreConfig};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let db = DurableStore::open(StoreConfig::new("cache.redb"))?;
/// let (scope, _) = db.scopes()?.into_iter().next().ok_or("no scope")?;
/// export_log(&db, Some(scope), &mut std::io::stdout().lock())?;
/// # Ok(()) }
/// ```
pub fn export_log(
    db: &DurableStore,
    scope: Option<ScopeId>,
    out: &mut impl Write,
) -> Result<ExportReport, ReplayError> {
    let log = db.log();
    let mut report = ExportReport::default();
    let mut after = Seq(0);
    let mut line = Vec::with_capacity(4096);
    let io = |source| ReplayError::Io {
        path: "<export>".into(),
        line: None,
        source,
    };
    loop {
        let (records, scanned) = match scope {
            Some(s) => log.read_scope_after(after, PAGE, s)?,
            None => {
                let records = log.read_after(after, PAGE, None)?;
                let last = records.last().map_or(after, |r| r.seq);
                (records, last)
            }
        };
        if scanned == after {
            break;
        }
        after = scanned;
        for r in records {
            report.last_seq = r.seq;
            let (kind, bytes) = match r.kind {
                DeltaKind::Sync => {
                    report.syncs += 1;
                    continue;
                }
                DeltaKind::Added => ("ADDED", r.object),
                DeltaKind::Updated | DeltaKind::Replaced => ("MODIFIED", r.object),
                DeltaKind::Deleted => {
                    if r.object.is_none() {
                        report.unknown_final_state += 1;
                    }
                    ("DELETED", r.object.or(r.old))
                }
            };
            let Some(bytes) = bytes else { continue };
            line.clear();
            line.extend_from_slice(br#"{"type":""#);
            line.extend_from_slice(kind.as_bytes());
            line.extend_from_slice(br#"","object":"#);
            line.extend_from_slice(&bytes);
            line.extend_from_slice(b"}\n");
            out.write_all(&line).map_err(io)?;
            report.lines += 1;
        }
    }
    out.flush().map_err(io)?;
    Ok(report)
}

/// [`export_log`] into a file, zstd-compressed when the path ends in `.zst`. The file is
/// created with mode 0600 (a log may hold Secrets).
pub fn export_log_file(
    db: &DurableStore,
    scope: Option<ScopeId>,
    path: impl AsRef<Path>,
) -> Result<ExportReport, ReplayError> {
    let path = path.as_ref();
    let io = |source| ReplayError::Io {
        path: path.to_owned(),
        line: None,
        source,
    };
    let file = super::recorder::create_private(path).map_err(io)?;
    let mut out = BufWriter::with_capacity(256 << 10, file);
    if path.extension().is_some_and(|e| e == "zst") {
        let mut enc = zstd::stream::write::Encoder::new(out, 3).map_err(io)?;
        let report = export_log(db, scope, &mut enc)?;
        let mut out = enc.finish().map_err(io)?;
        out.flush().map_err(io)?;
        Ok(report)
    } else {
        let report = export_log(db, scope, &mut out)?;
        out.flush().map_err(io)?;
        Ok(report)
    }
}
