//! The recorder: live watch traffic from any [`Source`] written to a recording, with receive
//! times, rotated by size.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
#[cfg(unix)]
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::{FutureExt, StreamExt};
use tokio::sync::watch;

use super::format::{encode_line, event_rv, type_meta_of, RECEIVED_AT};
use super::ReplayError;
use crate::object::ResourceVersion;
use crate::source::{ListRequest, RawWatchEvent, Source, WatchEvent, WatchRequest};

/// How a recording starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum InitialState {
    /// A paginated LIST turned into ADDED lines, then a BOOKMARK annotated
    /// `k8s.io/initial-events-end` at the list's resourceVersion, then a watch from there
    /// (default).
    #[default]
    List,
    /// A watch without a resourceVersion: the server's synthetic ADDED events come first.
    Watch,
}

/// Recorder settings.
#[derive(Debug, Clone)]
pub struct RecorderConfig {
    /// The first file. Compressed with zstd when it ends in `.zst`.
    pub path: PathBuf,
    /// Start a new file once the current one holds this many (uncompressed) bytes. Files are
    /// named after the first: `pods.jsonl`, `pods.1.jsonl`, `pods.2.jsonl`, … (the part before
    /// the first dot, the number, the rest). `None` (default) never rotates.
    pub rotate_bytes: Option<u64>,
    /// How the recording starts.
    pub initial: InitialState,
    /// LIST page size (default 500).
    pub page_size: u32,
    /// `timeoutSeconds` of each watch (default 300); a watch that ends is re-opened from the
    /// last resourceVersion recorded.
    pub watch_timeout_secs: u32,
}

impl RecorderConfig {
    /// Defaults for a recording at `path`.
    #[must_use]
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            rotate_bytes: None,
            initial: InitialState::List,
            page_size: 500,
            watch_timeout_secs: 300,
        }
    }

    /// Rotates files at this size.
    #[must_use]
    pub fn rotate_bytes(mut self, bytes: u64) -> Self {
        self.rotate_bytes = Some(bytes.max(1));
        self
    }

    /// Sets how the recording starts.
    #[must_use]
    pub fn initial(mut self, initial: InitialState) -> Self {
        self.initial = initial;
        self
    }
}

/// What a recorder wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecorderReport {
    /// Every file written, in order (replay them with
    /// [`ReplaySource::open_all`](super::ReplaySource::open_all)).
    pub files: Vec<PathBuf>,
    /// Lines written.
    pub lines: u64,
    /// Uncompressed bytes written.
    pub bytes: u64,
    /// The last resourceVersion recorded.
    pub last_rv: ResourceVersion,
    /// Watches opened.
    pub watches: u64,
}

/// Records a [`Source`] into a recording file.
///
/// It writes every line as received (the server's bytes, when the source has them: see
/// [`Source::watch_raw`](crate::source::Source::watch_raw)) with its receive time added,
/// `BOOKMARK` and `ERROR` lines included. After a 410 (the watch expired) it relists and
/// writes the new state as ADDED lines plus an initial-events-end BOOKMARK, which replay turns
/// back into a relist. A watch that ends is re-opened from the last RV; other errors are
/// retried after a backoff (1 s doubling to 30 s). The file is flushed whenever the stream has
/// nothing ready, so a crash loses at most the events in flight and leaves at worst a truncated
/// last line, which replay tolerates. Files are created with mode 0600.
///
/// File writes are synchronous and small (buffered); run it on a multi-threaded runtime.
///
/// ```no_run
/// use durable_informer::replay::{Recorder, RecorderConfig};
/// use durable_informer::source::KubeSource;
/// use k8s_openapi::api::core::v1::Pod;
/// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
/// let config = kube::Config::infer().await?;
/// let server = config.cluster_url.to_string();
/// let client = kube::Client::try_from(config)?;
/// let recorder = Recorder::new(
///     KubeSource::typed::<Pod>(client, &server),
///     RecorderConfig::new("pods.jsonl.zst").rotate_bytes(256 << 20),
/// );
/// let (stop, stop_rx) = tokio::sync::watch::channel(false);
/// tokio::spawn(async move { tokio::signal::ctrl_c().await.ok(); stop.send(true).ok(); });
/// let report = recorder.run(stop_rx).await?;
/// println!("{} lines in {:?}", report.lines, report.files);
/// # Ok(()) }
/// ```
pub struct Recorder<S: Source> {
    source: S,
    config: RecorderConfig,
    progress: watch::Sender<RecorderReport>,
}

