//! An object as it travels through the pipeline: its bytes exactly as received, and its metadata.

use bytes::Bytes;

use super::meta::{scan_object, ManagedFields, Scanned};
use super::{ObjectError, ObjectKey, ObjectMeta};

/// An object as received: its JSON bytes (kept exactly as they arrived) and its metadata.
#[derive(Clone)]
pub struct RawObject {
    /// Extracted metadata.
    pub meta: ObjectMeta,
    /// The JSON bytes.
    pub bytes: Bytes,
    /// Where `managedFields` was in `bytes` when they were scanned, and which bytes those were
    /// (start address and length): a hint that is ignored once `bytes` is replaced.
    pub(crate) scan: Option<(usize, usize, ManagedFields)>,
}

// Equality and `Debug` ignore the scan hint: it says where a field is, not what the object is.
impl std::fmt::Debug for RawObject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawObject")
            .field("meta", &self.meta)
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl PartialEq for RawObject {
    fn eq(&self, other: &Self) -> bool {
        self.meta == other.meta && self.bytes == other.bytes
    }
}

impl Eq for RawObject {}

impl RawObject {
    /// Extracts the metadata of `bytes`.
    pub fn from_json(bytes: impl Into<Bytes>) -> Result<Self, ObjectError> {
        let bytes = bytes.into();
        let scanned = scan_object(&bytes)?;
        Ok(Self::scanned(bytes, scanned))
    }

    pub(crate) fn scanned(bytes: Bytes, scanned: Scanned) -> Self {
        Self {
            meta: scanned.meta,
            scan: Some((bytes.as_ptr() as usize, bytes.len(), scanned.managed_fields)),
            bytes,
        }
    }

    /// An object whose metadata the caller already has (read back from the store).
    pub(crate) fn from_parts(meta: ObjectMeta, bytes: Bytes) -> Self {
        Self {
            meta,
            bytes,
            scan: None,
        }
    }

    /// Replaces `bytes` with the same object without `managedFields`, and says so in the hint,
    /// so a later look at the new bytes never applies the old position to them.
    pub(crate) fn set_stripped(&mut self, bytes: Bytes) {
        self.scan = Some((bytes.as_ptr() as usize, bytes.len(), ManagedFields::Absent));
        self.bytes = bytes;
    }

    /// The object's key.
    #[must_use]
    pub fn key(&self) -> ObjectKey {
        self.meta.key()
    }

    /// Where `managedFields` is in the current `bytes`, if these are the bytes that were
    /// scanned (`Unknown` otherwise).
    pub(crate) fn managed_fields(&self) -> ManagedFields {
        match &self.scan {
            Some((addr, len, mf)) if *addr == self.bytes.as_ptr() as usize && *len == self.bytes.len() => match mf {
                ManagedFields::At { key, .. } if self.bytes.get(*key..key + 15) != Some(&b"\"managedFields\""[..]) => {
                    ManagedFields::Unknown
                }
                mf => mf.clone(),
            },
            _ => ManagedFields::Unknown,
        }
    }
}
