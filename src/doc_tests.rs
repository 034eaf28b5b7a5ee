//! The Rust examples of the README and of the pages under `docs/`, compiled (and the runnable
//! ones run) as doc tests, so a page cannot drift from the API. Examples that need a real
//! cluster are `no_run` (compiled only).

/// README.md.
#[cfg(all(doctest, feature = "sim"))]
#[doc = include_str!("../README.md")]
pub struct Readme;

/// docs/library.md.
#[cfg(all(doctest, feature = "sim"))]
#[doc = include_str!("../docs/library.md")]
pub struct LibraryDoc;

/// docs/leader-election.md.
#[cfg(all(doctest, feature = "sim"))]
#[doc = include_str!("../docs/leader-election.md")]
pub struct LeaderElectionDoc;

/// docs/sharding.md.
#[cfg(all(doctest, feature = "sim"))]
#[doc = include_str!("../docs/sharding.md")]
pub struct ShardingDoc;

/// docs/sim.md.
#[cfg(all(doctest, feature = "sim"))]
#[doc = include_str!("../docs/sim.md")]
pub struct SimDoc;
