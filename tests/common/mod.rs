pub mod alone;
pub mod fake;
pub mod tables;
