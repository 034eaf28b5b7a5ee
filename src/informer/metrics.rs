//! The informers' metric family (a section of [`crate::metrics`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

#[cfg(feature = "metrics")]
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet};

use crate::metrics::prom::{Family, Gauge};
#[cfg(feature = "metrics")]
use crate::metrics::{add_section, encode_family};

/// Labels: resource and handler.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
#[cfg_attr(feature = "metrics", derive(EncodeLabelSet))]
pub(crate) struct HandlerLabels {
    /// The resource.
    pub(crate) resource: String,
    /// The handler's name; `volatile-<n>` for an unnamed one, `n` counting the process's
    /// unnamed handlers, so two never set one gauge.
    pub(crate) handler: String,
}

impl HandlerLabels {
    pub(crate) fn new(resource: &str, name: Option<&str>) -> Self {
        static UNNAMED: AtomicU64 = AtomicU64::new(0);
        let handler = name.map_or_else(
            || format!("volatile-{}", UNNAMED.fetch_add(1, Ordering::Relaxed) + 1),
            ToOwned::to_owned,
        );
        Self {
            resource: resource.to_owned(),
            handler,
        }
    }
}

/// Log entries a handler still has to read: the last committed seq minus its cursor, updated
/// as either moves (also while the handler is stuck in a callback); removed when it ends.
pub(crate) fn handler_lag() -> &'static Family<HandlerLabels, Gauge> {
    static FAMILY: OnceLock<Family<HandlerLabels, Gauge>> = OnceLock::new();
    FAMILY.get_or_init(|| {
        #[cfg(feature = "metrics")]
        add_section("informer", encode);
        Family::default()
    })
}

#[cfg(feature = "metrics")]
fn encode(e: &mut DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
    encode_family(
        e,
        "durable_informer_handler_lag_entries",
        "Log entries a handler has not read yet",
        handler_lag(),
    )
}
