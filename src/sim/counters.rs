//! Request counters: what the server was asked and served, for tests and benchmarks.

use std::sync::atomic::{AtomicU64, Ordering};

/// A snapshot of the request counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Counters {
    /// LIST requests answered (any status).
    pub list_requests: u64,
    /// Objects returned by LIST requests.
    pub list_objects: u64,
    /// WATCH requests received (any status).
    pub watch_requests: u64,
    /// ADDED/MODIFIED/DELETED/ERROR events written to watch streams.
    pub watch_events: u64,
    /// BOOKMARK events written to watch streams.
    pub bookmarks: u64,
    /// GET requests for single objects.
    pub get_requests: u64,
    /// POST/PUT/PATCH/DELETE requests.
    pub write_requests: u64,
    /// Response body bytes written (LIST, WATCH, GET, writes, errors).
    pub bytes_served: u64,
    /// Requests that carried an `Authorization: Bearer …` header. The server authenticates
    /// nobody and never keeps the token; this lets tests prove a client sent one.
    pub bearer_requests: u64,
}

#[derive(Debug, Default)]
pub(crate) struct AtomicCounters {
    pub list_requests: AtomicU64,
    pub list_objects: AtomicU64,
    pub watch_requests: AtomicU64,
    pub watch_events: AtomicU64,
    pub bookmarks: AtomicU64,
    pub get_requests: AtomicU64,
    pub write_requests: AtomicU64,
    pub bytes_served: AtomicU64,
    pub bearer_requests: AtomicU64,
}

impl AtomicCounters {
    pub(super) fn snapshot(&self) -> Counters {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Counters {
            list_requests: l(&self.list_requests),
            list_objects: l(&self.list_objects),
            watch_requests: l(&self.watch_requests),
            watch_events: l(&self.watch_events),
            bookmarks: l(&self.bookmarks),
            get_requests: l(&self.get_requests),
            write_requests: l(&self.write_requests),
            bytes_served: l(&self.bytes_served),
            bearer_requests: l(&self.bearer_requests),
        }
    }
    pub(super) fn reset(&self) {
        for a in [
            &self.list_requests,
            &self.list_objects,
            &self.watch_requests,
            &self.watch_events,
            &self.bookmarks,
            &self.get_requests,
            &self.write_requests,
            &self.bytes_served,
            &self.bearer_requests,
        ] {
            a.store(0, Ordering::Relaxed);
        }
    }
}