impl<S: Source> std::fmt::Debug for Recorder<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// Creates a file readable by its owner only (a recording may hold Secrets; a Unix mode,
/// elsewhere the directory's access rules decide).
pub(crate) fn create_private(path: &Path) -> std::io::Result<File> {
    let mut options = OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    options.mode(0o600);
    options.open(path)
}

enum Sink {
    Plain(BufWriter<File>),
    Zstd(zstd::stream::write::Encoder<'static, BufWriter<File>>),
}

impl Sink {
    fn writer(&mut self) -> &mut dyn Write {
        match self {
            Sink::Plain(w) => w,
            Sink::Zstd(w) => w,
        }
    }

    fn finish(self) -> std::io::Result<()> {
        match self {
            Sink::Plain(mut w) => w.flush(),
            Sink::Zstd(w) => w.finish()?.flush(),
        }
    }
}

/// The rotating file writer.
struct Files {
    config: RecorderConfig,
    sink: Option<Sink>,
    in_file: u64,
    report: RecorderReport,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// `dir/pods.jsonl.zst` → `dir/pods.{n}.jsonl.zst`.
fn rotated_name(path: &Path, n: usize) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let rotated = match name.split_once('.') {
        Some((stem, rest)) => format!("{stem}.{n}.{rest}"),
        None => format!("{name}.{n}"),
    };
    path.with_file_name(rotated)
}

impl Files {
    fn io(&self, source: std::io::Error) -> ReplayError {
        ReplayError::Io {
            path: self
                .report
                .files
                .last()
                .cloned()
                .unwrap_or_else(|| self.config.path.clone()),
            line: None,
            source,
        }
    }

    fn open_next(&mut self) -> Result<(), ReplayError> {
        let n = self.report.files.len();
        let path = if n == 0 {
            self.config.path.clone()
        } else {
            rotated_name(&self.config.path, n)
        };
        let io = |source| ReplayError::Io {
            path: path.clone(),
            line: None,
            source,
        };
        let file = BufWriter::with_capacity(256 << 10, create_private(&path).map_err(io)?);
        let sink = if path.extension().is_some_and(|e| e == "zst") {
            let mut enc = zstd::stream::write::Encoder::new(file, 3).map_err(io)?;
            // A checksum, so a corrupted file fails at its frame's end instead of replaying
            // altered objects.
            enc.include_checksum(true).map_err(io)?;
            Sink::Zstd(enc)
        } else {
            Sink::Plain(file)
        };
        self.sink = Some(sink);
        self.in_file = 0;
        self.report.files.push(path);
        Ok(())
    }

    fn write(&mut self, line: &[u8]) -> Result<(), ReplayError> {
        if let (Some(limit), true) = (self.config.rotate_bytes, self.sink.is_some()) {
            if self.in_file > 0 && self.in_file + line.len() as u64 > limit {
                if let Some(sink) = self.sink.take() {
                    sink.finish().map_err(|e| self.io(e))?;
                }
            }
        }
        if self.sink.is_none() {
            self.open_next()?;
        }
        if let Some(sink) = self.sink.as_mut() {
            if let Err(e) = sink.writer().write_all(line) {
                return Err(self.io(e));
            }
        }
        self.in_file += line.len() as u64;
        self.report.bytes += line.len() as u64;
        self.report.lines += 1;
        Ok(())
    }

