//! Credentials never reach logs or errors, and the database file is private.

mod common;

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
        .unwrap()
        .expect("cache synced");
    informer.shutdown().await.unwrap();

    let logs = String::from_utf8(capture.0.lock().unwrap().clone()).unwrap();
    assert!(logs.len() > 1000, "debug logging was captured ({} bytes)", logs.len());
    assert!(logs.contains("500"), "the injected failures were logged");
    assert!(!logs.contains(TOKEN), "the token leaked into the logs");
    let errors = informer.errors().join("\n");
    assert!(!errors.is_empty());
    assert!(!errors.contains(TOKEN), "the token leaked into errors: {errors}");
    assert!(!debug_view.contains(TOKEN));
    // positive control: the token really was sent, so its absence above means something
    assert!(sim.counters().bearer_requests > 0, "the client sent the bearer token");
}

#[test]
fn database_files_are_private_even_with_a_permissive_umask() {
    use nix::sys::stat::{umask, Mode};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db.redb");
    let control = dir.path().join("control");
    // umask 0: a file created with the default mode would be world-readable. The umask is
    // process-wide; the other tests here only gain looser modes from it for a moment.
    let old = umask(Mode::empty());
    let db = DurableStore::open(StoreConfig::new(&path));
    let control_file = std::fs::write(&control, b"x");
    umask(old);
    drop(db.unwrap());
    control_file.unwrap();
    assert_eq!(
        std::fs::metadata(&control).unwrap().permissions().mode() & 0o777,
        0o666,
        "control: the umask was really 0"
    );
    // 0600 is requested explicitly on creation.
    assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
}

/// The binary with `--log debug` and a kubeconfig holding a token: the token reaches the
/// server (the sim counts it) and never stdout or stderr.
#[test]
fn the_cli_never_prints_the_kubeconfig_token_even_at_debug_level() {
    let sim = Sim::start(SimConfig::default()).unwrap();
    sim.create(
        "configmaps",
        Some("default"),
        json!({"metadata": {"name": "seen-by-cli"}}),
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: sim\n  cluster:\n    server: {}\ncontexts:\n- name: sim\n  context:\n    cluster: sim\n    user: u\ncurrent-context: sim\nusers:\n- name: u\n  user:\n    token: {TOKEN}\n",
            sim.url()
        ),
    )
    .unwrap();
    // a failure on the way, so error paths log too (kube does not retry a 500)
    sim.faults().fail_next(FaultTarget::Any, Failure::InternalError, 1);
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_durable-informer"))
        .args(["--log", "debug", "watch", "-r", "configmaps", "-A", "--kubeconfig"])
        .arg(&kubeconfig)
        .arg("--db")
        .arg(dir.path().join("db.redb"))
        .env_remove("KUBECONFIG")
        .env("HOME", "/nonexistent-home")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stdout.contains("seen-by-cli"), "the watch ran: {stdout}\n{stderr}");
    assert!(stderr.contains("DEBUG"), "debug logging was on: {stderr}");
    assert!(sim.counters().bearer_requests > 0, "the CLI sent the token");
    assert!(!stdout.contains(TOKEN), "the token leaked to stdout");
    assert!(!stderr.contains(TOKEN), "the token leaked to stderr");
}

/// Opting in to Secrets logs a warning that they are stored on disk, naming the file; a
/// ConfigMap informer on the same store logs no such warning.
#[test]
fn allowing_secrets_warns_that_they_are_stored_on_disk() {
    use k8s_openapi::api::core::v1::Secret;
    // Alone in its process: a thread-local subscriber must not race other tests' threads.
    if !common::alone::in_own_process("allowing_secrets_warns_that_they_are_stored_on_disk") {
        return;
    }
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
