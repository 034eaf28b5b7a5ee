//! `record`, `replay`, `export`: recordings of watch traffic.

use std::path::{Path, PathBuf};
use std::time::Duration;

use durable_informer::object::ScopeSpec;
use durable_informer::replay::{
    export_log_file, replay_into, scope_of, MalformedPolicy, Recorder, RecorderConfig, RecordingReader, ReplayOptions,
    ReplaySource, Speed,
};
use durable_informer::source::WatchEvent;
use durable_informer::store::{DurableStore, StoreConfig};
use serde_json::json;

use super::db::{find_scope, open, split_resource};
use super::live::{client, resolve, scoped_source, signals};
use super::output::{print_data, Format};
use super::progress::spinner;
use super::{CliError, CliResult, ClusterArgs, ScopeArgs};

fn replay_err(e: impl std::fmt::Display) -> CliError {
    CliError::runtime(e)
}

pub async fn record(
    scope: ScopeArgs,
    cluster: ClusterArgs,
    out: PathBuf,
    rotate: Option<u64>,
    duration: Option<u64>,
    output: &Format,
) -> CliResult {
    let stop_signal = signals();
    let (client, server, context_ns) = client(&cluster).await?;
    let (ar, namespaced) = resolve(&client, &server, scope.resource()).await?;
    let source = scoped_source(client, &server, ar, namespaced, &scope, &context_ns);
    let mut config = RecorderConfig::new(&out);
    if let Some(b) = rotate {
        config = config.rotate_bytes(b);
    }
    let recorder = Recorder::new(source, config);
    let mut progress = recorder.progress();
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(recorder.run(stop));
    let pb = spinner(&format!("recording into {}", out.display()));
    let shown = pb.clone();
    let ticker = tokio::spawn(async move {
        while progress.changed().await.is_ok() {
            let p = progress.borrow_and_update().clone();
            shown.set_message(format!(
                "recording: {} lines, {} bytes, resourceVersion {}",
                p.lines, p.bytes, p.last_rv
            ));
        }
    });
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
    let report = task.await.map_err(CliError::runtime)?.map_err(replay_err);
    ticker.abort();
    pb.finish_and_clear();
    let report = report?;
    let files: Vec<String> = report.files.iter().map(|p| p.display().to_string()).collect();
    if *output != Format::Table {
        let v = json!({
            "files": files,
            "lines": report.lines,
            "bytes": report.bytes,
            "lastResourceVersion": report.last_rv.0,
            "watches": report.watches,
        });
        return print_data(output, &v, false);
    }
    outln!(
        "recorded {} lines ({} bytes) up to resourceVersion {} into {}",
        report.lines,
        report.bytes,
        report.last_rv,
        files.join(", ")
    )
}

