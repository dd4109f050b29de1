#!/usr/bin/env bash
# The API against its own OpenAPI document: schemathesis with every check (server
# errors, status codes, content types, response schemas and headers, negative and
# positive data, missing headers, unsupported methods, ignored auth, ...) on every route
# of GET /openapi.json, against the real binary on the embedded backend. Exits non-zero
# on any finding. Run by ./scripts/test.sh; alone: ./scripts/schemathesis.sh
#
# The first gateway runs with API keys (so 401 and 403 answer), a backlog ceiling of 20 read
# before every send (so 429 queue_full answers once 20 messages are stored) and a 64-byte
# body limit (so 413 answers), on a free port, in a temporary data directory.
#
# POST /admin/drain is tested in a second pass with a key that has only the sender role
# (with /health/detailed and /metrics, so their 403 answers too): with an admin key the
# first 202 drains the gateway and the process exits (nothing is in flight), so every
# later request would fail to connect. That 202 is tested in tests/api/admin.rs.
#
# POST /admin/breakers/{backend} runs in a third pass: its `open` holds the primary's
# breaker open, after which every send is a 503 backend_unavailable (a server-error finding
# for the send route). Its effect on sends is tested in tests/api/settings.rs.
#
# A fourth pass runs against a second gateway, the default open mode (no keys file, on
# loopback), with every check too: its document declares no security requirement, so
# `ignored_auth` must find no route that asks for a token it does not check (POST
# /admin/drain and the breakers left out, as above).
#
# schemathesis lives in a project-local virtualenv (.venv-schemathesis/, git- and
# docker-ignored), installed from PyPI on first use, pinned.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=.venv-schemathesis
PACKAGES=("schemathesis==4.32.5")
# Test cases per operation and phase; SCHEMATHESIS_MAX_EXAMPLES overrides, and
# SCHEMATHESIS_EXTRA adds options (e.g. "--report har --report-dir /tmp/st").
EXAMPLES="${SCHEMATHESIS_MAX_EXAMPLES:-200}"

. scripts/pyvenv.sh
ensure_venv "$VENV" "${PACKAGES[@]}"

echo "-- building sendgate"
cargo build --quiet --bin sendgate
BINARY=target/debug/sendgate

WORK=$(mktemp -d)
PID=""
OPEN_PID=""
cleanup() {
    for pid in $PID $OPEN_PID; do
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    rm -rf "$WORK"
}
trap cleanup EXIT

token() { "$VENV/bin/python" -c 'import secrets; print(secrets.token_urlsafe(32))'; }
ADMIN_TOKEN=$(token)
SENDER_TOKEN=$(token)
key() { # name token role
    printf '[[keys]]\nname = "%s"\nsha256 = "%s"\nroles = ["%s"]\nqueues = ["*"]\n' \
        "$1" "$(printf '%s' "$2" | sha256sum | cut -d' ' -f1)" "$3"
}
{ key fuzz-admin "$ADMIN_TOKEN" admin; key fuzz-sender "$SENDER_TOKEN" sender; } >"$WORK/keys.toml"

free_port() {
    "$VENV/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
# A gateway on the embedded backend: start_gateway NAME PORT [VAR=value...]; its pid in
# $STARTED, its log in $WORK/NAME.log, its data in $WORK/NAME-data. Returns once it is
# ready; exits with its log if it is not.
start_gateway() {
    local name=$1 port=$2
    shift 2
    echo "-- starting sendgate ($name) on http://127.0.0.1:$port (log: $WORK/$name.log)"
    env -i PATH="$PATH" \
        SENDGATE_LISTEN="127.0.0.1:$port" \
        SENDGATE_BACKEND=embedded \
        SENDGATE_DATA_DIR="$WORK/$name-data" \
        SERVICEBUS_SEND_MAX_QUEUE_DEPTH=20 \
        SENDGATE_DEPTH_TTL_MS=0 \
        SENDGATE_MAX_BODY_BYTES=64 \
        "$@" \
        "$BINARY" serve >"$WORK/$name.log" 2>&1 &
    STARTED=$!
    for _ in $(seq 1 200); do
        if curl -fsS -o /dev/null "http://127.0.0.1:$port/health/ready" 2>/dev/null; then
            return 0
        fi
        if ! kill -0 "$STARTED" 2>/dev/null; then break; fi
        sleep 0.1
    done
    kill "$STARTED" 2>/dev/null || true
    tail -n 40 "$WORK/$name.log"
    echo "schemathesis: the gateway ($name) did not start"
    exit 1
}

PORT=$(free_port)
BASE="http://127.0.0.1:$PORT"
start_gateway sendgate "$PORT" SENDGATE_API_KEYS_FILE="$WORK/keys.toml"
PID=$STARTED

SCHEMATHESIS=("$VENV/bin/schemathesis" --config-file scripts/schemathesis.toml run
    "$BASE/openapi.json" --checks all --max-examples "$EXAMPLES" --seed 1
    --no-color --warnings off ${SCHEMATHESIS_EXTRA:-})

failed=0
echo "-- schemathesis: every route but POST /admin/drain and the breakers, as an admin"
"${SCHEMATHESIS[@]}" -H "Authorization: Bearer $ADMIN_TOKEN" \
    --exclude-path /admin/drain --exclude-path '/admin/breakers/{backend}' || failed=1

echo "-- schemathesis: POST /admin/drain, /health/detailed, /metrics as a sender (403)"
"${SCHEMATHESIS[@]}" -H "Authorization: Bearer $SENDER_TOKEN" \
    --include-path /admin/drain --include-path /health/detailed --include-path /metrics || failed=1

echo "-- schemathesis: POST /admin/breakers/{backend}, as an admin (it may hold the breaker open)"
"${SCHEMATHESIS[@]}" -H "Authorization: Bearer $ADMIN_TOKEN" \
    --include-path '/admin/breakers/{backend}' || failed=1

OPEN_PORT=$(free_port)
OPEN_BASE="http://127.0.0.1:$OPEN_PORT"
start_gateway sendgate-open "$OPEN_PORT"
OPEN_PID=$STARTED
if ! curl -fsS -o "$WORK/open.json" "$OPEN_BASE/openapi.json"; then
    echo "schemathesis: the open gateway did not serve its document"
    failed=1
fi
if grep -q -e '"security"' -e '"401"' "$WORK/open.json"; then
    echo "schemathesis: the open gateway's document declares a security requirement or a 401"
    failed=1
fi
echo "-- schemathesis: every route but POST /admin/drain and the breakers, open mode, no token"
OPEN_RUN=("${SCHEMATHESIS[@]}")
# The URL follows `run`: checked, so an option put before it cannot fuzz the keys gateway.
[ "${OPEN_RUN[4]}" = "$BASE/openapi.json" ] || { echo "schemathesis.sh: the URL moved"; exit 1; }
OPEN_RUN[4]="$OPEN_BASE/openapi.json"
"${OPEN_RUN[@]}" --exclude-path /admin/drain --exclude-path '/admin/breakers/{backend}' || failed=1
if ! kill -0 "$OPEN_PID" 2>/dev/null; then
    echo "schemathesis: the open gateway exited during the run"
    tail -n 40 "$WORK/sendgate-open.log"
    failed=1
fi

if ! kill -0 "$PID" 2>/dev/null; then
    echo "schemathesis: the gateway exited during the run"
    failed=1
fi
if [ "$failed" -ne 0 ]; then
    echo "-- gateway log (last 40 lines)"
    tail -n 40 "$WORK/sendgate.log"
    echo "schemathesis: FAILED"
    exit 1
fi
echo "schemathesis: ok"
