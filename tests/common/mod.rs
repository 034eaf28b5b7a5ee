pub mod alone;
pub mod churn;
pub mod fake;
pub mod metrics_text;
pub mod reflector;
pub mod tables;
