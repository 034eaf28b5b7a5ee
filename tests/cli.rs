//! The `durable-informer` binary end to end against the simulated cluster: every subcommand,
//! and the error cases with their exit codes.

use std::process::{Command, Stdio};
use std::time::Duration;

#[path = "common/cli_bin.rs"]
mod cli_bin;

use assert_cmd::prelude::*;
use cli_bin::bin;
use durable_informer::sim::{Sim, SimConfig};
use nix::sys::signal::Signal;
use predicates::prelude::*;
use serde_json::json;

fn sim() -> Sim {
    let sim = Sim::start(SimConfig::default().bookmark_interval(Duration::from_millis(500))).unwrap();
    for (ns, name, app) in [
        ("default", "web-1", "web"),
        ("default", "web-2", "web"),
        ("other", "db-1", "db"),
    ] {
        sim.create(
            "configmaps",
            Some(ns),
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": ns, "labels": {"app": app}}, "data": {"k": "v"}}),
        )
        .unwrap();
    }
    sim
}

/// Runs `watch` for a while, then SIGTERM; returns its stdout. It must exit 0.
fn watch_for(sim: &Sim, db: &std::path::Path, extra: &[&str], while_running: impl FnOnce()) -> String {
    let mut cmd = bin();
    cmd.args(["watch", "-r", "configmaps", "-A", "--server", &sim.url(), "--db"])
        .arg(db)
        .args(extra);
    let (stdout, _) = run_then_signal(cmd, Signal::SIGTERM, while_running);
    stdout
}

/// Runs a long-running command for a while, then sends `signal`; it must exit 0. Returns
/// (stdout, stderr).
fn run_then_signal(mut cmd: Command, signal: Signal, while_running: impl FnOnce()) -> (String, String) {
    let child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    while_running();
    std::thread::sleep(Duration::from_millis(1000));
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), signal).unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "exited with {:?}: {stderr}", out.status);
    assert!(!stderr.contains("panicked"), "{stderr}");
    (String::from_utf8(out.stdout).unwrap(), stderr)
}

/// Runs a failing command: exit `code`, and stderr is one line containing `what`.
fn fails_with_one_line(cmd: &mut Command, code: i32, what: &str) -> String {
    let out = cmd.stdin(Stdio::null()).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(code), "{cmd:?}: {stderr}");
    assert!(stderr.contains(what), "{cmd:?}: {stderr:?} lacks {what:?}");
    assert_eq!(stderr.lines().count(), 1, "{cmd:?}: not one line: {stderr:?}");
    assert!(stderr.starts_with("error: "), "{stderr:?}");
    assert!(!stderr.contains('\x1b'), "ANSI escapes off a terminal: {stderr:?}");
    stderr
}

/// A stdout whose reader is already gone: every write fails with EPIPE.
fn closed_stdout() -> Stdio {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    Stdio::from(writer)
}

/// Waits for `child` to exit, killing it and failing after a generous deadline (a hang guard,
/// not a timing assertion).
fn exits_within(mut child: std::process::Child, what: &str) -> (std::process::ExitStatus, String) {
    use std::io::Read;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut stderr = String::new();
            if let Some(mut e) = child.stderr.take() {
                e.read_to_string(&mut stderr).unwrap();
            }
            return (status, stderr);
        }
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            panic!("{what} kept running after its stdout was closed");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn demo_small_runs_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("demo.redb");
    let out = bin()
        .args(["demo", "--size", "small", "-o", "json", "--db"])
        .arg(&db)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // The cold start listed everything; the restart listed at most the one-object RV probe and
    // delivered the changes made while down, deletes included.
    assert!(
        report["coldStart"]["server"]["listedObjects"].as_u64().unwrap()
            + report["coldStart"]["server"]["watchEvents"].as_u64().unwrap()
            >= 1000,
        "{report}"
    );
    let restart = &report["restart"];
    assert_eq!(restart["restored"], true, "{report}");
    assert!(restart["server"]["listedObjects"].as_u64().unwrap() <= 1, "{report}");
    let delivered = &restart["delivered"];
    assert!(delivered["deletes"].as_u64().unwrap() > 0, "{report}");
    assert_eq!(
        delivered["adds"].as_u64().unwrap()
            + delivered["updates"].as_u64().unwrap()
            + delivered["deletes"].as_u64().unwrap(),
        restart["missed"].as_u64().unwrap(),
        "{report}"
    );
    // The 410 relist reported only the differences, fewer than the objects.
    let relist = &report["relist"];
    let differences = relist["differences"].as_u64().unwrap();
    assert!(
        differences > 0 && differences < relist["objects"].as_u64().unwrap(),
        "{report}"
    );
    assert_eq!(report["storeEqualsServer"], true, "{report}");

    // The demo's database has the label index: `list --index` reads it.
    let pods = bin()
        .args(["list", "-r", "pods", "-o", "json", "--db"])
        .arg(&db)
        .output()
        .unwrap();
    let pods: serde_json::Value = serde_json::from_slice(&pods.stdout).unwrap();
    let pods = pods["items"].as_array().unwrap();
    let app = pods[0]["metadata"]["labels"]["app"].as_str().unwrap();
    let want = pods.iter().filter(|p| p["metadata"]["labels"]["app"] == app).count();
    assert!(want > 0 && want < pods.len());
    let table = bin()
        .args([
            "list",
            "-r",
            "pods",
            "-o",
            "table",
            "--index",
            &format!("labels=app={app}"),
            "--db",
        ])
        .arg(&db)
        .output()
        .unwrap();
    assert!(table.status.success());
    let table = String::from_utf8(table.stdout).unwrap();
    assert!(table.starts_with("NAMESPACE"), "{table}");
    assert_eq!(table.lines().count(), want + 1, "{table}");
}

