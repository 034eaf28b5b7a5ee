//! kube-runtime's `reflector::Store<K>`, over an informer's read model: infallible reads that
//! never touch the database on the calling thread.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::cache::{Cache, Entry};
use super::{InformerError, Inner};
use crate::object::ObjectKey;
use crate::selector::LabelSelector;
use serde::de::DeserializeOwned;

/// The reads of kube-runtime's [`reflector::Store`](kube::runtime::reflector::Store), served
/// from the informer's cache: [`get`](Self::get), [`state`](Self::state),
/// [`find`](Self::find), [`state_filter`](Self::state_filter),
/// [`state_filter_selector`](Self::state_filter_selector), [`len`](Self::len),
/// [`is_empty`](Self::is_empty) and [`wait_until_ready`](Self::wait_until_ready).
///
/// Reads are infallible and synchronous and never read the database: asking an informer for a
/// reader pins its cache (every object's JSON held, no byte budget, as kube's store holds every
/// object), and a background task brings in, on blocking threads, the JSON of the objects the
/// cache had left on disk. Until that is done — the informer synced and every object in
/// memory — the reader is empty, as kube's store is before its first `InitDone`; once ready it
/// stays ready, and a relist keeps answering from the previous state until the new one
/// replaces it. An object whose stored JSON does not decode as `K` is left out (with a
/// warning). For fallible reads with a byte budget, see [`Lister`](super::Lister).
///
/// ```no_run
/// # async fn f(client: kube::Client, db: &durable_informer::store::DurableStore) -> Result<(), Box<dyn std::error::Error>> {
/// use durable_informer::informer::Informer;
/// use k8s_openapi::api::core::v1::Pod;
/// use kube::runtime::reflector::ObjectRef;
///
/// let informer = Informer::from_api(db, kube::Api::<Pod>::all(client)).build().await?;
/// let pods = informer.reader();
/// informer.start();
/// pods.wait_until_ready().await?;
/// let web = pods.get(&ObjectRef::new("web-0").within("prod"));
/// let pending = pods.find(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Pending"));
/// println!("{} pods, web-0 {}", pods.len(), if web.is_some() { "found" } else { "missing" });
/// # let _ = pending; Ok(()) }
/// ```
pub struct Reader<K> {
    cache: Arc<Cache<K>>,
    inner: Arc<Inner>,
    /// Warned once that the informer was never started.
    warned: Arc<AtomicBool>,
    _k: PhantomData<fn() -> K>,
}

impl<K> Clone for Reader<K> {
    fn clone(&self) -> Self {
        Self {
            cache: self.cache.clone(),
            inner: self.inner.clone(),
            warned: self.warned.clone(),
            _k: PhantomData,
        }
    }
}

impl<K: DeserializeOwned + Send + Sync + 'static> std::fmt::Debug for Reader<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader")
            .field("resource", &self.inner.resource)
            .field("ready", &self.is_ready())
            .finish_non_exhaustive()
    }
}

