//! KEP-5866 sharded list and watch against real servers (issue #34): informers holding one
//! shard each partition the ConfigMaps exactly, on v1.37.2 with the `ShardedListAndWatch` gate
//! on (the server filters: it echoes `metadata.shardInfo`, each informer receives only its
//! share) and off, and on v1.20.2 (the server ignores `shardSelector`: the informer filters).
//! The server's hash and ours agree object by object, and a restart with a wider range fetches
//! only the added range at the persisted resourceVersion.
//!
//! Ignored by default: run `scripts/envtest-install`, then
//! `cargo test --all-features --test 'envtest_*' -- --ignored`.

mod envtest;

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use durable_informer::informer::Informer;
use durable_informer::object::ScopeSpec;
use durable_informer::reflector::{ReflectorConfig, ShardMode};
use durable_informer::selector::ShardSelector;
use durable_informer::source::{
    KubeSource, ListPage, ListRequest, Source, SourceError, WatchEvent, WatchRequest, WatchStream,
};
use durable_informer::store::{DurableStore, StoreConfig};
use envtest::{eventually, on_servers, EnvTest, Options, Server};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, ListParams, PostParams};
use kube::ResourceExt;

const NS: &str = "shards";
const SHARDS: u32 = 3;
const GATE: &str = "ShardedListAndWatch";

/// What a source received: objects and bytes of list pages and watch events (not the
/// one-object RV probe or the revision probe, which are no part of the shard's data).
#[derive(Default)]
struct Received {
    objects: AtomicU64,
    bytes: AtomicU64,
}

impl Received {
    fn add(&self, bytes: usize) {
        self.objects.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    fn objects(&self) -> u64 {
        self.objects.load(Ordering::Relaxed)
    }
}

/// A source that counts what the server sent, before the reflector's own shard filter.
struct Counting {
    inner: KubeSource,
    received: Arc<Received>,
}

impl Source for Counting {
    async fn list(&self, req: ListRequest) -> Result<ListPage, SourceError> {
        let probe = req.revision_only || req.limit == Some(1);
        let page = self.inner.list(req).await?;
        if !probe {
            for o in &page.items {
                self.received.add(o.bytes.len());
            }
        }
        Ok(page)
    }

    async fn watch(&self, req: WatchRequest) -> Result<WatchStream, SourceError> {
        let received = self.received.clone();
        let stream = self.inner.watch(req).await?;
        Ok(stream
            .inspect(move |ev| {
                if let Ok(WatchEvent::Added(o) | WatchEvent::Modified(o) | WatchEvent::Deleted(o)) = ev {
                    received.add(o.bytes.len());
                }
            })
            .boxed())
    }

    async fn cluster_identity(&self) -> Result<Option<String>, SourceError> {
        self.inner.cluster_identity().await
    }

    fn resource(&self) -> String {
        self.inner.resource()
    }

    fn scope(&self) -> ScopeSpec {
        self.inner.scope()
    }
}

fn shard(index: u32, count: u32) -> ShardSelector {
    ShardSelector::by_uid(index, count).unwrap()
}

/// `namespace/name` of every ConfigMap on the server whose UID hashes into `shard` (all when
/// `None`), by our hash.
async fn on_server(client: &kube::Client, shard: Option<&ShardSelector>) -> BTreeSet<String> {
    Api::<ConfigMap>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|cm| {
            let uid = cm.uid().unwrap_or_default();
            shard.is_none_or(|s| s.matches(|_| Some(uid.as_str())))
        })
        .map(|cm| format!("{}/{}", cm.namespace().unwrap_or_default(), cm.name_any()))
        .collect()
}

fn stored(informer: &Informer<ConfigMap>) -> BTreeSet<String> {
    informer
        .store()
        .list()
        .unwrap()
        .into_iter()
        .map(|o| o.key.to_string())
        .collect()
}

