#!/usr/bin/env bash
# Proof that the randomized checker (crates/idempotency-check) can fail: puts back, one at a
# time, each defect of crates/idempotency-check/mutations/*.patch and counts the seeds the
# checker needs to find it. Starts the servers it needs like scripts/check.sh.
#
#   scripts/check-mutations.sh                            # every patch
#   scripts/check-mutations.sh fencing-token-goes-back    # some patches, by name
#   scripts/check-mutations.sh --seeds 50 --all NAME      # seeds 1..50, every one of them
#   scripts/check-mutations.sh --subject service-pg NAME  # other subjects than the patch's
#
# For each patch: a temporary git worktree of HEAD (under mktemp -d, removed afterwards; the
# caller's tree is never touched), `git apply` of the patch, a build of the checker there, then
# the checker on each subject the patch names (its `# subjects:` line, or the --subject ones),
# seed 1, 2, ... up to --seeds (MUTATION_SEEDS, 30), until the first history that breaks an
# invariant (--all: every seed). That seed is then run once more by the checker built from
# HEAD without a patch, the control (`ok` there: the violation is the patch's; --no-control
# skips it). Prints one Markdown table row per patch and subject: class, patch, subject, the
# invariants that broke, the seeds needed (or "not found in N"), the control. The failing
# histories stay in <target>/mutations/logs until the next run.
#
# The builds go to <target>/mutations (<target>: the caller's CARGO_TARGET_DIR or target/),
# seeded at every run with hard links to the caller's dependencies, so they are not built
# again. Not the caller's target directory itself: a worktree's crates have the caller's
# artifact names, and cargo would take the mutated ones as fresh in the caller's next build.
#
# Exit 0: every patch was found, on at least one of its subjects; 1: some patch was found on
# none (or no longer applies, or does not build); 2: a run could not be made (a server missing).
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed -e '/^set -euo/d' -e 's/^# \{0,1\}//' >&2
  exit "${1:-2}"
}

seeds="${MUTATION_SEEDS:-30}"
all=false
control=true
names=()
chosen=()
while [ "$#" -gt 0 ]; do
  case "$1" in
    --seeds) [ "$#" -ge 2 ] || usage; seeds="$2"; shift 2 ;;
    --all) all=true; shift ;;
    --no-control) control=false; shift ;;
    --subject) [ "$#" -ge 2 ] || usage; chosen+=("$2"); shift 2 ;;
    -h | --help) usage 0 ;;
    -*) echo "unknown option $1" >&2; usage ;;
    *) names+=("${1%.patch}"); shift ;;
  esac
done
case "$seeds" in '' | *[!0-9]*) echo "--seeds takes a number, not '$seeds'" >&2; exit 2 ;; esac

dir=crates/idempotency-check/mutations
if [ "${#names[@]}" -eq 0 ]; then
  for patch in "$dir"/*.patch; do
    [ -e "$patch" ] || continue
    name="$(basename "$patch")"
    names+=("${name%.patch}")
  done
fi
[ "${#names[@]}" -gt 0 ] || { echo "no patches in $dir" >&2; exit 2; }
for name in "${names[@]}"; do
  [ -f "$dir/$name.patch" ] || { echo "no patch $dir/$name.patch" >&2; exit 2; }
done

# shellcheck source=scripts/services.sh
source scripts/services.sh
ensure_services

started=$SECONDS
meta="$(cargo metadata --no-deps --format-version 1)"
target="$(python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])' <<<"$meta")"
# The names the workspace's own artifacts carry (packages, and crates with `_`).
mapfile -t own < <(python3 -c '
import json, sys
names = set()
for p in json.load(sys.stdin)["packages"]:
    names.add(p["name"])
    for t in p["targets"]:
        names.add(t["name"])
for n in sorted(names):
    print(n)
    print(n.replace("-", "_"))' <<<"$meta" | sort -u)

mutants="$target/mutations"
logs="$mutants/logs"
rm -rf "$mutants"
mkdir -p "$mutants/debug" "$logs"
# The caller's dependencies, by hard links; none of the workspace's own artifacts (built here
# afresh, they must not be written through a link) and no executables.
for sub in deps build .fingerprint; do
  if [ -d "$target/debug/$sub" ]; then
    cp -al "$target/debug/$sub" "$mutants/debug/$sub"
    for n in "${own[@]}"; do
      find "$mutants/debug/$sub" -maxdepth 1 \( -name "$n-*" -o -name "lib$n-*" -o -name "$n" \) \
        -exec rm -rf {} +
    done
  fi
done
if [ -d "$mutants/debug/deps" ]; then
  find "$mutants/debug/deps" -maxdepth 1 -type f -perm -u+x ! -name '*.so' -delete
fi

work="$(mktemp -d)"
mkdir "$work/tmp" # the checker's SQLite files (TMPDIR), removed with the rest
trees=()
cleanup() {
  local tree
  for tree in "${trees[@]}"; do
    git -C "$root" worktree remove --force "$tree" >/dev/null 2>&1 || true
  done
  git -C "$root" worktree prune
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A worktree of HEAD at $work/$1, with patch $2 applied when given.
worktree() {
  local tree="$work/$1"
  git -C "$root" worktree add --quiet --detach "$tree" HEAD
  trees+=("$tree")
  if [ -n "${2:-}" ]; then
    git -C "$tree" apply --check "$root/$2" && git -C "$tree" apply "$root/$2"
  fi
}

# Builds the checker in worktree $1 and copies it to $work/$1.bin.
build() {
  local log="$logs/$1.build.log"
  if (cd "$work/$1" && CARGO_TARGET_DIR="$mutants" cargo build --quiet -p idempotency-check) \
    >"$log" 2>&1; then
    cp "$mutants/debug/idempotency-check" "$work/$1.bin"
  else
    tail -n 30 "$log" >&2
    return 1
  fi
}

# Runs checker $1 on seed $2 and subject $3 (output in $4); prints ok, fail or error.
run() {
  local code=0
  (cd "$work" && TMPDIR="$work/tmp" "$1" --seed "$2" --subject "$3") >"$4" 2>&1 || code=$?
  case "$code" in
    0) echo ok ;;
    1) echo fail ;;
    *) echo error ;;
  esac
}

# The invariants the history in log $1 broke, comma-separated.
broken() {
  sed -n 's/^  VIOLATION \([a-z-]*\).*/\1/p' "$1" | sort -u | paste -sd, - | sed 's/,/, /g'
}

