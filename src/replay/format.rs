//! The recording format: reading and writing JSON Lines watch events.
//!
//! One watch event per line, exactly as the API server sends it
//! (`{"type":"ADDED","object":{…}}`), optionally followed by one extra top-level field,
//! [`RECEIVED_AT`] (`"receivedAt"`): the unix time in **milliseconds** at which the recorder
//! received the event. The API server never sends that field, so `kubectl get --raw
//! '/api/v1/pods?watch=1'` output is a recording as it is. Files starting with the zstd magic
//! bytes are decompressed transparently, whatever their name.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use bytes::Bytes;

use super::{MalformedPolicy, ReplayError};
use crate::object::ResourceVersion;
use crate::source::{decode_recorded_bytes, ApiStatus, DecodeError, ListPage, WatchEvent};

/// The name of the optional top-level field carrying the receive time (unix milliseconds).
pub const RECEIVED_AT: &str = "receivedAt";

const ZSTD_MAGIC: [u8; 4] = [0x28, 0xB5, 0x2F, 0xFD];

/// One event read from a recording.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedEvent {
    /// The file it came from.
    pub path: PathBuf,
    /// Its 1-based line number in that file.
    pub line: u64,
    /// The event; object bytes are the bytes of the line, unchanged.
    pub event: WatchEvent,
    /// The receive time (unix milliseconds), when the line carries one.
    pub received_at_ms: Option<u64>,
}

/// Decodes one recording line with the live source's decoder ([`decode_watch_line`]'s), so a
/// recording decodes exactly as the watch it came from; only `receivedAt` is extra.
fn decode_line(line: &[u8]) -> Result<(WatchEvent, Option<u64>), LineError> {
    decode_recorded_bytes(&Bytes::copy_from_slice(line)).map_err(|e| match e {
        DecodeError::UnknownType(kind) => LineError::UnknownType(kind),
        other => LineError::Malformed(other.to_string()),
    })
}

enum LineError {
    Malformed(String),
    UnknownType(String),
}

/// Reads a recording line by line (streaming: it holds one line at a time), from one file or
/// several rotated files in order.
///
/// * A line that does not decode is an error naming its file and line
///   ([`ReplayError::Malformed`]), or is skipped and counted under [`MalformedPolicy::Skip`].
/// * An unknown event type is always an error ([`ReplayError::UnknownEventType`]).
/// * A last line without a newline that does not decode (a crash while recording) is dropped
///   with a warning and reported by [`truncated_tail`](Self::truncated_tail).
/// * Corrupt zstd data (a bad checksum, an invalid block) is an [`ReplayError::Io`] naming the
///   file, the line and the decompressed byte offset. The recorder and export write a checksum,
///   checked at the frame's end: lines before it may already have been read.
/// * Empty lines are ignored.
///
/// ```no_run
/// use durable_informer::replay::RecordingReader;
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// for ev in RecordingReader::open("pods.jsonl.zst")? {
///     let ev = ev?;
///     println!("{}: {:?}", ev.line, ev.event);
/// }
/// # Ok(()) }
/// ```
pub struct RecordingReader {
    input: Option<(PathBuf, Box<dyn BufRead + Send>)>,
    pending: VecDeque<PathBuf>,
    line: u64,
    buf: Vec<u8>,
    on_malformed: MalformedPolicy,
    skipped: u64,
    truncated: bool,
    /// The current file is zstd.
    compressed: bool,
    /// Decompressed bytes read from the current file before the current line.
    offset: u64,
}

impl std::fmt::Debug for RecordingReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordingReader")
            .field("path", &self.input.as_ref().map(|(p, _)| p))
            .field("line", &self.line)
            .field("skipped", &self.skipped)
            .finish_non_exhaustive()
    }
}

/// A recording's lines, and whether they come from a zstd decoder.
type Input = (Box<dyn BufRead + Send>, bool);

fn open_input(path: &Path) -> Result<Input, ReplayError> {
    let file = File::open(path).map_err(|source| ReplayError::Io {
        path: path.to_owned(),
        line: None,
        source,
    })?;
    wrap_input(path, Box::new(file))
}

