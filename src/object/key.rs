//! Object keys and resourceVersions: the identities every stage passes around.

use std::fmt;

/// NUL: the separator inside the store's composite keys, so it may not appear in a key.
const NUL: u8 = 0;

/// A Kubernetes resourceVersion: opaque to clients, but in practice a decimal integer that can
/// be compared (KEP-5504 makes that official).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize)]
pub struct ResourceVersion(pub String);

impl ResourceVersion {
    /// The resourceVersion as an integer, when it is one.
    #[must_use]
    pub fn as_u64(&self) -> Option<u64> {
        self.0.parse().ok()
    }

    /// The string form.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// True for the empty resourceVersion.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// `true` when `self` is known to be older than `other` (both integers).
    #[must_use]
    pub fn is_older_than(&self, other: &ResourceVersion) -> bool {
        matches!((self.as_u64(), other.as_u64()), (Some(a), Some(b)) if a < b)
    }
}

impl fmt::Display for ResourceVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for ResourceVersion {
    fn from(s: &str) -> Self {
        Self(s.to_owned())
    }
}

impl From<String> for ResourceVersion {
    fn from(s: String) -> Self {
        Self(s)
    }
}

/// The key of an object inside a scope: `namespace/name`, or `name` for cluster-scoped objects
/// (client-go's `MetaNamespaceKeyFunc`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct ObjectKey {
    /// Namespace; `None` for cluster-scoped objects.
    pub namespace: Option<String>,
    /// Name.
    pub name: String,
}

impl ObjectKey {
    /// A namespaced key.
    #[must_use]
    pub fn namespaced(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: Some(namespace.into()),
            name: name.into(),
        }
    }

    /// A cluster-scoped key.
    #[must_use]
    pub fn cluster(name: impl Into<String>) -> Self {
        Self {
            namespace: None,
            name: name.into(),
        }
    }

    /// Parses `ns/name` or `name`.
    pub fn parse(s: &str) -> Result<Self, KeyError> {
        let key = match s.split_once('/') {
            Some((ns, name)) => Self::namespaced(ns, name),
            None => Self::cluster(s),
        };
        key.validate()?;
        Ok(key)
    }

    /// Checks that the key can be encoded: a non-empty name, no NUL and no `/` in either part.
    pub fn validate(&self) -> Result<(), KeyError> {
        let bad = |s: &str| s.bytes().any(|b| b == NUL || b == b'/');
        if self.name.is_empty() {
            return Err(KeyError::EmptyName);
        }
        if bad(&self.name) || self.namespace.as_deref().is_some_and(|ns| ns.is_empty() || bad(ns)) {
            return Err(KeyError::Invalid(self.to_string()));
        }
        Ok(())
    }

    /// The namespace, or `""` for cluster-scoped objects.
    #[must_use]
    pub fn namespace_str(&self) -> &str {
        self.namespace.as_deref().unwrap_or("")
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{ns}/{}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

impl std::str::FromStr for ObjectKey {
    type Err = KeyError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// A key that cannot be stored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The object has no name.
    #[error("object has an empty name")]
    EmptyName,
    /// A NUL byte or a `/` inside a name or namespace, or an empty namespace.
    #[error("invalid object key {0:?}: names and namespaces must be non-empty and contain no NUL or '/'")]
    Invalid(String),
    /// A stored key does not decode: the database is damaged.
    #[error("malformed stored key {0:?}")]
    Malformed(Vec<u8>),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_parse_and_reject_bad_names() {
        assert_eq!(ObjectKey::parse("ns/a").unwrap(), ObjectKey::namespaced("ns", "a"));
        assert_eq!(ObjectKey::parse("node-1").unwrap(), ObjectKey::cluster("node-1"));
        assert_eq!(ObjectKey::parse("").unwrap_err(), KeyError::EmptyName);
        assert!(ObjectKey::parse("a/b/c").is_err());
        assert!(ObjectKey::parse("/b").is_err());
        assert!(ObjectKey::namespaced("a", "b\0").validate().is_err());
    }

    #[test]
    fn resource_versions_compare_as_integers() {
        assert!(ResourceVersion::from("9").is_older_than(&"10".into()));
        assert!(!ResourceVersion::from("10").is_older_than(&"9".into()));
        assert!(!ResourceVersion::from("x").is_older_than(&"9".into()));
    }
}
