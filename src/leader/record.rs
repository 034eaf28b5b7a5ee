//! The part of a Lease that leader election reads and writes.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

/// A Lease's election fields, as read (with its resourceVersion) or to be written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRecord {
    /// `holderIdentity`; `None` (or empty) when nobody holds it.
    pub holder: Option<String>,
    /// `leaseDurationSeconds`.
    pub lease_duration: Duration,
    /// `acquireTime` (the holder's wall clock: informative only).
    pub acquire_time: Option<Timestamp>,
    /// `renewTime` (the holder's wall clock: informative only, never used to decide expiry).
    pub renew_time: Option<Timestamp>,
    /// `leaseTransitions`: how many times the holder changed.
    pub transitions: i32,
    /// The Lease's resourceVersion when read; the condition of an update.
    pub resource_version: Option<String>,
}

impl LeaseRecord {
    /// A record held by `holder` from now.
    #[must_use]
    pub fn held_by(holder: &str, lease_duration: Duration, transitions: i32) -> Self {
        let now = Timestamp::now();
        Self {
            holder: Some(holder.to_owned()),
            lease_duration,
            acquire_time: Some(now),
            renew_time: Some(now),
            transitions,
            resource_version: None,
        }
    }

    /// The same holder, renewed now.
    #[must_use]
    pub fn renewed(&self) -> Self {
        Self {
            renew_time: Some(Timestamp::now()),
            ..self.clone()
        }
    }

    /// Given up by its holder (client-go's release): no holder, a one-second duration.
    #[must_use]
    pub fn released(&self) -> Self {
        let now = Timestamp::now();
        Self {
            holder: None,
            lease_duration: Duration::from_secs(1),
            acquire_time: Some(now),
            renew_time: Some(now),
            transitions: self.transitions,
            resource_version: self.resource_version.clone(),
        }
    }

    /// Equal in everything but the resourceVersion.
    #[must_use]
    pub fn same_content(&self, other: &Self) -> bool {
        Self {
            resource_version: None,
            ..self.clone()
        } == Self {
            resource_version: None,
            ..other.clone()
        }
    }
}
