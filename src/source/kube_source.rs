//! The live source: LIST and WATCH through `kube::Client` (kubeconfig, in-cluster config, auth,
//! TLS and request building are kube's), with the response body read here as raw bytes.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::{StreamExt, TryStreamExt};
use http_body_util::BodyExt;
use kube::core::{ApiResource, DynamicObject, Request, Resource};
use kube::Client;
use tracing::Instrument;

use crate::object::ScopeSpec;
use crate::selector::ShardSelector;

use super::decode::{decode_list_bytes, decode_status, decode_watch_bytes};
use super::{
    DecodeError, ListPage, ListRequest, RawWatchEvent, RawWatchStream, Source, SourceError, WatchRequest, WatchStream,
};

/// Longest watch line accepted (one object); longer lines are reported as malformed.
const MAX_LINE: usize = 64 << 20;

/// How a [`KubeSource`] names its cluster in the database, so a database is never filled from
/// two clusters: the name is stored at the first start and compared at every later one (a
/// different name stops the informer with `ClusterMismatch`, unless the reflector is set to
/// `reset_on_cluster_change`). Set it with [`KubeSource::identity`] or
/// [`InformerBuilder::cluster_identity`](crate::informer::InformerBuilder::cluster_identity).
///
/// ```no_run
/// # async fn f(client: kube::Client, db: &durable_informer::store::DurableStore) -> Result<(), Box<dyn std::error::Error>> {
/// use durable_informer::informer::Informer;
/// use durable_informer::source::ClusterIdentity;
/// use k8s_openapi::api::core::v1::ConfigMap;
/// // A namespace-scoped operator: no cluster-wide read, a name from its own configuration.
/// let cms = Informer::from_api(db, kube::Api::<ConfigMap>::namespaced(client, "team-a"))
///     .cluster_identity(ClusterIdentity::named("prod-eu-1"))
///     .build()
///     .await?;
/// # let _ = cms; Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ClusterIdentity {
    /// The default: the `kube-system` namespace UID (`<uid>@<server URL>`) when the client may
    /// read it, as before. On 403/404, a source with a server URL uses the URL alone
    /// (`@<url>`), and one without (built from an `Api` or a client) the cluster's root CA as
    /// [`RootCa`](Self::RootCa) reads it: no cluster-wide RBAC is needed. The form depends on
    /// access, so an operator whose RBAC may change should pin one of the others.
    #[default]
    Auto,
    /// The `kube-system` namespace UID only (needs `get` on `namespaces/kube-system`); refused
    /// without it.
    KubeSystemUid,
    /// A hash of the cluster's root CA certificate, from the `kube-root-ca.crt` ConfigMap that
    /// Kubernetes (v1.20+) publishes in every namespace: in `namespace`, or the scope's, or the
    /// client's default namespace. Needs only a namespaced Role with `get` on that ConfigMap.
    /// A CA rotation changes it (the database is then refused as another cluster's).
    RootCa {
        /// The namespace to read `kube-root-ca.crt` from.
        namespace: Option<String>,
    },
    /// A name you choose (from your own configuration): no request at all.
    Named(String),
}

impl ClusterIdentity {
    /// [`ClusterIdentity::Named`].
    #[must_use]
    pub fn named(name: impl Into<String>) -> Self {
        Self::Named(name.into())
    }

    /// [`ClusterIdentity::RootCa`] of the scope's (or the client's default) namespace.
    #[must_use]
    pub fn root_ca() -> Self {
        Self::RootCa { namespace: None }
    }
}

/// The ConfigMap holding the cluster's root CA in every namespace (the root CA publisher's).
const ROOT_CA_CONFIGMAP: &str = "kube-root-ca.crt";

