#!/usr/bin/env bash
# Every scenario of both reference documents, with curl, against a running demo.
# Each step asserts the status, body fields and headers; the script stops at the first mismatch
# with a non-zero exit code. Keys are unique per run, so it can run again and again.
#
#   demo/scenarios.sh                      # against http://127.0.0.1:8080
#   BASE_URL=http://127.0.0.1:18080 demo/scenarios.sh
set -euo pipefail

BASE_URL="${BASE_URL:-${1:-http://127.0.0.1:8080}}"
RUN="$(date +%s%N)"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
STEP=0

uuid() { python3 -c 'import uuid; print(uuid.uuid4())'; }

fail() {
  printf '\nFAIL [%s] %s\n  status: %s\n  headers:\n%s\n  body: %s\n' "$STEP" "$*" "$STATUS" \
    "$(sed 's/^/    /' "$WORK/headers")" "$BODY" >&2
  exit 1
}

# req METHOD PATH [BODY] [-H header ...]: sets STATUS and BODY (headers in $WORK/headers).
req() {
  local method=$1 path=$2 body=${3:-}
  shift 2; [ $# -gt 0 ] && shift
  local args=(-s -o "$WORK/body" -D "$WORK/headers" -w '%{http_code}' -X "$method" "$BASE_URL$path")
  [ -n "$body" ] && args+=(-H 'Content-Type: application/json' --data-binary "$body")
  STATUS=$(curl "${args[@]}" "$@") || fail "curl could not reach $BASE_URL$path"
  BODY=$(cat "$WORK/body")
}

step() { STEP="$*"; printf '%-80s ' "$*"; }
ok() { printf 'ok\n'; }

expect_status() { [ "$STATUS" = "$1" ] || fail "expected status $1"; }

# json EXPR: evaluates a Python expression over the parsed body `b`.
json() { python3 -c 'import json,sys; b=json.loads(sys.argv[1]); print(eval(sys.argv[2]))' "$BODY" "$1" 2>/dev/null; }
expect_json() { local got; got=$(json "$1") || fail "body is not JSON"; [ "$got" = "$2" ] || fail "$1 = '$got', expected '$2'"; }

header() { grep -i "^$1:" "$WORK/headers" | head -n1 | cut -d: -f2- | tr -d ' \r'; }
expect_header() { [ "$(header "$1")" = "$2" ] || fail "header $1 = '$(header "$1")', expected '$2'"; }
expect_no_header() { [ -z "$(header "$1")" ] || fail "unexpected header $1"; }

expect_problem() { # STATUS TYPE-SLUG
  expect_status "$1"
  expect_header content-type application/problem+json
  expect_json "b['type'].rsplit('/', 1)[1]" "$2"
}

pay() { req POST /api/payments "$2" -H "Idempotency-Key: $1" "${@:3}"; }

echo "scenarios against $BASE_URL (run $RUN)"

# ---------------------------------------------------------------- reference 001: payments
K1="demo-1-$RUN"
step "payment: first request creates it (201 CONFIRMED)"
pay "$K1" '{"orderId": "o-1", "recipient": "alice", "amount": 100.00}'
expect_status 201; expect_json "b['status']" CONFIRMED; expect_json "b['amount']" 100.00
expect_no_header idempotent-replayed
PAYMENT_ID=$(json "b['paymentId']"); ok

step "payment: duplicate replays the same paymentId"
pay "$K1" '{"orderId": "o-1", "recipient": "alice", "amount": 100.00}'
expect_status 201; expect_json "b['paymentId']" "$PAYMENT_ID"; expect_header idempotent-replayed true; ok

step "payment: same payload spelled differently still replays"
pay "$K1" '{ "amount": "100", "recipient": "alice", "orderId": "o-1" }'
expect_status 201; expect_json "b['paymentId']" "$PAYMENT_ID"; expect_header idempotent-replayed true; ok

step "payment: same key, different payload: 422 (IETF draft; reference 001 says 409)"
pay "$K1" '{"orderId": "o-1", "recipient": "alice", "amount": 200.00}'
expect_problem 422 idempotency-key-reused; ok

K2="demo-2-$RUN"
step "payment: over the balance is rejected (422 INSUFFICIENT_FUNDS)"
pay "$K2" '{"orderId": "o-2", "recipient": "alice", "amount": 5000.00}'
expect_problem 422 request-rejected; expect_json "b['code']" INSUFFICIENT_FUNDS
expect_json "b['details']['requestedAmount']" 5000.00; expect_json "b['details']['availableBalance']" 1000.00
REJECTION="$BODY"; ok

step "payment: the rejection is replayed identically"
pay "$K2" '{"orderId": "o-2", "recipient": "alice", "amount": 5000.00}'
expect_problem 422 request-rejected; expect_header idempotent-replayed true
[ "$BODY" = "$REJECTION" ] || fail "the replayed rejection differs"; ok

K3="demo-3-$RUN"
step "payment: FAIL_ONCE fails with 500 and stores nothing"
pay "$K3" '{"orderId": "o-3", "recipient": "FAIL_ONCE", "amount": 100.00}'
expect_problem 500 internal-error; ok

step "payment: the retry with the same key runs from scratch (201)"
pay "$K3" '{"orderId": "o-3", "recipient": "FAIL_ONCE", "amount": 100.00}'
expect_status 201; expect_json "b['status']" CONFIRMED; expect_no_header idempotent-replayed; ok

step "payment: FAIL_TECH always fails with 500"
pay "demo-4-$RUN" '{"orderId": "o-4", "recipient": "FAIL_TECH", "amount": 1}'
expect_problem 500 internal-error
pay "demo-4-$RUN" '{"orderId": "o-4", "recipient": "FAIL_TECH", "amount": 1}'
expect_problem 500 internal-error; ok

# ---------------------------------------------------------------- reference 001: refunds
step "refund: over the limit is rejected (422 REFUND_LIMIT_EXCEEDED)"
req POST /api/refunds "{\"paymentId\": \"$PAYMENT_ID\", \"amount\": 800.00}" -H "Idempotency-Key: refund-1-$RUN"
expect_problem 422 request-rejected; expect_json "b['code']" REFUND_LIMIT_EXCEEDED; ok

step "refund: the rejection is replayed"
req POST /api/refunds "{\"paymentId\": \"$PAYMENT_ID\", \"amount\": 800.00}" -H "Idempotency-Key: refund-1-$RUN"
expect_problem 422 request-rejected; expect_header idempotent-replayed true; ok

step "refund: within the limit (200 REFUNDED)"
req POST /api/refunds "{\"paymentId\": \"$PAYMENT_ID\", \"amount\": 300.00}" -H "Idempotency-Key: refund-2-$RUN"
expect_status 200; expect_json "b['status']" REFUNDED; REFUND_ID=$(json "b['refundId']"); ok

step "refund: repeated, the same refundId"
req POST /api/refunds "{\"paymentId\": \"$PAYMENT_ID\", \"amount\": 300.00}" -H "Idempotency-Key: refund-2-$RUN"
expect_status 200; expect_json "b['refundId']" "$REFUND_ID"; expect_header idempotent-replayed true; ok

# ---------------------------------------------------------------- the Idempotency-Key header
step "header missing: 400"
req POST /api/payments '{"orderId": "o", "recipient": "a", "amount": 1}'
expect_problem 400 idempotency-key-missing; ok

step "header invalid (space, too long, list): 400"
pay "has space" '{"orderId": "o", "recipient": "a", "amount": 1}'
expect_problem 400 idempotency-key-invalid
pay "$(printf 'k%.0s' $(seq 1 256))" '{"orderId": "o", "recipient": "a", "amount": 1}'
expect_problem 400 idempotency-key-invalid
pay '"a", "b"' '{"orderId": "o", "recipient": "a", "amount": 1}'
expect_problem 400 idempotency-key-invalid; expect_json "b['reason']" list; ok

step "header quoted (Structured Field string) is the same key"
pay "\"$K1\"" '{"orderId": "o-1", "recipient": "alice", "amount": 100.00}'
expect_status 201; expect_json "b['paymentId']" "$PAYMENT_ID"; expect_header idempotent-replayed true; ok

# ---------------------------------------------------------------- bad bodies
step "malformed JSON: 400, nothing stored"
pay "bad-1-$RUN" '{not json'
expect_problem 400 malformed-body; ok

step "invalid amount: 422"
pay "bad-2-$RUN" '{"orderId": "o", "recipient": "a", "amount": -1}'
expect_problem 422 invalid-request; ok

step "oversized body: 413"
BIG=$(python3 -c 'print("{\"orderId\":\"" + "x"*70000 + "\",\"recipient\":\"a\",\"amount\":1}")')
pay "bad-3-$RUN" "$BIG"
expect_problem 413 payload-too-large; ok

# ---------------------------------------------------------------- scoping
step "tenants: the same key under two tenants runs twice"
pay "shared-$RUN" '{"orderId": "o-7", "recipient": "carol", "amount": 42}' -H 'X-Tenant-Id: tenant-a'
expect_status 201; A=$(json "b['paymentId']")
pay "shared-$RUN" '{"orderId": "o-7", "recipient": "carol", "amount": 42}' -H 'X-Tenant-Id: tenant-b'
expect_status 201; expect_no_header idempotent-replayed
[ "$(json "b['paymentId']")" != "$A" ] || fail "tenant B received tenant A's payment"; ok

# ---------------------------------------------------------------- reference 000: charges
CHARGE_KEY=$(uuid)
step "charge: POST /charges with a UUID key (201)"
req POST /charges '{"amountCents": 4900}' -H "Idempotency-Key: $CHARGE_KEY"
expect_status 201; CHARGE=$(json "b['id']"); FIRST="$BODY"; expect_no_header idempotent-replayed; ok

step "charge: repeated, the same body"
req POST /charges '{"amountCents": 4900}' -H "Idempotency-Key: $CHARGE_KEY"
expect_status 201; [ "$BODY" = "$FIRST" ] || fail "different body"; expect_header idempotent-replayed true; ok

step "charge: quoted upper-case UUID is the same key"
req POST /charges '{"amountCents": 4900}' -H "Idempotency-Key: \"${CHARGE_KEY^^}\""
expect_status 201; expect_json "b['id']" "$CHARGE"; expect_header idempotent-replayed true; ok

step "charge: same key, different amount: 422"
req POST /charges '{"amountCents": 5000}' -H "Idempotency-Key: $CHARGE_KEY"
expect_problem 422 idempotency-key-reused; ok

step "charge: a key that is not a UUID: 400"
req POST /charges '{"amountCents": 4900}' -H "Idempotency-Key: demo-1"
expect_problem 400 idempotency-key-invalid; expect_json "b['reason']" not-uuid; ok

step "charge: GET /charges/{id}"
req GET "/charges/$CHARGE"
expect_status 200; expect_json "b['id']" "$CHARGE"; expect_json "b['amountCents']" 4900; ok

step "charge: two overlapping calls, one winner and one replay or 409"
OVERLAP=$(uuid)
for n in 1 2; do
  curl -s -o "$WORK/overlap$n.body" -D "$WORK/overlap$n.headers" -w '%{http_code}' -X POST "$BASE_URL/charges" \
    -H 'Content-Type: application/json' -H "Idempotency-Key: $OVERLAP" --data-binary '{"amountCents": 100}' \
    > "$WORK/overlap$n.status" &
done
wait
fresh=0; others=0
for n in 1 2; do
  s=$(cat "$WORK/overlap$n.status")
  if [ "$s" = 201 ] && ! grep -qi '^idempotent-replayed: true' "$WORK/overlap$n.headers"; then fresh=$((fresh + 1))
  elif [ "$s" = 201 ] || [ "$s" = 409 ]; then others=$((others + 1))
  else STATUS=$s; BODY=$(cat "$WORK/overlap$n.body"); fail "unexpected status for an overlapping call"; fi
done
[ "$fresh" = 1 ] && [ "$others" = 1 ] || { STATUS="$fresh fresh / $others others"; BODY=; fail "expected one winner"; }
ok

step "outbox: ChargeCreated is published (outbox_published_total > 0)"
for _ in $(seq 1 50); do
  req GET /metrics
  PUBLISHED=$(printf '%s\n' "$BODY" | awk '/^outbox_published_total/ {s += $NF} END {print s + 0}')
  [ "${PUBLISHED%.*}" -gt 0 ] && break
  sleep 0.2
done
[ "${PUBLISHED%.*}" -gt 0 ] || fail "no event was published"; ok

# ---------------------------------------------------------------- operations
step "health: 200 UP"
req GET /health
expect_status 200; expect_json "b['status']" UP; expect_json "b['database']" UP; ok

step "metrics: idempotency meters are exposed"
req GET /metrics
expect_status 200
printf '%s\n' "$BODY" | grep -q '^idempotency_replays_total{' || fail "idempotency_replays_total missing"
printf '%s\n' "$BODY" | grep -q '^idempotency_persisted_total{' || fail "idempotency_persisted_total missing"; ok

echo "all scenarios passed"
