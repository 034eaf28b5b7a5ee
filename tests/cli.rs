//! The `durable-informer` binary end to end against the simulated cluster: every subcommand,
//! and the error cases with their exit codes.

use std::process::{Command, Stdio};
use std::time::Duration;

use assert_cmd::cargo::CommandCargoExt;
use assert_cmd::prelude::*;
use durable_informer::sim::{Sim, SimConfig};
use nix::sys::signal::Signal;
use predicates::prelude::*;
use serde_json::json;

fn bin() -> Command {
    let mut c = Command::cargo_bin("durable-informer").unwrap();
    // No ambient cluster configuration leaks into the tests.
    c.env_remove("KUBECONFIG").env("HOME", "/nonexistent-home");
    c
}

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
    // A database locked by another process (this one).
    let locked = dir.path().join("locked.redb");
    let held = durable_informer::store::DurableStore::open(durable_informer::store::StoreConfig::new(&locked)).unwrap();
    fails_with_one_line(bin().args(["stats", "--db"]).arg(&locked), 4, "locked");
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
