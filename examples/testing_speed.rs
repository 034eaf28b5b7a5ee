//! How fast the controller test harness runs: generates a recording of Foos with `EVENTS`
//! changes (creates, scales, status messages from another party, deletes; seeded), then
//! checks the sample controller (examples/testing_sample_controller.rs) with `SCHEDULES`
//! sampled schedules on `THREADS` threads (default: the cores) and prints the rate. With
//! `list`, it also checks a whole-state invariant after every write (listing every
//! Deployment), whose cost grows with the live objects. Build it in release for figures:
//!
//! ```text
//! cargo run --release --features testing --example testing_speed -- 10000 200
//! cargo run --release --features testing --example testing_speed -- 10000 20 1 list
//! ```
//!
//! `testing_speed_mimalloc` is the same with mimalloc as the global allocator, as a test
//! binary may choose (docs/testing-controllers.md has both). With `TESTING_SPEED_BUDGET=S`
//! the check gets a [time budget](durable_informer::testing::Harness::time_budget) of `S`
//! seconds and prints how many schedules fit in it.

#![allow(missing_docs)] // an example
#![allow(clippy::disallowed_names)] // `Foo` is the resource sample-controller is about

#[path = "testing_sample_controller.rs"]
#[allow(unreachable_pub)]
mod sample;

use std::io::Write;
use std::time::Instant;

use rand::{Rng, SeedableRng};
use serde_json::json;

/// Writes a recording of `events` changes of Foos in namespace `default`.
fn generate(path: &std::path::Path, events: usize, seed: u64) -> std::io::Result<()> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut rv = 1000u64;
    let mut live: Vec<(String, i64, bool)> = Vec::new();
    let mut next = 0;
    let foo = |name: &str, replicas: i64, message: bool, rv: u64| {
        let mut o = json!({"apiVersion": "samplecontroller.k8s.io/v1alpha1", "kind": "Foo",
            "metadata": {"name": name, "namespace": "default", "resourceVersion": rv.to_string()},
            "spec": {"deploymentName": name, "replicas": replicas}});
        if message {
            o["status"] = json!({"message": "audited"});
        }
        o
    };
    for _ in 0..20 {
        rv += 1;
        let name = format!("foo-{next}");
        next += 1;
        writeln!(out, "{}", json!({"type": "ADDED", "object": foo(&name, 1, false, rv)}))?;
        live.push((name, 1, false));
    }
    for _ in 0..events {
        rv += 1;
        let pick = rng.random_range(0..10);
        if live.is_empty() || pick < 3 {
            let name = format!("foo-{next}");
            next += 1;
            writeln!(out, "{}", json!({"type": "ADDED", "object": foo(&name, 1, false, rv)}))?;
            live.push((name, 1, false));
        } else if pick < 7 {
            let i = rng.random_range(0..live.len());
            live[i].1 = rng.random_range(1..5);
            let (n, r, m) = &live[i];
            writeln!(out, "{}", json!({"type": "MODIFIED", "object": foo(n, *r, *m, rv)}))?;
        } else if pick < 8 {
            let i = rng.random_range(0..live.len());
            live[i].2 = true;
            let (n, r, m) = &live[i];
            writeln!(out, "{}", json!({"type": "MODIFIED", "object": foo(n, *r, *m, rv)}))?;
        } else {
            let i = rng.random_range(0..live.len());
            let (n, r, m) = live.swap_remove(i);
            writeln!(out, "{}", json!({"type": "DELETED", "object": foo(&n, r, m, rv)}))?;
        }
    }
    out.flush()
}

#[allow(clippy::print_stdout)]
pub(crate) fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let events: usize = args.next().map_or(Ok(10_000), |s| s.parse())?;
    let schedules: u64 = args.next().map_or(Ok(200), |s| s.parse())?;
    let threads: Option<usize> = args.next().map(|s| s.parse()).transpose()?;
    let list = args.next().as_deref() == Some("list");
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("foos.jsonl");
    generate(&path, events, 42)?;
    let mut h = sample::harness(sample::Variant::Correct, path.to_str().ok_or("path")?)?;
    if let Some(n) = threads {
        h = h.threads(n);
    }
    if let Some(secs) = std::env::var_os("TESTING_SPEED_BUDGET") {
        let secs: f64 = secs.to_str().ok_or("TESTING_SPEED_BUDGET")?.parse()?;
        h = h.time_budget(std::time::Duration::try_from_secs_f64(secs)?);
    }
    if list {
        h = h.invariant("at most one Deployment per Foo (listed)", |w| {
            let deployments = w.list("deployments.apps");
            let mut seen = std::collections::HashSet::new();
            for d in &deployments {
                let labels = &d["metadata"]["labels"];
                if let Some(foo) = labels[sample::LABEL].as_str() {
                    if !seen.insert((d["metadata"]["namespace"].as_str(), foo)) {
                        return Err(format!("two Deployments of Foo {foo}"));
                    }
                }
            }
            Ok(())
        });
    }
    let start = Instant::now();
    let result = h.check(schedules);
    let secs = start.elapsed().as_secs_f64();
    match result {
        Ok(report) => println!(
            "{events} events, {report}: {secs:.1} s, {:.2} schedules/s, {:.0} steps/s",
            report.schedules as f64 / secs,
            report.steps as f64 / secs
        ),
        Err(e) => println!("{events} events: {e}\n({secs:.1} s)"),
    }
    Ok(())
}
