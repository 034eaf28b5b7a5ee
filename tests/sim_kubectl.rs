//! A client nobody here wrote — `kubectl` — works against the simulated API server through the
//! kubeconfig it writes: get, create, label, delete and get --watch, on Pods and ConfigMaps.
//!
//! Needs `kubectl` on PATH (`scripts/install-kubectl` installs Debian's `kubernetes-client`).
//! Without it the test is ignored, never silently passed.

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use durable_informer::sim::{Sim, SimConfig};
use serde_json::{json, Value};

fn kubectl(kubeconfig: &std::path::Path, args: &[&str], stdin: Option<&str>) -> Output {
    let mut cmd = Command::new("kubectl");
    cmd.env("KUBECONFIG", kubeconfig)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
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

fn ok(kubeconfig: &std::path::Path, args: &[&str], stdin: Option<&str>) -> String {
    let out = kubectl(kubeconfig, args, stdin);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "kubectl {args:?} failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
#[ignore = "needs kubectl: scripts/install-kubectl"]
fn kubectl_gets_creates_labels_deletes_and_watches_pods_and_configmaps() {
    let sim = Sim::start(SimConfig::default()).expect("start");
    let dir = tempfile::tempdir().expect("tempdir");
    let kc = dir.path().join("kubeconfig");
    sim.write_kubeconfig(&kc).expect("kubeconfig");
    sim.create(
        "pods",
        Some("default"),
        json!({"metadata": {"name": "seed-pod", "labels": {"app": "seed"}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}, "status": {"phase": "Running"}}),
    )
    .expect("seed pod");

    // get (table and JSON)
    let table = ok(&kc, &["get", "pods"], None);
    assert!(table.contains("seed-pod"), "{table}");
    let list: Value = serde_json::from_str(&ok(&kc, &["get", "pods", "-o", "json"], None)).expect("json");
    assert_eq!(list["items"][0]["metadata"]["name"], "seed-pod");

    // get --watch on both kinds, running while the rest happens; the ConfigMap watch prints
    // event types so the delete can be told apart from the add and the label change
    let spawn_watch = |args: &[&str]| {
        Command::new("kubectl")
            .env("KUBECONFIG", &kc)
            .args(["get", "--watch", "--request-timeout=20s"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("watch")
    };
    let cm_watch = spawn_watch(&["configmaps", "-o", "json", "--output-watch-events"]);
    let pod_watch = spawn_watch(&["pods", "-o", "name"]);
    std::thread::sleep(Duration::from_millis(500));

    // create (from a manifest on stdin), for both kinds
    let cm = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: from-kubectl\ndata:\n  k: v\n";
    assert!(ok(&kc, &["create", "-f", "-"], Some(cm)).contains("configmap/from-kubectl created"));
    let pod =
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: kpod\nspec:\n  containers:\n  - name: c\n    image: busybox\n";
    assert!(ok(&kc, &["create", "-f", "-"], Some(pod)).contains("pod/kpod created"));
    let stored = sim.get("configmaps", Some("default"), "from-kubectl").expect("stored");
    assert_eq!(stored["data"]["k"], "v");

    // label
    ok(&kc, &["label", "configmap", "from-kubectl", "team=infra"], None);
    ok(&kc, &["label", "pod", "kpod", "app=web"], None);
    assert_eq!(
        sim.get("pods", Some("default"), "kpod").expect("pod")["metadata"]["labels"]["app"],
        "web"
    );
    let selected = ok(&kc, &["get", "pods", "-l", "app=web", "-o", "name"], None);
    assert_eq!(selected.trim(), "pod/kpod");
    let by_field = ok(
        &kc,
        &["get", "pods", "--field-selector", "status.phase=Running", "-o", "name"],
        None,
    );
    assert_eq!(by_field.trim(), "pod/seed-pod");
    // a malformed selector is refused by the server with 400, as on a real one
    let bad = kubectl(&kc, &["get", "pods", "-l", "app in web"], None);
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("unable to parse requirement"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );

    // delete
    ok(&kc, &["delete", "configmap", "from-kubectl"], None);
    ok(&kc, &["delete", "pod", "kpod", "--wait=false"], None);
    assert!(sim.get("configmaps", Some("default"), "from-kubectl").is_err());
    let pods = ok(&kc, &["get", "pods", "-o", "name"], None);
    assert_eq!(pods.trim(), "pod/seed-pod");

    // the watches saw the configmap arrive and leave, and the pod arrive
    std::thread::sleep(Duration::from_millis(500));
    let stop = |mut child: std::process::Child| {
        let _ = child.kill();
        let out = child.wait_with_output().expect("watch output");
        (
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (cm_seen, cm_err) = stop(cm_watch);
    let (pod_seen, pod_err) = stop(pod_watch);
    let cm_events: Vec<String> = serde_json::Deserializer::from_str(&cm_seen)
        .into_iter::<Value>()
        .map_while(Result::ok)
        .filter(|e| e["object"]["metadata"]["name"] == "from-kubectl")
        .map(|e| e["type"].as_str().unwrap_or("?").to_string())
        .collect();
    assert_eq!(
        cm_events.first().map(String::as_str),
        Some("ADDED"),
        "configmap watch: {cm_seen} stderr: {cm_err}"
    );
    assert_eq!(
        cm_events.last().map(String::as_str),
        Some("DELETED"),
        "configmap watch events {cm_events:?} stderr: {cm_err}"
    );
    let pod_lines: Vec<&str> = pod_seen.lines().collect();
    assert!(
        pod_lines.contains(&"pod/seed-pod") && pod_lines.contains(&"pod/kpod"),
        "pod watch output: {pod_seen:?} stderr: {pod_err}"
    );
    assert!(sim.counters().watch_requests >= 2);
}