/// `demo --keep` leaves its temporary database closed and readable by the other commands;
/// without it the temporary directory is gone when the demo exits.
#[test]
fn demo_keep_leaves_its_database_for_the_cli_and_without_it_nothing_is_left() {
    let tmp = tempfile::tempdir().unwrap();
    let out = bin()
        .env("TMPDIR", tmp.path())
        .args(["demo", "--size", "small", "--keep", "-o", "json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["database"]["kept"], true, "{report}");
    let db = std::path::PathBuf::from(report["database"]["path"].as_str().unwrap());
    assert!(db.starts_with(tmp.path()) && db.is_file(), "{}", db.display());
    let dir_mode = std::fs::metadata(db.parent().unwrap()).unwrap().permissions();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&dir_mode) & 0o777,
        0o700,
        "the kept directory is private"
    );
    // Every Pod the server held at the end, read back offline.
    let names = bin()
        .args(["get", "pods", "-o", "name", "--db"])
        .arg(&db)
        .output()
        .unwrap();
    assert!(names.status.success(), "{}", String::from_utf8_lossy(&names.stderr));
    let names = String::from_utf8(names.stdout).unwrap();
    assert_eq!(
        names.lines().count() as u64,
        report["relist"]["objects"].as_u64().unwrap(),
        "{names}"
    );
    assert!(names.lines().all(|l| l.starts_with("pod/")), "{names}");
    let stats = bin().args(["stats", "-o", "json", "--db"]).arg(&db).output().unwrap();
    assert!(stats.status.success(), "{}", String::from_utf8_lossy(&stats.stderr));

    // Without --keep: the table names the database, which is gone afterwards with its folder.
    let tmp2 = tempfile::tempdir().unwrap();
    let out = bin()
        .env("TMPDIR", tmp2.path())
        .args(["demo", "--size", "small"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with("database: "))
        .expect("the database line");
    let path = std::path::Path::new(line.trim_start_matches("database: "));
    assert!(path.starts_with(tmp2.path()), "{text}");
    assert!(!path.exists(), "{} was left behind", path.display());
    assert!(!text.contains("database kept"), "{text}");
    assert_eq!(
        std::fs::read_dir(tmp2.path()).unwrap().count(),
        0,
        "nothing left in TMPDIR"
    );
}

#[test]
fn watch_prints_events_resumes_on_restart_and_the_database_can_be_inspected() {
    let sim = sim();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("cm.redb");
    let out = watch_for(&sim, &db, &["-o", "json"], || {});
    let lines: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 3, "{out}");
    assert!(lines.iter().all(|l| l["type"] == "ADDED"));

    // Restart: only what changed while it was down, and no full LIST.
    sim.delete("configmaps", Some("default"), "web-2").unwrap();
    let before = sim.counters();
    let out = watch_for(&sim, &db, &["-o", "json"], || {
        sim.create(
            "configmaps",
            Some("other"),
            json!({"metadata": {"name": "late", "namespace": "other"}}),
        )
        .unwrap();
    });
    let after = sim.counters();
    let types: Vec<String> = out
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["type"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(types, ["DELETED", "ADDED"], "{out}");
    assert!(
        after.list_objects - before.list_objects <= 1,
        "restart made a full LIST"
    );

    // Offline inspection.
    bin()
        .args(["get", "--db"])
        .arg(&db)
        .args(["-r", "configmaps", "default/web-1"])
        .assert()
        .success()
        .stdout(predicate::str::contains("\"name\": \"web-1\""));
    bin()
        .args(["get", "-o", "yaml", "--db"])
        .arg(&db)
        .args(["-r", "configmaps", "default/web-1"])
        .assert()
        .success()
        .stdout(predicate::str::contains("  name: web-1\n"));
    let history = bin()
        .args(["history", "-o", "json", "--db"])
        .arg(&db)
        .args(["-r", "configmaps", "default/web-2"])
        .output()
        .unwrap();
    let types: Vec<String> = String::from_utf8(history.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["type"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(types, ["ADDED", "DELETED"]);
    let list = bin()
        .args(["list", "--db"])
        .arg(&db)
        .args(["-r", "configmaps", "-l", "app=web", "-o", "json"])
        .output()
        .unwrap();
    let list: serde_json::Value = serde_json::from_slice(&list.stdout).unwrap();
    assert_eq!(list["kind"], "List");
    assert_eq!(list["items"].as_array().unwrap().len(), 1);
    bin()
        .args(["list", "--db"])
        .arg(&db)
        .args(["-r", "configmaps", "-n", "other", "-o", "wide"])
        .assert()
        .success()
        .stdout(
            predicate::str::contains("late")
                .and(predicate::str::contains("db-1"))
                .and(predicate::str::contains("web-1").not()),
        );
    bin()
        .args(["list", "--db"])
        .arg(&db)
        .args(["-r", "configmaps", "-o", "yaml"])
        .assert()
        .success()
        .stdout(predicate::str::contains("kind: List"));
    bin()
        .args(["history", "--db"])
        .arg(&db)
        .args(["-r", "configmaps", "default/web-2"])
        .assert()
        .success()
        .stdout(predicate::str::contains("Added").and(predicate::str::contains("Deleted")));
    bin()
        .args(["stats", "--db"])
        .arg(&db)
        .assert()
        .success()
        .stdout(predicate::str::contains("configmaps"));
    let stats = bin().args(["stats", "-o", "json", "--db"]).arg(&db).output().unwrap();
    let stats: serde_json::Value = serde_json::from_slice(&stats.stdout).unwrap();
    assert_eq!(stats["scopes"][0]["objects"], 3);
    assert_eq!(stats["scopes"][0]["relists"], 0, "{stats}");

    // The server compacts its history while the watch is down: the resume gets 410 and relists
    // once; stats says when and why.
    sim.create(
        "configmaps",
        Some("default"),
        json!({"metadata": {"name": "after-compaction", "namespace": "default"}}),
    )
    .unwrap();
    sim.compact();
    let out = watch_for(&sim, &db, &["-o", "json"], || {});
    assert!(out.contains("after-compaction"), "{out}");
    let stats = bin().args(["stats", "-o", "json", "--db"]).arg(&db).output().unwrap();
    let stats: serde_json::Value = serde_json::from_slice(&stats.stdout).unwrap();
    let scope = &stats["scopes"][0];
    assert_eq!(scope["relists"], 1, "{stats}");
    assert!(scope["lastRelistReason"].as_str().unwrap().contains("410"), "{stats}");
    assert!(scope["lastRelistAtMs"].as_u64().unwrap() > 0, "{stats}");
    let table = bin().args(["stats", "--db"]).arg(&db).output().unwrap();
    let table = String::from_utf8(table.stdout).unwrap();
    let at = scope["lastRelistAt"].as_str().unwrap();
    assert!(table.contains("LAST-RELIST") && table.contains(at), "{table}");
    bin()
        .args(["check", "--db"])
        .arg(&db)
        .assert()
        .success()
        .stdout(predicate::str::contains("ok"));
    let compact = bin()
        .args(["compact", "--keep", "1", "-o", "json", "--db"])
        .arg(&db)
        .output()
        .unwrap();
    assert!(compact.status.success());
    let compact: serde_json::Value = serde_json::from_slice(&compact.stdout).unwrap();
    assert!(compact["removedEntries"].as_u64().unwrap() > 0, "{compact}");
    bin()
        .args(["compact", "--db"])
        .arg(&db)
        .assert()
        .success()
        .stdout(predicate::str::contains("removed 0 entries"));
    bin().args(["check", "--db"]).arg(&db).assert().success();
}

#[test]
fn watch_scope_flags_kubeconfig_context_table_output_and_sigint() {
    let sim = sim();
    sim.create(
        "configmaps",
        Some("default"),
        json!({"metadata": {"name": "web-unlabeled", "namespace": "default"}}),
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    sim.write_kubeconfig(&kubeconfig).unwrap();
    let mut cmd = bin();
    cmd.args(["watch", "-r", "configmaps", "-n", "default", "-l", "app=web"])
        .args(["--field-selector", "metadata.name!=web-2", "-o", "table"])
        .args(["--context", "sim", "--kubeconfig"])
        .arg(&kubeconfig)
        .arg("--db")
        .arg(dir.path().join("w.redb"));
    let (stdout, _) = run_then_signal(cmd, Signal::SIGINT, || {
        sim.create(
            "configmaps",
            Some("default"),
            json!({"metadata": {"name": "web-3", "namespace": "default", "labels": {"app": "web"}}}),
        )
        .unwrap();
    });
    let mut lines = stdout.lines();
    assert!(lines.next().unwrap().starts_with("EVENT"), "{stdout}");
    let names: Vec<&str> = lines.map(|l| l.split_whitespace().nth(2).unwrap()).collect();
    assert_eq!(names, ["web-1", "web-3"], "{stdout}");
}

#[test]
fn errors_are_one_clear_line_with_documented_exit_codes() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("x.redb");
    // No kubeconfig at all.
    fails_with_one_line(bin().args(["watch", "-r", "pods", "--db"]).arg(&db), 1, "--kubeconfig");
    // Unreachable server (a port nothing listens on): kube's own error report is not shown.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    fails_with_one_line(
        bin()
            .args([
                "watch",
                "-r",
                "pods",
                "--server",
                &format!("http://127.0.0.1:{port}"),
                "--db",
            ])
            .arg(&db),
        1,
        "cannot reach the API server",
    );
    // Unknown resource.
    let sim = sim();
    fails_with_one_line(
        bin()
            .args(["watch", "-r", "widgets.example.com", "--server", &sim.url(), "--db"])
            .arg(&db),
        5,
        "unknown resource",
    );
    // Secrets need an explicit opt-in.
    fails_with_one_line(
        bin()
            .args(["watch", "-r", "secrets", "--server", &sim.url(), "--db"])
            .arg(&db),
        2,
        "DURABLE_INFORMER_ALLOW_SECRETS",
    );
    // A kubeconfig context that does not exist.
    let kubeconfig = dir.path().join("kubeconfig");
    sim.write_kubeconfig(&kubeconfig).unwrap();
    fails_with_one_line(
        bin()
            .args(["watch", "-r", "configmaps", "--context", "nope", "--kubeconfig"])
            .arg(&kubeconfig)
            .arg("--db")
            .arg(&db),
        1,
        "nope",
    );
    // A missing database for offline commands.
    fails_with_one_line(
        bin().args(["stats", "--db"]).arg(dir.path().join("missing.redb")),
        4,
        "no such database",
    );
    // A file that is not a database.
    let junk = dir.path().join("junk.redb");
    std::fs::write(&junk, "hello").unwrap();
    fails_with_one_line(
        bin().args(["stats", "--db"]).arg(&junk),
        4,
        "not a durable-informer database",
    );
    // A database written by a newer durable-informer.
    let newer = dir.path().join("newer.redb");
    {
        let db = redb::Database::create(&newer).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut meta = txn
                .open_table(redb::TableDefinition::<&str, &[u8]>::new("meta"))
                .unwrap();
            meta.insert(
                "schema_version",
                (durable_informer::store::SCHEMA_VERSION + 1).to_be_bytes().as_slice(),
            )
            .unwrap();
        }
        txn.commit().unwrap();
    }
    fails_with_one_line(bin().args(["stats", "--db"]).arg(&newer), 4, "upgrade durable-informer");
    // A database another process (this one) writes: a command that writes is refused (reading
    // beside a writer is tests/cli_live.rs's).
    let locked = dir.path().join("locked.redb");
    let held = durable_informer::store::DurableStore::open(durable_informer::store::StoreConfig::new(&locked)).unwrap();
    fails_with_one_line(bin().args(["compact", "--db"]).arg(&locked), 4, "locked");
    drop(held);
    // Another cluster's database: both identities are named.
    let other = dir.path().join("other.redb");
    {
        let db =
            durable_informer::store::DurableStore::open(durable_informer::store::StoreConfig::new(&other)).unwrap();
        db.writer()
            .cluster_identity_blocking("uid-from-elsewhere@https://elsewhere", false)
            .unwrap();
    }
    let msg = fails_with_one_line(
        bin()
            .args(["watch", "-r", "configmaps", "--server", &sim.url(), "--db"])
            .arg(&other),
        4,
        "uid-from-elsewhere@https://elsewhere",
    );
    assert!(msg.contains("127.0.0.1"), "the server's identity is named too: {msg}");
    assert!(msg.contains("--reset-on-cluster-change"), "{msg}");
    // A bad replay speed and a bad log filter are usage errors.
    fails_with_one_line(
        bin().args(["replay", "x.jsonl", "--speed", "fast", "--db"]).arg(&db),
        2,
        "--speed",
    );
    fails_with_one_line(bin().args(["--log", "x=[", "stats", "--db"]).arg(&db), 2, "--log");
    // Usage errors: clap's message with the usage, and no panic.
    let out = bin().args(["list"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with("error: ") && !stderr.contains("panicked"),
        "{stderr}"
    );
}

#[test]
fn a_closed_stdout_ends_watch_and_list_quietly() {
    let sim = sim();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("cm.redb");
    // `watch -o json | head -0`: the first event's write fails, the watch stops by itself.
    for output in ["json", "table"] {
        let child = bin()
            .args([
                "watch",
                "-r",
                "configmaps",
                "-o",
                output,
                "--server",
                &sim.url(),
                "--db",
            ])
            .arg(&db)
            .stdout(closed_stdout())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (status, stderr) = exits_within(child, "watch");
        assert!(status.success(), "{status:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    for args in [
        &["list", "-r", "configmaps"][..],
        &["list", "-r", "configmaps", "-o", "json"],
        &["stats"],
        &["history", "-r", "configmaps", "default/web-1"],
    ] {
        let child = bin()
            .args(args)
            .arg("--db")
            .arg(&db)
            .stdout(closed_stdout())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (status, stderr) = exits_within(child, args[0]);
        assert!(status.success(), "{args:?}: {status:?}: {stderr}");
        assert!(
            !stderr.contains("panicked") && !stderr.contains("error"),
            "{args:?}: {stderr}"
        );
    }
    // The database the interrupted watch filled is whole.
    bin().args(["check", "--db"]).arg(&db).assert().success();
}

#[test]
fn secrets_are_watched_with_the_opt_in_and_a_warning() {
    let sim = sim();
    sim.create(
        "secrets",
        Some("default"),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "token", "namespace": "default"}, "data": {"k": "dg=="}}),
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = bin();
    cmd.env("DURABLE_INFORMER_ALLOW_SECRETS", "1")
        .args(["watch", "-r", "secrets", "-o", "json", "--server", &sim.url(), "--db"])
        .arg(dir.path().join("s.redb"));
    let (stdout, stderr) = run_then_signal(cmd, Signal::SIGTERM, || {});
    assert!(stderr.contains("stored on disk"), "{stderr}");
    assert!(stdout.contains("\"name\":\"token\""), "{stdout}");
}

#[test]
fn check_fails_with_exit_3_on_a_damaged_invariant() {
    // A database whose object count disagrees with its table, written through redb directly.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.redb");
    {
        let db = durable_informer::store::DurableStore::open(durable_informer::store::StoreConfig::new(&path)).unwrap();
        let w = db.writer();
        let scope = w
            .register_scope_blocking(&durable_informer::object::ScopeSpec::new("", "v1", "configmaps"))
            .unwrap();
        let obj = durable_informer::object::RawObject::from_json(
            br#"{"metadata":{"name":"a","namespace":"n","resourceVersion":"5"}}"#.to_vec(),
        )
        .unwrap();
        w.apply_blocking(
            durable_informer::store::Batch::new(scope)
                .delta(durable_informer::store::DeltaKind::Added, obj)
                .rv("5"),
        )
        .unwrap();
    }
    {
        let db = redb::Database::open(&path).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut log = txn.open_table(redb::TableDefinition::<u64, &[u8]>::new("log")).unwrap();
            log.remove(1).unwrap();
        }
        txn.commit().unwrap();
    }
    bin()
        .args(["check", "--db"])
        .arg(&path)
        .assert()
        .code(3)
        .stdout(predicate::str::contains("PROBLEM"));
}