/// A [`Source`] over a live API server (or the simulated one) through `kube::Client`.
///
/// Its cluster identity is chosen by [`ClusterIdentity`]; by default `<kube-system namespace
/// UID>@<server URL>`. When the client may not read that namespace (403) or it does not exist
/// (404), the identity falls back to `@<server URL>`: the URL is then all that tells clusters
/// apart. A source built from a client alone ([`from_api`](Self::from_api),
/// [`for_client`](Self::for_client)) knows no URL: it identifies the cluster by the UID alone
/// (`<uid>@`), or without access to `kube-system` by its root CA (`ca:<hash>`, see
/// [`ClusterIdentity::RootCa`]). Two identities with the same non-empty UID name one cluster, whatever the
/// URLs (one cluster behind two addresses). The UID and URL-only forms differ, so a
/// database written with one and opened with the other is refused as another cluster's (for
/// example after losing RBAC on `kube-system`); restore the access, or open it with
/// `reset_on_cluster_change` to start afresh.
#[derive(Clone)]
pub struct KubeSource {
    client: Client,
    server: String,
    resource: ApiResource,
    /// The resource again, with the namespace and selectors (the builders are `ScopeSpec`'s).
    scope: ScopeSpec,
    /// The resource has no namespaced path (learnt from a 404 of the revision probe).
    cluster_scoped: Arc<std::sync::atomic::AtomicBool>,
    /// The `User-Agent` of every request (ours, after the caller's own when set).
    user_agent: http::HeaderValue,
    /// How the cluster is named in the database.
    identity: ClusterIdentity,
}

/// This crate's part of the `User-Agent`: `durable-informer/<version>`.
pub const USER_AGENT: &str = concat!("durable-informer/", env!("CARGO_PKG_VERSION"));

impl std::fmt::Debug for KubeSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The client holds credentials: never print it.
        f.debug_struct("KubeSource")
            .field("server", &self.server)
            .field("resource", &self.resource.plural)
            .field("namespace", &self.scope.namespace)
            .finish_non_exhaustive()
    }
}

impl KubeSource {
    /// A source for any resource. `server` is the cluster URL (part of the cluster identity).
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
    /// use durable_informer::source::KubeSource;
    /// let config = kube::Config::infer().await?;
    /// let server = config.cluster_url.to_string();
    /// let client = kube::Client::try_from(config)?;
    /// let pods = KubeSource::typed::<k8s_openapi::api::core::v1::Pod>(client, &server).namespace("default");
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn new(client: Client, server: &str, resource: ApiResource) -> Self {
        let scope = ScopeSpec::new(&resource.group, &resource.version, &resource.plural);
        Self {
            client,
            server: server.trim_end_matches('/').to_owned(),
            resource,
            scope,
            cluster_scoped: Arc::default(),
            user_agent: http::HeaderValue::from_static(USER_AGENT),
            identity: ClusterIdentity::Auto,
        }
    }

    /// How the cluster is named in the database (default [`ClusterIdentity::Auto`]).
    ///
    /// ```no_run
    /// # fn f(client: kube::Client) {
    /// use durable_informer::source::{ClusterIdentity, KubeSource};
    /// let pods = KubeSource::for_client::<k8s_openapi::api::core::v1::Pod>(client)
    ///     .namespace("team-a")
    ///     .identity(ClusterIdentity::root_ca());
    /// # let _ = pods; }
    /// ```
    #[must_use]
    pub fn identity(mut self, identity: ClusterIdentity) -> Self {
        self.identity = identity;
        self
    }

    /// Puts your controller's own agent first in the `User-Agent` of every request
    /// (`my-controller/1.2 durable-informer/0.1.0`), so audit logs and API Priority and Fairness
    /// can tell your requests apart; without it the header is [`USER_AGENT`]. An agent that is
    /// not a valid header value is ignored (with a warning).
    ///
    /// ```no_run
    /// # fn f(client: kube::Client) {
    /// use durable_informer::source::KubeSource;
    /// let pods = KubeSource::typed::<k8s_openapi::api::core::v1::Pod>(client, "https://10.0.0.1:6443")
    ///     .user_agent("my-controller/1.2");
    /// # let _ = pods; }
    /// ```
    #[must_use]
    pub fn user_agent(mut self, agent: &str) -> Self {
        match http::HeaderValue::from_str(&format!("{agent} {USER_AGENT}")) {
            Ok(v) => self.user_agent = v,
            Err(_) => tracing::warn!("the user agent is not a valid header value; sending {USER_AGENT} alone"),
        }
        self
    }

    /// A source for a typed resource such as `k8s_openapi::api::core::v1::Pod`.
    #[must_use]
    pub fn typed<K: Resource<DynamicType = ()>>(client: Client, server: &str) -> Self {
        Self::new(client, server, ApiResource::erase::<K>(&()))
    }

