//! Deterministic workload generators: realistic Pod, ConfigMap and Deployment JSON, N objects
//! over M namespaces, and churn (creates, updates, deletes) — all reproducible from a seed.
//!
//! ## Example
//!
//! ```no_run
//! use durable_informer::sim::{Sim, SimConfig, workload::{Churn, WorkloadGen}};
//!
//! let sim = Sim::start(SimConfig::default())?;
//! let mut gen = WorkloadGen::new(42).namespaces(10);
//! sim.bulk_load("pods", gen.pods(1_000))?;           // about 4 KB each
//! let mut churn = Churn::new(7, "pods", gen.namespace_names());
//! churn.adopt_existing(&sim)?;
//! churn.step(&sim, 500)?;                              // 500 deterministic operations
//! # Ok::<(), durable_informer::sim::SimError>(())
//! ```

use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};

use super::{Result, Sim};

const APPS: &[&str] = &["web", "api", "worker", "cache", "db", "ingest", "auth", "search"];
const PHASES: &[&str] = &["Running", "Running", "Running", "Pending", "Succeeded", "Failed"];

/// Generates objects from a seed: the same seed gives the same objects, byte for byte
/// (except what the server assigns: uid, timestamps, resourceVersion).
#[derive(Debug, Clone)]
pub struct WorkloadGen {
    rng: ChaCha8Rng,
    namespaces: Vec<String>,
    seq: u64,
}

impl WorkloadGen {
    /// A generator with one namespace, `default`.
    pub fn new(seed: u64) -> Self {
        Self {
            rng: ChaCha8Rng::seed_from_u64(seed),
            namespaces: vec!["default".into()],
            seq: 0,
        }
    }

    /// Spread objects over `m` namespaces named `ns-0` … `ns-{m-1}` (at least one).
    #[must_use]
    pub fn namespaces(mut self, m: usize) -> Self {
        self.namespaces = (0..m.max(1)).map(|i| format!("ns-{i}")).collect();
        self
    }

    /// The namespace names objects are spread over.
    pub fn namespace_names(&self) -> Vec<String> {
        self.namespaces.clone()
    }

    /// Namespace objects for [`namespace_names`](Self::namespace_names).
    pub fn namespace_objects(&self) -> Vec<Value> {
        self.namespaces
            .iter()
            .map(|n| json!({"metadata": {"name": n}}))
            .collect()
    }

    fn hex(&mut self, n: usize) -> String {
        (0..n)
            .map(|_| char::from(b"0123456789abcdef"[self.rng.random_range(0..16)]))
            .collect()
    }

