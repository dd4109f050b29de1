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
# Three more passes, split as the first three, run against a third gateway with
# Microsoft Entra ID callers on (contract section 5), pointed at scripts/oidc_provider.py:
# a local OpenID provider on loopback (discovery, JWKS, a client credentials token
# endpoint) signing with a committed test key (tests/data/oidc). The tokens schemathesis
# sends are that provider's, fetched like a client fetches them; the gateway verifies them
# against the JWKS it discovered. API keys are on beside Entra ID: schemathesis 4.32.5
# derives a credential to remove or forge only from `http` and `apiKey` schemes, so against
# a document declaring `openIdConnect` alone its ignored_auth check would probe nothing;
# with `bearer` beside `entra` it removes the Entra token and forges another, and must get
# 401 each time (tried: a gateway built to let a tokenless request in passed against the
# Entra-only document and failed against this one). The document's `entra` scheme is checked to be OpenID Connect with the
# provider's discovery URL (the Entra-only document, `entra` alone, is
# tests/api/openapi.rs's and src/http/openapi.rs's).
#
# Schema-valid data refused with 400 fails every pass: scripts/schemathesis.toml names
# scripts/schemathesis_hooks.py, which drops such a 400 only where a send breaks a rule JSON
# Schema cannot state (listed there, and why), judged by the problems the answer lists.
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
BINARY="${CARGO_TARGET_DIR:-target}/debug/sendgate"