    /// A source for `K` through `client`, without a server URL (kube-rs' `Api::all`): the
    /// cluster is identified by its `kube-system` UID alone (see the type's docs).
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
    /// use durable_informer::source::KubeSource;
    /// use k8s_openapi::api::core::v1::Pod;
    /// let client = kube::Client::try_default().await?;
    /// let pods = KubeSource::for_client::<Pod>(client);
    /// # let _ = pods; Ok(()) }
    /// ```
    #[must_use]
    pub fn for_client<K: Resource<DynamicType = ()>>(client: Client) -> Self {
        Self::new(client, "", ApiResource::erase::<K>(&()))
    }

    /// A source for what `api` reads: its resource type and, for `Api::namespaced`, its
    /// namespace. The cluster is identified by its `kube-system` UID alone.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
    /// use durable_informer::source::KubeSource;
    /// use k8s_openapi::api::core::v1::Pod;
    /// let client = kube::Client::try_default().await?;
    /// let pods = KubeSource::from_api(kube::Api::<Pod>::namespaced(client, "prod"));
    /// assert_eq!(pods.namespace_name(), Some("prod"));
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn from_api<K: Resource<DynamicType = ()>>(api: kube::Api<K>) -> Self {
        Self::from_api_with(api, &())
    }

    /// [`from_api`](Self::from_api) for a resource known at run time: an `Api<DynamicObject>`
    /// (kube's `Api::all_with(client, &ar)`) and the `ApiResource` it was made with.
    ///
    /// ```no_run
    /// # fn f(client: kube::Client) {
    /// use durable_informer::source::KubeSource;
    /// use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
    /// let ar = ApiResource::from_gvk(&GroupVersionKind::gvk("example.com", "v1", "Widget"));
    /// let widgets = KubeSource::from_api_with(kube::Api::<DynamicObject>::namespaced_with(client, "prod", &ar), &ar);
    /// assert_eq!(widgets.api_resource().plural, "widgets");
    /// # }
    /// ```
    #[must_use]
    pub fn from_api_with<K: Resource>(api: kube::Api<K>, dyntype: &K::DynamicType) -> Self {
        let namespace = api.namespace().map(str::to_owned);
        let source = Self::new(api.into_client(), "", ApiResource::erase::<K>(dyntype));
        match namespace {
            Some(ns) => source.namespace(&ns),
            None => source,
        }
    }

    /// Lists and watches the objects' metadata only (`meta.k8s.io/v1` `PartialObjectMetadata`,
    /// as kube's `Api::list_metadata`/`watch_metadata` and its `metadata_watcher` do): what a
    /// controller that reads labels, owners and annotations needs, at a fraction of the bytes.
    /// The scope is one of its own, apart from a full-object informer of the same resource.
    /// Read it as `kube::core::PartialObjectMeta<K>`; see
    /// [`Informer::metadata_from_api`](crate::informer::Informer::metadata_from_api).
    #[must_use]
    pub fn metadata_only(mut self) -> Self {
        self.scope = self.scope.metadata_only();
        self
    }

    /// Watches one namespace only.
    #[must_use]
    pub fn namespace(mut self, ns: &str) -> Self {
        self.scope = self.scope.namespace(ns);
        self
    }

    /// Adds a label selector.
    #[must_use]
    pub fn labels(mut self, selector: &str) -> Self {
        self.scope = self.scope.labels(selector);
        self
    }

    /// Adds a field selector.
    #[must_use]
    pub fn fields(mut self, selector: &str) -> Self {
        self.scope = self.scope.fields(selector);
        self
    }

    /// The resource.
    #[must_use]
    pub fn api_resource(&self) -> &ApiResource {
        &self.resource
    }

    /// The namespace, if one.
    #[must_use]
    pub fn namespace_name(&self) -> Option<&str> {
        self.scope.namespace.as_deref()
    }

    /// The label selector, if any.
    #[must_use]
    pub fn label_selector(&self) -> Option<&str> {
        self.scope.label_selector.as_deref()
    }

    /// The field selector, if any.
    #[must_use]
    pub fn field_selector(&self) -> Option<&str> {
        self.scope.field_selector.as_deref()
    }

    fn request(&self) -> Request {
        Request::new(DynamicObject::url_path(&self.resource, self.scope.namespace.as_deref()))
    }

    fn name(&self) -> String {
        if self.resource.group.is_empty() {
            self.resource.plural.clone()
        } else {
            format!("{}.{}", self.resource.plural, self.resource.group)
        }
    }

