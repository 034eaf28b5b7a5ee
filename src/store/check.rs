//! `check`: verifies the invariants of the design over one read transaction, one function per
//! invariant (each named after what it verifies). Every stored state is read back and
//! decompressed, so damaged rows are found whether their header or their bytes are hit.

use std::collections::{BTreeMap, BTreeSet};
#[cfg(unix)]
use std::os::unix::fs::PermissionsExt;

use bytes::Bytes;
use redb::{ReadOnlyTable, ReadableTable};

use super::codec::{self, BackfillProgress, Compression, DataRef, ObjectHeader, PrevRef, ScopeRecord};
use super::rules::{in_shard, keys_written_since};
use super::schema::{
    keys, IndexName, ScopeId, COMMIT_TIMES, CURSORS, DICTS, INDEX, INDEX_BACKFILL, INDEX_REV, LOG, META, META_LAST_SEQ,
    OBJECTS, SCOPES, SHARDS,
};
use super::{read, Shared, StoreError};
use crate::object::ObjectKey;
use crate::selector::ShardSelector;

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
    let mut c = Check::open(shared)?;
    c.file_is_readable_by_its_owner_only();
    c.log_seqs_are_dense()?;
    c.log_entries_read_back()?;
    c.commit_times_cover_the_retained_log()?;
    let mut backfilling = c.backfills_read_back_and_name_existing_scopes()?;
    c.cursors_are_within_the_log()?;
    let scopes: Vec<(u32, Vec<u8>)> = c
        .scopes
        .iter()
        .map_err(|e| c.st(e))?
        .map(|row| row.map(|(k, v)| (k.value(), v.value().to_vec())))
        .collect::<Result<_, _>>()
        .map_err(|e| c.st(e))?;
    for (scope, record) in scopes {
        let scope = ScopeId(scope);
        c.report.scopes += 1;
        let Some(record) = c.scope_record_reads_back(scope, &record) else {
            continue;
        };
        let in_progress = backfilling.remove(&scope).unwrap_or_default();
        c.scope(scope, &record, &in_progress)?;
    }
    Ok(c.report)
}

/// An object row that read back: its key, header and current bytes.
struct Object {
    key: ObjectKey,
    header: ObjectHeader,
    bytes: Bytes,
}

/// The open read transaction, its tables and what was found so far.
struct Check<'a> {
    shared: &'a Shared,
    txn: super::ReadTxn,
    scopes: ReadOnlyTable<u32, &'static [u8]>,
    objects: ReadOnlyTable<&'static [u8], &'static [u8]>,
    log: ReadOnlyTable<u64, &'static [u8]>,
    index: ReadOnlyTable<&'static [u8], ()>,
    index_rev: ReadOnlyTable<&'static [u8], &'static [u8]>,
    /// Every dictionary row's (scope, id).
    dict_ids: BTreeSet<(u32, u32)>,
    /// The last seq in the log (0 when empty).
    last: u64,
    report: CheckReport,
}

impl<'a> Check<'a> {
    fn open(shared: &'a Shared) -> Result<Self, StoreError> {
        let st = |e: redb::Error| shared.storage(e);
        let txn = shared.db()?.begin_read().map_err(|e| st(e.into()))?;
        let mut dict_ids = BTreeSet::new();
        for row in txn
            .open_table(DICTS)
            .map_err(|e| st(e.into()))?
            .iter()
            .map_err(|e| st(e.into()))?
        {
            let (k, _) = row.map_err(|e| st(e.into()))?;
            dict_ids.insert(k.value());
        }
        let log = txn.open_table(LOG).map_err(|e| st(e.into()))?;
        let last = log.last().map_err(|e| st(e.into()))?.map_or(0, |(k, _)| k.value());
        Ok(Self {
            shared,
            scopes: txn.open_table(SCOPES).map_err(|e| st(e.into()))?,
            objects: txn.open_table(OBJECTS).map_err(|e| st(e.into()))?,
            index: txn.open_table(INDEX).map_err(|e| st(e.into()))?,
            index_rev: txn.open_table(INDEX_REV).map_err(|e| st(e.into()))?,
            log,
            txn,
            dict_ids,
            last,
            report: CheckReport::default(),
        })
    }

