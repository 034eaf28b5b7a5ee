//! What an informer watches: a resource, a namespace and selectors.

/// What a scope watches: resource, namespace and selectors. Two informers with equal specs
/// share one scope.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct ScopeSpec {
    /// API group (`""` for core).
    pub group: String,
    /// API version.
    pub version: String,
    /// Plural resource name.
    pub resource: String,
    /// Namespace, or `None` for all namespaces / cluster-scoped resources.
    pub namespace: Option<String>,
    /// Label selector, as sent to the server.
    pub label_selector: Option<String>,
    /// Field selector, as sent to the server.
    pub field_selector: Option<String>,
    /// Objects as `meta.k8s.io/v1` `PartialObjectMetadata` (a metadata-only informer): a
    /// scope of its own, apart from the full objects of the same resource.
    pub metadata_only: bool,
}

impl ScopeSpec {
    /// A scope over all namespaces with no selectors.
    #[must_use]
    pub fn new(group: &str, version: &str, resource: &str) -> Self {
        Self {
            group: group.to_owned(),
            version: version.to_owned(),
            resource: resource.to_owned(),
            ..Self::default()
        }
    }

    /// Restricts the scope to one namespace.
    #[must_use]
    pub fn namespace(mut self, ns: &str) -> Self {
        self.namespace = Some(ns.to_owned());
        self
    }

    /// Adds a label selector.
    #[must_use]
    pub fn labels(mut self, selector: &str) -> Self {
        self.label_selector = Some(selector.to_owned()).filter(|s| !s.is_empty());
        self
    }

    /// Adds a field selector.
    #[must_use]
    pub fn fields(mut self, selector: &str) -> Self {
        self.field_selector = Some(selector.to_owned()).filter(|s| !s.is_empty());
        self
    }

    /// Holds the objects' metadata only (`PartialObjectMetadata`).
    #[must_use]
    pub fn metadata_only(mut self) -> Self {
        self.metadata_only = true;
        self
    }

    /// Parses what [`canonical`](Self::canonical) writes (`None` for anything else).
    ///
    /// ```
    /// use durable_informer::object::ScopeSpec;
    /// let spec = ScopeSpec::new("apps", "v1", "deployments").namespace("prod").labels("app=web,tier in (a,b)");
    /// assert_eq!(ScopeSpec::from_canonical(&spec.canonical()), Some(spec.clone()));
    /// let meta = spec.metadata_only();
    /// assert_eq!(ScopeSpec::from_canonical(&meta.canonical()), Some(meta));
    /// ```
    #[must_use]
    pub fn from_canonical(canonical: &str) -> Option<Self> {
        let (path, query) = canonical.split_once("?ns=")?;
        let mut parts = path.splitn(3, '/');
        let (group, version, resource) = (parts.next()?, parts.next()?, parts.next()?);
        let (resource, metadata_only) = match resource.strip_suffix(";as=PartialObjectMetadata") {
            Some(r) => (r, true),
            None => (resource, false),
        };
        // Selectors may hold `&`: the keys are found from the left, in their fixed order.
        let (ns, rest) = query.split_once("&labels=")?;
        let (labels, fields) = rest.split_once("&fields=")?;
        let mut spec = Self::new(group, version, resource).labels(labels).fields(fields);
        spec.namespace = Some(ns.to_owned()).filter(|n| !n.is_empty());
        spec.metadata_only = metadata_only;
        Some(spec)
    }

    /// The canonical string that identifies the scope in the database:
    /// `group/version/resource?ns=…&labels=…&fields=…` (`resource;as=PartialObjectMetadata` for a
    /// metadata-only scope).
    #[must_use]
    pub fn canonical(&self) -> String {
        format!(
            "{}/{}/{}{}?ns={}&labels={}&fields={}",
            self.group,
            self.version,
            self.resource,
            if self.metadata_only {
                ";as=PartialObjectMetadata"
            } else {
                ""
            },
            self.namespace.as_deref().unwrap_or(""),
            self.label_selector.as_deref().unwrap_or(""),
            self.field_selector.as_deref().unwrap_or("")
        )
    }
}
