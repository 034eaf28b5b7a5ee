//! End to end against real kube-apiservers, each test on v1.20.2 with etcd 3.4.23 and on
//! v1.37.2 with etcd 3.7.3 (issues #11 and #34): initial sync (a streaming list where the server has
//! them), restart without a LIST (checked in the apiserver's audit log), compaction while down
//! (410 from etcd, and from the watch cache after a cluster restart), a persisted RV ahead of a
//! restored cluster, another cluster's database, and a restart while another resource churns.
//!
//! Ignored by default: run `scripts/envtest-install` once, then
//! `cargo test --all-features --test 'envtest_*' -- --ignored`.

#[path = "common/churn.rs"]
mod churn;
mod envtest;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use churn::LeaseChurn;
use durable_informer::informer::{handler_fn, Event, HandlerOptions, Informer};
use durable_informer::reflector::{BackoffConfig, ListReason, ReflectorConfig};
use durable_informer::source::KubeSource;
use durable_informer::store::{DurableStore, StoreConfig};
use envtest::{eventually, on_servers, EnvTest, Options, Server};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, VersionMatch};
use kube::ResourceExt;
use serde::de::DeserializeOwned;

const NS: &str = "e2e";
/// The user the informers authenticate as (the test's own requests are `envtest-admin`'s).
const INFORMER: &str = "informer";

type Seen = Arc<Mutex<Vec<String>>>;

fn config() -> ReflectorConfig {
    ReflectorConfig {
        backoff: BackoffConfig {
            initial: Duration::from_millis(50),
            max: Duration::from_secs(1),
            ..BackoffConfig::default()
        },
        ..ReflectorConfig::default()
    }
}

fn recorder<K>(kind: &'static str, seen: &Seen) -> impl durable_informer::informer::EventHandler<K>
where
    K: kube::Resource + Send + Sync + 'static,
{
    let seen = seen.clone();
    handler_fn(move |ev: Event<K>| -> Result<(), std::convert::Infallible> {
        let key = |o: &K| format!("{}/{}", o.namespace().unwrap_or_default(), o.name_any());
        let line = match &ev {
            Event::Add { object, .. } => format!("add {kind} {}", key(object)),
            Event::Update { new, .. } => format!("update {kind} {}", key(new)),
            Event::Delete {
                object,
                final_state_unknown,
            } => format!(
                "delete {kind} {}{}",
                key(object),
                if *final_state_unknown { " (unknown)" } else { "" }
            ),
        };
        seen.lock().unwrap().push(line);
        Ok(())
    })
}

/// Informers for Pods and ConfigMaps (cluster-wide) on one database, each with a durable
/// handler that records what it gets.
struct Running {
    db: DurableStore,
    pods: Informer<Pod>,
    cms: Informer<ConfigMap>,
}

async fn open_db(path: &Path) -> DurableStore {
    let p = path.to_owned();
    tokio::task::spawn_blocking(move || DurableStore::open(StoreConfig::new(p)))
        .await
        .unwrap()
        .unwrap()
}

async fn start(env: &EnvTest, path: &Path, config: ReflectorConfig, seen: &Seen) -> Running {
    let db = open_db(path).await;
    let client = env.client_as(INFORMER).await;
    let url = env.url();
    let pods = Informer::<Pod>::builder(&db, KubeSource::typed::<Pod>(client.clone(), &url))
        .reflector_config(config.clone())
        .build()
        .await
        .unwrap();
    let cms = Informer::<ConfigMap>::builder(&db, KubeSource::typed::<ConfigMap>(client, &url))
        .reflector_config(config)
        .build()
        .await
        .unwrap();
    pods.add_event_handler(recorder("pod", seen), HandlerOptions::durable("e2e-pod"));
    cms.add_event_handler(recorder("cm", seen), HandlerOptions::durable("e2e-cm"));
    pods.start();
    cms.start();
    Running { db, pods, cms }
}

impl Running {
    async fn synced(&self) {
        let both = async {
            self.pods.wait_for_sync().await.expect("cache synced");
            self.cms.wait_for_sync().await.expect("cache synced");
        };
        if tokio::time::timeout(Duration::from_secs(60), both).await.is_err() {
            panic!(
                "not synced within 60 s: pods {:?} {:?}, configmaps {:?} {:?}",
                *self.pods.status().borrow(),
                self.pods.errors(),
                *self.cms.status().borrow(),
                self.cms.errors()
            );
        }
    }

    async fn stop(self) {
        self.pods.shutdown().await.unwrap();
        self.cms.shutdown().await.unwrap();
        let Running { db, pods, cms } = self;
        drop((pods, cms));
        tokio::task::spawn_blocking(move || db.close()).await.unwrap().unwrap();
    }
}

/// `namespace/name → resourceVersion` of a fresh LIST.
async fn listed<K>(client: &kube::Client) -> BTreeMap<String, String>
where
    K: kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    Api::<K>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|o| {
            let key = match o.namespace() {
                Some(ns) => format!("{ns}/{}", o.name_any()),
                None => o.name_any(),
            };
            (key, o.resource_version().unwrap_or_default())
        })
        .collect()
}

