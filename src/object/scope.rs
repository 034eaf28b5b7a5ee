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
