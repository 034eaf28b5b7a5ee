//! What makes a key due: the primary's own changes, its children's owner references (`owns`),
//! and mappers over related objects (`watches`), each filtered by predicates.

use std::any::Any;
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::FutureExt;
use kube::core::{ApiResource, DynamicObject};
use kube::runtime::controller::ReconcileReason;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::Resource;
use serde::de::DeserializeOwned;

use super::schedule::Enqueue;
use crate::informer::{handler_fn, Entry, Event, HandlerOptions, Informer, InformerError, Registration, Watched};
use crate::object::ObjectKey;
use crate::store::DurableStore;

/// A value computed from an object (kube-runtime's predicates: `fn(&K) -> Option<u64>`, such as
/// [`kube::runtime::predicates::generation`]). An update whose old and new values are equal is
/// filtered out; `None` lets it through.
pub type Predicate<K> = Arc<dyn Fn(&K) -> Option<u64> + Send + Sync>;

/// How a related resource triggers reconciles: for
/// [`owns_informer`](super::Controller::owns_informer), [`owns_where`](super::Controller::owns_where),
/// [`watches_informer`](super::Controller::watches_informer) and
/// [`watches_where`](super::Controller::watches_where).
///
/// ```
/// use durable_informer::controller::Relation;
/// use k8s_openapi::api::apps::v1::ReplicaSet;
/// use kube::runtime::predicates;
/// // Only the controlling owner (controller-runtime's `Owns`), and only on spec changes.
/// let r = Relation::<ReplicaSet>::new().controller_only().predicate(predicates::generation);
/// # let _ = r;
/// ```
pub struct Relation<C> {
    pub(crate) controller_only: bool,
    pub(crate) predicates: Vec<Predicate<C>>,
}

impl<C> Default for Relation<C> {
    fn default() -> Self {
        Self {
            controller_only: false,
            predicates: Vec::new(),
        }
    }
}

impl<C> std::fmt::Debug for Relation<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relation")
            .field("controller_only", &self.controller_only)
            .field("predicates", &self.predicates.len())
            .finish()
    }
}

impl<C> Relation<C> {
    /// Every owner reference (kube-runtime's `owns`), no predicate.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// For `owns`: follow only the owner reference with `controller: true` (controller-runtime's
    /// `Owns`), not every matching one.
    #[must_use]
    pub fn controller_only(mut self) -> Self {
        self.controller_only = true;
        self
    }

    /// Let an update of a related object through only when `predicate`'s value changed; adds
    /// and deletes always pass. Given several times, a change of any one passes (kube-runtime's
    /// `Predicate::combine`).
    #[must_use]
    pub fn predicate(mut self, predicate: impl Fn(&C) -> Option<u64> + Send + Sync + 'static) -> Self {
        self.predicates.push(Arc::new(predicate));
        self
    }
}

/// Where a trigger's objects come from: an informer given, or one the controller builds in its
/// database at `run`.
pub(crate) enum Origin<C> {
    Informer(Informer<C>),
    Api(Box<(kube::Api<C>, watcher::Config)>),
}

impl<C> Origin<C>
where
    C: Resource + DeserializeOwned + Send + Sync + 'static,
{
    /// The informer, built now if needed (of the resource `dyntype` names).
    pub(crate) async fn informer_with(
        self,
        db: Option<&DurableStore>,
        what: &'static str,
        dyntype: &C::DynamicType,
    ) -> Result<Informer<C>, super::Error<std::convert::Infallible>> {
        match self {
            Origin::Informer(i) => Ok(i),
            Origin::Api(api_wc) => {
                let (api, wc) = *api_wc;
                let db = db.ok_or(super::Error::NoDatabase(what))?;
                Informer::from_api_with(db, api, dyntype)
                    .watcher_config(&wc)
                    .build()
                    .await
                    .map_err(super::Error::Informer)
            }
        }
    }

    /// The informer of a typed resource, built now if needed.
    pub(crate) async fn informer(
        self,
        db: Option<&DurableStore>,
        what: &'static str,
    ) -> Result<Informer<C>, super::Error<std::convert::Infallible>>
    where
        C: Resource<DynamicType = ()>,
    {
        self.informer_with(db, what, &()).await
    }
}

/// A related informer's registration, its sync, and the informer itself: the controller holds
/// it while it runs, or an informer whose only handle was given to `owns` or `watches` would
/// stop (dropping its last handle stops it) right after its sync.
pub(crate) struct Armed {
    pub(crate) registration: Registration,
    pub(crate) synced: BoxFuture<'static, Result<(), InformerError>>,
    pub(crate) informer: Box<dyn Any + Send + Sync>,
}

/// A trigger, armed at `run` with the controller's database and queue.
pub(crate) type Trigger = Box<
    dyn FnOnce(
            Option<Arc<DurableStore>>,
            Enqueue,
        ) -> BoxFuture<'static, Result<Armed, super::Error<std::convert::Infallible>>>
        + Send,
>;

