//! Restart → synced against a real kube-apiserver + etcd (the envtest builds) while another
//! resource changes, against kube-runtime's full relist of the same ConfigMaps, in one run
//! (issues #25 and #34).
//!
//! `cargo bench --bench envtest_restart` (needs `scripts/envtest-install`; without the binaries
//! it says so and exits 0). `ENVTEST_RESTART_SERVER` picks the server (`v1.37.2`, the default,
//! or `v1.20.2`), `ENVTEST_RESTART_N` sets the number of ConfigMaps (default 20,000),
//! `ENVTEST_RESTART_REPS` the repetitions (default 7), `ENVTEST_RESTART_LEASE_HZ` how often the
//! Lease in another namespace is renewed (default 20/s; 0 turns the churn off).
//!
//! Each repetition of ours opens the database the first sync left, builds the informer, starts
//! it and waits for `wait_for_sync` (in this process: the figure holds the open, the two
//! probes, the resumed watch and the sync decision, not a process start). Each repetition of
//! theirs runs `reflector(watcher(Api::<ConfigMap>::all))` until `InitDone`. The Lease keeps
//! changing through every repetition of both. Prints medians and the ratio, and writes
//! `target/bench-results/envtest_restart-<version>.json`.

#[path = "../tests/common/churn.rs"]
mod churn;
#[path = "../tests/envtest/mod.rs"]
mod envtest;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use churn::LeaseChurn;
use durable_informer::informer::Informer;
use durable_informer::source::KubeSource;
use durable_informer::store::{DurableStore, StoreConfig};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, PostParams};
use kube::runtime::{reflector, watcher};

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const NS: &str = "bench";

fn env_u64(name: &str, default: u64) -> Res<u64> {
    match std::env::var(name) {
        Ok(v) => Ok(v.parse()?),
        Err(_) => Ok(default),
    }
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s[s.len() / 2]
}