#[test]
fn sim_serve_listens_on_the_given_port_writes_a_kubeconfig_and_stops_on_sigterm() {
    use std::io::{BufRead, BufReader, Read, Write};
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let mut child = bin()
        .args([
            "sim",
            "serve",
            "--size",
            "small",
            "--port",
            &port.to_string(),
            "--kubeconfig-out",
        ])
        .arg(&kubeconfig)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.contains(&format!("127.0.0.1:{port}")), "{line}");
    assert!(std::fs::read_to_string(&kubeconfig)
        .unwrap()
        .contains(&format!("http://127.0.0.1:{port}")));
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    conn.write_all(b"GET /version HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut resp = String::new();
    conn.read_to_string(&mut resp).unwrap();
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    // --size small generated the Pods before serving.
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    conn.write_all(b"GET /api/v1/pods?limit=1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut resp = String::new();
    conn.read_to_string(&mut resp).unwrap();
    assert!(
        resp.starts_with("HTTP/1.1 200")
            && resp.contains("\"kind\":\"PodList\"")
            && resp.contains("\"remainingItemCount\":999"),
        "{resp}"
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(child.wait().unwrap().success());
}

#[test]
fn record_replay_export_round_trip_and_kubectl_output_replays() {
    let sim = sim();
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("cm.jsonl");
    // Only default's app=web ConfigMaps are recorded.
    let child = bin()
        .args([
            "record",
            "-r",
            "configmaps",
            "-n",
            "default",
            "-l",
            "app=web",
            "-o",
            "json",
        ])
        .args(["--server", &sim.url(), "--duration", "3", "--out"])
        .arg(&rec)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let web = |name: &str| json!({"metadata": {"name": name, "namespace": "default", "labels": {"app": "web"}}});
    sim.create("configmaps", Some("default"), web("recorded-live")).unwrap();
    sim.create(
        "configmaps",
        Some("default"),
        json!({"metadata": {"name": "unlabeled", "namespace": "default"}}),
    )
    .unwrap();
    sim.delete("configmaps", Some("other"), "db-1").unwrap();
    sim.delete("configmaps", Some("default"), "web-2").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let text = std::fs::read_to_string(&rec).unwrap();
    assert!(text.contains("recorded-live") && text.contains("\"DELETED\""), "{text}");
    assert!(!text.contains("unlabeled") && !text.contains("db-1"), "{text}");
    assert_eq!(summary["files"], json!([rec.display().to_string()]), "{summary}");
    assert!(summary["lines"].as_u64().unwrap() >= 4, "{summary}");
    let rv_of = |name: &str| -> String {
        text.lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .filter(|l| l["object"]["metadata"]["name"] == name)
            .map(|l| l["object"]["metadata"]["resourceVersion"].as_str().unwrap().to_owned())
            .next_back()
            .unwrap()
    };
    let (rv_live, rv_deleted) = (rv_of("recorded-live"), rv_of("web-2"));
    assert_eq!(summary["lastResourceVersion"], rv_deleted.as_str(), "{summary}");
    let names_in = |db: &std::path::Path| -> Vec<String> {
        let list = bin()
            .args(["list", "-o", "json", "-r", "configmaps", "--db"])
            .arg(db)
            .output()
            .unwrap();
        let list: serde_json::Value = serde_json::from_slice(&list.stdout).unwrap();
        let mut names: Vec<String> = list["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["metadata"]["name"].as_str().unwrap().to_owned())
            .collect();
        names.sort();
        names
    };

    let db = dir.path().join("replayed.redb");
    bin()
        .args(["replay"])
        .arg(&rec)
        .args(["-o", "json", "--db"])
        .arg(&db)
        .assert()
        .success()
        .stdout(predicate::str::contains(format!(
            "\"lastResourceVersion\":\"{rv_deleted}\""
        )));
    assert_eq!(names_in(&db), ["recorded-live", "web-1"]);
    // Up to an RV, paced, into a named resource: the later delete is not applied.
    let until = dir.path().join("until.redb");
    bin()
        .args(["replay"])
        .arg(&rec)
        .args([
            "--until-rv",
            &rv_live,
            "--speed",
            "1000",
            "-r",
            "configmaps",
            "-o",
            "json",
            "--db",
        ])
        .arg(&until)
        .assert()
        .success()
        .stdout(predicate::str::contains(format!(
            "\"lastResourceVersion\":\"{rv_live}\""
        )));
    assert_eq!(names_in(&until), ["recorded-live", "web-1", "web-2"]);
    // -r must name what the recording holds.
    fails_with_one_line(
        bin()
            .args(["replay"])
            .arg(&rec)
            .args(["-r", "pods", "--db"])
            .arg(dir.path().join("pods.redb")),
        2,
        "ConfigMap",
    );
    // -n on a cluster-scoped resource is said, not silently dropped.
    let ns_rec = dir.path().join("ns.jsonl");
    let out = bin()
        .args([
            "record",
            "-r",
            "namespaces",
            "-n",
            "default",
            "--duration",
            "1",
            "--server",
            &sim.url(),
            "--out",
        ])
        .arg(&ns_rec)
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cluster-scoped"));

    let out = dir.path().join("export.jsonl");
    let exported = bin()
        .args(["export", "-r", "configmaps", "-o", "json", "--db"])
        .arg(&db)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert!(exported.status.success());
    let exported: serde_json::Value = serde_json::from_slice(&exported.stdout).unwrap();
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(text.contains("recorded-live"));
    assert_eq!(
        exported["lines"].as_u64().unwrap(),
        text.lines().count() as u64,
        "{exported}"
    );
    bin()
        .args(["export", "--db"])
        .arg(&db)
        .arg("--out")
        .arg(dir.path().join("export2.jsonl"))
        .assert()
        .success()
        .stdout(predicate::str::starts_with("exported ").and(predicate::str::contains("ExportReport").not()));
    fails_with_one_line(
        bin()
            .args(["export", "-r", "deployments.apps", "--db"])
            .arg(&db)
            .arg("--out")
            .arg(dir.path().join("none.jsonl")),
        5,
        "deployments",
    );

    // A recorded kube-apiserver watch stream replays as it is.
    let wire = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/k8s-wire/configmaps-watch.jsonl"
    );
    let db2 = dir.path().join("wire.redb");
    bin()
        .args(["replay", wire, "--db"])
        .arg(&db2)
        .assert()
        .success()
        .stdout(predicate::str::contains("resourceVersion"));
    // A malformed recording: a clear error with the line number.
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(&bad, "{\"type\":\"ADDED\",\"object\":{\"metadata\":{\"name\":\"a\",\"resourceVersion\":\"1\"}}}\nnot json\n{\"type\":\"ADDED\",\"object\":{\"metadata\":{\"name\":\"b\",\"resourceVersion\":\"2\"}}}\n").unwrap();
    fails_with_one_line(
        bin()
            .args(["replay"])
            .arg(&bad)
            .args(["-r", "configmaps", "--db"])
            .arg(dir.path().join("bad.redb")),
        1,
        "bad.jsonl:2: malformed",
    );
}

// ---- kubectl conventions (issue #24) -------------------------------------------------------

/// An RFC 3339 time `seconds_ago` before now.
fn ago(seconds_ago: i64) -> String {
    let now = k8s_openapi::jiff::Timestamp::now();
    k8s_openapi::jiff::Timestamp::from_second(now.as_second() - seconds_ago)
        .unwrap()
        .to_string()
}

/// A database written through the library: Pods in `prod` and `dev`, a Deployment, a
/// cluster-scoped Namespace and a ConfigMap whose values look like other YAML types.
fn fixture_db(dir: &std::path::Path) -> std::path::PathBuf {
    use durable_informer::object::{RawObject, ScopeSpec};
    use durable_informer::store::{Batch, DeltaKind, DurableStore, StoreConfig};
    let path = dir.join("fixture.redb");
    let db = DurableStore::open(StoreConfig::new(&path)).unwrap();
    let w = db.writer();
    let mut rv = 10;
    let mut fill = |spec: ScopeSpec, objects: Vec<serde_json::Value>| {
        let scope = w.register_scope_blocking(&spec).unwrap();
        let mut batch = Batch::new(scope);
        for mut o in objects {
            rv += 1;
            o["metadata"]["resourceVersion"] = json!(rv.to_string());
            batch = batch.delta(
                DeltaKind::Added,
                RawObject::from_json(o.to_string().into_bytes()).unwrap(),
            );
        }
        w.apply_blocking(batch.rv(rv.to_string()).synced()).unwrap();
    };
    let pod = |ns: &str, name: &str, app: &str, phase: &str, age: i64| {
        let running = phase == "Running";
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": ns, "labels": {"app": app}, "creationTimestamp": ago(age)},
               "spec": {"nodeName": "node-1", "containers": [{"name": "app"}, {"name": "sidecar"}]},
               "status": {"phase": phase, "podIP": if running { "10.0.0.7" } else { "" },
                          "containerStatuses": [
                              {"name": "app", "ready": running, "restartCount": 2},
                              {"name": "sidecar", "ready": false, "restartCount": 1}]}})
    };
    fill(
        ScopeSpec::new("", "v1", "pods"),
        vec![
            pod("prod", "web-0", "web", "Running", 630),
            pod("prod", "db-0", "db", "Pending", 2 * 86400 + 60),
            pod("dev", "web-1", "web", "Running", (3 * 365 + 10) * 86400 + 60),
            pod("prod", "same", "x", "Running", 5),
            pod("dev", "same", "x", "Running", 5),
        ],
    );
    fill(
        ScopeSpec::new("apps", "v1", "deployments"),
        vec![json!({"apiVersion": "apps/v1", "kind": "Deployment",
                    "metadata": {"name": "web", "namespace": "prod", "creationTimestamp": ago(40)},
                    "spec": {"replicas": 3},
                    "status": {"readyReplicas": 2, "updatedReplicas": 3, "availableReplicas": 2}})],
    );
    fill(
        ScopeSpec::new("", "v1", "namespaces"),
        vec![json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "prod"}})],
    );
    // A custom resource whose kind no rule derives from its plural.
    fill(
        ScopeSpec::new("example.com", "v1alpha1", "gizmoes"),
        vec![json!({"apiVersion": "example.com/v1alpha1", "kind": "Thingamajig",
                    "metadata": {"name": "g1", "namespace": "prod"}})],
    );
    fill(
        ScopeSpec::new("", "v1", "configmaps"),
        vec![json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": "tricky", "namespace": "prod"},
                    "data": {"a": "True", "b": "0x1F", "c": "2026-01-01", "d": "null", "e": "~",
                             "f": "yes", "g": "010", "h": "1e3", "i": "", "j": "on", "k": "multi\nline"}})],
    );
    path
}

