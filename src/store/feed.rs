//! The feed: a hot scope's newest log records, kept in memory so that volatile handlers get
//! each event as soon as the writer has decided it, before its redb rows are written and
//! committed, without reading them back from redb.
//!
//! In a group of batches committed without an fsync, the writer pushes each record here
//! ([`Feed::push`]) right after the change reaches the hot tier and before writing its rows;
//! other groups are published whole ([`Feed::publish`]). A handler that reads a record
//! therefore finds its lister at least at that state. Should the group fail, the records are
//! taken back ([`Feed::undo`]) and
//! the writer announces a rollback, after which readers move their cursors back, as after a
//! lost relaxed commit: volatile handlers are told at least once; durable ones read only what
//! is on disk and never use the feed.

use crate::util::Locked;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::{Mutex, MutexGuard};

use super::hot::HotEntry;
use super::read::LogRecord;
use super::schema::Seq;

/// How many committed records the feed keeps for readers a little behind; a reader further
/// behind reads redb. Records not yet committed are never dropped (a group is bounded by the
/// writer's `max_deltas`).
const KEEP: usize = 1024;

/// What [`Feed::after`] found.
#[derive(Debug)]
pub(crate) enum FeedRead {
    /// The records after the cursor, and the seq the reader has seen everything up to.
    Records { records: Vec<LogRecord>, scanned: Seq },
    /// The feed does not reach back to the cursor: read redb (committed records only).
    Behind,
}

struct State {
    /// The scope's records, seq ascending.
    records: VecDeque<LogRecord>,
    /// The version a record replaced, as the tier held it (with its decoded object, when a
    /// reader decoded it), for records pushed as they were applied: a handler's old state
    /// without a second decode. Seq ascending, a subset of `records`' seqs.
    olds: VecDeque<(Seq, Arc<HotEntry>)>,
    /// Old versions trimmed off, for the writer to free elsewhere ([`Feed::take_dropped`]):
    /// dropping the last reference to a decoded object frees hundreds of allocations made on
    /// another thread, which cost the writer tens of microseconds per event (`perf`).
    dropped: Vec<Arc<HotEntry>>,
    /// Every record of the scope with a seq in `(floor, head]` is in `records`.
    floor: Seq,
    /// The last seq (of any scope) published.
    head: Seq,
}

/// One scope's feed; see the module documentation.
pub(crate) struct Feed {
    state: Mutex<State>,
}

