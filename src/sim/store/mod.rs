//! The simulated etcd: one global revision, objects as serialized JSON, the event history and
//! compaction. Knows nothing about HTTP.
//!
//! Invariants (kept by [`State`]'s methods):
//! 1. `rv` only grows, by one per create/update/delete, except through `restore`.
//! 2. `history` holds every event with `rv > compact_rv`, in increasing `rv` order.
//! 3. For every resource, `objects[res]` equals the result of applying all events up to `rv`.

use crate::sim::util::JsonAt as _;
use std::collections::{BTreeMap, VecDeque};
use std::ops::Bound;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::util;
use super::ResourceDef;

mod error;
mod object;
#[cfg(feature = "testing")]
mod parsed;
mod prebuilt;

pub(crate) use error::ApiError;
#[cfg(feature = "testing")]
use object::build_obj_parsed;
pub(crate) use object::{build_obj, key_of, merge_patch, strategic_merge_patch, Event, EventKind, Obj};
use object::{check_name, meta_mut, random_suffix, resolve_ns};
#[cfg(feature = "testing")]
pub(crate) use parsed::ParsedVersions;
pub use prebuilt::Prebuilt;

/// Limits of the history (the compaction window).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Window {
    pub max_events: usize,
    pub max_age: Duration,
}

/// A copy of the stored objects at one revision ("an etcd backup").
#[derive(Debug, Clone)]
pub struct Backup {
    pub(crate) rv: u64,
    pub(crate) objects: Vec<BTreeMap<String, Arc<Obj>>>,
}

impl Backup {
    /// The revision the backup was taken at.
    pub fn resource_version(&self) -> u64 {
        self.rv
    }
}

/// Everything behind the server's lock.
#[derive(Debug)]
pub(crate) struct State {
    pub rv: u64,
    /// Events with `rv <= compact_rv` are gone: a watch/list from `N < compact_rv` is expired.
    pub compact_rv: u64,
    pub resources: Vec<Arc<ResourceDef>>,
    pub objects: Vec<BTreeMap<String, Arc<Obj>>>,
    pub history: VecDeque<Event>,
    pub window: Window,
    /// Remaining-item counts of recent paginated lists, so a LIST of N objects in pages is
    /// not O(N²): (resource, list RV, key prefix, start key) → objects from that key on.
    /// Exact because a list at one RV reads one snapshot; cleared by [`State::restore`], after
    /// which an RV can name another state.
    pub remaining_memo: VecDeque<(RemainingKey, usize)>,
    /// Each resource's watch-cache revision: what a real API server's cacher for that
    /// resource has processed. It moves with the resource's own events only (the cacher
    /// watches its resource's etcd prefix; etcd's progress notifications come every ten
    /// minutes by default), so while other resources change it stays behind `rv`. An RV=0
    /// LIST and every bookmark carry it.
    pub cache_rv: Vec<u64>,
    /// The write comes from the cluster itself (the in-process `Sim` API: a test playing a
    /// kubelet or re-enacting a recording), not from a client over HTTP: it may set the
    /// deletion fields a client may not.
    pub server_write: bool,
    /// Set for the controller test harness: uids, timestamps and generated names come from
    /// a counter and a clock it sets instead of randomness and the wall clock, so two runs
    /// of one schedule store the same bytes.
    pub deterministic: Option<Deterministic>,
    /// Object versions parsed for the harness, which reads each one several times.
    #[cfg(feature = "testing")]
    pub parsed: ParsedVersions,
    /// `plural` and `plural.group` → the first resource so named (see [`State::find`]).
    by_name: std::collections::HashMap<String, usize>,
}

/// The harness's source of uids, generated names and the current time.
#[derive(Debug, Clone, Default)]
pub(crate) struct Deterministic {
    /// Objects created so far: the next uid and name suffix derive from it.
    pub created: u64,
    /// What `creationTimestamp` and `deletionTimestamp` read (unix seconds).
    pub now_secs: u64,
    /// Names generated so far per `generateName` prefix: the n-th name of a prefix is the
    /// same whatever else was created before it.
    pub generated: std::collections::HashMap<String, u64>,
}

/// Key of [`State::remaining_memo`].
pub(crate) type RemainingKey = (usize, u64, String, String);

impl State {
    /// Objects from the memo's start key on, if a previous page recorded them.
    pub fn remaining_at(&self, key: &RemainingKey) -> Option<usize> {
        self.remaining_memo.iter().find(|(k, _)| k == key).map(|(_, n)| *n)
    }

