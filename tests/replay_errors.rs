//! Bad recordings: a malformed line is an error naming its line (or is skipped and counted when
//! asked), a truncated last line is tolerated, an unknown event type is an error with its line,
//! and resourceVersions going backwards are an error or a counted warning.

use std::path::{Path, PathBuf};

use durable_informer::replay::{
    replay_into, MalformedPolicy, RecordingReader, ReplayError, ReplayOptions, ReplaySource, RvRegressionPolicy,
};
use durable_informer::store::{DurableStore, StoreConfig};

fn cm(kind: &str, name: &str, rv: u64) -> String {
    format!(
        r#"{{"type":"{kind}","object":{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"{name}","namespace":"ns","resourceVersion":"{rv}"}},"data":{{"v":"{rv}"}}}}}}"#
    )
}

fn write(dir: &Path, lines: &[String], trailing_newline: bool) -> PathBuf {
    let path = dir.join("rec.jsonl");
    let mut text = lines.join("\n");
    if trailing_newline {
        text.push('\n');
    }
    std::fs::write(&path, text).unwrap();
    path
}

async fn replay(
    dir: &Path,
    path: &Path,
    options: ReplayOptions,
) -> Result<durable_informer::replay::ReplayReport, ReplayError> {
    let db = DurableStore::open(StoreConfig::new(dir.join("db.redb")).durable(false)).unwrap();
    let source = ReplaySource::open(path, options)?;
    replay_into(&db, source).await
}