if $control; then
  echo "building the control (HEAD, no patch)" >&2
  worktree control
  build control || { echo "the control does not build" >&2; exit 2; }
  git -C "$root" worktree remove --force "$work/control"
fi

header='| defect class | patch | subject | found by | seeds | same seed, no patch |
|---|---|---|---|---:|---|'
rows=("$header")
missed=0
printf '%s\n' "$header"
for name in "${names[@]}"; do
  patch="$dir/$name.patch"
  # The patch's header: `# <class>: <how it is put back>`, then `# subjects: ...`.
  class="$(sed -n '1s/^# \([^:]*\):.*/\1/p' "$patch")"
  if [ "${#chosen[@]}" -gt 0 ]; then
    subjects=("${chosen[@]}")
  else
    read -r -a subjects <<<"$(sed -n 's/^# subjects: *//p' "$patch" | head -n 1)"
  fi
  [ "${#subjects[@]}" -gt 0 ] || { echo "$patch names no subjects (# subjects: ...)" >&2; exit 2; }
  echo "[$name] applying and building" >&2
  if ! worktree "$name" "$patch" >"$logs/$name.apply.log" 2>&1; then
    cat "$logs/$name.apply.log" >&2
    row="| $class | \`$name\` | | | does not apply | |"
    rows+=("$row"); printf '%s\n' "$row"; missed=$((missed + 1)); continue
  fi
  if ! build "$name"; then
    row="| $class | \`$name\` | | | does not build | |"
    rows+=("$row"); printf '%s\n' "$row"; missed=$((missed + 1)); continue
  fi
  caught=false
  for subject in "${subjects[@]}"; do
    first="" invariants="" failed=()
    for ((seed = 1; seed <= seeds; seed++)); do
      log="$logs/$name.$subject.seed$seed.log"
      result="$(run "$work/$name.bin" "$seed" "$subject" "$log")"
      echo "[$name] seed $seed $subject: $result" >&2
      case "$result" in
        ok) rm -f "$log" ;;
        fail)
          failed+=("$seed")
          if [ -z "$first" ]; then
            first=$seed
            invariants="$(broken "$log")"
            $all || break
          fi
          ;;
        *)
          tail -n 20 "$log" >&2
          echo "seed $seed $subject: the run could not be made (log: $log)" >&2
          exit 2
          ;;
      esac
    done
    if [ -z "$first" ]; then
      found="not found in $seeds"
      verdict=""
    else
      caught=true
      found="$first"
      $all && found="$first (${#failed[@]} of $seeds: ${failed[*]})"
      verdict=""
      if $control; then
        verdict="$(run "$work/control.bin" "$first" "$subject" "$logs/$name.$subject.control.log")"
        if [ "$verdict" = fail ]; then
          verdict="fail: $(broken "$logs/$name.$subject.control.log")"
        fi
      fi
    fi
    row="| $class | \`$name\` | \`$subject\` | ${invariants:+\`${invariants//, /\`, \`}\`} | $found | $verdict |"
    rows+=("$row")
    printf '%s\n' "$row"
  done
  $caught || missed=$((missed + 1))
  git -C "$root" worktree remove --force "$work/$name"
done

elapsed=$((SECONDS - started))
echo "${#names[@]} patches, seeds 1..$seeds: $((elapsed / 60)) min $((elapsed % 60)) s" >&2
printf '%s\n' "${rows[@]}" >"$logs/table.md"
echo "table: $logs/table.md; histories that broke an invariant: $logs" >&2
[ "$missed" -eq 0 ]
