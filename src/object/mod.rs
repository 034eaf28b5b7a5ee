//! The vocabulary every stage shares: an object's bytes and metadata, its key, its
//! resourceVersion and the scope it was watched in. It imports nothing else from the crate.
//!
//! `source` produces [`RawObject`]s, `store` keeps them, `reflector`, `informer`, `controller`
//! and `replay` pass them on; none of those needs another's types to talk about an object.
//!
//! ```
//! use durable_informer::object::{ObjectKey, RawObject};
//!
//! let obj = RawObject::from_json(&br#"{"metadata":{"name":"a","namespace":"ns","resourceVersion":"7"}}"#[..])?;
//! assert_eq!(obj.key(), ObjectKey::namespaced("ns", "a"));
//! assert_eq!(obj.meta.resource_version.as_u64(), Some(7));
//! # Ok::<(), durable_informer::object::ObjectError>(())
//! ```

mod key;
mod meta;
mod raw;
mod scope;

pub use key::{KeyError, ObjectKey, ResourceVersion};
pub use meta::{extract_meta, ObjectError, ObjectMeta, OwnerReference, StringMap, StringMapIter};
pub(crate) use meta::{scan_object, ManagedFields};
pub use raw::RawObject;
pub use scope::ScopeSpec;
