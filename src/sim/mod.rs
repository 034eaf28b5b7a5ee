//! The simulated Kubernetes API server: list/watch over real HTTP on 127.0.0.1, etcd-like
//! storage, fault injection and request counters. It imports nothing from the client side.
//!
//! The server speaks the list/watch protocol the way a kube-apiserver does (checked against the
//! responses recorded from kube-apiserver v1.20.2 in `tests/data/k8s-wire/`): one global revision counter,
//! an event history with a compaction window, paginated LIST with continue tokens, WATCH from a
//! revision or with synthetic ADDED events, bookmarks, streaming lists (`sendInitialEvents`),
//! 410 Expired / 504 ResourceVersionTooLarge, label and field selectors, and writes (POST, PUT,
//! merge PATCH, DELETE, `/status`). Real clients (`kube::Client`, `kubectl`) talk to it.
//!
//! It runs on its own small Tokio runtime, so it can be started from synchronous code, from any
//! async test (even one with paused time), and it shuts down when the [`Sim`] handle is dropped.
//!
//! ## Usage
//!
//! ```no_run
//! use durable_informer::sim::{Sim, SimConfig};
//! use serde_json::json;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let sim = Sim::start(SimConfig::default())?;
//! sim.create("configmaps", Some("default"), json!({"metadata": {"name": "a"}, "data": {"k": "v"}}))?;
//! let client = sim.client()?;
//! let api: kube::Api<k8s_openapi::api::core::v1::ConfigMap> = kube::Api::namespaced(client, "default");
//! let list = api.list(&Default::default()).await?;
//! assert_eq!(list.items.len(), 1);
//! println!("{} LIST requests", sim.counters().list_requests);
//! # Ok(()) }
//! ```
//!
//! ## What is not emulated
//!
//! Protobuf/CBOR bodies (answered with 415, so use JSON clients), JSON patch (RFC 6902),
//! strategic-merge list semantics (a strategic merge patch is applied as a JSON merge patch),
//! real server-side apply (approximated as create-or-merge), `deletecollection`, `dryRun`,
//! graceful deletion (deletes are immediate; a Pod's final event carries `deletionTimestamp`),
//! namespace existence checks, Table output for `kubectl get` (it falls back to names and ages),
//! the legacy `/api/v1/watch/...` paths, admission, RBAC and authentication.
//!
//! ## Memory usage
//!
//! Objects are kept as serialized JSON (`bytes::Bytes`) plus a small index (namespace, name,
//! labels, resourceVersion, selectable fields). The history shares object versions with the
//! current state; superseded versions stay alive until the compaction window drops them.

mod faults;
mod server;
mod store;
mod util;
pub mod workload;

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde_json::Value;

pub use faults::{Failure, FaultTarget, Faults};
pub use store::Backup;

use store::{State, Window};

/// Errors of the simulated server's handle.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SimError {
    /// Binding the listener or building the runtime failed.
    #[error("simulated API server I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// The resource name is not registered.
    #[error("unknown resource {0:?}")]
    UnknownResource(String),
    /// The server refused the operation, as a real API server would (with the same status).
    #[error("{reason} ({code}): {message}")]
    Api {
        /// HTTP status code, e.g. 404 or 409.
        code: u16,
        /// `Status.reason`, e.g. `NotFound`, `AlreadyExists`, `Conflict`.
        reason: String,
        /// `Status.message`.
        message: String,
    },
    /// Building a kube client or config failed.
    #[error("kube client error: {0}")]
    Kube(#[from] kube::Error),
    /// The server URL could not be turned into a URI (should not happen).
    #[error("invalid server URL: {0}")]
    Url(String),
}

impl From<store::ApiError> for SimError {
    fn from(e: store::ApiError) -> Self {
        SimError::Api {
            code: e.code,
            reason: e.reason.to_string(),
            message: e.message,
        }
    }
}

/// Result with [`SimError`].
pub type Result<T, E = SimError> = std::result::Result<T, E>;