    fn flush(&mut self) -> Result<(), ReplayError> {
        if let Some(sink) = self.sink.as_mut() {
            if let Err(e) = sink.writer().flush() {
                return Err(self.io(e));
            }
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<(), ReplayError> {
        if self.sink.is_none() && self.report.files.is_empty() {
            // An empty recording is still a file.
            self.open_next()?;
        }
        if let Some(sink) = self.sink.take() {
            sink.finish().map_err(|e| self.io(e))?;
        }
        Ok(())
    }
}

enum Stopped {
    Yes,
    No,
}

impl<S: Source> Recorder<S> {
    /// A recorder of `source`.
    #[must_use]
    pub fn new(source: S, config: RecorderConfig) -> Self {
        let (progress, _) = watch::channel(RecorderReport::default());
        Self {
            source,
            config,
            progress,
        }
    }

    /// What was written so far, updated at every flush.
    #[must_use]
    pub fn progress(&self) -> watch::Receiver<RecorderReport> {
        self.progress.subscribe()
    }

    /// Records until `stop` turns true (or is dropped), then closes the files. Fails on I/O
    /// errors and when a LIST's continue token expires (410) midway.
    pub async fn run(self, mut stop: watch::Receiver<bool>) -> Result<RecorderReport, ReplayError> {
        let mut files = Files {
            config: self.config.clone(),
            sink: None,
            in_file: 0,
            report: RecorderReport::default(),
        };
        let result = self.run_inner(&mut files, &mut stop).await;
        let finished = files.finish();
        self.progress.send_replace(files.report.clone());
        result?;
        finished?;
        Ok(files.report)
    }

    fn publish(&self, files: &mut Files) -> Result<(), ReplayError> {
        files.flush()?;
        self.progress.send_replace(files.report.clone());
        Ok(())
    }

    async fn run_inner(&self, files: &mut Files, stop: &mut watch::Receiver<bool>) -> Result<(), ReplayError> {
        let mut w = LineWriter::default();
        let mut rv = ResourceVersion::default();
        let mut backoff = Duration::from_secs(1);
        let mut need_list = self.config.initial == InitialState::List;
        loop {
            if *stop.borrow() {
                return Ok(());
            }
            if need_list {
                match self.list(files, &mut w, stop, &mut backoff).await? {
                    Some(at) => rv = at,
                    None => return Ok(()),
                }
                need_list = false;
            }
            files.report.watches += 1;
            let opened = tokio::select! {
                s = self.source.watch_raw(WatchRequest {
                    resource_version: rv.clone(),
                    timeout_secs: self.config.watch_timeout_secs.max(1),
                    bookmarks: true,
                    send_initial_events: false,
                    shard: None,
                }) => s,
                _ = stop.wait_for(|s| *s) => return Ok(()),
            };
            let mut stream = match opened {
                Ok(s) => s,
                Err(e) => {
                    if let Some(status) = e.status().filter(|s| s.is_gone()) {
                        // Written as the ERROR event a watch would have sent, so replay
                        // relists from the state that follows.
                        w.event(files, &WatchEvent::Error(status.clone()))?;
                        need_list = true;
                        continue;
                    }
                    tracing::warn!(error = %e, "recorder: watch failed; re-watching after a backoff");
                    if let Stopped::Yes = self.pause(files, &mut backoff, stop).await? {
                        return Ok(());
                    }
                    continue;
                }
            };
            loop {
                let next = match stream.next().now_or_never() {
                    Some(n) => n,
                    None => {
                        self.publish(files)?;
                        tokio::select! {
                            n = stream.next() => n,
                            _ = stop.wait_for(|s| *s) => return Ok(()),
                        }
                    }
                };
                match next {
                    None => break,
                    Some(Ok(RawWatchEvent { event, line })) => {
                        match line {
                            Some(line) => w.raw(files, &line, &event)?,
                            None => w.event(files, &event)?,
                        }
                        if let WatchEvent::Error(status) = &event {
                            if status.is_gone() {
                                // The recording goes on with what the relist finds, as an
                                // informer would.
                                need_list = true;
                            } else {
                                tracing::warn!(%status, "recorder: ERROR event; re-watching after a backoff");
                                if let Stopped::Yes = self.pause(files, &mut backoff, stop).await? {
                                    return Ok(());
                                }
                            }
                            break;
                        }
                        backoff = Duration::from_secs(1);
                        if let Some(r) = event_rv(&event) {
                            rv.clone_from(r);
                            files.report.last_rv.clone_from(r);
                        }
                    }
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "recorder: watch failed; re-watching after a backoff");
                        if let Stopped::Yes = self.pause(files, &mut backoff, stop).await? {
                            return Ok(());
                        }
                        break;
                    }
                }
            }
        }
    }