fn wrap_input(path: &Path, input: Box<dyn Read + Send>) -> Result<Input, ReplayError> {
    let mut buffered = BufReader::with_capacity(256 << 10, input);
    let head = buffered.fill_buf().map_err(|source| ReplayError::Io {
        path: path.to_owned(),
        line: None,
        source,
    })?;
    if head.starts_with(&ZSTD_MAGIC) {
        let decoder = zstd::stream::read::Decoder::with_buffer(buffered).map_err(|source| ReplayError::Io {
            path: path.to_owned(),
            line: None,
            source,
        })?;
        Ok((Box::new(BufReader::with_capacity(256 << 10, decoder)), true))
    } else {
        Ok((Box::new(buffered), false))
    }
}

impl RecordingReader {
    /// Opens one recording file (plain or zstd, detected by its first bytes).
    pub fn open(path: impl AsRef<Path>) -> Result<Self, ReplayError> {
        Self::open_all([path.as_ref().to_owned()])
    }

    /// Opens several files read one after the other, such as the rotated files of a
    /// [`Recorder`](super::Recorder) (listed in [`RecorderReport::files`](super::RecorderReport::files)).
    pub fn open_all(paths: impl IntoIterator<Item = PathBuf>) -> Result<Self, ReplayError> {
        let mut pending: VecDeque<PathBuf> = paths.into_iter().collect();
        let first = pending.pop_front().ok_or(ReplayError::NoInput)?;
        let (input, compressed) = open_input(&first)?;
        Ok(Self::reading(first, input, compressed, pending))
    }

    fn reading(name: PathBuf, input: Box<dyn BufRead + Send>, compressed: bool, pending: VecDeque<PathBuf>) -> Self {
        Self {
            input: Some((name, input)),
            pending,
            line: 0,
            buf: Vec::with_capacity(4096),
            on_malformed: MalformedPolicy::Fail,
            skipped: 0,
            truncated: false,
            compressed,
            offset: 0,
        }
    }

    /// Reads from any reader (plain or zstd); `name` is used in messages.
    pub fn from_reader(name: impl Into<PathBuf>, reader: impl Read + Send + 'static) -> Result<Self, ReplayError> {
        let name = name.into();
        let (input, compressed) = wrap_input(&name, Box::new(reader))?;
        Ok(Self::reading(name, input, compressed, VecDeque::new()))
    }

    /// What to do with a line that does not decode (default [`MalformedPolicy::Fail`]).
    #[must_use]
    pub fn on_malformed(mut self, policy: MalformedPolicy) -> Self {
        self.on_malformed = policy;
        self
    }

    /// Lines skipped as malformed so far.
    #[must_use]
    pub fn skipped(&self) -> u64 {
        self.skipped
    }

    /// True when the input ended cut off: a truncated last line was dropped, or a zstd frame
    /// never ended.
    #[must_use]
    pub fn truncated_tail(&self) -> bool {
        self.truncated
    }

    /// The current file and line number (of the last line read).
    #[must_use]
    pub fn position(&self) -> (Option<&Path>, u64) {
        (self.input.as_ref().map(|(p, _)| p.as_path()), self.line)
    }