    /// Records a count for the next page (bounded: the oldest entries go).
    pub fn remember_remaining(&mut self, key: RemainingKey, n: usize) {
        if self.remaining_memo.len() >= 32 {
            self.remaining_memo.pop_front();
        }
        self.remaining_memo.push_back((key, n));
    }
}

impl State {
    pub fn new(resources: Vec<ResourceDef>, window: Window) -> Self {
        let n = resources.len();
        let mut st = Self {
            rv: 1,
            compact_rv: 1,
            resources: resources.into_iter().map(Arc::new).collect(),
            objects: vec![BTreeMap::new(); n],
            history: VecDeque::new(),
            window,
            remaining_memo: VecDeque::new(),
            server_write: false,
            cache_rv: vec![1; n],
            deterministic: None,
            #[cfg(feature = "testing")]
            parsed: Default::default(),
            by_name: Default::default(),
        };
        (0..n).for_each(|i| st.index_name(i));
        st
    }

    /// A new object's uid: random, or from the counter in deterministic mode.
    fn new_uid(&mut self) -> String {
        match &mut self.deterministic {
            Some(d) => {
                d.created += 1;
                format!("00000000-0000-4000-8000-{:012x}", d.created)
            }
            None => util::new_uid(),
        }
    }

    /// The current time as RFC 3339 (the harness's clock in deterministic mode).
    fn now_rfc3339(&self) -> String {
        match &self.deterministic {
            Some(d) => util::rfc3339(d.now_secs),
            None => util::now_rfc3339(),
        }
    }

    /// The suffix of a `generateName` name.
    fn name_suffix(&mut self, prefix: &str) -> String {
        match &mut self.deterministic {
            Some(d) => {
                let n = d.generated.entry(prefix.to_string()).or_insert(0);
                *n += 1;
                format!("{:05x}", *n % 0x10_0000)
            }
            None => random_suffix(),
        }
    }

    /// Find a resource by plural, `plural.group`, or (group, version, plural).
    pub fn find(&self, name: &str) -> Option<usize> {
        // By map: every request and every delivery of the harness looks its resource up.
        let found = self.by_name.get(name).copied();
        debug_assert_eq!(
            found,
            self.resources.iter().position(|d| {
                d.plural == name
                    || name
                        .strip_prefix(d.plural.as_str())
                        .and_then(|rest| rest.strip_prefix('.'))
                        == Some(d.group.as_str())
            })
        );
        found
    }

    /// Names resource `i` in [`by_name`](Self::by_name); an earlier resource keeps a name.
    fn index_name(&mut self, i: usize) {
        let Some(d) = self.resources.get(i) else {
            return;
        };
        let dotted = format!("{}.{}", d.plural, d.group);
        self.by_name.entry(d.plural.clone()).or_insert(i);
        self.by_name.entry(dotted).or_insert(i);
    }

    pub fn find_gvr(&self, group: &str, version: &str, plural: &str) -> Option<usize> {
        self.resources
            .iter()
            .position(|d| d.group == group && d.version == version && d.plural == plural)
    }

    pub fn register(&mut self, def: ResourceDef) -> usize {
        if let Some(i) = self.find_gvr(&def.group, &def.version, &def.plural) {
            return i;
        }
        self.resources.push(Arc::new(def));
        self.index_name(self.resources.len() - 1);
        self.objects.push(BTreeMap::new());
        // A new cacher starts from a list at the current revision.
        self.cache_rv.push(self.rv);
        self.resources.len() - 1
    }

    /// Drop history outside the window (count and age).
    pub fn maintain(&mut self) {
        let now = Instant::now();
        while let Some(front) = self.history.front() {
            let too_many = self.history.len() > self.window.max_events;
            let too_old = now.duration_since(front.at) > self.window.max_age;
            if !(too_many || too_old) {
                break;
            }
            self.compact_rv = self.compact_rv.max(front.rv);
            self.history.pop_front();
        }
    }

    /// Compact the history up to and including `rv` (clamped to the current revision).
    pub fn compact_to(&mut self, rv: u64) {
        let rv = rv.min(self.rv);
        while self.history.front().is_some_and(|e| e.rv <= rv) {
            self.history.pop_front();
        }
        self.compact_rv = self.compact_rv.max(rv);
    }

    /// Forget the history (a server restart: the watch cache starts at the current revision).
    pub fn reset_history(&mut self) {
        self.history.clear();
        self.compact_rv = self.rv;
    }

