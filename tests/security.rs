//! Credentials never reach logs or errors, and the database file is private.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use durable_informer::informer::{handler_fn, Event, HandlerOptions, Informer};
use durable_informer::reflector::{BackoffConfig, ReflectorConfig};
use durable_informer::sim::{Failure, FaultTarget, Sim, SimConfig};
use durable_informer::source::KubeSource;
use durable_informer::store::{DurableStore, StoreConfig};
use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::json;

const TOKEN: &str = "sEcReT-bearer-token-0123456789";

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Capture {
    type Writer = Capture;
    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bearer_token_never_appears_in_logs_or_errors() {
    let capture = Capture::default();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(capture.clone())
        .finish();
    // Global: the informer logs from runtime worker threads. Only this test in this binary logs.
    tracing::subscriber::set_global_default(subscriber).unwrap();

    let sim = tokio::task::spawn_blocking(|| Sim::start(SimConfig::default()).unwrap())
        .await
        .unwrap();
    sim.create(
        "configmaps",
        Some("default"),
        json!({"metadata": {"name": "a", "namespace": "default"}}),
    )
    .unwrap();
    let mut config = sim.kube_config().unwrap();
    config.auth_info.token = Some(TOKEN.to_string().into());
    let client = kube::Client::try_from(config).unwrap();
    // Failures produce errors that carry requests' context: the token must not be part of it.
    sim.faults().fail_next(FaultTarget::Any, Failure::InternalError, 3);

    let dir = tempfile::tempdir().unwrap();
    let db = DurableStore::open(StoreConfig::new(dir.path().join("db.redb"))).unwrap();
    let cfg = ReflectorConfig {
        backoff: BackoffConfig {
            initial: Duration::from_millis(10),
            max: Duration::from_millis(50),
            ..BackoffConfig::default()
        },
        ..ReflectorConfig::default()
    };
    let source = KubeSource::typed::<ConfigMap>(client, &sim.url());
    let debug_view = format!("{source:?}");
    let informer = Informer::<ConfigMap>::builder(&db, source)
        .reflector_config(cfg)
        .build()
        .await
        .unwrap();
    informer.add_event_handler(
        handler_fn(|_: Event<ConfigMap>| -> Result<(), String> { Err("handler error".into()) }),
        HandlerOptions::volatile(),
    );
    informer.start();
    tokio::time::timeout(Duration::from_secs(20), informer.wait_for_sync())
        .await
        .unwrap();
    informer.shutdown().await.unwrap();

    let logs = String::from_utf8(capture.0.lock().unwrap().clone()).unwrap();
    assert!(logs.len() > 1000, "debug logging was captured ({} bytes)", logs.len());
    assert!(logs.contains("500"), "the injected failures were logged");
    assert!(!logs.contains(TOKEN), "the token leaked into the logs");
    let errors = informer.errors().join("\n");
    assert!(!errors.is_empty());
    assert!(!errors.contains(TOKEN), "the token leaked into errors: {errors}");
    assert!(!debug_view.contains(TOKEN));
}

#[test]
fn database_files_are_private_even_with_a_permissive_umask() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db.redb");
    // Whatever the umask, 0600 is requested explicitly on creation.
    let db = DurableStore::open(StoreConfig::new(&path)).unwrap();
    drop(db);
    assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
}

/// Opting in to Secrets logs a warning that they are stored on disk, naming the file; a
/// ConfigMap informer on the same store logs no such warning.
#[test]
fn allowing_secrets_warns_that_they_are_stored_on_disk() {
    use k8s_openapi::api::core::v1::Secret;
    let capture = Capture::default();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_writer(capture.clone())
        .finish();
    let sim = Sim::start(SimConfig::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db.redb");
    let db = DurableStore::open(StoreConfig::new(&path)).unwrap();
    // Thread-local subscriber: the warning is logged by `build` on this (current) thread.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let logs = |capture: &Capture| String::from_utf8(capture.0.lock().unwrap().clone()).unwrap();
    tracing::subscriber::with_default(subscriber, || {
        rt.block_on(async {
            Informer::<ConfigMap>::builder(&db, KubeSource::typed::<ConfigMap>(sim.client().unwrap(), &sim.url()))
                .build()
                .await
                .unwrap();
            assert!(!logs(&capture).contains("stored on disk"), "{}", logs(&capture));
            Informer::<Secret>::builder(&db, KubeSource::typed::<Secret>(sim.client().unwrap(), &sim.url()))
                .allow_secrets()
                .build()
                .await
                .unwrap();
        })
    });
    let logs = logs(&capture);
    let line = logs
        .lines()
        .find(|l| l.contains("Secrets: they are stored on disk"))
        .unwrap_or_else(|| panic!("no warning about Secrets on disk in: {logs}"));
    assert!(line.contains("WARN"), "{line}");
    assert!(line.contains(&path.display().to_string()), "the file is named: {line}");
}
