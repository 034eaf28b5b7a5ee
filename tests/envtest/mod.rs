//! A real etcd and kube-apiserver for the end-to-end tests (`tests/envtest_*.rs`), one of
//! each [`Server`] `scripts/envtest-install` builds: v1.20.2 (the oldest supported, from
//! Debian's packages) and v1.37.2 (from the Go module proxy).
//!
//! Every test runs against each server in turn: [`on_servers!`] turns `async fn name(server:
//! Server)` into the tests `name::v1_20_2` and `name::v1_37_2` (or only the servers named), so
//! a failure names its server, and `-- ::v1_37_2` runs one server's tests.
//!
//! [`EnvTest::start`] picks free loopback ports, makes fresh certificates (openssl), a token
//! file and an etcd data directory in a temporary directory, starts etcd and kube-apiserver,
//! waits for `/readyz`, checks that `/version` is the server asked for, and hands out
//! `kube::Client`s. Dropping it kills and reaps both processes; they also get `SIGKILL` if the
//! test process dies (`setpriv --pdeathsig`).
//!
//! The binaries are `<version>/bin/{kube-apiserver,etcd,etcdctl}` in
//! `${DURABLE_INFORMER_ENVTEST_DIR:-$HOME/.cache/durable-informer-envtest}`.
#![allow(dead_code)] // each test file uses a part of it

use std::fmt::Write as _;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rand::Rng;

/// A kube-apiserver version the tests run against, with the etcd of its time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Server {
    /// kube-apiserver v1.20.2 + etcd 3.4.23 (Debian bookworm): the oldest supported. No
    /// streaming lists, no `shardSelector`, a watch cache whose revision moves only with the
    /// resource's own events.
    V1_20_2,
    /// kube-apiserver v1.37.2 + etcd 3.7.3: consistent reads from the cache (always on since
    /// 1.34's GA), streaming lists (`WatchList`, on), KEP-5866 sharded list/watch (alpha, the
    /// `ShardedListAndWatch` gate off unless [`Options::feature_gates`] turns it on).
    V1_37_2,
}

impl Server {
    /// Every server, oldest first.
    pub const ALL: [Server; 2] = [Server::V1_20_2, Server::V1_37_2];

    /// `v1.20.2`, as `/version` reports it and the cache directory is named.
    pub fn version(self) -> &'static str {
        match self {
            Server::V1_20_2 => "v1.20.2",
            Server::V1_37_2 => "v1.37.2",
        }
    }

    /// The server of a test case name (`v1_20_2`), as [`on_servers!`] names them.
    pub fn from_case(case: &str) -> Self {
        Self::ALL
            .into_iter()
            .find(|s| s.version().replace('.', "_") == case)
            .unwrap_or_else(|| panic!("no envtest server {case}: one of {:?}", Self::ALL))
    }

    /// Whether the server serves streaming lists (`sendInitialEvents`, KEP-3157).
    pub fn streams_lists(self) -> bool {
        self >= Server::V1_37_2
    }
}

impl std::fmt::Display for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "kube-apiserver {}", self.version())
    }
}

/// Declares the tests of `async fn $test(server: Server)`: one per server, `$test::v1_20_2`
/// and `$test::v1_37_2`, or only the cases listed after a colon (`on_servers!(name: v1_37_2)`).
#[allow(unused_macros)] // benches include this module without tests
macro_rules! on_servers {
    ($test:ident) => {
        $crate::envtest::on_servers!($test: v1_20_2, v1_37_2);
    };
    ($test:ident: $($case:ident),+ $(,)?) => {
        mod $test {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                #[ignore = "needs the envtest servers: scripts/envtest-install"]
                async fn $case() {
                    super::$test($crate::envtest::Server::from_case(stringify!($case))).await
                }
            )+
        }
    };
}
#[allow(unused_imports)] // benches include this module without tests
pub(crate) use on_servers;

/// The user of [`EnvTest::client`]; [`EnvTest::client_as`] accepts the others in
/// [`USERS`]. All are in `system:masters` (authorization is `AlwaysAllow` anyway); separate
/// users let a test tell an informer's requests apart from its own in the audit log.
pub const ADMIN: &str = "envtest-admin";
/// Users with a token.
pub const USERS: [&str; 3] = [ADMIN, "informer", "controller"];

