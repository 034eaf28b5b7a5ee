//! Log retention: commit times, and compaction by count and age in bounded transactions.
//!
//! Invariant 4: compaction removes only entries below every durable cursor and outside the
//! retention window (beyond the count, or committed longer ago than the age). Each transaction
//! removes at most `compact_step` entries, so a large backlog is worked off between batches
//! instead of in one transaction that holds up ingest.

use std::collections::HashMap;
use std::sync::Arc;

use redb::{ReadableTable, WriteTransaction};

use super::super::codec::{self, Compression, DataRef, DeltaKind, PrevRef};
use super::super::schema::{keys, ScopeId, Seq, COMMIT_TIMES, CURSORS, LOG};
use super::{Ack, CompactReport, Step, StoreError, Tables, WriterThread};
use crate::object::ObjectKey;

/// What compaction works toward.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Goal {
    /// Entries below this seq are beyond the count retention (0: none).
    pub(super) count_target: u64,
    /// Entries committed before this time (unix ms) are beyond the age retention.
    pub(super) cutoff_ms: Option<u64>,
}

impl Goal {
    fn merge(self, other: Goal) -> Goal {
        Goal {
            count_target: self.count_target.max(other.count_target),
            cutoff_ms: self.cutoff_ms.max(other.cutoff_ms),
        }
    }
}

/// Compaction still to do, and who waits for it.
#[derive(Default)]
pub(super) struct Compaction {
    /// Every pending goal merged; `None` once no step can make progress.
    goal: Option<Goal>,
    /// Explicit `compact` calls: each is answered once its own goal is reached.
    waiters: Vec<(Goal, CompactReport, Ack<CompactReport>)>,
    /// `settle` calls: answered once no step can make progress.
    settles: Vec<Ack<()>>,
}

/// What one compaction transaction did.
struct StepOutcome {
    removed: u64,
    inlined: u64,
    /// The first seq left in the log (last + 1 when it is empty).
    first: u64,
    /// Whether another step could remove more toward the goal.
    more: bool,
    /// Entries at or above this seq are not below every durable cursor.
    cursor_bound: u64,
    /// The commit time of entry `first`, if it is dated.
    first_time: Option<u64>,
    last: u64,
}

impl StepOutcome {
    fn reached(&self, goal: Goal) -> bool {
        self.first > self.last
            || self.first >= self.cursor_bound
            || (self.first >= goal.count_target
                && match (goal.cutoff_ms, self.first_time) {
                    (Some(cutoff), Some(t)) => t >= cutoff,
                    _ => true,
                })
    }
}

/// Seqs in-memory readers still deliver from (see [`Writer::pin`](super::Writer::pin)):
/// compaction treats each like a durable cursor.
#[derive(Debug, Default)]
pub(crate) struct Pins {
    pins: std::sync::Mutex<std::collections::BTreeMap<u64, Seq>>,
    next: std::sync::atomic::AtomicU64,
}

impl Pins {
    pub(super) fn pin(self: &Arc<Self>, seq: Seq) -> LogPin {
        use crate::util::Locked;
        let id = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.pins.locked().insert(id, seq);
        LogPin { pins: self.clone(), id }
    }

    /// The smallest `pin + 1` (`u64::MAX` without pins).
    fn bound(&self) -> u64 {
        use crate::util::Locked;
        self.pins
            .locked()
            .values()
            .map(|s| s.0.saturating_add(1))
            .min()
            .unwrap_or(u64::MAX)
    }
}

/// Keeps the log entries after a seq from compaction until dropped; see
/// [`Writer::pin`](super::Writer::pin).
#[derive(Debug)]
pub struct LogPin {
    pins: Arc<Pins>,
    id: u64,
}

impl LogPin {
    /// Moves the pin to `seq`.
    pub fn set(&self, seq: Seq) {
        use crate::util::Locked;
        self.pins.pins.locked().insert(self.id, seq);
    }
}

impl Drop for LogPin {
    fn drop(&mut self) {
        use crate::util::Locked;
        self.pins.pins.locked().remove(&self.id);
    }
}

/// The smallest `cursor + 1` over every durable cursor (`u64::MAX` without cursors).
fn cursor_bound<T: ReadableTable<(u32, &'static str), u64>>(cursors: &T) -> Result<u64, redb::Error> {
    let mut bound = u64::MAX;
    for row in cursors.iter()? {
        let (_, v) = row?;
        bound = bound.min(v.value().saturating_add(1));
    }
    Ok(bound)
}