    /// A Pod of about 4 KB: labels, ownerReferences, managedFields, two containers, status.
    pub fn pod(&mut self, ns: &str, name: &str) -> Value {
        let app = APPS[self.rng.random_range(0..APPS.len())];
        let phase = PHASES[self.rng.random_range(0..PHASES.len())];
        let node = format!("node-{}", self.rng.random_range(0..50));
        let hash = self.hex(10);
        let owner_uid = format!(
            "{}-{}-4{}-a{}-{}",
            self.hex(8),
            self.hex(4),
            self.hex(3),
            self.hex(3),
            self.hex(12)
        );
        let ip = format!(
            "10.{}.{}.{}",
            self.rng.random_range(0..255),
            self.rng.random_range(0..255),
            self.rng.random_range(1..255)
        );
        let image_tag = self.hex(12);
        let ts = "2026-11-22T09:00:00Z";
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": name, "namespace": ns,
                "labels": {"app": app, "pod-template-hash": hash, "tier": if self.rng.random_bool(0.5) { "frontend" } else { "backend" },
                           "app.kubernetes.io/part-of": "durable-informer-bench"},
                "annotations": {"kubernetes.io/psp": "restricted", "prometheus.io/scrape": "true", "prometheus.io/port": "9090"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": format!("{app}-{hash}"),
                                     "uid": owner_uid, "controller": true, "blockOwnerDeletion": true}],
                "managedFields": [
                    {"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1", "time": ts, "fieldsType": "FieldsV1",
                     "fieldsV1": {"f:metadata": {"f:generateName": {}, "f:labels": {".": {}, "f:app": {}, "f:pod-template-hash": {}, "f:tier": {}},
                                  "f:ownerReferences": {".": {}, format!("k:{{\"uid\":\"{owner_uid}\"}}"): {}}},
                                  "f:spec": {"f:containers": {"k:{\"name\":\"main\"}": {".": {}, "f:image": {}, "f:imagePullPolicy": {}, "f:name": {},
                                  "f:ports": {".": {}, "k:{\"containerPort\":8080,\"protocol\":\"TCP\"}": {".": {}, "f:containerPort": {}, "f:protocol": {}}},
                                  "f:resources": {".": {}, "f:limits": {".": {}, "f:cpu": {}, "f:memory": {}}, "f:requests": {".": {}, "f:cpu": {}, "f:memory": {}}},
                                  "f:terminationMessagePath": {}, "f:terminationMessagePolicy": {}}},
                                  "f:dnsPolicy": {}, "f:enableServiceLinks": {}, "f:restartPolicy": {}, "f:schedulerName": {}, "f:securityContext": {},
                                  "f:terminationGracePeriodSeconds": {}}}},
                    {"manager": "kubelet", "operation": "Update", "apiVersion": "v1", "time": ts, "fieldsType": "FieldsV1", "subresource": "status",
                     "fieldsV1": {"f:status": {"f:conditions": {"k:{\"type\":\"ContainersReady\"}": {".": {}, "f:lastProbeTime": {}, "f:lastTransitionTime": {}, "f:status": {}, "f:type": {}},
                                  "k:{\"type\":\"Initialized\"}": {".": {}, "f:lastProbeTime": {}, "f:lastTransitionTime": {}, "f:status": {}, "f:type": {}},
                                  "k:{\"type\":\"Ready\"}": {".": {}, "f:lastProbeTime": {}, "f:lastTransitionTime": {}, "f:status": {}, "f:type": {}}},
                                  "f:containerStatuses": {}, "f:hostIP": {}, "f:phase": {}, "f:podIP": {}, "f:podIPs": {".": {}, format!("k:{{\"ip\":\"{ip}\"}}"): {".": {}, "f:ip": {}}}, "f:startTime": {}}}}
                ]
            },
            "spec": {
                "containers": [
                    {"name": "main", "image": format!("registry.example.com/{app}:{image_tag}"), "imagePullPolicy": "IfNotPresent",
                     "ports": [{"containerPort": 8080, "protocol": "TCP"}],
                     "env": [{"name": "APP", "value": app}, {"name": "LOG_LEVEL", "value": "info"}],
                     "resources": {"limits": {"cpu": "500m", "memory": "512Mi"}, "requests": {"cpu": "100m", "memory": "128Mi"}},
                     "volumeMounts": [{"name": "kube-api-access", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true}],
                     "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File"},
                    {"name": "sidecar", "image": "registry.example.com/proxy:1.2.3", "imagePullPolicy": "IfNotPresent",
                     "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}},
                     "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File"}
                ],
                "volumes": [{"name": "kube-api-access", "projected": {"defaultMode": 420, "sources": [{"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}}]}}],
                "restartPolicy": "Always", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
                "serviceAccountName": "default", "nodeName": node, "securityContext": {}, "schedulerName": "default-scheduler",
                "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
                                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}],
                "priority": 0, "enableServiceLinks": true, "preemptionPolicy": "PreemptLowerPriority"
            },
            "status": {
                "phase": phase, "hostIP": "192.168.0.10", "podIP": ip, "podIPs": [{"ip": ip}], "startTime": ts, "qosClass": "Burstable",
                "conditions": [
                    {"type": "Initialized", "status": "True", "lastProbeTime": null, "lastTransitionTime": ts},
                    {"type": "Ready", "status": "True", "lastProbeTime": null, "lastTransitionTime": ts},
                    {"type": "ContainersReady", "status": "True", "lastProbeTime": null, "lastTransitionTime": ts},
                    {"type": "PodScheduled", "status": "True", "lastProbeTime": null, "lastTransitionTime": ts}
                ],
                "containerStatuses": [
                    {"name": "main", "ready": true, "restartCount": 0, "image": format!("registry.example.com/{app}:{image_tag}"),
                     "imageID": format!("registry.example.com/{app}@sha256:{}", self.hex(64)), "containerID": format!("containerd://{}", self.hex(64)),
                     "started": true, "state": {"running": {"startedAt": ts}}, "lastState": {}}
                ]
            }
        })
    }

    /// A small ConfigMap with two keys (about 0.2 KB as generated; the server adds about 0.15 KB).
    pub fn configmap(&mut self, ns: &str, name: &str) -> Value {
        let app = APPS[self.rng.random_range(0..APPS.len())];
        let v = self.hex(32);
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": name, "namespace": ns, "labels": {"app": app}},
               "data": {"config.yaml": format!("app: {app}\nreplicas: 3\ntoken: {v}\n"), "LOG_LEVEL": "info"}})
    }

    /// An apps/v1 Deployment with one container and a status, without managedFields (about 0.6 KB
    /// as generated).
    pub fn deployment(&mut self, ns: &str, name: &str) -> Value {
        let app = APPS[self.rng.random_range(0..APPS.len())];
        let replicas = self.rng.random_range(1..6);
        let tag = self.hex(12);
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
               "metadata": {"name": name, "namespace": ns, "labels": {"app": app}},
               "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": app, "deploy": name}},
                        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}},
                        "template": {"metadata": {"labels": {"app": app, "deploy": name}},
                                     "spec": {"containers": [{"name": "main", "image": format!("registry.example.com/{app}:{tag}"),
                                              "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}]}}},
               "status": {"replicas": replicas, "readyReplicas": replicas, "availableReplicas": replicas, "observedGeneration": 1}})
    }

    fn many(&mut self, n: usize, prefix: &str, f: fn(&mut Self, &str, &str) -> Value) -> Vec<Value> {
        (0..n)
            .map(|i| {
                self.seq += 1;
                let ns = self.namespaces[i % self.namespaces.len()].clone();
                f(self, &ns, &format!("{prefix}-{i}"))
            })
            .collect()
    }

    /// `n` Pods named `pod-{i}`, round-robin over the namespaces.
    pub fn pods(&mut self, n: usize) -> Vec<Value> {
        self.many(n, "pod", Self::pod)
    }

    /// `n` ConfigMaps named `cm-{i}`, round-robin over the namespaces.
    pub fn configmaps(&mut self, n: usize) -> Vec<Value> {
        self.many(n, "cm", Self::configmap)
    }

    /// `n` Deployments named `deploy-{i}`, round-robin over the namespaces.
    pub fn deployments(&mut self, n: usize) -> Vec<Value> {
        self.many(n, "deploy", Self::deployment)
    }
}

