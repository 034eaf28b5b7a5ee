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
//! changing through every repetition of both. Client-go's SharedIndexInformer for ConfigMaps
//! (the Go peer of `benches/peers`, built by `scripts/build-peers`; `ENVTEST_RESTART_CLIENT_GO=0`
//! leaves it out) does the same relist in each repetition: a new informer, `start` until its
//! store and handler report synced. Prints medians and the ratios, and writes
//! `target/bench-results/envtest_restart-<version>.json`.

#[path = "../tests/common/churn.rs"]
mod churn;
#[path = "../tests/envtest/mod.rs"]
mod envtest;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
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

/// client-go's informer in the Go peer, driven over its line protocol (docs/bench/peers.md).
struct ClientGo {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl ClientGo {
    fn spawn(kubeconfig: &Path) -> Res<Self> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/build-peers");
        let out = Command::new("bash").arg(&script).stderr(Stdio::inherit()).output()?;
        let printed = String::from_utf8_lossy(&out.stdout);
        let bin = printed
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix("PEER="))
            .filter(|_| out.status.success())
            .ok_or_else(|| format!("{} failed ({}): {}", script.display(), out.status, printed.trim()))?;
        let mut child = Command::new(bin)
            .args(["-system", "client-go", "-resource", "configmaps", "-kubeconfig"])
            .arg(kubeconfig)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let stdin = child.stdin.take().ok_or("peer: no stdin")?;
        let stdout = BufReader::new(child.stdout.take().ok_or("peer: no stdout")?);
        let mut peer = Self { child, stdin, stdout };
        let hello = peer.line()?;
        eprintln!("client-go peer: {}", hello.trim_start_matches("hello "));
        Ok(peer)
    }

    /// The next reply (event lines are off: `report` is never turned on).
    fn line(&mut self) -> Res<String> {
        let mut l = String::new();
        if self.stdout.read_line(&mut l)? == 0 {
            return Err("client-go peer exited".into());
        }
        Ok(l.trim_end().to_owned())
    }

    fn call(&mut self, command: &str) -> Res<String> {
        writeln!(self.stdin, "{command}")?;
        self.stdin.flush()?;
        let reply = self.line()?;
        if !reply.starts_with("ok ") {
            return Err(format!("client-go peer, {command}: {reply}").into());
        }
        Ok(reply)
    }

    /// A new informer until its store and handler are synced; the time and the objects.
    fn relist(&mut self) -> Res<(f64, usize)> {
        let t = Instant::now();
        self.call("start")?;
        let synced = self.call("synced")?;
        let secs = t.elapsed().as_secs_f64();
        self.call("stop")?;
        let objects = synced
            .split_whitespace()
            .nth(2)
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        Ok((secs, objects))
    }
}

impl Drop for ClientGo {
    /// `quit`, up to 5 s to exit, then a kill: the peer never outlives the bench.
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "quit");
        let _ = self.stdin.flush();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
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
    let mut client_go = match std::env::var("ENVTEST_RESTART_CLIENT_GO").as_deref() {
        Ok("0") => None,
        _ => {
            let kubeconfig = env.kubeconfig(envtest::ADMIN);
            let peer = tokio::task::spawn_blocking(move || ClientGo::spawn(&kubeconfig)).await??;
            Some(peer)
        }
    };
    // Let the Lease renewals move the cluster-wide RV past the ConfigMaps' before measuring.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (mut ours, mut theirs, mut go) = (Vec::new(), Vec::new(), Vec::new());
    for rep in 1..=reps {
        let (secs, lists, restored) = ours_once(&env, &path).await?;
        if lists != 0 || !restored {
            return Err(format!("repetition {rep}: ours listed ({lists}) or was not restored").into());
        }
        let (their_secs, objects) = theirs_once(&env).await?;
        let go_secs = match client_go.take() {
            Some(mut peer) => {
                let (done, peer) = tokio::task::spawn_blocking(move || (peer.relist(), peer)).await?;
                client_go = Some(peer);
                let (go_secs, go_objects) = done?;
                if go_objects != objects {
                    return Err(format!("client-go listed {go_objects} objects, kube-runtime {objects}").into());
                }
                go.push(go_secs);
                format!(", client-go {:.1} ms", go_secs * 1e3)
            }
            None => String::new(),
        };
        eprintln!(
            "repetition {rep}/{reps}: ours {:.1} ms, kube-runtime {:.1} ms{go_secs} ({objects} objects)",
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
    let g = (!go.is_empty()).then(|| median(&go));
    if let Some(g) = g {
        println!("| client-go (full relist) | {:.1} | {} |", g * 1e3, range(&go));
    }
    println!("ratio ours / kube-runtime: {:.3}", o / th);
    if let Some(g) = g {
        println!("ratio ours / client-go: {:.3}", o / g);
    }
    drop(client_go);
    let out = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bench-results");
    std::fs::create_dir_all(&out)?;
    std::fs::write(
        out.join(format!("envtest_restart-{}.json", server.version())),
        serde_json::to_vec_pretty(&serde_json::json!({
            "server": server.version(), "configmaps": n, "leaseRenewalsPerSecond": hz, "renewals": renewals,
            "oursSeconds": ours, "theirsSeconds": theirs,
            "oursMedian": o, "theirsMedian": th, "ratio": o / th,
            "clientGoSeconds": go, "clientGoMedian": g, "ratioClientGo": g.map(|g| o / g),
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
