#!/usr/bin/env bash
# Make sure headless Chromium and its WebDriver (chromedriver) are installed, from Debian's
# packages, for the status page's browser tests (tests/browser.rs). Idempotent and quick
# when both are there. Run as root (CI and the dev machines are); the tests call it
# themselves too, so `cargo test --test browser` alone works, and they fail (never skip)
# when it cannot install them.
set -euo pipefail

log() { echo "ensure-chromium: $*" >&2; }

if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then
  exit 0
fi

log "installing chromium and chromium-driver"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq chromium chromium-driver >/dev/null

if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then
  exit 0
fi
log "/usr/bin/chromium or /usr/bin/chromedriver is still missing after the install"
exit 1
