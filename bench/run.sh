#!/usr/bin/env bash
# sendgate's benchmark suite (issue 9). One command:
#
#   ./bench/run.sh            # full run, ~35 minutes after the builds
#   ./bench/run.sh --quick    # same comparisons, shorter windows (~5 minutes)
#   ./bench/run.sh --only 2,4 # some comparisons only (1 accept, 2 reject, 3 admin plane,
#                             # 4 RSS, 5 criterion, 6 fleet on Redis, 7 retry amplification,
#                             # 8 restart under load, 9 hostile clients, 10 batches vs direct
#                             # lapin, 11 RSS with large batches in flight, 12 fair shares,
#                             # 13 OpenTelemetry export on vs off, 14 overload open-loop:
#                             # ./bench/overload.sh, which also runs alone);
#                             # the report shows what was measured
#   ./bench/run.sh --only 7 --amplify-s 20
#                             # comparison 7 with a shorter window per side (default 60 s,
#                             # 15 with --quick)
#   ./bench/run.sh --only 9 --soak-s 30
#                             # comparison 9 with a shorter soak per side (default 60 s,
#                             # 15 with --quick)
#   ./bench/run.sh --only 12 --fair-s 20
#                             # comparison 12 with shorter tenant scenarios (default 60 s,
#                             # 15 with --quick)
#   FAIR_PARTS=b,d ./bench/run.sh --only 12
#                             # some of comparison 12's parts only (a one process, b 3
#                             # replicas, c criticality, d the cost; default all);
#                             # FAIR_COST_ROUNDS=N callgrind rounds of d (default 2)
#   ./bench/run.sh --only 2,6 --update-docs
#                             # a partial run that also rewrites docs/benchmarks.md: the
#                             # comparisons it left out are carried over from the current
#                             # docs/benchmarks.md, marked with the run they come from
#
# Writes raw results to bench/results/<timestamp>/ (results.jsonl, logs, criterion
# numbers, benchmarks.md; bench/results/latest points at the last run). A full run also
# writes the report to docs/benchmarks.md (numbers from bench/report.py, analysis from
# bench/analysis.md); --quick and --only leave docs/benchmarks.md as it is unless
# --update-docs (full windows only) asks for the carry-over above.
#
# Everything runs on 127.0.0.1: the local RabbitMQ (./scripts/ensure-rabbitmq.sh), the
# local Redis for comparison 6 (./scripts/ensure-redis.sh),
# sendgate release builds, the bench/ crate (loadgen, bare429) and wrk. Every loop is
# bounded; every process this script starts is stopped by PID on exit and is also
# wrapped in `timeout`, so nothing outlives a killed run by more than 30 minutes.
# Release builds go to target/bench (CARGO_TARGET_DIR) so they never invalidate the
# debug builds of ./scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

QUICK=0
UPDATE_DOCS=0
ALL="1,2,3,4,5,6,7,8,9,10,11,12,13,14"
ONLY=$ALL
AMPLIFY_S=""
SOAK_S=""
FAIR_S=""
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1 ;;
    --only) ONLY="$2"; shift ;;
    --amplify-s) AMPLIFY_S="$2"; shift ;;
    --update-docs) UPDATE_DOCS=1 ;;
    --soak-s) SOAK_S="$2"; shift ;;
    --fair-s) FAIR_S="$2"; shift ;;
    -h|--help) sed -n '2,43p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
if [ "$UPDATE_DOCS" = 1 ] && [ "$QUICK" = 1 ]; then
  echo "run.sh: --update-docs needs full windows (not --quick)" >&2; exit 2
fi
want() { [[ ",$ONLY," == *",$1,"* ]]; }

if [ "$QUICK" = 1 ]; then
  D=3; WARM=0.5; D3=5; ROUNDS=3; ROUNDS_REJECT=3; HOLD=4
  CRITERION_ARGS=(--warm-up-time 0.2 --measurement-time 0.5 --sample-size 20)
  D7=15; ROUNDS7=1; D8=12; ROUNDS8=1
  ROUNDS9=1; HEADS_S=5; SOAK=15
  D12=15
else
  D=10; WARM=1; D3=10; ROUNDS=3; ROUNDS_REJECT=5; HOLD=6
  CRITERION_ARGS=()
  D7=60; ROUNDS7=2; D8=30; ROUNDS8=2
  ROUNDS9=3; HEADS_S=15; SOAK=60
  D12=60
fi
D7=${AMPLIFY_S:-$D7}
SOAK=${SOAK_S:-$SOAK}
D12=${FAIR_S:-$D12}
# Comparison 9 (issue 23): the unfinished heads' sizes (130,000 passes the 32 KiB cap of one
# head, so each is cut at once; 30,000 stays under it, so the 8 MiB budget of all heads is
# what cuts), how many clients send them, the attack levels of the soak and its clients'
# kinds, and the normal producer beside them (connections, 1 KB sends, closed loop).
HOSTILE_HEAD_SIZES=${HOSTILE_HEAD_SIZES:-"130000 30000"}
HOSTILE_HEADS=${HOSTILE_HEADS:-5000}
HOSTILE_KEEPALIVE=1000
SOAK_LEVELS=${SOAK_LEVELS:-"5000 10000"}
SOAK_KIND=${SOAK_KIND:-trickle,idle}
SOAK_PRODUCERS=8
# Comparison 7's two sides, `name:VAR=value,...` each (an empty list: the defaults). The
# first forces the 1 s Retry-After of before (SENDGATE_RETRY_AFTER_MAX_S, issue 15; a build
# that does not know the variable refuses to start, and that side is recorded as failed).
AMPLIFY_SIDES=${AMPLIFY_SIDES:-"retry_after_1s:SENDGATE_RETRY_AFTER_MAX_S=1 default:"}
AMP_CEILING=200; AMP_RATE=200; AMP_PRODUCERS=16
# Comparisons 10 and 11 (issue 24): batch sizes (`single` = the single-send route, the CPU
# target's baseline), connections and channels; the large batches held in flight (clients,
# extra clients past them, entries, bytes per batch, the budgets of the sides, the hold,
# under the default 5 s body deadline).
BATCH_LEVELS=${BATCH_LEVELS:-"single 1 10 100"}
BATCH_CONNS=8
BIG_CLIENTS=64; BIG_EXTRA=16; BIG_ENTRIES=100; BIG_BYTES=1048576; BIG_HOLD=3
BIG_SIDES=${BIG_SIDES:-"budget64:67108864 budget32:33554432"}
# Comparison 12 (issue 25): the issue's scenario (ceiling 40, a worker draining 50 msg/s,
# tenant A 12 threads retrying every 20 ms, tenant B 10 sends/s); the cost's baseline, the
# last commit before issue 25's code, built from `git archive` into a target dir of its own
# (FAIR_BASE_TARGET_DIR); callgrind's requests per measured run.
FAIR_CEILING=40; FAIR_DRAIN=50; FAIR_A_THREADS=12; FAIR_A_RETRY_MS=20; FAIR_B_RATE=10
FAIR_BASE_COMMIT=${FAIR_BASE_COMMIT:-8871103}
FAIR_CALLGRIND_N=${FAIR_CALLGRIND_N:-2000}
FAIR_PARTS=${FAIR_PARTS:-a,b,c,d}
FAIR_COST_ROUNDS=${FAIR_COST_ROUNDS:-2}
fair_part() { [[ ",$FAIR_PARTS," == *",$1,"* ]]; }

# Comparison 13 (issue 26): callgrind's requests per measured run, and its rounds.
OTEL_CALLGRIND_N=${OTEL_CALLGRIND_N:-2000}
OTEL_CALLGRIND_ROUNDS=${OTEL_CALLGRIND_ROUNDS:-2}

# BENCH_TARGET_DIR: a release target dir shared with other checkouts (default target/bench).
export CARGO_TARGET_DIR="${BENCH_TARGET_DIR:-$ROOT/target/bench}"
BIN="$CARGO_TARGET_DIR/release"
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
OUT="$ROOT/bench/results/$STAMP"
mkdir -p "$OUT"
ln -sfn "$STAMP" "$ROOT/bench/results/latest"
RESULTS="$OUT/results.jsonl"
: > "$RESULTS"

log() { echo "[bench $(date -u +%H:%M:%S)] $*" >&2; }

MGMT=http://127.0.0.1:15672
AMQP_URL='amqp://guest:guest@127.0.0.1:5672/%2f'
# Ports: sendgate instances 187xx, bare handlers 18729/18730, counting proxies 157xx.
P_ACCEPT=18701; P_TTL0=18702; P_FULL=18703; P_RSS=18704; P_BARE=18729; P_FWD=18730
P_AMP=18761; P_RESTART=18762; P_HRSS=18763; P_HSOAK=18764; P_BATCH=18765; P_BRSS=18766
# Comparison 12: the embedded gateway, the fleet 18771-3, the cost's two builds (reject, accept).
P_FAIR=18767; P_FAIR_FLEET=(18771 18772 18773)
P_COST_HEAD_R=18774; P_COST_BASE_R=18775; P_COST_HEAD_A=18776; P_COST_BASE_A=18777
# Comparison 13: the OTLP sink, the gateways with export off and on (reject, accept).
P_OTLP=18780; P_OTEL_OFF_R=18781; P_OTEL_ON_R=18782; P_OTEL_OFF_A=18783; P_OTEL_ON_A=18784
P_OTLP_GRPC=18785
PX_A=15701; PX_A_CTL=15702; PX_B=15703; PX_B_CTL=15704
# Comparison 6: the Redis fleet 18741-3, one process 18744, a local (uncoordinated) fleet
# 18745-7, the ceiling fleets 18751-3; each group's admin plane behind its own proxy.
P_FLEET=(18741 18742 18743); P_ONE=18744; P_LOCAL=(18745 18746 18747); P_CAP=(18751 18752 18753)
PX_F=15705; PX_F_CTL=15706; PX_O=15707; PX_O_CTL=15708; PX_L=15709; PX_L_CTL=15710
REDIS_ADDR=127.0.0.1:6379
REDIS_URL="redis://$REDIS_ADDR"
FLEET_CEILING=500
HUGE_CEILING=1000000000