async fn create_configmaps(client: &kube::Client, n: u64) -> Res<()> {
    let ns: Api<Namespace> = Api::all(client.clone());
    let namespace: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": NS}}))?;
    ns.create(&PostParams::default(), &namespace).await?;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    let results: Vec<Res<()>> = futures::stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            async move {
                let cm: ConfigMap = serde_json::from_value(serde_json::json!({
                    "metadata": {"name": format!("cm-{i:06}"), "labels": {"app": format!("a{}", i % 10)}},
                    "data": {"value": "x".repeat(200)}
                }))?;
                api.create(&PostParams::default(), &cm).await?;
                Ok(())
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    results.into_iter().collect()
}

async fn open(path: &Path) -> Res<DurableStore> {
    let p = path.to_owned();
    Ok(tokio::task::spawn_blocking(move || DurableStore::open(StoreConfig::new(p))).await??)
}

/// Opens the database, builds and starts the informer, waits for sync; returns the time and
/// the reflector's LIST count.
async fn ours_once(env: &envtest::EnvTest, path: &Path) -> Res<(f64, u64, bool)> {
    let client = env.client().await;
    let t = Instant::now();
    let db = open(path).await?;
    let informer = Informer::<ConfigMap>::builder(&db, KubeSource::typed::<ConfigMap>(client, &env.url()))
        .build()
        .await?;
    informer.start();
    tokio::time::timeout(Duration::from_secs(120), informer.wait_for_sync()).await??;
    let secs = t.elapsed().as_secs_f64();
    let status = informer.status().borrow().clone();
    informer.shutdown().await?;
    drop(informer);
    tokio::task::spawn_blocking(move || db.close()).await??;
    Ok((secs, status.lists, status.restored))
}

/// kube-runtime's reflector from nothing until `InitDone`; returns the time and the objects.
async fn theirs_once(env: &envtest::EnvTest) -> Res<(f64, usize)> {
    let api: Api<ConfigMap> = Api::all(env.client().await);
    let t = Instant::now();
    let (store, writer) = reflector::store::<ConfigMap>();
    let stream = reflector::reflector(writer, watcher(api, watcher::Config::default()));
    let mut stream = std::pin::pin!(stream);
    while let Some(ev) = stream.next().await {
        if let watcher::Event::InitDone = ev? {
            break;
        }
    }
    Ok((t.elapsed().as_secs_f64(), store.state().len()))
}

/// The server named by `ENVTEST_RESTART_SERVER` (default v1.37.2).
fn server() -> Res<envtest::Server> {
    let want = std::env::var("ENVTEST_RESTART_SERVER").unwrap_or_else(|_| "v1.37.2".into());
    envtest::Server::ALL
        .into_iter()
        .find(|s| s.version() == want)
        .ok_or_else(|| format!("ENVTEST_RESTART_SERVER={want}: one of {:?}", envtest::Server::ALL).into())
}

async fn run(server: envtest::Server) -> Res<()> {
    let n = env_u64("ENVTEST_RESTART_N", 20_000)?;
    let reps = env_u64("ENVTEST_RESTART_REPS", 7)?.max(1);
    let hz = env_u64("ENVTEST_RESTART_LEASE_HZ", 20)?;
    let env = envtest::EnvTest::start(server).await;
    let client = env.client().await;
    let t = Instant::now();
    create_configmaps(&client, n).await?;
    eprintln!("{n} ConfigMaps created in {:.1?}", t.elapsed());
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("restart.redb");
    let (first, lists, _) = ours_once(&env, &path).await?;
    eprintln!("ours: first sync {first:.2} s ({lists} list)");
    let ns: Api<Namespace> = Api::all(client.clone());
    let namespace: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": "churn"}}))?;
    ns.create(&PostParams::default(), &namespace).await?;
    let churn = match 1000u64.checked_div(hz) {
        Some(ms) => Some(LeaseChurn::start(client.clone(), "churn", Duration::from_millis(ms)).await?),
        None => None,
    };
    // Let the Lease renewals move the cluster-wide RV past the ConfigMaps' before measuring.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for rep in 1..=reps {
        let (secs, lists, restored) = ours_once(&env, &path).await?;
        if lists != 0 || !restored {
            return Err(format!("repetition {rep}: ours listed ({lists}) or was not restored").into());
        }
        let (their_secs, objects) = theirs_once(&env).await?;
        eprintln!(
            "repetition {rep}/{reps}: ours {:.1} ms, kube-runtime {:.1} ms ({objects} objects)",
            secs * 1e3,
            their_secs * 1e3
        );
        ours.push(secs);
        theirs.push(their_secs);
    }
    let renewals = match churn {
        Some(c) => c.stop().await?,
        None => 0,
    };
    let (o, th) = (median(&ours), median(&theirs));
    let range = |v: &[f64]| {
        let (lo, hi) = v.iter().fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(*x), b.max(*x)));
        format!("{:.1}–{:.1}", lo * 1e3, hi * 1e3)
    };
    println!(
        "restart → synced, {n} ConfigMaps, {server}, a Lease renewed {hz}/s ({renewals} renewals), {reps} repetitions"
    );
    println!("| system | median (ms) | min–max (ms) |");
    println!("|---|---|---|");
    println!("| durable-informer (resume) | {:.1} | {} |", o * 1e3, range(&ours));
    println!("| kube-runtime (full relist) | {:.1} | {} |", th * 1e3, range(&theirs));
    println!("ratio ours / theirs: {:.3}", o / th);
    let out = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bench-results");
    std::fs::create_dir_all(&out)?;
    std::fs::write(
        out.join(format!("envtest_restart-{}.json", server.version())),
        serde_json::to_vec_pretty(&serde_json::json!({
            "server": server.version(), "configmaps": n, "leaseRenewalsPerSecond": hz, "renewals": renewals,
            "oursSeconds": ours, "theirsSeconds": theirs,
            "oursMedian": o, "theirsMedian": th, "ratio": o / th,
        }))?,
    )?;
    Ok(())
}

fn main() -> Res<()> {
    // `cargo test --benches` and `cargo bench -- --list` run this with arguments: do nothing.
    if std::env::args().any(|a| a == "--list" || a == "--test") {
        return Ok(());
    }
    let server = server()?;
    if !envtest::Binaries::installed(server) {
        println!("envtest_restart: skipped (no {server} binaries: run scripts/envtest-install)");
        return Ok(());
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(run(server))
}
