//! Running one test alone in a process of its own.
#![allow(dead_code)]

/// In the test process: runs test `name` again in a child process, alone, waits for it and
/// fails if it failed; returns `false` (the caller returns). In that child: returns `true` (the
/// caller runs its body).
///
/// For tests that capture logs with a thread-local subscriber: tracing caches whether each
/// callsite is enabled for the whole process, and a callsite first hit by another test's
/// thread at the moment the subscriber is installed can be cached as disabled, so the expected
/// line never reaches the capture (seen about once in twenty runs).
pub fn in_own_process(name: &str) -> bool {
    const CHILD: &str = "DI_ALONE_CHILD";
    if std::env::var_os(CHILD).is_some() {
        return true;
    }
    let out = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .output()
        .expect("run the test in a child process");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{name}, run alone, failed:\n{stdout}\n{stderr}");
    // A name that matched no test would pass without running anything.
    assert!(
        stdout.contains("1 passed"),
        "{name} did not run in the child:\n{stdout}"
    );
    false
}
