//! kubectl's ways to name a resource: `pods`, `pod`, `po`, `Pod`, `pods.v1.`,
//! `deployments.apps`, `deployments.v1.apps`.
//!
//! The database records a scope's group, version and plural but no short names, so short
//! names come from a built-in table of the standard Kubernetes resources; kinds and singulars
//! are matched against the recorded plurals (and, offline, a stored object's `kind`).

/// A resource as typed on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wanted {
    /// The name part, lower-cased: plural, singular, kind or short name.
    pub name: String,
    /// `Some("")` for `pods.v1.` (core), `Some("apps")` for `deployments.apps`; `None`: any.
    pub group: Option<String>,
    /// `Some("v1")` for `pods.v1.`.
    pub version: Option<String>,
    /// What was typed, for messages.
    pub typed: String,
}

/// The standard resources: (short names, plural, group, kind).
const BUILT_IN: &[(&[&str], &str, &str, &str)] = &[
    (&["po"], "pods", "", "Pod"),
    (&["svc"], "services", "", "Service"),
    (&["cm"], "configmaps", "", "ConfigMap"),
    (&[], "secrets", "", "Secret"),
    (&["ns"], "namespaces", "", "Namespace"),
    (&["no"], "nodes", "", "Node"),
    (&["sa"], "serviceaccounts", "", "ServiceAccount"),
    (&["ep"], "endpoints", "", "Endpoints"),
    (&["ev"], "events", "", "Event"),
    (&["pvc"], "persistentvolumeclaims", "", "PersistentVolumeClaim"),
    (&["pv"], "persistentvolumes", "", "PersistentVolume"),
    (&["rc"], "replicationcontrollers", "", "ReplicationController"),
    (&["limits"], "limitranges", "", "LimitRange"),
    (&["quota"], "resourcequotas", "", "ResourceQuota"),
    (&["deploy"], "deployments", "apps", "Deployment"),
    (&["ds"], "daemonsets", "apps", "DaemonSet"),
    (&["sts"], "statefulsets", "apps", "StatefulSet"),
    (&["rs"], "replicasets", "apps", "ReplicaSet"),
    (&[], "controllerrevisions", "apps", "ControllerRevision"),
    (&[], "jobs", "batch", "Job"),
    (&["cj"], "cronjobs", "batch", "CronJob"),
    (&["ing"], "ingresses", "networking.k8s.io", "Ingress"),
    (&["netpol"], "networkpolicies", "networking.k8s.io", "NetworkPolicy"),
    (&[], "ingressclasses", "networking.k8s.io", "IngressClass"),
    (
        &["hpa"],
        "horizontalpodautoscalers",
        "autoscaling",
        "HorizontalPodAutoscaler",
    ),
    (&["pdb"], "poddisruptionbudgets", "policy", "PodDisruptionBudget"),
    (&["sc"], "storageclasses", "storage.k8s.io", "StorageClass"),
    (
        &["crd", "crds"],
        "customresourcedefinitions",
        "apiextensions.k8s.io",
        "CustomResourceDefinition",
    ),
    (&["pc"], "priorityclasses", "scheduling.k8s.io", "PriorityClass"),
    (
        &["csr"],
        "certificatesigningrequests",
        "certificates.k8s.io",
        "CertificateSigningRequest",
    ),
    (&[], "leases", "coordination.k8s.io", "Lease"),
    (&[], "endpointslices", "discovery.k8s.io", "EndpointSlice"),
    (&[], "roles", "rbac.authorization.k8s.io", "Role"),
    (&[], "rolebindings", "rbac.authorization.k8s.io", "RoleBinding"),
    (&[], "clusterroles", "rbac.authorization.k8s.io", "ClusterRole"),
    (
        &[],
        "clusterrolebindings",
        "rbac.authorization.k8s.io",
        "ClusterRoleBinding",
    ),
];

