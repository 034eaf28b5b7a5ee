#!/usr/bin/env bash
# Coverage-guided libFuzzer runs without cargo-fuzz: builds the targets with the SanitizerCoverage
# flags cargo-fuzz uses (no AddressSanitizer, so it works on stable), seeds the corpora, and runs
# each target for SECONDS (default 60). `--target` keeps the flags off build scripts.
#   fuzz/run-coverage.sh [SECONDS] [TARGET...]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
secs=${1:-60}
shift || true
targets=${*:-watch_line extract_meta list recording selectors continue_token}
triple=$(rustc -vV | sed -n 's/^host: //p')
cd "$here"
RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions -Coverflow-checks" \
    cargo build --bins --target "$triple" --target-dir target-cov
./seed-corpora.sh >/dev/null
mkdir -p artifacts
for t in $targets; do
    "target-cov/$triple/debug/$t" "corpus/$t" -max_total_time="$secs" -print_final_stats=1 \
        -artifact_prefix="artifacts/$t-" 2>&1 | grep -E "^#[0-9]+ +DONE|stat::number_of_executed_units|stat::new_units_added|ERROR|panicked" \
        | sed "s/^/$t: /"
done
