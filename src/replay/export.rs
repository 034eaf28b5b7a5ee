//! Export: a database's delta log written back out as a recording.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufWriter, Write};
use std::path::Path;

use super::format::{encode_line, type_meta_of};
use super::ReplayError;
use crate::object::{ObjectKey, ResourceVersion};
use crate::source::{ApiStatus, WatchEvent};
use crate::store::{DeltaKind, LogReader, LogRecord, ScopeId, Seq};

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
    /// Relists written as a 410 `ERROR` line followed by the state the relist ended with.
    pub relists: u64,
}

/// What export knows of one scope: each object's newest log entry, to write the state after
/// a relist.
#[derive(Default)]
struct ScopeState {
    objects: BTreeMap<ObjectKey, Seq>,
    last_rv: Option<ResourceVersion>,
    type_meta: Option<(String, String)>,
    /// Inside a relist: the newest RV its entries carry.
    relist: Option<ResourceVersion>,
    /// Past the leading run of ADDED entries (the initial list, in key order, which replay
    /// takes in any RV order).
    watching: bool,
}

const PAGE: usize = 4096;

/// Writes the retained log of one scope (or of all scopes, interleaved in log order) to `out`
/// as a recording: `{"type":"ADDED|MODIFIED|DELETED","object":<stored bytes>}` per entry, in
/// log order. An update is a MODIFIED; resyncs are left out. No receive time is written (the
/// log does not keep one), and bookmarks are not in the log.
///
/// A relist (after a 410) logs its differences in key order, and its deletes carry the
/// deleted object's last known RV: as watch events they would go back in RV. Export writes
/// such a run as a recorder records a relist: a 410 `ERROR` line, then the state the relist
/// ended with as ADDED lines and an initial-events-end BOOKMARK at its newest RV; replay
/// relists from it ([`ReplayReport::relists`](super::ReplayReport::relists)). Relist
/// entries already in RV order cannot be told from watch events and are written as such (they
/// replay the same). That state holds the objects the retained log names; export keeps one
/// key and seq per such object in memory.
///
/// Record → replay (with [`replay_into`](super::replay_into), which keeps objects byte for
/// byte) → export gives back the recorded ADDED/MODIFIED/DELETED lines, without their
/// `receivedAt` field. Entries already compacted out of the log cannot be exported; a replay
/// of an export of a compacted log therefore starts from the first retained entry.
///
/// With `scope = None` the scopes share one file, interleaved in log order; each scope's lines
/// in it are exactly what exporting that scope alone writes. A recording replays into one
/// scope, so such a file is for reading, not for replay: export each scope on its own to
/// replay it.
///
/// `db` is a [`DurableStore`](crate::store::DurableStore), a
/// [`ReadOnlyStore`](crate::store::ReadOnlyStore) or a [`LogReader`] (by reference).
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
    db: impl Into<LogReader>,
    scope: Option<ScopeId>,
    out: &mut impl Write,
) -> Result<ExportReport, ReplayError> {
    let log: LogReader = db.into();
    let mut report = ExportReport::default();
    let mut after = Seq(0);
    let mut line = Vec::with_capacity(4096);
    let mut scopes: HashMap<ScopeId, ScopeState> = HashMap::new();
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
            if r.kind == DeltaKind::Sync {
                report.syncs += 1;
                continue;
            }
            let state = scopes.entry(r.scope).or_default();
            state.watching |= r.kind != DeltaKind::Added;
            let backwards = state.watching && state.last_rv.as_ref().is_some_and(|last| r.rv.is_older_than(last));
            if let Some(newest) = &state.relist {
                // A relist's entries are not newer than its newest so far, or are deletes; the
                // first newer one is a watch event after it.
                if r.final_state_unknown || !newest.is_older_than(&r.rv) {
                    relist_entry(state, &r);
                    continue;
                }
                end_relist(&log, r.scope, state, &mut line, &mut report, out)?;
            } else if r.final_state_unknown || backwards {
                state.relist = Some(state.last_rv.clone().unwrap_or_default());
                relist_entry(state, &r);
                continue;
            }
            track(state, &r);
            if write_entry(&r, &mut line, &mut report, out)? {
                let newer = state.last_rv.as_ref().is_none_or(|last| !r.rv.is_older_than(last));
                if newer {
                    state.last_rv = Some(r.rv.clone());
                }
            }
        }
    }
    let mut pending: Vec<ScopeId> = scopes
        .iter()
        .filter(|(_, s)| s.relist.is_some())
        .map(|(k, _)| *k)
        .collect();
    pending.sort_unstable_by_key(|s| s.0);
    for id in pending {
        if let Some(state) = scopes.get_mut(&id) {
            end_relist(&log, id, state, &mut line, &mut report, out)?;
        }
    }
    out.flush().map_err(io)?;
    Ok(report)
}

