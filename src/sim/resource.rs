//! The resources the server serves: group, version, kind, plural, scope and selectable fields.

/// A resource the server serves: group/version/kind and its plural name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceDef {
    /// API group (`""` for core).
    pub group: String,
    /// API version, e.g. `v1`.
    pub version: String,
    /// Kind, e.g. `Pod`.
    pub kind: String,
    /// Plural resource name, e.g. `pods`.
    pub plural: String,
    /// Whether objects live in namespaces.
    pub namespaced: bool,
    /// Whether `/status` is a subresource (then the main resource ignores `.status` changes).
    pub status_subresource: bool,
    /// Short names for discovery (`kubectl get cm`).
    pub short_names: Vec<String>,
}

impl ResourceDef {
    /// A namespaced custom resource stored as JSON, with a status subresource.
    pub fn custom(group: &str, version: &str, kind: &str, plural: &str) -> Self {
        Self {
            group: group.into(),
            version: version.into(),
            kind: kind.into(),
            plural: plural.into(),
            namespaced: true,
            status_subresource: true,
            short_names: Vec::new(),
        }
    }

    /// Make it cluster-scoped.
    #[must_use]
    pub fn cluster_scoped(mut self) -> Self {
        self.namespaced = false;
        self
    }

    fn builtin(group: &str, kind: &str, plural: &str, namespaced: bool, status: bool, short: &[&str]) -> Self {
        Self {
            group: group.into(),
            version: "v1".into(),
            kind: kind.into(),
            plural: plural.into(),
            namespaced,
            status_subresource: status,
            short_names: short.iter().map(|s| (*s).to_string()).collect(),
        }
    }

    /// The built-in resources: core/v1 pods, configmaps, secrets, namespaces, nodes,
    /// serviceaccounts and services, apps/v1 deployments, batch/v1 jobs and cronjobs,
    /// rbac.authorization.k8s.io/v1 roles, rolebindings, clusterroles and clusterrolebindings,
    /// and coordination.k8s.io/v1 leases: what `kubectl create` has generators for.
    pub fn builtins() -> Vec<Self> {
        const RBAC: &str = "rbac.authorization.k8s.io";
        vec![
            Self::builtin("", "Pod", "pods", true, true, &["po"]),
            Self::builtin("", "ConfigMap", "configmaps", true, false, &["cm"]),
            Self::builtin("", "Secret", "secrets", true, false, &[]),
            Self::builtin("", "Namespace", "namespaces", false, true, &["ns"]),
            Self::builtin("", "Node", "nodes", false, true, &["no"]),
            Self::builtin("", "ServiceAccount", "serviceaccounts", true, false, &["sa"]),
            Self::builtin("", "Service", "services", true, true, &["svc"]),
            Self::builtin("apps", "Deployment", "deployments", true, true, &["deploy"]),
            Self::builtin("batch", "Job", "jobs", true, true, &[]),
            Self::builtin("batch", "CronJob", "cronjobs", true, true, &["cj"]),
            Self::builtin(RBAC, "Role", "roles", true, false, &[]),
            Self::builtin(RBAC, "RoleBinding", "rolebindings", true, false, &[]),
            Self::builtin(RBAC, "ClusterRole", "clusterroles", false, false, &[]),
            Self::builtin(RBAC, "ClusterRoleBinding", "clusterrolebindings", false, false, &[]),
            Self::builtin("coordination.k8s.io", "Lease", "leases", true, false, &[]),
        ]
    }

    /// Whether the resource has the `/scale` subresource (autoscaling/v1 `Scale`).
    pub(crate) fn has_scale(&self) -> bool {
        self.group == "apps" && matches!(self.plural.as_str(), "deployments" | "replicasets" | "statefulsets")
    }

    /// `group/version`, or `version` for the core group.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            // Built by hand: every stored version asks for it, and `format!` costs more.
            let mut s = String::with_capacity(self.group.len() + 1 + self.version.len());
            s.push_str(&self.group);
            s.push('/');
            s.push_str(&self.version);
            s
        }
    }

    /// `plural` or `plural.group`, as used in API server messages.
    pub(crate) fn resource_group(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    pub(crate) fn has_generation(&self) -> bool {
        !self.group.is_empty()
    }

    fn is_core(&self, plural: &str) -> bool {
        self.group.is_empty() && self.plural == plural
    }

    /// Field paths selectable besides `metadata.name` and `metadata.namespace`.
    pub(crate) fn extra_fields(&self) -> &'static [&'static str] {
        if self.is_core("pods") {
            &[
                "status.phase",
                "spec.nodeName",
                "spec.restartPolicy",
                "spec.schedulerName",
                "spec.serviceAccountName",
                "status.podIP",
                "status.nominatedNodeName",
            ]
        } else if self.is_core("secrets") {
            &["type"]
        } else if self.is_core("namespaces") {
            &["status.phase"]
        } else if self.is_core("nodes") {
            &["spec.unschedulable"]
        } else {
            &[]
        }
    }
}
