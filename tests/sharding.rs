//! Sharding (KEP-5866) end to end: the simulated server's `shardSelector` over raw HTTP, informers
//! holding one shard with the server filtering or (on a server without the feature) filtering
//! themselves, and a change of range on restart that keeps what is still owned, reports what
//! left as deletes and fetches only the added ranges.

mod sim_common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use durable_informer::informer::{handler_fn, Event, HandlerOptions, Informer, Registration};
use durable_informer::reflector::{ReflectorConfig, ShardMode};
use durable_informer::selector::{fnv1a_64, ShardField, ShardSelector};
use durable_informer::sim::workload::WorkloadGen;
use durable_informer::sim::{Failure, FaultTarget, Sim, SimConfig};
use durable_informer::source::KubeSource;
use durable_informer::store::{DurableStore, Seq, StoreConfig};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::ResourceExt;
use serde_json::{json, Value};
use sim_common::request;

/// `%`-encodes a query value.
fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

async fn sim_with(pods: usize, config: SimConfig) -> Sim {
    tokio::task::spawn_blocking(move || {
        let sim = Sim::start(config.bookmark_interval(Duration::from_millis(300))).expect("start");
        let mut gen = WorkloadGen::new(7).namespaces(4);
        sim.bulk_load("namespaces", gen.namespace_objects())
            .expect("namespaces");
        sim.bulk_load("pods", gen.pods(pods)).expect("pods");
        sim
    })
    .await
    .expect("join")
}

/// Every Pod on the server: key → uid.
async fn server_pods(sim: &Sim) -> BTreeMap<String, String> {
    let api: Api<Pod> = Api::all(sim.client().expect("client"));
    api.list(&ListParams::default())
        .await
        .expect("list")
        .items
        .into_iter()
        .map(|p| {
            (
                format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any()),
                p.uid().unwrap_or_default(),
            )
        })
        .collect()
}

