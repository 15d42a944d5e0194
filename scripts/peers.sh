#!/usr/bin/env bash
# Installs the peer libraries the load bench measures first executions against, outside the
# repository, at the versions pinned in crates/idempotency-bench/peers/:
#
#   scripts/peers.sh            # into $PEERS_DIR (default /var/tmp/idempotency-peers)
#
# then `idempotency-bench --only-first --peers "$PEERS_DIR"`. A peer whose toolchain is missing
# (node and npm, python3 with venv) is left out with a message; the bench leaves out a peer that
# is not installed.
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${PEERS_DIR:-/var/tmp/idempotency-peers}"
manifests="$PWD/crates/idempotency-bench/peers"
mkdir -p "$dir"

if command -v node >/dev/null && command -v npm >/dev/null; then
  mkdir -p "$dir/node"
  cp "$manifests/package.json" "$dir/node/package.json"
  (cd "$dir/node" && npm install --no-audit --no-fund --loglevel=error >/dev/null)
  echo "peers: @node-idempotency/core installed in $dir/node"
else
  echo "peers: node or npm not found, @node-idempotency/core left out" >&2
fi

if python3 -m venv --help >/dev/null 2>&1; then
  [ -x "$dir/python/bin/python" ] || python3 -m venv "$dir/python"
  "$dir/python/bin/pip" install -q --disable-pip-version-check -r "$manifests/requirements.txt"
  echo "peers: Powertools for AWS Lambda installed in $dir/python"
else
  echo "peers: python3 with venv not found, Powertools for AWS Lambda left out" >&2
fi
