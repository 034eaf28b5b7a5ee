//! A client nobody here wrote — `kubectl` — works against the simulated API server through the
//! kubeconfig it writes, with every kubectl `scripts/install-kubectl` installs (v1.20.2 and the
//! newest Debian has, from Debian's packages; v1.37.2, built from the Go module proxy): get,
//! create from manifests and with the generators (which send protobuf), apply (client- and
//! server-side), edit, label, scale, rollout status, get --watch and delete.
//!
//! The kubectl binaries are `<dir>/<version>/kubectl` in
//! `${DURABLE_INFORMER_KUBECTL_DIR:-$HOME/.cache/durable-informer-kubectl}`, or the paths listed
//! (colon-separated) in `DURABLE_INFORMER_KUBECTL`. Run with `--ignored` and none found, the
//! tests fail: they never pass silently.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use durable_informer::sim::{Sim, SimConfig};
use serde_json::{json, Value};

/// Every kubectl to test with, and its version line.
fn kubectls() -> Vec<(PathBuf, String)> {
    let mut paths: Vec<PathBuf> = match std::env::var_os("DURABLE_INFORMER_KUBECTL") {
        Some(list) => std::env::split_paths(&list).collect(),
        None => {
            let dir = std::env::var_os("DURABLE_INFORMER_KUBECTL_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| {
                    PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
                        .join(".cache/durable-informer-kubectl")
                });
            std::fs::read_dir(&dir)
                .map(|entries| {
                    entries
                        .filter_map(Result::ok)
                        .map(|e| e.path().join("kubectl"))
                        .filter(|p| p.is_file())
                        .collect()
                })
                .unwrap_or_default()
        }
    };
    paths.sort();
    assert!(
        !paths.is_empty(),
        "no kubectl found (DURABLE_INFORMER_KUBECTL, or <version>/kubectl in DURABLE_INFORMER_KUBECTL_DIR or \
         ~/.cache/durable-informer-kubectl): run scripts/install-kubectl first"
    );
    paths
        .into_iter()
        .map(|p| {
            eprintln!("kubectl: {}", p.display());
            let out = Command::new(&p)
                .args(["version", "--client"])
                .output()
                .unwrap_or_else(|e| panic!("{} does not run: {e}", p.display()));
            let version = String::from_utf8_lossy(&out.stdout)
                .lines()
                .next()
                .unwrap_or("?")
                .to_string();
            (p, version)
        })
        .collect()
}

/// One kubectl against one sim.
struct Kubectl<'a> {
    bin: &'a Path,
    version: &'a str,
    kubeconfig: PathBuf,
}

impl Kubectl<'_> {
    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(self.bin);
        cmd.env("KUBECONFIG", &self.kubeconfig)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    }

    fn run(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let mut cmd = self.command(args);
        if stdin.is_some() {
            cmd.stdin(Stdio::piped());
        }
        let mut child = cmd.spawn().expect("kubectl runs");
        if let Some(text) = stdin {
            use std::io::Write;
            child
                .stdin
                .take()
                .expect("stdin")
                .write_all(text.as_bytes())
                .expect("write stdin");
        }
        child.wait_with_output().expect("kubectl output")
    }

    fn ok(&self, args: &[&str], stdin: Option<&str>) -> String {
        let out = self.run(args, stdin);
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "{}: kubectl {args:?} failed: {}\n{stdout}",
            self.version,
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    }

    /// `get --watch` running in the background.
    fn watch(&self, args: &[&str]) -> Child {
        let mut all = vec!["get", "--watch", "--request-timeout=30s"];
        all.extend_from_slice(args);
        self.command(&all).spawn().expect("watch")
    }
}

