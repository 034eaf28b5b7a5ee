//! The simulated Kubernetes API server: list/watch over real HTTP on 127.0.0.1, etcd-like
//! storage, fault injection and request counters. It imports nothing from the client side.
//!
//! The server speaks the list/watch protocol the way a kube-apiserver does (checked against the
//! responses recorded from kube-apiserver v1.20.2 in `tests/data/k8s-wire/`): one global revision counter,
//! an event history with a compaction window, paginated LIST with continue tokens, WATCH from a
//! revision or with synthetic ADDED events, bookmarks, streaming lists (`sendInitialEvents`),
//! 410 Expired / 504 ResourceVersionTooLarge, label and field selectors, KEP-5866 shard
//! selectors (`shardSelector`, echoed in `metadata.shardInfo`; off with
//! [`SimConfig::sharded_list_watch`]), and writes (POST, PUT,
//! merge, strategic merge and JSON PATCH, DELETE, `/status`, `/scale`), with JSON or protobuf
//! bodies. Real clients (`kube::Client`, `kubectl`) talk to it.
//!
//! Like a real watch cache, each resource has its own revision: that of its last event, which
//! other resources do not move (a real cacher watches its resource's etcd prefix, and etcd's
//! progress notifications come every ten minutes by default). An RV=0 LIST answers at that
//! revision, and a bookmark carries it, only once it is past the watch's resourceVersion,
//! periodically (`bookmark_interval`) and once before the watch's timeout
//! (`bookmark_before_timeout`). A `metadata.name=` field selector on a namespaced path reads one
//! key, as the registry does. [`Faults::delay_watch_replay`] delays what a watch sends after
//! its resourceVersion, for tests that must not report synced before it arrives.
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
//! CBOR bodies (answered with 415), protobuf lists and watches (always JSON; protobuf request
//! bodies and single-object answers are supported, see `pb`), strategic merge in full (lists
//! merge by key only for the usual fields), controllers (nothing rolls a Deployment out),
//! defaulting and validation of built-in kinds, real server-side apply (approximated as
//! create-or-merge), `deletecollection`, `dryRun`,
//! graceful deletion (deletes are immediate; a Pod's final event carries `deletionTimestamp`;
//! `metadata.finalizers` are honoured: a delete marks the object, 202, and the write that
//! removes its last finalizer deletes it), garbage collection of dependents,
//! namespace existence checks, Table output for `kubectl get` (it falls back to names and ages),
//! the legacy `/api/v1/watch/...` paths, admission, RBAC and authentication.
//!
//! ## Memory usage
//!
//! Objects are kept as serialized JSON (`bytes::Bytes`) plus a small index (namespace, name,
//! labels, resourceVersion, selectable fields). The history shares object versions with the
//! current state; superseded versions stay alive until the compaction window drops them.

mod config;
mod counters;
mod faults;
#[cfg(feature = "testing")]
mod in_process;
mod pb;
mod resource;
mod server;
mod store;
pub(crate) mod util;
pub mod workload;

use crate::util::Locked;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use util::JsonAt as _;

use serde_json::Value;

pub use config::SimConfig;
pub(crate) use counters::AtomicCounters;
pub use counters::Counters;
pub use faults::{Failure, FaultTarget, Faults};
pub use resource::ResourceDef;
pub use store::{Backup, Prebuilt};

#[cfg(feature = "testing")]
pub(crate) use in_process::HistoryEvent;
#[cfg(feature = "testing")]
pub(crate) use server::LaggingCache;
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
    /// The distinct `User-Agent`s of requests (the first [`MAX_USER_AGENTS`]).
    pub user_agents: Mutex<std::collections::BTreeSet<String>>,
}

/// How many distinct `User-Agent`s the sim remembers.
pub(crate) const MAX_USER_AGENTS: usize = 64;

impl Shared {
    pub fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves consistent data (every method either completes
        // or returns an error before mutating), so poisoning is ignored.
        self.state.locked()
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
            user_agents: Mutex::default(),
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

    /// An object version as returned to callers (see [`State::value_of`]).
    fn value_of(&self, obj: &store::Obj) -> Value {
        #[cfg(feature = "testing")]
        {
            let mut st = self.shared.lock();
            if st.deterministic.is_some() {
                return st.value_of(obj);
            }
        }
        // Parsed outside the lock.
        obj.value()
    }

    fn write<T>(&self, f: impl FnOnce(&mut State) -> Result<T>) -> Result<T> {
        let mut st = self.shared.lock();
        st.server_write = true;
        let out = f(&mut st);
        st.server_write = false;
        let rv = st.rv;
        drop(st);
        self.shared.notify(rv);
        out
    }

    /// Create an object of `resource` (plural, or `plural.group`) in namespace `ns`; returns
    /// it as stored (uid, creationTimestamp and resourceVersion set).
    pub fn create(&self, resource: &str, ns: Option<&str>, object: Value) -> Result<Value> {
        // JSON is parsed back outside the lock (see `value_of`)
        self.create_stored(resource, ns, object).map(|o| self.value_of(&o))
    }

    /// [`create`](Self::create), giving the stored version (the harness needs only its
    /// resourceVersion, not a parsed copy).
    pub(crate) fn create_stored(&self, resource: &str, ns: Option<&str>, object: Value) -> Result<Arc<store::Obj>> {
        self.write(|st| {
            let res = self.resource(st, resource)?;
            Ok(st.create(res, ns, object)?)
        })
    }

    /// Replace an object (a `resourceVersion` in the body is a precondition).
    pub fn update(&self, resource: &str, ns: Option<&str>, object: Value) -> Result<Value> {
        let name = object
            .at("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        self.write(|st| {
            let res = self.resource(st, resource)?;
            Ok(st.update(res, ns, &name, object, false)?)
        })
        .map(|o| self.value_of(&o))
    }

