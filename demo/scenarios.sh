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

echo "scenarios against $BASE_URL (run $RUN)"

# scenarios API PAYMENTS REFUNDS CHARGES SPELLED_100: every idempotency scenario against one set
# of routes. `/api/*` and `/charges` call `execute` by hand; `/v2/*` are protected by
# IdempotencyLayer alone. SPELLED_100 is the amount 100 spelled another way: the handlers of
# `/api` fingerprint the parsed request (a decimal, so "100" is 100.00); the layer fingerprints
# the body's RFC 8785 form (so 100 is 100.00, but the string "100" is another payload).
scenarios() {
API=$1 PAYMENTS=$2 REFUNDS=$3 CHARGES=$4 SPELLED_100=$5
pay() { req POST "$PAYMENTS" "$2" -H "Idempotency-Key: $1" "${@:3}"; }

# ---------------------------------------------------------------- reference 001: payments
K1="demo-1-$API-$RUN"
step "[$API] payment: first request creates it (201 CONFIRMED)"
pay "$K1" '{"orderId": "o-1", "recipient": "alice", "amount": 100.00}'
expect_status 201; expect_json "b['status']" CONFIRMED; expect_json "b['amount']" 100.00
expect_no_header idempotent-replayed
PAYMENT_ID=$(json "b['paymentId']"); ok

step "[$API] payment: duplicate replays the same paymentId"
pay "$K1" '{"orderId": "o-1", "recipient": "alice", "amount": 100.00}'
expect_status 201; expect_json "b['paymentId']" "$PAYMENT_ID"; expect_header idempotent-replayed true; ok

step "[$API] payment: same payload spelled differently still replays"
pay "$K1" "{ \"amount\": $SPELLED_100, \"recipient\": \"alice\", \"orderId\": \"o-1\" }"
expect_status 201; expect_json "b['paymentId']" "$PAYMENT_ID"; expect_header idempotent-replayed true; ok

step "[$API] payment: same key, different payload: 422 (IETF draft; reference 001 says 409)"
pay "$K1" '{"orderId": "o-1", "recipient": "alice", "amount": 200.00}'
expect_problem 422 idempotency-key-reused; ok

K2="demo-2-$API-$RUN"
step "[$API] payment: over the balance is rejected (422 INSUFFICIENT_FUNDS)"
pay "$K2" '{"orderId": "o-2", "recipient": "alice", "amount": 5000.00}'
expect_problem 422 request-rejected; expect_json "b['code']" INSUFFICIENT_FUNDS
expect_json "b['details']['requestedAmount']" 5000.00; expect_json "b['details']['availableBalance']" 1000.00
REJECTION="$BODY"; ok

step "[$API] payment: the rejection is replayed identically"
pay "$K2" '{"orderId": "o-2", "recipient": "alice", "amount": 5000.00}'
expect_problem 422 request-rejected; expect_header idempotent-replayed true
[ "$BODY" = "$REJECTION" ] || fail "the replayed rejection differs"; ok

K3="demo-3-$API-$RUN"
step "[$API] payment: FAIL_ONCE fails with 500 and stores nothing"
pay "$K3" '{"orderId": "o-3", "recipient": "FAIL_ONCE", "amount": 100.00}'
expect_problem 500 internal-error; ok

step "[$API] payment: the retry with the same key runs from scratch (201)"
pay "$K3" '{"orderId": "o-3", "recipient": "FAIL_ONCE", "amount": 100.00}'
expect_status 201; expect_json "b['status']" CONFIRMED; expect_no_header idempotent-replayed; ok

step "[$API] payment: FAIL_TECH always fails with 500"
pay "demo-4-$API-$RUN" '{"orderId": "o-4", "recipient": "FAIL_TECH", "amount": 1}'
expect_problem 500 internal-error
pay "demo-4-$API-$RUN" '{"orderId": "o-4", "recipient": "FAIL_TECH", "amount": 1}'
expect_problem 500 internal-error; ok

# ---------------------------------------------------------------- reference 001: refunds
step "[$API] refund: over the limit is rejected (422 REFUND_LIMIT_EXCEEDED)"
req POST "$REFUNDS" "{\"paymentId\": \"$PAYMENT_ID\", \"amount\": 800.00}" -H "Idempotency-Key: refund-1-$API-$RUN"
expect_problem 422 request-rejected; expect_json "b['code']" REFUND_LIMIT_EXCEEDED; ok

step "[$API] refund: the rejection is replayed"
req POST "$REFUNDS" "{\"paymentId\": \"$PAYMENT_ID\", \"amount\": 800.00}" -H "Idempotency-Key: refund-1-$API-$RUN"
expect_problem 422 request-rejected; expect_header idempotent-replayed true; ok

step "[$API] refund: within the limit (200 REFUNDED)"
req POST "$REFUNDS" "{\"paymentId\": \"$PAYMENT_ID\", \"amount\": 300.00}" -H "Idempotency-Key: refund-2-$API-$RUN"
expect_status 200; expect_json "b['status']" REFUNDED; REFUND_ID=$(json "b['refundId']"); ok

step "[$API] refund: repeated, the same refundId"
req POST "$REFUNDS" "{\"paymentId\": \"$PAYMENT_ID\", \"amount\": 300.00}" -H "Idempotency-Key: refund-2-$API-$RUN"
expect_status 200; expect_json "b['refundId']" "$REFUND_ID"; expect_header idempotent-replayed true; ok

# ---------------------------------------------------------------- the Idempotency-Key header
step "[$API] header missing: 400"
req POST "$PAYMENTS" '{"orderId": "o", "recipient": "a", "amount": 1}'
expect_problem 400 idempotency-key-missing; ok

step "[$API] header invalid (space, too long, list): 400"
pay "has space" '{"orderId": "o", "recipient": "a", "amount": 1}'
expect_problem 400 idempotency-key-invalid
pay "$(printf 'k%.0s' $(seq 1 256))" '{"orderId": "o", "recipient": "a", "amount": 1}'
expect_problem 400 idempotency-key-invalid
pay '"a", "b"' '{"orderId": "o", "recipient": "a", "amount": 1}'
expect_problem 400 idempotency-key-invalid; expect_json "b['reason']" list; ok

step "[$API] header quoted (Structured Field string) is the same key"
pay "\"$K1\"" '{"orderId": "o-1", "recipient": "alice", "amount": 100.00}'
expect_status 201; expect_json "b['paymentId']" "$PAYMENT_ID"; expect_header idempotent-replayed true; ok

# ---------------------------------------------------------------- bad bodies
step "[$API] malformed JSON: 400, nothing runs"
pay "bad-1-$API-$RUN" '{not json'
expect_problem 400 invalid-request-body; ok

step "[$API] malformed JSON stored nothing: the corrected body under its key runs: 201"
pay "bad-1-$API-$RUN" '{"orderId": "o-fixed", "recipient": "alice", "amount": 5}'
expect_status 201; expect_no_header idempotent-replayed; ok

step "[$API] invalid amount: 422"
pay "bad-2-$API-$RUN" '{"orderId": "o", "recipient": "a", "amount": -1}'
expect_problem 422 invalid-request; ok

step "[$API] oversized body: 413"
BIG=$(python3 -c 'print("{\"orderId\":\"" + "x"*70000 + "\",\"recipient\":\"a\",\"amount\":1}")')
pay "bad-3-$API-$RUN" "$BIG"
expect_problem 413 payload-too-large; ok

# ---------------------------------------------------------------- scoping
step "[$API] tenants: the same key under two tenants runs twice"
pay "shared-$API-$RUN" '{"orderId": "o-7", "recipient": "carol", "amount": 42}' -H 'X-Tenant-Id: tenant-a'
expect_status 201; A=$(json "b['paymentId']")
pay "shared-$API-$RUN" '{"orderId": "o-7", "recipient": "carol", "amount": 42}' -H 'X-Tenant-Id: tenant-b'
expect_status 201; expect_no_header idempotent-replayed
[ "$(json "b['paymentId']")" != "$A" ] || fail "tenant B received tenant A's payment"; ok

# ---------------------------------------------------------------- reference 000: charges
CHARGE_KEY=$(uuid)
step "[$API] charge: POST /charges with a UUID key (201)"
req POST "$CHARGES" '{"amountCents": 4900}' -H "Idempotency-Key: $CHARGE_KEY"
expect_status 201; CHARGE=$(json "b['id']"); FIRST="$BODY"; expect_no_header idempotent-replayed; ok

step "[$API] charge: repeated, the same body"
req POST "$CHARGES" '{"amountCents": 4900}' -H "Idempotency-Key: $CHARGE_KEY"
expect_status 201; [ "$BODY" = "$FIRST" ] || fail "different body"; expect_header idempotent-replayed true; ok

step "[$API] charge: quoted upper-case UUID is the same key"
req POST "$CHARGES" '{"amountCents": 4900}' -H "Idempotency-Key: \"${CHARGE_KEY^^}\""
expect_status 201; expect_json "b['id']" "$CHARGE"; expect_header idempotent-replayed true; ok

step "[$API] charge: same key, different amount: 422"
req POST "$CHARGES" '{"amountCents": 5000}' -H "Idempotency-Key: $CHARGE_KEY"
expect_problem 422 idempotency-key-reused; ok

step "[$API] charge: a key that is not a UUID: 400"
req POST "$CHARGES" '{"amountCents": 4900}' -H "Idempotency-Key: demo-1"
expect_problem 400 idempotency-key-invalid; expect_json "b['reason']" not-uuid; ok

step "[$API] charge: GET /charges/{id}"
req GET "/charges/$CHARGE"
expect_status 200; expect_json "b['id']" "$CHARGE"; expect_json "b['amountCents']" 4900; ok

step "[$API] charge: two overlapping calls, one winner and one replay or 409"
OVERLAP=$(uuid)
for n in 1 2; do
  curl -s -o "$WORK/overlap$n.body" -D "$WORK/overlap$n.headers" -w '%{http_code}' -X POST "$BASE_URL$CHARGES" \
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

}