    fn transport(&self, e: impl std::fmt::Display) -> SourceError {
        SourceError::Transport {
            resource: self.name(),
            detail: e.to_string(),
        }
    }

    /// Sends a request; an HTTP error status becomes [`SourceError::Api`] with `Retry-After`.
    /// A whole (non-streaming) response body.
    async fn body(&self, res: http::Response<kube::client::Body>) -> Result<Bytes, SourceError> {
        Ok(res
            .into_body()
            .collect()
            .await
            .map_err(|e| self.transport(e))?
            .to_bytes())
    }

    async fn send(&self, mut req: http::Request<Vec<u8>>) -> Result<http::Response<kube::client::Body>, SourceError> {
        req.headers_mut()
            .entry(http::header::USER_AGENT)
            .or_insert_with(|| self.user_agent.clone());
        let res = self
            .client
            .send(req.map(kube::client::Body::from))
            .await
            .map_err(|e| self.transport(e))?;
        let status = res.status();
        if status.is_success() {
            return Ok(res);
        }
        let retry_after = res
            .headers()
            .get(http::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let body = res
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let mut st = decode_status(status.as_u16(), &body);
        st.code = status.as_u16();
        st.retry_after = retry_after.or(st.retry_after);
        Err(SourceError::Api {
            resource: self.name(),
            status: st,
        })
    }

    fn build_error(&self, e: kube::core::request::Error) -> SourceError {
        SourceError::Request {
            resource: self.name(),
            source: Arc::new(e),
        }
    }
}

impl Source for KubeSource {
    async fn list(&self, req: ListRequest) -> Result<ListPage, SourceError> {
        let span = tracing::debug_span!("list", resource = %self.name(), rv = ?req.resource_version);
        self.list_page(req).instrument(span).await
    }

    async fn watch(&self, req: WatchRequest) -> Result<WatchStream, SourceError> {
        let span = tracing::debug_span!("watch", resource = %self.name(), rv = %req.resource_version);
        let raw = self.open_watch(req).instrument(span).await?;
        Ok(raw.map(|r| r.map(|e| e.event)).boxed())
    }

    async fn watch_raw(&self, req: WatchRequest) -> Result<RawWatchStream, SourceError> {
        let span = tracing::debug_span!("watch", resource = %self.name(), rv = %req.resource_version);
        self.open_watch(req).instrument(span).await
    }

    async fn cluster_identity(&self) -> Result<Option<String>, SourceError> {
        match &self.identity {
            ClusterIdentity::Auto => self.kube_system_identity(true).await,
            ClusterIdentity::KubeSystemUid => self.kube_system_identity(false).await,
            ClusterIdentity::RootCa { namespace } => self.root_ca_identity(namespace.as_deref()).await.map(Some),
            // `@` would make the store compare the part before it as a UID.
            ClusterIdentity::Named(name) => Ok(Some(format!("name:{}", name.replace('@', "%40")))),
        }
    }

    fn resource(&self) -> String {
        self.name()
    }

    fn scope(&self) -> ScopeSpec {
        self.scope.clone()
    }
}

impl KubeSource {
    async fn list_page(&self, req: ListRequest) -> Result<ListPage, SourceError> {
        let (label_selector, field_selector) = if req.revision_only {
            (None, Some(super::REVISION_PROBE_SELECTOR.to_owned()))
        } else {
            (self.scope.label_selector.clone(), self.scope.field_selector.clone())
        };
        let mut lp = kube::api::ListParams {
            label_selector,
            field_selector,
            limit: req.limit,
            continue_token: req.continue_token.clone(),
            ..Default::default()
        };
        if let Some(rv) = &req.resource_version {
            lp.resource_version = Some(rv.0.clone());
            if req.exact && rv.0 != "0" {
                lp.version_match = Some(kube::api::VersionMatch::Exact);
            } else if req.not_older_than && rv.0 != "0" {
                lp.version_match = Some(kube::api::VersionMatch::NotOlderThan);
            }
        }
        if req.revision_only {
            return self.revision_probe(&lp).await;
        }
        let http_req = if self.scope.metadata_only {
            self.request().list_metadata(&lp)
        } else {
            self.request().list(&lp)
        }
        .map_err(|e| self.build_error(e))?;
        self.list_at(with_shard(http_req, req.shard.as_ref())).await
    }

