#!/usr/bin/env bash
# Instructions per request under `valgrind --tool=callgrind` (repeatable whatever the
# machine's load, unlike wall-clock numbers): see "Instruction counts per request" in
# bench/analysis.md.
#
#   ./bench/callgrind.sh reject BINARY [N]        # sendgate's 429 path (embedded backend)
#   ./bench/callgrind.sh reject-bare BINARY [N]   # bench's bare429
#   ./bench/callgrind.sh accept BINARY [N]        # sendgate's 201 path (local RabbitMQ)
#   ./bench/callgrind.sh accept-bare BINARY [N]   # bench's bareforward
#   ./bench/callgrind.sh accept-fleet BINARY [N]  # the 201 path as one replica of a fleet
#                                                 # on the local Redis (a prefix of its own)
#
# BINARY is a release build (e.g. target/bench/release/sendgate, or one of another commit
# from its own worktree). 200 requests of warm-up, then the counters are zeroed and N
# (default 2000) requests are sent on one keep-alive connection (1 KB JSON body, bearer
# token, 5 API keys), then dumped. Prints Ir per request and leaves the profile in
# bench/results/callgrind/ for `callgrind_annotate --inclusive=yes`.
#
# CALLGRIND_ENV="VAR=value ..." adds variables to sendgate's environment (reject, accept,
# accept-fleet), e.g. comparison 13's OTEL_EXPORTER_OTLP_ENDPOINT; CALLGRIND_SETTLE=S waits S
# seconds after the last request before the counters are dumped.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=$1 bin=$(realpath "$2") n=${3:-2000}
out=bench/results/callgrind; mkdir -p "$out"
label="$mode-$(basename "$bin")-$(date -u +%H%M%S)"
port=18899
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT

token="sg_$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')"
{
  for i in 1 2 3 4; do
    printf '[[keys]]\nname = "other-%s"\nsha256 = "%s"\nroles = ["sender"]\nqueues = ["*"]\n\n' \
      "$i" "$(head -c 32 /dev/urandom | sha256sum | cut -d' ' -f1)"
  done
  printf '[[keys]]\nname = "bench-sender"\nsha256 = "%s"\nroles = ["sender"]\nqueues = ["*"]\n' \
    "$(printf %s "$token" | sha256sum | cut -d' ' -f1)"
} > "$work/keys.toml"

cat > "$work/client.py" <<'PY'
import socket, sys, collections
port, n, token, queue = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
head, tail = '{"bench":true,"pad":"', '"}'
body = (head + "x" * (1024 - len(head) - len(tail)) + tail).encode()
req = ("\r\n".join([f"POST /v1/queues/{queue}/messages HTTP/1.1", f"Host: 127.0.0.1:{port}",
       "Content-Type: application/json", f"Content-Length: {len(body)}",
       f"Authorization: Bearer {token}"]) + "\r\n\r\n").encode() + body
s = socket.create_connection(("127.0.0.1", port))
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
f = s.makefile("rb")
counts = collections.Counter()
for _ in range(n):
    s.sendall(req)
    status = f.readline().split()[1].decode()
    length = 0
    while (line := f.readline()) not in (b"\r\n", b""):
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            length = int(v)
    f.read(length)
    counts[status] += 1
print(dict(counts), file=sys.stderr)
PY

rmq() { curl -sf -u guest:guest "$@"; }
MGMT=http://127.0.0.1:15672
cg=(valgrind --tool=callgrind --callgrind-out-file="$out/$label.%p")
read -r -a extra <<< "${CALLGRIND_ENV:-}"
case $mode in
  reject)
    queue=bench_full
    env RUST_LOG=warn "${extra[@]}" SENDGATE_LISTEN=127.0.0.1:$port SENDGATE_BACKEND=embedded \
      SENDGATE_DATA_DIR="$work/data" SENDGATE_QUEUES=$queue SENDGATE_API_KEYS_FILE="$work/keys.toml" \
      SERVICEBUS_SEND_MAX_QUEUE_DEPTH=1 SENDGATE_DEPTH_TTL_MS=3600000 \
      "${cg[@]}" "$bin" > "$work/server.log" 2>&1 & ;;
  reject-bare)
    queue=bench_full
    "${cg[@]}" "$bin" 127.0.0.1:$port 1700 > "$work/server.log" 2>&1 & ;;
  accept|accept-bare|accept-fleet)
    queue=bench
    rmq -X PUT -H 'content-type: application/json' -d '{"durable":true}' "$MGMT/api/queues/%2F/$queue" >/dev/null
    rmq -X DELETE "$MGMT/api/queues/%2F/$queue/contents" >/dev/null || true
    fleet=()
    [ "$mode" = accept-fleet ] && fleet=(SENDGATE_COORDINATION=redis
      SENDGATE_REDIS_URL=redis://127.0.0.1:6379 SENDGATE_REDIS_PREFIX="callgrind-$label")
    if [ "$mode" != accept-bare ]; then
      env RUST_LOG=warn "${extra[@]}" "${fleet[@]}" SENDGATE_LISTEN=127.0.0.1:$port SENDGATE_BACKEND=rabbitmq \
        SENDGATE_QUEUES=$queue SENDGATE_API_KEYS_FILE="$work/keys.toml" \
        SERVICEBUS_SEND_MAX_QUEUE_DEPTH=1000000000 SENDGATE_DEPTH_TTL_MS=3600000 \
        SENDGATE_PROBE_INTERVAL_S=3600 "${cg[@]}" "$bin" > "$work/server.log" 2>&1 &
    else
      "${cg[@]}" "$bin" 127.0.0.1:$port 'amqp://guest:guest@127.0.0.1:5672/%2f' 600 > "$work/server.log" 2>&1 &
    fi ;;
  *) echo "callgrind.sh: unknown mode $mode" >&2; exit 2 ;;
esac
vpid=$!
# Ready: sendgate's /health/ready answers 200, a bare tool answers 404 there.
for _ in $(seq 1 900); do
  code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health/ready" || true)
  [ "$code" = 200 ] || [ "$code" = 404 ] && break
  sleep 0.2
done
python3 "$work/client.py" $port 200 "$token" $queue
callgrind_control -z $vpid >/dev/null
python3 "$work/client.py" $port "$n" "$token" $queue
# CALLGRIND_SETTLE: seconds to wait before the dump, so work the requests left behind
# (comparison 13: the spans' last export, up to OTEL_BSP_SCHEDULE_DELAY later) counts too.
sleep "${CALLGRIND_SETTLE:-0}"
callgrind_control -d $vpid >/dev/null
sleep 1
kill $vpid; wait $vpid 2>/dev/null || true
[ "$queue" = bench ] && { rmq -X DELETE "$MGMT/api/queues/%2F/$queue/contents" >/dev/null || true; }
dump=$(ls -t "$out/$label".*.1 | head -1)
total=$(awk '/^totals:/ {print $2}' "$dump")
echo "$mode $(basename "$bin"): $((total / n)) Ir per request ($total over $n; $dump)"
