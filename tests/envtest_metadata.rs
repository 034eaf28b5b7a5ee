//! Metadata-only informers and the kube-shaped reader against real kube-apiservers (v1.20.2 and
//! v1.37.2): the server answers `PartialObjectMetadata`, the informer stores metadata only,
//! and a restart resumes without a full LIST (checked in the audit log).
//!
//! Ignored by default: run `scripts/envtest-install` once, then
//! `cargo test --all-features --test envtest_metadata -- --ignored`.

mod envtest;

use std::collections::BTreeSet;
use std::time::Duration;

use durable_informer::informer::Informer;
use durable_informer::source::KubeSource;
use durable_informer::store::{DurableStore, StoreConfig};
use envtest::{on_servers, EnvTest, Server};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, DeleteParams, PostParams};
use kube::core::{ApiResource, PartialObjectMeta};
use kube::ResourceExt;

const NS: &str = "meta";
const INFORMER: &str = "informer";

async fn create_cm(client: &kube::Client, name: &str) {
    let cm: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {"app": "meta"}},
        "data": {"secret-ish": "VALUE-THAT-MUST-NOT-BE-STORED"}
    }))
    .unwrap();
    Api::<ConfigMap>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &cm)
        .await
        .unwrap();
}

async fn informer(env: &EnvTest, db: &DurableStore) -> Informer<PartialObjectMeta<ConfigMap>> {
    let source = KubeSource::new(
        env.client_as(INFORMER).await,
        &env.url(),
        ApiResource::erase::<ConfigMap>(&()),
    )
    .namespace(NS)
    .metadata_only();
    Informer::<PartialObjectMeta<ConfigMap>>::builder(db, source)
        .build()
        .await
        .unwrap()
}

fn names(state: &[std::sync::Arc<PartialObjectMeta<ConfigMap>>]) -> BTreeSet<String> {
    state.iter().map(|c| c.name_any()).collect()
}

on_servers!(a_metadata_informer_syncs_stores_metadata_and_resumes_without_a_list);
async fn a_metadata_informer_syncs_stores_metadata_and_resumes_without_a_list(server: Server) {
    let env = EnvTest::start(server).await;
    let client = env.client().await;
    let ns: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": NS}})).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    for i in 0..5 {
        create_cm(&client, &format!("cm-{i}")).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db.redb");
    {
        let db = DurableStore::open(StoreConfig::new(&path)).unwrap();
        let cms = informer(&env, &db).await;
        let reader = cms.reader();
        cms.start();
        tokio::time::timeout(Duration::from_secs(60), reader.wait_until_ready())
            .await
            .unwrap()
            .unwrap();
        let state = reader.state();
        // kube-root-ca.crt exists only where a controller-manager publishes it: none here.
        let want: BTreeSet<String> = (0..5).map(|i| format!("cm-{i}")).collect();
        assert_eq!(names(&state), want);
        assert!(state
            .iter()
            .all(|c| c.labels().get("app").map(String::as_str) == Some("meta")));
        for o in cms.store().snapshot().unwrap().list().unwrap() {
            let text = String::from_utf8_lossy(&o.bytes);
            assert!(!text.contains("VALUE-THAT-MUST-NOT-BE-STORED"), "metadata only: {text}");
            assert!(text.contains("PartialObjectMetadata"), "{text}");
        }
        cms.shutdown().await.unwrap();
        drop(cms);
        tokio::task::spawn_blocking(move || db.close()).await.unwrap().unwrap();
    }
    // While down: one created, one deleted.
    create_cm(&client, "cm-new").await;
    Api::<ConfigMap>::namespaced(client.clone(), NS)
        .delete("cm-0", &DeleteParams::default())
        .await
        .unwrap();
    let audit_mark = env.audit_events().len();
    let db = DurableStore::open(StoreConfig::new(&path)).unwrap();
    let cms = informer(&env, &db).await;
    assert!(cms.is_restored());
    let reader = cms.reader();
    cms.start();
    tokio::time::timeout(Duration::from_secs(60), reader.wait_until_ready())
        .await
        .unwrap()
        .unwrap();
    let want: BTreeSet<String> = (1..5).map(|i| format!("cm-{i}")).chain(["cm-new".to_owned()]).collect();
    envtest::eventually("the changes made while down arrived", 60, async || {
        (names(&reader.state()) == want).then_some(())
    })
    .await;
    assert_eq!(cms.status().borrow().lists, 0, "no relist");
    cms.shutdown().await.unwrap();
    // Every request the informer made after the restart: no LIST beyond one-object probes, and
    // a watch (logged when it ends, so waited for).
    let requests = |env: &EnvTest| -> Vec<(String, String)> {
        env.audit_events()
            .into_iter()
            .skip(audit_mark)
            .filter(|e| e["user"]["username"] == INFORMER)
            .map(|e| {
                (
                    e["verb"].as_str().unwrap_or_default().to_owned(),
                    e["requestURI"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    };
    let seen = envtest::eventually("the resumed watch in the audit log", 30, async || {
        let r = requests(&env);
        r.iter().any(|(v, _)| v == "watch").then_some(r)
    })
    .await;
    let full: Vec<_> = seen
        .iter()
        .filter(|(v, uri)| v == "list" && !uri.contains("limit=1") && !uri.contains("_revision_probe_"))
        .collect();
    assert!(full.is_empty(), "full LISTs after the restart: {full:?}");
}