    async fn list_at(&self, http_req: http::Request<Vec<u8>>) -> Result<ListPage, SourceError> {
        let body = self.body(self.send(http_req).await?).await?;
        decode_list_bytes(&body).map_err(|e| SourceError::decode(self.name(), None, e))
    }

    /// The revision probe on a namespaced path (the scope's namespace, else `default`): with a
    /// namespace and a single name, the API server reads one key of its watch cache instead
    /// of filtering the whole collection. A cluster-scoped resource has no such path (404):
    /// the collection's path is used from then on.
    async fn revision_probe(&self, lp: &kube::api::ListParams) -> Result<ListPage, SourceError> {
        use std::sync::atomic::Ordering;
        if !self.cluster_scoped.load(Ordering::Relaxed) {
            let ns = self.scope.namespace.as_deref().unwrap_or("default");
            let req = Request::new(DynamicObject::url_path(&self.resource, Some(ns)))
                .list(lp)
                .map_err(|e| self.build_error(e))?;
            match self.list_at(req).await {
                Err(SourceError::Api { status, .. }) if status.code == 404 => {
                    self.cluster_scoped.store(true, Ordering::Relaxed);
                }
                other => return other,
            }
        }
        let req = Request::new(DynamicObject::url_path(&self.resource, None))
            .list(lp)
            .map_err(|e| self.build_error(e))?;
        self.list_at(req).await
    }

    async fn open_watch(&self, req: WatchRequest) -> Result<RawWatchStream, SourceError> {
        let wp = kube::api::WatchParams {
            label_selector: self.scope.label_selector.clone(),
            field_selector: self.scope.field_selector.clone(),
            timeout: Some(req.timeout_secs),
            bookmarks: req.bookmarks || req.send_initial_events,
            send_initial_events: req.send_initial_events,
        };
        let http_req = if self.scope.metadata_only {
            self.request().watch_metadata(&wp, &req.resource_version.0)
        } else {
            self.request().watch(&wp, &req.resource_version.0)
        }
        .map_err(|e| self.build_error(e))?;
        let http_req = with_shard(http_req, req.shard.as_ref());
        tracing::debug!(resource = %self.name(), rv = %req.resource_version, "watch");
        let res = self.send(http_req).await?;
        let resource = self.name();
        let body = res.into_body().into_data_stream().map_err(|e| e.to_string()).boxed();
        Ok(LineReader::new(body, resource).into_stream())
    }

    /// `ca:<xxh64 of the root CA certificate>`, from `kube-root-ca.crt` in `namespace` (else
    /// the scope's, else the client's default namespace).
    async fn root_ca_identity(&self, namespace: Option<&str>) -> Result<String, SourceError> {
        let ns = namespace
            .or(self.scope.namespace.as_deref())
            .unwrap_or_else(|| self.client.default_namespace())
            .to_owned();
        let req = Request::new(format!("/api/v1/namespaces/{ns}/configmaps"))
            .get(ROOT_CA_CONFIGMAP, &Default::default())
            .map_err(|e| self.build_error(e))?;
        let body = match self.send(req).await {
            Ok(res) => self.body(res).await?,
            Err(SourceError::Api { status, .. }) if status.code == 404 || status.code == 403 => {
                return Err(SourceError::Api {
                    status: super::ApiStatus {
                        message: format!(
                            "cannot identify the cluster by its root CA: reading configmap {ns}/{ROOT_CA_CONFIGMAP} failed ({} {}); grant `get` on it with a Role in {ns}, or name the cluster with ClusterIdentity::Named",
                            status.code, status.message
                        ),
                        ..status
                    },
                    resource: "configmaps".to_owned(),
                })
            }
            Err(e) => return Err(e),
        };
        let cm: serde_json::Value = serde_json::from_slice(&body).map_err(|e| {
            SourceError::decode(
                "configmaps",
                None,
                DecodeError::NotAnObject(crate::object::ObjectError::Json(e)),
            )
        })?;
        let Some(ca) = cm["data"]["ca.crt"].as_str().filter(|c| !c.trim().is_empty()) else {
            return Err(SourceError::Api {
                resource: "configmaps".to_owned(),
                status: super::ApiStatus {
                    code: 404,
                    reason: "NotFound".to_owned(),
                    message: format!("cannot identify the cluster by its root CA: configmap {ns}/{ROOT_CA_CONFIGMAP} has no data.ca.crt; name the cluster with ClusterIdentity::Named"),
                    ..Default::default()
                },
            });
        };
        Ok(format!(
            "ca:{:016x}",
            xxhash_rust::xxh64::xxh64(ca.trim().as_bytes(), 0)
        ))
    }