    /// The next event, `None` at the end of the last file.
    pub fn next_event(&mut self) -> Result<Option<RecordedEvent>, ReplayError> {
        loop {
            let Some((path, input)) = self.input.as_mut() else {
                return Ok(None);
            };
            self.buf.clear();
            let mut cut = false;
            let n = match input.read_until(b'\n', &mut self.buf) {
                Ok(n) => n,
                // Only the zstd decoder reports an early end: a frame that was never finished,
                // what a crash while recording leaves. Like a truncated plain file: keep what
                // decoded, warn, and stop reading this file.
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                    tracing::warn!(path = %path.display(), line = self.line + 1,
                        "compressed recording ends mid-frame (a crash while recording?); replaying what precedes the cut");
                    self.truncated = true;
                    cut = true;
                    *input = Box::new(std::io::empty());
                    self.buf.len()
                }
                Err(source) => {
                    // From a zstd decoder this is corrupt data (a flipped bit, a bad checksum):
                    // say so, and where, rather than a bare decoder message.
                    let source = if self.compressed {
                        std::io::Error::new(
                            source.kind(),
                            format!(
                                "corrupt compressed recording (after {} decompressed bytes): {source}",
                                self.offset + self.buf.len() as u64
                            ),
                        )
                    } else {
                        source
                    };
                    return Err(ReplayError::Io {
                        path: path.clone(),
                        line: Some(self.line + 1),
                        source,
                    });
                }
            };
            if n == 0 {
                // End of this file: on to the next one.
                self.input = None;
                if let Some(next) = self.pending.pop_front() {
                    let (input, compressed) = open_input(&next)?;
                    self.input = Some((next, input));
                    self.compressed = compressed;
                    self.offset = 0;
                    self.line = 0;
                }
                continue;
            }
            self.line += 1;
            self.offset += n as u64;
            let complete = !cut && self.buf.last() == Some(&b'\n');
            let mut line = self.buf.as_slice();
            while let Some((last, rest)) = line.split_last() {
                if last.is_ascii_whitespace() {
                    line = rest;
                } else {
                    break;
                }
            }
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            match decode_line(line) {
                Ok((event, received_at_ms)) => {
                    return Ok(Some(RecordedEvent {
                        path: path.clone(),
                        line: self.line,
                        event,
                        received_at_ms,
                    }))
                }
                Err(LineError::Malformed(_)) if !complete => {
                    tracing::warn!(path = %path.display(), line = self.line,
                        "recording ends with a truncated line (a crash while recording?); it was dropped");
                    self.truncated = true;
                }
                Err(LineError::UnknownType(kind)) => {
                    return Err(ReplayError::UnknownEventType {
                        path: path.clone(),
                        line: self.line,
                        kind,
                    })
                }
                Err(LineError::Malformed(detail)) => match self.on_malformed {
                    MalformedPolicy::Fail => {
                        return Err(ReplayError::Malformed {
                            path: path.clone(),
                            line: self.line,
                            detail,
                        })
                    }
                    MalformedPolicy::Skip => {
                        tracing::warn!(path = %path.display(), line = self.line, %detail, "malformed line skipped");
                        self.skipped += 1;
                    }
                },
            }
        }
    }
}

impl Iterator for RecordingReader {
    type Item = Result<RecordedEvent, ReplayError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_event().transpose()
    }
}

/// The `type` of a watch line for an event.
#[must_use]
pub fn event_type(event: &WatchEvent) -> &'static str {
    match event {
        WatchEvent::Added(_) => "ADDED",
        WatchEvent::Modified(_) => "MODIFIED",
        WatchEvent::Deleted(_) => "DELETED",
        WatchEvent::Bookmark { .. } => "BOOKMARK",
        WatchEvent::Error(_) => "ERROR",
    }
}

