//! Sources of list/watch data: the small trait the reflector drives, the live implementation
//! over `kube::Client`, and the decoder of the wire format.
//!
//! A source yields *raw* objects: the JSON bytes as received plus metadata extracted from them.
//! It never decodes a whole object into typed structs, and it never touches the store.

mod decode;
mod kube_source;
mod watcher_config;

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::BoxStream;

pub(crate) use decode::decode_recorded_bytes;
pub use decode::{decode_list, decode_watch_line, DecodeError};
pub use kube_source::{ClusterIdentity, KubeSource, USER_AGENT};
pub(crate) use watcher_config::apply as apply_watcher_config;

use crate::object::{RawObject, ResourceVersion, ScopeSpec};
use crate::selector::ShardSelector;

/// A `Status` returned by the API server, as an HTTP error or an in-stream `ERROR` event.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ApiStatus {
    /// HTTP status code (`code` of the Status).
    pub code: u16,
    /// Machine-readable reason (`Expired`, `Gone`, `Timeout`, `TooManyRequests`, …).
    pub reason: String,
    /// Human-readable message.
    pub message: String,
    /// `reason`s of `details.causes` (e.g. `ResourceVersionTooLarge`).
    pub causes: Vec<String>,
    /// `Retry-After` header or `details.retryAfterSeconds`.
    pub retry_after: Option<Duration>,
}

impl ApiStatus {
    /// 410 Gone / Expired: the requested resourceVersion was compacted; relist.
    #[must_use]
    pub fn is_gone(&self) -> bool {
        self.code == 410 || self.reason == "Expired" || self.reason == "Gone"
    }

    /// 504 with cause `ResourceVersionTooLarge`: the server has not reached the RV.
    #[must_use]
    pub fn is_too_large_rv(&self) -> bool {
        self.causes.iter().any(|c| c == "ResourceVersionTooLarge")
            || self.message.contains("Too large resource version")
    }
}

impl fmt::Display for ApiStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HTTP {} {}: {}", self.code, self.reason, self.message)
    }
}

/// What went wrong talking to the server. Messages never include credentials.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum SourceError {
    /// The server answered with an error status.
    #[error("{resource}: {status}")]
    Api {
        /// The resource (`pods`, `deployments.apps`, …).
        resource: String,
        /// What the server said.
        status: ApiStatus,
    },
    /// The connection failed or broke.
    #[error("{resource}: connection error: {detail}")]
    Transport {
        /// The resource.
        resource: String,
        /// What failed.
        detail: String,
    },
    /// A response or watch line does not decode.
    #[error("{resource}: malformed response{}: {source}", line.map(|l| format!(" at line {l}")).unwrap_or_default())]
    Decode {
        /// The resource.
        resource: String,
        /// Line number within the watch stream, when known.
        line: Option<u64>,
        /// What is wrong (shared: source errors are cloned into statuses and reports).
        #[source]
        source: Arc<DecodeError>,
    },
    /// A request could not be built (a parameter the client library refuses).
    #[error("{resource}: cannot build request: {source}")]
    Request {
        /// The resource.
        resource: String,
        /// The client library's error.
        #[source]
        source: Arc<dyn std::error::Error + Send + Sync>,
    },
}

impl SourceError {
    /// A [`SourceError::Decode`] of `resource` (at watch `line`, when known).
    #[must_use]
    pub fn decode(resource: impl Into<String>, line: Option<u64>, source: DecodeError) -> Self {
        SourceError::Decode {
            resource: resource.into(),
            line,
            source: Arc::new(source),
        }
    }

    /// The API status, when the server sent one.
    #[must_use]
    pub fn status(&self) -> Option<&ApiStatus> {
        match self {
            SourceError::Api { status, .. } => Some(status),
            _ => None,
        }
    }
}

/// One LIST request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListRequest {
    /// `resourceVersion` (`None` = unset: a consistent read).
    pub resource_version: Option<ResourceVersion>,
    /// `resourceVersionMatch=NotOlderThan` when true and an RV is set.
    pub not_older_than: bool,
    /// `resourceVersionMatch=Exact` when true and an RV is set: the state at exactly that RV
    /// (410 once it is compacted). Takes precedence over `not_older_than`.
    pub exact: bool,
    /// KEP-5866 `shardSelector`: only objects of these hash ranges. A server before v1.36
    /// ignores it (its page then has no [`ListPage::shard_info`]); the reflector filters
    /// every page itself either way.
    pub shard: Option<ShardSelector>,
    /// `limit`.
    pub limit: Option<u32>,
    /// `continue` token.
    pub continue_token: Option<String>,
    /// Only the list's resourceVersion is wanted, no object: with `resource_version` `"0"` the
    /// server answers from its watch cache, so the RV is the cache's revision of this resource
    /// (what a watch has to deliver), not the cluster-wide one. A source sends a field
    /// selector no object can match ([`REVISION_PROBE_SELECTOR`]) and ignores the scope's
    /// selectors; a source that has no cache answers its current revision.
    pub revision_only: bool,
}