/// Stop a watch; its stdout and stderr.
fn stop(mut child: Child) -> (String, String) {
    let _ = child.kill();
    let out = child.wait_with_output().expect("watch output");
    (
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// The event types of `--output-watch-events -o json` output for one object.
fn events_of(out: &str, name: &str) -> Vec<String> {
    serde_json::Deserializer::from_str(out)
        .into_iter::<Value>()
        .map_while(Result::ok)
        .filter(|e| e["object"]["metadata"]["name"] == name)
        .map(|e| e["type"].as_str().unwrap_or("?").to_string())
        .collect()
}

/// The event types the watch output `out` shows for `name`, after checking that the object
/// arrived first (`ADDED`) and left last (`DELETED`).
fn arrived_and_left(out: &str, err: &str, name: &str, v: &str) -> Vec<String> {
    let events = events_of(out, name);
    assert_eq!(
        events.first().map(String::as_str),
        Some("ADDED"),
        "{v}: watch of {name}: {out} stderr: {err}"
    );
    assert_eq!(
        events.last().map(String::as_str),
        Some("DELETED"),
        "{v}: watch of {name}: events {events:?} stderr: {err}"
    );
    events
}

fn start(dir: &Path) -> (Sim, PathBuf) {
    let sim = Sim::start(SimConfig::default()).expect("start");
    let kc = dir.join("kubeconfig");
    sim.write_kubeconfig(&kc).expect("kubeconfig");
    (sim, kc)
}

#[test]
#[ignore = "needs kubectl: scripts/install-kubectl"]
fn kubectl_gets_creates_labels_deletes_and_watches_pods_and_configmaps() {
    for (bin, version) in kubectls() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (sim, kubeconfig) = start(dir.path());
        let k = Kubectl {
            bin: &bin,
            version: &version,
            kubeconfig,
        };
        pods_and_configmaps(&sim, &k);
    }
}

fn pods_and_configmaps(sim: &Sim, k: &Kubectl) {
    let v = k.version;
    sim.create(
        "pods",
        Some("default"),
        json!({"metadata": {"name": "seed-pod", "labels": {"app": "seed"}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}, "status": {"phase": "Running"}}),
    )
    .expect("seed pod");

    // get (table and JSON)
    let table = k.ok(&["get", "pods"], None);
    assert!(table.contains("seed-pod"), "{v}: {table}");
    let list: Value = serde_json::from_str(&k.ok(&["get", "pods", "-o", "json"], None)).expect("json");
    assert_eq!(list["items"][0]["metadata"]["name"], "seed-pod", "{v}");

    // get --watch on both kinds, running while the rest happens; the ConfigMap watch prints
    // event types so the delete can be told apart from the add and the label change
    let cm_watch = k.watch(&["configmaps", "-o", "json", "--output-watch-events"]);
    let pod_watch = k.watch(&["pods", "-o", "name"]);
    std::thread::sleep(Duration::from_millis(500));

    // create (from a manifest on stdin), for both kinds
    let cm = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: from-kubectl\ndata:\n  k: v\n";
    assert!(k
        .ok(&["create", "-f", "-"], Some(cm))
        .contains("configmap/from-kubectl created"));
    let pod =
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: kpod\nspec:\n  containers:\n  - name: c\n    image: busybox\n";
    assert!(k.ok(&["create", "-f", "-"], Some(pod)).contains("pod/kpod created"));
    let stored = sim.get("configmaps", Some("default"), "from-kubectl").expect("stored");
    assert_eq!(stored["data"]["k"], "v", "{v}");

    // label
    k.ok(&["label", "configmap", "from-kubectl", "team=infra"], None);
    k.ok(&["label", "pod", "kpod", "app=web"], None);
    assert_eq!(
        sim.get("pods", Some("default"), "kpod").expect("pod")["metadata"]["labels"]["app"],
        "web",
        "{v}"
    );
    let selected = k.ok(&["get", "pods", "-l", "app=web", "-o", "name"], None);
    assert_eq!(selected.trim(), "pod/kpod", "{v}");
    let by_field = k.ok(
        &["get", "pods", "--field-selector", "status.phase=Running", "-o", "name"],
        None,
    );
    assert_eq!(by_field.trim(), "pod/seed-pod", "{v}");
    // a malformed selector is refused by the server with 400, as on a real one
    let bad = k.run(&["get", "pods", "-l", "app in web"], None);
    assert!(!bad.status.success(), "{v}");
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("unable to parse requirement"),
        "{v}: {}",
        String::from_utf8_lossy(&bad.stderr)
    );

    // delete
    k.ok(&["delete", "configmap", "from-kubectl"], None);
    k.ok(&["delete", "pod", "kpod", "--wait=false"], None);
    assert!(sim.get("configmaps", Some("default"), "from-kubectl").is_err(), "{v}");
    let pods = k.ok(&["get", "pods", "-o", "name"], None);
    assert_eq!(pods.trim(), "pod/seed-pod", "{v}");

    // the watches saw the configmap arrive and leave, and the pod arrive
    std::thread::sleep(Duration::from_millis(500));
    let (cm_seen, cm_err) = stop(cm_watch);
    let (pod_seen, pod_err) = stop(pod_watch);
    arrived_and_left(&cm_seen, &cm_err, "from-kubectl", v);
    let pod_lines: Vec<&str> = pod_seen.lines().collect();
    assert!(
        pod_lines.contains(&"pod/seed-pod") && pod_lines.contains(&"pod/kpod"),
        "{v}: pod watch output: {pod_seen:?} stderr: {pod_err}"
    );
    assert!(sim.counters().watch_requests >= 2, "{v}");
}