    /// Apply a JSON merge patch to an object.
    pub fn patch(&self, resource: &str, ns: Option<&str>, name: &str, patch: &Value) -> Result<Value> {
        self.patch_stored(resource, ns, name, patch, false)
            .map(|o| self.value_of(&o))
    }

    /// Apply a JSON merge patch to an object's status (the `/status` subresource).
    pub fn patch_status(&self, resource: &str, ns: Option<&str>, name: &str, patch: &Value) -> Result<Value> {
        self.patch_stored(resource, ns, name, patch, true)
            .map(|o| self.value_of(&o))
    }

    /// [`patch`](Self::patch) (of the status with `status`), giving the stored version.
    pub(crate) fn patch_stored(
        &self,
        resource: &str,
        ns: Option<&str>,
        name: &str,
        patch: &Value,
        status: bool,
    ) -> Result<Arc<store::Obj>> {
        self.write(|st| {
            let res = self.resource(st, resource)?;
            Ok(st.patch(res, ns, name, patch, status)?)
        })
    }

    /// A template of an object's current state whose resourceVersion and the value of
    /// `label` are filled in by [`write_prebuilt`](Self::write_prebuilt): the benchmark's
    /// fast write path, which parses no JSON per write.
    ///
    /// ```no_run
    /// # fn f(sim: &durable_informer::sim::Sim) -> Result<(), Box<dyn std::error::Error>> {
    /// let pod = sim.prebuild("pods", Some("ns-0"), "pod-0", "latency")?;
    /// let rv = sim.write_prebuilt(&pod, "17")?;
    /// # let _ = rv; Ok(()) }
    /// ```
    pub fn prebuild(&self, resource: &str, ns: Option<&str>, name: &str, label: &str) -> Result<Prebuilt> {
        let st = self.shared.lock();
        let res = self.resource(&st, resource)?;
        Ok(st.prebuild(res, ns, name, label)?)
    }

    /// Writes the next version of a pre-built object, with `value` (which must need no JSON
    /// escaping) as its label's value; returns the new resourceVersion. Whatever else changed
    /// in the object since [`prebuild`](Self::prebuild) is overwritten by the template.
    pub fn write_prebuilt(&self, object: &Prebuilt, value: &str) -> Result<u64> {
        self.write(|st| Ok(st.write_prebuilt(object, value)?))
    }

    /// The distinct `User-Agent` headers of the requests so far (the first 64), in order.
    pub fn user_agents(&self) -> Vec<String> {
        self.shared.user_agents.locked().iter().cloned().collect()
    }

    /// Delete an object; returns its final state (with the deletion's resourceVersion), or, for
    /// an object with finalizers, its terminating state (`deletionTimestamp` set).
    pub fn delete(&self, resource: &str, ns: Option<&str>, name: &str) -> Result<Value> {
        self.delete_stored(resource, ns, name).map(|o| self.value_of(&o))
    }

    /// [`delete`](Self::delete), giving the stored version (or the one deleted).
    pub(crate) fn delete_stored(&self, resource: &str, ns: Option<&str>, name: &str) -> Result<Arc<store::Obj>> {
        self.write(|st| {
            let res = self.resource(st, resource)?;
            Ok(st.delete(res, ns, name)?.0)
        })
    }

    /// Read one object.
    pub fn get(&self, resource: &str, ns: Option<&str>, name: &str) -> Result<Value> {
        let mut st = self.shared.lock();
        let res = self.resource(&st, resource)?;
        let obj = st.get(res, ns, name)?;
        Ok(st.value_of(&obj))
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

    /// Simulate an API server restart: every open watch ends, without sending anything
    /// written after the restart, and the history is dropped (watches from older revisions
    /// get 410); the objects and the revision stay.
    pub fn restart(&self) {
        let mut st = self.shared.lock();
        st.reset_history();
        // Under the state's lock: a watch reading the state after this sees the restart.
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
            self.shared.epoch_tx.send_modify(|e| *e += 1);
            st.rv
        };
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

/// Polls `done` every 20 ms until it returns true or `timeout` passes, and says which: demos
/// and tests wait for what an informer or controller did instead of sleeping a fixed time,
/// which a loaded machine can outlast.
///
/// ```
/// # async fn demo() {
/// use std::time::Duration;
/// let start = std::time::Instant::now();
/// let done = durable_informer::sim::wait_until(Duration::from_secs(5), async || {
///     start.elapsed() > Duration::from_millis(50)
/// })
/// .await;
/// assert!(done);
/// # }
/// ```
pub async fn wait_until(timeout: std::time::Duration, mut done: impl AsyncFnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if done().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
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
