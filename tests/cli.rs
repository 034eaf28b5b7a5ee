//! The `durable-informer` binary end to end against the simulated cluster: every subcommand,
//! and the error cases with their exit codes.

use std::process::{Command, Stdio};
use std::time::Duration;

use assert_cmd::cargo::CommandCargoExt;
use assert_cmd::prelude::*;
use durable_informer::sim::{Sim, SimConfig};
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
    let child = bin()
        .args(["watch", "-r", "configmaps", "-A", "--server", &sim.url(), "--db"])
        .arg(db)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    while_running();
    std::thread::sleep(Duration::from_millis(1000));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "watch exited with {:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn demo_small_runs_end_to_end() {
    bin()
        .args(["demo", "--size", "small"])
        .assert()
        .success()
        .stdout(predicate::str::contains("full LISTs: 0"))
        .stdout(predicate::str::contains("store equals the server's LIST: yes"));
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
    bin()
        .args(["check", "--db"])
        .arg(&db)
        .assert()
        .success()
        .stdout(predicate::str::contains("ok"));
    bin()
        .args(["compact", "--keep", "1", "--db"])
        .arg(&db)
        .assert()
        .success()
        .stdout(predicate::str::contains("removed"));
    bin().args(["check", "--db"]).arg(&db).assert().success();
}

#[test]
fn errors_are_one_clear_line_with_documented_exit_codes() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("x.redb");
    // No kubeconfig at all.
    bin()
        .args(["watch", "-r", "pods", "--db"])
        .arg(&db)
        .assert()
        .code(1)
        .stderr(predicate::str::contains("--kubeconfig"));
    // Unreachable server (a port nothing listens on).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    bin()
        .args([
            "watch",
            "-r",
            "pods",
            "--server",
            &format!("http://127.0.0.1:{port}"),
            "--db",
        ])
        .arg(&db)
        .assert()
        .code(1)
        .stderr(predicate::str::contains("cannot reach the API server"));
    // Unknown resource.
    let sim = sim();
    bin()
        .args(["watch", "-r", "widgets.example.com", "--server", &sim.url(), "--db"])
        .arg(&db)
        .assert()
        .code(5)
        .stderr(predicate::str::contains("unknown resource"));
    // Secrets need an explicit opt-in.
    bin()
        .args(["watch", "-r", "secrets", "--server", &sim.url(), "--db"])
        .arg(&db)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("DURABLE_INFORMER_ALLOW_SECRETS"));
    // A missing database for offline commands.
    bin()
        .args(["stats", "--db"])
        .arg(dir.path().join("missing.redb"))
        .assert()
        .code(4)
        .stderr(predicate::str::contains("no such database"));
    // A file that is not a database.
    let junk = dir.path().join("junk.redb");
    std::fs::write(&junk, "hello").unwrap();
    bin()
        .args(["stats", "--db"])
        .arg(&junk)
        .assert()
        .code(4)
        .stderr(predicate::str::contains("not a durable-informer database"));
    // A database locked by another process (this one).
    let locked = dir.path().join("locked.redb");
    let held = durable_informer::store::DurableStore::open(durable_informer::store::StoreConfig::new(&locked)).unwrap();
    bin()
        .args(["stats", "--db"])
        .arg(&locked)
        .assert()
        .code(4)
        .stderr(predicate::str::contains("locked"));
    drop(held);
    // Another cluster's database.
    let other = dir.path().join("other.redb");
    {
        let db =
            durable_informer::store::DurableStore::open(durable_informer::store::StoreConfig::new(&other)).unwrap();
        db.writer()
            .cluster_identity_blocking("uid-from-elsewhere@https://elsewhere", false)
            .unwrap();
    }
    bin()
        .args(["watch", "-r", "configmaps", "--server", &sim.url(), "--db"])
        .arg(&other)
        .assert()
        .code(4)
        .stderr(predicate::str::contains("uid-from-elsewhere@https://elsewhere"));
    // Usage errors.
    bin().args(["list"]).assert().code(2);
    // No panic, no backtrace anywhere above: checked by the exact exit codes.
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
            .register_scope_blocking(&durable_informer::store::ScopeSpec::new("", "v1", "configmaps"))
            .unwrap();
        let obj = durable_informer::store::RawObject::from_json(
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
        .args(["sim", "serve", "--port", &port.to_string(), "--kubeconfig-out"])
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
    let mut child = bin()
        .args([
            "record",
            "-r",
            "configmaps",
            "-A",
            "--server",
            &sim.url(),
            "--duration",
            "3",
            "--out",
        ])
        .arg(&rec)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    sim.create(
        "configmaps",
        Some("default"),
        json!({"metadata": {"name": "recorded-live", "namespace": "default"}}),
    )
    .unwrap();
    sim.delete("configmaps", Some("other"), "db-1").unwrap();
    assert!(child.wait().unwrap().success());
    let text = std::fs::read_to_string(&rec).unwrap();
    assert!(text.contains("recorded-live") && text.contains("\"DELETED\""), "{text}");

    let db = dir.path().join("replayed.redb");
    bin()
        .args(["replay"])
        .arg(&rec)
        .args(["-o", "json", "--db"])
        .arg(&db)
        .assert()
        .success()
        .stdout(predicate::str::contains("\"lastResourceVersion\""));
    let list = bin()
        .args(["list", "-o", "json", "-r", "configmaps", "--db"])
        .arg(&db)
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
    assert_eq!(names, ["recorded-live", "web-1", "web-2"]);
    let out = dir.path().join("export.jsonl");
    bin()
        .args(["export", "--db"])
        .arg(&db)
        .arg("--out")
        .arg(&out)
        .assert()
        .success();
    assert!(std::fs::read_to_string(&out).unwrap().contains("recorded-live"));

    // A recorded kube-apiserver watch stream replays as it is.
    let wire = concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/k8s-wire/configmaps-watch.jsonl");
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
    bin()
        .args(["replay"])
        .arg(&bad)
        .args(["-r", "configmaps", "--db"])
        .arg(dir.path().join("bad.redb"))
        .assert()
        .code(1)
        .stderr(predicate::str::contains("line 2"));
}