#[test]
#[ignore = "needs kubectl: scripts/install-kubectl"]
fn kubectl_generators_apply_edit_scale_and_rollout_work() {
    for (bin, version) in kubectls() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (sim, kubeconfig) = start(dir.path());
        let k = Kubectl {
            bin: &bin,
            version: &version,
            kubeconfig,
        };
        generators_and_apply(&sim, &k, dir.path());
    }
}

fn generators_and_apply(sim: &Sim, k: &Kubectl, dir: &Path) {
    let v = k.version;
    // The generators: current kubectl sends these bodies in protobuf.
    assert!(
        k.ok(&["create", "namespace", "x"], None)
            .contains("namespace/x created"),
        "{v}"
    );
    // (one watch per resource: kubectl watches a single resource type at a time)
    let cm_watch = k.watch(&["-n", "x", "configmaps", "-o", "json", "--output-watch-events"]);
    let deploy_watch = k.watch(&["-n", "x", "deployments", "-o", "json", "--output-watch-events"]);
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        k.ok(&["-n", "x", "create", "configmap", "c", "--from-literal=a=1"], None)
            .contains("configmap/c created"),
        "{v}"
    );
    assert_eq!(
        sim.get("configmaps", Some("x"), "c").expect("cm")["data"],
        json!({"a": "1"}),
        "{v}"
    );
    k.ok(
        &[
            "-n",
            "x",
            "create",
            "secret",
            "generic",
            "s",
            "--from-literal=p=hunter2",
        ],
        None,
    );
    assert_eq!(
        sim.get("secrets", Some("x"), "s").expect("secret")["data"]["p"],
        "aHVudGVyMg==",
        "{v}"
    );
    k.ok(&["-n", "x", "create", "serviceaccount", "robot"], None);
    k.ok(
        &[
            "-n",
            "x",
            "create",
            "role",
            "reader",
            "--verb=get,list",
            "--resource=pods",
        ],
        None,
    );
    k.ok(
        &[
            "-n",
            "x",
            "create",
            "rolebinding",
            "reads",
            "--role=reader",
            "--serviceaccount=x:robot",
        ],
        None,
    );
    assert_eq!(
        sim.get("rolebindings.rbac.authorization.k8s.io", Some("x"), "reads")
            .expect("binding")["subjects"][0]["name"],
        "robot",
        "{v}"
    );
    k.ok(
        &["-n", "x", "create", "job", "once", "--image=busybox", "--", "date"],
        None,
    );
    let cronjob = [
        "-n",
        "x",
        "create",
        "cronjob",
        "tick",
        "--image=busybox",
        "--schedule=*/5 * * * *",
        "--",
        "date",
    ];
    let old_kubectl = v.contains("v1.20.");
    if old_kubectl {
        // kubectl v1.20 creates batch/v1beta1 CronJobs, which a v1.25+ server (as the sim
        // says it is) no longer serves: the server's 404, as from a real one.
        let out = k.run(&cronjob, None);
        assert!(!out.status.success(), "{v}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("could not find the requested resource"), "{v}: {err}");
    } else {
        k.ok(&cronjob, None);
        assert_eq!(
            sim.get("cronjobs", Some("x"), "tick").expect("cronjob")["spec"]["schedule"],
            "*/5 * * * *",
            "{v}"
        );
    }
    assert!(
        k.ok(
            &[
                "-n",
                "x",
                "create",
                "deployment",
                "web",
                "--image=nginx:1",
                "--replicas=2"
            ],
            None
        )
        .contains("deployment.apps/web created"),
        "{v}"
    );
    let web = sim.get("deployments", Some("x"), "web").expect("deployment");
    assert_eq!(web["spec"]["replicas"], 2, "{v}");
    assert_eq!(
        web["spec"]["template"]["spec"]["containers"][0]["image"], "nginx:1",
        "{v}"
    );
    let listed = k.ok(
        &[
            "-n",
            "x",
            "get",
            "configmaps,secrets,serviceaccounts,jobs,cronjobs,deployments",
            "-o",
            "name",
        ],
        None,
    );
    for name in [
        "configmap/c",
        "secret/s",
        "serviceaccount/robot",
        "job.batch/once",
        "cronjob.batch/tick",
        "deployment.apps/web",
    ] {
        if old_kubectl && name.starts_with("cronjob") {
            continue;
        }
        assert!(listed.lines().any(|l| l == name), "{v}: {name} missing in {listed}");
    }

    // apply -f: creates, then patches (client-side: a strategic merge patch with the
    // last-applied annotation), then server-side
    let manifest = |image: &str, extra: &str| {
        format!(
            "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: api\n  namespace: x\nspec:\n  replicas: 1\n  selector:\n    matchLabels: {{app: api}}\n  template:\n    metadata:\n      labels: {{app: api}}\n    spec:\n      containers:\n      - name: main\n        image: {image}\n        ports:\n        - containerPort: 8080\n{extra}"
        )
    };
    assert!(
        k.ok(&["apply", "-f", "-"], Some(&manifest("api:1", "")))
            .contains("deployment.apps/api created"),
        "{v}"
    );
    let sidecar = "      - name: sidecar\n        image: proxy:1\n";
    assert!(
        k.ok(&["apply", "-f", "-"], Some(&manifest("api:2", sidecar)))
            .contains("deployment.apps/api configured"),
        "{v}"
    );
    let api = sim.get("deployments", Some("x"), "api").expect("api");
    let containers = &api["spec"]["template"]["spec"]["containers"];
    assert_eq!(containers[0]["image"], "api:2", "{v}: {containers}");
    assert_eq!(containers[0]["ports"][0]["containerPort"], 8080, "{v}: {containers}");
    assert_eq!(containers[1]["name"], "sidecar", "{v}: {containers}");
    assert!(
        api["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]
            .as_str()
            .is_some_and(|a| a.contains("api:2")),
        "{v}: {api}"
    );
    // dropping the sidecar from the manifest removes it
    k.ok(&["apply", "-f", "-"], Some(&manifest("api:2", "")));
    let containers =
        sim.get("deployments", Some("x"), "api").expect("api")["spec"]["template"]["spec"]["containers"].clone();
    assert_eq!(containers.as_array().map(Vec::len), Some(1), "{v}: {containers}");
    let ssa = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: applied\n  namespace: x\ndata:\n  k: first\n";
    k.ok(&["apply", "--server-side", "-f", "-"], Some(ssa));
    assert_eq!(
        sim.get("configmaps", Some("x"), "applied").expect("applied")["data"]["k"],
        "first",
        "{v}"
    );
    k.ok(
        &["apply", "--server-side", "-f", "-"],
        Some(&ssa.replace("first", "second")),
    );
    assert_eq!(
        sim.get("configmaps", Some("x"), "applied").expect("applied")["data"]["k"],
        "second",
        "{v}"
    );

    // edit: kubectl GETs, runs the editor on the object, then sends a patch of the change
    let editor = dir.join("editor.sh");
    std::fs::write(&editor, "#!/bin/sh\nsed -i -e 's/a: \"1\"/a: \"2\"/' \"$1\"\n").expect("editor");
    std::fs::set_permissions(&editor, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
    let mut edit = k.command(&["-n", "x", "edit", "configmap", "c"]);
    edit.env("KUBE_EDITOR", &editor);
    let out = edit.output().expect("edit");
    assert!(
        out.status.success(),
        "{v}: edit: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        sim.get("configmaps", Some("x"), "c").expect("cm")["data"]["a"],
        "2",
        "{v}"
    );

    // patch, the three kinds kubectl sends
    k.ok(
        &[
            "-n",
            "x",
            "patch",
            "configmap",
            "c",
            "--type=merge",
            "-p",
            r#"{"data":{"m":"1"}}"#,
        ],
        None,
    );
    k.ok(
        &["-n", "x", "patch", "configmap", "c", "-p", r#"{"data":{"s":"1"}}"#],
        None,
    );
    k.ok(
        &[
            "-n",
            "x",
            "patch",
            "configmap",
            "c",
            "--type=json",
            "-p",
            r#"[{"op":"add","path":"/data/j","value":"1"}]"#,
        ],
        None,
    );
    let data = sim.get("configmaps", Some("x"), "c").expect("cm")["data"].clone();
    assert_eq!(data, json!({"a": "2", "m": "1", "s": "1", "j": "1"}), "{v}");
    // a JSON patch whose test fails is refused, as by a real server
    let out = k.run(
        &[
            "-n",
            "x",
            "patch",
            "configmap",
            "c",
            "--type=json",
            "-p",
            r#"[{"op":"test","path":"/data/a","value":"9"}]"#,
        ],
        None,
    );
    assert!(!out.status.success(), "{v}");
    assert!(
        String::from_utf8_lossy(&out.stderr).to_lowercase().contains("invalid"),
        "{v}: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // a Service from the generator (the sim allocates no cluster IP)
    k.ok(
        &["-n", "x", "create", "service", "clusterip", "front", "--tcp=80:8080"],
        None,
    );
    let svc = sim.get("services", Some("x"), "front").expect("service");
    assert_eq!(svc["spec"]["ports"][0]["port"], 80, "{v}: {svc}");
    assert_eq!(svc["spec"]["ports"][0]["targetPort"], 8080, "{v}: {svc}");

    // label and scale
    k.ok(&["-n", "x", "label", "deployment", "web", "tier=front"], None);
    assert!(
        k.ok(&["-n", "x", "scale", "deployment", "web", "--replicas=5"], None)
            .contains("deployment.apps/web scaled"),
        "{v}"
    );
    let web = sim.get("deployments", Some("x"), "web").expect("deployment");
    assert_eq!(web["spec"]["replicas"], 5, "{v}");
    assert_eq!(web["metadata"]["labels"]["tier"], "front", "{v}");
    let by_label = k.ok(
        &["-n", "x", "get", "deployments", "-l", "tier=front", "-o", "name"],
        None,
    );
    assert_eq!(by_label.trim(), "deployment.apps/web", "{v}");

    // rollout status: there is no controller to roll the Deployment out (as on a real API
    // server without kube-controller-manager), so it waits until its timeout and says so
    let out = k.run(
        &["-n", "x", "rollout", "status", "deployment/web", "--timeout=2s"],
        None,
    );
    assert!(
        !out.status.success(),
        "{v}: rollout status cannot succeed without a controller"
    );
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("Waiting for deployment"), "{v}: {said}");
    assert!(said.contains("timed out"), "{v}: {said}");
    // ... and finishes once something (here the test, as a controller would) reports it done
    let generation = web["metadata"]["generation"].clone();
    sim.patch_status(
        "deployments",
        Some("x"),
        "web",
        &json!({"status": {"observedGeneration": generation, "replicas": 5, "updatedReplicas": 5,
            "readyReplicas": 5, "availableReplicas": 5}}),
    )
    .expect("status");
    let done = k.ok(
        &["-n", "x", "rollout", "status", "deployment/web", "--timeout=10s"],
        None,
    );
    assert!(done.contains("successfully rolled out"), "{v}: {done}");

    // delete, and what the watch saw
    k.ok(&["-n", "x", "delete", "configmap", "c"], None);
    k.ok(&["-n", "x", "delete", "deployment", "web"], None);
    assert!(sim.get("deployments", Some("x"), "web").is_err(), "{v}");
    std::thread::sleep(Duration::from_millis(500));
    let (seen, err) = stop(cm_watch);
    let cm_events = arrived_and_left(&seen, &err, "c", v);
    assert!(cm_events.contains(&"MODIFIED".to_string()), "{v}: {cm_events:?} {err}");
    let (seen, err) = stop(deploy_watch);
    arrived_and_left(&seen, &err, "web", v);
    k.ok(&["delete", "namespace", "x"], None);
    assert!(sim.get("namespaces", None, "x").is_err(), "{v}");
}