/// The commit time of entry `seq`: the row with the greatest key not above it.
fn time_of<T: ReadableTable<u64, u64>>(times: &T, seq: u64) -> Result<Option<u64>, redb::Error> {
    Ok(times.range(..=seq)?.next_back().transpose()?.map(|(_, t)| t.value()))
}

impl WriterThread {
    fn slack(&self, entries: u64) -> u64 {
        (entries / 10).min(self.upkeep.compact_step as u64)
    }

    /// Dates the entries `[start, last]` a commit appended (nothing when it appended none).
    /// Times never decrease, even when the clock steps back.
    pub(super) fn date_commit(&self, txn: &WriteTransaction, start: u64, last: u64) -> Result<(), StoreError> {
        if last < start {
            return Ok(());
        }
        let mut times = txn.open_table(COMMIT_TIMES).map_err(|e| self.st(e))?;
        let newest = times.last().map_err(|e| self.st(e))?.map_or(0, |(_, t)| t.value());
        let now = self.shared.config.now_ms().max(newest);
        times.insert(start, now).map_err(|e| self.st(e))?;
        Ok(())
    }

    /// The goal of an explicit `compact`: fixed now, so it ends even while batches keep coming.
    pub(super) fn compact_goal(&self, _txn: &WriteTransaction, keep: Option<u64>) -> Step<Goal> {
        let last = self.next_seq.get().saturating_sub(1);
        Ok(Goal {
            count_target: keep
                .or(self.upkeep.retention_entries)
                .map_or(0, |k| last.saturating_sub(k).saturating_add(1)),
            cutoff_ms: self.age_cutoff(),
        })
    }

    fn age_cutoff(&self) -> Option<u64> {
        let age = u64::try_from(self.upkeep.retention_age?.as_millis()).unwrap_or(u64::MAX);
        Some(self.shared.config.now_ms().saturating_sub(age))
    }

    /// Looks whether automatic retention has work: the log is longer than the count retention
    /// plus slack, or its first entry is older than the age. Cheap (one read transaction, a few
    /// lookups); runs after every group commit and while idle.
    pub(super) fn plan_retention(&self) {
        if self.upkeep.retention_entries.is_none() && self.upkeep.retention_age.is_none() {
            return;
        }
        match self.retention_goal() {
            Ok(Some(goal)) => self.add_goal(goal),
            Ok(None) => {}
            Err(e) => tracing::debug!(error = %e, "planning log retention failed"),
        }
    }

    fn retention_goal(&self) -> Result<Option<Goal>, StoreError> {
        let st = |e: redb::Error| self.shared.storage(e);
        let sto = |e: redb::StorageError| self.shared.storage(e);
        let txn = self.shared.db()?.begin_read().map_err(|e| st(e.into()))?;
        let log = txn.open_table(LOG).map_err(|e| st(e.into()))?;
        let Some(first) = log.first().map_err(sto)?.map(|(k, _)| k.value()) else {
            return Ok(None);
        };
        let last = self.next_seq.get().saturating_sub(1);
        let cursors = txn.open_table(CURSORS).map_err(|e| st(e.into()))?;
        if first >= cursor_bound(&cursors).map_err(st)?.min(self.upkeep.pins.bound()) {
            // A durable consumer holds the first entry: nothing can go.
            return Ok(None);
        }
        let len = last.saturating_sub(first) + 1;
        let count_target = match self.upkeep.retention_entries {
            Some(n) if len > n.saturating_add(self.slack(n)) => last - n + 1,
            _ => 0,
        };
        let mut cutoff_ms = None;
        if let Some(cutoff) = self.age_cutoff() {
            let times = txn.open_table(COMMIT_TIMES).map_err(|e| st(e.into()))?;
            if time_of(&times, first).map_err(st)?.is_some_and(|t| t < cutoff) {
                cutoff_ms = Some(cutoff);
            }
        }
        Ok((count_target > first || cutoff_ms.is_some()).then_some(Goal {
            count_target,
            cutoff_ms,
        }))
    }

    fn add_goal(&self, goal: Goal) {
        let mut c = self.upkeep.compaction.borrow_mut();
        c.goal = Some(c.goal.map_or(goal, |g| g.merge(goal)));
    }