/// Whether an update passes the predicates: none given, another object under the same name,
/// or a value that changed or is `None`. A state not held decoded (evicted) or that does not
/// decode passes: a reconcile too many is safe, one too few is not.
pub(crate) fn passes_entries<K: DeserializeOwned>(predicates: &[Predicate<K>], old: &Entry<K>, new: &Entry<K>) -> bool {
    if predicates.is_empty() || !old.same_object(new) {
        return true;
    }
    match (old.object(), new.object()) {
        (Some(Ok(o)), Some(Ok(n))) => passes(predicates, &o, &n),
        _ => true,
    }
}

/// Whether an update from `old` to `new` passes the predicates.
pub(crate) fn passes<K>(predicates: &[Predicate<K>], old: &K, new: &K) -> bool {
    predicates.is_empty()
        || predicates.iter().any(|p| match (p(old), p(new)) {
            (Some(a), Some(b)) => a != b,
            _ => true,
        })
}

/// An object reference to `meta`'s object, of resource `ar`, for a reconcile reason.
fn erased_ref(ar: &ApiResource, namespace: Option<&String>, name: &str) -> Box<ObjectRef<DynamicObject>> {
    let mut r = ObjectRef::<DynamicObject>::new_with(name, ar.clone());
    r.namespace = namespace.cloned();
    Box::new(r)
}

fn arm<C>(informer: Informer<C>, registration: Registration) -> Armed
where
    C: DeserializeOwned + Send + Sync + 'static,
{
    // Idempotent: an informer already started (shared through a factory, say) keeps its one
    // reflector.
    informer.start();
    let synced = informer.clone();
    Armed {
        registration,
        synced: async move { synced.wait_for_sync().await }.boxed(),
        informer: Box::new(informer),
    }
}

/// `owns`: the owners of type `K` named by each changed child's owner references (group and
/// kind from `K`, any version), read from the metadata the store scanned on arrival: the
/// children are decoded only to evaluate predicates.
pub(crate) fn owns<K, C>(origin: Origin<C>, relation: Relation<C>, dyntype: &K::DynamicType) -> Trigger
where
    K: Resource,
    C: Resource<DynamicType = ()> + DeserializeOwned + Send + Sync + 'static,
{
    let (group, kind) = (K::group(dyntype).into_owned(), K::kind(dyntype).into_owned());
    let child = ApiResource::erase::<C>(&());
    Box::new(move |db, enqueue| {
        async move {
            let informer = origin.informer(db.as_deref(), "owns").await?;
            let Relation {
                controller_only,
                predicates,
            } = relation;
            let on_change = move |c: Watched<'_, C>| {
                let (old, new) = (c.old, c.new);
                if let (Some(o), Some(n)) = (old, new) {
                    if !Arc::ptr_eq(o, n) && !passes_entries(&predicates, o, n) {
                        return;
                    }
                }
                // Both states: an owner reference may have moved from one owner to another.
                let old = old.filter(|o| !new.is_some_and(|n| Arc::ptr_eq(o, n)));
                for state in old.into_iter().chain(new) {
                    let meta = &state.meta;
                    for o in &meta.owner_references {
                        let ref_group = o.api_version.rsplit_once('/').map_or("", |(g, _)| g);
                        if o.kind != kind || ref_group != group || (controller_only && !o.controller) {
                            continue;
                        }
                        let key = ObjectKey {
                            namespace: meta.namespace.clone(),
                            name: o.name.clone(),
                        };
                        enqueue.add(key, || ReconcileReason::RelatedObjectUpdated {
                            obj_ref: erased_ref(&child, meta.namespace.as_ref(), &meta.name),
                        });
                    }
                }
            };
            let registration = informer.watch_changes(on_change, HandlerOptions::volatile());
            Ok(arm(informer, registration))
        }
        .boxed()
    })
}

/// `watches`: the references `mapper` gives for each changed related object (for an update,
/// for its old and its new state: a relation may have moved).
pub(crate) fn watches<K, C, I>(
    origin: Origin<C>,
    mapper: impl Fn(C) -> I + Send + Sync + 'static,
    relation: Relation<C>,
) -> Trigger
where
    K: Resource,
    C: Resource<DynamicType = ()> + Clone + DeserializeOwned + Send + Sync + 'static,
    I: IntoIterator<Item = ObjectRef<K>>,
{
    let child = ApiResource::erase::<C>(&());
    Box::new(move |db, enqueue| {
        async move {
            let informer = origin.informer(db.as_deref(), "watches").await?;
            let predicates = relation.predicates;
            let map = move |obj: &Arc<C>| {
                let meta = obj.meta();
                let name = meta.name.clone().unwrap_or_default();
                for r in mapper(C::clone(obj)) {
                    let key = ObjectKey {
                        namespace: r.namespace,
                        name: r.name,
                    };
                    enqueue.add(key, || ReconcileReason::RelatedObjectUpdated {
                        obj_ref: erased_ref(&child, meta.namespace.as_ref(), &name),
                    });
                }
            };
            let handler = handler_fn(move |ev: Event<C>| -> Result<(), std::convert::Infallible> {
                match &ev {
                    Event::Update { old, new, .. } => {
                        if passes(&predicates, old, new) {
                            map(old);
                            map(new);
                        }
                    }
                    Event::Add { object, .. } | Event::Delete { object, .. } => map(object),
                }
                Ok(())
            });
            let registration = informer.add_event_handler(handler, HandlerOptions::volatile());
            Ok(arm(informer, registration))
        }
        .boxed()
    })
}
