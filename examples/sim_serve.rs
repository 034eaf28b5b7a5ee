//! Run the simulated API server with a generated workload, write a kubeconfig, and keep
//! serving until Ctrl-C: `cargo run --features sim --example sim_serve -- [pods] [kubeconfig-path]`.
//! Then: `KUBECONFIG=/tmp/sim.kubeconfig kubectl get pods -A`.

use durable_informer::sim::workload::{Churn, WorkloadGen};
use durable_informer::sim::{Sim, SimConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let pods: usize = args.next().map_or(Ok(100), |s| s.parse())?;
    let kubeconfig = args.next().unwrap_or_else(|| "/tmp/sim.kubeconfig".into());
    let sim = Sim::start(SimConfig::default())?;
    let mut gen = WorkloadGen::new(1).namespaces(4);
    sim.bulk_load("namespaces", gen.namespace_objects())?;
    sim.bulk_load("pods", gen.pods(pods))?;
    sim.write_kubeconfig(&kubeconfig)?;
    println!(
        "serving {} (kubeconfig: {kubeconfig}), rv {}",
        sim.url(),
        sim.current_rv()
    );
    let mut churn = Churn::new(2, "pods", gen.namespace_names());
    churn.adopt_existing(&sim)?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async {
        loop {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => break,
                r = churn.run(&sim, 5, std::time::Duration::from_secs(1)) => { r?; }
            }
        }
        Ok::<_, durable_informer::sim::SimError>(())
    })?;
    Ok(())
}
