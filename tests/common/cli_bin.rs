//! The `durable-informer` binary as the CLI tests run it: no ambient cluster configuration.

use std::path::Path;
use std::process::{Command, Stdio};

use assert_cmd::cargo::CommandCargoExt;

/// The binary, with no kubeconfig and no home directory of the machine's.
pub fn bin() -> Command {
    let mut c = Command::cargo_bin("durable-informer").unwrap();
    c.env_remove("KUBECONFIG").env("HOME", "/nonexistent-home");
    c
}

/// Runs `args --db db`; returns (exit code, stdout, stderr).
#[allow(dead_code)] // not every test file runs commands on a database
pub fn run(args: &[&str], db: &Path) -> (i32, String, String) {
    let out = bin()
        .args(args)
        .arg("--db")
        .arg(db)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