    pub fn backup(&self) -> Backup {
        Backup {
            rv: self.rv,
            objects: self.objects.clone(),
        }
    }

    /// Go back to a backup: the revision moves backwards, the history is gone.
    pub fn restore(&mut self, b: &Backup) {
        for (i, m) in b.objects.iter().enumerate() {
            if let Some(slot) = self.objects.get_mut(i) {
                slot.clone_from(m);
            }
        }
        for slot in self.objects.iter_mut().skip(b.objects.len()) {
            slot.clear();
        }
        self.rv = b.rv;
        self.reset_history();
        self.remaining_memo.clear();
        // The cachers start again from a list of the restored state.
        self.cache_rv.iter_mut().for_each(|c| *c = b.rv);
    }

    fn push_event(&mut self, res: usize, kind: EventKind, obj: Arc<Obj>, prev: Option<Arc<Obj>>) {
        if let Some(c) = self.cache_rv.get_mut(res) {
            *c = obj.rv;
        }
        self.history.push_back(Event {
            rv: obj.rv,
            res,
            kind,
            obj,
            prev,
            at: Instant::now(),
        });
        self.maintain();
    }

    /// Create an object. `ns` is the namespace from the path (ignored for cluster resources).
    pub fn create(&mut self, res: usize, ns: Option<&str>, mut v: Value) -> Result<Arc<Obj>, ApiError> {
        let def = self.def(res)?;
        let meta = meta_mut(&mut v)?;
        let name = match meta.get("name").and_then(Value::as_str) {
            Some(n) if !n.is_empty() => n.to_string(),
            _ => match meta.get("generateName").and_then(Value::as_str) {
                Some(g) if !g.is_empty() => {
                    let g = g.to_string();
                    format!("{g}{}", self.name_suffix(&g))
                }
                _ => {
                    return Err(ApiError::invalid(
                        &def,
                        "",
                        "metadata.name: Required value: name or generateName is required",
                    ))
                }
            },
        };
        let ns = resolve_ns(&def, ns, meta)?;
        check_name(&def, &name)?;
        let key = key_of(&def, &ns, &name);
        if self.objects[res].contains_key(&key) {
            let mut e = ApiError::new(
                409,
                "AlreadyExists",
                format!("{} \"{name}\" already exists", def.resource_group()),
            );
            e.details = Some(json!({"name": name, "group": def.group, "kind": def.plural}));
            return Err(e);
        }
        let rv = self.rv + 1;
        meta.insert("name".into(), json!(name));
        meta.remove("generateName");
        if def.namespaced {
            meta.insert("namespace".into(), json!(ns));
        } else {
            meta.remove("namespace");
        }
        let uid = self.new_uid();
        meta.insert("uid".into(), json!(uid));
        meta.insert("resourceVersion".into(), json!(rv.to_string()));
        meta.insert("creationTimestamp".into(), json!(self.now_rfc3339()));
        meta.remove("deletionTimestamp");
        if def.has_generation() {
            meta.insert("generation".into(), json!(1));
        }
        if def.plural == "namespaces" && def.group.is_empty() {
            let obj = v
                .as_object_mut()
                .ok_or_else(|| ApiError::bad_request("object expected"))?;
            obj.entry("spec")
                .or_insert_with(|| json!({"finalizers": ["kubernetes"]}));
            obj.entry("status").or_insert_with(|| json!({"phase": "Active"}));
        }
        let obj = Arc::new(self.build(&def, key.clone(), v)?);
        self.rv = rv;
        self.objects[res].insert(key, obj.clone());
        self.push_event(res, EventKind::Added, obj.clone(), None);
        Ok(obj)
    }

