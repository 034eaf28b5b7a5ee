//! The simulated server's configuration.

use std::time::Duration;

use super::ResourceDef;

/// Configuration of the simulated server. `Default` gives API-server-like timings; tests
/// shorten them with the builder methods.
#[derive(Debug, Clone)]
pub struct SimConfig {
    pub(crate) history_max_events: usize,
    pub(crate) history_max_age: Duration,
    pub(crate) bookmark_interval: Duration,
    pub(crate) bookmark_before_timeout: Duration,
    pub(crate) default_watch_timeout: Duration,
    pub(crate) too_large_rv_wait: Duration,
    pub(crate) old_server: bool,
    pub(crate) watch_cache: bool,
    pub(crate) sharded_list_watch: bool,
    pub(crate) resources: Vec<ResourceDef>,
    pub(crate) seed_namespaces: bool,
    pub(crate) port: u16,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            history_max_events: 200_000,
            history_max_age: Duration::from_secs(300),
            bookmark_interval: Duration::from_secs(60),
            bookmark_before_timeout: Duration::from_secs(2),
            default_watch_timeout: Duration::from_secs(1800),
            too_large_rv_wait: Duration::from_secs(3),
            old_server: false,
            watch_cache: true,
            sharded_list_watch: true,
            resources: ResourceDef::builtins(),
            seed_namespaces: true,
            port: 0,
        }
    }
}

impl SimConfig {
    /// Keep at most `n` events in the history (older ones are compacted away).
    #[must_use]
    pub fn history_max_events(mut self, n: usize) -> Self {
        self.history_max_events = n;
        self
    }
    /// Compact events older than `age`.
    #[must_use]
    pub fn history_max_age(mut self, age: Duration) -> Self {
        self.history_max_age = age;
        self
    }
    /// Interval of periodic bookmarks on watches that allow them (real server: ~1 min).
    #[must_use]
    pub fn bookmark_interval(mut self, d: Duration) -> Self {
        self.bookmark_interval = d;
        self
    }
    /// How long before `timeoutSeconds` ends a watch the last bookmark is sent.
    #[must_use]
    pub fn bookmark_before_timeout(mut self, d: Duration) -> Self {
        self.bookmark_before_timeout = d;
        self
    }
    /// Watch duration when the request has no `timeoutSeconds` (real server: 30–60 min).
    #[must_use]
    pub fn default_watch_timeout(mut self, d: Duration) -> Self {
        self.default_watch_timeout = d;
        self
    }
    /// How long a LIST for a not-yet-reached revision waits before answering 504 (real: ~3 s).
    #[must_use]
    pub fn too_large_rv_wait(mut self, d: Duration) -> Self {
        self.too_large_rv_wait = d;
        self
    }
    /// Behave like a server that predates streaming lists: a WATCH with
    /// `resourceVersionMatch` is refused with 422 Invalid (as recorded from v1.20.2).
    #[must_use]
    pub fn old_server(mut self, yes: bool) -> Self {
        self.old_server = yes;
        self
    }
    /// With `false`, behave like a server with the watch cache off: no bookmarks, and a watch
    /// from a compacted revision reports etcd's message.
    #[must_use]
    pub fn watch_cache(mut self, yes: bool) -> Self {
        self.watch_cache = yes;
        self
    }
    /// With `false`, behave like a kube-apiserver before v1.36 (or with the
    /// `ShardedListAndWatch` feature gate off): the `shardSelector` parameter is ignored and
    /// lists carry no `metadata.shardInfo`, so clients must filter their shard themselves.
    /// Default `true`: LIST and WATCH honour KEP-5866's `shardSelector` (a malformed one is a
    /// 400) and a list that honoured it echoes the selector in `metadata.shardInfo.selector`.
    #[must_use]
    pub fn sharded_list_watch(mut self, yes: bool) -> Self {
        self.sharded_list_watch = yes;
        self
    }
    /// Register a custom resource (stored as JSON, listed in discovery).
    #[must_use]
    pub fn with_resource(mut self, def: ResourceDef) -> Self {
        self.resources.push(def);
        self
    }
    /// Listens on this port of 127.0.0.1 (default 0: any free port).
    #[must_use]
    pub fn port(mut self, port: u16) -> Self {
        self.port = port;
        self
    }

    /// Creates the `default`, `kube-system` and `kube-public` namespaces at start (default true).
    #[must_use]
    pub fn seed_namespaces(mut self, yes: bool) -> Self {
        self.seed_namespaces = yes;
        self
    }
}