# ---------------------------------------------------------------------------------------
# Processes: started with `timeout`, remembered by PID, stopped by PID.
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Not called in $(...): the job must belong to this shell to be waited for.
start() { # name, command...: start in the background under a 30-minute bound; sets PID
  local name=$1; shift
  timeout -s TERM 1800 "$@" > "$OUT/$name.log" 2>&1 &
  PID=$!
  PIDS+=("$PID")
}
stop() { # pid (as returned by start)
  kill "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}
child_of() { # the real process under a `timeout` wrapper
  local c
  for _ in $(seq 1 50); do
    c=$(pgrep -P "$1" | head -1 || true)
    [ -n "$c" ] && { echo "$c"; return; }
    sleep 0.1
  done
  echo "$1"
}

# sendgate on the RabbitMQ backend with API keys on; extra VAR=value arguments override.
start_sendgate() { # name, port, VAR=value...: sets PID once /health/ready answers 200
  local name=$1 port=$2; shift 2
  start "$name" env RUST_LOG=warn \
    SENDGATE_LISTEN="127.0.0.1:$port" SENDGATE_BACKEND=rabbitmq SENDGATE_QUEUES=bench \
    SENDGATE_API_KEYS_FILE="$OUT/keys.toml" SERVICEBUS_SEND_MAX_QUEUE_DEPTH=$HUGE_CEILING \
    "$@" "$BIN/sendgate"
  for _ in $(seq 1 300); do
    if curl -sf "http://127.0.0.1:$port/health/ready" >/dev/null 2>&1; then
      return
    fi
    sleep 0.1
  done
  log "sendgate $name did not become ready; log:"; tail -20 "$OUT/$name.log" >&2
  exit 1
}
# The same, but a gateway that does not come up (a setting this build refuses) is not the
# end of the run: returns 1 after stopping it, so the caller records the side as failed.
try_start_sendgate() { # name, port, VAR=value...: sets PID
  local name=$1 port=$2; shift 2
  start "$name" env RUST_LOG=warn \
    SENDGATE_LISTEN="127.0.0.1:$port" SENDGATE_BACKEND=rabbitmq SENDGATE_QUEUES=bench \
    SENDGATE_API_KEYS_FILE="$OUT/keys.toml" SERVICEBUS_SEND_MAX_QUEUE_DEPTH=$HUGE_CEILING \
    "$@" "$BIN/sendgate"
  for _ in $(seq 1 300); do
    if curl -sf "http://127.0.0.1:$port/health/ready" >/dev/null 2>&1; then
      return 0
    fi
    kill -0 "$PID" 2>/dev/null || break
    sleep 0.1
  done
  log "sendgate $name did not become ready; log:"; tail -5 "$OUT/$name.log" >&2
  stop "$PID"
  return 1
}

# ---------------------------------------------------------------------------------------
# RabbitMQ helpers (management HTTP API: no Erlang CLI start-up per call).
rmq() { curl -sf -u guest:guest "$@"; }
declare_queue() { rmq -X PUT -H 'content-type: application/json' -d '{"durable":true}' "$MGMT/api/queues/%2F/$1" >/dev/null; }
purge() { rmq -X DELETE "$MGMT/api/queues/%2F/$1/contents" >/dev/null || true; }
depth() { rmq "$MGMT/api/queues/%2F/$1?columns=messages" | jq -r '.messages // 0'; }

# Append one result line: the tool's JSON plus the labels given as key=value.
record() { # json, key=value...
  local json=$1; shift
  # A tool that failed (e.g. the broker restarted under it) leaves a marked row, not a hole.
  if ! echo "$json" | jq -e 'type == "object"' >/dev/null 2>&1; then
    log "run failed: $* (output: ${json:0:200})"
    json='{"failed": true}'
  fi
  # The machine may be shared: note its load, and the broker's uptime (a restart by someone
  # else's test shows up as an uptime that went down).
  local uptime_s
  uptime_s=$(rmq "$MGMT/api/nodes" 2>/dev/null | jq '.[0].uptime / 1000 | floor' 2>/dev/null || echo null)
  # Builds and test binaries of others, alive right now (they steal the same 2 cores).
  local foreign
  foreign=$(( $(ps -eo comm= | grep -cxE 'rustc|cargo|rust-lld|cc|ld' || true) + $(pgrep -c -f '/target/debug/deps/' || true) ))
  json=$(echo "$json" | jq -c --arg load "$(cut -d' ' -f1 /proc/loadavg)" --argjson up "${uptime_s:-null}" \
    --argjson foreign "$foreign" \
    '. + {loadavg_1m: ($load|tonumber), broker_uptime_s: $up, foreign_procs: $foreign}')
  local args=()
  for kv in "$@"; do args+=(--arg "${kv%%=*}" "${kv#*=}"); done
  local labels
  labels=$(jq -cn '$ARGS.named' "${args[@]}")
  echo "$json" | jq -c --argjson l "$labels" '. + $l' >> "$RESULTS"
  echo "$json" | jq -c --argjson l "$labels" '$l + {rps, msgs_per_s, p50_ms, p99_ms}' >&2
}

loadgen() { timeout 120 "$BIN/loadgen" "$@"; }

# ---------------------------------------------------------------------------------------
setup() {
  log "RabbitMQ"
  ./scripts/ensure-rabbitmq.sh
  if want 6 || want 12 || want 14; then
    log "Redis"
    ./scripts/ensure-redis.sh
  fi
  if ! command -v wrk >/dev/null 2>&1; then
    log "installing wrk"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq wrk >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq wrk >/dev/null; }
  fi
  # 10,000 held connections (comparison 9) plus the rest: the soft limit up to the hard
  # one (a failed `ulimit -n 65536` must not fall back to one that also lowers the hard
  # limit: the gateway and the load generator inherit it).
  ulimit -Sn 65536 2>/dev/null || ulimit -Sn "$(ulimit -Hn)" 2>/dev/null || true

  log "building sendgate (release) and the bench/ tools into $CARGO_TARGET_DIR"
  cargo build --release --quiet --bin sendgate
  (cd bench && cargo build --release --quiet)
  if want 12 && fair_part d; then build_fair_base; fi

  # Five API keys: a sender, an observer (for /metrics) and three other senders, so each
  # request's token is compared with several keys, as in production.
  SENDER_TOKEN="sg_$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')"
  OBSERVER_TOKEN="sg_$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')"
  {
    for i in 1 2 3; do
      printf '[[keys]]\nname = "other-%s"\nsha256 = "%s"\nroles = ["sender"]\nqueues = ["*"]\n\n' \
        "$i" "$(head -c 32 /dev/urandom | sha256sum | cut -d' ' -f1)"
    done
    printf '[[keys]]\nname = "bench-observer"\nsha256 = "%s"\nroles = ["observer"]\nqueues = ["*"]\n\n' \
      "$(printf %s "$OBSERVER_TOKEN" | sha256sum | cut -d' ' -f1)"
    printf '[[keys]]\nname = "bench-sender"\nsha256 = "%s"\nroles = ["sender"]\nqueues = ["*"]\n' \
      "$(printf %s "$SENDER_TOKEN" | sha256sum | cut -d' ' -f1)"
  } > "$OUT/keys.toml"

  declare_queue bench
  purge bench

  log "recording the machine and versions"
  local lock="$ROOT/Cargo.lock"
  ver() { awk -v n="$1" '$0 == "name = \"" n "\"" { getline; gsub(/version = |"/, ""); print; exit }' "$lock"; }
  jq -n \
    --arg stamp "$STAMP" --arg quick "$QUICK" --arg only "$ONLY" \
    --arg d "$D" --arg d3 "$D3" --arg warm "$WARM" --arg rounds "$ROUNDS" --arg rounds_reject "$ROUNDS_REJECT" \
    --arg nofile "$(ulimit -n)" --arg port_range "$(tr '\t' ' ' < /proc/sys/net/ipv4/ip_local_port_range)" \
    --arg nproc "$(nproc)" \
    --arg mem_kib "$(awk '/MemTotal/ {print $2}' /proc/meminfo)" \
    --arg cpu "$(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)" \
    --arg kernel "$(uname -r)" \
    --arg loadavg "$(cat /proc/loadavg)" \
    --arg rustc "$(rustc --version)" \
    --arg rabbitmq "$(rabbitmqctl -q status 2>/dev/null | awk -F': ' '/RabbitMQ version/ {print $2; exit}')" \
    --arg erlang "$(rabbitmqctl -q status 2>/dev/null | awk -F': ' '/Erlang configuration/ {print $2; exit}' | cut -d' ' -f1-2)" \
    --arg wrk "$(wrk -v 2>&1 | head -1 | awk '{print $2}')" \
    --arg redis "$(redis-cli -h 127.0.0.1 INFO server 2>/dev/null | awk -F: '/^redis_version/ {sub(/\r/, "", $2); print $2}')" \
    --arg redis_crate "$(ver redis)" \
    --arg actix "$(ver actix-web)" --arg lapin "$(ver lapin)" --arg tokio "$(ver tokio)" \
    --arg criterion "$(ver criterion)" \
    --arg batch_levels "$BATCH_LEVELS" --arg batch_conns "$BATCH_CONNS" \
    --arg d12 "$D12" --arg fair_base_commit "$FAIR_BASE_COMMIT" --arg fair_callgrind_n "$FAIR_CALLGRIND_N" \
    --arg otel_callgrind_n "$OTEL_CALLGRIND_N" --arg otel_callgrind_rounds "$OTEL_CALLGRIND_ROUNDS" \
    --arg commit "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" \
    --arg dirty "$(git status --porcelain -- src Cargo.toml 2>/dev/null | wc -l)" \
    '$ARGS.named' > "$OUT/meta.json"
}

