//! The labels of label-ring sharding: which ring a shard Lease belongs to, which shard an object
//! is assigned to, and the drain request that moves it.
//!
//! The keys are those of timebertt/kubernetes-controller-sharding (`alpha.sharding.timebertt.dev`),
//! so `kubectl get -L` shows the same columns and either project's shards and sharder can share
//! a ring: the Lease label `alpha.sharding.timebertt.dev/controllerring=<ring>`, the object
//! labels `shard.alpha.sharding.timebertt.dev/<ring>=<shard>` and
//! `drain.alpha.sharding.timebertt.dev/<ring>=true`.

use super::label::{validate_key, validate_value, Labels};
use super::{Result, SelectorError};

/// The common prefix of the label keys.
pub const RING_LABEL_PREFIX: &str = "alpha.sharding.timebertt.dev/";

/// The label of a shard Lease that names its ring.
pub const CONTROLLER_RING_LABEL: &str = "alpha.sharding.timebertt.dev/controllerring";

/// The label keys of one ring.
///
/// ```
/// use durable_informer::selector::RingLabels;
/// let ring = RingLabels::new("webhosting")?;
/// assert_eq!(ring.shard_label(), "shard.alpha.sharding.timebertt.dev/webhosting");
/// assert_eq!(ring.drain_label(), "drain.alpha.sharding.timebertt.dev/webhosting");
/// assert_eq!(ring.lease_selector(), "alpha.sharding.timebertt.dev/controllerring=webhosting");
/// // A ring name must fit in a label key's name part.
/// assert!(RingLabels::new("Not A Ring").is_err());
/// # Ok::<(), durable_informer::selector::SelectorError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RingLabels {
    ring: String,
    shard: String,
    drain: String,
}

impl RingLabels {
    /// The labels of ring `ring` (at most 63 characters, alphanumeric at both ends, `-_.`
    /// inside: it ends the label keys and is the value of the Lease label).
    pub fn new(ring: &str) -> Result<Self> {
        validate_value(ring)?;
        if ring.is_empty() {
            return Err(SelectorError::InvalidValue {
                value: String::new(),
                reason: "a ring name must not be empty".into(),
            });
        }
        let shard = format!("shard.{RING_LABEL_PREFIX}{ring}");
        let drain = format!("drain.{RING_LABEL_PREFIX}{ring}");
        validate_key(&shard)?;
        validate_key(&drain)?;
        Ok(Self {
            ring: ring.to_owned(),
            shard,
            drain,
        })
    }

    /// The ring's name.
    #[must_use]
    pub fn ring(&self) -> &str {
        &self.ring
    }

    /// `shard.alpha.sharding.timebertt.dev/<ring>`: the shard an object is assigned to.
    #[must_use]
    pub fn shard_label(&self) -> &str {
        &self.shard
    }

    /// `drain.alpha.sharding.timebertt.dev/<ring>`: the sharder asks the object's shard to let
    /// it go.
    #[must_use]
    pub fn drain_label(&self) -> &str {
        &self.drain
    }

    /// The label selector of the ring's shard Leases.
    #[must_use]
    pub fn lease_selector(&self) -> String {
        format!("{CONTROLLER_RING_LABEL}={}", self.ring)
    }

    /// Shard `shard` of this ring (its id is a label value: at most 63 characters).
    ///
    /// ```
    /// use durable_informer::selector::RingLabels;
    /// let me = RingLabels::new("web")?.member("shard-0")?;
    /// assert_eq!(me.label_selector(), "shard.alpha.sharding.timebertt.dev/web=shard-0");
    /// assert!(RingLabels::new("web")?.member("").is_err());
    /// # Ok::<(), durable_informer::selector::SelectorError>(())
    /// ```
    pub fn member(&self, shard: &str) -> Result<RingMember> {
        validate_value(shard)?;
        if shard.is_empty() {
            return Err(SelectorError::InvalidValue {
                value: String::new(),
                reason: "a shard id must not be empty".into(),
            });
        }
        Ok(RingMember {
            labels: self.clone(),
            shard: shard.to_owned(),
        })
    }