/// A table's rows as header → cell maps (cells here hold no spaces).
fn table(stdout: &str) -> Vec<std::collections::BTreeMap<String, String>> {
    let mut lines = stdout.lines();
    let header: Vec<&str> = lines.next().unwrap_or_default().split_whitespace().collect();
    lines
        .map(|l| {
            let cells: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(cells.len(), header.len(), "{stdout}");
            header
                .iter()
                .zip(cells)
                .map(|(h, c)| (h.to_string(), c.to_owned()))
                .collect()
        })
        .collect()
}

/// Runs an offline command on `db`; it must succeed. Returns stdout.
fn ok(db: &std::path::Path, args: &[&str]) -> String {
    let out = bin().args(args).arg("--db").arg(db).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{args:?}: {stderr}");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn resource_and_name_are_positional_and_short_names_and_kinds_resolve_offline() {
    let dir = tempfile::tempdir().unwrap();
    let db = fixture_db(dir.path());
    for args in [
        &["get", "pods", "web-0", "-n", "prod", "-o", "name"][..],
        &["get", "po", "web-0", "-n", "prod", "-o", "name"],
        &["get", "pod", "web-0", "-o", "name"],
        &["get", "Pod", "web-0", "-o", "name"],
        &["get", "pods.v1.", "web-0", "-o", "name"],
        &["get", "pod/web-0", "-o", "name"],
    ] {
        assert_eq!(ok(&db, args), "pod/web-0\n", "{args:?}");
    }
    for r in [
        "deployments.apps",
        "deploy",
        "Deployment",
        "deployments.v1.apps",
        "deployments",
    ] {
        assert_eq!(
            ok(&db, &["get", r, "web", "-o", "name"]),
            "deployment.apps/web\n",
            "{r}"
        );
    }
    assert_eq!(ok(&db, &["get", "ns", "-o", "name"]), "namespace/prod\n");
    assert_eq!(ok(&db, &["get", "cm", "-o", "name"]), "configmap/tricky\n");
    // A custom resource's kind is read from a stored object; its group can be named.
    for r in [
        "Thingamajig",
        "thingamajig",
        "gizmoes",
        "gizmo",
        "gizmoes.example.com",
        "gizmoes.v1alpha1.example.com",
    ] {
        assert_eq!(
            ok(&db, &["get", r, "-o", "name"]),
            "thingamajig.example.com/g1\n",
            "{r}"
        );
    }
    // A name in several namespaces needs -n; a resource the database lacks is exit 5.
    fails_with_one_line(bin().args(["get", "pods", "same", "--db"]).arg(&db), 2, "pass -n");
    assert_eq!(
        ok(&db, &["get", "pods", "same", "-n", "dev", "-o", "name"]),
        "pod/same\n"
    );
    fails_with_one_line(bin().args(["history", "pods", "same", "--db"]).arg(&db), 2, "pass -n");
    fails_with_one_line(
        bin().args(["get", "widgets", "--db"]).arg(&db),
        5,
        "no scope for resource",
    );
    fails_with_one_line(bin().args(["get", "pods.v2.", "--db"]).arg(&db), 5, "pods.v2.");
    fails_with_one_line(
        bin().args(["get", "pods", "nope", "-n", "prod", "--db"]).arg(&db),
        1,
        "not found",
    );
    fails_with_one_line(bin().args(["get", "--db"]).arg(&db), 2, "name a resource");
    // Both forms at once is a usage error (clap's message with the usage).
    let out = bin()
        .args(["list", "pods", "-r", "pods", "--db"])
        .arg(&db)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot be used with"));
}

