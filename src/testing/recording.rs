//! Recordings as the harness uses them: an initial state and the world's changes, in order.

use crate::sim::util::JsonAt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;

use super::oracle::merge_diff;
use super::run::world_body;
use super::HarnessError;
use crate::replay::{plural_of, RecordingReader};
use crate::source::WatchEvent;

/// What the world did to one object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    Added,
    Modified,
    Deleted,
}

impl Change {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Change::Added => "ADDED",
            Change::Modified => "MODIFIED",
            Change::Deleted => "DELETED",
        }
    }
}

/// One recorded change of the world.
#[derive(Debug, Clone)]
pub(crate) struct WorldEvent {
    /// The simulated server's name of the resource (`plural` or `plural.group`).
    pub resource: String,
    pub change: Change,
    pub object: Arc<Value>,
    /// The recorded resourceVersion (to merge several recordings of one cluster in order).
    pub rv: Option<u64>,
    /// `file:line`, for the trace and error messages.
    pub origin: String,
    /// For a change: the merge patch from the recorded previous version of the object
    /// (the whole object without a previous one; `None`: nothing changed). Computed once
    /// here, not in every schedule.
    pub patch: Option<Arc<Value>>,
}

/// A recording read for the harness: the state it starts with and the changes after it.
///
/// A recording is what `durable-informer record` writes (or `kubectl get --raw
/// '…?watch=1'` prints): ADDED lines for the initial state, optionally closed by a BOOKMARK
/// annotated `k8s.io/initial-events-end`, then the watch events. `BOOKMARK` and `ERROR` lines
/// after the initial state are skipped.
///
/// ```no_run
/// use durable_informer::testing::Recording;
/// # fn f() -> Result<(), durable_informer::testing::HarnessError> {
/// let rec = Recording::open("tests/data/recordings/foos.jsonl")?;
/// println!("{} objects, then {} changes of {}", rec.initial_len(), rec.changes_len(), rec.resource());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Recording {
    pub(crate) resource: String,
    pub(crate) initial: Vec<WorldEvent>,
    pub(crate) events: Vec<WorldEvent>,
    /// The files it was read from, copied next to a failure's schedule.
    pub(crate) files: Vec<PathBuf>,
}

impl Recording {
    /// Reads a recording file (plain or zstd). The resource is derived from the objects'
    /// `apiVersion` and `kind` by the API server's plural rules; use
    /// [`open_as`](Self::open_as) for a custom resource with an irregular plural.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, HarnessError> {
        Self::read(path.as_ref(), None)
    }

    /// Reads a recording of `plural` (`deployments.apps`, `foos.samplecontroller.k8s.io`,
    /// `pods`).
    pub fn open_as(path: impl AsRef<Path>, resource: &str) -> Result<Self, HarnessError> {
        Self::read(path.as_ref(), Some(resource.to_string()))
    }

    fn read(path: &Path, resource: Option<String>) -> Result<Self, HarnessError> {
        let reader = RecordingReader::open(path).map_err(|e| HarnessError::Recording(e.to_string()))?;
        let mut resource = resource;
        let mut initial = Vec::new();
        let mut events = Vec::new();
        let mut in_initial = true;
        // The last recorded version of each object, for the changes' patches.
        let mut prev: std::collections::HashMap<(Option<String>, String), Arc<Value>> = Default::default();
        for ev in reader {
            let ev = ev.map_err(|e| HarnessError::Recording(e.to_string()))?;
            let origin = format!("{}:{}", path.display(), ev.line);
            let (change, raw) = match ev.event {
                WatchEvent::Added(o) => (Change::Added, o),
                WatchEvent::Modified(o) => (Change::Modified, o),
                WatchEvent::Deleted(o) => (Change::Deleted, o),
                WatchEvent::Bookmark { initial_events_end, .. } => {
                    if initial_events_end {
                        in_initial = false;
                    }
                    continue;
                }
                WatchEvent::Error(_) => continue,
            };
            let object: Value = serde_json::from_slice(&raw.bytes)
                .map_err(|e| HarnessError::Recording(format!("{origin}: object is not JSON: {e}")))?;
            if resource.is_none() {
                resource = Some(resource_of(&object).ok_or_else(|| {
                    HarnessError::Recording(format!(
                        "{origin}: object has no apiVersion and kind; use Recording::open_as"
                    ))
                })?);
            }
            let rv = object
                .at("/metadata/resourceVersion")
                .and_then(Value::as_str)
                .and_then(|s| s.parse().ok());
            let object = Arc::new(object);
            let id = (
                object
                    .at("/metadata/namespace")
                    .and_then(Value::as_str)
                    .map(str::to_owned),
                object
                    .at("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
            );
            let patch = match (change, prev.get(&id)) {
                (Change::Modified, Some(p)) => merge_diff(&world_body(p), &world_body(&object)).map(Arc::new),
                (Change::Modified, None) => Some(Arc::new(world_body(&object))),
                _ => None,
            };
            prev.insert(id, object.clone());
            let we = WorldEvent {
                resource: resource.clone().unwrap_or_default(),
                change,
                object,
                rv,
                origin,
                patch,
            };
            if in_initial && change == Change::Added {
                initial.push(we);
            } else {
                in_initial = false;
                events.push(we);
            }
        }
        let resource = resource
            .ok_or_else(|| HarnessError::Recording(format!("{}: the recording holds no object", path.display())))?;
        Ok(Recording {
            resource,
            initial,
            events,
            files: vec![path.to_owned()],
        })
    }

    /// The simulated server's name of the recorded resource (`plural` or `plural.group`).
    pub fn resource(&self) -> &str {
        &self.resource
    }

    /// How many objects the initial state holds.
    pub fn initial_len(&self) -> usize {
        self.initial.len()
    }

    /// How many changes follow the initial state.
    pub fn changes_len(&self) -> usize {
        self.events.len()
    }
}

/// `plural` or `plural.group` of an object, from its `apiVersion` and `kind`.
fn resource_of(object: &Value) -> Option<String> {
    let api_version = object.get("apiVersion")?.as_str()?;
    let kind = object.get("kind")?.as_str()?;
    let plural = plural_of(kind);
    Some(match api_version.split_once('/') {
        Some((group, _)) => format!("{plural}.{group}"),
        None => plural,
    })
}

/// The changes of several recordings of one cluster in one order: by recorded
/// resourceVersion where both have one (one etcd orders them), otherwise in file order.
pub(crate) fn merge(recordings: &[Recording]) -> (Vec<WorldEvent>, Vec<WorldEvent>) {
    let initial = recordings.iter().flat_map(|r| r.initial.iter().cloned()).collect();
    let mut events: Vec<(usize, usize, WorldEvent)> = recordings
        .iter()
        .enumerate()
        .flat_map(|(i, r)| r.events.iter().cloned().enumerate().map(move |(j, e)| (i, j, e)))
        .collect();
    // A stable sort by RV; events without an RV keep their place in their file.
    if events.iter().all(|(_, _, e)| e.rv.is_some()) {
        events.sort_by_key(|(i, j, e)| (e.rv, *i, *j));
    }
    (initial, events.into_iter().map(|(_, _, e)| e).collect())
}
