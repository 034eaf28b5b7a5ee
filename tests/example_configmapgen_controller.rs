//! The migration example: kube-runtime's controller (`examples/kube_configmapgen_controller.rs`)
//! and the same on this crate (`examples/durable_configmapgen_controller.rs`). The two files
//! differ only in imports and the constructor (checked line by line), and both converge on the
//! simulated cluster: a generator's ConfigMap applied, owned, and updated on a change.

#[path = "../examples/durable_configmapgen_controller.rs"]
#[allow(unused_imports, clippy::all)]
mod durable;
#[path = "../examples/kube_configmapgen_controller.rs"]
#[allow(unused_imports, clippy::all)]
mod kube_rt;

use std::sync::Arc;
use std::time::Duration;

use durable_informer::sim::{ResourceDef, Sim, SimConfig};
use durable_informer::store::{DurableStore, StoreConfig};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams, PostParams};

/// The lines of `a` and `b` that are not in their longest common subsequence.
fn changed_lines<'a>(a: &[&'a str], b: &[&'a str]) -> Vec<&'a str> {
    let (n, m) = (a.len(), b.len());
    let mut lcs = vec![vec![0_usize; m + 1]; n + 1];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < n || j < m {
        if i < n && j < m && a[i] == b[j] {
            i += 1;
            j += 1;
        } else if j < m && (i == n || lcs[i][j + 1] >= lcs[i + 1][j]) {
            out.push(b[j]);
            j += 1;
        } else {
            out.push(a[i]);
            i += 1;
        }
    }
    out
}

/// What may differ: the module docs, `use` lines, and the constructor: `Controller::new` with
/// the database first, the database opened, and handed down through `run`.
fn allowed(line: &str) -> bool {
    let t = line.trim_start();
    t.starts_with("//!")
        || t.starts_with("use ")
        || t.starts_with("Controller::new(")
        || t.starts_with("pub async fn run(client: Client,")
        || t.starts_with("run(client,")
        || t.contains("DurableStore")
        || t == "let db = Arc::new(db);"
}

#[test]
fn the_two_controllers_differ_only_in_imports_and_the_constructor() {
    let kube_rt = include_str!("../examples/kube_configmapgen_controller.rs");
    let durable = include_str!("../examples/durable_configmapgen_controller.rs");
    let changed = changed_lines(
        &kube_rt.lines().collect::<Vec<_>>(),
        &durable.lines().collect::<Vec<_>>(),
    );
    let code: Vec<&str> = changed
        .iter()
        .copied()
        .filter(|l| !l.trim_start().starts_with("//!"))
        .collect();
    assert!(
        code.iter().any(|l| l.contains("Controller::new(db,")),
        "the constructor takes the database: {code:#?}"
    );
    let other: Vec<&str> = code.iter().copied().filter(|l| !allowed(l)).collect();
    assert!(
        other.is_empty(),
        "lines that differ beyond imports and the constructor: {other:#?}"
    );
    for f in ["pub async fn reconcile(", "pub fn error_policy("] {
        assert!(kube_rt.contains(f) && durable.contains(f), "{f}");
    }
}

#[test]
fn the_diff_check_sees_a_changed_reconcile() {
    let a = ["use a;", "fn reconcile() {", "    Ok(Action::await_change())", "}"];
    let b = ["use b;", "fn reconcile() {", "    Ok(Action::requeue(d))", "}"];
    let changed = changed_lines(&a, &b);
    assert_eq!(changed.len(), 4, "{changed:?}");
    assert!(changed.iter().any(|l| !allowed(l)));
}

async fn eventually<T>(what: &str, mut f: impl AsyncFnMut() -> Option<T>) -> T {
    for _ in 0..200 {
        if let Some(v) = f().await {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for {what}");
}

/// Creates a generator, waits for its ConfigMap, changes the content, waits for the change.
async fn converges(client: kube::Client, generator: &str) {
    let generators: Api<durable::ConfigMapGenerator> = Api::namespaced(client.clone(), "default");
    let mut g = durable::ConfigMapGenerator::new(generator, durable::ConfigMapGeneratorSpec { content: "one".into() });
    g.metadata.namespace = Some("default".into());
    let created = generators.create(&PostParams::default(), &g).await.unwrap();
    let configmaps: Api<ConfigMap> = Api::namespaced(client, "default");
    let content = async |want: &str| {
        let configmaps = configmaps.clone();
        let want = want.to_owned();
        eventually(&format!("content {want}"), async || {
            let cm = configmaps.get_opt(generator).await.ok()??;
            (cm.data.as_ref()?.get("content")? == &want).then_some(cm)
        })
        .await
    };
    let cm = content("one").await;
    let owner = &cm.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.controller),
        ("ConfigMapGenerator", Some(true))
    );
    assert_eq!(Some(&owner.uid), created.metadata.uid.as_ref());
    let patch = serde_json::json!({"spec": {"content": "two"}});
    generators
        .patch(generator, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    content("two").await;
}

fn sim() -> Sim {
    Sim::start(SimConfig::default().with_resource(ResourceDef::custom(
        "nullable.se",
        "v1",
        "ConfigMapGenerator",
        "configmapgenerators",
    )))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_controllers_converge_on_the_simulated_cluster() {
    let sim = tokio::task::spawn_blocking(sim).await.unwrap();
    let client = sim.client().unwrap();

    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let shutdown = async move {
        let _ = stopped.await;
    };
    let task = tokio::spawn(kube_rt::run(client.clone(), shutdown));
    converges(client.clone(), "with-kube").await;
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .unwrap()
        .unwrap();

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db.redb");
    let db = tokio::task::spawn_blocking(move || DurableStore::open(StoreConfig::new(path)))
        .await
        .unwrap()
        .unwrap();
    let db = Arc::new(db);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let shutdown = async move {
        let _ = stopped.await;
    };
    let (c, d) = (client.clone(), db.clone());
    let task = tokio::spawn(async move { durable::run(c, &d, shutdown).await });
    converges(client, "with-durable").await;
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .unwrap()
        .unwrap();
}