    fn st<E: Into<redb::Error>>(&self, e: E) -> StoreError {
        self.shared.storage(e)
    }

    fn problem(&mut self, problem: String) {
        self.report.problems.push(problem);
    }

    /// Stored bytes tagged `compression`, decompressed as a reader does.
    fn unpack(&self, compression: Compression, bytes: &[u8]) -> Result<Bytes, StoreError> {
        self.shared
            .dicts
            .unpack(compression, bytes, &read::txn_loader(self.shared, &self.txn))
    }

    /// Why a blob tagged `c` cannot be read, when the dictionary it names is missing.
    fn missing_dict(&self, c: Compression) -> Option<String> {
        match c {
            Compression::Dict { scope, dict } if !self.dict_ids.contains(&(scope, dict)) => {
                Some(format!("names missing dictionary {dict} of scope {scope}"))
            }
            _ => None,
        }
    }

    /// Invariant 5: the database file is readable and writable by its owner only (0600): it
    /// may hold Secrets. Unix modes only: elsewhere there is no mode to check.
    fn file_is_readable_by_its_owner_only(&mut self) {
        #[cfg(unix)]
        if let Ok(m) = std::fs::metadata(&self.shared.path) {
            let mode = m.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                self.problem(format!(
                    "database file mode is {mode:o}, expected 600 (it may hold Secrets)"
                ));
            }
        }
    }

    /// Invariant 4: log seqs are dense and increasing.
    fn log_seqs_are_dense(&mut self) -> Result<(), StoreError> {
        let mut expected: Option<u64> = None;
        let mut gaps = Vec::new();
        for row in self.log.iter().map_err(|e| self.st(e))? {
            let seq = row.map_err(|e| self.st(e))?.0.value();
            if let Some(e) = expected.filter(|e| *e != seq) {
                gaps.push(format!("log seq gap: expected {e}, found {seq}"));
            }
            expected = Some(seq + 1);
            self.report.log_entries += 1;
        }
        self.report.problems.extend(gaps);
        Ok(())
    }

    /// Every log entry reads back: its header decodes, the dictionaries it names exist, its
    /// state and inline previous state decompress, and a previous state kept in the log points
    /// at an earlier entry that exists.
    fn log_entries_read_back(&mut self) -> Result<(), StoreError> {
        let mut problems = Vec::new();
        for row in self.log.iter().map_err(|e| self.st(e))? {
            let (k, v) = row.map_err(|e| self.st(e))?;
            let seq = k.value();
            let (h, data, prev_inline) = match codec::decode_log(v.value()) {
                Ok(d) => d,
                Err(e) => {
                    problems.push(format!("log entry {seq}: {e}"));
                    continue;
                }
            };
            let prev_tag = match h.prev {
                PrevRef::Inline(c) => Some(c),
                _ => None,
            };
            let missing: Vec<String> = [Some(h.compression), prev_tag]
                .into_iter()
                .flatten()
                .filter_map(|c| self.missing_dict(c))
                .collect();
            if !missing.is_empty() {
                problems.extend(missing.into_iter().map(|m| format!("log entry {seq} {m}")));
                continue;
            }
            if h.has_data {
                if let Err(e) = self.unpack(h.compression, data) {
                    problems.push(format!("log entry {seq}: {e}"));
                }
            }
            if let Some(c) = prev_tag {
                if let Err(e) = self.unpack(c, prev_inline) {
                    problems.push(format!("log entry {seq}: its previous state: {e}"));
                }
            }
            if let PrevRef::Log(p) = h.prev {
                if p >= seq || self.log.get(p).map_err(|e| self.st(e))?.is_none() {
                    problems.push(format!("log entry {seq} points at missing previous entry {p}"));
                }
            }
        }
        self.report.problems.extend(problems);
        Ok(())
    }

    /// Commit times: one row per retained commit, the first at the first retained seq, none
    /// outside the log, never decreasing.
    fn commit_times_cover_the_retained_log(&mut self) -> Result<(), StoreError> {
        let commit_times = self.txn.open_table(COMMIT_TIMES).map_err(|e| self.st(e))?;
        let first_seq = self.log.first().map_err(|e| self.st(e))?.map(|(k, _)| k.value());
        let last = self.last;
        let mut first_time_key = None;
        let mut previous: Option<(u64, u64)> = None;
        for row in commit_times.iter().map_err(|e| self.st(e))? {
            let (k, v) = row.map_err(|e| self.st(e))?;
            let (seq, time) = (k.value(), v.value());
            first_time_key.get_or_insert(seq);
            match first_seq {
                Some(first) if (first..=last).contains(&seq) => {}
                _ => self.problem(format!(
                    "commit time of seq {seq} is outside the log ({})",
                    first_seq.map_or("empty".to_owned(), |f| format!("{f}..={last}"))
                )),
            }
            if let Some((pseq, ptime)) = previous {
                if time < ptime {
                    self.problem(format!(
                        "commit time of seq {seq} ({time} ms) is before that of seq {pseq} ({ptime} ms)"
                    ));
                }
            }
            previous = Some((seq, time));
        }
        if let Some(first) = first_seq {
            if first_time_key != Some(first) {
                self.problem(format!("the first retained log entry {first} has no commit time row"));
            }
        }
        Ok(())
    }

    /// Every index backfill in progress decodes and names an existing scope. Returns them by
    /// scope.
    fn backfills_read_back_and_name_existing_scopes(
        &mut self,
    ) -> Result<BTreeMap<ScopeId, BTreeMap<IndexName, BackfillProgress>>, StoreError> {
        let backfill = self.txn.open_table(INDEX_BACKFILL).map_err(|e| self.st(e))?;
        let mut backfilling: BTreeMap<ScopeId, BTreeMap<IndexName, BackfillProgress>> = BTreeMap::new();
        for row in backfill.iter().map_err(|e| self.st(e))? {
            let (k, v) = row.map_err(|e| self.st(e))?;
            let (scope, name) = k.value();
            match codec::decode_backfill(v.value()) {
                Ok(p) => {
                    backfilling
                        .entry(ScopeId(scope))
                        .or_default()
                        .insert(IndexName(name.to_owned()), p);
                }
                Err(e) => self.problem(format!("backfill of index {name:?} of scope#{scope}: {e}")),
            }
        }
        for (scope, names) in &backfilling {
            if self.scopes.get(scope.0).map_err(|e| self.st(e))?.is_none() {
                for name in names.keys() {
                    self.problem(format!("backfill of index {name} names missing {scope}"));
                }
            }
        }
        Ok(backfilling)
    }

    /// Invariant 9: no durable cursor is past the last seq ever handed out (compaction may
    /// have emptied the log below it).
    fn cursors_are_within_the_log(&mut self) -> Result<(), StoreError> {
        let saved = {
            let meta = self.txn.open_table(META).map_err(|e| self.st(e))?;
            let saved = meta.get(META_LAST_SEQ).map_err(|e| self.st(e))?;
            saved.map_or(0, |v| <[u8; 8]>::try_from(v.value()).map_or(0, u64::from_be_bytes))
        };
        let handed_out = self.last.max(saved);
        let cursors = self.txn.open_table(CURSORS).map_err(|e| self.st(e))?;
        for row in cursors.iter().map_err(|e| self.st(e))? {
            let (k, v) = row.map_err(|e| self.st(e))?;
            if v.value() > handed_out {
                let (scope, name) = k.value();
                self.problem(format!(
                    "cursor {name:?} of {} at {} is past the last log seq {handed_out}",
                    ScopeId(scope),
                    v.value()
                ));
            }
        }
        Ok(())
    }

    /// A scope's record decodes.
    fn scope_record_reads_back(&mut self, scope: ScopeId, value: &[u8]) -> Option<ScopeRecord> {
        match codec::decode_scope(value) {
            Ok(r) => Some(r),
            Err(e) => {
                self.problem(format!("{scope}: record does not decode: {e}"));
                None
            }
        }
    }

    /// One scope's objects and indexes.
    fn scope(
        &mut self,
        scope: ScopeId,
        record: &ScopeRecord,
        in_progress: &BTreeMap<IndexName, BackfillProgress>,
    ) -> Result<(), StoreError> {
        let shard = self.shard_record_reads_back(scope)?;
        self.no_index_is_both_ready_and_backfilling(scope, record, in_progress);
        let indexers = self.shared.indexes.for_scope(scope);
        // Index rows the index functions give over the object table, per object.
        let mut want: BTreeMap<IndexName, BTreeMap<ObjectKey, BTreeSet<Vec<u8>>>> = BTreeMap::new();
        let (start, end) = keys::scope_range(scope);
        let mut count = 0u64;
        let rows = self
            .objects
            .range::<&[u8]>(start.as_slice()..end.as_slice())
            .map_err(|e| self.st(e))?;
        for row in rows {
            let (k, v) = row.map_err(|e| self.st(e))?;
            count += 1;
            self.report.objects += 1;
            let Some(o) = self.object_reads_back(scope, k.value(), v.value())? else {
                continue;
            };
            self.object_row_holds_its_own_key(scope, &o);
            self.object_is_in_the_shard(scope, &o, shard.as_ref());
            self.scope_rv_is_not_behind_its_objects(scope, &o, record);
            self.object_points_at_its_own_log_entry(scope, &o)?;
            for ix in &indexers {
                if !record.indexes.contains(&ix.name.0) && !in_progress.contains_key(&ix.name) {
                    continue;
                }
                let rows = want
                    .entry(ix.name.clone())
                    .or_default()
                    .entry(o.key.clone())
                    .or_default();
                match ix.values_caught(&o.header.meta, &o.bytes) {
                    Ok(values) => {
                        for value in values {
                            rows.insert(keys::index(scope, &ix.name, &value.into(), &o.key));
                        }
                    }
                    Err(e) => self.problem(format!("{scope}: object {}: {e}", o.key)),
                }
            }
        }
        self.object_count_matches_the_record(scope, record, count);
        let names: BTreeSet<IndexName> = record
            .indexes
            .iter()
            .map(|n| IndexName(n.clone()))
            .chain(in_progress.keys().cloned())
            .collect();
        for name in names {
            let have = self.index_rows(scope, &name)?;
            if indexers.iter().any(|ix| ix.name == name) {
                let want = want.remove(&name).unwrap_or_default();
                self.index_rows_equal_the_index_functions(scope, &name, &have, &want, in_progress.get(&name))?;
            }
            self.reverse_index_lists_the_index_rows(scope, &name, &have)?;
        }
        Ok(())
    }

    /// A scope's shard record decodes; its range.
    fn shard_record_reads_back(&mut self, scope: ScopeId) -> Result<Option<ShardSelector>, StoreError> {
        let shards = self.txn.open_table(SHARDS).map_err(|e| self.st(e))?;
        let Some(v) = shards.get(scope.0).map_err(|e| self.st(e))? else {
            return Ok(None);
        };
        Ok(match codec::decode_shard(v.value()) {
            Ok(r) => r.range,
            Err(e) => {
                self.problem(format!("{scope}: shard record does not decode: {e}"));
                None
            }
        })
    }

    /// An index is either ready or being backfilled, never both.
    fn no_index_is_both_ready_and_backfilling(
        &mut self,
        scope: ScopeId,
        record: &ScopeRecord,
        in_progress: &BTreeMap<IndexName, BackfillProgress>,
    ) {
        for name in in_progress.keys() {
            if record.indexes.contains(&name.0) {
                self.problem(format!("{scope}: index {name} is both ready and being backfilled"));
            }
        }
    }

    /// An object row reads back: its key and header decode, the dictionary it names exists,
    /// and its current state (inline or in the log entry it points at) decompresses.
    fn object_reads_back(&mut self, scope: ScopeId, k: &[u8], v: &[u8]) -> Result<Option<Object>, StoreError> {
        let key = match keys::decode_object(k) {
            Ok((_, key)) => key,
            Err(e) => {
                self.problem(format!("{scope}: {e}"));
                return Ok(None);
            }
        };
        let (header, inline) = match codec::decode_object(v) {
            Ok(x) => x,
            Err(e) => {
                self.problem(format!("{scope}: object {key}: {e}"));
                return Ok(None);
            }
        };
        if header.data == DataRef::Inline {
            if let Some(problem) = self.missing_dict(header.compression) {
                self.problem(format!("{scope}: object {key} {problem}"));
                return Ok(None);
            }
        }
        let bytes = {
            let loader = read::txn_loader(self.shared, &self.txn);
            read::object_bytes(self.shared, &self.log, &header, inline, &loader)
        };
        match bytes {
            Ok(bytes) => Ok(Some(Object { key, header, bytes })),
            // A missing log entry is reported by `object_points_at_its_own_log_entry`.
            Err(StoreError::Corrupted { .. }) => Ok(Some(Object {
                key,
                header,
                bytes: Bytes::new(),
            })),
            Err(e @ (StoreError::Storage { .. } | StoreError::Closed { .. })) => Err(e),
            Err(e) => {
                self.problem(format!("{scope}: object {key}: {e}"));
                Ok(None)
            }
        }
    }

    /// A row holds the metadata of the key it is stored under.
    fn object_row_holds_its_own_key(&mut self, scope: ScopeId, o: &Object) {
        if o.header.meta.key() != o.key {
            self.problem(format!(
                "{scope}: row {} holds metadata of {}",
                o.key,
                o.header.meta.key()
            ));
        }
    }

    /// Invariant 6: every object of a sharded scope is in the scope's persisted shard range.
    fn object_is_in_the_shard(&mut self, scope: ScopeId, o: &Object, shard: Option<&ShardSelector>) {
        if let Some(range) = shard {
            if !in_shard(range, &o.header.meta) {
                self.problem(format!(
                    "{scope}: object {} is outside the scope's shard {range}",
                    o.key
                ));
            }
        }
    }

    /// Invariant 2: the scope's persisted RV is not behind the data it describes.
    fn scope_rv_is_not_behind_its_objects(&mut self, scope: ScopeId, o: &Object, record: &ScopeRecord) {
        if let Some(rv) = &record.rv {
            if rv.is_older_than(&o.header.meta.resource_version) {
                self.problem(format!(
                    "{scope}: object {} has RV {} newer than the scope RV {rv}",
                    o.key, o.header.meta.resource_version
                ));
            }
        }
    }

    /// An object whose bytes are in the log points at an entry of its own key, scope and RV.
    fn object_points_at_its_own_log_entry(&mut self, scope: ScopeId, o: &Object) -> Result<(), StoreError> {
        let DataRef::Log(seq) = o.header.data else {
            return Ok(());
        };
        let problem = match self.log.get(seq).map_err(|e| self.st(e))? {
            None => Some(format!("{scope}: object {} points at missing log entry {seq}", o.key)),
            Some(row) => match codec::decode_log(row.value()) {
                Ok((lh, _, _)) if lh.key != o.key || lh.scope != scope.0 || lh.rv != o.header.meta.resource_version => {
                    Some(format!(
                        "{scope}: object {} points at log entry {seq} of another version",
                        o.key
                    ))
                }
                // A damaged entry is reported by `log_entries_read_back`.
                _ => None,
            },
        };
        if let Some(p) = problem {
            self.problem(p);
        }
        Ok(())
    }

    /// The scope record counts the objects the table holds.
    fn object_count_matches_the_record(&mut self, scope: ScopeId, record: &ScopeRecord, count: u64) {
        if count != record.object_count {
            self.problem(format!(
                "{scope}: record counts {} objects, table holds {count}",
                record.object_count
            ));
        }
    }

    /// The rows of index `name` of `scope`.
    fn index_rows(&mut self, scope: ScopeId, name: &IndexName) -> Result<BTreeSet<Vec<u8>>, StoreError> {
        let (s, e) = keys::index_range(scope, name);
        let mut have = BTreeSet::new();
        let mut problems = Vec::new();
        for row in self
            .index
            .range::<&[u8]>(s.as_slice()..e.as_slice())
            .map_err(|e| self.st(e))?
        {
            let (k, _) = row.map_err(|e| self.st(e))?;
            if let Err(e) = keys::decode_index(k.value(), scope, name) {
                problems.push(format!("{scope}: index {name}: {e}"));
            }
            have.insert(k.value().to_vec());
        }
        self.report.problems.extend(problems);
        self.report.index_rows += have.len() as u64;
        Ok(have)
    }

    /// Invariant 3: the index tables equal what the index functions give over the objects
    /// (during a backfill: exactly behind its cursor, and ahead of it no rows or exact ones).
    fn index_rows_equal_the_index_functions(
        &mut self,
        scope: ScopeId,
        name: &IndexName,
        have: &BTreeSet<Vec<u8>>,
        want: &BTreeMap<ObjectKey, BTreeSet<Vec<u8>>>,
        progress: Option<&BackfillProgress>,
    ) -> Result<(), StoreError> {
        let Some(progress) = progress else {
            let want: BTreeSet<&Vec<u8>> = want.values().flatten().collect();
            let missing = want.iter().filter(|r| !have.contains(**r)).count();
            let stale = have.iter().filter(|r| !want.contains(r)).count();
            if missing + stale > 0 {
                self.problem(format!("{scope}: index {name}: {missing} rows missing, {stale} stale"));
            }
            return Ok(());
        };
        let mut have_by_key: BTreeMap<ObjectKey, BTreeSet<&Vec<u8>>> = BTreeMap::new();
        // Rows that do not decode were reported by `index_rows`.
        for row in have {
            if let Ok((_, key)) = keys::decode_index(row, scope, name) {
                have_by_key.entry(key).or_default().insert(row);
            }
        }
        // Keys written since the backfill's last step are exempt: after a restart those writes
        // may have run before the function was registered again, and the resume repairs
        // exactly them first (or starts over: `None`, all pending).
        let pending = keys_written_since(&self.log, scope, progress.seq, self.last).map_err(|e| self.st(e))?;
        let exempt = |k: &ObjectKey| pending.as_ref().is_none_or(|p| p.contains(k));
        let mut wrong = 0;
        let empty = BTreeSet::new();
        for (key, rows) in want {
            let got = have_by_key.get(key).unwrap_or(&empty);
            let behind = progress.after.as_ref().is_some_and(|a| key <= a);
            let same = got.len() == rows.len() && rows.iter().all(|r| got.contains(r));
            if !same && (behind || !got.is_empty()) && !exempt(key) {
                wrong += 1;
            }
        }
        let orphaned = have_by_key
            .keys()
            .filter(|k| !want.contains_key(*k) && !exempt(k))
            .count();
        if wrong + orphaned > 0 {
            self.problem(format!(
                "{scope}: index {name} (backfill after {:?}): {wrong} objects with wrong rows, {orphaned} rows of missing objects",
                progress.after.as_ref().map(ToString::to_string)
            ));
        }
        Ok(())
    }

    /// Invariant 3: the reverse map of index `name` lists exactly the values of its rows.
    fn reverse_index_lists_the_index_rows(
        &mut self,
        scope: ScopeId,
        name: &IndexName,
        have: &BTreeSet<Vec<u8>>,
    ) -> Result<(), StoreError> {
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
        let mut problems = Vec::new();
        for row in self
            .index_rev
            .range::<&[u8]>(rs.as_slice()..re.as_slice())
            .map_err(|e| self.st(e))?
        {
            let (k, v) = row.map_err(|e| self.st(e))?;
            let key = match keys::decode_object(&[&scope.0.to_be_bytes()[..], &k.value()[rs.len()..]].concat()) {
                Ok((_, key)) => key,
                Err(e) => {
                    problems.push(format!("{scope}: index {name}: {e}"));
                    continue;
                }
            };
            match codec::decode_values(v.value()) {
                Ok(values) => {
                    for value in values {
                        rev_rows.insert(keys::index(scope, name, &value.into(), &key));
                    }
                }
                Err(e) => problems.push(format!("{scope}: index {name}: reverse row of {key}: {e}")),
            }
        }
        self.report.problems.extend(problems);
        if rev_rows != *have {
            self.problem(format!(
                "{scope}: index {name}: reverse map disagrees with the index rows"
            ));
        }
        Ok(())
    }
}