/// How to run the apiserver.
#[derive(Debug, Clone)]
pub struct Options {
    /// `--etcd-compaction-interval` (the apiserver's default is 5 minutes).
    pub compaction_interval: Option<Duration>,
    /// `--watch-cache` (default true). Off, a watch from a compacted RV reaches etcd and gets
    /// its 410 at once; on, the watch cache answers from its own window.
    pub watch_cache: bool,
    /// `--feature-gates` entries (`ShardedListAndWatch=true`); for v1.37.2 only.
    pub feature_gates: Vec<String>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            compaction_interval: None,
            watch_cache: true,
            feature_gates: Vec::new(),
        }
    }
}

/// Paths of the binaries.
#[derive(Debug, Clone)]
pub struct Binaries {
    pub kube_apiserver: PathBuf,
    pub etcd: PathBuf,
    pub etcdctl: PathBuf,
    /// Restores snapshots where etcdctl no longer does (etcd 3.6 on); `None` for etcd 3.4.
    pub etcdutl: Option<PathBuf>,
}

impl Binaries {
    /// The cache root of `scripts/envtest-install`.
    fn cache() -> PathBuf {
        std::env::var_os("DURABLE_INFORMER_ENVTEST_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
                    .join(".cache/durable-informer-envtest")
            })
    }

    /// Where `server`'s binaries are expected.
    fn expected(server: Server) -> (PathBuf, Self) {
        let dir = Self::cache().join(server.version()).join("bin");
        let bins = Self {
            kube_apiserver: dir.join("kube-apiserver"),
            etcd: dir.join("etcd"),
            etcdctl: dir.join("etcdctl"),
            etcdutl: (server >= Server::V1_37_2).then(|| dir.join("etcdutl")),
        };
        (dir, bins)
    }

    /// Whether every binary of `server` is installed (benches skip themselves when not).
    pub fn installed(server: Server) -> bool {
        let (_, b) = Self::expected(server);
        let paths: Vec<&PathBuf> = [&b.kube_apiserver, &b.etcd, &b.etcdctl]
            .into_iter()
            .chain(&b.etcdutl)
            .collect();
        paths.iter().all(|p| p.exists())
    }

    /// `server`'s binaries; panics with how to install them.
    pub fn find(server: Server) -> Self {
        let (dir, bins) = Self::expected(server);
        for p in [&bins.kube_apiserver, &bins.etcd, &bins.etcdctl]
            .into_iter()
            .chain(&bins.etcdutl)
        {
            assert!(
                p.exists(),
                "{} of {server} not found in {}: run scripts/envtest-install first",
                p.file_name().unwrap_or_default().to_string_lossy(),
                dir.display()
            );
        }
        bins
    }
}

/// A running etcd + kube-apiserver pair.
pub struct EnvTest {
    server: Server,
    dir: tempfile::TempDir,
    bins: Binaries,
    options: Options,
    etcd_port: u16,
    peer_port: u16,
    secure_port: u16,
    /// The etcd data directory in use (changes after a restore).
    data_dir: PathBuf,
    etcd: Option<Child>,
    apiserver: Option<Child>,
    /// How many times the pair was started (log files are numbered by it).
    generation: u32,
}

impl std::fmt::Debug for EnvTest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the tokens.
        f.debug_struct("EnvTest")
            .field("server", &self.server)
            .field("url", &self.url())
            .field("etcd", &self.etcd_url())
            .field("dir", &self.dir.path())
            .finish_non_exhaustive()
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free loopback port")
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Runs `program` so that it is killed when this process dies.
fn command(program: &Path) -> Command {
    if Path::new("/usr/bin/setpriv").exists() {
        let mut c = Command::new("/usr/bin/setpriv");
        c.arg("--pdeathsig").arg("KILL").arg("--").arg(program);
        c
    } else {
        Command::new(program)
    }
}

fn stop_child(child: &mut Option<Child>) {
    if let Some(mut c) = child.take() {
        let _ = c.kill();
        let _ = c.wait();
    }
}

impl EnvTest {
    /// Starts a fresh cluster of `server` with default options.
    pub async fn start(server: Server) -> Self {
        Self::start_with(server, Options::default()).await
    }

