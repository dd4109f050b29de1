#!/usr/bin/env bash
# Overload, open-loop (issue 39; comparison 14 of ./bench/run.sh). One command:
#
#   ./bench/overload.sh                 # every scenario on every backend, full windows
#   ./bench/overload.sh --quick         # the same, short windows (~12 minutes)
#   ./bench/overload.sh --quick --backends embedded --update-docs
#                                       # some backends only (embedded, rabbitmq_exact,
#                                       # rabbitmq_management, fleet3), and rewrite section 14
#                                       # of docs/benchmarks.md and its plots from this run
#   ./bench/overload.sh --quick --label "before issue 39's changes"
#                                       # a note the report prints beside the commit
#   ./bench/overload.sh --scenarios step,storm
#                                       # some scenarios only (sweep, step, storm, priority,
#                                       # weights, drop, low_ceiling)
#
# Every scenario runs bench's `openloop` (arrivals on a seeded Poisson schedule, latency from
# each request's intended send time, a consumer draining at D) against a fresh gateway:
#   sweep        0.5×, 1×, 2×, 5×, 10× D in turn (D 100/s, ceiling 200), refusals dropped
#   step         0.5× → 5× → 10× → 0.5× D, refusals dropped
#   storm        0.5× → 5× → 0.5× with each producer policy: naive (3 immediate retries),
#                honour (Retry-After with jitter, 120 s give-up), client (sendgate-client)
#   priority     5× D, 60 % sheddable / 30 % default / 10 % critical, one tenant
#   weights      two tenants weighted 3:1, each offering 5× a worker of 8/s, ceiling 20
#   drop         0.8× D offered while D halves for a while (Retry-After honoured)
#   low_ceiling  ceiling 50 below D × TTL (D 100/s, TTL 1 s): 0.5× → 2× → 0.5×
# Backends: the embedded default (worker: `sendgate queue receive`), RabbitMQ with the
# exact (amqp) and the management depth source (worker: basic.get), and 3 replicas on
# RabbitMQ + Redis (exact depth).
#
# Results: bench/results/overload-<stamp>/results.jsonl (one summary line per run, the
# per-second series in it), report.md (section 14, by bench/report_overload.py) and the
# plots (PNG, matplotlib in .venv-bench, installed by scripts/pyvenv.sh). `--out DIR` appends
# to DIR/results.jsonl instead (a second backend added to a first run's report), `--bin DIR`
# takes the binaries from DIR without building; ./bench/run.sh passes both and --no-report.
#
# OPENLOOP_KEYS=0 sends the none, naive and honour producers' messages without an
# Idempotency-Key (openloop --keys off; by default each message has its own, on every
# attempt), so a queue_full promises them no place to claim: with --label, the run before
# claiming places, on the same binaries.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

QUICK=0; UPDATE_DOCS=0; OUT=""; BIN=""; BUILD=1; LABEL=""; REPORT=1
BACKENDS=embedded,rabbitmq_exact,rabbitmq_management,fleet3
SCENARIOS=sweep,step,storm,priority,weights,drop,low_ceiling
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1 ;;
    --update-docs) UPDATE_DOCS=1 ;;
    --backends) BACKENDS="$2"; shift ;;
    --scenarios) SCENARIOS="$2"; shift ;;
    --label) LABEL="$2"; shift ;;
    --out) OUT="$2"; shift ;;
    --no-report) REPORT=0 ;;
    --bin) BIN="$2"; BUILD=0; shift ;;
    -h|--help) sed -n '2,39p' "$0"; exit 0 ;;
    *) echo "overload.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
has() { [[ ",$1," == *",$2,"* ]]; }

# Windows (seconds): a phase of the sweep, of the step, the storm's overload and its
# recovery, the priority and weights runs, the capacity drop, the low ceiling's phases.
if [ "$QUICK" = 1 ]; then
  W_SWEEP=5; W_STEP=8; W_STORM=10; W_RECOVER=15; W_PRIO=10; W_DROP=10; W_LOW=8
else
  W_SWEEP=20; W_STEP=30; W_STORM=30; W_RECOVER=60; W_PRIO=30; W_DROP=30; W_LOW=20
