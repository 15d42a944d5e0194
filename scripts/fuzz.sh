#!/usr/bin/env bash
# Builds and runs the cargo-fuzz targets (libFuzzer, nightly) for a bounded time each.
#
#   scripts/fuzz.sh                 # every target, 60 s each
#   scripts/fuzz.sh 300             # every target, 300 s each
#   scripts/fuzz.sh 120 canonicalize
#
# Each run starts from the committed seeds (fuzz/corpus/<target>/, read only) plus the corpus
# grown by earlier runs (fuzz/work/corpus/<target>/, ignored by git). A crash stops the script
# with a non-zero status; the input is saved under fuzz/artifacts/<target>/ and can be replayed
# with `cargo +nightly fuzz run <target> <file>`. Reproduce it as a plain #[test] in
# crates/idempotency-axum/tests/header_properties.rs or
# crates/idempotency-core/tests/fingerprint_properties.rs.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-60}"
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(header_parser canonicalize)
fi
case "$seconds" in
    '' | *[!0-9]*) echo "usage: $0 [seconds] [target...]" >&2; exit 2 ;;
esac

if ! rustup run nightly rustc --version >/dev/null 2>&1; then
    echo "fuzz.sh: a nightly toolchain is required (rustup toolchain install nightly)" >&2
    exit 1
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi

for target in "${targets[@]}"; do
    cargo +nightly fuzz build "$target"
done

summary=()
for target in "${targets[@]}"; do
    work="fuzz/work/corpus/$target"
    log="fuzz/work/$target.log"
    mkdir -p "$work" "fuzz/artifacts/$target"
    echo "== $target: ${seconds}s"
    status=0
    cargo +nightly fuzz run "$target" "$work" "fuzz/corpus/$target" -- \
        -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=4096 \
        -print_final_stats=1 >"$log" 2>&1 || status=$?
    execs=$(awk '/stat::number_of_executed_units/ {print $2}' "$log")
    rate=$(awk '/stat::average_exec_per_sec/ {print $2}' "$log")
    units=$(find "$work" -type f | wc -l)
    if [ "$status" -ne 0 ]; then
        tail -n 40 "$log" >&2
        echo "fuzz.sh: $target FAILED (status $status); input saved under fuzz/artifacts/$target/" >&2
        exit "$status"
    fi
    summary+=("$target: ${execs:-?} executions in ${seconds}s, ${rate:-?} exec/s, corpus $units inputs")
done

echo "== summary"
printf '%s\n' "${summary[@]}"
