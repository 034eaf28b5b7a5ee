//! `check`: verifies the invariants of the design over one read transaction.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::PermissionsExt;

use redb::{ReadableDatabase, ReadableTable};

use super::codec::{self, Compression, DataRef, PrevRef};
use super::schema::{keys, IndexName, ScopeId, CURSORS, DICTS, INDEX, INDEX_REV, LOG, OBJECTS, SCOPES};
use super::{read, Shared, StoreError};

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
    for row in cursors.iter().map_err(|e| st(e.into()))? {
        let (k, v) = row.map_err(|e| st(e.into()))?;
        if v.value() > last {
            report.problems.push(format!(
                "cursor {:?} at {} is past the last log entry {last}",
                k.value(),
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
        let (start, end) = keys::scope_range(scope);
        let mut count = 0u64;
        // Index rows the index functions give over the object table (invariant 3).
        let indexers = shared.indexes.for_scope(scope);
        let mut want: BTreeMap<IndexName, BTreeSet<Vec<u8>>> = BTreeMap::new();
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
                if !record.indexes.contains(&ix.name.0) {
                    continue;
                }
                match read::object_bytes(shared, &log, &h, inline, &read::txn_loader(shared, &txn)) {
                    Ok(json) => {
                        for value in ix.values(&h.meta, &json) {
                            want.entry(ix.name.clone()).or_default().insert(keys::index(
                                scope,
                                &ix.name,
                                &value.into(),
                                &key,
                            ));
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
        for name in &record.indexes {
            let name = IndexName(name.clone());
            let (s, e) = keys::index_range(scope, &name);
            let mut have = BTreeSet::new();
            for row in index
                .range::<&[u8]>(s.as_slice()..e.as_slice())
                .map_err(|e| st(e.into()))?
            {
                let (k, _) = row.map_err(|e| st(e.into()))?;
                report.index_rows += 1;
                have.insert(k.value().to_vec());
            }
            if indexers.iter().any(|ix| ix.name == name) {
                let want = want.remove(&name).unwrap_or_default();
                let missing = want.difference(&have).count();
                let stale = have.difference(&want).count();
                if missing + stale > 0 {
                    report
                        .problems
                        .push(format!("{scope}: index {name}: {missing} rows missing, {stale} stale"));
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