/// The field selector of a [`ListRequest::revision_only`] request: `_` is not allowed in an
/// object name, so nothing matches and the response carries only the resourceVersion.
pub const REVISION_PROBE_SELECTOR: &str = "metadata.name=_revision_probe_";

/// One page of a LIST.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListPage {
    /// The objects.
    pub items: Vec<RawObject>,
    /// The list's resourceVersion.
    pub resource_version: ResourceVersion,
    /// Token for the next page.
    pub continue_token: Option<String>,
    /// `remainingItemCount`, when the server sent it.
    pub remaining: Option<i64>,
    /// `metadata.shardInfo.selector` (KEP-5866): the shard selector the server applied, when
    /// it filtered the list by one.
    pub shard_info: Option<String>,
}

/// One WATCH request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchRequest {
    /// Watch events after this RV (`""` = synthetic adds of the current state first).
    pub resource_version: ResourceVersion,
    /// `timeoutSeconds`.
    pub timeout_secs: u32,
    /// `allowWatchBookmarks`.
    pub bookmarks: bool,
    /// Streaming list: `sendInitialEvents=true&resourceVersionMatch=NotOlderThan`.
    pub send_initial_events: bool,
    /// KEP-5866 `shardSelector` (see [`ListRequest::shard`]).
    pub shard: Option<ShardSelector>,
}

/// One watch event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEvent {
    /// `ADDED`.
    Added(RawObject),
    /// `MODIFIED`.
    Modified(RawObject),
    /// `DELETED` (the object's final state).
    Deleted(RawObject),
    /// `BOOKMARK`: progress without an object change.
    Bookmark {
        /// The RV reached.
        resource_version: ResourceVersion,
        /// The `k8s.io/initial-events-end` annotation of a streaming list.
        initial_events_end: bool,
    },
    /// `ERROR` with a `Status`.
    Error(ApiStatus),
}

/// A stream of watch events.
pub type WatchStream = BoxStream<'static, Result<WatchEvent, SourceError>>;

/// A watch event with the line it was decoded from, for the recorder (a decoded `BOOKMARK` or
/// `ERROR` drops fields a recording should keep).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawWatchEvent {
    /// The decoded event.
    pub event: WatchEvent,
    /// The line as received, without its newline; `None` when the source has no wire form.
    pub line: Option<bytes::Bytes>,
}

/// A stream of watch events with their lines.
pub type RawWatchStream = BoxStream<'static, Result<RawWatchEvent, SourceError>>;

/// The list/watch operations the reflector needs (client-go's `ListerWatcher`).
pub trait Source: Send + Sync + 'static {
    /// Lists one page.
    fn list(&self, req: ListRequest) -> impl Future<Output = Result<ListPage, SourceError>> + Send;
    /// Opens a watch.
    fn watch(&self, req: WatchRequest) -> impl Future<Output = Result<WatchStream, SourceError>> + Send;
    /// Opens a watch whose events carry the lines they came from. The default has no lines
    /// ([`RawWatchEvent::line`] is `None`); [`KubeSource`] gives the server's bytes.
    fn watch_raw(&self, req: WatchRequest) -> impl Future<Output = Result<RawWatchStream, SourceError>> + Send {
        async move {
            let stream = self.watch(req).await?;
            Ok(futures::StreamExt::boxed(futures::StreamExt::map(stream, |r| {
                r.map(|event| RawWatchEvent { event, line: None })
            })))
        }
    }
    /// The cluster's identity (for example the `kube-system` namespace UID plus the server URL),
    /// so a database is never mixed across clusters. `None` when the source cannot tell (a
    /// recording).
    fn cluster_identity(&self) -> impl Future<Output = Result<Option<String>, SourceError>> + Send;
    /// The resource, for messages (`pods`, `deployments.apps`).
    fn resource(&self) -> String;
    /// What this source watches, as a store scope.
    fn scope(&self) -> ScopeSpec;
}