    /// The shard an object with these labels is assigned to (`None`: unassigned).
    #[must_use]
    pub fn assigned<'a, L: Labels + ?Sized>(&self, labels: &'a L) -> Option<&'a str> {
        labels.get_label(&self.shard).filter(|s| !s.is_empty())
    }

    /// Whether an object with these labels is being drained from its shard.
    #[must_use]
    pub fn draining<L: Labels + ?Sized>(&self, labels: &L) -> bool {
        labels.get_label(&self.drain).is_some()
    }
}

/// One shard of a ring: the ring's labels and the shard's id (also the name and holder of its
/// Lease). What an informer restricted to its shard, and the shard's drain acknowledgement, need.
///
/// ```
/// use std::collections::BTreeMap;
/// use durable_informer::selector::RingLabels;
/// let me = RingLabels::new("web")?.member("shard-0")?;
/// let labels = BTreeMap::from([(me.ring().shard_label().to_owned(), "shard-0".to_owned())]);
/// assert!(me.owns(&labels));
/// # Ok::<(), durable_informer::selector::SelectorError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RingMember {
    labels: RingLabels,
    shard: String,
}

impl RingMember {
    /// The ring's labels.
    #[must_use]
    pub fn ring(&self) -> &RingLabels {
        &self.labels
    }

    /// The shard's id.
    #[must_use]
    pub fn shard(&self) -> &str {
        &self.shard
    }

    /// `shard.alpha.sharding.timebertt.dev/<ring>=<shard>`: the objects assigned to this shard.
    #[must_use]
    pub fn label_selector(&self) -> String {
        format!("{}={}", self.labels.shard, self.shard)
    }

    /// Whether an object with these labels is assigned to this shard.
    #[must_use]
    pub fn owns<L: Labels + ?Sized>(&self, labels: &L) -> bool {
        self.labels.assigned(labels) == Some(self.shard.as_str())
    }

    /// `base` narrowed to this shard's objects (`base` may be empty).
    ///
    /// ```
    /// use durable_informer::selector::RingLabels;
    /// let me = RingLabels::new("web")?.member("a")?;
    /// assert_eq!(me.narrow(Some("app=x")), "app=x,shard.alpha.sharding.timebertt.dev/web=a");
    /// assert_eq!(me.narrow(None), "shard.alpha.sharding.timebertt.dev/web=a");
    /// # Ok::<(), durable_informer::selector::SelectorError>(())
    /// ```
    #[must_use]
    pub fn narrow(&self, base: Option<&str>) -> String {
        match base.map(str::trim).filter(|b| !b.is_empty()) {
            Some(b) => format!("{b},{}", self.label_selector()),
            None => self.label_selector(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_names_that_cannot_end_a_label_key_are_refused() {
        for bad in ["", "-a", "a b", "UPPER_ok_but/slash", &"x".repeat(64)] {
            assert!(RingLabels::new(bad).is_err(), "{bad:?}");
        }
        let ring = RingLabels::new("a.b-c_d").unwrap();
        assert!(ring.member(&"s".repeat(64)).is_err());
        assert!(ring.member("pod-7d9f").is_ok());
    }

    #[test]
    fn the_member_selector_parses_and_matches_its_labels() {
        let me = RingLabels::new("web").unwrap().member("s1").unwrap();
        let sel: crate::selector::LabelSelector = me.narrow(Some("app=x")).parse().unwrap();
        let mut labels = std::collections::BTreeMap::from([("app".to_owned(), "x".to_owned())]);
        assert!(!sel.matches(&labels));
        labels.insert(me.ring().shard_label().to_owned(), "s1".to_owned());
        assert!(sel.matches(&labels) && me.owns(&labels));
        assert!(!me.ring().draining(&labels));
    }
}
