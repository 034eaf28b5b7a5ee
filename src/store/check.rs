//! `check`: verifies the invariants of the design over one read transaction.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::PermissionsExt;

use redb::{ReadableDatabase, ReadableTable};

use super::codec::{self, BackfillProgress, Compression, DataRef, PrevRef};
use super::schema::{
    keys, IndexName, ScopeId, COMMIT_TIMES, CURSORS, DICTS, INDEX, INDEX_BACKFILL, INDEX_REV, LOG, META, META_LAST_SEQ,
    OBJECTS, SCOPES, SHARDS,
};
use super::writer::RESUME_SCAN;
use super::{read, Shared, StoreError};
use crate::object::ObjectKey;

/// What `check` found. `problems` is empty when every invariant holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CheckReport {
    /// Scopes examined.
    pub scopes: u64,
    /// Object rows examined.
    pub objects: u64,
    /// Log entries examined.
    pub log_entries: u64,
    /// Index rows examined.
    pub index_rows: u64,
    /// Violations, one line each.
    pub problems: Vec<String>,
}

impl CheckReport {
    /// True when every invariant holds.
    #[must_use]
    pub fn is_ok(&self) -> bool {
        self.problems.is_empty()
    }
}

pub(crate) fn run(shared: &Shared) -> Result<CheckReport, StoreError> {
    let st = |e: redb::Error| shared.storage(e);
    let mut report = CheckReport::default();
    let txn = shared.db()?.begin_read().map_err(|e| st(e.into()))?;
    let scopes = txn.open_table(SCOPES).map_err(|e| st(e.into()))?;
    let objects = txn.open_table(OBJECTS).map_err(|e| st(e.into()))?;
    let log = txn.open_table(LOG).map_err(|e| st(e.into()))?;
    let index = txn.open_table(INDEX).map_err(|e| st(e.into()))?;
    let index_rev = txn.open_table(INDEX_REV).map_err(|e| st(e.into()))?;
    let cursors = txn.open_table(CURSORS).map_err(|e| st(e.into()))?;
    let dicts = txn.open_table(DICTS).map_err(|e| st(e.into()))?;
    let commit_times = txn.open_table(COMMIT_TIMES).map_err(|e| st(e.into()))?;
    let backfill = txn.open_table(INDEX_BACKFILL).map_err(|e| st(e.into()))?;
    let shards = txn.open_table(SHARDS).map_err(|e| st(e.into()))?;
    // Every dictionary a blob names must exist (rows are never removed).
    let mut dict_ids = BTreeSet::new();
    for row in dicts.iter().map_err(|e| st(e.into()))? {
        let (k, _) = row.map_err(|e| st(e.into()))?;
        dict_ids.insert(k.value());
    }
    let missing_dict = |c: Compression| match c {
        Compression::Dict { scope, dict } if !dict_ids.contains(&(scope, dict)) => {
            Some(format!("names missing dictionary {dict} of scope {scope}"))
        }
        _ => None,
    };

    // Invariant 5.
    if let Ok(m) = std::fs::metadata(&shared.path) {
        let mode = m.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            report.problems.push(format!(
                "database file mode is {mode:o}, expected 600 (it may hold Secrets)"
            ));
        }
    }

    // Invariant 4: dense seqs; every entry decodes; previous-state pointers resolve.
    let mut expected: Option<u64> = None;
    let mut last = 0;
    for row in log.iter().map_err(|e| st(e.into()))? {
        let (k, v) = row.map_err(|e| st(e.into()))?;
        let seq = k.value();
        if let Some(e) = expected {
            if seq != e {
                report.problems.push(format!("log seq gap: expected {e}, found {seq}"));
            }
        }
        expected = Some(seq + 1);
        last = seq;
        report.log_entries += 1;
        match codec::decode_log(v.value()) {
            Ok((h, _, _)) => {
                let prev_tag = match h.prev {
                    PrevRef::Inline(c) => c,
                    _ => Compression::None,
                };
                for problem in [missing_dict(h.compression), missing_dict(prev_tag)]
                    .into_iter()
                    .flatten()
                {
                    report.problems.push(format!("log entry {seq} {problem}"));
                }
                if let PrevRef::Log(p) = h.prev {
                    if p >= seq || log.get(p).map_err(|e| st(e.into()))?.is_none() {
                        report
                            .problems
                            .push(format!("log entry {seq} points at missing previous entry {p}"));
                    }
                }
            }
            Err(e) => report.problems.push(format!("log entry {seq}: {e}")),
        }
    }
    // Commit times: one row per retained commit, the first at the first retained seq, none
    // outside the log, never decreasing.
    let first_seq = log.first().map_err(|e| st(e.into()))?.map(|(k, _)| k.value());
    let mut first_time_key = None;
    let mut previous: Option<(u64, u64)> = None;
    for row in commit_times.iter().map_err(|e| st(e.into()))? {
        let (k, v) = row.map_err(|e| st(e.into()))?;
        let (seq, time) = (k.value(), v.value());
        first_time_key.get_or_insert(seq);
        match first_seq {
            Some(first) if (first..=last).contains(&seq) => {}
            _ => report.problems.push(format!(
                "commit time of seq {seq} is outside the log ({})",
                first_seq.map_or("empty".to_owned(), |f| format!("{f}..={last}"))
            )),
        }
        if let Some((pseq, ptime)) = previous {
            if time < ptime {
                report.problems.push(format!(
                    "commit time of seq {seq} ({time} ms) is before that of seq {pseq} ({ptime} ms)"
                ));
            }
        }
        previous = Some((seq, time));
    }
    if let Some(first) = first_seq {
        if first_time_key != Some(first) {
            report
                .problems
                .push(format!("the first retained log entry {first} has no commit time row"));
        }
    }

    // Backfills in progress, by scope.
    let mut backfilling: BTreeMap<ScopeId, BTreeMap<IndexName, BackfillProgress>> = BTreeMap::new();
    for row in backfill.iter().map_err(|e| st(e.into()))? {
        let (k, v) = row.map_err(|e| st(e.into()))?;
        let (scope, name) = k.value();
        match codec::decode_backfill(v.value()) {
            Ok(p) => {
                backfilling
                    .entry(ScopeId(scope))
                    .or_default()
                    .insert(IndexName(name.to_owned()), p);
            }
            Err(e) => report
                .problems
                .push(format!("backfill of index {name:?} of scope#{scope}: {e}")),
        }
    }
    for (scope, names) in &backfilling {
        if scopes.get(scope.0).map_err(|e| st(e.into()))?.is_none() {
            for name in names.keys() {
                report
                    .problems
                    .push(format!("backfill of index {name} names missing {scope}"));
            }
        }
    }

    let last_seq_saved = {
        let meta = txn.open_table(META).map_err(|e| st(e.into()))?;
        let saved = meta.get(META_LAST_SEQ).map_err(|e| st(e.into()))?;
        saved.map_or(0, |v| <[u8; 8]>::try_from(v.value()).map_or(0, u64::from_be_bytes))
    };
    for row in cursors.iter().map_err(|e| st(e.into()))? {
        let (k, v) = row.map_err(|e| st(e.into()))?;
        // Compaction may have emptied the log below the cursor: compare with the last seq ever
        // handed out.
        let handed_out = last.max(last_seq_saved);
        if v.value() > handed_out {
            let (scope, name) = k.value();
            report.problems.push(format!(
                "cursor {name:?} of {} at {} is past the last log seq {handed_out}",
                ScopeId(scope),
                v.value()
            ));
        }
    }

    for row in scopes.iter().map_err(|e| st(e.into()))? {
        let (k, v) = row.map_err(|e| st(e.into()))?;
        let scope = ScopeId(k.value());
        report.scopes += 1;
        let record = match codec::decode_scope(v.value()) {
            Ok(r) => r,
            Err(e) => {
                report.problems.push(format!("{scope}: record does not decode: {e}"));
                continue;
            }
        };
        // Every object of a sharded scope is in its range (a change of range drops the others
        // in its own transaction).
        let shard = match shards.get(scope.0).map_err(|e| st(e.into()))? {
            Some(v) => match codec::decode_shard(v.value()) {
                Ok(r) => r.range,
                Err(e) => {
                    report
                        .problems
                        .push(format!("{scope}: shard record does not decode: {e}"));
                    None
                }
            },
            None => None,
        };
        let (start, end) = keys::scope_range(scope);
        let mut count = 0u64;
        let in_progress = backfilling.remove(&scope).unwrap_or_default();
        for name in in_progress.keys() {
            if record.indexes.contains(&name.0) {
                report
                    .problems
                    .push(format!("{scope}: index {name} is both ready and being backfilled"));
            }
        }
        // Index rows the index functions give over the object table (invariant 3), per object.
        let indexers = shared.indexes.for_scope(scope);
        let mut want: BTreeMap<IndexName, BTreeMap<ObjectKey, BTreeSet<Vec<u8>>>> = BTreeMap::new();
        for row in objects
            .range::<&[u8]>(start.as_slice()..end.as_slice())
            .map_err(|e| st(e.into()))?
        {
            let (k, v) = row.map_err(|e| st(e.into()))?;
            count += 1;
            report.objects += 1;
            let key = match keys::decode_object(k.value()) {
                Ok((_, key)) => key,
                Err(e) => {
                    report.problems.push(format!("{scope}: {e}"));
                    continue;
                }
            };
            let (h, inline) = match codec::decode_object(v.value()) {
                Ok(x) => x,
                Err(e) => {
                    report.problems.push(format!("{scope}: object {key}: {e}"));
                    continue;
                }
            };
            if h.data == DataRef::Inline {
                if let Some(problem) = missing_dict(h.compression) {
                    report.problems.push(format!("{scope}: object {key} {problem}"));
                }
            }
            if h.meta.key() != key {
                report
                    .problems
                    .push(format!("{scope}: row {key} holds metadata of {}", h.meta.key()));
            }
            if let Some(range) = &shard {
                if !super::writer::in_shard(range, &h.meta) {
                    report
                        .problems
                        .push(format!("{scope}: object {key} is outside the scope's shard {range}"));
                }
            }
            // Invariant 2: the scope's RV is not behind the data it describes.
            if let Some(rv) = &record.rv {
                if rv.is_older_than(&h.meta.resource_version) {
                    report.problems.push(format!(
                        "{scope}: object {key} has RV {} newer than the scope RV {rv}",
                        h.meta.resource_version
                    ));
                }
            }
            if let DataRef::Log(seq) = h.data {
                match log.get(seq).map_err(|e| st(e.into()))? {
                    None => report
                        .problems
                        .push(format!("{scope}: object {key} points at missing log entry {seq}")),
                    Some(row) => match codec::decode_log(row.value()) {
                        Ok((lh, _, _)) if lh.key != key || lh.scope != scope.0 || lh.rv != h.meta.resource_version => {
                            report.problems.push(format!(
                                "{scope}: object {key} points at log entry {seq} of another version"
                            ));
                        }
                        _ => {}
                    },
                }
            }
            for ix in &indexers {
                if !record.indexes.contains(&ix.name.0) && !in_progress.contains_key(&ix.name) {
                    continue;
                }
                match read::object_bytes(shared, &log, &h, inline, &read::txn_loader(shared, &txn)) {
                    Ok(json) => {
                        let rows = want.entry(ix.name.clone()).or_default().entry(key.clone()).or_default();
                        match ix.values_caught(&h.meta, &json) {
                            Ok(values) => {
                                for value in values {
                                    rows.insert(keys::index(scope, &ix.name, &value.into(), &key));
                                }
                            }
                            Err(e) => report.problems.push(format!("{scope}: object {key}: {e}")),
                        }
                    }
                    Err(e) => report.problems.push(format!("{scope}: object {key}: {e}")),
                }
            }
        }
        if count != record.object_count {
            report.problems.push(format!(
                "{scope}: record counts {} objects, table holds {count}",
                record.object_count
            ));
        }
        let names: BTreeSet<IndexName> = record
            .indexes
            .iter()
            .map(|n| IndexName(n.clone()))
            .chain(in_progress.keys().cloned())
            .collect();
        for name in names {
            let (s, e) = keys::index_range(scope, &name);
            let mut have = BTreeSet::new();
            let mut have_by_key: BTreeMap<ObjectKey, BTreeSet<Vec<u8>>> = BTreeMap::new();
            for row in index
                .range::<&[u8]>(s.as_slice()..e.as_slice())
                .map_err(|e| st(e.into()))?
            {
                let (k, _) = row.map_err(|e| st(e.into()))?;
                report.index_rows += 1;
                have.insert(k.value().to_vec());
                match keys::decode_index(k.value(), scope, &name) {
                    Ok((_, key)) => {
                        have_by_key.entry(key).or_default().insert(k.value().to_vec());
                    }
                    Err(e) => report.problems.push(format!("{scope}: index {name}: {e}")),
                }
            }
            if indexers.iter().any(|ix| ix.name == name) {
                let want = want.remove(&name).unwrap_or_default();
                match in_progress.get(&name) {
                    None => {
                        let want: BTreeSet<Vec<u8>> = want.into_values().flatten().collect();
                        let missing = want.difference(&have).count();
                        let stale = have.difference(&want).count();
                        if missing + stale > 0 {
                            report
                                .problems
                                .push(format!("{scope}: index {name}: {missing} rows missing, {stale} stale"));
                        }
                    }
                    Some(progress) => {
                        // Behind the backfill cursor rows are exact; ahead of it an object has
                        // no rows yet or exact ones (written since the index was registered).
                        // Except keys written since the last step: after a restart those writes
                        // may have run before the function was registered again, and the resume
                        // repairs exactly them first (or starts over: `None`, all pending).
                        let pending = pending_repair(&log, scope, progress).map_err(st)?;
                        let exempt = |k: &ObjectKey| pending.as_ref().is_none_or(|p| p.contains(k));
                        let mut wrong = 0;
                        let empty = BTreeSet::new();
                        for (key, rows) in &want {
                            let got = have_by_key.get(key).unwrap_or(&empty);
                            let behind = progress.after.as_ref().is_some_and(|a| key <= a);
                            if got != rows && (behind || !got.is_empty()) && !exempt(key) {
                                wrong += 1;
                            }
                        }
                        let orphaned = have_by_key
                            .keys()
                            .filter(|k| !want.contains_key(*k) && !exempt(k))
                            .count();
                        if wrong + orphaned > 0 {
                            report.problems.push(format!(
                                "{scope}: index {name} (backfill after {:?}): {wrong} objects with wrong rows, {orphaned} rows of missing objects",
                                progress.after.as_ref().map(ToString::to_string)
                            ));
                        }
                    }
                }
            }
            // The reverse map lists exactly the values of the forward rows.
            let mut rev_rows = BTreeSet::new();
            let (rs, re) = {
                let mut s = scope.0.to_be_bytes().to_vec();
                s.extend_from_slice(name.0.as_bytes());
                s.push(0);
                let mut e = s.clone();
                if let Some(l) = e.last_mut() {
                    *l = 1;
                }
                (s, e)
            };
            for row in index_rev
                .range::<&[u8]>(rs.as_slice()..re.as_slice())
                .map_err(|e| st(e.into()))?
            {
                let (k, v) = row.map_err(|e| st(e.into()))?;
                let key = match keys::decode_object(&[&scope.0.to_be_bytes()[..], &k.value()[rs.len()..]].concat()) {
                    Ok((_, key)) => key,
                    Err(e) => {
                        report.problems.push(format!("{scope}: index {name}: {e}"));
                        continue;
                    }
                };
                for value in codec::decode_values(v.value()).unwrap_or_default() {
                    rev_rows.insert(keys::index(scope, &name, &value.into(), &key));
                }
            }
            if rev_rows != have {
                report.problems.push(format!(
                    "{scope}: index {name}: reverse map disagrees with the index rows"
                ));
            }
        }
    }
    Ok(report)
}

