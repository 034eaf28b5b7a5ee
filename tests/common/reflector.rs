//! One reflector harness for the tests that drive a [`Reflector`] by hand: open a store with a
//! ConfigMap scope, start a reflector on any source, wait for sync, stop it, read what it
//! stored.
#![allow(dead_code)] // Each test binary uses part of it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use durable_informer::object::ScopeSpec;
use durable_informer::reflector::{Reflector, ReflectorConfig, ReflectorError, ReflectorStatus};
use durable_informer::source::Source;
use durable_informer::store::{DurableStore, ScopeId, StoreConfig};
use tokio::sync::watch;

/// How long a test waits for a sync or a stop before it fails.
const PATIENCE: Duration = Duration::from_secs(20);

/// A reflector running in a task, with the errors it reported.
pub struct Running {
    pub stop: watch::Sender<bool>,
    pub task: tokio::task::JoinHandle<Result<(), ReflectorError>>,
    pub status: watch::Receiver<ReflectorStatus>,
    pub errors: Arc<Mutex<Vec<String>>>,
}

/// A fresh database in `dir` with one all-namespaces ConfigMap scope.
pub fn open(dir: &tempfile::TempDir) -> (DurableStore, ScopeId) {
    let db = DurableStore::open(StoreConfig::new(dir.path().join("db.redb"))).unwrap();
    let scope = db
        .writer()
        .register_scope_blocking(&ScopeSpec::new("", "v1", "configmaps"))
        .unwrap();
    (db, scope)
}

/// Starts a reflector of `source` into `scope`, recording every error it reports.
pub fn start<S: Source>(source: S, db: &DurableStore, scope: ScopeId, config: ReflectorConfig) -> Running {
    let errors = Arc::new(Mutex::new(Vec::new()));
    let e2 = errors.clone();
    let r = Reflector::new(source, db.writer(), db.store(scope), config)
        .on_error(Arc::new(move |e| e2.lock().unwrap().push(e.to_string())));
    let status = r.status();
    let (stop, rx) = watch::channel(false);
    let task = tokio::spawn(r.run(rx));
    Running {
        stop,
        task,
        status,
        errors,
    }
}

impl Running {
    /// Waits until the reflector reports synced.
    pub async fn synced(&mut self) {
        tokio::time::timeout(PATIENCE, self.status.wait_for(|s| s.synced))
            .await
            .expect("not synced in time")
            .unwrap();
    }

    /// Stops the reflector, checks it ended without an error, and returns what it reported.
    pub async fn stop(self) -> Vec<String> {
        self.stop.send(true).unwrap();
        tokio::time::timeout(PATIENCE, self.task)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        self.errors.lock().unwrap().clone()
    }
}

/// `namespace/name` → resourceVersion of everything in the scope.
pub fn stored(db: &DurableStore, scope: ScopeId) -> BTreeMap<String, u64> {
    db.store(scope)
        .list()
        .unwrap()
        .into_iter()
        .map(|o| (o.key.to_string(), o.meta.resource_version.as_u64().unwrap()))
        .collect()
}
