//! `record`, `replay`, `export`: recordings of watch traffic.

use std::path::{Path, PathBuf};
use std::time::Duration;

use durable_informer::replay::{
    export_log_file, replay_into, MalformedPolicy, Recorder, RecorderConfig, ReplayOptions, ReplaySource, Speed,
};
use durable_informer::store::{DurableStore, ScopeSpec, StoreConfig};
use serde_json::json;

use super::db::{find_scope, open, split_resource};
use super::live::{client, resolve, scoped_source, signals};
use super::{CliError, CliResult, ClusterArgs, Output, ScopeArgs};

fn replay_err(e: impl std::fmt::Display) -> CliError {
    CliError::runtime(e)
}

pub async fn record(
    scope: ScopeArgs,
    cluster: ClusterArgs,
    out: PathBuf,
    rotate: Option<u64>,
    duration: Option<u64>,
) -> CliResult {
    let stop_signal = signals();
    let (client, server) = client(&cluster).await?;
    let (ar, namespaced) = resolve(&client, &server, &scope.resource).await?;
    let source = scoped_source(client, &server, ar, namespaced, &scope);
    let mut config = RecorderConfig::new(&out);
    if let Some(b) = rotate {
        config = config.rotate_bytes(b);
    }
    let recorder = Recorder::new(source, config);
    let progress = recorder.progress();
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(recorder.run(stop));
    let limit = async {
        match duration {
            Some(s) => tokio::time::sleep(Duration::from_secs(s)).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        () = stop_signal => {}
        () = limit => {}
    }
    let _ = stop_tx.send(true);
    let report = task.await.map_err(CliError::runtime)?.map_err(replay_err)?;
    let _ = progress;
    errln!(
        "recorded {} lines ({} bytes) up to resourceVersion {} into {}",
        report.lines,
        report.bytes,
        report.last_rv,
        report
            .files
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(())
}

#[allow(clippy::too_many_arguments)] // one per command-line option
pub async fn replay(
    files: Vec<PathBuf>,
    db: PathBuf,
    resource: Option<String>,
    speed: &str,
    until_rv: Option<String>,
    skip_malformed: bool,
    output: Output,
) -> CliResult {
    let mut options = ReplayOptions::default();
    options = options.speed(match speed {
        "max" => Speed::Max,
        f => Speed::Factor(
            f.parse::<f64>()
                .ok()
                .filter(|x| *x > 0.0)
                .ok_or_else(|| CliError::new(2, format!("--speed takes `max` or a positive factor, got {f:?}")))?,
        ),
    });
    if let Some(rv) = until_rv {
        options = options.stop_at_rv(rv);
    }
    if skip_malformed {
        options = options.on_malformed(MalformedPolicy::Skip);
    }
    if let Some(r) = &resource {
        let (plural, group) = split_resource(r);
        // The version is taken from the objects; the scope needs one, "v1" is the usual.
        options = options.scope(ScopeSpec::new(&group, "v1", &plural));
    }
    let source = ReplaySource::open_all(files, options).map_err(replay_err)?;
    let store = tokio::task::spawn_blocking(move || DurableStore::open(StoreConfig::new(db)))
        .await
        .map_err(CliError::runtime)??;
    let report = replay_into(&store, source).await.map_err(replay_err)?;
    match output {
        Output::Json => outln!(
            "{}",
            json!({
                "initialObjects": report.initial_objects,
                "events": report.events,
                "lastResourceVersion": report.last_rv.0,
                "skippedMalformed": report.skipped_malformed,
                "rvRegressions": report.rv_regressions,
                "truncatedTail": report.truncated_tail,
                "stoppedEarly": report.stopped_early,
            })
        )?,
        _ => {
            outln!(
                "replayed {} initial objects and {} events up to resourceVersion {}",
                report.initial_objects,
                report.events,
                report.last_rv
            )?;
            if report.skipped_malformed > 0 {
                outln!("skipped {} malformed lines", report.skipped_malformed)?;
            }
            if report.truncated_tail {
                outln!("warning: the last line was truncated (a crash while recording?) and was dropped")?;
            }
        }
    }
    tokio::task::spawn_blocking(move || store.close())
        .await
        .map_err(CliError::runtime)??;
    Ok(())
}

pub fn export(db: &Path, resource: Option<&str>, out: &Path) -> CliResult {
    let store = open(db)?;
    let scope = match resource {
        Some(r) => Some(find_scope(&store, r, None)?.0),
        None => None,
    };
    let report = export_log_file(&store, scope, out).map_err(replay_err)?;
    errln!("exported {:?} to {}", report, out.display());
    Ok(())
}