    pub(super) fn defer_compact(&self, ack: Ack<CompactReport>, goal: Goal) {
        self.add_goal(goal);
        self.upkeep
            .compaction
            .borrow_mut()
            .waiters
            .push((goal, CompactReport::default(), ack));
    }

    pub(super) fn defer_settle(&self, ack: Ack<()>) {
        self.upkeep.compaction.borrow_mut().settles.push(ack);
    }

    pub(super) fn has_compaction_work(&self) -> bool {
        let c = self.upkeep.compaction.borrow();
        c.goal.is_some() || !c.waiters.is_empty() || !c.settles.is_empty()
    }

    /// Runs one compaction transaction and answers the callers it satisfied. Returns how many
    /// entries it removed.
    pub(super) fn compaction_step(&self) -> u64 {
        let Some(goal) = self.upkeep.compaction.borrow().goal else {
            self.finish_compaction(None);
            return 0;
        };
        let limit = self.upkeep.compact_step;
        match self.maintenance(|txn| self.compact_range(txn, goal, limit)) {
            Ok(outcome) => {
                let removed = outcome.removed;
                if removed > 0 {
                    tracing::debug!(removed, first = outcome.first, "log compacted");
                }
                self.finish_compaction(Some(&outcome));
                removed
            }
            Err(e) => {
                tracing::warn!(error = %e, "log compaction failed; retried after the next commit");
                self.abandon_compaction(&e);
                0
            }
        }
    }

    /// Answers the callers a step satisfied (all of them when it was the last step).
    fn finish_compaction(&self, outcome: Option<&StepOutcome>) {
        let mut c = self.upkeep.compaction.borrow_mut();
        let done = outcome.is_none_or(|o| !o.more);
        let waiters = std::mem::take(&mut c.waiters);
        for (goal, mut report, ack) in waiters {
            if let Some(o) = outcome {
                report.removed += o.removed;
                report.inlined += o.inlined;
                report.first_retained = Seq(o.first);
            }
            if done || outcome.is_some_and(|o| o.reached(goal)) {
                drop(ack.send(Ok(report)));
            } else {
                c.waiters.push((goal, report, ack));
            }
        }
        if done {
            c.goal = None;
            for ack in c.settles.drain(..) {
                drop(ack.send(Ok(())));
            }
        }
    }

    /// Fails every compaction caller (the store is closing, or a step failed).
    pub(super) fn abandon_compaction(&self, e: &StoreError) {
        let mut c = self.upkeep.compaction.borrow_mut();
        c.goal = None;
        for (_, _, ack) in c.waiters.drain(..) {
            drop(ack.send(Err(e.to_aborted())));
        }
        for ack in c.settles.drain(..) {
            drop(ack.send(Err(e.to_aborted())));
        }
    }