#[allow(clippy::too_many_arguments)] // one per command-line option
pub async fn replay(
    files: Vec<PathBuf>,
    db: PathBuf,
    resource: Option<String>,
    speed: &str,
    until_rv: Option<String>,
    until_time: Option<u64>,
    skip_malformed: bool,
    output: &Format,
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
    if let Some(ms) = until_time {
        options = options.stop_at_ms(ms);
    }
    if skip_malformed {
        options = options.on_malformed(MalformedPolicy::Skip);
    }
    if let Some(r) = &resource {
        options = options.scope(replay_scope(&files, r, skip_malformed)?);
    }
    let source = ReplaySource::open_all(files, options).map_err(replay_err)?;
    let store = tokio::task::spawn_blocking(move || DurableStore::open(StoreConfig::new(db)))
        .await
        .map_err(CliError::runtime)??;
    // Progress: log entries committed so far.
    let pb = spinner("replaying");
    let mut committed = store.writer().committed();
    let start = *committed.borrow();
    let shown = pb.clone();
    let ticker = tokio::spawn(async move {
        while committed.changed().await.is_ok() {
            let now = *committed.borrow_and_update();
            shown.set_message(format!(
                "replaying: {} log entries committed",
                now.0.saturating_sub(start.0)
            ));
        }
    });
    let report = replay_into(&store, source).await.map_err(replay_err);
    ticker.abort();
    pb.finish_and_clear();
    let report = report?;
    match output {
        Format::Json | Format::Yaml => {
            let v = json!({
                "initialObjects": report.initial_objects,
                "events": report.events,
                "lastResourceVersion": report.last_rv.0,
                "skippedMalformed": report.skipped_malformed,
                "rvRegressions": report.rv_regressions,
                "truncatedTail": report.truncated_tail,
                "stoppedEarly": report.stopped_early,
            });
            print_data(output, &v, false)?;
        }
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

/// The type of the first object in the recording: (apiVersion, kind).
fn recorded_type(files: &[PathBuf], skip_malformed: bool) -> CliResult<Option<(String, String)>> {
    // The first object normally is on the first line; a bounded look keeps a huge file cheap.
    const LOOK: usize = 1000;
    let mut reader = RecordingReader::open_all(files.to_vec()).map_err(replay_err)?;
    if skip_malformed {
        reader = reader.on_malformed(MalformedPolicy::Skip);
    }
    for _ in 0..LOOK {
        let Some(ev) = reader.next_event().map_err(replay_err)? else {
            break;
        };
        let (WatchEvent::Added(o) | WatchEvent::Modified(o) | WatchEvent::Deleted(o)) = &ev.event else {
            continue;
        };
        let v: serde_json::Value = serde_json::from_slice(&o.bytes).unwrap_or_default();
        if let (Some(av), Some(kind)) = (v["apiVersion"].as_str(), v["kind"].as_str()) {
            return Ok(Some((av.to_owned(), kind.to_owned())));
        }
    }
    Ok(None)
}

/// The scope for `replay -r R`: the version comes from the objects' apiVersion (`v1` when they
/// carry none), and R must name the objects' resource.
fn replay_scope(files: &[PathBuf], resource: &str, skip_malformed: bool) -> CliResult<ScopeSpec> {
    let (plural, group) = split_resource(resource);
    let Some((api_version, kind)) = recorded_type(files, skip_malformed)? else {
        return Ok(ScopeSpec::new(&group, "v1", &plural));
    };
    let found = scope_of(&api_version, &kind);
    // A custom resource (its group has a dot) may declare a plural the default rules miss.
    let plural_ok = found.resource == plural || (group.contains('.') && found.group == group);
    if found.group != group || !plural_ok {
        let named = if found.group.is_empty() {
            found.resource.clone()
        } else {
            format!("{}.{}", found.resource, found.group)
        };
        return Err(CliError::new(
            2,
            format!(
                "-r {resource}: the recording holds {kind} objects ({api_version}); use -r {named} or leave -r out"
            ),
        ));
    }
    Ok(ScopeSpec::new(&group, &found.version, &plural))
}

pub fn export(db: &Path, resource: Option<&str>, out: &Path, output: &Format) -> CliResult {
    let store = open(db)?;
    let scope = match resource {
        Some(r) => Some(find_scope(&store, r, None)?.0),
        None => None,
    };
    let pb = spinner(&format!("exporting to {}", out.display()));
    let report = export_log_file(&store, scope, out).map_err(replay_err);
    pb.finish_and_clear();
    let report = report?;
    if *output != Format::Table {
        let v = json!({
            "file": out.display().to_string(),
            "lines": report.lines,
            "syncsLeftOut": report.syncs,
            "unknownFinalState": report.unknown_final_state,
            "lastSeq": report.last_seq.0,
        });
        return print_data(output, &v, false);
    }
    outln!(
        "exported {} lines (the log up to seq {}) to {}",
        report.lines,
        report.last_seq.0,
        out.display()
    )?;
    if report.syncs > 0 {
        outln!("left out {} resync entries (they change nothing)", report.syncs)?;
    }
    if report.unknown_final_state > 0 {
        outln!(
            "{} deletes found by a relist were written with their last known state",
            report.unknown_final_state
        )?;
    }
    Ok(())
}
