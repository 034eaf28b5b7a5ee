//! The feeder: reads and decodes the recording on its own thread and hands events over in chunks.

use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::super::format::{event_rv, RecordedEvent, RecordingReader};
use super::super::{ReplayError, RvRegressionPolicy};
use crate::object::{RawObject, ResourceVersion};
use crate::source::WatchEvent;

use super::options::{ReplayOptions, Speed};
use super::CHUNK;

#[derive(Debug, Default)]
pub(super) struct FeedSummary {
    pub(super) skipped_malformed: u64,
    pub(super) rv_regressions: u64,
    pub(super) error_events: u64,
    pub(super) relists: u64,
    pub(super) truncated_tail: bool,
    pub(super) stopped_early: bool,
}

pub(super) enum Feed {
    Initial(RawObject),
    InitialEnd(ResourceVersion),
    Event(WatchEvent),
    Done(Result<FeedSummary, ReplayError>),
}

/// Reads the recording on its own thread and feeds the consumer in chunks.
pub(super) struct Feeder {
    pub(super) tx: mpsc::Sender<Vec<Feed>>,
    pub(super) chunk: Vec<Feed>,
    pub(super) options: ReplayOptions,
    pub(super) summary: FeedSummary,
    pub(super) initial: bool,
    pub(super) initial_max: Option<ResourceVersion>,
    pub(super) initial_cut: bool,
    pub(super) last: Option<ResourceVersion>,
    pub(super) pace: Option<(Instant, u64)>,
    /// A 410 ERROR waiting for the next line: followed by a new initial state (what the
    /// recorder and export write after an expired watch) it is replayed as a relist.
    pub(super) gone: Option<RecordedEvent>,
}

pub(super) enum Flow {
    Continue,
    Stop,
}

/// The newer of two resourceVersions (integers compared; otherwise the later one wins).
pub(super) fn newer(a: Option<ResourceVersion>, b: &ResourceVersion) -> ResourceVersion {
    match a {
        Some(a) if b.is_older_than(&a) => a,
        _ => b.clone(),
    }
}

impl Feeder {
    pub(super) fn run(mut self, mut reader: RecordingReader, prefix: Vec<RecordedEvent>) {
        let result = self.run_inner(&mut reader, prefix);
        if let Some(ev) = self.gone.take() {
            self.skip_error(&ev);
        }
        let result = result.map(|()| {
            let mut s = std::mem::take(&mut self.summary);
            s.skipped_malformed = reader.skipped();
            s.truncated_tail = reader.truncated_tail();
            s
        });
        if self.initial {
            self.end_initial(None);
        }
        self.chunk.push(Feed::Done(result));
        self.flush();
    }

    pub(super) fn run_inner(
        &mut self,
        reader: &mut RecordingReader,
        prefix: Vec<RecordedEvent>,
    ) -> Result<(), ReplayError> {
        for ev in prefix {
            if matches!(self.handle(ev)?, Flow::Stop) {
                return Ok(());
            }
        }
        while let Some(ev) = reader.next_event()? {
            if matches!(self.handle(ev)?, Flow::Stop) {
                return Ok(());
            }
        }
        Ok(())
    }

    pub(super) fn flush(&mut self) -> bool {
        if self.chunk.is_empty() {
            return true;
        }
        self.tx.blocking_send(std::mem::take(&mut self.chunk)).is_ok()
    }

    pub(super) fn push(&mut self, f: Feed) -> bool {
        self.chunk.push(f);
        if self.chunk.len() >= CHUNK {
            self.flush()
        } else {
            true
        }
    }

    pub(super) fn end_initial(&mut self, rv: Option<ResourceVersion>) -> bool {
        self.initial = false;
        let rv = rv
            .filter(|r| !r.is_empty())
            .or_else(|| self.initial_max.clone())
            .unwrap_or_else(|| "0".into());
        self.last = Some(rv.clone());
        self.push(Feed::InitialEnd(rv))
    }

    pub(super) fn skip_error(&mut self, ev: &RecordedEvent) {
        if let WatchEvent::Error(status) = &ev.event {
            tracing::warn!(path = %ev.path.display(), line = ev.line, %status, "ERROR event in the recording; not replayed");
        }
        self.summary.error_events += 1;
    }

