//! Fault injection for the simulated server: dropped watches, delays, 429/500, stalls and
//! cut chunks. Switches apply to requests that start after they are set.

use crate::util::Locked;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// Which requests a failure applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultTarget {
    /// LIST requests only.
    List,
    /// WATCH requests only.
    Watch,
    /// Every request to a resource path (LIST, WATCH, GET, writes).
    Any,
}

/// An error response to inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// HTTP 429 `TooManyRequests` with a `Retry-After` header of this many seconds.
    TooManyRequests {
        /// Value of `Retry-After` (and `details.retryAfterSeconds`).
        retry_after_secs: u32,
    },
    /// HTTP 500 `InternalError`.
    InternalError,
}

#[derive(Debug, Default)]
pub(crate) struct FaultState {
    pub drop_watch_after: Option<u64>,
    pub delay: Duration,
    pub fail: Option<(FaultTarget, Failure, u32)>,
    pub stall_watches: u32,
    pub cut_watches: u32,
    pub garble_watch: Option<u64>,
    pub too_large_watches: bool,
    pub delay_replay: Option<Duration>,
}

/// Fault-injection switches of a running [`Sim`](super::Sim).
#[derive(Debug, Clone, Default)]
pub struct Faults {
    inner: Arc<Mutex<FaultState>>,
}

impl Faults {
    pub(crate) fn lock(&self) -> MutexGuard<'_, FaultState> {
        self.inner.locked()
    }

    /// End every watch opened from now on after it has sent `events` events (bookmarks
    /// excluded); `None` turns it off. The stream ends cleanly, as a proxy timeout would.
    pub fn drop_watch_after(&self, events: Option<u64>) {
        self.lock().drop_watch_after = events;
    }

    /// Delay every response by `d` (zero turns it off).
    pub fn delay(&self, d: Duration) {
        self.lock().delay = d;
    }

    /// Answer the next `times` requests matching `target` with `failure`.
    pub fn fail_next(&self, target: FaultTarget, failure: Failure, times: u32) {
        self.lock().fail = Some((target, failure, times));
    }

    /// The next `watches` WATCH requests get HTTP 200 and then nothing: no events, no
    /// bookmarks, no end of stream, until the client gives up.
    pub fn stall_next_watches(&self, watches: u32) {
        self.lock().stall_watches = watches;
    }

    /// The next `watches` WATCH requests send half of their first event line and then abort
    /// the connection (a chunk cut in half).
    pub fn cut_next_watches(&self, watches: u32) {
        self.lock().cut_watches = watches;
    }

    /// The next WATCH request sends `after_events` events intact, then the next event's line
    /// cut short (not valid JSON, newline-terminated), then carries on as usual.
    pub fn garble_next_watch(&self, after_events: u64) {
        self.lock().garble_watch = Some(after_events);
    }

    /// While on, a WATCH from a resourceVersion the server has not reached waits the
    /// configured too-large wait and answers HTTP 504 with cause `ResourceVersionTooLarge`, as
    /// some API server versions do, instead of staying silent.
    pub fn too_large_watches(&self, on: bool) {
        self.lock().too_large_watches = on;
    }

    /// While `Some(d)`, every WATCH from a resourceVersion waits `d` after its response
    /// headers before it sends anything: the replay of the events the watch cache holds after
    /// that resourceVersion comes late (a busy or lagging server), and so does everything
    /// after it.
    pub fn delay_watch_replay(&self, d: Option<Duration>) {
        self.lock().delay_replay = d;
    }

    /// Turn every fault off.
    pub fn clear(&self) {
        *self.lock() = FaultState::default();
    }

    /// Take one injected failure for a request of kind `is_watch`/`is_list`, if any is armed.
    pub(crate) fn take_failure(&self, is_list: bool, is_watch: bool) -> Option<Failure> {
        let mut st = self.lock();
        let (target, failure, times) = st.fail?;
        let applies = match target {
            FaultTarget::Any => true,
            FaultTarget::List => is_list,
            FaultTarget::Watch => is_watch,
        };
        if !applies || times == 0 {
            return None;
        }
        st.fail = if times > 1 {
            Some((target, failure, times - 1))
        } else {
            None
        };
        Some(failure)
    }

    pub(crate) fn take_counter(&self, pick: impl FnOnce(&mut FaultState) -> &mut u32) -> bool {
        let mut st = self.lock();
        let c = pick(&mut st);
        if *c > 0 {
            *c -= 1;
            true
        } else {
            false
        }
    }
}