    /// Starts a fresh cluster of `server`.
    pub async fn start_with(server: Server, options: Options) -> Self {
        assert!(
            options.feature_gates.is_empty() || server >= Server::V1_37_2,
            "feature gates are for v1.37.2 only"
        );
        let bins = Binaries::find(server);
        let dir = tempfile::Builder::new()
            .prefix("envtest-")
            .tempdir()
            .expect("temporary directory");
        let mut env = Self {
            server,
            data_dir: dir.path().join("etcd"),
            dir,
            bins,
            options,
            etcd_port: 0,
            peer_port: 0,
            secure_port: 0,
            etcd: None,
            apiserver: None,
            generation: 0,
        };
        env.write_credentials();
        for attempt in 1..=3 {
            env.etcd_port = free_port();
            env.peer_port = free_port();
            env.secure_port = free_port();
            match env.launch().await {
                Ok(()) => {
                    eprintln!("envtest: {server} at {} ({})", env.url(), env.dir.path().display());
                    return env;
                }
                Err(e) if attempt < 3 => {
                    eprintln!("envtest: {server}: start attempt {attempt} failed, retrying on other ports: {e}");
                    env.stop();
                    let _ = std::fs::remove_dir_all(&env.data_dir);
                }
                Err(e) => panic!("envtest: cannot start etcd + {server}: {e}"),
            }
        }
        unreachable!()
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Certificates (CA, serving certificate for 127.0.0.1, service-account key), tokens,
    /// the audit policy, and a kubeconfig per user.
    fn write_credentials(&self) {
        let p = |n: &str| self.path(n);
        let ossl = || {
            let mut c = Command::new("openssl");
            c.current_dir(self.dir.path());
            c
        };
        run(ossl()
            .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2"])
            .args(["-subj", "/CN=envtest-ca", "-keyout", "ca.key", "-out", "ca.crt"]));
        run(ossl()
            .args(["req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1"])
            .args(["-keyout", "server.key", "-out", "server.csr"]));
        std::fs::write(
            p("server.ext"),
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n\
             extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n",
        )
        .unwrap();
        run(ossl()
            .args(["x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key"])
            .args([
                "-CAcreateserial",
                "-days",
                "2",
                "-extfile",
                "server.ext",
                "-out",
                "server.crt",
            ]));
        run(ossl().args(["genrsa", "-out", "sa.key", "2048"]));
        run(ossl().args(["rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub"]));

        let mut tokens = String::new();
        let mut rng = rand::rng();
        for user in USERS {
            let token = format!("{:032x}", rng.random::<u128>());
            writeln!(tokens, "{token},{user},{user},system:masters").unwrap();
            // A kubeconfig per user: what a user of the library would point it at.
            let kubeconfig = format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: envtest\n  cluster:\n    server: {url}\n    certificate-authority: {ca}\n\
                 users:\n- name: {user}\n  user:\n    token: {token}\ncontexts:\n- name: envtest\n  context:\n    cluster: envtest\n    user: {user}\n\
                 current-context: envtest\n",
                url = self.url(),
                ca = p("ca.crt").display(),
            );
            write_private(&p(&format!("kubeconfig-{user}")), &kubeconfig);
        }
        write_private(&p("tokens.csv"), &tokens);
        std::fs::write(
            p("audit-policy.yaml"),
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [\"RequestReceived\"]\nrules:\n\
             - level: Metadata\n  verbs: [\"list\", \"watch\"]\n- level: None\n",
        )
        .unwrap();
    }

    /// Starts etcd, then kube-apiserver, and waits until it is ready.
    async fn launch(&mut self) -> Result<(), String> {
        self.generation += 1;
        // The kubeconfigs name the server URL: rewrite them for the ports of this attempt.
        self.rewrite_kubeconfigs();
        let g = self.generation;
        let dir = self.dir.path().to_owned();
        let log = |name: &str| std::fs::File::create(dir.join(format!("{name}-{g}.log"))).expect("log file");
        let etcd_log = self.path(&format!("etcd-{g}.log"));
        let api_log = self.path(&format!("kube-apiserver-{g}.log"));
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let mut etcd = command(&self.bins.etcd);
        etcd.arg("--name=default")
            .arg(format!("--data-dir={}", self.data_dir.display()))
            .arg(format!("--listen-client-urls={}", self.etcd_url()))
            .arg(format!("--advertise-client-urls={}", self.etcd_url()))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=default={peer}"))
            .arg("--log-level=warn")
            .stdin(Stdio::null())
            .stdout(log("etcd-out"))
            .stderr(log("etcd"));
        self.etcd = Some(etcd.spawn().map_err(|e| format!("etcd: {e}"))?);

        let mut api = command(&self.bins.kube_apiserver);
        let p = |n: &str| self.path(n).display().to_string();
        api.arg(format!("--etcd-servers={}", self.etcd_url()))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--secure-port={}", self.secure_port))
            .arg(format!("--cert-dir={}", p("cert-dir")))
            .arg(format!("--tls-cert-file={}", p("server.crt")))
            .arg(format!("--tls-private-key-file={}", p("server.key")))
            .arg(format!("--client-ca-file={}", p("ca.crt")))
            .arg(format!("--token-auth-file={}", p("tokens.csv")))
            .arg("--authorization-mode=AlwaysAllow")
            .arg(format!("--service-account-key-file={}", p("sa.pub")))
            .arg(format!("--service-account-signing-key-file={}", p("sa.key")))
            .arg("--service-account-issuer=https://kubernetes.default.svc.cluster.local")
            .arg("--service-cluster-ip-range=10.0.0.0/24")
            .arg("--endpoint-reconciler-type=none")
            .arg("--disable-admission-plugins=ServiceAccount")
            .arg(format!("--audit-log-path={}", p("audit.log")))
            .arg(format!("--audit-policy-file={}", p("audit-policy.yaml")))
            .arg(format!("--watch-cache={}", self.options.watch_cache))
            .stdin(Stdio::null())
            .stdout(log("kube-apiserver-out"))
            .stderr(log("kube-apiserver"));
        if let Some(i) = self.options.compaction_interval {
            api.arg(format!("--etcd-compaction-interval={}s", i.as_secs().max(1)));
        }
        match self.server {
            // Removed in v1.24; v1.20 serves plain HTTP on 8080 without it.
            Server::V1_20_2 => {
                api.arg("--insecure-port=0");
            }
            Server::V1_37_2 => {
                if !self.options.feature_gates.is_empty() {
                    api.arg(format!("--feature-gates={}", self.options.feature_gates.join(",")));
                }
            }
        }
        self.apiserver = Some(api.spawn().map_err(|e| format!("kube-apiserver: {e}"))?);

        let deadline = Instant::now() + Duration::from_secs(90);
        let client = self.client().await;
        loop {
            for (name, child, log) in [
                ("etcd", &mut self.etcd, &etcd_log),
                ("kube-apiserver", &mut self.apiserver, &api_log),
            ] {
                if let Some(st) = child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                    return Err(format!("{name} exited with {st}:\n{}", tail(log, 30)));
                }
            }
            let req = http::Request::get("/readyz").body(Vec::new()).unwrap();
            if let Ok(body) = client.request_text(req).await {
                if body.trim() == "ok" {
                    let info = client.apiserver_version().await.map_err(|e| format!("/version: {e}"))?;
                    if info.git_version != self.server.version() {
                        return Err(format!(
                            "{} is {}, not {}: run scripts/envtest-install",
                            self.bins.kube_apiserver.display(),
                            info.git_version,
                            self.server.version()
                        ));
                    }
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                return Err(format!("{} not ready after 90 s:\n{}", self.server, tail(&api_log, 30)));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    fn rewrite_kubeconfigs(&self) {
        for user in USERS {
            let path = self.path(&format!("kubeconfig-{user}"));
            let text = std::fs::read_to_string(&path).unwrap();
            let text: String = text
                .lines()
                .map(|l| {
                    if l.trim_start().starts_with("server: ") {
                        format!("    server: {}\n", self.url())
                    } else {
                        format!("{l}\n")
                    }
                })
                .collect();
            write_private(&path, &text);
        }
    }

    /// The server version this cluster runs.
    pub fn server(&self) -> Server {
        self.server
    }

    /// The value of the apiserver's `kubernetes_feature_enabled` metric for `gate` (`None`
    /// where the server has no such metric or gate: v1.20 has neither).
    pub async fn feature_enabled(&self, gate: &str) -> Option<bool> {
        let want = format!("kubernetes_feature_enabled{{name=\"{gate}\"");
        self.metrics()
            .await
            .lines()
            .find(|l| l.starts_with(&want))
            .and_then(|l| l.rsplit(' ').next())
            .map(|v| v.trim() == "1")
    }

    /// The apiserver's `/metrics` text.
    pub async fn metrics(&self) -> String {
        let req = http::Request::get("/metrics").body(Vec::new()).unwrap();
        self.client()
            .await
            .request_text(req)
            .await
            .unwrap_or_else(|e| panic!("{}: /metrics: {e}", self.server))
    }

    /// The sum of the samples of metric `name` whose labels contain every `labels` pair
    /// (`resource="configmaps"`), from `/metrics`.
    pub async fn metric_sum(&self, name: &str, labels: &[&str]) -> f64 {
        self.metrics()
            .await
            .lines()
            .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
            .filter(|l| labels.iter().all(|want| l.contains(want)))
            .filter_map(|l| l.rsplit(' ').next()?.trim().parse::<f64>().ok())
            .sum()
    }

    /// `https://127.0.0.1:PORT` (the cluster URL, part of the cluster identity).
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.secure_port)
    }

    fn etcd_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.etcd_port)
    }

