#!/usr/bin/env bash
# Make sure the local RabbitMQ the tests need is installed, configured, running and ready:
# AMQP on 127.0.0.1:5672 (guest/guest) and the management API on 127.0.0.1:15672.
# Idempotent and quick when everything is already in place. Run as root (CI and the dev
# machines are); tests call it themselves, so `cargo test` alone works too.
set -euo pipefail

log() { echo "ensure-rabbitmq: $*" >&2; }

if ! command -v rabbitmq-server >/dev/null 2>&1; then
  log "installing rabbitmq-server"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq rabbitmq-server curl >/dev/null
fi

conf=/etc/rabbitmq/rabbitmq.conf
changed=0
want() { # key, value: add "key = value" to rabbitmq.conf unless the key is set already
  if ! grep -qE "^\s*$1\s*=" "$conf" 2>/dev/null; then
    # Never glue the new line onto a last line that lacks its newline.
    if [ -s "$conf" ] && [ -n "$(tail -c1 "$conf")" ]; then echo >> "$conf"; fi
    echo "$1 = $2" >> "$conf"
    changed=1
  fi
}
mkdir -p /etc/rabbitmq
touch "$conf"
want listeners.tcp.local 127.0.0.1:5672
want management.tcp.ip 127.0.0.1
want management.tcp.port 15672
# Fresher queue statistics for the admin plane (the default is 5000 ms).
want collect_statistics_interval 1000

running() { timeout 15 rabbitmqctl -q status >/dev/null 2>&1; }

if ! grep -q rabbitmq_management /etc/rabbitmq/enabled_plugins 2>/dev/null; then
  log "enabling rabbitmq_management"
  if running; then
    rabbitmq-plugins -q enable rabbitmq_management >/dev/null
  else
    rabbitmq-plugins -q enable --offline rabbitmq_management >/dev/null
  fi
fi

if running && [ "$changed" = 1 ]; then
  log "restarting RabbitMQ to apply $conf"
  timeout 60 rabbitmqctl -q stop >/dev/null 2>&1 || true
fi
if ! running; then
  log "starting RabbitMQ"
  rabbitmq-server -detached
  # -detached returns before the node has registered; wait until the CLI can reach it.
  for _ in $(seq 1 60); do
    running && break
    sleep 1
  done
fi
timeout 90 rabbitmqctl -q await_startup

for _ in $(seq 1 90); do
  if curl -sf -u guest:guest http://127.0.0.1:15672/api/overview >/dev/null 2>&1; then
    exit 0
  fi
  sleep 1
done
log "the management API did not answer on 127.0.0.1:15672"
exit 1
