#!/usr/bin/env bash
# The whole test suite, as CI runs it: formatting, lints, then every test.
# Usage: ./scripts/test.sh   (from anywhere inside the repository)
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== services: RabbitMQ with its management plugin"
./scripts/ensure-rabbitmq.sh

echo "== services: Redis (the fleet ledger)"
./scripts/ensure-redis.sh

echo "== browser: headless Chromium and chromedriver (the status page's tests)"
./scripts/ensure-chromium.sh

echo "== deployment lint: checkov (infra/, Dockerfile), hadolint, bicep parse"
./scripts/lint-infra.sh

echo "== cargo fmt --check"
cargo fmt --all -- --check

# --workspace: the server, the client crate (client/), the wire crate (wire/) and the
# fleet protocol's model (model/, ~40 s of exhaustive checks).
echo "== cargo clippy --workspace --all-targets -D warnings"
cargo clippy --workspace --all-targets --quiet -- -D warnings

echo "== cargo deny: licenses, bans (one TLS stack, duplicates), sources"
./scripts/deny.sh

echo "== cargo test --workspace"
mkdir -p target
cargo test --workspace --all-targets --no-fail-fast 2>&1 | tee target/test-output.txt

# The API against its own OpenAPI document (GET /openapi.json), on the real binary.
echo "== schemathesis: every route, every check"
schemathesis_status=0
./scripts/schemathesis.sh || schemathesis_status=$?

# One closing line for the whole run.
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i; if ($(i+1) ~ /^ignored/) s += $i } }
     END { printf "suite: %d passed, %d failed, %d skipped\n", p, f, s }' target/test-output.txt
if [ "$schemathesis_status" -ne 0 ]; then
    echo "schemathesis: FAILED (see above)"
    exit "$schemathesis_status"
fi
