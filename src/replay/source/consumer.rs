//! The consumer end of the feed: what lists and watches read, and the replay's progress.

use crate::util::Locked;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, watch};

use super::super::ReplayError;
use crate::object::{RawObject, ResourceVersion};
use crate::source::{DecodeError, SourceError};

use super::feed::{Feed, FeedSummary};
use super::options::ReplayReport;

#[derive(Default)]
pub(super) struct ProgressState {
    pub(super) done: bool,
    pub(super) report: ReplayReport,
    pub(super) error: Option<ReplayError>,
    pub(super) error_text: Option<String>,
}

pub(super) struct Progress {
    pub(super) state: Mutex<ProgressState>,
    pub(super) done: watch::Sender<bool>,
}

impl Progress {
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, ProgressState> {
        self.state.locked()
    }

    pub(super) fn take_error(&self) -> Option<ReplayError> {
        let mut s = self.lock();
        match s.error.take() {
            Some(e) => Some(e),
            None => s.error_text.clone().map(ReplayError::Failed),
        }
    }
}

pub(super) struct Consumer {
    pub(super) rx: mpsc::Receiver<Vec<Feed>>,
    pub(super) buf: VecDeque<Feed>,
    pub(super) initial_done: bool,
    pub(super) finished: bool,
    pub(super) last_rv: ResourceVersion,
    pub(super) initial: u64,
    pub(super) events: u64,
    pub(super) progress: Arc<Progress>,
}

impl Consumer {
    pub(super) async fn next(&mut self) -> Feed {
        loop {
            if let Some(f) = self.buf.pop_front() {
                return f;
            }
            match self.rx.recv().await {
                Some(chunk) => self.buf.extend(chunk),
                None => {
                    return Feed::Done(Err(ReplayError::Failed(
                        "the recording reader stopped unexpectedly".into(),
                    )))
                }
            }
        }
    }

    /// Records the end of the feed; returns the error to hand to the reflector, if any.
    /// Counts an object of the initial list.
    pub(super) fn initial_object(&mut self, o: RawObject) -> RawObject {
        self.initial += 1;
        o
    }

    /// The initial list ended at `rv`.
    pub(super) fn end_initial(&mut self, rv: &ResourceVersion) {
        self.initial_done = true;
        self.last_rv = rv.clone();
    }

    pub(super) fn finish(&mut self, result: Result<FeedSummary, ReplayError>) -> Option<SourceError> {
        self.finished = true;
        let mut s = self.progress.lock();
        s.done = true;
        s.report.initial_objects = self.initial;
        s.report.events = self.events;
        s.report.last_rv = self.last_rv.clone();
        let err = match result {
            Ok(sum) => {
                s.report.skipped_malformed = sum.skipped_malformed;
                s.report.rv_regressions = sum.rv_regressions;
                s.report.error_events = sum.error_events;
                s.report.relists = sum.relists;
                s.report.truncated_tail = sum.truncated_tail;
                s.report.stopped_early = sum.stopped_early;
                None
            }
            Err(e) => {
                let line = match &e {
                    ReplayError::Malformed { line, .. }
                    | ReplayError::UnknownEventType { line, .. }
                    | ReplayError::RvRegression { line, .. } => Some(*line),
                    _ => None,
                };
                s.error_text = Some(e.to_string());
                // The reflector gets a copy; the replay's caller the error itself.
                let copy = e.duplicate().unwrap_or_else(|| ReplayError::Failed(e.to_string()));
                s.error = Some(e);
                Some(SourceError::decode(
                    "recording",
                    line,
                    DecodeError::Recording(Arc::new(copy)),
                ))
            }
        };
        drop(s);
        self.progress.done.send_replace(true);
        err
    }
}

pub(super) struct Shared {
    pub(super) consumer: Mutex<Option<Consumer>>,
    pub(super) progress: Arc<Progress>,
}

/// Holds the consumer while a list or watch uses it, and gives it back when dropped.
pub(super) struct Guard {
    pub(super) shared: Arc<Shared>,
    pub(super) consumer: Option<Consumer>,
}

impl Guard {
    pub(super) fn take(shared: &Arc<Shared>) -> Result<Self, SourceError> {
        let consumer = shared.consumer.locked().take();
        match consumer {
            Some(c) => Ok(Self {
                shared: shared.clone(),
                consumer: Some(c),
            }),
            None => Err(SourceError::Transport {
                resource: "recording".into(),
                detail: "the recording is already being read by another request".into(),
            }),
        }
    }

    pub(super) fn c(&mut self) -> &mut Consumer {
        // Invariant: `consumer` is `Some` from `take` until `drop`.
        self.consumer
            .as_mut()
            .expect("the consumer is held until the guard drops")
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(c) = self.consumer.take() {
            *self.shared.consumer.locked() = Some(c);
        }
    }
}