    pub(super) fn handle(&mut self, ev: RecordedEvent) -> Result<Flow, ReplayError> {
        let closed = |ok: bool| if ok { Flow::Continue } else { Flow::Stop };
        if let Some(gone) = self.gone.take() {
            if matches!(
                ev.event,
                WatchEvent::Added(_)
                    | WatchEvent::Bookmark {
                        initial_events_end: true,
                        ..
                    }
            ) {
                // The watch expired and the recording holds the state the relist found: the
                // reflector gets the 410 and relists from that state, as it did live.
                self.summary.relists += 1;
                if !self.push(Feed::Event(gone.event)) {
                    return Ok(Flow::Stop);
                }
                self.initial = true;
                self.initial_max = None;
            } else {
                self.skip_error(&gone);
            }
        }
        if self.initial {
            // Received after the stop time: left out, like an object past the stop RV.
            let late = matches!((self.options.stop_at_ms, ev.received_at_ms), (Some(stop), Some(at)) if at > stop);
            match ev.event {
                WatchEvent::Added(o) => {
                    let rv = &o.meta.resource_version;
                    if late || self.options.stop_at_rv.as_ref().is_some_and(|s| s.is_older_than(rv)) {
                        self.initial_cut = true;
                        return Ok(Flow::Continue);
                    }
                    self.initial_max = Some(newer(self.initial_max.take(), rv));
                    return Ok(closed(self.push(Feed::Initial(o))));
                }
                WatchEvent::Bookmark {
                    resource_version,
                    initial_events_end: true,
                } => {
                    self.initial_cut |= late;
                    let rv = if self.initial_cut { None } else { Some(resource_version) };
                    let ok = self.end_initial(rv);
                    if self.initial_cut {
                        self.summary.stopped_early = true;
                        return Ok(Flow::Stop);
                    }
                    return Ok(closed(ok));
                }
                event => {
                    if !self.end_initial(None) {
                        return Ok(Flow::Stop);
                    }
                    if self.initial_cut {
                        self.summary.stopped_early = true;
                        return Ok(Flow::Stop);
                    }
                    return self.live(RecordedEvent { event, ..ev });
                }
            }
        }
        self.live(ev)
    }

    pub(super) fn live(&mut self, ev: RecordedEvent) -> Result<Flow, ReplayError> {
        if let WatchEvent::Error(status) = &ev.event {
            if status.is_gone() {
                self.gone = Some(ev);
            } else {
                self.skip_error(&ev);
            }
            return Ok(Flow::Continue);
        }
        let Some(rv) = event_rv(&ev.event).cloned() else {
            return Ok(Flow::Continue);
        };
        if let Some(stop) = &self.options.stop_at_rv {
            if stop.is_older_than(&rv) {
                self.summary.stopped_early = true;
                return Ok(Flow::Stop);
            }
        }
        if let (Some(stop), Some(at)) = (self.options.stop_at_ms, ev.received_at_ms) {
            if at > stop {
                self.summary.stopped_early = true;
                return Ok(Flow::Stop);
            }
        }
        if let Some(last) = &self.last {
            if rv.is_older_than(last) {
                match self.options.on_rv_regression {
                    RvRegressionPolicy::Fail => {
                        return Err(ReplayError::RvRegression {
                            path: ev.path,
                            line: ev.line,
                            previous: last.clone(),
                            found: rv,
                        })
                    }
                    RvRegressionPolicy::Warn => {
                        tracing::warn!(path = %ev.path.display(), line = ev.line, previous = %last, found = %rv,
                            "resourceVersion goes backwards; event skipped");
                        self.summary.rv_regressions += 1;
                        return Ok(Flow::Continue);
                    }
                }
            }
        }
        let paced = self.pace(ev.received_at_ms);
        self.last = Some(rv);
        let mut ok = self.push(Feed::Event(ev.event));
        if paced {
            ok &= self.flush();
        }
        Ok(if ok { Flow::Continue } else { Flow::Stop })
    }

    /// Sleeps until the event is due; returns whether pacing is on.
    pub(super) fn pace(&mut self, at: Option<u64>) -> bool {
        let Speed::Factor(factor) = self.options.speed else {
            return false;
        };
        let Some(at) = at else { return true };
        let factor = if factor.is_finite() && factor > 0.0 {
            factor
        } else {
            1.0
        };
        let (start, t0) = *self.pace.get_or_insert((Instant::now(), at));
        #[allow(clippy::cast_precision_loss)] // millisecond offsets far below 2^52
        let offset = Duration::from_secs_f64(at.saturating_sub(t0) as f64 / 1000.0 / factor);
        let due = start + offset;
        let now = Instant::now();
        if due > now {
            self.flush();
            std::thread::sleep(due - now);
        }
        true
    }
}
