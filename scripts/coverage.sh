#!/usr/bin/env bash
# Per-crate line coverage of the library crates, from the whole test suite run against the real
# servers (cargo-llvm-cov). Prints a table and fails when a library crate is under the threshold.
#
#   scripts/coverage.sh            # threshold 80 %
#   COVERAGE_MIN=85 scripts/coverage.sh
set -euo pipefail
cd "$(dirname "$0")/.."
min="${COVERAGE_MIN:-80}"
command -v cargo-llvm-cov >/dev/null || cargo install --locked cargo-llvm-cov
rustup component list --installed 2>/dev/null | grep -q llvm-tools || rustup component add llvm-tools-preview
source scripts/services.sh
ensure_services
report="$(mktemp)"
cargo llvm-cov --workspace --all-features --json --summary-only --output-path "$report"
python3 - "$report" "$min" <<'PY'
import json, sys, collections
report, minimum = sys.argv[1], float(sys.argv[2])
data = json.load(open(report))["data"][0]["files"]
lines = collections.defaultdict(lambda: [0, 0])
for f in data:
    name = f["filename"]
    if "/crates/" not in name or "/src/" not in name:
        continue
    crate = name.split("/crates/")[1].split("/")[0]
    if crate in ("idempotency-testing", "idempotency-bench", "idempotency-load"):
        continue  # test support and the load tools are not libraries (publish = false)
    summary = f["summary"]["lines"]
    lines[crate][0] += summary["covered"]
    lines[crate][1] += summary["count"]
failed = []
print(f"| crate | lines covered | total | coverage |")
print(f"|---|---:|---:|---:|")
for crate in sorted(lines):
    covered, total = lines[crate]
    percent = 100.0 * covered / total if total else 100.0
    print(f"| {crate} | {covered} | {total} | {percent:.1f} % |")
    if percent < minimum:
        failed.append(crate)
if failed:
    print(f"under {minimum} %: {', '.join(failed)}")
    sys.exit(1)
PY