/// The keys of `scope` that the log shows written since a backfill's last step: a resume
/// repairs those first (the writer's `repair_since` finds them the same way). `None` when the
/// resume starts the backfill over instead (the log no longer shows every such write, or
/// shows too many).
fn pending_repair(
    log: &redb::ReadOnlyTable<u64, &'static [u8]>,
    scope: ScopeId,
    progress: &BackfillProgress,
) -> Result<Option<BTreeSet<ObjectKey>>, redb::Error> {
    let Some(last) = log.last()?.map(|(k, _)| k.value()) else {
        return Ok(Some(BTreeSet::new()));
    };
    if last <= progress.seq {
        return Ok(Some(BTreeSet::new()));
    }
    let first = log.first()?.map_or(last + 1, |(k, _)| k.value());
    if first > progress.seq + 1 || last - progress.seq > RESUME_SCAN {
        return Ok(None);
    }
    let mut keys = BTreeSet::new();
    for row in log.range(progress.seq + 1..=last)? {
        let (_, v) = row?;
        match codec::decode_log(v.value()) {
            Ok((h, _, _)) if h.scope == scope.0 => {
                keys.insert(h.key);
            }
            Ok(_) => {}
            // The log check below reports it; the resume could not read it either.
            Err(_) => return Ok(None),
        }
    }
    Ok(Some(keys))
}
