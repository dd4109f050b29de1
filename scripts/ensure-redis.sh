#!/usr/bin/env bash
# Make sure the local Redis the tests need (the fleet ledger, issue 14) is installed,
# running and answering on 127.0.0.1:6379. Idempotent and quick when it already answers.
# Run as root (CI and the dev machines are); tests call it themselves, so `cargo test`
# alone works too. Nothing is persisted: the tests' keys are throwaway.
set -euo pipefail

log() { echo "ensure-redis: $*" >&2; }

pong() { [ "$(timeout 5 redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null)" = "PONG" ]; }

if command -v redis-cli >/dev/null 2>&1 && pong; then
  exit 0
fi

if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
  log "installing redis-server"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq redis-server redis-tools >/dev/null
fi

if ! pong; then
  log "starting redis-server on 127.0.0.1:6379"
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
fi

for _ in $(seq 1 50); do
  if pong; then
    exit 0
  fi
  sleep 0.2
done
log "Redis did not answer PING on 127.0.0.1:6379 (see /var/log/redis/ci.log)"
exit 1
