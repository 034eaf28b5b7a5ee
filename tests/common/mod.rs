pub mod alone;
pub mod churn;
pub mod fake;
#[cfg(feature = "metrics")]
pub mod metrics_text;
pub mod reflector;
pub mod tables;
