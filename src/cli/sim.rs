//! `sim serve`: the simulated API server alone, for kubectl and your own controllers.

use std::path::PathBuf;

use durable_informer::sim::workload::WorkloadGen;
use durable_informer::sim::{Sim, SimConfig};

use super::progress::spinner;
use super::{CliError, CliResult, Size};

/// Fills `sim` with `pods` Pods over `namespaces` namespaces (seed 42), with a spinner.
pub fn generate(sim: &Sim, pods: usize, namespaces: usize) -> CliResult {
    let pb = spinner(&format!("generating {pods} Pods in {namespaces} namespaces"));
    let mut gen = WorkloadGen::new(42).namespaces(namespaces);
    let fail = |e: durable_informer::sim::SimError| CliError::runtime(format!("simulated cluster: {e}"));
    sim.bulk_load("namespaces", gen.namespace_objects()).map_err(fail)?;
    sim.bulk_load("pods", gen.pods(pods)).map_err(fail)?;
    pb.finish_and_clear();
    Ok(())
}

pub async fn serve(port: u16, kubeconfig_out: Option<PathBuf>, size: Option<Size>) -> CliResult {
    let stop_signal = super::live::signals();
    tokio::pin!(stop_signal);
    let sim = tokio::task::spawn_blocking(move || -> Result<Sim, CliError> {
        let sim =
            Sim::start(SimConfig::default().port(port)).map_err(|e| CliError::runtime(format!("cannot start: {e}")))?;
        if let Some(size) = size {
            let (pods, ns) = match size {
                Size::Small => (1_000, 5),
                Size::Medium => (20_000, 50),
                Size::Large => (100_000, 100),
            };
            generate(&sim, pods, ns)?;
        }
        Ok(sim)
    });
    // A signal during a long generation stops at once.
    let sim = tokio::select! {
        r = sim => r.map_err(CliError::runtime)??,
        () = &mut stop_signal => return Ok(()),
    };
    if let Some(path) = &kubeconfig_out {
        sim.write_kubeconfig(path)
            .map_err(|e| CliError::runtime(format!("{}: {e}", path.display())))?;
        errln!(
            "kubeconfig written to {} (kubectl --kubeconfig {} get pods -A)",
            path.display(),
            path.display()
        );
    }
    outln!("simulated API server listening on {} (Ctrl-C to stop)", sim.url())?;
    stop_signal.await;
    drop(sim);
    Ok(())
}
