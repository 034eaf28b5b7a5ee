pub mod alone;
pub mod fake;
pub mod reflector;
pub mod tables;