async fn create_cms(client: &kube::Client, prefix: &str, n: usize) {
    let api = Api::<ConfigMap>::namespaced(client.clone(), NS);
    for i in 0..n {
        let cm: ConfigMap = serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("{prefix}-{i}")},
            "data": {"v": "x".repeat(100)}
        }))
        .unwrap();
        api.create(&PostParams::default(), &cm).await.unwrap();
    }
}

struct Sharded {
    db: DurableStore,
    informer: Informer<ConfigMap>,
    received: Arc<Received>,
}

async fn start(env: &EnvTest, path: &Path, shard: ShardSelector, streaming: bool) -> Sharded {
    let p = path.to_owned();
    let db = tokio::task::spawn_blocking(move || DurableStore::open(StoreConfig::new(p)))
        .await
        .unwrap()
        .unwrap();
    let received = Arc::new(Received::default());
    let source = Counting {
        inner: KubeSource::typed::<ConfigMap>(env.client_as("informer").await, &env.url()),
        received: received.clone(),
    };
    let informer = Informer::<ConfigMap>::builder(&db, source)
        .reflector_config(ReflectorConfig {
            sharding: Some(shard),
            streaming_list: streaming,
            ..ReflectorConfig::default()
        })
        .build()
        .await
        .unwrap();
    informer.start();
    match tokio::time::timeout(Duration::from_secs(60), informer.wait_for_sync()).await {
        Ok(synced) => synced.expect("cache synced"),
        Err(_) => panic!("{}: not synced in 60 s: {:?}", env.server(), informer.status().borrow()),
    }
    Sharded { db, informer, received }
}

impl Sharded {
    async fn stop(self) {
        self.informer.shutdown().await.unwrap();
        let Sharded { db, informer, .. } = self;
        drop(informer);
        tokio::task::spawn_blocking(move || db.close()).await.unwrap().unwrap();
    }

    async fn converges_to(&self, want: &BTreeSet<String>) {
        let mut got = BTreeSet::new();
        for _ in 0..300 {
            got = stored(&self.informer);
            if &got == want {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(&got, want, "the shard's store");
    }
}

/// Three informers, one shard each, streaming lists (shards 0 and 1) and a paginated LIST
/// (shard 2); then live changes; then shard 0 restarted as shard 0 of 2.
async fn shards_partition_the_configmaps(server: Server, gate_on: bool) {
    let options = Options {
        feature_gates: if gate_on && server >= Server::V1_37_2 {
            vec![format!("{GATE}=true")]
        } else {
            Vec::new()
        },
        ..Options::default()
    };
    let env = EnvTest::start_with(server, options).await;
    let server_filters = server >= Server::V1_37_2 && gate_on;
    if server >= Server::V1_37_2 {
        assert_eq!(env.feature_enabled(GATE).await, Some(gate_on), "{GATE} as asked");
    }
    let client = env.client().await;
    let ns: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": NS}})).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    create_cms(&client, "cm", 90).await;

    // The server's filter against our hash, object by object, and the echoed selector.
    let s0 = shard(0, SHARDS);
    let req = http::Request::get(format!(
        "/api/v1/configmaps?shardSelector={}",
        form_urlencoded::byte_serialize(s0.to_string().as_bytes()).collect::<String>()
    ))
    .body(Vec::new())
    .unwrap();
    let list: serde_json::Value = client.request(req).await.unwrap();
    let names: BTreeSet<String> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            format!(
                "{}/{}",
                o["metadata"]["namespace"].as_str().unwrap(),
                o["metadata"]["name"].as_str().unwrap()
            )
        })
        .collect();
    let all = on_server(&client, None).await;
    if server_filters {
        assert_eq!(names, on_server(&client, Some(&s0)).await, "the server's shard is ours");
        let echoed = list["metadata"]["shardInfo"]["selector"].as_str().unwrap_or_default();
        let parsed: ShardSelector = echoed.parse().unwrap_or_else(|e| panic!("shardInfo {echoed:?}: {e}"));
        assert_eq!(parsed, s0, "shardInfo echoes the selector: {echoed}");
    } else {
        assert_eq!(names, all, "a server without the feature sends everything");
        assert!(list["metadata"].get("shardInfo").is_none(), "{}", list["metadata"]);
    }