fi
D=100; CEILING=200
GIVE_UP=120
case "${OPENLOOP_KEYS:-1}" in
  1) KEYS_ARG=on ;;
  0) KEYS_ARG=off ;;
  *) echo "overload.sh: OPENLOOP_KEYS is 0 or 1, not ${OPENLOOP_KEYS}" >&2; exit 2 ;;
esac

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-${BENCH_TARGET_DIR:-$ROOT/target/bench}}"
BIN=${BIN:-$CARGO_TARGET_DIR/release}
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
OUT=${OUT:-$ROOT/bench/results/overload-$STAMP}
mkdir -p "$OUT"
RESULTS="$OUT/results.jsonl"
touch "$RESULTS"
log() { echo "[overload $(date -u +%H:%M:%S)] $*" >&2; }

MGMT=http://127.0.0.1:15672
AMQP_URL='amqp://guest:guest@127.0.0.1:5672/%2f'
REDIS_URL=redis://127.0.0.1:6379
P_ONE=18790; P_FLEET=(18791 18792 18793)
Q=bench_overload

PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM
start() { # name, command...: in the background under a 30-minute bound; sets PID
  local name=$1; shift
  timeout -s TERM 1800 "$@" > "$OUT/$name.log" 2>&1 &
  PID=$!
  PIDS+=("$PID")
}
stop() { kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }
rmq() { curl -sf -u guest:guest "$@"; }
declare_queue() { rmq -X PUT -H 'content-type: application/json' -d '{"durable":true}' "$MGMT/api/queues/%2F/$1" >/dev/null; }
purge() { rmq -X DELETE "$MGMT/api/queues/%2F/$1/contents" >/dev/null || true; }
redis_forget() {
  redis-cli -h 127.0.0.1 EVAL \
    "for _,k in ipairs(redis.call('KEYS', ARGV[1])) do redis.call('DEL', k) end" 0 "$1:*" >/dev/null || true
}
token() { echo "sg_$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')"; }
key_entry() { # name, token, extra TOML lines
  printf '[[keys]]\nname = "%s"\nsha256 = "%s"\nroles = ["%s"]\nqueues = ["*"]\n%s\n' \
    "$1" "$(printf %s "$2" | sha256sum | cut -d' ' -f1)" "${4:-sender}" "$3"
}

# ---------------------------------------------------------------------------------------
if [ "$BUILD" = 1 ]; then
  log "building sendgate (release) and bench's openloop into $CARGO_TARGET_DIR"
  cargo build --release --quiet --bin sendgate
  (cd bench && cargo build --release --quiet --bin openloop)
fi
if has "$BACKENDS" rabbitmq_exact || has "$BACKENDS" rabbitmq_management || has "$BACKENDS" fleet3; then
  ./scripts/ensure-rabbitmq.sh >/dev/null
  declare_queue "$Q"
fi
has "$BACKENDS" fleet3 && ./scripts/ensure-redis.sh >/dev/null

# Tokens: a producer whose key may send `critical` (each send lowers itself with
# Sendgate-Criticality; without a header it sends at `critical`: the default mix names its
# level), two tenants weighted 3:1, and an observer.
T_ONE=$(token); T_A=$(token); T_B=$(token); T_OBS=$(token)
KEYS="$OUT/overload-keys.toml"
{
  key_entry producer "$T_ONE" 'criticality = "critical"'
  key_entry tenant-a "$T_A" 'weight = 3'
  key_entry tenant-b "$T_B" 'weight = 1'
  key_entry observer "$T_OBS" "" observer
} > "$KEYS"

wait_ready() { # port
  for _ in $(seq 1 300); do
    curl -sf "http://127.0.0.1:$1/health/ready" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  log "the gateway on $1 did not become ready"; return 1
}
wait_fleet() { # port...
  local port mode
  for port in "$@"; do
    for _ in $(seq 1 100); do
      mode=$(curl -sf -H "Authorization: Bearer $T_OBS" "http://127.0.0.1:$port/health/detailed" \
        | jq -r '.coordination.mode // "none"' 2>/dev/null || echo none)
      [ "$mode" = redis ] && break
      sleep 0.1
    done
  done
}