#[test]
fn get_without_a_name_lists_with_namespaces_labels_and_field_selectors() {
    let dir = tempfile::tempdir().unwrap();
    let db = fixture_db(dir.path());
    let names = |args: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = ok(&db, args).lines().map(str::to_owned).collect();
        v.sort();
        v
    };
    assert_eq!(
        names(&["get", "pods", "-o", "name"]),
        ["pod/db-0", "pod/same", "pod/same", "pod/web-0", "pod/web-1"]
    );
    assert_eq!(
        names(&["get", "pods", "-A", "-l", "app=web", "-o", "name"]),
        ["pod/web-0", "pod/web-1"]
    );
    assert_eq!(
        names(&["get", "pods", "-n", "dev", "-o", "name"]),
        ["pod/same", "pod/web-1"]
    );
    for cmd in ["get", "list"] {
        assert_eq!(
            names(&[cmd, "pods", "--field-selector", "metadata.name=web-1", "-o", "name"]),
            ["pod/web-1"]
        );
        assert_eq!(
            names(&[
                cmd,
                "pods",
                "--field-selector",
                "metadata.namespace!=prod,metadata.name!=same",
                "-o",
                "name"
            ]),
            ["pod/web-1"]
        );
        assert_eq!(
            names(&[cmd, "pods", "--field-selector", "status.phase=Pending", "-o", "name"]),
            ["pod/db-0"]
        );
    }
    fails_with_one_line(
        bin()
            .args(["get", "pods", "--field-selector", "metadata.name", "--db"])
            .arg(&db),
        2,
        "bad field selector",
    );
    // -A shows a NAMESPACE column, -n does not (as kubectl).
    let all = ok(&db, &["get", "pods"]);
    assert!(all.starts_with("NAMESPACE"), "{all}");
    let one = ok(&db, &["get", "cm", "-n", "prod"]);
    let header: Vec<&str> = one.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["NAME", "AGE"], "{one}");
    // Nothing found: no header, kubectl's note on stderr.
    let out = bin()
        .args(["get", "pods", "-n", "nowhere", "--db"])
        .arg(&db)
        .output()
        .unwrap();
    assert!(out.status.success() && out.stdout.is_empty());
    assert!(String::from_utf8_lossy(&out.stderr).contains("No resources found in nowhere namespace"));
}