    /// The `kube-system` UID plus the server URL, or on 403/404 (see the type's docs) the URL
    /// alone, or (without a URL, when `fallback`) the root CA: a UID survives URL changes and
    /// tells apart clusters behind one URL, but needs read access that not every controller has.
    async fn kube_system_identity(&self, fallback: bool) -> Result<Option<String>, SourceError> {
        let req = Request::new("/api/v1/namespaces")
            .get("kube-system", &Default::default())
            .map_err(|e| self.build_error(e))?;
        match self.send(req).await {
            Ok(res) => {
                let body = self.body(res).await?;
                let meta = crate::object::extract_meta(&body)
                    .map_err(|e| SourceError::decode("namespaces", None, DecodeError::NotAnObject(e)))?;
                Ok(Some(format!("{}@{}", meta.uid.unwrap_or_default(), self.server)))
            }
            // Without a URL, the root CA (readable with namespaced RBAC) tells clusters apart.
            Err(SourceError::Api { status, .. })
                if (status.code == 404 || status.code == 403) && self.server.is_empty() && fallback =>
            {
                tracing::info!(code = status.code, "the kube-system namespace is not readable; identifying the cluster by its root CA");
                self.root_ca_identity(None).await.map(Some)
            }
            // Without a URL nothing else tells clusters apart: refuse rather than risk mixing
            // two clusters' objects in one database.
            Err(SourceError::Api { status, .. })
                if (status.code == 404 || status.code == 403) && self.server.is_empty() =>
            {
                Err(SourceError::Api {
                    status: super::ApiStatus {
                        message: format!(
                            "cannot identify the cluster: reading the kube-system namespace failed ({} {}), and a source built from a client alone has no server URL to fall back on; grant `get` on namespaces/kube-system, or choose another ClusterIdentity (RootCa, Named)",
                            status.code, status.message
                        ),
                        ..status
                    },
                    resource: "namespaces".to_owned(),
                })
            }
            // Without access to kube-system the server URL alone identifies the cluster.
            Err(SourceError::Api { status, .. }) if status.code == 404 || status.code == 403 => {
                Ok(Some(format!("@{}", self.server)))
            }
            Err(e) => Err(e),
        }
    }
}

/// Adds KEP-5866's `shardSelector` to a request's query (kube's `ListParams` predates it).
fn with_shard(mut req: http::Request<Vec<u8>>, shard: Option<&ShardSelector>) -> http::Request<Vec<u8>> {
    let Some(shard) = shard else { return req };
    let uri = req.uri().to_string();
    let param = form_urlencoded::Serializer::new(String::new())
        .append_pair("shardSelector", &shard.to_string())
        .finish();
    let sep = if uri.contains('?') { '&' } else { '?' };
    // The URI was valid and the parameter is percent-encoded, so this parses; keep the
    // request unchanged otherwise (the reflector filters the shard itself anyway).
    match format!("{uri}{sep}{param}").parse::<http::Uri>() {
        Ok(u) => *req.uri_mut() = u,
        Err(e) => tracing::warn!(error = %e, "could not add shardSelector to the request"),
    }
    req
}

/// Splits a streaming body into lines and decodes each as a watch event, keeping the line.
struct LineReader {
    /// The body's data frames (any chunking: a line may span frames, a frame hold many lines).
    body: futures::stream::BoxStream<'static, Result<Bytes, String>>,
    buf: BytesMut,
    /// How much of `buf` is known to hold no newline.
    scanned: usize,
    line_no: u64,
    done: bool,
    /// Discarding the rest of a line over [`MAX_LINE`] (already reported) up to its newline.
    skipping: bool,
    resource: String,
}

impl LineReader {
    fn new(body: futures::stream::BoxStream<'static, Result<Bytes, String>>, resource: String) -> Self {
        Self {
            body,
            buf: BytesMut::new(),
            scanned: 0,
            line_no: 0,
            done: false,
            skipping: false,
            resource,
        }
    }