impl Feed {
    /// An empty feed at `head`: readers at `head` or later wait for the next publication,
    /// readers before it read redb.
    pub(crate) fn new(head: Seq) -> Self {
        Self {
            state: Mutex::new(State {
                records: VecDeque::new(),
                olds: VecDeque::new(),
                dropped: Vec::new(),
                floor: head,
                head,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.locked()
    }

    /// Publishes one applied group, of the seqs after `after` up to `last`: its records of
    /// this scope. `committed` is the last seq on redb, below which records may be dropped.
    pub(crate) fn publish(&self, records: Vec<LogRecord>, after: Seq, last: Seq, committed: Seq) {
        let mut st = self.lock();
        debug_assert!(st.head <= last, "the feed moved back");
        if st.head != after {
            // Seqs passed by without the feed: readers find them in redb once committed.
            drop(st);
            self.reset(last);
            return;
        }
        debug_assert!(records.windows(2).all(|w| w[0].seq < w[1].seq));
        debug_assert!(records.iter().all(|r| st.head < r.seq && r.seq <= last));
        st.records.extend(records);
        st.head = last;
        st.trim(committed);
    }

    /// Publishes one record as the writer applies it, ahead of the rest of its group: every
    /// seq between the head and `record.seq` belongs to another scope. `committed` as for
    /// [`publish`](Self::publish).
    pub(crate) fn push(&self, record: LogRecord, old: Option<Arc<HotEntry>>, committed: Seq) {
        let mut st = self.lock();
        debug_assert!(st.head < record.seq, "the feed moved back");
        st.head = record.seq;
        if let Some(old) = old {
            st.olds.push_back((record.seq, old));
        }
        st.records.push_back(record);
        st.trim(committed);
    }

    /// The last seq published.
    pub(crate) fn head(&self) -> Seq {
        self.lock().head
    }

    /// Empties the feed at `last` (the group was applied while the tier could not serve it,
    /// so its records are read from redb once committed).
    pub(crate) fn reset(&self, last: Seq) {
        let mut st = self.lock();
        st.records.clear();
        let olds = std::mem::take(&mut st.olds);
        st.dropped.extend(olds.into_iter().map(|(_, e)| e));
        st.floor = last;
        st.head = last;
    }

    /// Records up to `committed` are on redb: the oldest may go.
    pub(crate) fn committed(&self, committed: Seq) {
        self.lock().trim(committed);
    }

    /// Takes back the records after `to`: their commit failed (the writer then announces the
    /// rollback, which moves readers back).
    pub(crate) fn undo(&self, to: Seq) {
        let mut st = self.lock();
        while st.records.back().is_some_and(|r| r.seq > to) {
            st.records.pop_back();
        }
        while st.olds.back().is_some_and(|(s, _)| *s > to) {
            if let Some((_, e)) = st.olds.pop_back() {
                st.dropped.push(e);
            }
        }
        st.head = st.head.min(to);
        st.floor = st.floor.min(to);
    }

    /// The old versions let go of since the last call, to be freed off the writer thread.
    pub(crate) fn take_dropped(&self) -> Vec<Arc<HotEntry>> {
        std::mem::take(&mut self.lock().dropped)
    }

    /// The version the record at `seq` replaced, if the feed still holds it.
    pub(crate) fn old(&self, seq: Seq) -> Option<Arc<HotEntry>> {
        let st = self.lock();
        let i = st.olds.binary_search_by_key(&seq, |(s, _)| *s).ok()?;
        st.olds.get(i).map(|(_, e)| e.clone())
    }

    /// At most `limit` records after `cursor`.
    pub(crate) fn after(&self, cursor: Seq, limit: usize) -> FeedRead {
        let st = self.lock();
        if cursor < st.floor {
            return FeedRead::Behind;
        }
        let start = st.records.partition_point(|r| r.seq <= cursor);
        let records: Vec<LogRecord> = st.records.iter().skip(start).take(limit).cloned().collect();
        let scanned = if records.len() == limit {
            records.last().map_or(st.head, |r| r.seq)
        } else {
            st.head.max(cursor)
        };
        FeedRead::Records { records, scanned }
    }
}

impl State {
    fn trim(&mut self, committed: Seq) {
        while self.records.len() > KEEP {
            match self.records.front() {
                Some(r) if r.seq <= committed => {
                    self.floor = r.seq;
                    self.records.pop_front();
                    while self.olds.front().is_some_and(|(s, _)| *s <= self.floor) {
                        if let Some((_, e)) = self.olds.pop_front() {
                            self.dropped.push(e);
                        }
                    }
                }
                _ => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::object::{ObjectKey, ResourceVersion};
    use crate::store::{DeltaKind, ScopeId};
    use proptest::prelude::*;

    fn rec(seq: u64) -> LogRecord {
        LogRecord {
            seq: Seq(seq),
            scope: ScopeId(1),
            kind: DeltaKind::Added,
            key: ObjectKey::namespaced("ns", format!("o{seq}")),
            rv: ResourceVersion::from(seq.to_string()),
            object: Some(bytes::Bytes::from_static(b"{}")),
            old: None,
            final_state_unknown: false,
        }
    }

    fn seqs(read: &FeedRead) -> (Vec<u64>, u64) {
        match read {
            FeedRead::Records { records, scanned } => (records.iter().map(|r| r.seq.0).collect(), scanned.0),
            other => panic!("expected records, got {other:?}"),
        }
    }

    #[test]
    fn a_reader_gets_what_follows_its_cursor_and_moves_to_the_head() {
        let feed = Feed::new(Seq(10));
        assert_eq!(seqs(&feed.after(Seq(10), 100)), (vec![], 10));
        assert!(matches!(feed.after(Seq(9), 100), FeedRead::Behind));
        // Seq 12 belongs to another scope: the head passes it.
        feed.publish(vec![rec(11), rec(13)], Seq(10), Seq(14), Seq(10));
        assert_eq!(seqs(&feed.after(Seq(10), 100)), (vec![11, 13], 14));
        assert_eq!(seqs(&feed.after(Seq(11), 100)), (vec![13], 14));
        assert_eq!(seqs(&feed.after(Seq(10), 1)), (vec![11], 11));
    }

    #[test]
    fn an_undo_takes_the_records_back_and_their_seqs_are_published_again() {
        let feed = Feed::new(Seq(0));
        feed.publish(vec![rec(1), rec(2)], Seq(0), Seq(2), Seq(0));
        feed.publish(vec![rec(3), rec(4)], Seq(2), Seq(4), Seq(2));
        feed.undo(Seq(2));
        assert_eq!(seqs(&feed.after(Seq(2), 100)), (vec![], 2));
        // The seqs are handed out again, for other records; a reader moved back gets those.
        let mut other = rec(3);
        other.key = ObjectKey::namespaced("ns", "replacement");
        feed.publish(vec![other], Seq(2), Seq(3), Seq(2));
        let FeedRead::Records { records, scanned } = feed.after(Seq(2), 100) else {
            panic!("records expected")
        };
        assert_eq!(
            (records.len(), records[0].key.name.as_str(), scanned),
            (1, "replacement", Seq(3))
        );
    }

    #[test]
    fn a_reset_sends_readers_to_redb_for_what_it_skipped() {
        let feed = Feed::new(Seq(0));
        feed.publish(vec![rec(1)], Seq(0), Seq(1), Seq(0));
        feed.reset(Seq(5));
        assert!(matches!(feed.after(Seq(1), 100), FeedRead::Behind));
        assert_eq!(seqs(&feed.after(Seq(5), 100)), (vec![], 5));
    }

    proptest! {
        /// Against a model (every published record, dropping nothing): a reader that follows
        /// the feed, and reads the model ("redb") when behind, sees every record once, in order.
        #[test]
        fn readers_see_every_record_once_in_order(groups in prop::collection::vec((0usize..40, 0u64..3), 1..200), limit in 1usize..300) {
            let feed = Feed::new(Seq(0));
            let mut all: Vec<u64> = Vec::new();
            let mut next = 1u64;
            let mut committed = Seq(0);
            let (mut cursor, mut seen) = (Seq(0), Vec::new());
            for (n, gap) in groups {
                let recs: Vec<LogRecord> = (0..n).map(|i| rec(next + i as u64)).collect();
                all.extend(recs.iter().map(|r| r.seq.0));
                let after = Seq(next - 1);
                let last = Seq(next + n as u64 + gap);
                next = last.0 + 1;
                feed.publish(recs, after, last, committed);
                committed = last;
                feed.committed(committed);
                // Read a little after every group, sometimes nothing.
                for _ in 0..(gap as usize) {
                    match feed.after(cursor, limit) {
                        FeedRead::Records { records, scanned } => {
                            seen.extend(records.iter().map(|r| r.seq.0));
                            prop_assert!(scanned >= cursor);
                            cursor = scanned;
                        }
                        FeedRead::Behind => {
                            // redb: everything committed after the cursor.
                            seen.extend(all.iter().copied().filter(|s| *s > cursor.0 && *s <= committed.0));
                            cursor = committed;
                        }
                    }
                }
            }
            let expected: Vec<u64> = all.iter().copied().filter(|s| *s <= cursor.0).collect();
            prop_assert_eq!(seen, expected);
        }
    }
}