GW_PIDS=(); GW_ADDR=""; DRAIN_ARGS=(); DATA=""; PREFIX=""
# A fresh gateway (or fleet) for one run on `backend` with this ceiling: sets GW_ADDR and
# the consumer's arguments for openloop.
gateway_up() { # backend, ceiling, name
  local backend=$1 ceiling=$2 name=$3 i
  GW_PIDS=()
  case "$backend" in
    embedded)
      DATA="$OUT/data-$name"; rm -rf "$DATA"; mkdir -p "$DATA"
      start "gw-$name" env RUST_LOG=warn SENDGATE_LISTEN=127.0.0.1:$P_ONE SENDGATE_BACKEND=embedded \
        SENDGATE_DATA_DIR="$DATA" SENDGATE_QUEUES=$Q SENDGATE_API_KEYS_FILE="$KEYS" \
        SERVICEBUS_SEND_MAX_QUEUE_DEPTH="$ceiling" "$BIN/sendgate"
      GW_PIDS+=("$PID"); wait_ready $P_ONE
      GW_ADDR=127.0.0.1:$P_ONE
      DRAIN_ARGS=(--drain embedded --sendgate "$BIN/sendgate" --data-dir "$DATA") ;;
    rabbitmq_exact|rabbitmq_management)
      purge "$Q"
      local source=amqp; [ "$backend" = rabbitmq_management ] && source=management
      start "gw-$name" env RUST_LOG=warn SENDGATE_LISTEN=127.0.0.1:$P_ONE SENDGATE_BACKEND=rabbitmq \
        SENDGATE_QUEUES=$Q SENDGATE_API_KEYS_FILE="$KEYS" SERVICEBUS_SEND_MAX_QUEUE_DEPTH="$ceiling" \
        SENDGATE_RABBITMQ_DEPTH_SOURCE=$source "$BIN/sendgate"
      GW_PIDS+=("$PID"); wait_ready $P_ONE
      GW_ADDR=127.0.0.1:$P_ONE
      DRAIN_ARGS=(--drain amqp --amqp-url "$AMQP_URL") ;;
    fleet3)
      purge "$Q"
      PREFIX="bench-overload-$STAMP-$name"
      local addrs=()
      for i in 0 1 2; do
        start "gw-$name-$i" env RUST_LOG=warn SENDGATE_LISTEN=127.0.0.1:${P_FLEET[$i]} \
          SENDGATE_BACKEND=rabbitmq SENDGATE_WORKERS=1 SENDGATE_QUEUES=$Q \
          SENDGATE_API_KEYS_FILE="$KEYS" SERVICEBUS_SEND_MAX_QUEUE_DEPTH="$ceiling" \
          SENDGATE_RABBITMQ_DEPTH_SOURCE=amqp SENDGATE_COORDINATION=redis \
          SENDGATE_REDIS_URL="$REDIS_URL" SENDGATE_REDIS_PREFIX="$PREFIX" SENDGATE_REDIS_TIMEOUT_MS=500 \
          "$BIN/sendgate"
        GW_PIDS+=("$PID"); addrs+=("127.0.0.1:${P_FLEET[$i]}")
      done
      for i in 0 1 2; do wait_ready "${P_FLEET[$i]}"; done
      wait_fleet "${P_FLEET[@]}"
      GW_ADDR=$(IFS=,; echo "${addrs[*]}")
      DRAIN_ARGS=(--drain amqp --amqp-url "$AMQP_URL") ;;
    *) log "unknown backend $backend"; exit 2 ;;
  esac
}
gateway_down() { # backend
  local pid
  for pid in "${GW_PIDS[@]}"; do stop "$pid"; done
  case "$1" in
    embedded) rm -rf "$DATA" ;;
    fleet3) redis_forget "$PREFIX"; purge "$Q" ;;
    *) purge "$Q" ;;
  esac
}