#[test]
fn pods_and_deployments_get_kubectls_columns() {
    let dir = tempfile::tempdir().unwrap();
    let db = fixture_db(dir.path());
    let out = ok(&db, &["get", "pods", "-n", "prod"]);
    let header: Vec<&str> = out.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["NAME", "READY", "STATUS", "RESTARTS", "AGE"], "{out}");
    let rows = table(&out);
    let web = rows.iter().find(|r| r["NAME"] == "web-0").unwrap();
    assert_eq!(
        (web["READY"].as_str(), web["STATUS"].as_str(), web["RESTARTS"].as_str()),
        ("1/2", "Running", "3")
    );
    let db0 = rows.iter().find(|r| r["NAME"] == "db-0").unwrap();
    assert_eq!((db0["READY"].as_str(), db0["STATUS"].as_str()), ("0/2", "Pending"));
    let rows = table(&ok(&db, &["get", "pods", "-n", "prod", "-o", "wide"]));
    let web = rows.iter().find(|r| r["NAME"] == "web-0").unwrap();
    assert_eq!((web["IP"].as_str(), web["NODE"].as_str()), ("10.0.0.7", "node-1"));
    assert_eq!(rows.iter().find(|r| r["NAME"] == "db-0").unwrap()["IP"], "<none>");
    let rows = table(&ok(&db, &["get", "deploy", "-n", "prod"]));
    assert_eq!(
        (
            rows[0]["READY"].as_str(),
            rows[0]["UP-TO-DATE"].as_str(),
            rows[0]["AVAILABLE"].as_str()
        ),
        ("2/3", "3", "2")
    );
}

#[test]
fn json_and_yaml_print_one_object_or_a_kubectl_list() {
    let dir = tempfile::tempdir().unwrap();
    let db = fixture_db(dir.path());
    let one: serde_json::Value =
        serde_json::from_str(&ok(&db, &["get", "pods", "web-0", "-n", "prod", "-o", "json"])).unwrap();
    assert_eq!(one["kind"], "Pod");
    assert_eq!(one["metadata"]["name"], "web-0");
    let list: serde_json::Value = serde_json::from_str(&ok(&db, &["get", "pods", "-n", "prod", "-o", "json"])).unwrap();
    assert_eq!(
        (list["apiVersion"].as_str(), list["kind"].as_str()),
        (Some("v1"), Some("List"))
    );
    assert_eq!(list["items"].as_array().unwrap().len(), 3, "{list}");
    let yaml: serde_json::Value =
        serde_norway::from_str(&ok(&db, &["get", "pods", "-n", "prod", "-o", "yaml"])).unwrap();
    assert_eq!(yaml, list);
    let yaml: serde_json::Value =
        serde_norway::from_str(&ok(&db, &["get", "pods", "web-0", "-n", "prod", "-o", "yaml"])).unwrap();
    assert_eq!(yaml, one);
}

