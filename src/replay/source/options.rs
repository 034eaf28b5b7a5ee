//! How to replay (speed, policies, transform) and what a replay reports.

use super::super::{MalformedPolicy, RvRegressionPolicy};
use crate::object::{ResourceVersion, ScopeSpec};
use crate::reflector::Transform;

/// How fast a replay goes.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Speed {
    /// As fast as the store takes it (default).
    #[default]
    Max,
    /// Real time multiplied by this factor (2.0 = twice as fast), from the recorded receive
    /// times; lines without a receive time are not delayed.
    Factor(f64),
}

/// How to replay a recording.
#[derive(Debug, Clone)]
pub struct ReplayOptions {
    /// Malformed lines: fail (default) or skip and count.
    pub on_malformed: MalformedPolicy,
    /// resourceVersions going backwards: fail (default) or skip the event with a warning.
    pub on_rv_regression: RvRegressionPolicy,
    /// Pace.
    pub speed: Speed,
    /// Stop after the last event whose resourceVersion is not newer than this (integer RVs).
    /// Objects of the initial ADDED run newer than it are left out.
    pub stop_at_rv: Option<ResourceVersion>,
    /// Stop before the first event received after this time (unix milliseconds). Objects of
    /// the initial ADDED run received after it are left out.
    pub stop_at_ms: Option<u64>,
    /// The scope; derived from the first object's `apiVersion`/`kind` when `None`.
    pub scope: Option<ScopeSpec>,
    /// The transform [`replay_into`] runs the reflector with. Default: nothing dropped, so
    /// stored objects are the recorded bytes exactly (not the reflector's default, which drops
    /// `metadata.managedFields`).
    pub transform: Transform,
    /// Most deltas per batch handed to the writer by [`replay_into`] (default 1000).
    pub max_batch: usize,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        Self {
            on_malformed: MalformedPolicy::Fail,
            on_rv_regression: RvRegressionPolicy::Fail,
            speed: Speed::Max,
            stop_at_rv: None,
            stop_at_ms: None,
            scope: None,
            transform: Transform {
                drop_managed_fields: false,
                ..Transform::default()
            },
            max_batch: 1000,
        }
    }
}

impl ReplayOptions {
    /// Sets the malformed-line policy.
    #[must_use]
    pub fn on_malformed(mut self, policy: MalformedPolicy) -> Self {
        self.on_malformed = policy;
        self
    }

    /// Sets the RV-regression policy.
    #[must_use]
    pub fn on_rv_regression(mut self, policy: RvRegressionPolicy) -> Self {
        self.on_rv_regression = policy;
        self
    }

    /// Sets the pace.
    #[must_use]
    pub fn speed(mut self, speed: Speed) -> Self {
        self.speed = speed;
        self
    }

    /// Stops at a resourceVersion (inclusive).
    #[must_use]
    pub fn stop_at_rv(mut self, rv: impl Into<ResourceVersion>) -> Self {
        self.stop_at_rv = Some(rv.into());
        self
    }

    /// Stops at a receive time (unix milliseconds, inclusive).
    #[must_use]
    pub fn stop_at_ms(mut self, ms: u64) -> Self {
        self.stop_at_ms = Some(ms);
        self
    }

    /// Sets the scope instead of deriving it.
    #[must_use]
    pub fn scope(mut self, scope: ScopeSpec) -> Self {
        self.scope = Some(scope);
        self
    }

    /// Sets the transform used by [`replay_into`].
    #[must_use]
    pub fn transform(mut self, transform: Transform) -> Self {
        self.transform = transform;
        self
    }
}

/// What a replay did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplayReport {
    /// Objects of the initial ADDED run (served as the initial list).
    pub initial_objects: u64,
    /// Watch events delivered after it (bookmarks included).
    pub events: u64,
    /// The resourceVersion the scope reached.
    pub last_rv: ResourceVersion,
    /// Malformed lines skipped ([`MalformedPolicy::Skip`]).
    pub skipped_malformed: u64,
    /// Events skipped because their RV went backwards ([`RvRegressionPolicy::Warn`]).
    pub rv_regressions: u64,
    /// `ERROR` events in the recording that were not replayed: any but a 410 followed by the
    /// state a relist found (the reflector cannot relist against a recording that has no
    /// answer).
    pub error_events: u64,
    /// 410 `ERROR` events followed by a new initial state, replayed as relists.
    pub relists: u64,
    /// The recording ends cut off (a crash while recording): a truncated last line was
    /// dropped, or a compressed file ends mid-frame.
    pub truncated_tail: bool,
    /// The replay stopped at [`ReplayOptions::stop_at_rv`] / [`ReplayOptions::stop_at_ms`]
    /// before the end of the recording.
    pub stopped_early: bool,
}