# One run: a fresh gateway, openloop, one summary line in results.jsonl.
run_one() { # backend, scenario, side, ceiling, openloop args...
  local backend=$1 scenario=$2 side=$3 ceiling=$4; shift 4
  local name="$backend-$scenario-$side"
  log "$name"
  gateway_up "$backend" "$ceiling" "$name"
  local line
  line=$(timeout 900 "$BIN/openloop" --addr "$GW_ADDR" --queue $Q --ceiling "$ceiling" \
    --timeline "$OUT/timeline-$name.csv" --keys "$KEYS_ARG" \
    "${DRAIN_ARGS[@]}" "$@" 2>"$OUT/openloop-$name.log" | tail -1 || true)
  gateway_down "$backend"
  if ! echo "$line" | jq -e '.summary == true' >/dev/null 2>&1; then
    log "run failed: $name (see $OUT/openloop-$name.log)"
    line='{"failed": true}'
  fi
  echo "$line" | jq -c --arg b "$backend" --arg s "$scenario" --arg side "$side" \
    --arg quick "$QUICK" --arg lbl "$LABEL" --arg load "$(cut -d' ' -f1 /proc/loadavg)" \
    --arg commit "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" \
    '. + {comparison: "overload", level: $b, scenario: $s, side: $side, quick: ($quick == "1"), "label": $lbl,
          loadavg_1m: ($load|tonumber), commit: $commit}' >> "$RESULTS"
  echo "$line" | jq -c --arg n "$name" '{run: $n, attempts_per_message, goodput_per_s, settle,
    refusals_stop, backlog_max, retry_after_p50_s}' >&2 2>/dev/null || true
}

one_tenant="producer:$T_ONE"
for backend in ${BACKENDS//,/ }; do
  if has "$SCENARIOS" sweep; then
    run_one "$backend" sweep none $CEILING --drain-rate $D --tenants "$one_tenant" --mix default:100 \
      --phases "0.5:$W_SWEEP,1:$W_SWEEP,2:$W_SWEEP,5:$W_SWEEP,10:$W_SWEEP" --policy none --tail-s 2
  fi
  if has "$SCENARIOS" step; then
    run_one "$backend" step none $CEILING --drain-rate $D --tenants "$one_tenant" --mix default:100 \
      --phases "0.5:$W_STEP,5:$W_STEP,10:$W_STEP,0.5:$W_STEP" --policy none --tail-s 2
  fi
  if has "$SCENARIOS" storm; then
    for policy in naive honour client; do
      run_one "$backend" storm "$policy" $CEILING --drain-rate $D --tenants "$one_tenant" \
        --mix default:100 --phases "0.5:5,5:$W_STORM,0.5:$W_RECOVER" --policy "$policy" \
        --give-up-s $GIVE_UP --tail-s 2
    done
  fi
  if has "$SCENARIOS" priority; then
    run_one "$backend" priority none $CEILING --drain-rate $D --tenants "$one_tenant" \
      --mix sheddable:60,default:30,critical:10 --phases "0.5:3,5:$W_PRIO,0.5:3" --policy none --tail-s 2
  fi
  if has "$SCENARIOS" weights; then
    run_one "$backend" weights none 20 --drain-rate 8 --tenants "a:$T_A:3:1,b:$T_B:1:1" \
      --mix default:100 --phases "5:$W_PRIO" --policy none --tail-s 2 --tick-ms 125
  fi
  if has "$SCENARIOS" drop; then
    run_one "$backend" drop honour $CEILING --drain-rate $D --tenants "$one_tenant" --mix default:100 \
      --phases "0.8:$(( W_DROP * 2 + W_DROP / 2 ))" --drain-phases "$D:$(( W_DROP / 2 )),$(( D / 2 )):$W_DROP" \
      --policy honour --give-up-s $GIVE_UP --tail-s 2
  fi
  if has "$SCENARIOS" low_ceiling; then
    run_one "$backend" low_ceiling none 50 --drain-rate $D --tenants "$one_tenant" --mix default:100 \
      --phases "0.5:3,2:$W_LOW,0.5:$W_LOW" --policy none --tail-s 2
  fi
done

[ "$REPORT" = 1 ] || exit 0
python3 bench/report_overload.py "$OUT" > "$OUT/report.md"
log "section 14 in $OUT/report.md"
# The plots: matplotlib in the project's venv, pinned (scripts/pyvenv.sh).
. scripts/pyvenv.sh
ensure_venv "$ROOT/.venv-bench" "matplotlib==3.11.2" >&2
"$ROOT/.venv-bench/bin/python" bench/plot_overload.py "$OUT" "$OUT"
if [ "$UPDATE_DOCS" = 1 ]; then
  python3 bench/report_overload.py "$OUT" --splice docs/benchmarks.md
  mkdir -p docs/benchmarks
  cp "$OUT"/overload-*.png docs/benchmarks/
  log "docs/benchmarks.md section 14 and docs/benchmarks/overload-*.png rewritten from $OUT"
fi
