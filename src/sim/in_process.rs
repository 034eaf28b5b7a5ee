//! What the controller test harness (`crate::testing`) needs from the server: a server with no
//! socket and no runtime of its own, deterministic uids and clock, and direct reads of the
//! history (the harness delivers events itself instead of over watches).

use crate::sim::util::JsonAt as _;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use serde_json::Value;

use super::store::{Deterministic, Obj, State, Window};
use super::{AtomicCounters, Faults, Result, Shared, Sim, SimConfig, SimError};

/// One event of the server's history, as the harness's informers deliver it.
#[derive(Debug, Clone)]
pub(crate) struct HistoryEvent {
    /// The revision of the event.
    pub rv: u64,
    /// `ADDED`, `MODIFIED` or `DELETED`.
    pub kind: &'static str,
    /// The object as stored (for DELETED, its final state).
    pub object: Arc<Value>,
}

/// An object as the harness reads it: its revision, its JSON, and its parsed form if kept.
pub(crate) type RawObject = (u64, Bytes, Option<Arc<Value>>);

impl Sim {
    /// A server reached only in-process ([`handle`](Self::handle)): no listener, no runtime,
    /// uids and timestamps from a counter and [`set_clock`](Self::set_clock).
    pub(crate) fn in_process(config: SimConfig) -> Result<Sim> {
        let window = Window {
            max_events: config.history_max_events,
            max_age: config.history_max_age,
        };
        let mut state = State::new(config.resources.clone(), window);
        state.deterministic = Some(Deterministic::default());
        let (rv_tx, _) = tokio::sync::watch::channel(state.rv);
        let (epoch_tx, _) = tokio::sync::watch::channel(0);
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            rv_tx,
            epoch_tx,
            counters: AtomicCounters::default(),
            user_agents: Mutex::default(),
            faults: Faults::default(),
            config,
        });
        let sim = Sim {
            shared,
            addr: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
            runtime: None,
        };
        if sim.shared.config.seed_namespaces {
            for ns in ["default", "kube-system", "kube-public"] {
                sim.create("namespaces", None, serde_json::json!({"metadata": {"name": ns}}))?;
            }
        }
        Ok(sim)
    }

    /// Serve one HTTP request in-process.
    pub(crate) async fn handle(
        &self,
        req: http::Request<http_body_util::Full<bytes::Bytes>>,
    ) -> http::Response<super::server::Body> {
        super::server::handle_in_process(self.shared.clone(), req).await
    }

    /// Whether `resource` (`plural` or `plural.group`) is registered.
    pub(crate) fn knows(&self, resource: &str) -> bool {
        self.shared.lock().find(resource).is_some()
    }

    /// Set the deterministic clock (unix seconds) of an in-process server.
    pub(crate) fn set_clock(&self, secs: u64) {
        if let Some(d) = self.shared.lock().deterministic.as_mut() {
            d.now_secs = secs;
        }
    }

    /// The events of `resource` after revision `after`, oldest first (at most `max`).
    pub(crate) fn events_after(&self, resource: &str, after: u64, max: usize) -> Result<Vec<HistoryEvent>> {
        let mut st = self.shared.lock();
        let res = self.resource(&st, resource)?;
        if after < st.compact_rv {
            return Err(SimError::Api {
                code: 410,
                reason: "Expired".into(),
                message: format!("too old resource version: {after} ({})", st.compact_rv),
            });
        }
        let i = st.history.partition_point(|e| e.rv <= after);
        let found: Vec<(u64, &'static str, Arc<Obj>)> = st
            .history
            .range(i..)
            .filter(|e| e.res == res)
            .take(max)
            .map(|e| (e.rv, e.kind.as_str(), e.obj.clone()))
            .collect();
        Ok(found
            .into_iter()
            .map(|(rv, kind, obj)| HistoryEvent {
                rv,
                kind,
                object: st.parsed.of(&obj),
            })
            .collect())
    }

    /// One object, parsed once per version (see [`get`](Self::get)).
    pub(crate) fn get_parsed(&self, resource: &str, ns: Option<&str>, name: &str) -> Result<Arc<Value>> {
        let mut st = self.shared.lock();
        let res = self.resource(&st, resource)?;
        let obj = st.get(res, ns, name)?;
        Ok(st.parsed.of(&obj))
    }

    /// The parsed version whose bytes `full` are, when it is one of the newest (the answer
    /// to a write is the version the write stored).
    pub(crate) fn parsed_of_bytes(&self, full: &Bytes) -> Option<Arc<Value>> {
        let st = self.shared.lock();
        st.parsed.newest_of_bytes(full, 4)
    }

    /// Remembers a version the harness parsed from a write's answer (`full`, the answer's
    /// bytes): delivering it parses nothing when they are the stored version's.
    pub(crate) fn remember_parsed(&self, full: &Bytes, v: &Arc<Value>) {
        let rv = v
            .at("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .and_then(|s| s.parse().ok());
        if let Some(rv) = rv {
            self.shared.lock().parsed.remember(rv, full.clone(), v.clone());
        }
    }

    /// What the harness's garbage collector must look at after revision `after`: the objects
    /// deleted (resource, namespace, name: their dependents may be orphans now), and the
    /// objects created or changed since that name owners (their owners may be gone already),
    /// with their resource.
    #[allow(clippy::type_complexity)]
    pub(crate) fn gc_changes_since(
        &self,
        after: u64,
    ) -> (Vec<(String, Option<String>, String)>, Vec<(String, Arc<Value>)>) {
        let mut st = self.shared.lock();
        let i = st.history.partition_point(|e| e.rv <= after);
        let mut deleted = Vec::new();
        let mut owning = Vec::new();
        for e in st.history.range(i..) {
            let res = || st.resources.get(e.res).map(|d| d.resource_group()).unwrap_or_default();
            match e.kind.as_str() {
                "DELETED" => {
                    let ns = (!e.obj.ns.is_empty()).then(|| e.obj.ns.clone());
                    deleted.push((res(), ns, e.obj.name.clone()));
                }
                _ if memchr::memmem::find(&e.obj.full, b"\"ownerReferences\"").is_some() => {
                    owning.push((res(), e.obj.clone()));
                }
                _ => {}
            }
        }
        let owning = owning.into_iter().map(|(r, o)| (r, st.parsed.of(&o))).collect();
        (deleted, owning)
    }

    /// An object's uid and whether it is terminating (`deletionTimestamp` set), without
    /// parsing it unless it may be; `None` when it does not exist.
    pub(crate) fn uid_of(&self, resource: &str, ns: Option<&str>, name: &str) -> Result<Option<(String, bool)>> {
        let st = self.shared.lock();
        let res = self.resource(&st, resource)?;
        Ok(st.lookup(res, ns, name).map(|o| {
            let terminating = memchr::memmem::find(&o.full, b"\"deletionTimestamp\"").is_some()
                && o.value().at("/metadata/deletionTimestamp").is_some();
            (o.uid.clone(), terminating)
        }))
    }

    /// The current objects of `resource` in key order: each version's revision (global, so
    /// it names the version), its JSON, and its parsed form when the server keeps it. The
    /// harness parses each version once.
    pub(crate) fn objects_raw(&self, resource: &str) -> Result<Vec<RawObject>> {
        let st = self.shared.lock();
        let res = self.resource(&st, resource)?;
        Ok(st.objects[res]
            .values()
            .map(|o| (o.rv, o.full.clone(), st.parsed.kept(o)))
            .collect())
    }

    /// The objects of `resource` at revision `rv` (the current state when `rv` is the current
    /// revision), in key order; 410 when the history no longer reaches back to `rv`.
    pub(crate) fn objects_at(&self, resource: &str, rv: u64) -> Result<Vec<Arc<Value>>> {
        let mut st = self.shared.lock();
        let res = self.resource(&st, resource)?;
        if rv < st.compact_rv || rv > st.rv {
            return Err(SimError::Api {
                code: 410,
                reason: "Expired".into(),
                message: format!("no state at resource version {rv}"),
            });
        }
        let objects: Vec<Arc<Obj>> = st.snapshot_iter(res, rv, "", "").collect();
        Ok(objects.iter().map(|o| st.parsed.of(o)).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Full};
    use serde_json::json;
    use std::time::Duration;

    /// A streaming list of the ConfigMaps in `default`, with `extra` query parameters.
    fn streaming_list(extra: &str) -> http::Request<Full<Bytes>> {
        http::Request::get(format!(
            "/api/v1/namespaces/default/configmaps?watch=1&sendInitialEvents=true\
             &allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan{extra}"
        ))
        .body(Full::new(Bytes::new()))
        .unwrap()
    }

    /// Restarts the server, writes ConfigMap `name`, and reads to its end a watch opened before.
    async fn restart_write_and_read(sim: &Sim, resp: crate::sim::server::Resp, name: &str) -> String {
        sim.restart();
        sim.create("configmaps", Some("default"), json!({"metadata": {"name": name}}))
            .unwrap();
        let body = tokio::time::timeout(Duration::from_secs(60), resp.into_body().collect())
            .await
            .expect("the watch ends after a restart")
            .expect("the body reads")
            .to_bytes();
        String::from_utf8_lossy(&body).into_owned()
    }

    /// A streaming list that reaches a lagging watch cache lists the state at the cache's
    /// revision, then sends the changes after it; without the mark it lists the current state.
    #[cfg(feature = "testing")]
    #[tokio::test]
    async fn a_lagging_cache_lists_an_older_state_then_catches_up() {
        let sim = Sim::in_process(SimConfig::default()).unwrap();
        sim.create(
            "configmaps",
            Some("default"),
            json!({"metadata": {"name": "a"}, "data": {"v": "1"}}),
        )
        .unwrap();
        sim.create("configmaps", Some("default"), json!({"metadata": {"name": "b"}}))
            .unwrap();
        let at = sim.current_rv();
        sim.patch("configmaps", Some("default"), "a", &json!({"data": {"v": "2"}}))
            .unwrap();
        sim.delete("configmaps", Some("default"), "b").unwrap();
        let now = sim.current_rv();
        let list = |lagging: bool| {
            let mut req = streaming_list("&timeoutSeconds=1");
            if lagging {
                req.extensions_mut().insert(crate::sim::LaggingCache(at));
            }
            let sim = &sim;
            async move {
                let body = sim.handle(req).await.into_body().collect().await.unwrap().to_bytes();
                String::from_utf8_lossy(&body)
                    .lines()
                    .map(|l| {
                        let e: Value = serde_json::from_str(l).unwrap();
                        let o = &e["object"];
                        format!(
                            "{} {} {} {}",
                            e["type"].as_str().unwrap(),
                            o["metadata"]["name"].as_str().unwrap_or("-"),
                            o["metadata"]["resourceVersion"].as_str().unwrap(),
                            o["data"]["v"].as_str().unwrap_or("-"),
                        )
                    })
                    .filter(|l| {
                        !l.starts_with("BOOKMARK") || l.contains(&format!(" {at} ")) || l.contains(&format!(" {now} "))
                    })
                    .collect::<Vec<_>>()
            }
        };
        let lagging = list(true).await;
        assert_eq!(
            &lagging[..3],
            [
                format!("ADDED a {} 1", at - 1),
                format!("ADDED b {at} -"),
                format!("BOOKMARK - {at} -"),
            ],
            "{lagging:?}"
        );
        assert_eq!(
            &lagging[3..5],
            [format!("MODIFIED a {} 2", at + 1), format!("DELETED b {now} -")],
            "{lagging:?}"
        );
        let current = list(false).await;
        assert_eq!(
            &current[..2],
            [format!("ADDED a {} 2", at + 1), format!("BOOKMARK - {now} -")],
            "{current:?}"
        );
    }

    /// A restart ends every open watch: a change made after it never reaches a watch opened
    /// before it, even one still sending its initial events to a reader that is behind.
    #[tokio::test]
    async fn a_watch_open_at_a_restart_never_sends_a_later_change() {
        let sim = Sim::in_process(SimConfig::default()).unwrap();
        // More than the watch's channel holds (16 chunks of 256 KiB): its task waits on it.
        let data = "x".repeat(300);
        let cms = (0..20_000)
            .map(|i| json!({"metadata": {"name": format!("cm-{i}"), "namespace": "default"}, "data": {"k": data}}));
        sim.bulk_load("configmaps", cms).unwrap();
        let resp = sim.handle(streaming_list("")).await;
        assert_eq!(resp.status(), 200);
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        let text = restart_write_and_read(&sim, resp, "late").await;
        assert!(text.contains("\"cm-0\""), "the initial events were sent");
        assert!(
            !text.contains("\"late\""),
            "a change made after the restart reached a watch opened before it"
        );

        // A watch asked for before the restart whose task had not yet read the state: it ends
        // without sending the state after the restart.
        let resp = sim.handle(streaming_list("")).await;
        assert_eq!(resp.status(), 200);
        let text = restart_write_and_read(&sim, resp, "later").await;
        assert!(
            !text.contains("\"later\""),
            "a watch asked for before the restart listed the state after it"
        );
    }
}
