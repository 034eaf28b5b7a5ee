//! Background work of the writer: compaction and index backfills, run as bounded transactions
//! between group commits, so neither a large backlog nor a large scope holds up ingest for long.
//!
//! After every group the writer plans retention and runs compaction steps until it removed as
//! many entries as the group appended (so the log stays bounded under sustained load), then one
//! backfill step. While nothing is queued it runs steps back to back, checking the queue before
//! each one.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use redb::WriteTransaction;

use super::retention::{Compaction, Pins};
use super::{Backfills, Deferred, Failure, Step, StoreError, WriterThread};

/// What the writer keeps up between groups: compaction, retention, index backfills and the
/// file size metric.
pub(super) struct Upkeep {
    pub(super) retention_entries: Option<u64>,
    pub(super) retention_age: Option<Duration>,
    /// Most log entries one compaction transaction removes.
    pub(super) compact_step: usize,
    /// Most objects one backfill transaction indexes.
    pub(super) backfill_step: usize,
    /// Compaction still to do (automatic retention and explicit `compact` calls).
    pub(super) compaction: RefCell<Compaction>,
    /// Backfills this writer runs, with the callers waiting for each. An index in here has its
    /// function registered, so every write since maintained its rows.
    pub(super) backfills: RefCell<Backfills>,
    /// Whether the next idle step goes to a backfill (compaction and backfills take turns).
    pub(super) backfill_turn: Cell<bool>,
    /// When the file size was last published to the `database_bytes` metric.
    pub(super) size_observed: Cell<Option<std::time::Instant>>,
    /// Seqs readers are still delivering from without a durable cursor: compaction keeps them.
    pub(super) pins: Arc<Pins>,
    /// When scopes were last used, and dropping those unused for long.
    pub(super) scopes: super::scopes::ScopeLife,
}

impl Upkeep {
    pub(super) fn new(config: &super::super::StoreConfig, pins: Arc<Pins>) -> Self {
        Self {
            retention_entries: config.retention_entries,
            retention_age: config.retention_age,
            compact_step: config.compact_step,
            backfill_step: config.backfill_step,
            compaction: RefCell::new(Compaction::default()),
            backfills: RefCell::new(BTreeMap::new()),
            backfill_turn: Cell::new(false),
            size_observed: Cell::new(None),
            pins,
            scopes: super::scopes::ScopeLife::new(config.drop_unused_scopes_after),
        }
    }
}

/// Shortest and longest idle wait between looks at the log's age.
const AGE_POLL_MIN: Duration = Duration::from_secs(1);
const AGE_POLL_MAX: Duration = Duration::from_secs(60);

impl WriterThread {
    /// Runs `f` in a transaction of its own, committed with the store's durability.
    pub(super) fn maintenance<T>(&self, f: impl FnOnce(&WriteTransaction) -> Step<T>) -> Result<T, StoreError> {
        self.maintenance_with(self.commit.durable, f)
    }

    /// A maintenance commit that changes what a scope is (an index made ready, a stale scope
    /// dropped): durable on every store, as the commands that do so are.
    pub(super) fn structural_maintenance<T>(
        &self,
        f: impl FnOnce(&WriteTransaction) -> Step<T>,
    ) -> Result<T, StoreError> {
        self.maintenance_with(true, f)
    }

    fn maintenance_with<T>(
        &self,
        durable: bool,
        f: impl FnOnce(&WriteTransaction) -> Step<T>,
    ) -> Result<T, StoreError> {
        if self.commit.poisoned.get() {
            self.recover()?;
        }
        let db = self.shared.db()?;
        let mut txn = db.begin_write().map_err(|e| {
            let e = self.shared.storage(e);
            self.note(&e);
            e
        })?;
        if !durable {
            super::thread::relax(&mut txn);
        }
        let out = match f(&txn) {
            Ok(v) => v,
            Err(Failure::Refused(e) | Failure::Fatal(e)) => {
                drop(txn);
                self.note(&e);
                return Err(e);
            }
        };
        txn.commit().map_err(|e| {
            let e = self.shared.storage(e);
            self.note(&e);
            e
        })?;
        Ok(out)
    }

    /// Takes over a command's reply once its group committed.
    pub(super) fn defer(&self, d: Deferred) {
        match d {
            Deferred::Compact(ack, goal) => self.defer_compact(ack, goal),
            Deferred::Settle(ack) => self.defer_settle(ack),
            Deferred::Backfill(ack, scope, name) => self.defer_backfill(ack, scope, name),
        }
    }

    pub(super) fn has_background_work(&self) -> bool {
        self.has_compaction_work() || self.has_backfill_work()
    }

    /// How long to wait for commands while idle before looking at the log's age and the
    /// scopes' use again.
    pub(super) fn idle_poll(&self) -> Option<Duration> {
        let scopes = self.upkeep.scopes.due_in();
        Some(
            self.upkeep
                .retention_age
                .map_or(scopes, |age| (age / 10).clamp(AGE_POLL_MIN, AGE_POLL_MAX).min(scopes)),
        )
    }

    /// Nothing came in for [`idle_poll`](Self::idle_poll): what is due by time.
    pub(super) fn idle_tick(&self) {
        if self.upkeep.retention_age.is_some() {
            self.plan_retention();
        }
        if self.scope_life_due() {
            self.scope_life_step();
        }
    }

    /// One step while idle: compaction and backfill take turns.
    pub(super) fn background_step(&self) {
        let backfill_turn = self.upkeep.backfill_turn.get();
        self.upkeep.backfill_turn.set(!backfill_turn);
        if self.has_backfill_work() && (backfill_turn || !self.has_compaction_work()) {
            self.backfill_job_step();
        } else if self.has_compaction_work() {
            self.compaction_step();
        }
        self.observe_size(!self.has_background_work());
    }

    /// Publishes the file size to the `database_bytes` metric: at most once a second (a
    /// `stat` per commit would cost more than the metric is worth), and always when `now`.
    pub(super) fn observe_size(&self, now: bool) {
        let due = self
            .upkeep
            .size_observed
            .get()
            .is_none_or(|at| at.elapsed() >= std::time::Duration::from_secs(1));
        if now || due {
            crate::store::metrics::observe_db_size(&self.shared.path);
            self.upkeep.size_observed.set(Some(std::time::Instant::now()));
        }
    }

    /// After a group commit that appended `appended` entries.
    pub(super) fn after_group(&self, appended: u64) {
        if self.commit.poisoned.get() {
            return;
        }
        self.plan_retention();
        let mut removed = 0;
        while self.has_compaction_work() && !self.commit.poisoned.get() {
            let n = self.compaction_step();
            removed += n;
            if n == 0 || removed >= appended {
                break;
            }
        }
        if self.has_backfill_work() && !self.commit.poisoned.get() {
            self.backfill_job_step();
        }
        if self.scope_life_due() && !self.commit.poisoned.get() {
            self.scope_life_step();
        }
        // Idle: the size settles here; busy: once a second.
        self.observe_size(self.commit.rx.is_empty() && !self.has_background_work());
    }

    /// The store is closing: callers still waiting hear so (backfill progress stays persisted).
    pub(super) fn abandon_background_work(&self) {
        let e = StoreError::Aborted(
            "the store was closed before this finished; a backfill resumes on the next ensure_index".into(),
        );
        self.abandon_compaction(&e);
        self.abandon_backfills(&e);
    }
}