/// What a churn run did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChurnStats {
    /// Objects created.
    pub creates: u64,
    /// Objects updated.
    pub updates: u64,
    /// Objects deleted.
    pub deletes: u64,
}

/// Deterministic churn over one resource (`pods`, `configmaps` or `deployments`): a seeded mix
/// of creates, updates (label and status changes) and deletes.
#[derive(Debug, Clone)]
pub struct Churn {
    gen: WorkloadGen,
    rng: ChaCha8Rng,
    resource: String,
    namespaces: Vec<String>,
    live: Vec<(String, String)>,
    next: u64,
    weights: (u32, u32, u32),
}

impl Churn {
    /// Churn on `resource` over `namespaces`, seeded; the default mix is 30% creates,
    /// 50% updates, 20% deletes.
    pub fn new(seed: u64, resource: &str, namespaces: Vec<String>) -> Self {
        Self {
            gen: WorkloadGen::new(seed ^ 0x5eed),
            rng: ChaCha8Rng::seed_from_u64(seed),
            resource: resource.to_string(),
            namespaces: if namespaces.is_empty() {
                vec!["default".into()]
            } else {
                namespaces
            },
            live: Vec::new(),
            next: 0,
            weights: (3, 5, 2),
        }
    }

    /// Relative weights of creates, updates and deletes.
    #[must_use]
    pub fn mix(mut self, creates: u32, updates: u32, deletes: u32) -> Self {
        self.weights = (creates, updates, deletes.min(u32::MAX - creates - updates));
        self
    }

