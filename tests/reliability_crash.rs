//! Crash-kill harness: a child process runs an informer with a durable handler against the
//! simulated cluster under churn; the parent kills it with SIGKILL at random moments and starts
//! it again. After every round the persisted RV never went backwards and `check` passes; at the
//! end the store equals the server, and the durable handler received every event of the
//! server's log at least once, with duplicates only around the kills.
//!
//! `DI_CRASH_ROUNDS` sets the number of rounds (CI: 100; `--long`: thousands).

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use durable_informer::informer::{handler_fn, Event, HandlerOptions, Informer};
use durable_informer::reflector::{BackoffConfig, ReflectorConfig};
use durable_informer::sim::workload::Churn;
use durable_informer::sim::{Sim, SimConfig};
use durable_informer::source::KubeSource;
use durable_informer::store::{DurableStore, StoreConfig};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::watcher;

const TEST: &str = "killed_informers_lose_nothing_and_never_go_backwards";

fn reflector_config() -> ReflectorConfig {
    ReflectorConfig {
        backoff: BackoffConfig {
            initial: Duration::from_millis(10),
            max: Duration::from_millis(100),
            ..BackoffConfig::default()
        },
        resume_quiet_period: Some(Duration::from_millis(100)),
        ..ReflectorConfig::default()
    }
}

/// The child: run the informer; the durable handler appends `type key rv` lines to the audit
/// file before returning (at-least-once: the cursor is persisted after the handler returns).
fn child(db: &str, url: &str, audit: &str) -> ! {
    eprintln!("child starting with {db} {url}");
    if std::env::var("DI_TRACE").is_ok() {
        let _ = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_writer(std::io::stderr)
            .try_init();
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let store = DurableStore::open(StoreConfig::new(db)).expect("open");
        eprintln!("child: opened");
        let config = kube::Config::new(url.parse().expect("url"));
        let client = kube::Client::try_from(config).expect("client");
        let informer = Informer::<ConfigMap>::builder(&store, KubeSource::typed::<ConfigMap>(client, url))
            .reflector_config(reflector_config())
            .build()
            .await
            .expect("build");
        eprintln!("child: built");
        let file = std::sync::Mutex::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(audit)
                .expect("audit"),
        );
        informer.add_event_handler(
            handler_fn(move |ev: Event<ConfigMap>| -> Result<(), std::io::Error> {
                let (kind, obj) = match &ev {
                    Event::Add { object, initial: true } => ("INITIAL", object),
                    Event::Add { object, .. } => ("ADDED", object),
                    Event::Update { new, .. } => ("MODIFIED", new),
                    Event::Delete { object, .. } => ("DELETED", object),
                };
                let m = &obj.metadata;
                let line = format!(
                    "{kind} {}/{} {}\n",
                    m.namespace.as_deref().unwrap_or(""),
                    m.name.as_deref().unwrap_or(""),
                    m.resource_version.as_deref().unwrap_or("")
                );
                // One write per line: a kill leaves whole lines (the page cache survives SIGKILL).
                file.lock()
                    .map_err(|_| std::io::Error::other("poisoned"))?
                    .write_all(line.as_bytes())
            }),
            HandlerOptions::durable("audit"),
        );
        eprintln!("child: handler added");
        informer.start();
        eprintln!("child: started");
        while tokio::time::timeout(Duration::from_secs(2), informer.wait_for_sync())
            .await
            .is_err()
        {
            eprintln!(
                "not synced yet: {:?} {:?}",
                informer.status().borrow().clone(),
                informer.errors()
            );
        }
        println!("synced");
        std::future::pending::<()>().await;
    });
    std::process::exit(0)
}

/// A child process killed with SIGKILL when dropped, so a failing test leaves nothing behind.
struct Killer(std::process::Child);

impl Drop for Killer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct Truth {
    events: Vec<(String, String, String)>,
}