impl<K: DeserializeOwned + Send + Sync + 'static> Reader<K> {
    pub(super) fn new(inner: Arc<Inner>, cache: Arc<Cache<K>>) -> Self {
        if !cache.pin() {
            inner.runtime.spawn(Cache::warm(Arc::downgrade(&cache)));
        }
        Self {
            cache,
            inner,
            warned: Arc::default(),
            _k: PhantomData,
        }
    }

    /// Whether the reader answers (see the type's documentation).
    #[must_use]
    pub fn is_ready(&self) -> bool {
        *self.cache.warmed().borrow()
    }

    /// The decoded object of an entry the table holds; a warm table holds every JSON.
    fn decoded(&self, e: &Entry<K>) -> Option<Arc<K>> {
        match e.object() {
            Some(Ok(k)) => Some(k),
            Some(Err(message)) => {
                tracing::warn!(resource = %self.inner.resource, key = %e.meta.key(), %message, "a stored object does not decode; the reader leaves it out");
                None
            }
            None => {
                debug_assert!(false, "a warm cache holds every object's JSON");
                None
            }
        }
    }

    /// Before warm: `None`, with one warning if the informer was never started.
    fn view(&self) -> Option<super::cache::View<'_, K>> {
        let view = self.cache.held();
        if view.is_none() && !*self.inner.started.borrow() && !self.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(resource = %self.inner.resource, "reading an informer that was never started: its reader stays empty until start()");
        }
        view
    }

    /// The object `obj` names (its namespace and name; the group and kind are `K`'s), as
    /// kube's `Store::get`.
    #[must_use]
    pub fn get(&self, obj: &kube::runtime::reflector::ObjectRef<K>) -> Option<Arc<K>>
    where
        K: kube::Resource,
    {
        self.get_named(obj.namespace.as_deref(), &obj.name)
    }

    /// The object of `key` (`namespace/name`, or `name` when cluster-scoped).
    #[must_use]
    pub fn get_by_key(&self, key: &ObjectKey) -> Option<Arc<K>> {
        self.get_named(key.namespace.as_deref(), &key.name)
    }

    fn get_named(&self, namespace: Option<&str>, name: &str) -> Option<Arc<K>> {
        // The view (a read lock) ends with this statement: decoding happens outside it.
        let entry = self.view()?.named(namespace, name).cloned()?;
        self.decoded(&entry)
    }

    /// Every object, in key order (kube's `Store::state`).
    #[must_use]
    pub fn state(&self) -> Vec<Arc<K>> {
        self.select(None, |_| true)
    }

    /// The objects matching `selector`, in key order, in one namespace or all.
    #[must_use]
    pub fn list(&self, namespace: Option<&str>, selector: &LabelSelector) -> Vec<Arc<K>> {
        self.select(namespace, |m| selector.matches(&m.labels))
    }

    /// The objects an index holds under `value` (empty for an index the cache does not serve:
    /// one still being backfilled, or not registered).
    #[must_use]
    pub fn by_index(&self, index: &str, value: &str) -> Vec<Arc<K>> {
        let entries = self
            .view()
            .and_then(|v| {
                if index == crate::store::NAMESPACE {
                    Some(v.select(Some(value), |_| true))
                } else {
                    v.by_index(index, value)
                }
            })
            .unwrap_or_default();
        entries.iter().filter_map(|e| self.decoded(e)).collect()
    }

    fn select(&self, namespace: Option<&str>, keep: impl FnMut(&crate::object::ObjectMeta) -> bool) -> Vec<Arc<K>> {
        let entries = self.view().map(|v| v.select(namespace, keep)).unwrap_or_default();
        entries.iter().filter_map(|e| self.decoded(e)).collect()
    }

    /// The objects for which `predicate` is true, in key order (kube's `Store::state_filter`).
    #[must_use]
    pub fn state_filter(&self, predicate: impl Fn(&K) -> bool) -> Vec<Arc<K>> {
        let entries = self.view().map(|v| v.select(None, |_| true)).unwrap_or_default();
        entries
            .iter()
            .filter_map(|e| self.decoded(e))
            .filter(|k| predicate(k))
            .collect()
    }

    /// The objects whose labels match kube's `Selector`, in key order (kube's
    /// `Store::state_filter_selector`). The labels are read from the held metadata, so objects
    /// that do not match are not decoded.
    ///
    /// ```no_run
    /// # fn f(pods: durable_informer::informer::Reader<k8s_openapi::api::core::v1::Pod>) {
    /// use kube::core::{Expression, Selector};
    /// let selector: Selector = Expression::Equal("app".into(), "web".into()).into();
    /// let web = pods.state_filter_selector(&selector);
    /// # let _ = web; }
    /// ```
    #[must_use]
    pub fn state_filter_selector(&self, selector: &kube::core::Selector) -> Vec<Arc<K>> {
        use kube::core::SelectorExt as _;
        // The held labels are not a `BTreeMap`: the same selector in this crate's form reads
        // them as they are; one it cannot state is matched on a copy.
        match crate::selector::LabelSelector::try_from(selector) {
            Ok(ours) => self.select(None, |m| ours.matches(&m.labels)),
            Err(_) => self.select(None, |m| selector.matches(&std::collections::BTreeMap::from(&m.labels))),
        }
    }

    /// The first object in key order for which `pred` is true (kube's `Store::find`): objects
    /// after it are not decoded.
    #[must_use]
    pub fn find(&self, mut pred: impl FnMut(&K) -> bool) -> Option<Arc<K>> {
        let entries = self.view().map(|v| v.select(None, |_| true)).unwrap_or_default();
        entries.iter().filter_map(|e| self.decoded(e)).find(|k| pred(k))
    }

    /// How many objects the reader holds (0 before it is ready).
    #[must_use]
    pub fn len(&self) -> usize {
        self.view().map_or(0, |v| v.len())
    }

    /// Whether the reader holds no object.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waits until the reader answers: the informer synced and every object in memory (kube's
    /// `Store::wait_until_ready`). Fails with [`InformerError::NotStarted`] when the informer
    /// is not started within 2 seconds of the call, and with [`InformerError::NotSynced`] when
    /// its reflector stops before syncing.
    pub async fn wait_until_ready(&self) -> Result<(), InformerError> {
        self.inner.wait_started().await?;
        let mut warm = self.cache.warmed();
        let mut status = self.inner.status.clone();
        let failed = async {
            let stopped = status
                .wait_for(|s| s.phase == crate::reflector::Phase::Stopped && !s.synced)
                .await
                .is_ok();
            // A reflector gone after syncing still leaves a warm-up to wait for.
            if !stopped && self.inner.status.borrow().synced {
                futures::future::pending::<()>().await;
            }
        };
        tokio::select! {
            r = warm.wait_for(|w| *w) => if r.is_ok() { return Ok(()) },
            () = failed => {}
        }
        if self.is_ready() {
            return Ok(());
        }
        Err(InformerError::NotSynced {
            resource: self.inner.resource.clone(),
            last_error: self.inner.status.borrow().last_error.clone(),
        })
    }
}