/// A resource the server serves: group/version/kind and its plural name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceDef {
    /// API group (`""` for core).
    pub group: String,
    /// API version, e.g. `v1`.
    pub version: String,
    /// Kind, e.g. `Pod`.
    pub kind: String,
    /// Plural resource name, e.g. `pods`.
    pub plural: String,
    /// Whether objects live in namespaces.
    pub namespaced: bool,
    /// Whether `/status` is a subresource (then the main resource ignores `.status` changes).
    pub status_subresource: bool,
    /// Short names for discovery (`kubectl get cm`).
    pub short_names: Vec<String>,
}

impl ResourceDef {
    /// A namespaced custom resource stored as JSON, with a status subresource.
    pub fn custom(group: &str, version: &str, kind: &str, plural: &str) -> Self {
        Self {
            group: group.into(),
            version: version.into(),
            kind: kind.into(),
            plural: plural.into(),
            namespaced: true,
            status_subresource: true,
            short_names: Vec::new(),
        }
    }

    /// Make it cluster-scoped.
    #[must_use]
    pub fn cluster_scoped(mut self) -> Self {
        self.namespaced = false;
        self
    }

    fn builtin(group: &str, kind: &str, plural: &str, namespaced: bool, status: bool, short: &[&str]) -> Self {
        Self {
            group: group.into(),
            version: "v1".into(),
            kind: kind.into(),
            plural: plural.into(),
            namespaced,
            status_subresource: status,
            short_names: short.iter().map(|s| (*s).to_string()).collect(),
        }
    }

    /// The built-in resources: core/v1 pods, configmaps, secrets, namespaces, nodes and
    /// apps/v1 deployments.
    pub fn builtins() -> Vec<Self> {
        vec![
            Self::builtin("", "Pod", "pods", true, true, &["po"]),
            Self::builtin("", "ConfigMap", "configmaps", true, false, &["cm"]),
            Self::builtin("", "Secret", "secrets", true, false, &[]),
            Self::builtin("", "Namespace", "namespaces", false, true, &["ns"]),
            Self::builtin("", "Node", "nodes", false, true, &["no"]),
            Self::builtin("apps", "Deployment", "deployments", true, true, &["deploy"]),
        ]
    }

