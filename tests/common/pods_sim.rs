//! A simulated server holding generated Pods in two namespaces, for the reader tests.

use std::time::Duration;

use durable_informer::sim::workload::WorkloadGen;
use durable_informer::sim::{Sim, SimConfig};

/// A sim with `pods` Pods generated from `seed`, spread over two namespaces.
pub fn sim_with_pods(seed: u64, pods: usize) -> Sim {
    let sim = Sim::start(SimConfig::default().bookmark_interval(Duration::from_millis(200))).unwrap();
    let mut gen = WorkloadGen::new(seed).namespaces(2);
    sim.bulk_load("namespaces", gen.namespace_objects()).unwrap();
    sim.bulk_load("pods", gen.pods(pods)).unwrap();
    sim
}