    /// The kubeconfig file of `user` (one of [`USERS`]).
    pub fn kubeconfig(&self, user: &str) -> PathBuf {
        assert!(USERS.contains(&user), "no such envtest user: {user}");
        self.path(&format!("kubeconfig-{user}"))
    }

    /// A client as `user`: the generated CA is the only root, the token authenticates.
    pub async fn client_as(&self, user: &str) -> kube::Client {
        let kc = kube::config::Kubeconfig::read_from(self.kubeconfig(user)).expect("kubeconfig");
        let opts = kube::config::KubeConfigOptions::default();
        let config = kube::Config::from_custom_kubeconfig(kc, &opts)
            .await
            .expect("kube config");
        assert!(!config.accept_invalid_certs);
        kube::Client::try_from(config).expect("kube client")
    }

    /// A client as [`ADMIN`].
    pub async fn client(&self) -> kube::Client {
        self.client_as(ADMIN).await
    }

    /// The apiserver's audit log (list and watch requests), one JSON object per request, in
    /// the order they first appear. A watch may be logged at several stages (v1.37 logs
    /// `ResponseStarted` and `ResponseComplete`); only its first entry is kept.
    pub fn audit_events(&self) -> Vec<serde_json::Value> {
        let mut seen = std::collections::HashSet::new();
        std::fs::read_to_string(self.path("audit.log"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|e| seen.insert(e["auditID"].as_str().unwrap_or_default().to_owned()))
            .collect()
    }

    fn etcdctl(&self) -> Command {
        let mut c = Command::new(&self.bins.etcdctl);
        c.env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.etcd_url()));
        c
    }

    /// Saves an etcd snapshot (a backup of the whole cluster) to `file` in the temp directory.
    pub fn snapshot(&self, name: &str) -> PathBuf {
        let file = self.path(name);
        run(self.etcdctl().arg("snapshot").arg("save").arg(&file));
        file
    }

    /// Stops both processes, restores etcd from `snapshot` into a fresh data directory and
    /// starts both again on the same ports: the same cluster (kube-system UID, URL), but its
    /// resourceVersion went back to the snapshot's.
    pub async fn restore(&mut self, snapshot: &Path) {
        self.stop();
        let data_dir = self.path(&format!("etcd-restored-{}", self.generation));
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let mut restore = match &self.bins.etcdutl {
            Some(etcdutl) => Command::new(etcdutl),
            None => {
                let mut c = Command::new(&self.bins.etcdctl);
                c.env("ETCDCTL_API", "3");
                c
            }
        };
        run(restore
            .arg("snapshot")
            .arg("restore")
            .arg(snapshot)
            .arg(format!("--data-dir={}", data_dir.display()))
            .arg("--name=default")
            .arg(format!("--initial-cluster=default={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}")));
        self.data_dir = data_dir;
        if let Err(e) = self.launch().await {
            panic!("envtest: {}: restart after restore failed: {e}", self.server);
        }
    }

    /// Stops both processes and starts them again on the same ports and data: the same
    /// cluster after a restart (the watch caches start anew at the current RV).
    pub async fn restart(&mut self) {
        self.stop();
        if let Err(e) = self.launch().await {
            panic!("envtest: {}: restart failed: {e}", self.server);
        }
    }

    /// Stops kube-apiserver and etcd (kill, then reap).
    pub fn stop(&mut self) {
        stop_child(&mut self.apiserver);
        stop_child(&mut self.etcd);
    }
}

impl Drop for EnvTest {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            // Keep what explains the failure, not the credentials.
            let _ = std::fs::remove_file(self.path("tokens.csv"));
            for user in USERS {
                let _ = std::fs::remove_file(self.path(&format!("kubeconfig-{user}")));
            }
            let dir = std::mem::replace(&mut self.dir, tempfile::tempdir().unwrap()).keep();
            eprintln!("envtest: {}: logs kept in {}", self.server, dir.display());
        }
    }
}

fn write_private(path: &Path, text: &str) {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .expect("write file");
    f.write_all(text.as_bytes()).expect("write file");
}

/// Polls `f` every 100 ms until it returns `Some`, for at most `secs` seconds.
pub async fn eventually<T>(what: &str, secs: u64, mut f: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out after {secs} s waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