fn io(source: std::io::Error) -> ReplayError {
    ReplayError::Io {
        path: "<export>".into(),
        line: None,
        source,
    }
}

/// Keeps the scope's model current (which entry holds each object's newest version).
fn track(state: &mut ScopeState, r: &LogRecord) {
    if r.kind == DeltaKind::Deleted {
        state.objects.remove(&r.key);
    } else if let Some(bytes) = &r.object {
        if state.type_meta.is_none() {
            state.type_meta = type_meta_of(bytes);
        }
        state.objects.insert(r.key.clone(), r.seq);
    }
}

fn relist_entry(state: &mut ScopeState, r: &LogRecord) {
    track(state, r);
    if !r.final_state_unknown {
        let newest = state.relist.take().unwrap_or_default();
        state.relist = Some(if newest.is_older_than(&r.rv) || newest.is_empty() {
            r.rv.clone()
        } else {
            newest
        });
    }
}

/// Writes a 410 ERROR, then the scope's state as ADDED lines and the end bookmark.
fn end_relist(
    log: &LogReader,
    scope: ScopeId,
    state: &mut ScopeState,
    line: &mut Vec<u8>,
    report: &mut ExportReport,
    out: &mut impl Write,
) -> Result<(), ReplayError> {
    let Some(newest) = state.relist.take() else {
        return Ok(());
    };
    let gone = WatchEvent::Error(ApiStatus {
        code: 410,
        reason: "Expired".into(),
        message: "the watch expired; the state below is what the relist found (written by export)".into(),
        ..ApiStatus::default()
    });
    line.clear();
    encode_line(line, &gone, None, None);
    out.write_all(line).map_err(io)?;
    report.lines += 1;
    for seq in state.objects.values() {
        let Some(r) = log
            .read_after(Seq(seq.0.saturating_sub(1)), 1, Some(scope))?
            .into_iter()
            .find(|r| r.seq == *seq)
        else {
            continue;
        };
        let Some(bytes) = r.object else { continue };
        line.clear();
        line.extend_from_slice(br#"{"type":"ADDED","object":"#);
        line.extend_from_slice(&bytes);
        line.extend_from_slice(b"}\n");
        out.write_all(line).map_err(io)?;
        report.lines += 1;
    }
    let rv = match &state.last_rv {
        Some(last) if newest.is_older_than(last) || newest.is_empty() => last.clone(),
        _ => newest,
    };
    let end = WatchEvent::Bookmark {
        resource_version: rv.clone(),
        initial_events_end: true,
    };
    line.clear();
    let tm = state.type_meta.as_ref().map(|(a, k)| (a.as_str(), k.as_str()));
    encode_line(line, &end, None, tm);
    out.write_all(line).map_err(io)?;
    report.lines += 1;
    report.relists += 1;
    state.last_rv = Some(rv);
    Ok(())
}

/// Writes one entry as a watch line; false when there was nothing to write.
fn write_entry(
    r: &LogRecord,
    line: &mut Vec<u8>,
    report: &mut ExportReport,
    out: &mut impl Write,
) -> Result<bool, ReplayError> {
    let (kind, bytes) = match r.kind {
        DeltaKind::Sync => return Ok(false),
        DeltaKind::Added => ("ADDED", r.object.as_ref()),
        DeltaKind::Updated | DeltaKind::Replaced => ("MODIFIED", r.object.as_ref()),
        DeltaKind::Deleted => {
            if r.object.is_none() {
                report.unknown_final_state += 1;
            }
            ("DELETED", r.object.as_ref().or(r.old.as_ref()))
        }
    };
    let Some(bytes) = bytes else { return Ok(false) };
    line.clear();
    line.extend_from_slice(br#"{"type":""#);
    line.extend_from_slice(kind.as_bytes());
    line.extend_from_slice(br#"","object":"#);
    line.extend_from_slice(bytes);
    line.extend_from_slice(b"}\n");
    out.write_all(line).map_err(io)?;
    report.lines += 1;
    Ok(true)
}

/// [`export_log`] into a file, zstd-compressed when the path ends in `.zst`. The file is
/// created with mode 0600 (a log may hold Secrets).
pub fn export_log_file(
    db: impl Into<LogReader>,
    scope: Option<ScopeId>,
    path: impl AsRef<Path>,
) -> Result<ExportReport, ReplayError> {
    let db: LogReader = db.into();
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
        // Corruption is detected at the frame's end (as in the recorder).
        enc.include_checksum(true).map_err(io)?;
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