scenarios api /api/payments /api/refunds /charges '"100"'
scenarios v2 /v2/payments /v2/refunds /v2/charges 100

# ---------------------------------------------------------------- the layer's optimistic mode
# `/v2/payments/optimistic`: the same payment behind `IdempotencyLayer::optimistic()` (the
# handler first, then the record in one insert, in the same transaction).
OPT="/v2/payments/optimistic"
K_OPT="demo-opt-$RUN"
step "[optimistic] payment: first request creates it (201 CONFIRMED)"
req POST "$OPT" '{"orderId": "o-1", "recipient": "alice", "amount": 100.00}' -H "Idempotency-Key: $K_OPT"
expect_status 201; expect_json "b['status']" CONFIRMED; expect_no_header idempotent-replayed
OPT_ID=$(json "b['paymentId']"); ok

step "[optimistic] payment: duplicate replays the same paymentId"
req POST "$OPT" '{ "amount": 100, "recipient": "alice", "orderId": "o-1" }' -H "Idempotency-Key: $K_OPT"
expect_status 201; expect_json "b['paymentId']" "$OPT_ID"; expect_header idempotent-replayed true; ok

step "[optimistic] payment: same key, different payload: 422"
req POST "$OPT" '{"orderId": "o-1", "recipient": "alice", "amount": 200.00}' -H "Idempotency-Key: $K_OPT"
expect_problem 422 idempotency-key-reused; ok