/// `n` more Pods named `{prefix}-{i}`, spread over two namespaces.
fn more_pods(prefix: &str, n: usize) -> Vec<Value> {
    (0..n)
        .map(|i| {
            let ns = if i % 2 == 0 { "default" } else { "kube-public" };
            json!({"metadata": {"name": format!("{prefix}-{i}"), "namespace": ns},
                   "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
        })
        .collect()
}

fn in_shard(shard: &ShardSelector, uid: &str) -> bool {
    shard.matches(|f| (f == ShardField::Uid).then_some(uid))
}

/// The keys of `pods` in `shard`.
fn shard_of(pods: &BTreeMap<String, String>, shard: &ShardSelector) -> BTreeSet<String> {
    pods.iter()
        .filter(|(_, uid)| in_shard(shard, uid))
        .map(|(k, _)| k.clone())
        .collect()
}

fn item_uids(list: &Value) -> Vec<String> {
    list["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|i| i["metadata"]["uid"].as_str().expect("uid").to_owned())
        .collect()
}

// ---------------------------------------------------------------- the simulated server

#[tokio::test]
async fn a_sharded_list_keeps_the_range_and_echoes_the_selector_in_shard_info() {
    let sim = sim_with(300, SimConfig::default()).await;
    let all = server_pods(&sim).await;
    let shard = ShardSelector::by_uid(1, 3).unwrap();
    let raw = shard.to_string();
    let r = request(
        sim.addr(),
        "GET",
        &format!("/api/v1/pods?shardSelector={}", enc(&raw)),
        None,
    )
    .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let list = r.json();
    assert_eq!(list["metadata"]["shardInfo"]["selector"], Value::String(raw.clone()));
    let uids = item_uids(&list);
    let want = shard_of(&all, &shard).len();
    assert!(want > 50 && want < 150, "a third of 300, roughly: {want}");
    assert_eq!(uids.len(), want);
    for u in &uids {
        let h = fnv1a_64(u.as_bytes());
        assert!(
            (0x5555_5555_5555_5555..0xaaaa_aaaa_aaaa_aaaa).contains(&h),
            "{u} hashes to {h:#x}"
        );
    }
    // An unsharded list carries no shardInfo.
    let plain = request(sim.addr(), "GET", "/api/v1/pods", None).await.json();
    assert!(plain["metadata"].get("shardInfo").is_none(), "{}", plain["metadata"]);
    assert_eq!(item_uids(&plain).len(), all.len());
}

#[tokio::test]
async fn a_namespace_shard_keeps_whole_namespaces() {
    let sim = sim_with(200, SimConfig::default()).await;
    let shard = ShardSelector::by_namespace(0, 2).unwrap();
    let path = format!("/api/v1/pods?shardSelector={}", enc(&shard.to_string()));
    let list = request(sim.addr(), "GET", &path, None).await.json();
    let namespaces: BTreeSet<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["namespace"].as_str().unwrap())
        .collect();
    let all = request(sim.addr(), "GET", "/api/v1/pods", None).await.json();
    for item in all["items"].as_array().unwrap() {
        let ns = item["metadata"]["namespace"].as_str().unwrap();
        let owned = shard.matches(|f| (f == ShardField::Namespace).then_some(ns));
        assert_eq!(namespaces.contains(ns), owned, "{ns}");
    }
}

#[tokio::test]
async fn sharded_pages_add_up_to_the_unpaginated_shard() {
    let sim = sim_with(250, SimConfig::default()).await;
    let shard = ShardSelector::by_uid(0, 2).unwrap();
    let sel = enc(&shard.to_string());
    let whole = item_uids(
        &request(sim.addr(), "GET", &format!("/api/v1/pods?shardSelector={sel}"), None)
            .await
            .json(),
    );
    let mut paged = Vec::new();
    let mut token = String::new();
    let mut pages = 0;
    loop {
        let cont = if token.is_empty() {
            String::new()
        } else {
            format!("&continue={}", enc(&token))
        };
        let page = request(
            sim.addr(),
            "GET",
            &format!("/api/v1/pods?limit=20&shardSelector={sel}{cont}"),
            None,
        )
        .await
        .json();
        pages += 1;
        assert!(
            page["metadata"]["shardInfo"]["selector"].is_string(),
            "every page says it is a shard"
        );
        assert!(
            page["metadata"].get("remainingItemCount").is_none(),
            "not counted for a filtered list"
        );
        paged.extend(item_uids(&page));
        match page["metadata"]["continue"].as_str() {
            Some(t) if !t.is_empty() => token = t.to_owned(),
            _ => break,
        }
    }
    assert!(pages > 3, "{pages} pages");
    assert_eq!(paged, whole);
}

#[tokio::test]
async fn watches_and_streaming_lists_send_only_the_shard() {
    let sim = sim_with(120, SimConfig::default()).await;
    let shard = ShardSelector::by_uid(2, 3).unwrap();
    let sel = enc(&shard.to_string());
    let all = server_pods(&sim).await;
    // A streaming list: the shard's objects, then the end bookmark.
    let path = format!(
        "/api/v1/pods?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=1&shardSelector={sel}"
    );
    let events = request(sim.addr(), "GET", &path, None).await.events();
    let added: BTreeSet<String> = events
        .iter()
        .filter(|e| e["type"] == "ADDED")
        .map(|e| e["object"]["metadata"]["uid"].as_str().unwrap().to_owned())
        .collect();
    let want: BTreeSet<String> = all.values().filter(|u| in_shard(&shard, u)).cloned().collect();
    assert_eq!(added, want);
    assert!(events.iter().any(|e| e["type"] == "BOOKMARK"));
    // A watch from now: only changes of the shard's objects.
    let rv = sim.current_rv();
    sim.bulk_load("pods", more_pods("later", 60)).unwrap();
    let path = format!("/api/v1/pods?watch=1&resourceVersion={rv}&timeoutSeconds=1&shardSelector={sel}");
    let events = request(sim.addr(), "GET", &path, None).await.events();
    let uids: Vec<String> = events
        .iter()
        .map(|e| e["object"]["metadata"]["uid"].as_str().unwrap().to_owned())
        .collect();
    let now = server_pods(&sim).await;
    let new_in_shard = now
        .iter()
        .filter(|(k, u)| !all.contains_key(*k) && in_shard(&shard, u))
        .count();
    assert!(new_in_shard > 5, "{new_in_shard}");
    assert_eq!(uids.len(), new_in_shard);
    assert!(uids.iter().all(|u| in_shard(&shard, u)));
}

#[tokio::test]
async fn a_malformed_shard_selector_is_a_400_on_list_and_watch() {
    let sim = sim_with(5, SimConfig::default()).await;
    for bad in [
        "shardRange(object.metadata.name, '0x0', '0x1')",
        "shardRange(object.metadata.uid, '0x8', '0x1')",
        "shardRange(object.metadata.uid, 0, 1)",
        "bogus",
    ] {
        for watch in ["", "&watch=1"] {
            let r = request(
                sim.addr(),
                "GET",
                &format!("/api/v1/pods?shardSelector={}{watch}", enc(bad)),
                None,
            )
            .await;
            assert_eq!(r.status, 400, "{bad} {watch}");
            let status = r.json();
            assert_eq!(status["reason"], "BadRequest");
            let message = status["message"].as_str().unwrap();
            assert!(message.starts_with("invalid shardSelector"), "{message}");
        }
    }
}

#[tokio::test]
async fn a_server_without_the_feature_ignores_the_selector_and_sends_no_shard_info() {
    let sim = sim_with(40, SimConfig::default().sharded_list_watch(false)).await;
    let shard = ShardSelector::by_uid(0, 4).unwrap();
    for sel in [shard.to_string(), "not even a selector".to_owned()] {
        let list = request(
            sim.addr(),
            "GET",
            &format!("/api/v1/pods?shardSelector={}", enc(&sel)),
            None,
        )
        .await
        .json();
        assert!(list["metadata"].get("shardInfo").is_none());
        assert_eq!(item_uids(&list).len(), 40);
    }
}

// ---------------------------------------------------------------- informers

/// What the durable handler heard, and how far it got.
struct Seen {
    events: Arc<Mutex<Vec<(char, String)>>>,
    reg: Registration,
    committed: tokio::sync::watch::Receiver<Seq>,
}

impl Seen {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(char, String)>> {
        self.events.lock().unwrap()
    }

    /// Waits until the handler handled everything committed so far (it reads up to the last
    /// durable commit, which follows within `fsync_delay`).
    async fn settled(&self) {
        let target = *self.committed.borrow();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while self.reg.cursor() < target {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the handler never reached {target:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// An informer of Pods holding `shard`, with a durable handler recording what it hears. A
/// `page_size` of 0 makes the initial list a streaming one, any other a paginated one.
async fn informer(sim: &Sim, db: &DurableStore, shard: Option<ShardSelector>, page_size: u32) -> (Informer<Pod>, Seen) {
    let source = KubeSource::typed::<Pod>(sim.client().unwrap(), &sim.url());
    let config = ReflectorConfig {
        page_size: if page_size == 0 { 500 } else { page_size },
        streaming_list: page_size == 0,
        sharding: shard,
        ..ReflectorConfig::default()
    };
    let informer = Informer::<Pod>::builder(db, source)
        .reflector_config(config)
        .build()
        .await
        .expect("build");
    let events: Arc<Mutex<Vec<(char, String)>>> = Arc::default();
    let s2 = events.clone();
    let reg = informer.add_event_handler(
        handler_fn(move |ev: Event<Pod>| -> Result<(), std::convert::Infallible> {
            let (kind, p) = match &ev {
                Event::Add { object, .. } => ('A', object),
                Event::Update { new, .. } => ('U', new),
                Event::Delete { object, .. } => ('D', object),
            };
            let key = format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any());
            s2.lock().unwrap().push((kind, key));
            Ok(())
        }),
        HandlerOptions::durable("recorder"),
    );
    informer.start();
    tokio::time::timeout(Duration::from_secs(30), informer.wait_for_sync())
        .await
        .expect("synced in time")
        .expect("synced");
    let committed = db.writer().committed();
    (informer, Seen { events, reg, committed })
}

fn stored(informer: &Informer<Pod>) -> BTreeSet<String> {
    informer
        .store()
        .list_keys()
        .unwrap()
        .into_iter()
        .map(|k| format!("{}/{}", k.namespace.unwrap_or_default(), k.name))
        .collect()
}

/// Waits until the informer's store holds `want` and its handler has heard of every change.
async fn converge(informer: &Informer<Pod>, want: &BTreeSet<String>) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while stored(informer) != *want {
        assert!(tokio::time::Instant::now() < deadline, "store never converged");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn keys_of(seen: &Seen, kind: char) -> BTreeSet<String> {
    seen.lock()
        .iter()
        .filter(|(k, _)| *k == kind)
        .map(|(_, key)| key.clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_partition_the_objects_whether_the_server_or_the_client_filters() {
    for server_side in [true, false] {
        let sim = sim_with(240, SimConfig::default().sharded_list_watch(server_side)).await;
        let dir = tempfile::tempdir().unwrap();
        for count in [1u32, 2, 3, 5] {
            let mut union = BTreeSet::new();
            let mut total = 0;
            let mut informers = Vec::new();
            for i in 0..count {
                let db = DurableStore::open(StoreConfig::new(
                    dir.path().join(format!("{server_side}-{count}-{i}.redb")),
                ))
                .unwrap();
                // Small pages (every page is filtered, and tells who filtered), or a streaming list.
                let page_size = if i % 2 == 0 { 25 } else { 0 };
                let (inf, _) = informer(&sim, &db, Some(ShardSelector::by_uid(i, count).unwrap()), page_size).await;
                informers.push((inf, db));
            }
            // Changes after the initial list reach only the owner's watch.
            sim.bulk_load("pods", more_pods(&format!("after-{count}"), 30)).unwrap();
            let all = server_pods(&sim).await;
            for (i, (inf, _)) in informers.iter().enumerate() {
                let shard = ShardSelector::by_uid(u32::try_from(i).unwrap(), count).unwrap();
                let want = shard_of(&all, &shard);
                converge(inf, &want).await;
                total += want.len();
                union.extend(want);
                // The informer's own listing (not the test's computation) is what converged:
                // the modes hold identical sets.
                let mode = inf.status().borrow().shard_mode;
                let expect = if server_side {
                    ShardMode::Server
                } else {
                    ShardMode::Client
                };
                // A streaming initial list does not tell; paginated ones do.
                assert_eq!(mode, (i % 2 == 0).then_some(expect), "shard {i} of {count}");
            }
            assert_eq!(total, all.len(), "{count} shards overlap");
            assert_eq!(union.len(), all.len(), "{count} shards miss objects");
            for (inf, db) in informers {
                inf.shutdown().await.unwrap();
                drop(db);
            }
        }
    }
}

/// Objects the sim sent (LIST items and watch events) since the last reset.
fn fetched(sim: &Sim) -> u64 {
    let c = sim.counters();
    c.list_objects + c.watch_events
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resharding_three_to_four_keeps_owned_objects_and_fetches_only_the_moved_range() {
    let sim = sim_with(2_000, SimConfig::default().history_max_events(1_000_000)).await;
    let all = server_pods(&sim).await;
    let dir = tempfile::tempdir().unwrap();
    let path = |i: u32| dir.path().join(format!("replica-{i}.redb"));
    // Three replicas, each with a third.
    for i in 0..3 {
        let db = DurableStore::open(StoreConfig::new(path(i))).unwrap();
        let (inf, _) = informer(&sim, &db, Some(ShardSelector::by_uid(i, 3).unwrap()), 500).await;
        assert_eq!(stored(&inf), shard_of(&all, &ShardSelector::by_uid(i, 3).unwrap()));
        inf.shutdown().await.unwrap();
    }
    // Which objects change owner going from 3 to 4 shards.
    let owner = |uid: &str, n: u32| {
        (0..n)
            .find(|&i| in_shard(&ShardSelector::by_uid(i, n).unwrap(), uid))
            .unwrap()
    };
    let moved = all.values().filter(|u| owner(u, 3) != owner(u, 4)).count() as u64;
    // Four replicas: the first three on their databases, the fourth on a new one.
    let mut total_fetched = 0;
    for i in 0..4 {
        let (old, new) = (ShardSelector::by_uid(i, 3).ok(), ShardSelector::by_uid(i, 4).unwrap());
        let db = DurableStore::open(StoreConfig::new(path(i))).unwrap();
        sim.reset_counters();
        // The fourth replica's initial list streams (one WATCH); the others fetch by LIST.
        let (inf, seen) = informer(&sim, &db, Some(new.clone()), 0).await;
        let want = shard_of(&all, &new);
        converge(&inf, &want).await;
        let n = fetched(&sim);
        total_fetched += n;
        let held = old.as_ref().map(|o| shard_of(&all, o)).unwrap_or_default();
        let added: BTreeSet<String> = want.difference(&held).cloned().collect();
        let dropped: BTreeSet<String> = held.difference(&want).cloned().collect();
        // Handlers: adds for the added range, deletes for what moved out, nothing else.
        seen.settled().await;
        if old.is_some() {
            assert_eq!(keys_of(&seen, 'D'), dropped, "replica {i}: deletes");
            assert_eq!(
                keys_of(&seen, 'A').difference(&held).cloned().collect::<BTreeSet<_>>(),
                added,
                "replica {i}: adds"
            );
            assert!(inf.is_restored());
            let st = inf.status().borrow().clone();
            assert_eq!(st.lists, 0, "replica {i} made no full list: {st:?}");
            // Nothing to fetch when the new range is inside the old one.
            assert_eq!(
                st.shard_fetched,
                (!added.is_empty()).then_some(added.len() as u64),
                "replica {i}"
            );
            if !added.is_empty() {
                assert_eq!(st.shard_mode, Some(ShardMode::Server));
            }
        }
        // What the server sent: the added range, the one-object probe, nothing more.
        assert!(
            n as f64 <= added.len() as f64 * 1.05 + 1.0,
            "replica {i} fetched {n} objects for {} added",
            added.len()
        );
        inf.shutdown().await.unwrap();
    }
    assert!(
        total_fetched as f64 <= moved as f64 * 1.05 + 4.0,
        "fetched {total_fetched} objects in all for {moved} moved"
    );
    // A restart with the same range makes no full LIST: one probe of one object.
    let db = DurableStore::open(StoreConfig::new(path(1))).unwrap();
    sim.reset_counters();
    let (inf, seen) = informer(&sim, &db, Some(ShardSelector::by_uid(1, 4).unwrap()), 500).await;
    seen.settled().await;
    let c = sim.counters();
    assert!(c.list_objects <= 1 && c.watch_events == 0, "{c:?}");
    assert!(keys_of(&seen, 'D').is_empty());
    inf.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_range_change_on_a_server_without_the_feature_filters_on_the_client() {
    let sim = sim_with(400, SimConfig::default().sharded_list_watch(false)).await;
    let all = server_pods(&sim).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("client-side.redb");
    let (old, new) = (
        ShardSelector::by_uid(0, 2).unwrap(),
        ShardSelector::by_uid(1, 3).unwrap(),
    );
    {
        let db = DurableStore::open(StoreConfig::new(&path)).unwrap();
        let (inf, _) = informer(&sim, &db, Some(old.clone()), 50).await;
        assert_eq!(stored(&inf), shard_of(&all, &old));
        inf.shutdown().await.unwrap();
    }
    let db = DurableStore::open(StoreConfig::new(&path)).unwrap();
    let (inf, seen) = informer(&sim, &db, Some(new.clone()), 50).await;
    let (held, want) = (shard_of(&all, &old), shard_of(&all, &new));
    converge(&inf, &want).await;
    seen.settled().await;
    assert_eq!(keys_of(&seen, 'D'), held.difference(&want).cloned().collect());
    assert_eq!(
        keys_of(&seen, 'A').difference(&held).cloned().collect::<BTreeSet<_>>(),
        want.difference(&held).cloned().collect()
    );
    let st = inf.status().borrow().clone();
    assert_eq!(st.shard_mode, Some(ShardMode::Client));
    assert_eq!(st.lists, 0);
    inf.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compacted_resource_version_falls_back_to_a_relist_that_reports_only_differences() {
    let sim = sim_with(300, SimConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gone.redb");
    let (old, new) = (
        ShardSelector::by_uid(0, 3).unwrap(),
        ShardSelector::by_uid(0, 2).unwrap(),
    );
    let before = server_pods(&sim).await;
    {
        let db = DurableStore::open(StoreConfig::new(&path)).unwrap();
        let (inf, _) = informer(&sim, &db, Some(old.clone()), 100).await;
        assert_eq!(stored(&inf), shard_of(&before, &old));
        inf.shutdown().await.unwrap();
    }
    // While down: a few changes, then the history is compacted past the persisted RV.
    let victims: Vec<String> = shard_of(&before, &old).into_iter().take(5).collect();
    for key in &victims {
        let (ns, name) = key.split_once('/').unwrap();
        sim.delete("pods", Some(ns), name).unwrap();
    }
    sim.compact();
    let after = server_pods(&sim).await;
    let db = DurableStore::open(StoreConfig::new(&path)).unwrap();
    let (inf, seen) = informer(&sim, &db, Some(new.clone()), 100).await;
    let want = shard_of(&after, &new);
    converge(&inf, &want).await;
    seen.settled().await;
    let held = shard_of(&before, &old);
    // Deletes: the objects deleted while down (found by the relist); nothing moved out,
    // since half contains a third. Adds: what the new range added.
    assert_eq!(keys_of(&seen, 'D'), victims.iter().cloned().collect());
    assert_eq!(
        keys_of(&seen, 'A').difference(&held).cloned().collect::<BTreeSet<_>>(),
        want.difference(&held).cloned().collect()
    );
    let st = inf.status().borrow().clone();
    assert_eq!(st.lists, 1, "one relist after the 410: {st:?}");
    assert_eq!(st.shard_fetched, None);
    assert_eq!(inf.store().shard().unwrap().pending, None);
    inf.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_between_the_change_and_the_fetch_fetches_on_the_next_start() {
    let sim = sim_with(300, SimConfig::default()).await;
    let all = server_pods(&sim).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("midway.redb");
    let (old, new) = (
        ShardSelector::by_uid(1, 3).unwrap(),
        ShardSelector::by_uid(1, 4).unwrap(),
    );
    {
        let db = DurableStore::open(StoreConfig::new(&path)).unwrap();
        let (inf, _) = informer(&sim, &db, Some(old.clone()), 100).await;
        inf.shutdown().await.unwrap();
    }
    let (held, want) = (shard_of(&all, &old), shard_of(&all, &new));
    {
        // The change commits; every LIST fails, so the fetch never completes before the stop.
        sim.faults().fail_next(FaultTarget::List, Failure::InternalError, 1_000);
        let db = DurableStore::open(StoreConfig::new(&path)).unwrap();
        let source = KubeSource::typed::<Pod>(sim.client().unwrap(), &sim.url());
        let inf = Informer::<Pod>::builder(&db, source)
            .sharding(new.clone())
            .build()
            .await
            .unwrap();
        inf.start();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while inf.store().shard().unwrap().range.as_ref() != Some(&new) {
            assert!(tokio::time::Instant::now() < deadline, "the change never committed");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The objects of the new range that were held, and only those, are there; the added
        // range is recorded as still to fetch.
        assert_eq!(stored(&inf), held.intersection(&want).cloned().collect());
        let record = inf.store().shard().unwrap();
        assert!(record.pending.is_some(), "{record:?}");
        assert!(!inf.has_synced());
        inf.shutdown().await.unwrap();
        sim.faults().clear();
    }
    // The first store lets go of the file a moment after the drops; the open waits for it.
    let db = DurableStore::open(StoreConfig::new(&path)).unwrap();
    let (inf, seen) = informer(&sim, &db, Some(new.clone()), 100).await;
    converge(&inf, &want).await;
    seen.settled().await;
    // The handler's cursor was held back: it hears the deletes of the first start too.
    assert_eq!(keys_of(&seen, 'D'), held.difference(&want).cloned().collect());
    assert_eq!(
        keys_of(&seen, 'A').difference(&held).cloned().collect::<BTreeSet<_>>(),
        want.difference(&held).cloned().collect()
    );
    assert_eq!(inf.store().shard().unwrap().pending, None);
    inf.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_informer_moves_to_a_new_range_without_a_relist() {
    let sim = sim_with(600, SimConfig::default()).await;
    let all = server_pods(&sim).await;
    let dir = tempfile::tempdir().unwrap();
    let db = DurableStore::open(StoreConfig::new(dir.path().join("live.redb"))).unwrap();
    let (old, new) = (
        ShardSelector::by_uid(1, 3).unwrap(),
        ShardSelector::by_uid(1, 4).unwrap(),
    );
    let (inf, seen) = informer(&sim, &db, Some(old.clone()), 100).await;
    let (held, want) = (shard_of(&all, &old), shard_of(&all, &new));
    converge(&inf, &held).await;
    seen.settled().await;
    seen.lock().clear();
    sim.reset_counters();
    inf.set_sharding(Some(new.clone()));
    assert_eq!(inf.sharding(), Some(new.clone()));
    converge(&inf, &want).await;
    let added: BTreeSet<String> = want.difference(&held).cloned().collect();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while inf.status().borrow().shard_fetched != Some(added.len() as u64) {
        assert!(tokio::time::Instant::now() < deadline, "{:?}", inf.status().borrow());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    seen.settled().await;
    assert_eq!(keys_of(&seen, 'D'), held.difference(&want).cloned().collect());
    assert_eq!(keys_of(&seen, 'A'), added);
    let n = fetched(&sim);
    assert!(
        n as f64 <= added.len() as f64 * 1.05 + 1.0,
        "fetched {n} for {} added",
        added.len()
    );
    let st = inf.status().borrow().clone();
    assert_eq!(st.lists, 1, "only the initial list: {st:?}");
    let record = inf.store().shard().unwrap();
    assert_eq!((record.range, record.pending), (Some(new.clone()), None));
    // The watch resumed with the new range.
    sim.bulk_load("pods", more_pods("moved", 40)).unwrap();
    converge(&inf, &shard_of(&server_pods(&sim).await, &new)).await;
    inf.shutdown().await.unwrap();
}