WORK=$(mktemp -d)
PID=""
OPEN_PID=""
ENTRA_PID=""
OIDC_PID=""
cleanup() {
    for pid in $PID $OPEN_PID $ENTRA_PID $OIDC_PID; do
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

# The Entra ID gateway: its provider first (one test key, two applications and their
# app roles, as an Entra ID app registration assigns them), then the gateway pointed at it.
TENANT=11111111-2222-3333-4444-555555555555
AUDIENCE=api://sendgate
ENTRA_ADMIN_APP=aaaaaaaa-0000-0000-0000-00000000000a
ENTRA_SENDER_APP=aaaaaaaa-0000-0000-0000-00000000000b
echo "-- starting the OpenID provider (log: $WORK/oidc.log)"
"$VENV/bin/python" scripts/oidc_provider.py --key tests/data/oidc/key-a.der --kid key-a \
    --tenant "$TENANT" --audience "$AUDIENCE" --ready-file "$WORK/oidc.authority" \
    --app "$ENTRA_ADMIN_APP=Sendgate.Admin" --app "$ENTRA_SENDER_APP=Sendgate.Sender" \
    2>"$WORK/oidc.log" &
OIDC_PID=$!
for _ in $(seq 1 100); do
    [ -s "$WORK/oidc.authority" ] && break
    kill -0 "$OIDC_PID" 2>/dev/null || break
    sleep 0.1
done
[ -s "$WORK/oidc.authority" ] || { cat "$WORK/oidc.log"; echo "schemathesis: the OpenID provider did not start"; exit 1; }
AUTHORITY=$(cat "$WORK/oidc.authority")
# A client credentials grant, as an application asks Entra ID for a token to this API.
entra_token() {
    curl -fsS "$AUTHORITY/$TENANT/oauth2/v2.0/token" -d grant_type=client_credentials \
        -d "client_id=$1" --data-urlencode "scope=$AUDIENCE/.default" |
        "$VENV/bin/python" -c 'import json, sys; print(json.load(sys.stdin)["access_token"])'
}
ENTRA_ADMIN_TOKEN=$(entra_token "$ENTRA_ADMIN_APP")
ENTRA_SENDER_TOKEN=$(entra_token "$ENTRA_SENDER_APP")
# The sender application has an [[apps]] entry (the queue `requests`, a tenant of its own);
# the admin application none: named by its id, every queue (contract section 5). The key
# is there so the document declares `bearer` beside `entra` (see above); its token is
# never sent.
{
    key entra-unused-key "$(token)" sender
    printf '[[apps]]\nname = "fuzz-sender-app"\napp_id = "%s"\nqueues = ["requests"]\ntenant = "apps"\n' \
        "$ENTRA_SENDER_APP"
} >"$WORK/entra-keys.toml"
ENTRA_PORT=$(free_port)
ENTRA_BASE="http://127.0.0.1:$ENTRA_PORT"
start_gateway sendgate-entra "$ENTRA_PORT" SENDGATE_API_KEYS_FILE="$WORK/entra-keys.toml" \
    SENDGATE_ENTRA_TENANT_ID="$TENANT" SENDGATE_ENTRA_AUDIENCE="$AUDIENCE" \
    SENDGATE_ENTRA_AUTHORITY="$AUTHORITY" \
    SENDGATE_ENTRA_ALLOWED_APPS="$ENTRA_ADMIN_APP,$ENTRA_SENDER_APP"
ENTRA_PID=$STARTED
# Ready does not wait for the keys (fetched in the background): a send with the sender's
# token is 201 once the gateway has discovered the provider and fetched its JWKS.
entra_ready=0
for _ in $(seq 1 100); do
    status=$(curl -sS -o /dev/null -w '%{http_code}' -X POST "$ENTRA_BASE/v1/queues/requests/messages" \
        -H "Authorization: Bearer $ENTRA_SENDER_TOKEN" -H 'Content-Type: application/json' -d '{}' || true)
    if [ "$status" = 201 ]; then entra_ready=1; break; fi
    sleep 0.1
done
if [ "$entra_ready" -ne 1 ]; then
    echo "schemathesis: the Entra ID gateway never accepted the provider's token (last: $status)"
    failed=1
fi
if ! curl -fsS -o "$WORK/entra.json" "$ENTRA_BASE/openapi.json"; then
    echo "schemathesis: the Entra ID gateway did not serve its document"
    failed=1
fi
# The document names the provider as an OpenID Connect scheme, required beside `bearer`,
# and the discovery URL it names is the one the gateway read.
if ! "$VENV/bin/python" - "$WORK/entra.json" "$AUTHORITY/$TENANT/v2.0/.well-known/openid-configuration" <<'PY'
import json, sys, urllib.request
doc = json.load(open(sys.argv[1]))
entra = doc["components"]["securitySchemes"]["entra"]
assert entra["type"] == "openIdConnect", entra
assert entra["openIdConnectUrl"] == sys.argv[2], entra
assert doc["security"] == [{"bearer": []}, {"entra": []}], doc["security"]
assert json.load(urllib.request.urlopen(sys.argv[2]))["jwks_uri"]
PY
then
    echo "schemathesis: the Entra ID gateway's document does not declare its OpenID Connect scheme"
    failed=1
fi
ENTRA_RUN=("${SCHEMATHESIS[@]}")
ENTRA_RUN[4]="$ENTRA_BASE/openapi.json"
echo "-- schemathesis: Entra ID, every route but POST /admin/drain and the breakers, as Sendgate.Admin"
"${ENTRA_RUN[@]}" -H "Authorization: Bearer $ENTRA_ADMIN_TOKEN" \
    --exclude-path /admin/drain --exclude-path '/admin/breakers/{backend}' || failed=1
echo "-- schemathesis: Entra ID, POST /admin/drain, /health/detailed, /metrics as Sendgate.Sender (403)"
"${ENTRA_RUN[@]}" -H "Authorization: Bearer $ENTRA_SENDER_TOKEN" \
    --include-path /admin/drain --include-path /health/detailed --include-path /metrics || failed=1
echo "-- schemathesis: Entra ID, POST /admin/breakers/{backend} as Sendgate.Admin"
"${ENTRA_RUN[@]}" -H "Authorization: Bearer $ENTRA_ADMIN_TOKEN" \
    --include-path '/admin/breakers/{backend}' || failed=1
if ! kill -0 "$ENTRA_PID" 2>/dev/null; then
    echo "schemathesis: the Entra ID gateway exited during the run"
    failed=1
fi

if ! kill -0 "$PID" 2>/dev/null; then
    echo "schemathesis: the gateway exited during the run"
    failed=1
fi
if [ "$failed" -ne 0 ]; then
    for name in sendgate sendgate-open sendgate-entra oidc; do
        [ -f "$WORK/$name.log" ] || continue
        echo "-- $name log (last 40 lines)"
        tail -n 40 "$WORK/$name.log"
    done
    echo "schemathesis: FAILED"
    exit 1
fi
echo "schemathesis: ok"
