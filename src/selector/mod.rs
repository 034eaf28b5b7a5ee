//! Label, field and shard selectors with the API server's syntax (shared by the simulated server,
//! the reflector and listers).
//!
//! This module is neutral: it knows nothing about HTTP, the simulated server or the client side.
//! It parses the selector strings a kube-apiserver accepts in `labelSelector` and
//! `fieldSelector` query parameters, validates them the way the server does, matches them
//! against an object's labels or fields, and prints them back in canonical syntax.
//!
//! ## Label selectors
//!
//! A label selector is a comma-separated list of requirements, all of which must hold (AND):
//!
//! | syntax | meaning |
//! |---|---|
//! | `key=value`, `key==value` | the label is present and equal to `value` |
//! | `key!=value` | the label is absent, or present with another value |
//! | `key in (a,b)` | the label is present and one of the listed values |
//! | `key notin (a,b)` | the label is absent, or present with none of the listed values |
//! | `key` | the label is present |
//! | `!key` | the label is absent |
//! | `key>N`, `key<N` | the label is present, is an integer, and is greater (less) than the integer `N` |
//!
//! Keys are validated as Kubernetes label keys (optional DNS-subdomain prefix, `/`, name of at
//! most 63 characters); values as label values (at most 63 characters, alphanumeric at both
//! ends, `-`, `_`, `.` inside, or empty).
//!
//! ## Field selectors
//!
//! A field selector is a comma-separated list of `path=value`, `path==value` or `path!=value`
//! terms over dotted paths such as `metadata.name` or `status.phase`. A backslash escapes `,`,
//! `=`, `!` and `\` inside values. Which paths are *supported* depends on the resource; that
//! check belongs to the caller (the API server answers 400 for unsupported fields).
//!
//! ## Shard selectors
//!
//! A shard selector (KEP-5866, the `shardSelector` parameter of LIST and WATCH since
//! Kubernetes v1.36, alpha) is one or more `shardRange(FIELD, 'START', 'END')` terms joined by
//! `||`. FIELD is `object.metadata.uid` or `object.metadata.namespace`; START and END are
//! quoted `0x` hex bounds of a half-open range of the field's 64-bit FNV-1a hash (END may be
//! `'0x10000000000000000'`, the top). [`ShardSelector::by_uid`] builds shard `i` of `n`.
//!
//! ## Ring labels
//!
//! Label-ring sharding (timebertt's scheme) marks each object with the shard it is assigned to;
//! [`RingLabels`] names those labels and [`RingMember::label_selector`] selects one shard's
//! objects. The sharding itself is in [`crate::sharding`].
//!
//! ## Example
//!
//! ```no_run
//! use std::collections::BTreeMap;
//! use durable_informer::selector::{FieldSelector, LabelSelector};
//!
//! let sel: LabelSelector = "app=web,tier in (front,back),!canary".parse()?;
//! let labels = BTreeMap::from([("app".to_string(), "web".to_string()),
//!                              ("tier".to_string(), "front".to_string())]);
//! assert!(sel.matches(&labels));
//! assert_eq!(sel.to_string(), "app=web,!canary,tier in (back,front)");
//!
//! let fields: FieldSelector = "metadata.name=pod-1,status.phase!=Failed".parse()?;
//! assert!(fields.matches(|path| match path {
//!     "metadata.name" => Some("pod-1".to_string()),
//!     "status.phase" => Some("Running".to_string()),
//!     _ => None,
//! }));
//! # Ok::<(), durable_informer::selector::SelectorError>(())
//! ```

mod convert;
mod field;
mod label;
mod ring;
mod shard;

pub use field::{FieldOp, FieldRequirement, FieldSelector};
pub use label::{LabelOp, LabelRequirement, LabelSelector, Labels};
pub use ring::{RingLabels, RingMember, CONTROLLER_RING_LABEL, RING_LABEL_PREFIX};
pub use shard::{fnv1a_64, ShardField, ShardSelector, HASH_SPACE_END};

/// Why a selector string was rejected. The messages follow the API server's wording closely
/// enough to be shown to a user as the reason of an HTTP 400.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SelectorError {
    /// The label selector is not well formed (unexpected token, missing value, …).
    #[error("unable to parse requirement: {0}")]
    Syntax(String),
    /// A label key is not a valid Kubernetes label key.
    #[error("unable to parse requirement: invalid label key {key:?}: {reason}")]
    InvalidKey {
        /// The rejected key.
        key: String,
        /// What rule it breaks.
        reason: String,
    },
    /// A label value is not a valid Kubernetes label value.
    #[error("unable to parse requirement: invalid label value {value:?}: {reason}")]
    InvalidValue {
        /// The rejected value.
        value: String,
        /// What rule it breaks.
        reason: String,
    },
    /// A field selector term has no operator, or an empty field path.
    #[error("invalid selector: '{selector}'; can't understand '{term}'")]
    FieldTerm {
        /// The whole field selector.
        selector: String,
        /// The term that could not be understood.
        term: String,
    },
    /// A shard selector (KEP-5866 `shardRange(…)`) is not well formed or out of range.
    #[error("invalid shardSelector {selector:?}: {reason}")]
    Shard {
        /// The whole shard selector.
        selector: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// Result of selector parsing.
pub type Result<T, E = SelectorError> = std::result::Result<T, E>;

/// Writes requirements comma-separated: the canonical form of both selector kinds.
fn write_joined<T: std::fmt::Display>(f: &mut std::fmt::Formatter<'_>, items: &[T]) -> std::fmt::Result {
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            f.write_str(",")?;
        }
        write!(f, "{item}")?;
    }
    Ok(())
}
