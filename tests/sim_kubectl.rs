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

    // get --watch, running while the rest happens
    let mut watch = Command::new("kubectl")
        .env("KUBECONFIG", &kc)
        .args(["get", "configmaps", "--watch", "-o", "name", "--request-timeout=20s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("watch");
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

    // the watch saw the configmap arrive (and leave)
    std::thread::sleep(Duration::from_millis(500));
    let _ = watch.kill();
    let out = watch.wait_with_output().expect("watch output");
    let seen = String::from_utf8_lossy(&out.stdout);
    assert!(
        seen.contains("configmap/from-kubectl"),
        "watch output: {seen:?} stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(sim.counters().watch_requests >= 1);
}