    /// `group/version`, or `version` for the core group.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `plural` or `plural.group`, as used in API server messages.
    pub(crate) fn resource_group(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    fn has_generation(&self) -> bool {
        !self.group.is_empty()
    }

    fn is_core(&self, plural: &str) -> bool {
        self.group.is_empty() && self.plural == plural
    }

    /// Field paths selectable besides `metadata.name` and `metadata.namespace`.
    pub(crate) fn extra_fields(&self) -> &'static [&'static str] {
        if self.is_core("pods") {
            &[
                "status.phase",
                "spec.nodeName",
                "spec.restartPolicy",
                "spec.schedulerName",
                "spec.serviceAccountName",
                "status.podIP",
                "status.nominatedNodeName",
            ]
        } else if self.is_core("secrets") {
            &["type"]
        } else if self.is_core("namespaces") {
            &["status.phase"]
        } else if self.is_core("nodes") {
            &["spec.unschedulable"]
        } else {
            &[]
        }
    }
}

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
    fn snapshot(&self) -> Counters {
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
    fn reset(&self) {
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

/// State shared by the handle and the server tasks.
#[derive(Debug)]
pub(crate) struct Shared {
    pub state: Mutex<State>,
    /// The current revision, for watchers and waiting LISTs.
    pub rv_tx: tokio::sync::watch::Sender<u64>,
    /// Bumped by `restart`/`restore_backup`: every open watch ends.
    pub epoch_tx: tokio::sync::watch::Sender<u64>,
    pub counters: AtomicCounters,
    pub faults: Faults,
    pub config: SimConfig,
}

impl Shared {
    pub fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves consistent data (every method either completes
        // or returns an error before mutating), so poisoning is ignored.
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Publish the current revision to watchers.
    pub fn notify(&self, rv: u64) {
        self.rv_tx.send_replace(rv);
    }
}

/// A running simulated API server. Dropping it stops the server and ends every connection.
#[derive(Debug)]
pub struct Sim {
    shared: Arc<Shared>,
    addr: std::net::SocketAddr,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Sim {
    /// Start a server on `127.0.0.1:0` on its own two-thread Tokio runtime.
    pub fn start(config: SimConfig) -> Result<Sim> {
        let port = config.port;
        let window = Window {
            max_events: config.history_max_events,
            max_age: config.history_max_age,
        };
        let state = State::new(config.resources.clone(), window);
        let (rv_tx, _) = tokio::sync::watch::channel(state.rv);
        let (epoch_tx, _) = tokio::sync::watch::channel(0);
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            rv_tx,
            epoch_tx,
            counters: AtomicCounters::default(),
            faults: Faults::default(),
            config,
        });
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("sim-apiserver")
            .enable_all()
            .build()?;
        let listener = std::net::TcpListener::bind(("127.0.0.1", port))?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let listener = {
            let _guard = runtime.enter();
            tokio::net::TcpListener::from_std(listener)?
        };
        runtime.spawn(server::serve(listener, shared.clone()));
        let sim = Sim {
            shared,
            addr,
            runtime: Some(runtime),
        };
        if sim.shared.config.seed_namespaces {
            for ns in ["default", "kube-system", "kube-public"] {
                sim.create("namespaces", None, serde_json::json!({"metadata": {"name": ns}}))?;
            }
        }
        Ok(sim)
    }

    /// The server's base URL, e.g. `http://127.0.0.1:40123`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The socket address the server listens on.
    pub fn addr(&self) -> std::net::SocketAddr {
        self.addr
    }

    /// A `kube::Config` for this server (no auth, default namespace `default`).
    pub fn kube_config(&self) -> Result<kube::Config> {
        let uri: http::Uri = self
            .url()
            .parse()
            .map_err(|e: http::uri::InvalidUri| SimError::Url(e.to_string()))?;
        let mut config = kube::Config::new(uri);
        config.default_namespace = "default".into();
        config.read_timeout = None;
        Ok(config)
    }

    /// A `kube::Client` for this server. Must be called inside a Tokio runtime (the client's
    /// background task runs there, not on the server's runtime).
    ///
    /// Note that `kube::Client` retries 429/503/504 by default (honouring `Retry-After`); to
    /// see those statuses, build a client from [`kube_config`](Self::kube_config) with
    /// `default_retry = false`.
    pub fn client(&self) -> Result<kube::Client> {
        Ok(kube::Client::try_from(self.kube_config()?)?)
    }

    /// Write a kubeconfig file (context `sim`, namespace `default`) for `kubectl` and friends.
    pub fn write_kubeconfig(&self, path: impl AsRef<Path>) -> Result<()> {
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: sim\n  cluster:\n    server: {}\ncontexts:\n- name: sim\n  context:\n    cluster: sim\n    user: sim\n    namespace: default\ncurrent-context: sim\nusers:\n- name: sim\n  user: {{}}\n",
            self.url()
        );
        std::fs::write(path, text)?;
        Ok(())
    }

    fn resource(&self, st: &State, resource: &str) -> Result<usize> {
        st.find(resource)
            .ok_or_else(|| SimError::UnknownResource(resource.to_string()))
    }

    fn write<T>(&self, f: impl FnOnce(&mut State) -> Result<T>) -> Result<T> {
        let mut st = self.shared.lock();
        let out = f(&mut st);
        let rv = st.rv;
        drop(st);
        self.shared.notify(rv);
        out
    }

    /// Create an object of `resource` (plural, or `plural.group`) in namespace `ns`; returns
    /// it as stored (uid, creationTimestamp and resourceVersion set).
    pub fn create(&self, resource: &str, ns: Option<&str>, object: Value) -> Result<Value> {
        // JSON is parsed back outside the lock
        self.write(|st| {
            let res = self.resource(st, resource)?;
            Ok(st.create(res, ns, object)?)
        })
        .map(|o| o.value())
    }

    /// Replace an object (a `resourceVersion` in the body is a precondition).
    pub fn update(&self, resource: &str, ns: Option<&str>, object: Value) -> Result<Value> {
        let name = object
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        self.write(|st| {
            let res = self.resource(st, resource)?;
            Ok(st.update(res, ns, &name, object, false)?)
        })
        .map(|o| o.value())
    }

    /// Apply a JSON merge patch to an object.
    pub fn patch(&self, resource: &str, ns: Option<&str>, name: &str, patch: &Value) -> Result<Value> {
        self.write(|st| {
            let res = self.resource(st, resource)?;
            Ok(st.patch(res, ns, name, patch, false)?)
        })
        .map(|o| o.value())
    }

    /// Apply a JSON merge patch to an object's status (the `/status` subresource).
    pub fn patch_status(&self, resource: &str, ns: Option<&str>, name: &str, patch: &Value) -> Result<Value> {
        self.write(|st| {
            let res = self.resource(st, resource)?;
            Ok(st.patch(res, ns, name, patch, true)?)
        })
        .map(|o| o.value())
    }

    /// Delete an object; returns its final state (with the deletion's resourceVersion).
    pub fn delete(&self, resource: &str, ns: Option<&str>, name: &str) -> Result<Value> {
        self.write(|st| {
            let res = self.resource(st, resource)?;
            Ok(st.delete(res, ns, name)?)
        })
        .map(|o| o.value())
    }

    /// Read one object.
    pub fn get(&self, resource: &str, ns: Option<&str>, name: &str) -> Result<Value> {
        let st = self.shared.lock();
        let res = self.resource(&st, resource)?;
        Ok(st.get(res, ns, name)?.value())
    }

    /// Create many objects under one lock (each still gets its own revision and event);
    /// objects carry their namespace in `metadata.namespace`. Returns the revision after.
    pub fn bulk_load(&self, resource: &str, objects: impl IntoIterator<Item = Value>) -> Result<u64> {
        self.write(|st| {
            let res = self.resource(st, resource)?;
            for o in objects {
                st.create(res, None, o)?;
            }
            Ok(st.rv)
        })
    }

    /// The current global revision.
    pub fn current_rv(&self) -> u64 {
        self.shared.lock().rv
    }

    /// The revision below which watches and exact LISTs are expired (410).
    pub fn compacted_rv(&self) -> u64 {
        self.shared.lock().compact_rv
    }

    /// Compact the history at the current revision (like etcd compaction): every watch or
    /// continue token from an older revision gets 410 Expired.
    pub fn compact(&self) {
        let mut st = self.shared.lock();
        let rv = st.rv;
        st.compact_to(rv);
    }

    /// Compact the history up to and including `rv`.
    pub fn compact_to(&self, rv: u64) {
        self.shared.lock().compact_to(rv);
    }

    /// Simulate an API server restart: every open watch ends and the history is dropped
    /// (watches from older revisions get 410); the objects and the revision stay.
    pub fn restart(&self) {
        self.shared.lock().reset_history();
        self.shared.epoch_tx.send_modify(|e| *e += 1);
    }

    /// Take a copy of the stored objects at the current revision ("an etcd backup").
    pub fn backup(&self) -> Backup {
        self.shared.lock().backup()
    }

    /// Restore an old backup: objects and the revision go back to the backup's, the history is
    /// dropped and every open watch ends (the kubernetes#107457 situation).
    pub fn restore_backup(&self, backup: &Backup) {
        let rv = {
            let mut st = self.shared.lock();
            st.restore(backup);
            st.rv
        };
        self.shared.epoch_tx.send_modify(|e| *e += 1);
        self.shared.notify(rv);
    }

    /// A snapshot of the request counters.
    pub fn counters(&self) -> Counters {
        self.shared.counters.snapshot()
    }

    /// Set every counter to zero.
    pub fn reset_counters(&self) {
        self.shared.counters.reset();
    }

    /// The fault-injection switches (shared with the server; changes apply to new requests).
    pub fn faults(&self) -> &Faults {
        &self.shared.faults
    }

    /// Register a custom resource at run time (it appears in discovery at once).
    pub fn register_crd(&self, def: ResourceDef) {
        self.shared.lock().register(def);
    }
}

/// Decode a continue token the way the server does: `(resourceVersion, start key)` or the
/// message of the 400 the server would answer. Exposed for fuzzing only.
#[doc(hidden)]
pub fn decode_continue_token(token: &str) -> std::result::Result<(i64, String), String> {
    server::decode_continue(token)
        .map(|t| (t.rv, t.start))
        .map_err(|e| e.message)
}

/// Encode a continue token as the server does. Exposed for fuzzing only.
#[doc(hidden)]
pub fn encode_continue_token(rv: i64, start: &str) -> String {
    server::encode_continue(rv, start)
}

impl Drop for Sim {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}