    /// Writes a paginated LIST as ADDED lines plus an initial-events-end BOOKMARK; returns the
    /// list's RV, or `None` when stopped. A continue token that expires midway fails the
    /// recording: the pages already written cannot be taken back.
    async fn list(
        &self,
        files: &mut Files,
        w: &mut LineWriter,
        stop: &mut watch::Receiver<bool>,
        backoff: &mut Duration,
    ) -> Result<Option<ResourceVersion>, ReplayError> {
        let mut token = None;
        let rv = loop {
            let page = tokio::select! {
                p = self.source.list(ListRequest {
                    limit: Some(self.config.page_size.max(1)),
                    continue_token: token.clone(),
                    ..ListRequest::default()
                }) => p,
                _ = stop.wait_for(|s| *s) => return Ok(None),
            };
            let page = match page {
                Ok(p) => p,
                Err(e) if e.status().is_some_and(|s| s.is_gone()) && token.is_some() => {
                    return Err(ReplayError::from(e));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "recorder: LIST failed; retrying");
                    if let Stopped::Yes = self.sleep(backoff, stop).await {
                        return Ok(None);
                    }
                    continue;
                }
            };
            let at = now_ms();
            for o in page.items {
                w.at(files, &WatchEvent::Added(o), at)?;
            }
            token = page.continue_token;
            if token.is_none() {
                break page.resource_version;
            }
        };
        let end = WatchEvent::Bookmark {
            resource_version: rv.clone(),
            initial_events_end: true,
        };
        w.event(files, &end)?;
        files.report.last_rv = rv.clone();
        self.publish(files)?;
        Ok(Some(rv))
    }

    /// Flushes (a backoff can last 30 s), then sleeps.
    async fn pause(
        &self,
        files: &mut Files,
        backoff: &mut Duration,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<Stopped, ReplayError> {
        self.publish(files)?;
        Ok(self.sleep(backoff, stop).await)
    }

    async fn sleep(&self, backoff: &mut Duration, stop: &mut watch::Receiver<bool>) -> Stopped {
        let delay = *backoff;
        *backoff = (*backoff * 2).min(Duration::from_secs(30));
        tokio::select! {
            () = tokio::time::sleep(delay) => Stopped::No,
            _ = stop.wait_for(|s| *s) => Stopped::Yes,
        }
    }
}

/// Turns events into recording lines with their receive times.
#[derive(Default)]
struct LineWriter {
    buf: Vec<u8>,
    /// `apiVersion`/`kind` of the objects seen, for BOOKMARK lines the recorder writes itself.
    type_meta: Option<(String, String)>,
}

impl LineWriter {
    fn learn(&mut self, event: &WatchEvent) {
        if self.type_meta.is_none() {
            if let WatchEvent::Added(o) | WatchEvent::Modified(o) | WatchEvent::Deleted(o) = event {
                self.type_meta = type_meta_of(&o.bytes);
            }
        }
    }

    /// An event the source gave without its line (re-encoded; object bytes are unchanged).
    fn event(&mut self, files: &mut Files, event: &WatchEvent) -> Result<(), ReplayError> {
        self.at(files, event, now_ms())
    }

    fn at(&mut self, files: &mut Files, event: &WatchEvent, at: u64) -> Result<(), ReplayError> {
        self.learn(event);
        self.buf.clear();
        let tm = self.type_meta.as_ref().map(|(a, k)| (a.as_str(), k.as_str()));
        encode_line(&mut self.buf, event, Some(at), tm);
        files.write(&self.buf)
    }

    /// A line as received, with the receive time added as its last field.
    fn raw(&mut self, files: &mut Files, line: &[u8], event: &WatchEvent) -> Result<(), ReplayError> {
        self.learn(event);
        let trimmed = line.trim_ascii_end();
        let Some(body) = trimmed.strip_suffix(b"}") else {
            // It decoded, so it is a JSON object; this cannot happen, but never write a
            // line replay cannot read.
            return self.event(files, event);
        };
        self.buf.clear();
        self.buf.extend_from_slice(body);
        self.buf
            .extend_from_slice(format!(r#","{RECEIVED_AT}":{}}}"#, now_ms()).as_bytes());
        self.buf.push(b'\n');
        files.write(&self.buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotated_files_are_numbered_before_the_extension() {
        assert_eq!(
            rotated_name(Path::new("/r/pods.jsonl.zst"), 2),
            PathBuf::from("/r/pods.2.jsonl.zst")
        );
        assert_eq!(rotated_name(Path::new("rec"), 1), PathBuf::from("rec.1"));
    }
}