#[test]
fn yaml_quotes_strings_that_would_read_back_as_other_types() {
    let dir = tempfile::tempdir().unwrap();
    let db = fixture_db(dir.path());
    let text = ok(&db, &["get", "cm", "tricky", "-n", "prod", "-o", "yaml"]);
    // Quoted, so that YAML readers see strings and not a bool, a hex int, null, a date… — the
    // YAML 1.1 readers (kubectl's Go yaml.v2, PyYAML) too, which take `yes` and `on` for bools.
    for (key, value) in [
        ("a", "True"),
        ("b", "0x1F"),
        ("c", "2026-01-01"),
        ("d", "null"),
        ("e", "~"),
        ("f", "yes"),
        ("g", "010"),
        ("h", "1e3"),
        ("i", ""),
        ("j", "on"),
    ] {
        assert!(
            text.contains(&format!("  {key}: '{value}'\n")) || text.contains(&format!("  {key}: \"{value}\"\n")),
            "{key}: {value} not quoted in\n{text}"
        );
    }
    // Every value reads back as the same string.
    let back: serde_json::Value = serde_norway::from_str(&text).unwrap();
    let json: serde_json::Value =
        serde_json::from_str(&ok(&db, &["get", "cm", "tricky", "-n", "prod", "-o", "json"])).unwrap();
    assert_eq!(back["data"], json["data"], "{text}");
    for (k, v) in json["data"].as_object().unwrap() {
        assert!(v.is_string() && back["data"][k] == *v, "{k}: {text}");
    }
}

#[test]
fn jsonpath_templates_follow_kubectls_syntax() {
    let dir = tempfile::tempdir().unwrap();
    let db = fixture_db(dir.path());
    assert_eq!(
        ok(
            &db,
            &["get", "pods", "web-0", "-n", "prod", "-o", "jsonpath={.metadata.name}"]
        ),
        "web-0"
    );
    assert_eq!(
        ok(
            &db,
            &["get", "pods", "-n", "dev", "-o", "jsonpath={.items[*].metadata.name}"]
        ),
        "same web-1"
    );
    assert_eq!(
        ok(
            &db,
            &[
                "get",
                "pods",
                "-n",
                "dev",
                "-o",
                r#"jsonpath={range .items[*]}{.metadata.name} on {.spec.nodeName}{"\n"}{end}"#
            ]
        ),
        "same on node-1\nweb-1 on node-1\n"
    );
    assert_eq!(
        ok(
            &db,
            &[
                "get",
                "pods",
                "web-0",
                "-n",
                "prod",
                "-o",
                "jsonpath=name: {.metadata.name}, app: {.metadata.labels.app}"
            ]
        ),
        "name: web-0, app: web"
    );
    assert_eq!(
        ok(
            &db,
            &[
                "get",
                "pods",
                "-A",
                "-o",
                r#"jsonpath={.items[?(@.status.phase=="Pending")].metadata.name}"#
            ]
        ),
        "db-0"
    );
    for bad in [
        "jsonpath={range .items[*]}{.x}",
        "jsonpath={.metadata.name",
        "jsonpath",
        "jsonpath={end}",
    ] {
        fails_with_one_line(bin().args(["get", "pods", "-o", bad, "--db"]).arg(&db), 2, "jsonpath");
    }
}

#[test]
fn custom_columns_no_headers_show_labels_and_wide() {
    let dir = tempfile::tempdir().unwrap();
    let db = fixture_db(dir.path());
    let out = ok(
        &db,
        &[
            "get",
            "pods",
            "-n",
            "dev",
            "-o",
            "custom-columns=NAME:.metadata.name,NS:.metadata.namespace,X:.nope",
        ],
    );
    let rows: Vec<Vec<&str>> = out.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(
        rows,
        [
            ["NAME", "NS", "X"],
            ["same", "dev", "<none>"],
            ["web-1", "dev", "<none>"]
        ],
        "{out}"
    );
    let out = ok(
        &db,
        &[
            "get",
            "pods",
            "-n",
            "dev",
            "--no-headers",
            "-o",
            "custom-columns=NAME:{.metadata.name}",
        ],
    );
    assert_eq!(out, "same\nweb-1\n");
    fails_with_one_line(
        bin()
            .args(["get", "pods", "-o", "custom-columns=NAME", "--db"])
            .arg(&db),
        2,
        "HEADER:PATH",
    );
    let out = ok(&db, &["get", "pods", "-n", "prod", "--no-headers"]);
    assert_eq!(out.lines().count(), 3, "{out}");
    assert!(!out.contains("NAME"), "{out}");
    let out = ok(&db, &["get", "pods", "web-0", "-n", "prod", "--show-labels"]);
    let header: Vec<&str> = out.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header.last(), Some(&"LABELS"), "{out}");
    assert_eq!(table(&out)[0]["LABELS"], "app=web", "{out}");
    let out = ok(&db, &["get", "cm", "--show-labels"]);
    assert_eq!(table(&out)[0]["LABELS"], "<none>", "{out}");
    let out = ok(&db, &["get", "pods", "-n", "prod", "-o", "wide"]);
    assert!(out.lines().next().unwrap().contains("RESOURCE-VERSION"), "{out}");
    assert!(!out.contains("LABELS"), "{out}");
}

#[test]
fn age_column_uses_kubectls_short_form() {
    let dir = tempfile::tempdir().unwrap();
    let db = fixture_db(dir.path());
    let rows = table(&ok(&db, &["get", "pods", "-A"]));
    let age = |name: &str| -> String { rows.iter().find(|r| r["NAME"] == name).unwrap()["AGE"].clone() };
    assert_eq!(age("web-0"), "10m", "{rows:?}");
    assert_eq!(age("db-0"), "2d", "{rows:?}");
    assert_eq!(age("web-1"), "3y10d", "{rows:?}");
    let deploy = table(&ok(&db, &["get", "deploy", "web"]));
    assert!(["40s", "41s", "42s"].contains(&deploy[0]["AGE"].as_str()), "{deploy:?}");
    // No creationTimestamp: unknown, as kubectl.
    let ns = ok(&db, &["get", "namespaces"]);
    assert!(ns.lines().nth(1).unwrap().ends_with("<unknown>"), "{ns}");
}