    let dir = tempfile::tempdir().unwrap();
    let mut running = Vec::new();
    for i in 0..SHARDS {
        let db = dir.path().join(format!("shard-{i}.redb"));
        running.push(start(&env, &db, shard(i, SHARDS), i != 2).await);
    }
    let mut union = BTreeSet::new();
    for (i, r) in running.iter().enumerate() {
        let want = on_server(&client, Some(&shard(i as u32, SHARDS))).await;
        r.converges_to(&want).await;
        assert!(union.is_disjoint(&want), "shard {i} overlaps another");
        union.extend(want.iter().cloned());
        let received = r.received.objects();
        let sent = if server_filters { want.len() } else { all.len() } as u64;
        assert_eq!(
            received, sent,
            "{server}: objects shard {i} received (server filters: {server_filters})"
        );
        let st = r.informer.status().borrow().clone();
        assert_eq!(st.lists, 1, "{st:?}");
        if i == 2 {
            // The paginated LIST says who filtered; a streaming list does not tell.
            let who = if server_filters {
                ShardMode::Server
            } else {
                ShardMode::Client
            };
            assert_eq!(st.shard_mode, Some(who), "{st:?}");
        }
        eprintln!(
            "{server}: shard {i}/{SHARDS} holds {} of {} ConfigMaps, received {received} objects, {} bytes",
            want.len(),
            all.len(),
            r.received.bytes.load(Ordering::Relaxed)
        );
    }
    assert_eq!(union, all, "the shards cover every ConfigMap");

    // Live changes: each watch delivers its shard (and, when the server filters, only it).
    let before: Vec<u64> = running.iter().map(|r| r.received.objects()).collect();
    create_cms(&client, "live", 30).await;
    let all = on_server(&client, None).await;
    for (i, r) in running.iter().enumerate() {
        let want = on_server(&client, Some(&shard(i as u32, SHARDS))).await;
        r.converges_to(&want).await;
        let live = want.iter().filter(|k| k.contains("/live-")).count() as u64;
        let sent = if server_filters { live } else { 30 };
        eventually("the watch events counted", 10, async || {
            (r.received.objects() - before[i] == sent).then_some(())
        })
        .await;
    }

    // Shard 0 of 3 restarted as shard 0 of 2: keeps what it had, fetches only the added
    // range at its persisted resourceVersion, makes no full list.
    let first = running.remove(0);
    first.stop().await;
    for r in running {
        r.stop().await;
    }
    let wider = shard(0, 2);
    let r = start(&env, &dir.path().join("shard-0.redb"), wider.clone(), true).await;
    let want = on_server(&client, Some(&wider)).await;
    r.converges_to(&want).await;
    let st = r.informer.status().borrow().clone();
    assert_eq!(st.lists, 0, "no full list: {st:?}");
    let added = want.len() - on_server(&client, Some(&s0)).await.len();
    // The fetch lists the added range at the persisted RV; what the range gained after it
    // (another shard's last creations, past our last bookmark) comes by the watch.
    let fetched = st.shard_fetched.unwrap_or_default();
    assert!(fetched > 0 && fetched <= added as u64, "{added} added: {st:?}");
    let sent = if server_filters { added } else { all.len() } as u64;
    assert_eq!(r.received.objects(), sent, "objects the fetch received");
    r.stop().await;
}

on_servers!(three_shards_partition_the_configmaps: v1_20_2, v1_37_2);
async fn three_shards_partition_the_configmaps(server: Server) {
    shards_partition_the_configmaps(server, true).await;
}

on_servers!(with_the_gate_off_the_informer_filters_and_still_partitions: v1_37_2);
async fn with_the_gate_off_the_informer_filters_and_still_partitions(server: Server) {
    shards_partition_the_configmaps(server, false).await;
}