/// `namespace/name → resourceVersion` of what the informer stores.
fn stored<K>(informer: &Informer<K>) -> BTreeMap<String, String>
where
    K: DeserializeOwned + Send + Sync + 'static,
{
    informer
        .store()
        .list()
        .unwrap()
        .into_iter()
        .map(|o| (o.key.to_string(), o.meta.resource_version.0.clone()))
        .collect()
}

/// Waits until both stores equal a fresh LIST of the server.
async fn converged(r: &Running, client: &kube::Client) {
    let mut last = (BTreeMap::new(), BTreeMap::new(), BTreeMap::new(), BTreeMap::new());
    for _ in 0..300 {
        last = (
            stored(&r.pods),
            listed::<Pod>(client).await,
            stored(&r.cms),
            listed::<ConfigMap>(client).await,
        );
        if last.0 == last.1 && last.2 == last.3 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(last.0, last.1, "pods: store vs LIST");
    assert_eq!(last.2, last.3, "configmaps: store vs LIST");
}

async fn create_namespace(client: &kube::Client, name: &str) {
    let ns: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
}

async fn create_cm(client: &kube::Client, name: &str, value: &str) {
    let cm: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {"app": "e2e"}},
        "data": {"v": value}
    }))
    .unwrap();
    Api::<ConfigMap>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &cm)
        .await
        .unwrap();
}

async fn patch_cm(client: &kube::Client, name: &str, value: &str) {
    Api::<ConfigMap>::namespaced(client.clone(), NS)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"data": {"v": value}})),
        )
        .await
        .unwrap();
}

async fn delete_cm(client: &kube::Client, name: &str) {
    Api::<ConfigMap>::namespaced(client.clone(), NS)
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
}

async fn create_pod(client: &kube::Client, name: &str) {
    // No scheduler or kubelet: it stays Pending, which is all an informer needs.
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {"app": "e2e"}},
        "spec": {"containers": [{"name": "c", "image": "registry.invalid/none:1"}]}
    }))
    .unwrap();
    Api::<Pod>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
}

async fn delete_pod(client: &kube::Client, name: &str) {
    // An unscheduled Pod is removed at once.
    Api::<Pod>::namespaced(client.clone(), NS)
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
    let pods = Api::<Pod>::namespaced(client.clone(), NS);
    eventually("the pod to be gone", 30, async || {
        pods.get_opt(name).await.unwrap().is_none().then_some(())
    })
    .await;
}

/// The durable handler's events about objects in [`NS`], in order.
fn seen_in_ns(seen: &Seen) -> Vec<String> {
    let prefix = format!(" {NS}/");
    seen.lock()
        .unwrap()
        .iter()
        .filter(|l| l.contains(&prefix))
        .cloned()
        .collect()
}

async fn wait_seen(seen: &Seen, want: &[&str]) -> Vec<String> {
    wait_seen_but(seen, want, &[]).await
}