#[test]
fn an_output_format_a_command_cannot_print_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let db = fixture_db(dir.path());
    fails_with_one_line(
        bin().args(["stats", "-o", "wide", "--db"]).arg(&db),
        2,
        "`stats` cannot print it",
    );
    fails_with_one_line(
        bin().args(["check", "-o", "name", "--db"]).arg(&db),
        2,
        "table, json or yaml",
    );
    fails_with_one_line(
        bin()
            .args(["history", "pods", "web-0", "-n", "prod", "-o", "wide", "--db"])
            .arg(&db),
        2,
        "-o wide",
    );
    fails_with_one_line(
        bin().args(["get", "pods", "-o", "xml", "--db"]).arg(&db),
        2,
        "unknown output format",
    );
    fails_with_one_line(
        bin().args(["demo", "-o", "yaml", "--size", "small"]),
        2,
        "`demo` cannot print it",
    );
    fails_with_one_line(
        bin()
            .args(["watch", "pods", "-o", "wide", "--server", "http://127.0.0.1:1", "--db"])
            .arg(&db),
        2,
        "`watch` cannot print it",
    );
    // What a report command can print, it prints.
    let stats: serde_json::Value = serde_norway::from_str(&ok(&db, &["stats", "-o", "yaml"])).unwrap();
    assert_eq!(stats["scopes"].as_array().unwrap().len(), 5, "{stats}");
    let history = ok(&db, &["history", "pods", "web-0", "-n", "prod", "-o", "yaml"]);
    assert!(
        history.starts_with("---\n") && history.contains("type: ADDED"),
        "{history}"
    );
}

#[test]
fn completion_scripts_are_generated_for_bash_zsh_and_fish() {
    for shell in ["bash", "zsh", "fish"] {
        let out = bin().args(["completion", shell]).output().unwrap();
        assert!(out.status.success(), "{shell}");
        let script = String::from_utf8(out.stdout).unwrap();
        assert!(script.contains("durable-informer"), "{shell}: {script}");
        assert!(script.contains("watch") && script.contains("get"), "{shell}");
        if shell == "bash" {
            let dir = tempfile::tempdir().unwrap();
            let file = dir.path().join("completion.bash");
            std::fs::write(&file, &script).unwrap();
            let check = Command::new("bash").arg("-n").arg(&file).output().unwrap();
            assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stderr));
        }
    }
    let out = bin().args(["completion", "tcsh"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn older_flag_forms_keep_working() {
    let dir = tempfile::tempdir().unwrap();
    let db = fixture_db(dir.path());
    // `get -r R NAMESPACE/NAME` still prints JSON by default.
    let one: serde_json::Value = serde_json::from_str(&ok(&db, &["get", "-r", "pods", "prod/web-0"])).unwrap();
    assert_eq!(one["metadata"]["name"], "web-0");
    assert_eq!(
        ok(&db, &["get", "-r", "po", "web-0", "-n", "prod", "-o", "name"]),
        "pod/web-0\n"
    );
    assert_eq!(
        ok(&db, &["list", "-r", "pods", "-n", "dev", "--no-headers"])
            .lines()
            .count(),
        2
    );
    assert_eq!(
        ok(&db, &["list", "--resource", "pods", "-n", "dev", "-o", "name"])
            .lines()
            .count(),
        2
    );
    assert!(ok(&db, &["history", "-r", "pods", "prod/web-0"]).contains("Added"));
    assert!(ok(&db, &["history", "pods", "web-0", "-n", "prod"]).contains("Added"));
    let out = dir.path().join("export.jsonl");
    ok(&db, &["export", "deploy", "--out", out.to_str().unwrap()]);
    assert!(std::fs::read_to_string(&out).unwrap().contains("\"Deployment\""));
    ok(
        &db,
        &["export", "-r", "deployments.apps", "--out", out.to_str().unwrap()],
    );
    assert!(std::fs::read_to_string(&out).unwrap().contains("\"Deployment\""));
}

#[test]
fn live_commands_take_the_contexts_namespace_and_server_keeps_its_credentials() {
    let sim = sim();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    // A context with a namespace and a token, pointing nowhere useful: --server must keep the
    // token and the namespace while replacing the URL.
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:1\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\n    namespace: other\ncurrent-context: c\nusers:\n- name: u\n  user:\n    token: sekret\n",
    )
    .unwrap();
    let names = |stdout: &str| -> Vec<String> {
        let mut v: Vec<String> = stdout.lines().map(str::to_owned).collect();
        v.sort();
        v
    };
    let before = sim.counters().bearer_requests;
    let mut cmd = bin();
    cmd.args(["watch", "cm", "-o", "name", "--server", &sim.url(), "--kubeconfig"])
        .arg(&kubeconfig)
        .arg("--db")
        .arg(dir.path().join("ctx.redb"));
    let (stdout, _) = run_then_signal(cmd, Signal::SIGTERM, || {});
    assert_eq!(
        names(&stdout),
        ["configmap/db-1"],
        "the context's namespace only: {stdout}"
    );
    assert!(
        sim.counters().bearer_requests > before,
        "--server dropped the kubeconfig's token"
    );
    // -A, and the older -r form (which kept watching all namespaces), see every namespace.
    for (i, args) in [&["watch", "configmaps", "-A"][..], &["watch", "-r", "configmaps"]]
        .into_iter()
        .enumerate()
    {
        let mut cmd = bin();
        cmd.args(args)
            .args(["-o", "name", "--server", &sim.url(), "--kubeconfig"])
            .arg(&kubeconfig)
            .arg("--db")
            .arg(dir.path().join(format!("all-{i}.redb")));
        let (stdout, _) = run_then_signal(cmd, Signal::SIGTERM, || {});
        assert_eq!(
            names(&stdout),
            ["configmap/db-1", "configmap/web-1", "configmap/web-2"],
            "{args:?}: {stdout}"
        );
    }
    // record takes the same scope: the context's namespace.
    let rec = dir.path().join("ctx.jsonl");
    let out = bin()
        .args([
            "record",
            "cm",
            "--duration",
            "1",
            "-o",
            "json",
            "--server",
            &sim.url(),
            "--kubeconfig",
        ])
        .arg(&kubeconfig)
        .arg("--out")
        .arg(&rec)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(&rec).unwrap();
    assert!(text.contains("\"db-1\"") && !text.contains("\"web-1\""), "{text}");
    // -n wins over the context.
    let mut cmd = bin();
    cmd.args([
        "watch",
        "ConfigMap",
        "-n",
        "default",
        "-o",
        "name",
        "--server",
        &sim.url(),
        "--kubeconfig",
    ])
    .arg(&kubeconfig)
    .arg("--db")
    .arg(dir.path().join("n.redb"));
    let (stdout, _) = run_then_signal(cmd, Signal::SIGTERM, || {});
    assert_eq!(names(&stdout), ["configmap/web-1", "configmap/web-2"], "{stdout}");
}