    /// Replace an object (PUT). `status_only` applies only `.status` (the status subresource);
    /// otherwise `.status` is kept for resources with a status subresource.
    pub fn update(
        &mut self,
        res: usize,
        ns: Option<&str>,
        name: &str,
        mut v: Value,
        status_only: bool,
    ) -> Result<Arc<Obj>, ApiError> {
        let (def, key, old) = self.stored(res, ns, name)?;
        let meta = meta_mut(&mut v)?;
        if let Some(body_name) = meta.get("name").and_then(Value::as_str) {
            if body_name != name {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({body_name}) does not match the name on the URL ({name})"
                )));
            }
        }
        if let Some(want) = meta.get("resourceVersion").and_then(Value::as_str) {
            if !want.is_empty() && want != old.rv.to_string() {
                return Err(ApiError::conflict(&def, name));
            }
        }
        let old_v = self.parsed_of(&old);
        let mut new_v = if status_only {
            let mut base = (*old_v).clone();
            if let (Some(b), Some(s)) = (base.as_object_mut(), v.get("status")) {
                b.insert("status".into(), s.clone());
            }
            base
        } else {
            if def.status_subresource {
                if let (Some(o), Some(s)) = (v.as_object_mut(), old_v.get("status")) {
                    o.insert("status".into(), s.clone());
                }
            }
            v
        };
        self.store_update(res, &def, key, old, &old_v, &mut new_v)
    }

    /// Apply a JSON merge patch (RFC 7386) to an object.
    pub fn patch(
        &mut self,
        res: usize,
        ns: Option<&str>,
        name: &str,
        patch: &Value,
        status_only: bool,
    ) -> Result<Arc<Obj>, ApiError> {
        self.patch_with(res, ns, name, patch, status_only, merge_patch)
    }

    /// Apply a patch with `merge` (a JSON merge patch or a strategic merge patch).
    pub fn patch_with(
        &mut self,
        res: usize,
        ns: Option<&str>,
        name: &str,
        patch: &Value,
        status_only: bool,
        merge: fn(&mut Value, &Value),
    ) -> Result<Arc<Obj>, ApiError> {
        let (def, key, old) = self.stored(res, ns, name)?;
        if let Some(want) = patch.at("/metadata/resourceVersion").and_then(Value::as_str) {
            if want != old.rv.to_string() {
                return Err(ApiError::conflict(&def, name));
            }
        }
        let old_v = self.parsed_of(&old);
        let mut new_v = (*old_v).clone();
        if status_only {
            if let Some(s) = patch.get("status") {
                let mut st = new_v
                    .as_object_mut()
                    .and_then(|o| o.remove("status"))
                    .unwrap_or(Value::Null);
                merge(&mut st, s);
                if let Some(o) = new_v.as_object_mut() {
                    o.insert("status".into(), st);
                }
            }
        } else {
            merge(&mut new_v, patch);
            if def.status_subresource {
                if let Some(o) = new_v.as_object_mut() {
                    match old_v.get("status") {
                        Some(s) => o.insert("status".into(), s.clone()),
                        None => o.remove("status"),
                    };
                }
            }
        }
        self.store_update(res, &def, key, old, &old_v, &mut new_v)
    }

    fn store_update(
        &mut self,
        res: usize,
        def: &ResourceDef,
        key: String,
        old: Arc<Obj>,
        old_v: &Value,
        new_v: &mut Value,
    ) -> Result<Arc<Obj>, ApiError> {
        let rv = self.rv + 1;
        let spec_changed = old_v.get("spec") != new_v.get("spec");
        let no_meta = Value::Object(serde_json::Map::new());
        let old_meta = old_v.get("metadata").unwrap_or(&no_meta);
        let meta = meta_mut(new_v)?;
        for k in ["name", "namespace", "uid", "creationTimestamp"] {
            match old_meta.get(k) {
                Some(x) => meta.insert(k.into(), x.clone()),
                None => meta.remove(k),
            };
        }
        let terminating = old_meta.get("deletionTimestamp").is_some();
        // Only a deletion sets these; an update can neither clear nor change them (the real
        // server's BeforeUpdate), and a client that sets them is refused.
        for k in ["deletionTimestamp", "deletionGracePeriodSeconds"] {
            let sets = meta.get(k).is_some_and(|v| !v.is_null());
            if sets && self.server_write {
                continue;
            }
            if sets && old_meta.get(k).is_none() {
                let name = old_meta.get("name").and_then(Value::as_str).unwrap_or_default();
                return Err(ApiError::invalid(
                    def,
                    name,
                    &format!("metadata.{k}: Invalid value: field is immutable; may only be changed via deletion"),
                ));
            }
            match old_meta.get(k) {
                Some(x) => meta.insert(k.into(), x.clone()),
                None => meta.remove(k),
            };
        }
        if terminating {
            let before = finalizers(old_meta.get("finalizers"));
            let added: Vec<String> = finalizers(meta.get("finalizers"))
                .into_iter()
                .filter(|f| !before.contains(f))
                .collect();
            if !added.is_empty() {
                let name = old_meta.get("name").and_then(Value::as_str).unwrap_or_default();
                return Err(ApiError::invalid(
                    def,
                    name,
                    &format!(
                        "metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers {added:?}"
                    ),
                ));
            }
        }
        meta.insert("resourceVersion".into(), json!(rv.to_string()));
        if def.has_generation() {
            let g = old_meta.get("generation").and_then(Value::as_i64).unwrap_or(1);
            meta.insert("generation".into(), json!(if spec_changed { g + 1 } else { g }));
        }
        // The real server's rule: a terminating object with no finalizer left and no grace
        // period goes with this write (a Pod in its grace period stays until deleted again).
        let gone = terminating
            && finalizers(meta.get("finalizers")).is_empty()
            && meta
                .get("deletionGracePeriodSeconds")
                .and_then(Value::as_i64)
                .unwrap_or(0)
                == 0;
        let obj = Arc::new(self.build(def, key.clone(), new_v.take())?);
        self.rv = rv;
        if gone {
            // The last finalizer of a terminating object is gone: the object goes with this
            // write, and watchers see it as one DELETED event carrying this state.
            self.objects[res].remove(&key);
            self.push_event(res, EventKind::Deleted, obj.clone(), Some(old));
        } else {
            self.objects[res].insert(key, obj.clone());
            self.push_event(res, EventKind::Modified, obj.clone(), Some(old));
        }
        Ok(obj)
    }

    /// Delete an object; returns its last state stamped with the deletion's RV, and whether it
    /// stays (terminating) because finalizers are pending.
    ///
    /// An object with `metadata.finalizers` is only marked: `deletionTimestamp` is set (and
    /// `generation` bumped), watchers see MODIFIED, and it goes when a write removes its last
    /// finalizer (see `store_update`). Deleting a terminating object again changes nothing.
    pub fn delete(&mut self, res: usize, ns: Option<&str>, name: &str) -> Result<(Arc<Obj>, bool), ApiError> {
        let (def, key, old) = self.stored(res, ns, name)?;
        let rv = self.rv + 1;
        let mut v = self.value_of(&old);
        let meta = meta_mut(&mut v)?;
        if !finalizers(meta.get("finalizers")).is_empty() {
            if meta.contains_key("deletionTimestamp") {
                return Ok((old, true));
            }
            meta.insert("resourceVersion".into(), json!(rv.to_string()));
            meta.insert("deletionTimestamp".into(), json!(self.now_rfc3339()));
            meta.insert("deletionGracePeriodSeconds".into(), json!(0));
            if let Some(g) = meta.get("generation").and_then(Value::as_i64).filter(|g| *g > 0) {
                meta.insert("generation".into(), json!(g + 1));
            }
            let obj = Arc::new(self.build(&def, key.clone(), v)?);
            self.rv = rv;
            self.objects[res].insert(key, obj.clone());
            self.push_event(res, EventKind::Modified, obj.clone(), Some(old));
            return Ok((obj, true));
        }
        self.objects[res].remove(&key);
        meta.insert("resourceVersion".into(), json!(rv.to_string()));
        if def.plural == "pods" && def.group.is_empty() {
            // Pods are deleted gracefully on a real server; the final event carries these.
            meta.insert("deletionTimestamp".into(), json!(self.now_rfc3339()));
            meta.insert("deletionGracePeriodSeconds".into(), json!(0));
        }
        let obj = Arc::new(self.build(&def, key, v)?);
        self.rv = rv;
        self.push_event(res, EventKind::Deleted, obj.clone(), Some(old));
        Ok((obj, false))
    }

    /// A new stored version; on the in-process server its parsed form is kept for the
    /// harness, which reads every version (the answer to a write, its delivery).
    fn build(&mut self, def: &ResourceDef, key: String, v: Value) -> Result<Obj, ApiError> {
        #[cfg(feature = "testing")]
        if self.deterministic.is_some() {
            let (obj, parsed) = build_obj_parsed(def, key, v, true)?;
            if let Some(p) = parsed {
                self.parsed.remember(obj.rv, obj.full.clone(), Arc::new(p));
            }
            return Ok(obj);
        }
        build_obj(def, key, v)
    }

    /// An object version parsed: a copy of the harness's parsed version on the in-process
    /// server (cheaper than parsing again), parsed otherwise.
    pub fn value_of(&mut self, obj: &Obj) -> Value {
        #[cfg(feature = "testing")]
        if self.deterministic.is_some() {
            return (*self.parsed.of(obj)).clone();
        }
        obj.value()
    }

    /// [`value_of`](Self::value_of) to read only: the parsed version itself when kept.
    fn parsed_of(&mut self, obj: &Obj) -> Arc<Value> {
        #[cfg(feature = "testing")]
        if self.deterministic.is_some() {
            return self.parsed.of(obj);
        }
        Arc::new(obj.value())
    }

    pub fn get(&self, res: usize, ns: Option<&str>, name: &str) -> Result<Arc<Obj>, ApiError> {
        self.stored(res, ns, name).map(|(_, _, obj)| obj)
    }

    /// [`get`](Self::get) for a caller that does not need the 404 (building its message costs
    /// more than the lookup).
    #[cfg(feature = "testing")]
    pub fn lookup(&self, res: usize, ns: Option<&str>, name: &str) -> Option<Arc<Obj>> {
        let def = self.resources.get(res)?;
        self.objects.get(res)?.get(&storage_key(def, ns, name)).cloned()
    }

    /// The resource, storage key and current state of an object (404 when absent). A
    /// namespaced object without a namespace is looked up in `default`, as the server does.
    fn stored(
        &self,
        res: usize,
        ns: Option<&str>,
        name: &str,
    ) -> Result<(Arc<ResourceDef>, String, Arc<Obj>), ApiError> {
        let def = self.def(res)?;
        let key = storage_key(&def, ns, name);
        match self.objects[res].get(&key).cloned() {
            Some(obj) => Ok((def, key, obj)),
            None => Err(ApiError::not_found(&def, name)),
        }
    }

    pub fn def(&self, res: usize) -> Result<Arc<ResourceDef>, ApiError> {
        self.resources
            .get(res)
            .cloned()
            .ok_or_else(|| ApiError::new(404, "NotFound", "the server could not find the requested resource"))
    }

    /// The objects of `res` at revision `at` (>= `compact_rv`), with keys in `[from, ..)` under
    /// `prefix`, in key order.
    pub fn snapshot_iter<'a>(
        &'a self,
        res: usize,
        at: u64,
        prefix: &'a str,
        from: &str,
    ) -> impl Iterator<Item = Arc<Obj>> + 'a {
        let start = if from < prefix {
            prefix.to_string()
        } else {
            from.to_string()
        };
        // The state at `at` of every key changed after it: the first later event tells.
        let mut overlay: BTreeMap<String, Option<Arc<Obj>>> = BTreeMap::new();
        if at < self.rv {
            let i = self.history.partition_point(|e| e.rv <= at);
            for e in self.history.range(i..) {
                if e.res == res && e.obj.key.as_str() >= start.as_str() && e.obj.key.starts_with(prefix) {
                    overlay.entry(e.obj.key.clone()).or_insert_with(|| match e.kind {
                        EventKind::Added => None,
                        _ => e.prev.clone(),
                    });
                }
            }
        }
        let cur = self.objects[res]
            .range::<str, _>((Bound::Included(start.as_str()), Bound::Unbounded))
            .take_while(move |(k, _)| k.starts_with(prefix));
        Merge {
            cur: cur.peekable(),
            over: overlay.into_iter().peekable(),
        }
    }
}