    /// Take the objects already stored in the churn's namespaces as candidates for updates and
    /// deletes (in key order, so the run stays deterministic).
    pub fn adopt_existing(&mut self, sim: &Sim) -> Result<()> {
        let st = sim.shared.lock();
        let res = st
            .find(&self.resource)
            .ok_or_else(|| super::SimError::UnknownResource(self.resource.clone()))?;
        for o in st.objects[res].values() {
            if self.namespaces.contains(&o.ns) {
                self.live.push((o.ns.clone(), o.name.clone()));
            }
        }
        Ok(())
    }

    /// Apply `ops` operations to `sim`.
    pub fn step(&mut self, sim: &Sim, ops: usize) -> Result<ChurnStats> {
        let mut stats = ChurnStats::default();
        let (c, u, d) = self.weights;
        let total = (c + u + d).max(1);
        for _ in 0..ops {
            let roll = self.rng.random_range(0..total);
            if roll < c || self.live.is_empty() {
                let ns = self.namespaces[self.rng.random_range(0..self.namespaces.len())].clone();
                self.next += 1;
                let name = format!("churn-{}", self.next);
                let obj = match self.resource.as_str() {
                    "configmaps" => self.gen.configmap(&ns, &name),
                    "deployments" => self.gen.deployment(&ns, &name),
                    _ => self.gen.pod(&ns, &name),
                };
                sim.create(&self.resource, Some(&ns), obj)?;
                self.live.push((ns, name));
                stats.creates += 1;
            } else if roll < c + u {
                let i = self.rng.random_range(0..self.live.len());
                let (ns, name) = self.live[i].clone();
                let gen = self.rng.random_range(0..1_000_000u32).to_string();
                if self.resource == "pods" && self.rng.random_bool(0.5) {
                    let phase = PHASES[self.rng.random_range(0..PHASES.len())];
                    sim.patch_status(&self.resource, Some(&ns), &name, &json!({"status": {"phase": phase}}))?;
                } else {
                    sim.patch(
                        &self.resource,
                        Some(&ns),
                        &name,
                        &json!({"metadata": {"labels": {"churn": gen}}}),
                    )?;
                }
                stats.updates += 1;
            } else {
                let i = self.rng.random_range(0..self.live.len());
                let (ns, name) = self.live.swap_remove(i);
                sim.delete(&self.resource, Some(&ns), &name)?;
                stats.deletes += 1;
            }
        }
        Ok(stats)
    }

    /// Apply operations at about `ops_per_sec` for `duration` (in steps of 10 ms).
    pub async fn run(&mut self, sim: &Sim, ops_per_sec: u64, duration: Duration) -> Result<ChurnStats> {
        let start = tokio::time::Instant::now();
        let mut done: u64 = 0;
        let mut stats = ChurnStats::default();
        while start.elapsed() < duration {
            let due = (start.elapsed().as_secs_f64() * ops_per_sec as f64) as u64;
            if due > done {
                let s = self.step(sim, usize::try_from(due - done).unwrap_or(usize::MAX))?;
                stats.creates += s.creates;
                stats.updates += s.updates;
                stats.deletes += s.deletes;
                done = due;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(stats)
    }
}
