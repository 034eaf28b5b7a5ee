pub mod alone;
pub mod churn;
pub mod fake;
pub mod reflector;
pub mod tables;