/// Merges the current objects with an overlay of older states (None = did not exist).
struct Merge<A: Iterator, B: Iterator> {
    cur: std::iter::Peekable<A>,
    over: std::iter::Peekable<B>,
}

impl<'a, A, B> Iterator for Merge<A, B>
where
    A: Iterator<Item = (&'a String, &'a Arc<Obj>)>,
    B: Iterator<Item = (String, Option<Arc<Obj>>)>,
{
    type Item = Arc<Obj>;
    fn next(&mut self) -> Option<Arc<Obj>> {
        loop {
            let take_over = match (self.cur.peek(), self.over.peek()) {
                (None, None) => return None,
                (Some(_), None) => false,
                (None, Some(_)) => true,
                (Some((ck, _)), Some((ok, _))) => ok.as_str() <= ck.as_str(),
            };
            if take_over {
                let (k, v) = self.over.next()?;
                if self.cur.peek().is_some_and(|(ck, _)| **ck == k) {
                    self.cur.next();
                }
                if let Some(o) = v {
                    return Some(o);
                }
            } else {
                return self.cur.next().map(|(_, o)| o.clone());
            }
        }
    }
}

/// The names in a `metadata.finalizers` field.
fn finalizers(field: Option<&Value>) -> Vec<String> {
    field
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).map(str::to_owned).collect())
        .unwrap_or_default()
}

/// Where an object is stored: a namespaced object without a namespace is looked up in
/// `default`, as the server does; a cluster-scoped one has none.
fn storage_key(def: &ResourceDef, ns: Option<&str>, name: &str) -> String {
    let ns = if def.namespaced { ns.unwrap_or("default") } else { "" };
    key_of(def, ns, name)
}
