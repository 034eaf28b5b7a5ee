pub mod fake;
pub mod tables;
