//! The example binaries, built once per test binary with the same cargo, profile, target
//! directory and features as the test itself (`cargo test` does not build examples for an
//! integration test). Shared by `tests/example_binaries.rs` and `tests/envtest_deploy.rs`,
//! which build the same set so that neither rebuilds what the other built.
#![allow(dead_code)] // each test file uses a part of it

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

pub const EXAMPLES: [&str; 8] = [
    "ha_controller",
    "ring_sharding",
    "pod_informer",
    "deployment_lister",
    "mydemo_controller",
    "sample_controller",
    "controller_manager",
    "sim_serve",
];

/// `target/<profile>`, from this test binary's own path (`target/<profile>/deps/<exe>`).
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    exe.parent()
        .and_then(Path::parent)
        .expect("test binary lives in target/<profile>/deps")
        .to_path_buf()
}

/// The path of example `name`, built once for all tests of this file.
pub fn example(name: &str) -> PathBuf {
    static BUILT: OnceLock<Result<(), String>> = OnceLock::new();
    let built = BUILT.get_or_init(|| {
        let profile = profile_dir();
        let target = profile.parent().ok_or("no target dir")?;
        // The same feature set as this binary (`default` counts), so nothing is rebuilt.
        let mut features = Vec::new();
        if cfg!(feature = "default") {
            features.push("default");
        }
        if cfg!(feature = "sim") {
            features.push("sim");
        }
        if cfg!(feature = "cli") {
            features.push("cli");
        }
        let mut cmd = Command::new(env!("CARGO"));
        // Cargo sets these for the test process; some build scripts track them, so passing
        // them on would rebuild dependencies.
        for (key, _) in std::env::vars_os() {
            let k = key.to_string_lossy();
            if [
                "CARGO_MANIFEST_",
                "CARGO_PKG_",
                "CARGO_CRATE_",
                "CARGO_BIN_",
                "CARGO_PRIMARY_",
            ]
            .iter()
            .any(|p| k.starts_with(p))
                || k == "CARGO_TARGET_TMPDIR"
                || k == "OUT_DIR"
            {
                cmd.env_remove(&key);
            }
        }
        cmd.current_dir(env!("CARGO_MANIFEST_DIR"))
            .args(["build", "--quiet", "--no-default-features", "--features"])
            .arg(features.join(","))
            .arg("--target-dir")
            .arg(target);
        match profile.file_name().and_then(|n| n.to_str()) {
            Some("debug") => {}
            Some("release") => {
                cmd.arg("--release");
            }
            Some(other) => {
                cmd.args(["--profile", other]);
            }
            None => return Err("no profile dir".into()),
        }
        for e in EXAMPLES {
            cmd.args(["--example", e]);
        }
        let status = cmd.status().map_err(|e| format!("running cargo: {e}"))?;
        if status.success() {
            return Ok(());
        }
        // Once, on a CI machine, rustc died with 101 (what its LLVM error handler exits
        // with, out of memory or disk) while it built these side by side. One job at a time
        // needs the least; a compile error fails again and is reported as before.
        eprintln!("building the examples failed ({status}); trying once more with one job");
        let again = cmd
            .args(["--jobs", "1"])
            .status()
            .map_err(|e| format!("running cargo: {e}"))?;
        if again.success() {
            Ok(())
        } else {
            Err(format!("building the examples: {status}, then with one job: {again}"))
        }
    });
    if let Err(e) = built {
        panic!("{e}");
    }
    profile_dir().join("examples").join(name)
}
