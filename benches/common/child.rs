//! What the benches that run child processes share: the command a child runs under, and the
//! redb page cache asked for.

use std::process::Command;

/// The command that runs `exe` as a child: under `BENCH_WRAP` when set (a profiler, say
/// `heaptrack -o /tmp/mem`; its words split on whitespace), else `exe` itself.
pub fn child_command(exe: &std::path::Path) -> Command {
    let wrap = std::env::var("BENCH_WRAP").unwrap_or_default();
    let mut words = wrap.split_whitespace();
    match words.next() {
        Some(prog) => {
            let mut c = Command::new(prog);
            c.args(words).arg(exe);
            c
        }
        None => Command::new(exe),
    }
}

/// `BENCH_REDB_CACHE_MIB` in bytes, if set; a value that is not a number is an error.
pub fn redb_cache_bytes() -> Result<Option<usize>, String> {
    match std::env::var("BENCH_REDB_CACHE_MIB") {
        Ok(v) => v
            .trim()
            .parse::<usize>()
            .map(|mib| Some(mib << 20))
            .map_err(|e| format!("BENCH_REDB_CACHE_MIB={v:?}: {e}")),
        Err(_) => Ok(None),
    }
}