/// Like [`wait_seen`], ignoring the events in `maybe` (ones the server may or may not send).
async fn wait_seen_but(seen: &Seen, want: &[&str], maybe: &[&str]) -> Vec<String> {
    let mut want: Vec<String> = want.iter().map(|s| (*s).to_owned()).collect();
    want.sort();
    let mut got = Vec::new();
    for _ in 0..300 {
        got = seen_in_ns(seen);
        got.retain(|e| !maybe.contains(&e.as_str()));
        got.sort();
        if got == want {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(got, want, "events delivered to the durable handler");
    got
}

/// The informer user's LIST and WATCH requests in the audit log after `skip` entries:
/// `(verb, requestURI)`.
fn informer_requests(env: &EnvTest, skip: usize) -> Vec<(String, String)> {
    env.audit_events()
        .into_iter()
        .skip(skip)
        .filter(|e| e["user"]["username"] == INFORMER)
        .map(|e| {
            (
                e["verb"].as_str().unwrap_or_default().to_owned(),
                e["requestURI"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

/// True for a request that reads the whole collection: a LIST (anything but the one-object RV
/// probe and the watch-cache revision probe, which matches no object) or a streaming list (a
/// watch with `sendInitialEvents=true`).
fn is_full_list((verb, uri): &(String, String)) -> bool {
    let param = |p: &str| uri.split(['?', '&']).any(|q| q == p);
    match verb.as_str() {
        "list" => !param("limit=1") && !uri.contains("_revision_probe_"),
        "watch" => param("sendInitialEvents=true"),
        _ => false,
    }
}

/// The RV of a one-object LIST: the server's current resourceVersion.
async fn server_rv(client: &kube::Client) -> u64 {
    Api::<ConfigMap>::all(client.clone())
        .list_metadata(&ListParams::default().limit(1))
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap()
        .parse()
        .unwrap()
}

/// Consistent reads of `resource` the watch cache served itself (no fallback to etcd), from
/// the apiserver's metrics (v1.37; consistent reads from the cache are GA since v1.34).
async fn consistent_reads_from_cache(env: &EnvTest, resource: &str) -> f64 {
    env.metric_sum(
        "apiserver_watch_cache_consistent_read_total",
        &[
            &format!("resource=\"{resource}\""),
            "success=\"true\"",
            "fallback=\"false\"",
        ],
    )
    .await
}

fn persisted_rv(informer: &Informer<ConfigMap>) -> u64 {
    informer
        .last_synced_resource_version()
        .and_then(|r| r.as_u64())
        .unwrap()
}

on_servers!(initial_sync_of_pods_and_configmaps_equals_a_fresh_list);
async fn initial_sync_of_pods_and_configmaps_equals_a_fresh_list(server: Server) {
    let env = EnvTest::start(server).await;
    let client = env.client().await;
    create_namespace(&client, NS).await;
    for i in 0..12 {
        create_cm(&client, &format!("cm-{i}"), &format!("v{i}")).await;
    }
    for i in 0..5 {
        create_pod(&client, &format!("pod-{i}")).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let seen = Seen::default();
    let r = start(&env, &dir.path().join("db.redb"), config(), &seen).await;
    r.synced().await;
    assert!(!r.cms.is_restored());
    converged(&r, &client).await;

    // The stored bytes decode as the server's objects.
    let cm = r.cms.lister().namespace(NS).get("cm-7").unwrap().unwrap();
    assert_eq!(cm.data.as_ref().unwrap()["v"], "v7");
    let pod = r.pods.lister().namespace(NS).get("pod-3").unwrap().unwrap();
    assert_eq!(pod.spec.as_ref().unwrap().containers[0].name, "c");
    assert_eq!(pod.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Pending"));
    let mut want: Vec<String> = (0..12).map(|i| format!("add cm {NS}/cm-{i}")).collect();
    want.extend((0..5).map(|i| format!("add pod {NS}/pod-{i}")));
    let want: Vec<&str> = want.iter().map(String::as_str).collect();
    wait_seen(&seen, &want).await;

    // Live changes after the sync arrive through the watch.
    patch_cm(&client, "cm-0", "changed").await;
    delete_cm(&client, "cm-1").await;
    create_pod(&client, "pod-live").await;
    converged(&r, &client).await;
    assert_eq!(
        r.cms
            .lister()
            .namespace(NS)
            .get("cm-0")
            .unwrap()
            .unwrap()
            .data
            .as_ref()
            .unwrap()["v"],
        "changed"
    );
    // Each informer listed once: a streaming list on v1.37; v1.20 refuses it (422), so there
    // it is a paginated LIST (`the_initial_list_streams_where_the_server_can` checks which).
    assert_eq!(r.cms.status().borrow().lists, 1);
    assert_eq!(r.pods.status().borrow().lists, 1);
    r.stop().await;
}

on_servers!(restart_converges_on_changes_made_while_down_without_a_full_list);
async fn restart_converges_on_changes_made_while_down_without_a_full_list(server: Server) {
    let env = EnvTest::start(server).await;
    let client = env.client().await;
    create_namespace(&client, NS).await;
    for i in 0..4 {
        create_cm(&client, &format!("cm-{i}"), "v").await;
    }
    for i in 0..3 {
        create_pod(&client, &format!("pod-{i}")).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db.redb");
    let seen = Seen::default();
    let r = start(&env, &db, config(), &seen).await;
    r.synced().await;
    converged(&r, &client).await;
    r.stop().await;
    // The audit log does record this informer's full LISTs: the check below means something.
    let first = informer_requests(&env, 0);
    assert!(
        first.iter().filter(|r| is_full_list(r)).count() >= 2,
        "the first start lists Pods and ConfigMaps: {first:?}"
    );

    // While down: create, update, delete.
    create_cm(&client, "cm-new", "n").await;
    patch_cm(&client, "cm-0", "changed").await;
    delete_cm(&client, "cm-1").await;
    delete_pod(&client, "pod-0").await;
    create_pod(&client, "pod-new").await;
    seen.lock().unwrap().clear();
    let audit_mark = env.audit_events().len();

    let r = start(&env, &db, config(), &seen).await;
    assert!(r.cms.is_restored() && r.pods.is_restored());
    r.synced().await;
    converged(&r, &client).await;
    wait_seen_but(
        &seen,
        &[
            "add cm e2e/cm-new",
            "update cm e2e/cm-0",
            "delete cm e2e/cm-1",
            "delete pod e2e/pod-0",
            "add pod e2e/pod-new",
        ],
        // A Pod's delete may first set its deletionTimestamp (a MODIFIED event).
        &["update pod e2e/pod-0"],
    )
    .await;
    assert_eq!(r.cms.status().borrow().lists, 0);
    assert_eq!(r.pods.status().borrow().lists, 0);
    if server >= Server::V1_37_2 {
        // The resume's one-object probe is a consistent read, served from the watch cache.
        assert!(consistent_reads_from_cache(&env, "configmaps").await >= 1.0);
    }
    r.stop().await;
    // A watch shows up in the audit log when it ends (ResponseStarted is logged at its first
    // write): read the log after stopping.
    let requests = informer_requests(&env, audit_mark);
    let full: Vec<_> = requests.iter().filter(|r| is_full_list(r)).collect();
    assert!(full.is_empty(), "full LISTs after the restart: {full:?}");
    let watches: Vec<_> = requests.iter().filter(|(v, _)| v == "watch").collect();
    assert!(watches.len() >= 2, "resumed watches: {requests:?}");
    for (_, uri) in &watches {
        let rv = uri
            .split(['?', '&'])
            .find_map(|p| p.strip_prefix("resourceVersion="))
            .unwrap_or_default();
        assert!(
            rv.parse::<u64>().is_ok_and(|n| n > 0),
            "a resumed watch starts from the persisted RV: {uri}"
        );
    }
}

on_servers!(compaction_while_down_gives_410_and_the_relist_diff_delivers_the_missed_deletes);
async fn compaction_while_down_gives_410_and_the_relist_diff_delivers_the_missed_deletes(server: Server) {
    // Without the watch cache a watch from a compacted RV reaches etcd: 410 at once.
    let env = EnvTest::start_with(
        server,
        Options {
            compaction_interval: Some(Duration::from_secs(1)),
            watch_cache: false,
            ..Options::default()
        },
    )
    .await;
    let client = env.client().await;
    create_namespace(&client, NS).await;
    for i in 0..6 {
        create_cm(&client, &format!("cm-{i}"), "v").await;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db.redb");
    let seen = Seen::default();
    let r = start(&env, &db, config(), &seen).await;
    r.synced().await;
    converged(&r, &client).await;
    let persisted = persisted_rv(&r.cms);
    r.stop().await;

    for i in 0..3 {
        delete_cm(&client, &format!("cm-{i}")).await;
    }
    patch_cm(&client, "cm-3", "changed").await;
    create_cm(&client, "cm-new", "n").await;
    // Wait until etcd has compacted past the persisted RV: a watch from it reads revisions
    // from `persisted + 1` on, so an exact read at `persisted + 1` must be 410 already (with
    // the compaction exactly at `persisted + 1` the watch would still work).
    let cms = Api::<ConfigMap>::all(client.clone());
    eventually("etcd to compact past the persisted RV", 60, async || {
        let lp = ListParams {
            resource_version: Some((persisted + 1).to_string()),
            version_match: Some(VersionMatch::Exact),
            limit: Some(1),
            ..ListParams::default()
        };
        match cms.list_metadata(&lp).await {
            Err(kube::Error::Api(s)) if s.code == 410 => Some(()),
            _ => None,
        }
    })
    .await;
    seen.lock().unwrap().clear();

    let r = start(&env, &db, config(), &seen).await;
    r.synced().await;
    converged(&r, &client).await;
    wait_seen(
        &seen,
        &[
            "delete cm e2e/cm-0 (unknown)",
            "delete cm e2e/cm-1 (unknown)",
            "delete cm e2e/cm-2 (unknown)",
            "update cm e2e/cm-3",
            "add cm e2e/cm-new",
        ],
    )
    .await;
    let status = r.cms.status().borrow().clone();
    assert_eq!(status.relists, 1, "{status:?}");
    assert!(
        matches!(status.last_list_reason, Some(ListReason::Gone(_))),
        "{status:?}"
    );
    r.stop().await;
}

on_servers!(a_persisted_rv_ahead_of_a_restored_cluster_is_detected_and_relisted);
async fn a_persisted_rv_ahead_of_a_restored_cluster_is_detected_and_relisted(server: Server) {
    let mut env = EnvTest::start(server).await;
    let client = env.client().await;
    create_namespace(&client, NS).await;
    for i in 0..3 {
        create_cm(&client, &format!("cm-{i}"), "v").await;
    }
    // The backup the cluster will be restored from.
    let snapshot = env.snapshot("backup.db");
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db.redb");
    let seen = Seen::default();
    let r = start(&env, &db, config(), &seen).await;
    r.synced().await;
    // Many changes after the backup: the persisted RV runs far ahead of it.
    for i in 0..40 {
        create_cm(&client, &format!("late-{i}"), "v").await;
    }
    patch_cm(&client, "cm-0", "after-backup").await;
    converged(&r, &client).await;
    let persisted = persisted_rv(&r.cms);
    r.stop().await;

    // etcd restored from the backup: same cluster (kube-system UID, URL), older RV.
    env.restore(&snapshot).await;
    let client = env.client().await;
    let now = server_rv(&client).await;
    assert!(
        now < persisted,
        "the restored server's RV {now} should be behind the persisted {persisted}"
    );
    seen.lock().unwrap().clear();
    let started = std::time::Instant::now();
    let r = start(&env, &db, config(), &seen).await;
    assert!(r.cms.is_restored());
    r.synced().await;
    converged(&r, &client).await;
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "took {:?}",
        started.elapsed()
    );
    let mut want: Vec<String> = (0..40).map(|i| format!("delete cm {NS}/late-{i} (unknown)")).collect();
    want.push(format!("update cm {NS}/cm-0"));
    let want: Vec<&str> = want.iter().map(String::as_str).collect();
    wait_seen(&seen, &want).await;
    assert_eq!(
        r.cms
            .lister()
            .namespace(NS)
            .get("cm-0")
            .unwrap()
            .unwrap()
            .data
            .as_ref()
            .unwrap()["v"],
        "v"
    );
    let status = r.cms.status().borrow().clone();
    assert!(
        matches!(status.last_list_reason, Some(ListReason::AheadOfServer { .. })),
        "{status:?}"
    );
    r.stop().await;
}

async fn kube_system_uid(client: &kube::Client) -> String {
    Api::<Namespace>::all(client.clone())
        .get("kube-system")
        .await
        .unwrap()
        .uid()
        .unwrap()
}

on_servers!(another_clusters_database_is_refused_with_both_identities);
async fn another_clusters_database_is_refused_with_both_identities(server: Server) {
    let (a, b) = tokio::join!(EnvTest::start(server), EnvTest::start(server));
    let (ca, cb) = (a.client().await, b.client().await);
    create_namespace(&ca, NS).await;
    create_cm(&ca, "only-in-a", "a").await;
    create_namespace(&cb, NS).await;
    create_cm(&cb, "only-in-b", "b").await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db.redb");
    let seen = Seen::default();
    let r = start(&a, &path, config(), &seen).await;
    r.synced().await;
    converged(&r, &ca).await;
    r.stop().await;

    let id_a = format!("{}@{}", kube_system_uid(&ca).await, a.url());
    let id_b = format!("{}@{}", kube_system_uid(&cb).await, b.url());
    let db = open_db(&path).await;
    assert_eq!(db.cluster_identity().unwrap().as_deref(), Some(id_a.as_str()));
    let informer = Informer::<ConfigMap>::builder(
        &db,
        KubeSource::typed::<ConfigMap>(b.client_as(INFORMER).await, &b.url()),
    )
    .reflector_config(config())
    .build()
    .await
    .unwrap();
    let err = tokio::time::timeout(Duration::from_secs(30), informer.run())
        .await
        .expect("refused at once")
        .unwrap_err()
        .to_string();
    assert!(err.contains(&id_a) && err.contains(&id_b), "{err}");
    // Nothing of A's data was touched.
    assert!(stored(&informer).contains_key(&format!("{NS}/only-in-a")));
    drop(informer);

    // Carried to another cluster on purpose: reset and rebuild from B.
    let informer = Informer::<ConfigMap>::builder(
        &db,
        KubeSource::typed::<ConfigMap>(b.client_as(INFORMER).await, &b.url()),
    )
    .reflector_config(ReflectorConfig {
        reset_on_cluster_change: true,
        ..config()
    })
    .build()
    .await
    .unwrap();
    informer.start();
    tokio::time::timeout(Duration::from_secs(60), informer.wait_for_sync())
        .await
        .unwrap()
        .expect("cache synced");
    let want = listed::<ConfigMap>(&cb).await;
    eventually("the store to equal B's LIST", 30, async || {
        (stored(&informer) == want).then_some(())
    })
    .await;
    assert!(!stored(&informer).contains_key(&format!("{NS}/only-in-a")));
    assert_eq!(db.cluster_identity().unwrap().as_deref(), Some(id_b.as_str()));
    informer.shutdown().await.unwrap();
    drop(informer);
    tokio::task::spawn_blocking(move || db.close()).await.unwrap().unwrap();
}

on_servers!(a_restart_while_other_resources_change_syncs_on_the_caches_revision_losing_nothing);
async fn a_restart_while_other_resources_change_syncs_on_the_caches_revision_losing_nothing(server: Server) {
    let env = EnvTest::start(server).await;
    let client = env.client().await;
    create_namespace(&client, NS).await;
    for i in 0..4 {
        create_cm(&client, &format!("cm-{i}"), "v").await;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db.redb");
    let seen = Seen::default();
    // Strict: no quiet period, so only the sync target can report synced. With the
    // cluster-wide RV as the target this restart would wait for a bookmark the server sends
    // minutes later (2 s before the watch's timeout), and fail the 60 s wait.
    let strict = ReflectorConfig {
        resume_quiet_period: None,
        ..config()
    };
    let r = start(&env, &db, strict.clone(), &seen).await;
    r.synced().await;
    converged(&r, &client).await;
    r.stop().await;

    create_namespace(&client, "churn").await;
    let churn = LeaseChurn::start(client.clone(), "churn", Duration::from_millis(50))
        .await
        .unwrap();
    // While down: ConfigMap changes, then Lease renewals only.
    create_cm(&client, "cm-new", "n").await;
    patch_cm(&client, "cm-0", "changed").await;
    delete_cm(&client, "cm-1").await;
    let want = listed::<ConfigMap>(&client).await;
    let global_before = server_rv(&client).await;
    eventually("the Lease renewals to move the global RV", 10, async || {
        (server_rv(&client).await > global_before + 5).then_some(())
    })
    .await;
    let audit_mark = env.audit_events().len();

    let r = start(&env, &db, strict, &seen).await;
    r.synced().await;
    // The sync point holds every change made while down: what the store held when it said
    // synced equals the server's ConfigMaps (which did not change since).
    let scope = r.cms.scope();
    let until = r.cms.status().borrow().synced_seq.expect("a sync point");
    let mut at_sync: BTreeMap<String, String> = BTreeMap::new();
    let snapshot_keys: Vec<String> =
        r.db.log()
            .read_after(durable_informer::store::Seq(0), usize::MAX, Some(scope))
            .unwrap()
            .into_iter()
            .filter(|e| e.seq <= until)
            .map(|e| {
                let key = e.key.to_string();
                if e.kind == durable_informer::store::DeltaKind::Deleted {
                    at_sync.remove(&key);
                } else {
                    at_sync.insert(key.clone(), e.rv.0.clone());
                }
                key
            })
            .collect();
    assert!(!snapshot_keys.is_empty());
    let at_sync: BTreeMap<String, String> = at_sync.into_iter().filter(|(k, _)| k.starts_with(NS)).collect();
    let want: BTreeMap<String, String> = want.into_iter().filter(|(k, _)| k.starts_with(NS)).collect();
    assert_eq!(at_sync, want, "the state at the sync point is the server's");
    let renewals = churn.stop().await.unwrap();
    assert!(renewals > 5, "the Lease was renewed while the informer restarted");
    assert_eq!(r.cms.status().borrow().lists, 0);
    r.stop().await;
    let requests = informer_requests(&env, audit_mark);
    let full: Vec<_> = requests.iter().filter(|r| is_full_list(r)).collect();
    assert!(full.is_empty(), "full LISTs after the restart: {full:?}");
    assert!(
        requests
            .iter()
            .any(|(v, uri)| v == "list" && uri.contains("_revision_probe_")),
        "the watch cache's revision was asked: {requests:?}"
    );
}

on_servers!(the_initial_list_streams_where_the_server_can);
async fn the_initial_list_streams_where_the_server_can(server: Server) {
    let env = EnvTest::start(server).await;
    let client = env.client().await;
    create_namespace(&client, NS).await;
    for i in 0..120 {
        create_cm(&client, &format!("cm-{i}"), "v").await;
    }
    let dir = tempfile::tempdir().unwrap();
    let seen = Seen::default();
    // Pages of 50: a paginated LIST of the ConfigMaps takes at least three requests.
    let small_pages = ReflectorConfig {
        page_size: 50,
        ..config()
    };
    let r = start(&env, &dir.path().join("db.redb"), small_pages, &seen).await;
    r.synced().await;
    converged(&r, &client).await;
    assert_eq!(r.cms.status().borrow().lists, 1);
    r.stop().await;
    let cms: Vec<(String, String)> = informer_requests(&env, 0)
        .into_iter()
        .filter(|(_, uri)| uri.contains("/configmaps"))
        .collect();
    let lists: Vec<_> = cms.iter().filter(|(v, _)| v == "list").collect();
    let streams: Vec<_> = cms
        .iter()
        .filter(|(v, uri)| v == "watch" && uri.contains("sendInitialEvents=true"))
        .collect();
    if server.streams_lists() {
        assert!(lists.is_empty(), "{server}: no LIST at all, the list streamed: {cms:?}");
        assert_eq!(streams.len(), 1, "{server}: one streaming list: {cms:?}");
    } else {
        // v1.20 refuses sendInitialEvents: the informer falls back to a paginated LIST.
        assert!(lists.len() >= 3, "{server}: a paginated LIST of 50 a page: {cms:?}");
        assert!(
            lists.iter().all(|(_, uri)| uri.contains("limit=50")),
            "{server}: {lists:?}"
        );
    }
}

on_servers!(a_cluster_restart_and_compaction_while_down_give_410_from_the_watch_cache);
async fn a_cluster_restart_and_compaction_while_down_give_410_from_the_watch_cache(server: Server) {
    // The watch cache on (the default): after a restart its window starts at the current RV,
    // so a watch from an older one gets 410 from the cache, and etcd has compacted it too.
    let mut env = EnvTest::start_with(
        server,
        Options {
            compaction_interval: Some(Duration::from_secs(1)),
            ..Options::default()
        },
    )
    .await;
    let client = env.client().await;
    create_namespace(&client, NS).await;
    for i in 0..6 {
        create_cm(&client, &format!("cm-{i}"), "v").await;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db.redb");
    let seen = Seen::default();
    let r = start(&env, &db, config(), &seen).await;
    r.synced().await;
    converged(&r, &client).await;
    let persisted = persisted_rv(&r.cms);
    r.stop().await;

    for i in 0..3 {
        delete_cm(&client, &format!("cm-{i}")).await;
    }
    patch_cm(&client, "cm-3", "changed").await;
    create_cm(&client, "cm-new", "n").await;
    let cms = Api::<ConfigMap>::all(client.clone());
    eventually("etcd to compact past the persisted RV", 60, async || {
        let lp = ListParams {
            resource_version: Some((persisted + 1).to_string()),
            version_match: Some(VersionMatch::Exact),
            limit: Some(1),
            ..ListParams::default()
        };
        match cms.list_metadata(&lp).await {
            Err(kube::Error::Api(s)) if s.code == 410 => Some(()),
            _ => None,
        }
    })
    .await;
    env.restart().await;
    let client = env.client().await;
    seen.lock().unwrap().clear();

    let r = start(&env, &db, config(), &seen).await;
    r.synced().await;
    converged(&r, &client).await;
    wait_seen(
        &seen,
        &[
            "delete cm e2e/cm-0 (unknown)",
            "delete cm e2e/cm-1 (unknown)",
            "delete cm e2e/cm-2 (unknown)",
            "update cm e2e/cm-3",
            "add cm e2e/cm-new",
        ],
    )
    .await;
    let status = r.cms.status().borrow().clone();
    assert_eq!(status.relists, 1, "{status:?}");
    assert!(
        matches!(status.last_list_reason, Some(ListReason::Gone(_))),
        "{status:?}"
    );
    if server >= Server::V1_37_2 {
        assert!(
            consistent_reads_from_cache(&env, "configmaps").await >= 1.0,
            "the resume's probe was a consistent read from the cache"
        );
    }
    r.stop().await;
    // The relist streamed where the server can (v1.20's refusal of the streaming list, a 422,
    // is in the log too: only the list form the server serves is counted).
    let relists: Vec<_> = informer_requests(&env, 0)
        .into_iter()
        .filter(|r| r.1.contains("/configmaps") && is_full_list(r))
        .filter(|(verb, _)| (verb == "watch") == server.streams_lists())
        .collect();
    assert_eq!(relists.len(), 2, "{server}: the first list and the relist: {relists:?}");
}

on_servers!(a_resume_after_a_consistent_list_syncs_within_seconds);
/// The resume's sync target must stay reachable when a client read the resource meanwhile.
/// On v1.37 a consistent LIST (this one, or the resume's own one-object probe) moves the
/// watch cache's revision to the cluster-wide RV without an event of the resource, and the
/// watch cache sends an ordinary watch a bookmark once a minute: fails there until the
/// reflector gets a bookmark promptly (docs/kubernetes-versions.md, "Resume").
async fn a_resume_after_a_consistent_list_syncs_within_seconds(server: Server) {
    let env = EnvTest::start(server).await;
    let client = env.client().await;
    create_namespace(&client, NS).await;
    create_cm(&client, "cm-0", "v").await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db.redb");
    let seen = Seen::default();
    let r = start(&env, &db, config(), &seen).await;
    r.synced().await;
    r.stop().await;
    // Something else moves the cluster-wide RV, then a client lists the ConfigMaps.
    create_namespace(&client, "elsewhere").await;
    listed::<ConfigMap>(&client).await;
    let started = std::time::Instant::now();
    let r = start(&env, &db, config(), &seen).await;
    let synced = tokio::time::timeout(Duration::from_secs(10), r.cms.wait_for_sync()).await;
    let status = r.cms.status().borrow().clone();
    assert!(
        synced.is_ok(),
        "{server}: a resume not synced {:?} after its start: {status:?}",
        started.elapsed()
    );
    assert_eq!(status.lists, 0, "{status:?}");
    r.stop().await;
}

/// What the server says about ConfigMaps after a consistent read: the ConfigMaps' last event
/// (the highest RV a LIST holds: nothing deletes ConfigMaps here), the watch cache's revision
/// (an RV=0 LIST, as the reflector's revision probe), and what watches from that last event
/// deliver. Shared by the test below, on both servers.
struct AfterConsistentRead {
    last_event: u64,
    revision: u64,
}

async fn after_a_consistent_read(client: &kube::Client) -> AfterConsistentRead {
    create_namespace(client, NS).await;
    create_cm(client, "cm-0", "v").await;
    // Another resource moves the cluster-wide RV, then a consistent LIST of the ConfigMaps.
    create_namespace(client, "elsewhere").await;
    let last_event = listed::<ConfigMap>(client)
        .await
        .values()
        .map(|rv| rv.parse::<u64>().unwrap())
        .max()
        .unwrap();
    let probe = ListParams {
        resource_version: Some("0".into()),
        field_selector: Some(durable_informer::source::REVISION_PROBE_SELECTOR.into()),
        ..ListParams::default()
    };
    let revision = Api::<ConfigMap>::all(client.clone())
        .list_metadata(&probe)
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap()
        .parse()
        .unwrap();
    AfterConsistentRead { last_event, revision }
}

/// Every event of one watch of the ConfigMaps until it ends: `(type, RV, annotations)`.
async fn watch_all(
    client: &kube::Client,
    from: u64,
    params: &kube::api::WatchParams,
) -> Vec<(&'static str, u64, BTreeMap<String, String>)> {
    use futures::StreamExt;
    use kube::api::WatchEvent;
    let api = Api::<ConfigMap>::all(client.clone());
    let stream = api.watch(params, &from.to_string()).await.unwrap();
    let mut stream = std::pin::pin!(stream);
    let mut out = Vec::new();
    let rv = |o: &ConfigMap| o.resource_version().unwrap_or_default().parse().unwrap_or(0);
    while let Some(ev) = stream.next().await {
        out.push(match ev.unwrap() {
            WatchEvent::Added(o) => ("ADDED", rv(&o), BTreeMap::new()),
            WatchEvent::Modified(o) => ("MODIFIED", rv(&o), BTreeMap::new()),
            WatchEvent::Deleted(o) => ("DELETED", rv(&o), BTreeMap::new()),
            WatchEvent::Bookmark(b) => (
                "BOOKMARK",
                b.metadata.resource_version.parse().unwrap_or(0),
                b.metadata.annotations,
            ),
            WatchEvent::Error(e) => panic!("watch from {from}: {e:?}"),
        });
    }
    out
}

on_servers!(after_a_consistent_read_only_a_bookmark_reaches_the_caches_revision);
/// The server behaviour that bounds a resume's sync on v1.37 (docs/kubernetes-versions.md,
/// "Why a resume after a consistent read waits for a bookmark"). On v1.37 a consistent LIST
/// moves the watch cache's revision past the resource's last event with no event of its own,
/// so a watch resumed from that event delivers no event and reaches the revision only by a
/// periodic bookmark; the one request whose bookmark follows its initial events at once
/// (`sendInitialEvents=true`) sends every object, changed since its RV or not, so it is a
/// relist. On v1.20 the revision stays at the resource's last event: a resume is synced at once.
async fn after_a_consistent_read_only_a_bookmark_reaches_the_caches_revision(server: Server) {
    let env = EnvTest::start(server).await;
    let client = env.client().await;
    let AfterConsistentRead { last_event, revision } = after_a_consistent_read(&client).await;
    if server < Server::V1_37_2 {
        assert_eq!(
            revision, last_event,
            "{server}: the cache's revision is the last ConfigMap event"
        );
        return;
    }
    assert!(
        revision > last_event,
        "{server}: the consistent read moved the cache's revision ({revision}) past the last ConfigMap event ({last_event})"
    );
    // A resumed watch: nothing but bookmarks, the first one at or past the revision comes
    // with the watch cache's periodic tick (2 s before a short watch's deadline).
    let short = kube::api::WatchParams::default().timeout(3);
    let mut watches = Vec::new();
    let reached = loop {
        let events = watch_all(&client, last_event, &short).await;
        let reached = events.iter().any(|(t, rv, _)| *t == "BOOKMARK" && *rv >= revision);
        watches.push(events);
        if reached || watches.len() == 5 {
            break reached;
        }
    };
    assert!(
        watches.iter().flatten().all(|(t, _, _)| *t == "BOOKMARK"),
        "{server}: no ConfigMap changed, so a watch from {last_event} delivers bookmarks only: {watches:?}"
    );
    assert!(
        reached,
        "{server}: a bookmark at or past {revision} in 5 watches of 3 s: {watches:?}"
    );
    // A streaming list from that same RV: cm-0, unchanged since then, is sent again, and the
    // bookmark that ends the initial events (at once, not on a tick) carries the revision.
    let stream = kube::api::WatchParams::streaming_lists()
        .fields(&format!("metadata.namespace={NS}"))
        .timeout(3);
    let events = watch_all(&client, last_event, &stream).await;
    assert!(
        events.iter().any(|(t, rv, _)| *t == "ADDED" && *rv <= last_event),
        "{server}: the initial events hold an object unchanged since {last_event}: {events:?}"
    );
    let end = events
        .iter()
        .find(|(t, _, a)| *t == "BOOKMARK" && a.get("k8s.io/initial-events-end").map(String::as_str) == Some("true"))
        .unwrap_or_else(|| panic!("{server}: an initial-events-end bookmark: {events:?}"));
    assert!(end.1 >= revision, "{server}: {end:?} against the revision {revision}");
}
