#!/usr/bin/env bash
# Coverage-guided libFuzzer runs without cargo-fuzz: builds the targets with the SanitizerCoverage
# flags cargo-fuzz uses (no AddressSanitizer, so it works on stable), optimized with debug
# assertions and overflow checks (as `cargo fuzz` builds), seeds the corpora, and runs each target
# for SECONDS (default 60; 0: no time limit), one after the other. With RUNS set, each target
# stops after that many executions instead. `--target` keeps the flags off build scripts.
#   fuzz/run-coverage.sh [SECONDS] [TARGET...]
#   RUNS=10000000 fuzz/run-coverage.sh 0 store_object_row     (see fuzz/README.md)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
secs=${1:-60}
shift || true
targets=${*:-watch_line extract_meta list recording selectors continue_token \
store_object_row store_log_row store_record store_key store_unpack}
runs=${RUNS:+-runs=$RUNS}
triple=$(rustc -vV | sed -n 's/^host: //p')
cd "$here"
RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions -Coverflow-checks" \
    cargo build --release --bins --target "$triple" --target-dir target-cov
./seed-corpora.sh >/dev/null
mkdir -p artifacts
for t in $targets; do
    start=$SECONDS
    "target-cov/$triple/release/$t" "corpus/$t" -max_total_time="$secs" $runs -print_final_stats=1 \
        -artifact_prefix="artifacts/$t-" 2>&1 | grep -E "^#[0-9]+[[:space:]]+DONE|stat::number_of_executed_units|stat::new_units_added|ERROR|panicked" \
        | sed "s/^/$t: /"
    echo "$t: $((SECONDS - start)) s"
done