/// Appends one recording line (with its `\n`) for `event` to `out`. Object bytes are written
/// unchanged; a bookmark is written as the API server writes it (an object carrying only
/// `apiVersion`, `kind` and `metadata.resourceVersion`, plus the initial-events-end annotation
/// when set); `type_meta` is `(apiVersion, kind)` for those, when known.
pub fn encode_line(
    out: &mut Vec<u8>,
    event: &WatchEvent,
    received_at_ms: Option<u64>,
    type_meta: Option<(&str, &str)>,
) {
    out.extend_from_slice(br#"{"type":""#);
    out.extend_from_slice(event_type(event).as_bytes());
    out.extend_from_slice(br#"","object":"#);
    match event {
        WatchEvent::Added(o) | WatchEvent::Modified(o) | WatchEvent::Deleted(o) => out.extend_from_slice(&o.bytes),
        WatchEvent::Bookmark {
            resource_version,
            initial_events_end,
        } => {
            let mut meta = serde_json::json!({ "resourceVersion": resource_version.as_str() });
            if *initial_events_end {
                meta["annotations"] = serde_json::json!({ "k8s.io/initial-events-end": "true" });
            }
            let obj = match type_meta {
                Some((api_version, kind)) => {
                    serde_json::json!({ "kind": kind, "apiVersion": api_version, "metadata": meta })
                }
                None => serde_json::json!({ "metadata": meta }),
            };
            out.extend_from_slice(obj.to_string().as_bytes());
        }
        WatchEvent::Error(status) => out.extend_from_slice(status_json(status).as_bytes()),
    }
    if let Some(ms) = received_at_ms {
        out.extend_from_slice(format!(r#","{RECEIVED_AT}":{ms}"#).as_bytes());
    }
    out.extend_from_slice(b"}\n");
}

/// Appends a LIST page (the last, or only, one) as a recording's initial state: one ADDED line
/// per item, then a BOOKMARK annotated `k8s.io/initial-events-end` at the list's
/// resourceVersion, as a streaming list would send them.
///
/// ```
/// use durable_informer::replay::encode_list;
/// use durable_informer::source::decode_list;
/// let page = decode_list(br#"{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"7"},"items":[{"metadata":{"name":"a","namespace":"n","resourceVersion":"5"}}]}"#).unwrap();
/// let mut out = Vec::new();
/// encode_list(&mut out, &page, None);
/// assert_eq!(out.split(|b| *b == b'\n').filter(|l| !l.is_empty()).count(), 2);
/// ```
pub fn encode_list(out: &mut Vec<u8>, page: &ListPage, received_at_ms: Option<u64>) {
    let mut type_meta = None;
    for item in &page.items {
        if type_meta.is_none() {
            type_meta = type_meta_of(&item.bytes);
        }
        encode_line(out, &WatchEvent::Added(item.clone()), received_at_ms, None);
    }
    let end = WatchEvent::Bookmark {
        resource_version: page.resource_version.clone(),
        initial_events_end: true,
    };
    encode_line(
        out,
        &end,
        received_at_ms,
        type_meta.as_ref().map(|(a, k)| (a.as_str(), k.as_str())),
    );
}

fn status_json(status: &ApiStatus) -> String {
    serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": status.message,
        "reason": status.reason,
        "code": status.code,
    })
    .to_string()
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct TypeMeta {
    api_version: Option<String>,
    kind: Option<String>,
}

/// `(apiVersion, kind)` of an object, when it carries both.
pub(crate) fn type_meta_of(bytes: &[u8]) -> Option<(String, String)> {
    let t: TypeMeta = serde_json::from_slice(bytes).ok()?;
    Some((t.api_version?, t.kind?))
}

/// The resourceVersion an event moves a watcher to (`None` for errors and empty bookmarks).
#[must_use]
pub fn event_rv(event: &WatchEvent) -> Option<&ResourceVersion> {
    match event {
        WatchEvent::Added(o) | WatchEvent::Modified(o) | WatchEvent::Deleted(o) => Some(&o.meta.resource_version),
        WatchEvent::Bookmark { resource_version, .. } if !resource_version.is_empty() => Some(resource_version),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::object::RawObject;

    #[test]
    fn encode_then_decode_keeps_the_object_bytes() {
        let obj = RawObject::from_json(&br#"{"metadata":{"name":"a","resourceVersion":"3"},"x":[1, 2]}"#[..]).unwrap();
        let mut out = Vec::new();
        encode_line(
            &mut out,
            &WatchEvent::Modified(obj.clone()),
            Some(42),
            Some(("v1", "ConfigMap")),
        );
        let (ev, at) = decode_line(out.trim_ascii_end()).ok().unwrap();
        assert_eq!(ev, WatchEvent::Modified(obj));
        assert_eq!(at, Some(42));
        out.clear();
        let bm = WatchEvent::Bookmark {
            resource_version: "9".into(),
            initial_events_end: true,
        };
        encode_line(&mut out, &bm, None, None);
        assert_eq!(decode_line(out.trim_ascii_end()).ok().unwrap().0, bm);
    }
}
