//! Leader election's metric families (a section of [`crate::metrics`]): whether this replica
//! leads each Lease (client-go's `leader_election_master_status`) and how often that changed.

use std::sync::OnceLock;

#[cfg(feature = "metrics")]
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet};

use crate::metrics::prom::{Counter, Family, Gauge};
#[cfg(feature = "metrics")]
use crate::metrics::{add_section, encode_family};

/// Labels: the Lease, `namespace/name`.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
#[cfg_attr(feature = "metrics", derive(EncodeLabelSet))]
pub(crate) struct LeaseLabels {
    pub(crate) lease: String,
}

struct Families {
    is_leader: Family<LeaseLabels, Gauge>,
    transitions: Family<LeaseLabels, Counter>,
}

fn families() -> &'static Families {
    static F: OnceLock<Families> = OnceLock::new();
    F.get_or_init(|| {
        #[cfg(feature = "metrics")]
        add_section("leader", encode);
        Families {
            is_leader: Family::default(),
            transitions: Family::default(),
        }
    })
}

/// Records that this replica leads `lease` (or not); a change of value counts a transition.
pub(crate) fn set_leading(lease: &str, leading: bool) {
    let labels = LeaseLabels {
        lease: lease.to_owned(),
    };
    let f = families();
    let was = f.is_leader.get_or_create(&labels).set(i64::from(leading));
    if was != i64::from(leading) {
        f.transitions.get_or_create(&labels).inc();
    }
}

/// Makes the series of `lease` appear (not leading) before the first round ends.
pub(crate) fn following(lease: &str) {
    let labels = LeaseLabels {
        lease: lease.to_owned(),
    };
    let f = families();
    drop(f.is_leader.get_or_create(&labels));
    drop(f.transitions.get_or_create(&labels));
}

#[cfg(feature = "metrics")]
fn encode(e: &mut DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
    let f = families();
    encode_family(
        e,
        "durable_informer_leader_is_leader",
        "Whether this replica leads the Lease (1) or not (0)",
        &f.is_leader,
    )?;
    encode_family(
        e,
        "durable_informer_leader_transitions",
        "How often this replica started or stopped leading the Lease",
        &f.transitions,
    )
}

#[cfg(all(test, feature = "metrics"))]
mod tests {
    use super::*;

    #[test]
    fn a_change_of_leadership_counts_one_transition() {
        following("ns/unit-test");
        set_leading("ns/unit-test", true);
        set_leading("ns/unit-test", true);
        set_leading("ns/unit-test", false);
        let text = crate::metrics::encode();
        assert!(
            text.contains(r#"durable_informer_leader_is_leader{lease="ns/unit-test"} 0"#),
            "{text}"
        );
        assert!(
            text.contains(r#"durable_informer_leader_transitions_total{lease="ns/unit-test"} 2"#),
            "{text}"
        );
    }
}
