#!/usr/bin/env bash
# The dependency policy in deny.toml, as CI runs it from ./scripts/test.sh: licenses
# (allow-list), bans (one TLS stack: no aws-lc, OpenSSL or native-tls; no duplicate crate
# versions beyond the listed exceptions) and sources (crates.io only). Exits non-zero on
# any violation.
#
# Advisories are not checked here: they need the RustSec database from GitHub, which this
# CI machine cannot reach. The other checks read only Cargo.lock and crate sources from
# crates.io.
#
# cargo-deny is installed from crates.io on first use (pinned, --locked), then reused.
#
# Usage: ./scripts/deny.sh   (from anywhere inside the repository)
set -euo pipefail
cd "$(dirname "$0")/.."

# Pinned so that a new cargo-deny release cannot turn CI red (or green) by itself.
VERSION=0.20.2

if [ "$(cargo deny --version 2>/dev/null || true)" != "cargo-deny $VERSION" ]; then
    echo "-- installing cargo-deny $VERSION from crates.io"
    cargo install cargo-deny --version "$VERSION" --locked --quiet
fi

# Not advisories, so no database fetch; cargo metadata may download crate manifests (crates.io).
cargo deny --workspace check licenses bans sources