step "[optimistic] payment: over the balance is rejected, and the rejection replayed"
req POST "$OPT" '{"orderId": "o-2", "recipient": "alice", "amount": 5000.00}' -H "Idempotency-Key: $K_OPT-2"
expect_problem 422 request-rejected; expect_json "b['code']" INSUFFICIENT_FUNDS
req POST "$OPT" '{"orderId": "o-2", "recipient": "alice", "amount": 5000.00}' -H "Idempotency-Key: $K_OPT-2"
expect_problem 422 request-rejected; expect_header idempotent-replayed true; ok

step "[optimistic] payment: FAIL_ONCE fails with 500, the retry runs (201)"
req POST "$OPT" '{"orderId": "o-3", "recipient": "FAIL_ONCE", "amount": 1}' -H "Idempotency-Key: $K_OPT-3"
expect_problem 500 internal-error
req POST "$OPT" '{"orderId": "o-3", "recipient": "FAIL_ONCE", "amount": 1}' -H "Idempotency-Key: $K_OPT-3"
expect_status 201; expect_no_header idempotent-replayed; ok

# ---------------------------------------------------------------- request identity
DEPOSIT_KEY="deposit-$RUN"
step "[v2] deposit: account A, 201 with the deposit"
req POST "/v2/accounts/A/deposits?note=rent" '{"amount": 25}' -H "Idempotency-Key: $DEPOSIT_KEY"
expect_status 201; expect_json "b['account']" A; expect_json "b['amount']" 25.00; expect_json "b['note']" rent; ok

step "[v2] deposit: the same key and body for account A again: replayed"
req POST "/v2/accounts/A/deposits?note=rent" '{"amount": 25}' -H "Idempotency-Key: $DEPOSIT_KEY"
expect_status 201; expect_header idempotent-replayed true; expect_json "b['account']" A; ok

step "[v2] deposit: the same key and body for account B: 422 (another resource)"
req POST "/v2/accounts/B/deposits?note=rent" '{"amount": 25}' -H "Idempotency-Key: $DEPOSIT_KEY"
expect_problem 422 idempotency-key-reused; ok

step "[v2] deposit: the same key and body with another note: 422"
req POST "/v2/accounts/A/deposits?note=food" '{"amount": 25}' -H "Idempotency-Key: $DEPOSIT_KEY"
expect_problem 422 idempotency-key-reused; ok

step "outbox: ChargeCreated is published (outbox_published_total > 0)"
for _ in $(seq 1 50); do
  req GET /metrics
  PUBLISHED=$(printf '%s\n' "$BODY" | awk '/^outbox_published_total/ {s += $NF} END {print s + 0}')
  [ "${PUBLISHED%.*}" -gt 0 ] && break
  sleep 0.2
done
[ "${PUBLISHED%.*}" -gt 0 ] || fail "no event was published"; ok

# ---------------------------------------------------------------- operations
step "health: readiness 200 UP, liveness 200 UP"
req GET /health/ready
expect_status 200; expect_json "b['status']" UP; expect_json "b['database']['status']" UP
expect_json "b['outbox']['status']" UP; ok
req GET /health/live
expect_status 200; expect_json "b['status']" UP; ok
req GET /health
expect_status 200; expect_json "b['status']" UP; ok

step "metrics: idempotency meters are exposed"
req GET /metrics
expect_status 200
# A here-string, not printf | grep -q: under pipefail, grep leaving at the first match fails the
# pipeline with printf's SIGPIPE (141) when the body is still being written.
grep -q '^idempotency_replays_total{' <<<"$BODY" || fail "idempotency_replays_total missing"
grep -q '^idempotency_persisted_total{' <<<"$BODY" || fail "idempotency_persisted_total missing"; ok

echo "all scenarios passed"