    /// Removes up to `limit` entries from the front of the log toward `goal`, never at or past
    /// a durable cursor. Bytes still needed move out of the removed entries: into object rows
    /// that point at them, and into the first retained entry of a key whose previous version
    /// they hold. The commit-time rows below the new first entry go too.
    fn compact_range(&self, txn: &WriteTransaction, goal: Goal, limit: usize) -> Step<StepOutcome> {
        let last = self.next_seq.get().saturating_sub(1);
        let bound = {
            let cursors = txn.open_table(CURSORS).map_err(|e| self.st(e))?;
            cursor_bound(&cursors)
                .map_err(|e| self.st(e))?
                .min(self.upkeep.pins.bound())
        };
        let mut t = Tables::open(self, txn)?;
        let mut times = txn.open_table(COMMIT_TIMES).map_err(|e| self.st(e))?;
        let mut outcome = StepOutcome {
            removed: 0,
            inlined: 0,
            first: last + 1,
            more: false,
            cursor_bound: bound,
            first_time: None,
            last,
        };
        let Some(first) = t.log.first().map_err(|e| self.st(e))?.map(|(k, _)| k.value()) else {
            return Ok(outcome);
        };
        outcome.first = first;
        let cap = first.saturating_add(limit as u64);
        // How far the entries are older than the cutoff (looked at up to `cap` only).
        let (age_end, age_capped) = match goal.cutoff_ms {
            None => (first, false),
            Some(cutoff) => {
                let mut current = time_of(&times, first).map_err(|e| self.st(e))?;
                let mut end = first;
                let mut stopped = false;
                for row in times.range(first.saturating_add(1)..=cap).map_err(|e| self.st(e))? {
                    if current.is_none_or(|t| t >= cutoff) {
                        stopped = true;
                        break;
                    }
                    let (k, v) = row.map_err(|e| self.st(e))?;
                    end = k.value();
                    current = Some(v.value());
                }
                if !stopped && current.is_some_and(|t| t < cutoff) {
                    // The last segment runs past `cap` (or to the end of the log).
                    (cap.min(last + 1), true)
                } else {
                    (end, false)
                }
            }
        };
        let target = if age_capped {
            u64::MAX
        } else {
            goal.count_target.max(age_end)
        };
        let stop = target.min(bound).min(last + 1);
        let end = stop.min(cap);
        if end <= first {
            outcome.first_time = time_of(&times, first).map_err(|e| self.st(e))?;
            return Ok(outcome);
        }
        outcome.more = end < stop;

        // Bytes of removed versions that a retained entry may point at as its previous state.
        let mut orphans: HashMap<(u32, ObjectKey), (u64, Compression, Vec<u8>)> = HashMap::new();
        let removed: Vec<(u64, Vec<u8>)> = t
            .log
            .range(first..end)
            .map_err(|e| self.st(e))?
            .map(|r| r.map(|(k, v)| (k.value(), v.value().to_vec())))
            .collect::<Result<_, _>>()
            .map_err(|e| self.st(e))?;
        for (seq, row) in removed {
            let (h, data, _) = codec::decode_log(&row).map_err(StoreError::from)?;
            let id = (h.scope, h.key.clone());
            if h.kind == DeltaKind::Deleted {
                orphans.remove(&id);
            } else if h.has_data {
                let okey = keys::object(ScopeId(h.scope), &h.key);
                let current = match t.objects.get(okey.as_slice()).map_err(|e| self.st(e))? {
                    Some(v) => Some(codec::decode_object(v.value()).map_err(StoreError::from)?.0),
                    None => None,
                };
                match current {
                    Some(mut oh) if oh.data == DataRef::Log(seq) => {
                        oh.data = DataRef::Inline;
                        let row = codec::encode_object(&oh, Some(data)).map_err(StoreError::from)?;
                        t.objects
                            .insert(okey.as_slice(), row.as_slice())
                            .map_err(|e| self.st(e))?;
                        outcome.inlined += 1;
                        orphans.remove(&id);
                    }
                    _ => {
                        orphans.insert(id, (seq, h.compression, data.to_vec()));
                    }
                }
            }
            t.log.remove(seq).map_err(|e| self.st(e))?;
            outcome.removed += 1;
        }
        // The first retained entry of an orphan's key is the one that may point at it. Only
        // the rewritten rows are held in memory. A key with no later entry (its scope was reset)
        // makes this read to the end of the log.
        if !orphans.is_empty() {
            let mut rewritten = Vec::new();
            for row in t.log.range(end..).map_err(|e| self.st(e))? {
                if orphans.is_empty() {
                    break;
                }
                let (k, v) = row.map_err(|e| self.st(e))?;
                let (mut h, data, _) = codec::decode_log(v.value()).map_err(StoreError::from)?;
                let Some((oseq, comp, bytes)) = orphans.remove(&(h.scope, h.key.clone())) else {
                    continue;
                };
                if h.prev == PrevRef::Log(oseq) {
                    h.prev = PrevRef::Inline(comp);
                    let row = codec::encode_log(&h, data, &bytes).map_err(StoreError::from)?;
                    rewritten.push((k.value(), row));
                }
            }
            for (seq, row) in rewritten {
                t.log.insert(seq, row.as_slice()).map_err(|e| self.st(e))?;
            }
        }
        // Commit times: the row covering `end` moves to `end`, the ones below it go.
        let covering = time_of(&times, end).map_err(|e| self.st(e))?;
        times.retain_in(..end, |_, _| false).map_err(|e| self.st(e))?;
        if end <= last {
            if let Some(time) = covering {
                times.insert(end, time).map_err(|e| self.st(e))?;
            }
        }
        outcome.first = end;
        outcome.first_time = covering.filter(|_| end <= last);
        Ok(outcome)
    }
}