#[test]
fn killed_informers_lose_nothing_and_never_go_backwards() {
    if let (Ok(db), Ok(url), Ok(audit)) = (
        std::env::var("DI_DB"),
        std::env::var("DI_URL"),
        std::env::var("DI_AUDIT"),
    ) {
        child(&db, &url, &audit);
    }
    let rounds: u64 = std::env::var("DI_CRASH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100);
    let sim = Arc::new(
        Sim::start(
            SimConfig::default()
                .history_max_events(10_000_000)
                .bookmark_interval(Duration::from_millis(200)),
        )
        .unwrap(),
    );
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db.redb");
    let audit = dir.path().join("audit.log");
    let exe = std::env::current_exe().unwrap();
    let stderr_log = dir.path().join("child-stderr.log");
    let spawn = || {
        let err = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&stderr_log)
            .unwrap();
        Killer(
            Command::new(&exe)
                .args([TEST, "--exact", "--nocapture", "--test-threads=1"])
                .env("DI_DB", &db)
                .env("DI_URL", sim.url())
                .env("DI_AUDIT", &audit)
                .stdout(Stdio::piped())
                .stderr(err)
                .spawn()
                .unwrap(),
        )
    };

    // Seed some objects and let a first run sync them (an initial list is not a stream of
    // events, so the event check starts after it).
    Churn::new(5, "configmaps", vec!["seed".into()])
        .mix(1, 0, 0)
        .step(&sim, 20)
        .unwrap();
    {
        use std::io::BufRead;
        let mut first = spawn();
        let out = first.0.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let synced = std::io::BufReader::new(out)
                .lines()
                .map_while(Result::ok)
                .any(|l| l.trim_end().ends_with("synced"));
            let _ = tx.send(synced);
        });
        let synced = rx.recv_timeout(Duration::from_secs(60)).unwrap_or(false);
        assert!(
            synced,
            "the first run never synced: {}",
            std::fs::read_to_string(&stderr_log).unwrap_or_default()
        );
    }
    // An uninterrupted watcher records the truth: every event after the start RV.
    let start_rv = sim.current_rv();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let truth = Arc::new(std::sync::Mutex::new(Truth { events: Vec::new() }));
    let stop_truth = Arc::new(AtomicBool::new(false));
    {
        let truth = truth.clone();
        let client = rt.block_on(async { sim.client() }).unwrap();
        rt.spawn(async move {
            use futures::StreamExt;
            let api: kube::Api<ConfigMap> = kube::Api::all(client);
            let mut s = Box::pin(watcher::watcher(api, watcher::Config::default()));
            while let Some(ev) = s.next().await {
                if let Ok(watcher::Event::Apply(o) | watcher::Event::Delete(o)) = &ev {
                    let m = &o.metadata;
                    let key = format!(
                        "{}/{}",
                        m.namespace.as_deref().unwrap_or(""),
                        m.name.as_deref().unwrap_or("")
                    );
                    let kind = if matches!(ev, Ok(watcher::Event::Delete(_))) {
                        "DELETED"
                    } else {
                        "APPLY"
                    };
                    truth.lock().unwrap().events.push((
                        kind.to_string(),
                        key,
                        m.resource_version.clone().unwrap_or_default(),
                    ));
                }
            }
        });
    }

    // Churn in the background for the whole run.
    let churning = Arc::new(AtomicBool::new(true));
    let churn = {
        let sim = sim.clone();
        let churning = churning.clone();
        std::thread::spawn(move || {
            let mut ch = Churn::new(11, "configmaps", vec!["a".into(), "b".into(), "c".into()]).mix(3, 5, 2);
            while churning.load(Ordering::Relaxed) {
                ch.step(&sim, 5).unwrap();
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };

    let mut seed: u64 = 0x2545_F491_4F6C_DD1D;
    let mut last_rv = 0u64;
    for round in 0..rounds {
        let child = spawn();
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        std::thread::sleep(Duration::from_millis(60 + seed % 400));
        drop(child); // SIGKILL
        let store = DurableStore::open(StoreConfig::new(&db)).unwrap();
        if let Some((scope, record)) = store.scopes().unwrap().into_iter().next() {
            let _ = scope;
            let rv = record.rv.and_then(|r| r.as_u64()).unwrap_or(0);
            assert!(
                rv >= last_rv,
                "round {round}: the persisted RV went backwards from {last_rv} to {rv}"
            );
            last_rv = rv;
        }
        let report = store.check().unwrap();
        assert!(report.is_ok(), "round {round}: {:?}", report.problems);
    }
    churning.store(false, Ordering::Relaxed);
    churn.join().unwrap();

    // A last run catches up with everything.
    let final_rv = sim.current_rv();
    let child = spawn();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        std::thread::sleep(Duration::from_millis(200));
        let audit_text = std::fs::read_to_string(&audit).unwrap_or_default();
        let seen_final = audit_text.lines().any(|l| l.ends_with(&format!(" {final_rv}")));
        if seen_final || std::time::Instant::now() > deadline {
            break;
        }
    }
    drop(child);
    stop_truth.store(true, Ordering::Relaxed);

    let store = DurableStore::open(StoreConfig::new(&db)).unwrap();
    let (scope, _) = store.scopes().unwrap().into_iter().next().unwrap();
    let ours: BTreeMap<String, String> = store
        .store(scope)
        .list()
        .unwrap()
        .into_iter()
        .map(|o| (o.key.to_string(), o.meta.resource_version.0))
        .collect();
    let theirs: BTreeMap<String, String> = rt.block_on(async {
        let api: kube::Api<ConfigMap> = kube::Api::all(sim.client().unwrap());
        api.list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .map(|c| {
                (
                    format!("{}/{}", c.metadata.namespace.unwrap(), c.metadata.name.unwrap()),
                    c.metadata.resource_version.unwrap(),
                )
            })
            .collect()
    });
    assert_eq!(ours, theirs, "the store equals the server once caught up");

    // Every event after the start RV reached the durable handler at least once.
    let audit_text = std::fs::read_to_string(&audit).unwrap();
    let mut delivered: HashMap<(String, String), u32> = HashMap::new();
    for l in audit_text.lines() {
        let parts: Vec<&str> = l.split(' ').collect();
        if parts.len() == 3 && parts[0] != "INITIAL" {
            *delivered.entry((parts[1].to_owned(), parts[2].to_owned())).or_default() += 1;
        }
    }
    let truth = truth.lock().unwrap();
    let expected: Vec<&(String, String, String)> = truth
        .events
        .iter()
        .filter(|(_, _, rv)| rv.parse::<u64>().unwrap_or(0) > start_rv)
        .collect();
    assert!(expected.len() > 100, "the churn produced {} events", expected.len());
    let missing: Vec<_> = expected
        .iter()
        .filter(|(_, k, rv)| !delivered.contains_key(&(k.clone(), rv.clone())))
        .take(5)
        .collect();
    assert!(missing.is_empty(), "events never delivered (first 5): {missing:?}");
    // Duplicates come only from batches committed but not acknowledged when a kill hit:
    // at most one batch (256 entries) per round.
    let duplicates: u64 = delivered.values().map(|n| u64::from(n - 1)).sum();
    assert!(
        duplicates <= 256 * (rounds + 1),
        "{duplicates} duplicates in {rounds} rounds"
    );
    eprintln!(
        "crash harness: {rounds} rounds, {} events checked, {duplicates} redelivered, final RV {final_rv}",
        expected.len()
    );
}