fn good() -> Vec<String> {
    vec![
        cm("ADDED", "a", 10),
        cm("ADDED", "b", 11),
        cm("MODIFIED", "a", 12),
        cm("DELETED", "b", 13),
        cm("ADDED", "c", 14),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_line_is_an_error_naming_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let mut lines = good();
    lines.insert(3, r#"{"type":"MODIFIED","object":{"metadata":{"name":"a""#.into());
    let path = write(dir.path(), &lines, true);
    let err = replay(dir.path(), &path, ReplayOptions::default()).await.unwrap_err();
    match &err {
        ReplayError::Malformed { line, .. } => assert_eq!(*line, 4),
        other => panic!("{other}"),
    }
    assert!(
        err.to_string().contains("rec.jsonl:4: malformed recording line"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_lines_are_skipped_and_counted_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let mut lines = good();
    lines.insert(3, "garbage".into());
    lines.insert(1, r#"{"type":"ADDED","object":{"kind":"ConfigMap"}}"#.into());
    let path = write(dir.path(), &lines, true);
    let report = replay(
        dir.path(),
        &path,
        ReplayOptions::default().on_malformed(MalformedPolicy::Skip),
    )
    .await
    .unwrap();
    assert_eq!(report.skipped_malformed, 2);
    assert_eq!(report.last_rv.as_str(), "14");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_last_line_is_tolerated() {
    let dir = tempfile::tempdir().unwrap();
    let mut lines = good();
    let cut = cm("MODIFIED", "c", 15);
    lines.push(cut[..cut.len() / 2].to_owned());
    let path = write(dir.path(), &lines, false);
    let report = replay(dir.path(), &path, ReplayOptions::default()).await.unwrap();
    assert!(report.truncated_tail);
    assert_eq!(report.last_rv.as_str(), "14");
    assert_eq!(report.skipped_malformed, 0);

    // A complete last line without a newline is an ordinary line.
    let path = write(dir.path(), &good(), false);
    let mut reader = RecordingReader::open(&path).unwrap();
    assert_eq!(reader.by_ref().count(), 5);
    assert!(!reader.truncated_tail());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_event_type_is_an_error_with_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let mut lines = good();
    lines.insert(2, cm("SURPRISE", "a", 12));
    let path = write(dir.path(), &lines, true);
    // Even when malformed lines are skipped.
    let err = replay(
        dir.path(),
        &path,
        ReplayOptions::default().on_malformed(MalformedPolicy::Skip),
    )
    .await
    .unwrap_err();
    match err {
        ReplayError::UnknownEventType { line, kind, .. } => assert_eq!((line, kind.as_str()), (3, "SURPRISE")),
        other => panic!("{other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resource_versions_going_backwards_fail_or_warn_as_configured() {
    let dir = tempfile::tempdir().unwrap();
    let mut lines = good();
    lines.insert(4, cm("MODIFIED", "a", 9));
    let path = write(dir.path(), &lines, true);
    let err = replay(dir.path(), &path, ReplayOptions::default()).await.unwrap_err();
    match err {
        ReplayError::RvRegression {
            line, previous, found, ..
        } => {
            assert_eq!((line, previous.as_str(), found.as_str()), (5, "13", "9"));
        }
        other => panic!("{other}"),
    }
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), &lines, true);
    let report = replay(
        dir.path(),
        &path,
        ReplayOptions::default().on_rv_regression(RvRegressionPolicy::Warn),
    )
    .await
    .unwrap();
    assert_eq!(report.rv_regressions, 1);
    assert_eq!(report.last_rv.as_str(), "14");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_recording_needs_an_explicit_scope() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), &[], false);
    assert!(matches!(
        ReplaySource::open(&path, ReplayOptions::default()),
        Err(ReplayError::NoScope { .. })
    ));
    let scope = durable_informer::object::ScopeSpec::new("", "v1", "configmaps");
    let report = replay(dir.path(), &path, ReplayOptions::default().scope(scope))
        .await
        .unwrap();
    assert_eq!(report.events, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_stops_at_a_resource_version() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), &good(), true);
    let db = DurableStore::open(StoreConfig::new(dir.path().join("db.redb")).durable(false)).unwrap();
    let report = replay_into(
        &db,
        ReplaySource::open(&path, ReplayOptions::default().stop_at_rv("12")).unwrap(),
    )
    .await
    .unwrap();
    assert!(report.stopped_early);
    assert_eq!(report.last_rv.as_str(), "12");
    let (scope, _) = db.scopes().unwrap()[0].clone();
    let keys: Vec<String> = db
        .store(scope)
        .list_keys()
        .unwrap()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(keys, ["ns/a", "ns/b"]);
}

fn stamped(lines: &[String], step_ms: u64) -> Vec<String> {
    lines
        .iter()
        .enumerate()
        .map(|(i, l)| {
            format!(
                r#"{},"receivedAt":{}}}"#,
                &l[..l.len() - 1],
                1_000_000 + i as u64 * step_ms
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paced_replay_follows_the_receive_times_times_a_factor() {
    use durable_informer::replay::Speed;
    let dir = tempfile::tempdir().unwrap();
    // Five events 200 ms apart: 800 ms of recording, 200 ms at four times real speed.
    let path = write(dir.path(), &stamped(&good(), 200), true);
    let t = std::time::Instant::now();
    let report = replay(dir.path(), &path, ReplayOptions::default().speed(Speed::Factor(4.0)))
        .await
        .unwrap();
    let took = t.elapsed();
    assert_eq!(report.last_rv.as_str(), "14");
    // The initial ADDED run (two lines) is a snapshot and is not paced: 400 ms / 4.
    assert!(took >= std::time::Duration::from_millis(90), "{took:?}");
    assert!(took < std::time::Duration::from_secs(2), "{took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_stops_at_a_receive_time() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), &stamped(&good(), 200), true);
    // Lines are received at 1_000_000 + 200 * index: stop after the third (MODIFIED a, RV 12).
    let report = replay(dir.path(), &path, ReplayOptions::default().stop_at_ms(1_000_450))
        .await
        .unwrap();
    assert!(report.stopped_early);
    assert_eq!(report.last_rv.as_str(), "12");
}

/// A stop time inside the initial ADDED run: objects received after it are left out and the
/// replay stops there (before, the time was checked only after the initial run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_time_inside_the_initial_run_leaves_out_the_objects_received_after_it() {
    let dir = tempfile::tempdir().unwrap();
    // a (RV 10) at 1_000_000, b (RV 11) at 1_000_200: both in the initial run.
    let path = write(dir.path(), &stamped(&good(), 200), true);
    let db = DurableStore::open(StoreConfig::new(dir.path().join("db.redb")).durable(false)).unwrap();
    let source = ReplaySource::open(&path, ReplayOptions::default().stop_at_ms(1_000_100)).unwrap();
    let report = replay_into(&db, source).await.unwrap();
    assert!(report.stopped_early);
    assert_eq!(report.initial_objects, 1);
    assert_eq!(report.events, 0);
    assert_eq!(report.last_rv.as_str(), "10");
    let (scope, _) = db.scopes().unwrap()[0].clone();
    let names: Vec<String> = db
        .store(scope)
        .list()
        .unwrap()
        .into_iter()
        .map(|o| o.key.to_string())
        .collect();
    assert_eq!(names, ["ns/a"]);
}

/// `durable-informer replay --until-time <ms>` passes the stop time through.
#[cfg(feature = "cli")]
#[test]
fn the_cli_replay_stops_at_until_time() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), &stamped(&good(), 200), true);
    let run = |until: &str, db: &str| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_durable-informer"))
            .arg("replay")
            .arg(&path)
            .args(["-o", "json", "--until-time", until, "--db"])
            .arg(dir.path().join(db))
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    // In the initial run, then after the third line (MODIFIED a, RV 12).
    let early = run("1000100", "a.redb");
    assert_eq!(early["lastResourceVersion"], "10");
    assert_eq!(early["stoppedEarly"], true);
    let later = run("1000450", "b.redb");
    assert_eq!(later["lastResourceVersion"], "12");
    assert_eq!(later["events"], 1);
}

/// The events of a recording, or the error and whether the reader flagged a cut.
fn read_all(path: &Path) -> (Result<Vec<(u64, String)>, ReplayError>, bool) {
    let mut reader = match RecordingReader::open(path) {
        Ok(r) => r,
        Err(e) => return (Err(e), false),
    };
    let mut events = Vec::new();
    loop {
        match reader.next_event() {
            Ok(Some(ev)) => events.push((ev.line, format!("{:?} {:?}", ev.event, ev.received_at_ms))),
            Ok(None) => return (Ok(events), reader.truncated_tail()),
            Err(e) => return (Err(e), reader.truncated_tail()),
        }
    }
}

/// A bit flipped anywhere in a compressed recording (as export and the recorder write it,
/// with a checksum) is an error naming the file and the line (or the reader flags a cut), never
/// a panic and never a silently different event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bit_flipped_compressed_recording_is_an_error_with_its_position() {
    let dir = tempfile::tempdir().unwrap();
    let mut lines = Vec::new();
    for i in 0..400u64 {
        lines.push(cm(
            if i < 100 { "ADDED" } else { "MODIFIED" },
            &format!("o{}", i % 100),
            10 + i,
        ));
    }
    let plain = write(dir.path(), &lines, true);
    let db = DurableStore::open(StoreConfig::new(dir.path().join("db.redb")).durable(false)).unwrap();
    replay_into(&db, ReplaySource::open(&plain, ReplayOptions::default()).unwrap())
        .await
        .unwrap();
    let zst = dir.path().join("export.jsonl.zst");
    let (scope, _) = db.scopes().unwrap()[0].clone();
    durable_informer::replay::export_log_file(&db, Some(scope), &zst).unwrap();
    let whole = std::fs::read(&zst).unwrap();
    let (truth, cut) = read_all(&zst);
    let truth = truth.unwrap();
    assert!(!cut);
    assert_eq!(truth.len(), 400);

    let bad = dir.path().join("flipped.jsonl.zst");
    let mut errors = 0;
    let step = (whole.len() / 150).max(1);
    for at in (0..whole.len()).step_by(step).chain([whole.len() - 1]) {
        let mut bytes = whole.clone();
        bytes[at] ^= 0x10;
        std::fs::write(&bad, &bytes).unwrap();
        match read_all(&bad) {
            (Ok(events), cut) => assert!(
                cut || events == truth,
                "byte {at} flipped: {} events read without an error",
                events.len()
            ),
            (Err(e), _) => {
                errors += 1;
                let text = e.to_string();
                assert!(text.starts_with(&bad.display().to_string()), "byte {at}: {text}");
                match &e {
                    ReplayError::Io { line, .. } => {
                        assert!(line.is_some(), "byte {at}: {text}");
                        assert!(text.contains("corrupt compressed recording"), "byte {at}: {text}");
                    }
                    ReplayError::Malformed { .. } | ReplayError::UnknownEventType { .. } => {}
                    other => panic!("byte {at}: unexpected error {other:?}"),
                }
            }
        }
    }
    assert!(errors > 100, "only {errors} flips detected");

    // Through a replay: the error reaches the caller.
    let mut bytes = whole.clone();
    bytes[whole.len() / 2] ^= 0x10;
    std::fs::write(&bad, &bytes).unwrap();
    let db2 = DurableStore::open(StoreConfig::new(dir.path().join("db2.redb")).durable(false)).unwrap();
    // (A small file decodes in one read, so the checksum can fail while opening.)
    let err = match ReplaySource::open(&bad, ReplayOptions::default()) {
        Err(e) => e,
        Ok(source) => replay_into(&db2, source).await.unwrap_err(),
    };
    assert!(err.to_string().contains("flipped.jsonl.zst:"), "{err}");
}