    fn into_stream(self) -> RawWatchStream {
        futures::stream::unfold(self, |mut st| async move {
            let item = st.next_event().await?;
            Some((item, st))
        })
        .boxed()
    }

    fn malformed(&self, e: DecodeError) -> SourceError {
        SourceError::decode(self.resource.clone(), Some(self.line_no), e)
    }

    fn decode(&self, line: Bytes, truncated: bool) -> Result<RawWatchEvent, SourceError> {
        match decode_watch_bytes(&line) {
            Ok(event) => Ok(RawWatchEvent {
                event,
                line: Some(line),
            }),
            Err(e) if truncated => Err(self.malformed(DecodeError::Truncated(Box::new(e)))),
            Err(e) => Err(self.malformed(e)),
        }
    }

    async fn next_event(&mut self) -> Option<Result<RawWatchEvent, SourceError>> {
        loop {
            // Bytes before `scanned` hold no newline: a line spanning frames is searched once.
            let from = self.scanned.min(self.buf.len());
            if let Some(pos) = memchr::memchr(b'\n', &self.buf[from..]).map(|p| p + from) {
                self.scanned = 0;
                let line: Bytes = self.buf.split_to(pos + 1).freeze();
                if std::mem::take(&mut self.skipping) {
                    // The end of a line too long to keep, reported when it passed the cap.
                    continue;
                }
                self.line_no += 1;
                let line = line.slice(..pos);
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                return Some(self.decode(line, false));
            }
            self.scanned = self.buf.len();
            if self.skipping {
                // Nothing of a line too long to keep is buffered: only its newline matters.
                self.buf.clear();
                self.scanned = 0;
            }
            if self.done {
                if self.skipping || self.buf.iter().all(u8::is_ascii_whitespace) {
                    return None;
                }
                let rest = self.buf.split().freeze();
                self.line_no += 1;
                // The server ends every event with a newline; a last line without one may
                // still be complete JSON, or a chunk cut short.
                return Some(self.decode(rest, true));
            }
            if self.buf.len() > MAX_LINE {
                // Reported, then skipped up to its newline: the lines after it still decode
                // (the reflector relists for what the skipped line may have changed).
                self.skipping = true;
                self.buf.clear();
                self.scanned = 0;
                self.line_no += 1;
                return Some(Err(self.malformed(DecodeError::LineTooLong { limit: MAX_LINE })));
            }
            match self.body.next().await {
                None => self.done = true,
                Some(Ok(data)) => self.buf.extend_from_slice(&data),
                Some(Err(detail)) => {
                    self.done = true;
                    self.buf.clear();
                    return Some(Err(SourceError::Transport {
                        resource: self.resource.clone(),
                        detail,
                    }));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::WatchEvent;

    const ADDED_A: &str = r#"{"type":"ADDED","object":{"metadata":{"name":"a","resourceVersion":"1"}}}"#;
    const ADDED_B: &str = r#"{"type":"ADDED","object":{"metadata":{"name":"b","resourceVersion":"2"}}}"#;

    /// Every item the reader yields for a body delivered as `chunks`.
    fn read(chunks: Vec<Result<Bytes, String>>) -> Vec<Result<RawWatchEvent, SourceError>> {
        let reader = LineReader::new(futures::stream::iter(chunks).boxed(), "configmaps".into());
        futures::executor::block_on(reader.into_stream().collect())
    }

    fn names(items: &[Result<RawWatchEvent, SourceError>]) -> Vec<String> {
        items
            .iter()
            .map(|i| match i {
                Ok(RawWatchEvent {
                    event: WatchEvent::Added(o),
                    ..
                }) => o.meta.name.clone(),
                other => format!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn the_shard_selector_is_added_to_the_query_encoded() {
        let shard = ShardSelector::by_uid(0, 2).unwrap();
        let req = http::Request::get("/api/v1/pods?limit=5").body(Vec::new()).unwrap();
        let req = with_shard(req, Some(&shard));
        let query = req.uri().query().unwrap();
        assert!(
            query.starts_with("limit=5&shardSelector=shardRange%28object.metadata.uid"),
            "{query}"
        );
        let decoded: Vec<(String, String)> = form_urlencoded::parse(query.as_bytes()).into_owned().collect();
        assert_eq!(decoded[1], ("shardSelector".to_owned(), shard.to_string()));
        let bare = with_shard(
            http::Request::get("/api/v1/pods").body(Vec::new()).unwrap(),
            Some(&shard),
        );
        assert!(bare.uri().query().unwrap().starts_with("shardSelector="));
    }

    #[test]
    fn lines_split_at_any_chunk_boundary() {
        let body = format!("{ADDED_A}\n{ADDED_B}\n");
        for size in [1, 2, 7, 64, body.len()] {
            let chunks = body
                .as_bytes()
                .chunks(size)
                .map(|c| Ok(Bytes::copy_from_slice(c)))
                .collect();
            let items = read(chunks);
            assert_eq!(names(&items), ["a", "b"], "chunks of {size}");
            // The kept line is the server's bytes without the newline.
            let line = items[1].as_ref().unwrap().line.clone().unwrap();
            assert_eq!(&line[..], ADDED_B.as_bytes());
        }
    }

    #[test]
    fn crlf_blank_lines_and_a_last_line_without_newline() {
        let body = format!("\r\n{ADDED_A}\r\n   \n\n{ADDED_B}");
        let items = read(vec![Ok(Bytes::from(body))]);
        assert_eq!(names(&items), ["a", "b"]);
    }

    #[test]
    fn a_cut_off_last_line_is_a_truncated_stream_error_with_its_line_number() {
        let body = format!("{ADDED_A}\n\n{}", &ADDED_B[..30]);
        let items = read(vec![Ok(Bytes::from(body))]);
        assert_eq!(names(&items)[0], "a");
        match &items[1] {
            Err(SourceError::Decode {
                line: Some(3), source, ..
            }) => assert!(matches!(**source, DecodeError::Truncated(_)), "{source}"),
            other => panic!("expected a truncated-stream error, got {other:?}"),
        }
        assert_eq!(items.len(), 2);
    }

    #[test]
    fn a_malformed_line_names_its_number_and_later_lines_still_decode() {
        let body = format!("{ADDED_A}\n{{\"type\":\"ADDED\",\n{ADDED_B}\n");
        let items = read(vec![Ok(Bytes::from(body))]);
        assert!(
            matches!(&items[1], Err(SourceError::Decode { line: Some(2), .. })),
            "{:?}",
            items[1]
        );
        assert_eq!(names(&items)[2], "b");
    }

    #[test]
    fn a_transport_error_ends_the_stream_after_the_lines_before_it() {
        let items = read(vec![
            Ok(Bytes::from(format!("{ADDED_A}\n{{\"partial"))),
            Err("connection reset".into()),
            Ok(Bytes::from_static(b"never read\n")),
        ]);
        assert_eq!(names(&items)[0], "a");
        assert!(
            matches!(&items[1], Err(SourceError::Transport { detail, .. }) if detail == "connection reset"),
            "{:?}",
            items[1]
        );
        assert_eq!(items.len(), 2);
    }

    #[test]
    fn a_line_longer_than_the_limit_is_reported_skipped_and_the_next_lines_decode() {
        let mib = Bytes::from(vec![b' '; 1 << 20]);
        let mut chunks: Vec<Result<Bytes, String>> = vec![Ok(Bytes::from_static(b"{\"type\":\"ADDED\",\"object\":\""))];
        chunks.extend((0..(MAX_LINE >> 20) + 2).map(|_| Ok(mib.clone())));
        chunks.push(Ok(Bytes::from(format!("\"}}}}\n{ADDED_A}\n{ADDED_B}\n"))));
        let items = read(chunks);
        assert!(
            matches!(&items[0], Err(SourceError::Decode { source, .. }) if matches!(**source, DecodeError::LineTooLong { .. })),
            "{:?}",
            items[0]
        );
        assert_eq!(names(&items[1..]), ["a", "b"]);
    }

    #[test]
    fn a_stream_ending_inside_a_skipped_line_ends_quietly() {
        let mib = Bytes::from(vec![b' '; 1 << 20]);
        let mut chunks: Vec<Result<Bytes, String>> = vec![Ok(Bytes::from(format!("{ADDED_A}\n")))];
        chunks.extend((0..(MAX_LINE >> 20) + 2).map(|_| Ok(mib.clone())));
        let items = read(chunks);
        assert_eq!(items.len(), 2, "{:?}", names(&items));
        assert_eq!(names(&items[..1]), ["a"]);
    }
}