/// Whether `s` looks like an API version (`v1`, `v1beta1`, `v2alpha3`).
fn is_version(s: &str) -> bool {
    let Some(rest) = s.strip_prefix('v') else {
        return false;
    };
    let digits = rest.chars().take_while(char::is_ascii_digit).count();
    if digits == 0 {
        return false;
    }
    let tail = &rest[digits..];
    tail.is_empty()
        || ["alpha", "beta"].iter().any(|p| {
            tail.strip_prefix(p)
                .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
        })
}

impl Wanted {
    /// Parses `name[.version.group]` or `name[.group]` (kubectl's `resource.version.group`).
    pub fn parse(typed: &str) -> Wanted {
        let (name, rest) = match typed.split_once('.') {
            Some((n, r)) => (n, Some(r)),
            None => (typed, None),
        };
        let (version, group) = match rest {
            None => (None, None),
            Some(r) => match r.split_once('.') {
                Some((v, g)) if is_version(v) => (Some(v.to_owned()), Some(g.to_owned())),
                _ => (None, Some(r.to_owned())),
            },
        };
        Wanted {
            name: name.to_ascii_lowercase(),
            group,
            version,
            typed: typed.to_owned(),
        }
    }

    /// Whether this names the resource `plural` of `group` whose kind is `kind` (when known).
    pub fn matches(&self, plural: &str, group: &str, version: &str, kind: Option<&str>) -> bool {
        if self.group.as_deref().is_some_and(|g| g != group) {
            return false;
        }
        if self.version.as_deref().is_some_and(|v| v != version) {
            return false;
        }
        let n = self.name.as_str();
        let plural = plural.to_ascii_lowercase();
        if n == plural || kind.is_some_and(|k| k.eq_ignore_ascii_case(n)) {
            return true;
        }
        if let Some((shorts, _, _, k)) = builtin(&plural, group) {
            if shorts.contains(&n) || k.eq_ignore_ascii_case(n) {
                return true;
            }
        }
        // A singular without a known kind: English plurals as the API server forms them.
        [format!("{n}s"), format!("{n}es")].contains(&plural)
            || n.strip_suffix('y').is_some_and(|stem| plural == format!("{stem}ies"))
    }
}

/// The built-in entry of `plural` in `group`.
fn builtin(plural: &str, group: &str) -> Option<(&'static [&'static str], &'static str, &'static str, &'static str)> {
    BUILT_IN
        .iter()
        .copied()
        .find(|(_, p, g, _)| *p == plural && *g == group)
}

/// The kind of `plural` in `group` from the built-in table.
pub fn builtin_kind(plural: &str, group: &str) -> Option<&'static str> {
    builtin(plural, group).map(|(_, _, _, k)| k)
}

/// The (plural, group) a short name, kind or singular names among the standard resources.
pub fn builtin_lookup(w: &Wanted) -> Option<(&'static str, &'static str)> {
    BUILT_IN
        .iter()
        // The table holds no versions: any version the user named is checked later, by the
        // scope or discovery.
        .find(|(_, p, g, _)| w.matches(p, g, w.version.as_deref().unwrap_or(""), None))
        .map(|(_, p, g, _)| (*p, *g))
}

/// kubectl's `-o name` prefix: `pod`, `deployment.apps`.
pub fn name_prefix(kind: &str, group: &str) -> String {
    let kind = kind.to_ascii_lowercase();
    if group.is_empty() {
        kind
    } else {
        format!("{kind}.{group}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubectl_spellings_resolve() {
        for typed in ["pods", "pod", "po", "Pod", "PODS", "pods.v1.", "pod.v1."] {
            assert_eq!(builtin_lookup(&Wanted::parse(typed)), Some(("pods", "")), "{typed}");
        }
        for typed in ["deployments.apps", "deploy", "Deployment", "deployments.v1.apps"] {
            assert_eq!(
                builtin_lookup(&Wanted::parse(typed)),
                Some(("deployments", "apps")),
                "{typed}"
            );
        }
        assert_eq!(builtin_lookup(&Wanted::parse("pods.apps")), None);
        assert!(Wanted::parse("widget").matches("widgets", "example.com", "v1", None));
        assert!(Wanted::parse("policy").matches("policies", "example.com", "v1", None));
        assert!(!Wanted::parse("po").matches("podtemplates", "", "v1", None));
    }
}