# ---------------------------------------------------------------------------------------
# 1. Accepted sends: sendgate (default TTL, ceiling raised) vs direct lapin, 1 and 64 in
#    flight; and, as a third side, a bare actix-web + lapin forwarder (the floor of any
#    HTTP-to-AMQP gateway here), so the gap splits into "the HTTP hop" and "sendgate's code".
compare_accept() {
  log "1. accepted sends: sendgate vs direct lapin (confirms) vs bare forwarder, 1 KB persistent"
  ensure_accept_instance
  for round in $(seq 1 "$ROUNDS"); do
    for c in 1 64; do
      purge bench
      record "$(loadgen http --addr 127.0.0.1:$P_ACCEPT --token "$SENDER_TOKEN" \
        --metrics-token "$OBSERVER_TOKEN" --count-addr 127.0.0.1:$PX_A_CTL \
        --concurrency $c --duration $D --warmup $WARM)" \
        comparison=accept side=sendgate round="$round" level="$c"
      purge bench
      record "$(loadgen amqp --url "$AMQP_URL" --queue bench --channels 4 \
        --concurrency $c --duration $D --warmup $WARM)" \
        comparison=accept side=direct round="$round" level="$c"
      # A fresh forwarder per run: it has no reconnect logic of its own.
      start bareforward-$round-$c "$BIN/bareforward" 127.0.0.1:$P_FWD "$AMQP_URL" 600
      local fwd=$PID
      for _ in $(seq 1 50); do
        [ "$(curl -s -o /dev/null -w '%{http_code}' -X POST -H 'Content-Type: application/json' -d '{}' \
          "http://127.0.0.1:$P_FWD/v1/queues/bench/messages" || true)" = 201 ] && break
        sleep 0.1
      done
      purge bench
      record "$(loadgen http --addr 127.0.0.1:$P_FWD \
        --concurrency $c --duration $D --warmup $WARM)" \
        comparison=accept side=bareforward round="$round" level="$c"
      stop "$fwd"
    done
  done
  purge bench
}

# The default-TTL gateway (comparisons 1 and 3), its admin plane behind counting proxy A.
ensure_accept_instance() {
  [ -n "${SG_ACCEPT_PID:-}" ] && return
  start proxy-a "$BIN/loadgen" proxy --listen 127.0.0.1:$PX_A --control 127.0.0.1:$PX_A_CTL --max-secs 1700
  PX_A_PID=$PID
  start_sendgate sendgate-accept $P_ACCEPT SENDGATE_RABBITMQ_MANAGEMENT_URL=http://127.0.0.1:$PX_A
  SG_ACCEPT_PID=$PID
}

# ---------------------------------------------------------------------------------------
# 2. Rejection path: 429 from a cached backlog (keys on) vs a bare actix-web 429 handler.
compare_reject() {
  log "2. rejection path: sendgate 429 (cached backlog, API keys on) vs bare actix-web 429"
  declare_queue bench_full
  purge bench_full
  for _ in $(seq 1 10); do
    rmq -X POST -H 'content-type: application/json' \
      -d '{"properties":{"delivery_mode":2},"routing_key":"bench_full","payload":"{}","payload_encoding":"string"}' \
      "$MGMT/api/exchanges/%2F/amq.default/publish" >/dev/null
  done
  local sg bare url_sg url_bare status
  start_sendgate sendgate-full $P_FULL SENDGATE_QUEUES=bench_full SERVICEBUS_SEND_MAX_QUEUE_DEPTH=1
  sg=$PID
  start bare429 "$BIN/bare429" 127.0.0.1:$P_BARE 1700
  bare=$PID
  url_sg="http://127.0.0.1:$P_FULL/v1/queues/bench_full/messages"
  url_bare="http://127.0.0.1:$P_BARE/v1/queues/bench_full/messages"
  # The management API may not count the fresh messages yet: wait until the gate refuses.
  for _ in $(seq 1 100); do
    status=$(curl -s -o /dev/null -w '%{http_code}' -X POST -H "Authorization: Bearer $SENDER_TOKEN" \
      -H 'Content-Type: application/json' -d '{}' "$url_sg" || true)
    [ "$status" = 429 ] && break
    sleep 0.2
  done
  [ "$status" = 429 ] || { log "sendgate never answered 429 (last: $status)"; exit 1; }
  for _ in $(seq 1 50); do
    status=$(curl -s -o /dev/null -w '%{http_code}' -X POST -H 'Content-Type: application/json' -d '{}' "$url_bare" || true)
    [ "$status" = 429 ] && break
    sleep 0.1
  done
  [ "$status" = 429 ] || { log "bare429 never answered 429 (last: $status)"; exit 1; }

  run_wrk() { # url, connections, token
    local out
    out=$(BENCH_TOKEN="$3" timeout 120 wrk -t2 -c"$2" -d"${D}s" --timeout 5s \
      -s "$ROOT/bench/lua/post.lua" "$1" 2>&1)
    echo "$out" | sed -n 's/^BENCH_JSON //p'
  }
  # Cheap (no broker): more rounds, for a steadier median on a shared machine.
  for round in $(seq 1 "$ROUNDS_REJECT"); do
    for c in 64 256; do
      record "$(run_wrk "$url_sg" $c "$SENDER_TOKEN")" comparison=reject side=sendgate round="$round" level="$c"
      record "$(run_wrk "$url_bare" $c "")" comparison=reject side=bare round="$round" level="$c"
    done
  done
  # Every sendgate answer in the window must have been the 429 (none got through).
  jq -c 'select(.comparison=="reject" and .requests != .non_2xx_3xx)' "$RESULTS" | grep -q . \
    && log "WARNING: some rejection-path answers were 2xx/3xx"
  stop "$sg"; stop "$bare"
  purge bench_full
}

# ---------------------------------------------------------------------------------------
# 3. Admin-plane reads per second under paced load, and TTL=0 vs the default TTL.
compare_admin() {
  log "3. admin-plane reads: paced sends at 0/10/100/1000 per second; TTL 0 vs default"
  local sg0 pxb
  ensure_accept_instance
  start proxy-b "$BIN/loadgen" proxy --listen 127.0.0.1:$PX_B --control 127.0.0.1:$PX_B_CTL --max-secs 1700
  pxb=$PID
  start_sendgate sendgate-ttl0 $P_TTL0 SENDGATE_DEPTH_TTL_MS=0 SENDGATE_RABBITMQ_MANAGEMENT_URL=http://127.0.0.1:$PX_B
  sg0=$PID

  # 0) the admin plane's own capacity: what a design reading the depth before every send
  #    (without sendgate's single-flight sharing) could never exceed, broker otherwise idle.
  for round in $(seq 1 "$ROUNDS"); do
    for c in 1 8; do
      record "$(BENCH_AUTH="Basic $(printf guest:guest | base64)" timeout 60 wrk -t1 -c$c -d3s \
        -s "$ROOT/bench/lua/get.lua" "$MGMT/api/queues/%2F/bench?columns=messages" 2>&1 \
        | sed -n 's/^BENCH_JSON //p')" \
        comparison=admin_capacity side=management_api round="$round" level="$c"
    done
  done
  # a) paced: rate -> connections (each connection paced at rate/connections)
  for round in $(seq 1 "$ROUNDS"); do
    for spec in 0:0 10:1 100:2 1000:8; do
      local rate=${spec%%:*} conns=${spec#*:}
      purge bench
      record "$(loadgen http --addr 127.0.0.1:$P_ACCEPT --token "$SENDER_TOKEN" \
        --metrics-token "$OBSERVER_TOKEN" --count-addr 127.0.0.1:$PX_A_CTL \
        --concurrency $conns --rate $rate --duration $D3 --warmup $WARM)" \
        comparison=admin_paced side=sendgate round="$round" level="$rate"
    done
  done
  # b) closed loop: default TTL vs read on every send (TTL 0), same sendgate build
  for round in $(seq 1 "$ROUNDS"); do
    for c in 64 1; do
      purge bench
      record "$(loadgen http --addr 127.0.0.1:$P_ACCEPT --token "$SENDER_TOKEN" \
        --metrics-token "$OBSERVER_TOKEN" --count-addr 127.0.0.1:$PX_A_CTL \
        --concurrency $c --duration $D --warmup $WARM)" \
        comparison=ttl side=default round="$round" level="$c"
      purge bench
      record "$(loadgen http --addr 127.0.0.1:$P_TTL0 --token "$SENDER_TOKEN" \
        --metrics-token "$OBSERVER_TOKEN" --count-addr 127.0.0.1:$PX_B_CTL \
        --concurrency $c --duration $D --warmup $WARM)" \
        comparison=ttl side=ttl0 round="$round" level="$c"
    done
  done
  purge bench
  stop "$sg0"; stop "$pxb"
}

# ---------------------------------------------------------------------------------------
# 4. RSS idle and with 1,000 keep-alive connections (a fresh process each round).
rss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }
hwm_kib() { awk '/^VmHWM/ {print $2}' "/proc/$1/status"; }
compare_rss() {
  log "4. RSS: idle, and with 1,000 keep-alive connections"
  if [ -n "${SG_ACCEPT_PID:-}" ]; then
    local p
    p=$(child_of "$SG_ACCEPT_PID")
    record "$(jq -cn --arg r "$(rss_kib "$p")" --arg h "$(hwm_kib "$p")" \
      '{rss_kib: ($r|tonumber), hwm_kib: ($h|tonumber)}')" \
      comparison=rss side=after_load round=1 level=0
  fi
  for round in $(seq 1 "$ROUNDS"); do
    local sg pid idle held after hold_out ready="$OUT/hold-ready-$round"
    # The gateway's defaults (ceiling, TTL, workers) on the RabbitMQ backend with keys on.
    start_sendgate sendgate-rss-$round $P_RSS SERVICEBUS_SEND_MAX_QUEUE_DEPTH=2000
    sg=$PID
    pid=$(child_of "$sg")
    sleep 2
    idle=$(rss_kib "$pid")
    rm -f "$ready"
    timeout 60 "$BIN/loadgen" hold --addr 127.0.0.1:$P_RSS --connections 1000 \
      --hold "$HOLD" --ready-file "$ready" > "$OUT/hold-$round.json" &
    local lg=$!
    for _ in $(seq 1 300); do [ -f "$ready" ] && break; sleep 0.1; done
    sleep 1
    held=$(rss_kib "$pid")
    wait "$lg" || true
    hold_out=$(cat "$OUT/hold-$round.json")
    sleep 1
    after=$(rss_kib "$pid")
    record "$(echo "$hold_out" | jq -c --arg i "$idle" --arg h "$held" --arg a "$after" --arg w "$(hwm_kib "$pid")" \
      '. + {idle_kib: ($i|tonumber), held_kib: ($h|tonumber), after_kib: ($a|tonumber), hwm_kib: ($w|tonumber)}')" \
      comparison=rss side=sendgate round="$round" level=1000
    stop "$sg"
  done
}

# ---------------------------------------------------------------------------------------
# 5. criterion micro-benchmarks of the admission decision.
compare_micro() {
  log "5. criterion micro-benchmarks (benches/admission.rs)"
  rm -rf "$CARGO_TARGET_DIR/criterion"
  cargo bench --quiet --bench admission -- "${CRITERION_ARGS[@]}" > "$OUT/criterion.txt" 2>&1 \
    || { tail -30 "$OUT/criterion.txt" >&2; exit 1; }
  find "$CARGO_TARGET_DIR/criterion" -path '*/new/estimates.json' | sort | while read -r f; do
    local name=${f#"$CARGO_TARGET_DIR/criterion/"}
    name=${name%/new/estimates.json}
    jq -c --arg name "$name" \
      '{comparison: "micro", name: $name, median_ns: .median.point_estimate,
        median_lo_ns: .median.confidence_interval.lower_bound,
        median_hi_ns: .median.confidence_interval.upper_bound, mean_ns: .mean.point_estimate}' "$f" \
      >> "$RESULTS"
  done
}

# ---------------------------------------------------------------------------------------
# 6. Fleet mode on Redis (issue 14): three gateway processes sharing one ceiling through the
#    local Redis vs one process, same total concurrency and workers, same broker.
redis_forget() { # prefix: delete one run's ledger keys (they also expire by themselves)
  redis-cli -h 127.0.0.1 EVAL \
    "for _,k in ipairs(redis.call('KEYS', ARGV[1])) do redis.call('DEL', k) end" 0 "$1:*" >/dev/null || true
}
coordination_mode() { # port
  curl -sf -H "Authorization: Bearer $OBSERVER_TOKEN" "http://127.0.0.1:$1/health/detailed" \
    | jq -r '.coordination.mode // "none"' 2>/dev/null || echo none
}
wait_redis_mode() { # port...: every replica joined the fleet, or the run stops
  local port mode
  for port in "$@"; do
    for _ in $(seq 1 100); do
      mode=$(coordination_mode "$port")
      [ "$mode" = redis ] && break
      sleep 0.1
    done
    [ "$mode" = redis ] || { log "replica on $port never joined the fleet (mode: $mode)"; exit 1; }
  done
}
exact_depth() { # queue: messages in it, from the queue process itself (no stats lag)
  timeout 30 rabbitmqctl list_queues -q name messages 2>/dev/null | awk -v q="$1" '$1 == q {print $2}'
}
addrs() { local a=() p; for p in "$@"; do a+=("127.0.0.1:$p"); done; (IFS=,; echo "${a[*]}"); }

compare_fleet() {
  log "6. fleet: 3 replicas on Redis vs one process vs 3 uncoordinated replicas; overshoot at the ceiling"
  local prefix="bench-fleet-$STAMP" i pids=() round
  # The ceiling rounds' queues, declared now so that the management API has their stats
  # (a queue it has no numbers for yet is not a fair first read) by the time they are used.
  for round in $(seq 1 "$ROUNDS") control; do
    declare_queue "bench_ceiling_$round"; purge "bench_ceiling_$round"
  done
  # Long-lived instances for the throughput rounds: ceiling 10⁹ (far from it), default TTL,
  # the management depth source (so every admin read goes through a counting proxy).
  start proxy-fleet "$BIN/loadgen" proxy --listen 127.0.0.1:$PX_F --control 127.0.0.1:$PX_F_CTL --max-secs 1700
  pids+=("$PID")
  start proxy-one "$BIN/loadgen" proxy --listen 127.0.0.1:$PX_O --control 127.0.0.1:$PX_O_CTL --max-secs 1700
  pids+=("$PID")
  start proxy-local "$BIN/loadgen" proxy --listen 127.0.0.1:$PX_L --control 127.0.0.1:$PX_L_CTL --max-secs 1700
  pids+=("$PID")
  for i in 0 1 2; do
    start_sendgate fleet-$i "${P_FLEET[$i]}" SENDGATE_WORKERS=1 \
      SENDGATE_RABBITMQ_MANAGEMENT_URL=http://127.0.0.1:$PX_F \
      SENDGATE_COORDINATION=redis SENDGATE_REDIS_URL="$REDIS_URL" SENDGATE_REDIS_PREFIX="$prefix"
    pids+=("$PID")
    start_sendgate local-$i "${P_LOCAL[$i]}" SENDGATE_WORKERS=1 \
      SENDGATE_RABBITMQ_MANAGEMENT_URL=http://127.0.0.1:$PX_L
    pids+=("$PID")
  done
  # One process with the fleet's total of 3 HTTP workers (the default would be 2, one per core).
  start_sendgate one "$P_ONE" SENDGATE_WORKERS=3 SENDGATE_RABBITMQ_MANAGEMENT_URL=http://127.0.0.1:$PX_O
  pids+=("$PID")
  wait_redis_mode "${P_FLEET[@]}"

  local fleet one local
  fleet=$(addrs "${P_FLEET[@]}"); one=$(addrs "$P_ONE"); local=$(addrs "${P_LOCAL[@]}")
  for round in $(seq 1 "$ROUNDS"); do
    for spec in "one|$one|$PX_O_CTL" "fleet|$fleet|$PX_F_CTL" "local|$local|$PX_L_CTL"; do
      IFS='|' read -r side list ctl <<< "$spec"
      purge bench
      # 64 in flight in total, spread round robin over the side's processes (22/21/21).
      record "$(loadgen http --addr "$list" --token "$SENDER_TOKEN" \
        --metrics-token "$OBSERVER_TOKEN" --count-addr 127.0.0.1:$ctl --redis-addr $REDIS_ADDR \
        --concurrency 64 --duration $D --warmup $WARM)" \
        comparison=fleet side="$side" round="$round" level=64
    done
  done
  purge bench
  for pid in "${pids[@]}"; do stop "$pid"; done
  redis_forget "$prefix"

  # Overshoot at the ceiling: a fresh queue and a fresh fleet per round, ceiling 500,
  # 64 senders spread over the 3 replicas for a few seconds (far more than 500 sends
  # offered), every answer counted (no warm-up); then the queue's exact depth. The last
  # round is the control: the same with 3 uncoordinated replicas, which should overshoot.
  local hold=$(( D < 5 ? 2 : 4 ))
  for round in $(seq 1 "$ROUNDS") control; do
    local q="bench_ceiling_$round" side=fleet extra=() reps=()
    if [ "$round" = control ]; then
      side=local
    else
      extra=(SENDGATE_COORDINATION=redis SENDGATE_REDIS_URL="$REDIS_URL" SENDGATE_REDIS_PREFIX="$prefix-cap-$round")
    fi
    for _ in $(seq 1 100); do
      rmq "$MGMT/api/queues/%2F/$q" | jq -e 'has("messages")' >/dev/null 2>&1 && break
      sleep 0.1
    done
    for i in 0 1 2; do
      start_sendgate cap-$round-$i "${P_CAP[$i]}" SENDGATE_WORKERS=1 SENDGATE_QUEUES="$q" \
        SERVICEBUS_SEND_MAX_QUEUE_DEPTH=$FLEET_CEILING "${extra[@]}"
      reps+=("$PID")
    done
    if [ "$side" = fleet ]; then wait_redis_mode "${P_CAP[@]}"; fi
    local out depth
    out=$(loadgen http --addr "$(addrs "${P_CAP[@]}")" --path "/v1/queues/$q/messages" \
      --token "$SENDER_TOKEN" --redis-addr $REDIS_ADDR \
      --concurrency 64 --duration "$hold" --warmup 0)
    for pid in "${reps[@]}"; do stop "$pid"; done
    sleep 1
    depth=$(exact_depth "$q")
    record "$(echo "$out" | jq -c --arg d "${depth:-}" --argjson c $FLEET_CEILING \
      '. + {ceiling: $c, depth: ($d | tonumber? // null)}')" \
      comparison=fleet_ceiling side="$side" round="$round" level=$FLEET_CEILING
    rmq -X DELETE "$MGMT/api/queues/%2F/$q" >/dev/null || true
    if [ "$side" = fleet ]; then redis_forget "$prefix-cap-$round"; fi
  done
}

# ---------------------------------------------------------------------------------------
# 7. Retry amplification (issue 15): 16 producers, each a sendgate-client Client of its
#    own, push at one queue held over its ceiling while a consumer takes 200 msg/s off it;
#    HTTP requests per accepted message, Jain's fairness over the producers' accepted
#    counts, the depth's maximum (sampled exactly, must never pass the ceiling). Sides:
#    AMPLIFY_SIDES (the forced 1 s Retry-After of before vs the default).
compare_amplify() {
  log "7. retry amplification: $AMP_PRODUCERS producers over a ceiling of $AMP_CEILING, consumer at $AMP_RATE msg/s, ${D7} s per side"
  local q=bench_amplify round spec side vars sg
  declare_queue "$q"
  for round in $(seq 1 "$ROUNDS7"); do
    for spec in $AMPLIFY_SIDES; do
      side=${spec%%:*}; vars=${spec#*:}
      local extra=()
      [ -n "$vars" ] && IFS=',' read -r -a extra <<< "$vars"
      purge "$q"
      # The exact depth source: the gate and the sampler read the same number.
      if try_start_sendgate amplify-$side-$round $P_AMP SENDGATE_QUEUES=$q \
        SERVICEBUS_SEND_MAX_QUEUE_DEPTH=$AMP_CEILING SENDGATE_RABBITMQ_DEPTH_SOURCE=amqp "${extra[@]}"; then
        sg=$PID
        record "$(timeout $(( D7 + 60 )) "$BIN/producers" amplify --addr 127.0.0.1:$P_AMP --queue "$q" \
          --token "$SENDER_TOKEN" --ceiling $AMP_CEILING --producers $AMP_PRODUCERS \
          --consume-rate $AMP_RATE --duration "$D7" --amqp-url "$AMQP_URL")" \
          comparison=amplify side="$side" round="$round" level=$AMP_PRODUCERS settings="$vars"
        stop "$sg"
      else
        record '{"failed": true, "reason": "the gateway did not start with these settings"}' \
          comparison=amplify side="$side" round="$round" level=$AMP_PRODUCERS settings="$vars"
      fi
    done
  done
  purge "$q"
}

# ---------------------------------------------------------------------------------------
# 8. Restart under load (issue 15): 4 `sendgate send` processes, 25 messages/s each (one
#    Idempotency-Key per message, from the CLI), against a gateway on the embedded backend
#    that is drained by SIGTERM a third into the window and started again on the same port
#    and data; failed, stored twice, missing, longest wait. Nothing consumes the queue, so
#    its ceiling is raised far above the window's 3,000 sends (`producers --ceiling`, default
#    10⁶): at the default 2,000 the last third would meet `429 queue_full` (comparison 7's
#    subject), not the restart.
compare_restart() {
  log "8. restart under load: sendgate send x4 across a SIGTERM drain and a restart, ${D8} s"
  local round
  for round in $(seq 1 "$ROUNDS8"); do
    rm -rf "$OUT/restart-data-$round"
    record "$(timeout $(( D8 + 400 )) "$BIN/producers" restart --sendgate "$BIN/sendgate" \
      --port $P_RESTART --data-dir "$OUT/restart-data-$round" --queue requests \
      --producers 4 --rate 25 --concurrency 4 --duration "$D8" --restart-at $(( D8 / 3 )) \
      --log-dir "$OUT")" \
      comparison=restart side=sendgate_send round="$round" level=4
    rm -rf "$OUT/restart-data-$round"
  done
}

# ---------------------------------------------------------------------------------------
# 9. Hostile clients (issue 23): a) RSS while 5,000 clients send unfinished heads (a fresh
#    gateway per side and round, alternating with 1,000 plain keep-alive connections), before,
#    during and 5 s after they have gone, with the gateway's head bytes and close reasons;
#    b) a normal producer (8 connections, closed loop of 1 KB sends) alone, then beside
#    5,000 and 10,000 hostile clients (trickle and idle, reconnecting whenever closed), on
#    one gateway, alternating. Everything comes from 127.0.0.1: the per-peer cap is off.
hostile() { # timeout-s, loadgen hostile arguments...
  local t=$1; shift
  timeout "$t" "$BIN/loadgen" hostile --metrics-token "$OBSERVER_TOKEN" "$@"
}
compare_hostile() {
  log "9. hostile clients: RSS under $HOSTILE_HEADS unfinished heads ($HOSTILE_HEAD_SIZES bytes) vs $HOSTILE_KEEPALIVE keep-alive; a producer beside $SOAK_LEVELS hostile clients ($SOAK_KIND), ${SOAK} s each"
  local round side sg pid out
  for round in $(seq 1 "$ROUNDS9"); do
    for side in keepalive $(for b in $HOSTILE_HEAD_SIZES; do echo "heads$b"; done); do
      # As comparison 4: the gateway's defaults (ceiling, TTL, workers, every transport
      # limit but the per-peer cap) on the RabbitMQ backend with keys on.
      start_sendgate hostile-rss-$side-$round $P_HRSS SERVICEBUS_SEND_MAX_QUEUE_DEPTH=2000 \
        SENDGATE_MAX_CONNECTIONS_PER_PEER=0
      sg=$PID
      pid=$(child_of "$sg")
      sleep 2
      if [ "$side" = keepalive ]; then
        out=$(hostile $(( HEADS_S + 200 )) --addr 127.0.0.1:$P_HRSS --connections $HOSTILE_KEEPALIVE \
          --kind idle --duration "$HEADS_S" --after 5 --watch-pid "$pid" --probe-ms 200)
      else
        out=$(hostile $(( HEADS_S + 200 )) --addr 127.0.0.1:$P_HRSS --connections "$HOSTILE_HEADS" \
          --kind heads --head-bytes "${side#heads}" --duration "$HEADS_S" --after 5 --watch-pid "$pid" \
          --probe-ms 200)
      fi
      record "$(echo "$out" | jq -c 'del(.series)' 2>/dev/null || echo "$out")" \
        comparison=hostile_rss side="$side" round="$round" level="$(echo "$out" | jq -r '.connections // 0' 2>/dev/null)"
      echo "$out" > "$OUT/hostile-rss-$side-$round.json"
      stop "$sg"
    done
  done

  # b) one gateway for the soak: ceiling 10⁹, so every send is a 201.
  start_sendgate hostile-soak $P_HSOAK SENDGATE_MAX_CONNECTIONS_PER_PEER=0
  sg=$PID
  pid=$(child_of "$sg")
  local warm=$(( SOAK >= 30 ? 5 : 2 )) level ready="$OUT/hostile-ready" hp
  local pdur=$(( SOAK - warm - 3 ))
  for round in $(seq 1 "$ROUNDS9"); do
    for level in 0 $SOAK_LEVELS; do
      purge bench
      rm -f "$ready"
      # The alone side runs the same tool with no hostile clients: the same newcomer probe
      # (a fresh connection and GET /health/live every 200 ms) and RSS samples.
      hostile $(( SOAK + 200 )) --addr 127.0.0.1:$P_HSOAK --connections "$level" --kind "$SOAK_KIND" \
        --duration "$SOAK" --watch-pid "$pid" --probe-ms 200 --ready-file "$ready" \
        > "$OUT/hostile-soak-$level-$round.json" &
      hp=$!
      for _ in $(seq 1 1800); do [ -f "$ready" ] && break; kill -0 "$hp" 2>/dev/null || break; sleep 0.1; done
      out=$(timeout $(( SOAK + 60 )) "$BIN/loadgen" http --addr 127.0.0.1:$P_HSOAK --token "$SENDER_TOKEN" \
        --concurrency $SOAK_PRODUCERS --duration "$pdur" --warmup "$warm" || true)
      wait "$hp" || true
      local h
      h=$(jq -c 'del(.series)' "$OUT/hostile-soak-$level-$round.json" 2>/dev/null || echo null)
      record "$(echo "$out" | jq -c --argjson h "${h:-null}" '. + {hostile: $h}' 2>/dev/null || echo "$out")" \
        comparison=hostile_soak side="$([ "$level" = 0 ] && echo alone || echo attack)" round="$round" level="$level"
      sleep 2
    done
  done
  purge bench
  stop "$sg"
}

# ---------------------------------------------------------------------------------------
# 10. Batches (issue 24): msg/s through POST /v1/queues/bench/messages/batch at 1, 10 and
#     100 entries per request (and the single-send route), 8 connections, against direct
#     lapin publishing the same batches pipelined on 8 channels (each batch's publishes back
#     to back on one channel, the confirms awaited together), and the same direct lapin with
#     the gateway's trace headers on each message, alternating per level; the gateway's and
#     the broker's utime + stime over each window, per message.
compare_batch() {
  log "10. batches: sendgate at $BATCH_LEVELS entries per request vs direct lapin pipelined, $BATCH_CONNS connections / $BATCH_CONNS channels"
  local sg gw broker round b
  start_sendgate sendgate-batch $P_BATCH
  sg=$PID
  gw=$(child_of "$sg")
  broker=$(pgrep -o -x beam.smp || true)
  for round in $(seq 1 "$ROUNDS"); do
    for b in $BATCH_LEVELS; do
      purge bench
      if [ "$b" = single ]; then
        record "$(loadgen http --addr 127.0.0.1:$P_BATCH --token "$SENDER_TOKEN" \
          --concurrency $BATCH_CONNS --duration $D --warmup $WARM \
          --cpu-pids "gateway:$gw${broker:+,broker:$broker}")" \
          comparison=batch side=sendgate round="$round" level=single
        continue
      fi
      record "$(loadgen http --addr 127.0.0.1:$P_BATCH --token "$SENDER_TOKEN" --batch "$b" \
        --concurrency $BATCH_CONNS --duration $D --warmup $WARM \
        --cpu-pids "gateway:$gw${broker:+,broker:$broker}")" \
        comparison=batch side=sendgate round="$round" level="$b"
      purge bench
      record "$(loadgen amqp --url "$AMQP_URL" --queue bench --channels $BATCH_CONNS --batch "$b" \
        --concurrency $BATCH_CONNS --duration $D --warmup $WARM ${broker:+--cpu-pids broker:$broker})" \
        comparison=batch side=direct round="$round" level="$b"
      # The same with the trace context the gateway puts on every message (two AMQP headers):
      # what the broker's share of the difference is.
      purge bench
      record "$(loadgen amqp --url "$AMQP_URL" --queue bench --channels $BATCH_CONNS --batch "$b" \
        --trace-headers 1 --concurrency $BATCH_CONNS --duration $D --warmup $WARM \
        ${broker:+--cpu-pids broker:$broker})" \
        comparison=batch side=direct_trace round="$round" level="$b"
    done
  done
  purge bench
  stop "$sg"
}

# ---------------------------------------------------------------------------------------
# 11. RSS with large batches in flight (issue 24): 64 clients each send the head and all but
#     4 KiB of a 1 MiB batch (100 entries) and hold it, 16 more send the same batch whole
#     meanwhile, then the 64 finish and their batches go to the broker; a fresh gateway per
#     side and round (the default 64 MiB body budget, and 32 MiB), sides alternating.
compare_batch_rss() {
  log "11. RSS: $BIG_CLIENTS clients holding a $BIG_BYTES-byte batch each (+$BIG_EXTRA more), budgets: $BIG_SIDES"
  local round spec side budget sg pid out
  for round in $(seq 1 "$ROUNDS"); do
    for spec in $BIG_SIDES; do
      side=${spec%%:*}; budget=${spec#*:}
      start_sendgate batch-rss-$side-$round $P_BRSS SENDGATE_MAX_BUFFERED_BYTES="$budget"
      sg=$PID
      pid=$(child_of "$sg")
      sleep 2
      purge bench
      out=$(timeout 120 "$BIN/loadgen" bigbatch --addr 127.0.0.1:$P_BRSS --token "$SENDER_TOKEN" \
        --connections $BIG_CLIENTS --extra $BIG_EXTRA --entries $BIG_ENTRIES \
        --request-bytes $BIG_BYTES --hold $BIG_HOLD --watch-pid "$pid" || true)
      echo "$out" > "$OUT/batch-rss-$side-$round.json"
      record "$(echo "$out" | jq -c --argjson b "$budget" 'del(.series) + {budget_bytes: $b}' 2>/dev/null || echo "$out")" \
        comparison=batch_rss side="$side" round="$round" level=$BIG_CLIENTS
      stop "$sg"
    done
  done
  purge bench
}

# ---------------------------------------------------------------------------------------
# 12. Fair shares (issue 25). The baseline of the cost: FAIR_BASE_COMMIT (the last commit
#     before issue 25's code) from `git archive`, built in a target dir of its own (seeded
#     from this one's release deps when empty, so only sendgate itself is compiled).
FAIR_BASE_TARGET="${FAIR_BASE_TARGET_DIR:-$CARGO_TARGET_DIR-base}"
FAIR_BASE_BIN="$FAIR_BASE_TARGET/release/sendgate"
build_fair_base() {
  local src="$FAIR_BASE_TARGET/src-$FAIR_BASE_COMMIT"
  if [ ! -d "$src" ]; then
    log "extracting sendgate $FAIR_BASE_COMMIT into $src"
    mkdir -p "$src"
    git archive "$FAIR_BASE_COMMIT" | tar -x -C "$src"
  fi
  if [ ! -d "$FAIR_BASE_TARGET/release" ] && [ -d "$CARGO_TARGET_DIR/release/deps" ]; then
    mkdir -p "$FAIR_BASE_TARGET/release"
    cp -a "$CARGO_TARGET_DIR/release/deps" "$CARGO_TARGET_DIR/release/build" \
      "$CARGO_TARGET_DIR/release/.fingerprint" "$FAIR_BASE_TARGET/release/"
  fi
  log "building sendgate $FAIR_BASE_COMMIT (release) into $FAIR_BASE_TARGET"
  (cd "$src" && CARGO_TARGET_DIR="$FAIR_BASE_TARGET" cargo build --release --quiet --bin sendgate)
}

key_entry() { # name, token, extra TOML lines
  printf '[[keys]]\nname = "%s"\nsha256 = "%s"\nroles = ["sender"]\nqueues = ["*"]\n%s\n' \
    "$1" "$(printf %s "$2" | sha256sum | cut -d' ' -f1)" "$3"
}
# sendgate on the embedded backend (its own data dir) with this keys file; sets PID.
start_fair_embedded() { # name, keys file, data dir, VAR=value...
  local name=$1 keys=$2 data=$3; shift 3
  rm -rf "$data"; mkdir -p "$data"
  start "$name" env RUST_LOG=warn SENDGATE_LISTEN="127.0.0.1:$P_FAIR" SENDGATE_BACKEND=embedded \
    SENDGATE_DATA_DIR="$data" SENDGATE_QUEUES=fair SENDGATE_API_KEYS_FILE="$keys" \
    SERVICEBUS_SEND_MAX_QUEUE_DEPTH=$FAIR_CEILING "$@" "$BIN/sendgate"
  for _ in $(seq 1 300); do
    curl -sf "http://127.0.0.1:$P_FAIR/health/ready" >/dev/null 2>&1 && return
    sleep 0.1
  done
  log "sendgate $name did not become ready; log:"; tail -20 "$OUT/$name.log" >&2
  exit 1
}
fairshare() { local t=$1; shift; timeout "$t" "$BIN/fairshare" "$@"; }

compare_fair() {
  log "12. fair shares: the issue's two tenants (${D12} s per side), weights 3:1, 3 replicas on Redis, criticality, the cost against $FAIR_BASE_COMMIT"
  local ta tb keys="$OUT/fair-keys.toml" wkeys="$OUT/fair-keys-weights.toml" lkeys="$OUT/fair-keys-levels.toml"
  ta="sg_$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')"
  tb="sg_$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')"
  # The observer key too: wait_redis_mode reads /health/detailed with it.
  local observer
  observer=$(printf '[[keys]]\nname = "bench-observer"\nsha256 = "%s"\nroles = ["observer"]\nqueues = ["*"]\n' \
    "$(printf %s "$OBSERVER_TOKEN" | sha256sum | cut -d' ' -f1)")
  { key_entry tenant-a "$ta" ""; key_entry tenant-b "$tb" ""; echo "$observer"; } > "$keys"
  { key_entry tenant-a "$ta" "weight = 3"; key_entry tenant-b "$tb" "weight = 1"; echo "$observer"; } > "$wkeys"
  { key_entry tenant-a "$ta" 'criticality = "sheddable"'; key_entry tenant-b "$tb" ""; echo "$observer"; } > "$lkeys"
  local a_greedy=(--a-token "$ta" --a-kind greedy --a-threads $FAIR_A_THREADS --a-retry-ms $FAIR_A_RETRY_MS)
  local b_paced=(--b-token "$tb" --b-kind paced --b-rate $FAIR_B_RATE)
  local b_greedy=(--b-token "$tb" --b-kind greedy --b-threads $FAIR_A_THREADS --b-retry-ms $FAIR_A_RETRY_MS)
  local sg side data t12=$(( D12 + 120 ))

  # a) One gateway on the embedded backend, a worker (`sendgate queue receive`) draining
  #    50/s; the shares on, then off (`SENDGATE_FAIR_SHARE=off`); then weights 3:1 with
  #    both tenants greedy. A fresh data dir and gateway per side.
  local one_process=()
  fair_part a && one_process=("equal|$keys|b_paced|" "equal_off|$keys|b_paced|SENDGATE_FAIR_SHARE=off"
    "weights_3_1|$wkeys|b_greedy|")
  for spec in "${one_process[@]}"; do
    IFS='|' read -r side k b vars <<< "$spec"
    local extra=(); [ -n "$vars" ] && extra=("$vars")
    data="$OUT/fair-data-$side"
    start_fair_embedded fair-$side "$k" "$data" "${extra[@]}"
    sg=$PID
    local bargs=("${b_paced[@]}"); [ "$b" = b_greedy ] && bargs=("${b_greedy[@]}")
    record "$(fairshare $t12 --addr 127.0.0.1:$P_FAIR --queue fair --ceiling $FAIR_CEILING \
      --duration "$D12" --tenants a,b "${a_greedy[@]}" "${bargs[@]}" \
      --drain embedded --drain-rate $FAIR_DRAIN --sendgate "$BIN/sendgate" --data-dir "$data")" \
      comparison=fair side="$side" round=1 level=embedded settings="$vars"
    stop "$sg"
    rm -rf "$data"
  done

  # b) The same scenario on 3 replicas on RabbitMQ + Redis (exact AMQP depth, as the fleet
  #    tests), A's 12 threads spread over all three (4 each), B on one; the consumer takes
  #    50/s on one AMQP channel. Shares on, then off, then weights 3:1 with both greedy
  #    (B's threads spread as A's); a fresh fleet (prefix) per side.
  local q=bench_fair fleets=()
  declare_queue "$q"
  fair_part b && fleets=("fleet|$keys|b_paced|" "fleet_off|$keys|b_paced|SENDGATE_FAIR_SHARE=off"
    "fleet_weights_3_1|$wkeys|b_greedy|")
  for spec in "${fleets[@]}"; do
    IFS='|' read -r side k b vars <<< "$spec"
    local extra=(); [ -n "$vars" ] && extra=("$vars")
    local prefix="bench-fair-$STAMP-$side" reps=() i
    purge "$q"
    for i in 0 1 2; do
      start_sendgate fair-$side-$i "${P_FAIR_FLEET[$i]}" SENDGATE_WORKERS=1 SENDGATE_QUEUES="$q" \
        SENDGATE_API_KEYS_FILE="$k" SERVICEBUS_SEND_MAX_QUEUE_DEPTH=$FAIR_CEILING \
        SENDGATE_RABBITMQ_DEPTH_SOURCE=amqp SENDGATE_COORDINATION=redis \
        SENDGATE_REDIS_URL="$REDIS_URL" SENDGATE_REDIS_PREFIX="$prefix" SENDGATE_REDIS_TIMEOUT_MS=500 \
        "${extra[@]}"
      reps+=("$PID")
    done
    wait_redis_mode "${P_FAIR_FLEET[@]}"
    # B paced on the third replica only; greedy (weights 3:1), its threads spread as A's.
    local bargs=("${b_paced[@]}" --b-on 2)
    [ "$b" = b_greedy ] && bargs=("${b_greedy[@]}" --b-on 0,1,2)
    record "$(fairshare $t12 --addr "$(addrs "${P_FAIR_FLEET[@]}")" --queue "$q" --ceiling $FAIR_CEILING \
      --duration "$D12" --tenants a,b "${a_greedy[@]}" --a-on 0,1,2 "${bargs[@]}" \
      --drain amqp --drain-rate $FAIR_DRAIN --amqp-url "$AMQP_URL")" \
      comparison=fair side="$side" round=1 level=fleet3 settings="$vars"
    for pid in "${reps[@]}"; do stop "$pid"; done
    redis_forget "$prefix"
  done
  purge "$q"

  # c) Criticality: nothing drains, two greedy senders (4 threads each) fill the queue to
  #    its ceiling, one sheddable, one default; the backlog each level's first refusal
  #    names. One tenant (one key; the sheddable half lowers itself with
  #    Sendgate-Criticality), and two tenants (the sheddable one by its key).
  local levels=()
  fair_part c && levels=("levels_one_tenant|$keys|$ta|$ta" "levels_two_tenants|$lkeys|$ta|$tb")
  for spec in "${levels[@]}"; do
    IFS='|' read -r side k tok_s tok_d <<< "$spec"
    data="$OUT/fair-data-$side"
    start_fair_embedded fair-$side "$k" "$data"
    sg=$PID
    local crit=(); [ "$side" = levels_one_tenant ] && crit=(--shed-criticality sheddable)
    record "$(fairshare 60 --addr 127.0.0.1:$P_FAIR --queue fair --ceiling $FAIR_CEILING \
      --duration 5 --tenants shed,default \
      --shed-token "$tok_s" --shed-kind greedy --shed-threads 4 --shed-retry-ms 20 "${crit[@]}" \
      --default-token "$tok_d" --default-kind greedy --default-threads 4 --default-retry-ms 20 \
      --drain none --sendgate "$BIN/sendgate" --data-dir "$data")" \
      comparison=fair_levels side="$side" round=1 level=$FAIR_CEILING
    stop "$sg"
    rm -rf "$data"
  done

  fair_part d || return 0
  # d) The cost with one tenant (comparison 2's keys file: 5 keys, one sending), this build
  #    against FAIR_BASE_COMMIT's: instructions per request under callgrind (the primary
  #    measure: the machine is shared), then wall-clock, sides alternating.
  local round mode bin label line
  for round in $(seq 1 "$FAIR_COST_ROUNDS"); do
    for mode in reject accept; do
      for label in head base; do
        bin="$BIN/sendgate"; [ "$label" = base ] && bin="$FAIR_BASE_BIN"
        line=$(timeout 900 ./bench/callgrind.sh "$mode" "$bin" "$FAIR_CALLGRIND_N" 2>>"$OUT/fair-callgrind.log" | tail -1 || true)
        echo "$line" >> "$OUT/fair-callgrind.log"
        record "$(echo "$line" | sed -n 's/.*: \([0-9]*\) Ir per request (\([0-9]*\) over \([0-9]*\);.*/{"ir_per_request": \1, "ir_total": \2, "requests": \3}/p')" \
          comparison=fair_cost_ir side="$label" round="$round" level="$mode"
      done
    done
  done
  # Wall-clock: the 429 path (comparison 2's setup: a queue over a ceiling of 1, cached) and
  # accepted sends (64 in flight, ceiling 10⁹), each build on its own port, alternating.
  declare_queue bench_full; purge bench_full
  for _ in $(seq 1 10); do
    rmq -X POST -H 'content-type: application/json' \
      -d '{"properties":{"delivery_mode":2},"routing_key":"bench_full","payload":"{}","payload_encoding":"string"}' \
      "$MGMT/api/exchanges/%2F/amq.default/publish" >/dev/null
  done
  local pids=() status
  start_sendgate cost-head-reject $P_COST_HEAD_R SENDGATE_QUEUES=bench_full SERVICEBUS_SEND_MAX_QUEUE_DEPTH=1
  pids+=("$PID")
  start_sendgate cost-head-accept $P_COST_HEAD_A
  pids+=("$PID")
  local save=$BIN; BIN=$FAIR_BASE_TARGET/release
  start_sendgate cost-base-reject $P_COST_BASE_R SENDGATE_QUEUES=bench_full SERVICEBUS_SEND_MAX_QUEUE_DEPTH=1
  pids+=("$PID")
  start_sendgate cost-base-accept $P_COST_BASE_A
  pids+=("$PID")
  BIN=$save
  for port in $P_COST_HEAD_R $P_COST_BASE_R; do
    for _ in $(seq 1 100); do
      status=$(curl -s -o /dev/null -w '%{http_code}' -X POST -H "Authorization: Bearer $SENDER_TOKEN" \
        -H 'Content-Type: application/json' -d '{}' "http://127.0.0.1:$port/v1/queues/bench_full/messages" || true)
      [ "$status" = 429 ] && break
      sleep 0.2
    done
    [ "$status" = 429 ] || { log "the gateway on $port never answered 429 (last: $status)"; exit 1; }
  done
  for round in $(seq 1 "$ROUNDS_REJECT"); do
    for spec in head:$P_COST_HEAD_R base:$P_COST_BASE_R; do
      record "$(BENCH_TOKEN="$SENDER_TOKEN" timeout 120 wrk -t2 -c64 -d"${D}s" --timeout 5s \
        -s "$ROOT/bench/lua/post.lua" "http://127.0.0.1:${spec#*:}/v1/queues/bench_full/messages" 2>&1 \
        | sed -n 's/^BENCH_JSON //p')" \
        comparison=fair_cost_wall side="${spec%%:*}" round="$round" level=reject
    done
  done
  for round in $(seq 1 "$ROUNDS"); do
    for spec in head:$P_COST_HEAD_A base:$P_COST_BASE_A; do
      purge bench
      record "$(loadgen http --addr 127.0.0.1:${spec#*:} --token "$SENDER_TOKEN" \
        --concurrency 64 --duration $D --warmup $WARM)" \
        comparison=fair_cost_wall side="${spec%%:*}" round="$round" level=accept
    done
  done
  for pid in "${pids[@]}"; do stop "$pid"; done
  purge bench; purge bench_full
}

# ---------------------------------------------------------------------------------------
# 13. OpenTelemetry (issue 26): the 429 path and accepted sends with OTLP export on (to a
#     local sink: bench's otlpsink, which reads each export and answers 200) against export
#     off, the same build: instructions per request under callgrind (the primary measure,
#     the export thread's work included), then wall-clock, sides alternating. Under
#     callgrind a third side exports over gRPC (otlpsink's gRPC services: what the Container
#     Apps agent takes). The exporter's defaults (a batch of spans every 5 s or 512 spans,
#     metrics every 60 s).
compare_otel() {
  log "13. OpenTelemetry export on (local OTLP sink) vs off: the 429 path and accepted sends"
  start otlpsink "$BIN/otlpsink" 127.0.0.1:$P_OTLP 1700
  local sink=$PID
  start otlpsink-grpc "$BIN/otlpsink" 127.0.0.1:$P_OTLP_GRPC 1700 grpc
  local grpc_sink=$PID
  local on_env="OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:$P_OTLP"
  local grpc_env="OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:$P_OTLP_GRPC OTEL_EXPORTER_OTLP_PROTOCOL=grpc"
  local round mode side line
  for round in $(seq 1 "$OTEL_CALLGRIND_ROUNDS"); do
    for mode in reject accept; do
      for side in off on grpc; do
        local extra=""
        [ "$side" = on ] && extra=$on_env
        [ "$side" = grpc ] && extra=$grpc_env
        # CALLGRIND_SETTLE: the schedule delay and a second more, so the last batch's
        # encoding and post count too (both sides wait alike).
        line=$(CALLGRIND_SETTLE=6 CALLGRIND_ENV="$extra" timeout 900 ./bench/callgrind.sh "$mode" "$BIN/sendgate" "$OTEL_CALLGRIND_N" \
          2>>"$OUT/otel-callgrind.log" | tail -1 || true)
        echo "$side: $line" >> "$OUT/otel-callgrind.log"
        record "$(echo "$line" | sed -n 's/.*: \([0-9]*\) Ir per request (\([0-9]*\) over \([0-9]*\);.*/{"ir_per_request": \1, "ir_total": \2, "requests": \3}/p')" \
          comparison=otel_cost_ir side="$side" round="$round" level="$mode"
      done
    done
  done
  # Wall-clock: comparison 2's 429 (a queue over a ceiling of 1, cached) and accepted sends
  # (64 in flight, ceiling 10⁹), each side on its own port, alternating.
  declare_queue bench_full; purge bench_full
  for _ in $(seq 1 10); do
    rmq -X POST -H 'content-type: application/json' \
      -d '{"properties":{"delivery_mode":2},"routing_key":"bench_full","payload":"{}","payload_encoding":"string"}' \
      "$MGMT/api/exchanges/%2F/amq.default/publish" >/dev/null
  done
  local pids=() status port
  start_sendgate otel-off-reject $P_OTEL_OFF_R SENDGATE_QUEUES=bench_full SERVICEBUS_SEND_MAX_QUEUE_DEPTH=1
  pids+=("$PID")
  start_sendgate otel-on-reject $P_OTEL_ON_R SENDGATE_QUEUES=bench_full SERVICEBUS_SEND_MAX_QUEUE_DEPTH=1 "$on_env"
  pids+=("$PID")
  start_sendgate otel-off-accept $P_OTEL_OFF_A
  pids+=("$PID")
  start_sendgate otel-on-accept $P_OTEL_ON_A "$on_env"
  pids+=("$PID")
  for port in $P_OTEL_OFF_R $P_OTEL_ON_R; do
    for _ in $(seq 1 100); do
      status=$(curl -s -o /dev/null -w '%{http_code}' -X POST -H "Authorization: Bearer $SENDER_TOKEN" \
        -H 'Content-Type: application/json' -d '{}' "http://127.0.0.1:$port/v1/queues/bench_full/messages" || true)
      [ "$status" = 429 ] && break
      sleep 0.2
    done
    [ "$status" = 429 ] || { log "the gateway on $port never answered 429 (last: $status)"; exit 1; }
  done
  for round in $(seq 1 "$ROUNDS_REJECT"); do
    for spec in off:$P_OTEL_OFF_R on:$P_OTEL_ON_R; do
      record "$(BENCH_TOKEN="$SENDER_TOKEN" timeout 120 wrk -t2 -c64 -d"${D}s" --timeout 5s \
        -s "$ROOT/bench/lua/post.lua" "http://127.0.0.1:${spec#*:}/v1/queues/bench_full/messages" 2>&1 \
        | sed -n 's/^BENCH_JSON //p')" \
        comparison=otel_cost_wall side="${spec%%:*}" round="$round" level=reject
    done
  done
  for round in $(seq 1 "$ROUNDS"); do
    for spec in off:$P_OTEL_OFF_A on:$P_OTEL_ON_A; do
      purge bench
      record "$(loadgen http --addr 127.0.0.1:${spec#*:} --token "$SENDER_TOKEN" \
        --concurrency 64 --duration $D --warmup $WARM)" \
        comparison=otel_cost_wall side="${spec%%:*}" round="$round" level=accept
    done
  done
  # What the sink took, and what the gateways dropped (none expected: the sink answers).
  local observer="Authorization: Bearer $OBSERVER_TOKEN"
  for port in $P_OTEL_ON_R $P_OTEL_ON_A; do
    curl -sf -H "$observer" "http://127.0.0.1:$port/metrics" | grep '^sendgate_otel_spans' \
      | sed "s/^/$port: /" >> "$OUT/otel-spans.log" || true
  done
  for pid in "${pids[@]}"; do stop "$pid"; done
  stop "$sink"; stop "$grpc_sink"
  tail -3 "$OUT/otlpsink.log" >> "$OUT/otel-spans.log" 2>/dev/null || true
  tail -3 "$OUT/otlpsink-grpc.log" >> "$OUT/otel-spans.log" 2>/dev/null || true
  purge bench; purge bench_full
}

# Comparison 14 (issue 39): the open-loop overload scenarios of ./bench/overload.sh, on
# every backend, appended to this run's results; the plots beside the report.
compare_overload() {
  log "14. overload, open-loop: sweep, step, retry storm, priority mix, weights, capacity drop, low ceiling"
  local q=(); [ "$QUICK" = 1 ] && q=(--quick)
  ./bench/overload.sh "${q[@]}" --out "$OUT" --bin "$BIN" --no-report || log "overload.sh failed (its runs so far are kept)"
  . scripts/pyvenv.sh
  ensure_venv "$ROOT/.venv-bench" "matplotlib==3.11.2" >&2
  "$ROOT/.venv-bench/bin/python" bench/plot_overload.py "$OUT" "$OUT" || log "the overload plots failed"
}

# ---------------------------------------------------------------------------------------
started=$(date +%s)
setup
want 1 && compare_accept
want 2 && compare_reject
want 3 && compare_admin
want 4 && compare_rss
[ -n "${SG_ACCEPT_PID:-}" ] && { stop "$SG_ACCEPT_PID"; stop "$PX_A_PID"; }
want 6 && compare_fleet
want 7 && compare_amplify
want 8 && compare_restart
want 9 && compare_hostile
want 10 && compare_batch
want 11 && compare_batch_rss
want 12 && compare_fair
want 13 && compare_otel
want 14 && compare_overload
want 5 && compare_micro
jq -cn --arg s "$(( $(date +%s) - started ))" '{comparison: "run", seconds: ($s|tonumber)}' >> "$RESULTS"

python3 bench/report.py "$OUT" > "$OUT/benchmarks.md"
copy_plots() { if want 14 && ls "$OUT"/overload-*.png >/dev/null 2>&1; then mkdir -p docs/benchmarks; cp "$OUT"/overload-*.png docs/benchmarks/; fi; }
if [ "$QUICK" = 0 ] && [ "$ONLY" = "$ALL" ]; then
  cp "$OUT/benchmarks.md" docs/benchmarks.md
  copy_plots
  log "done in $(( $(date +%s) - started )) s: docs/benchmarks.md written; raw results in $OUT"
elif [ "$UPDATE_DOCS" = 1 ]; then
  python3 bench/report.py "$OUT" --carry-over docs/benchmarks.md > "$OUT/benchmarks-merged.md"
  cp "$OUT/benchmarks-merged.md" docs/benchmarks.md
  copy_plots
  log "done in $(( $(date +%s) - started )) s: docs/benchmarks.md written (comparisons $ONLY from this run, the rest carried over); raw results in $OUT"
else
  log "done in $(( $(date +%s) - started )) s: report in $OUT/benchmarks.md (a quick or partial run leaves docs/benchmarks.md as it is)"
fi
