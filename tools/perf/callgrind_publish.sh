#!/bin/bash
# Instructions per published message in the broker, counted by callgrind (deterministic
# on a busy machine, where wall-clock figures are not):
#   tools/perf/callgrind_publish.sh <code-dir> <n-messages> <out-prefix> [confirm]
# Runs `python -m ackmq serve` from <code-dir> under valgrind --tool=callgrind, publishes
# N 100-byte messages with pika (transient, no confirms; with `confirm`: persistent to a
# durable queue, each waiting for its confirm), waits until the queue holds them, stops
# the broker and prints callgrind's total. With `roundtrip`: transient publishes, then a
# consumer (prefetch 100, manual acks) takes and acks all N: publish+deliver+ack. Per message = (total at N - total at 0) / N.
# PYTHON: the interpreter with ackmq's dependencies (default: python3).
set -eu
code=$1; n=$2; out=$3; mode=${4:-}
py=${PYTHON:-python3}
port=$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
data=$(mktemp -d)
cd "$code"
PYTHONHASHSEED=0 PYTHONPATH=$code valgrind --tool=callgrind --callgrind-out-file="$out.cg" \
  "$py" -m ackmq serve --port "$port" --no-stomp --no-mqtt --no-stream --no-http --data-dir "$data" > "$out.log" 2>&1 &
vp=$!
for _ in $(seq 1 600); do grep -qs "listening" "$out.log" && break; kill -0 $vp 2>/dev/null || { cat "$out.log" >&2; exit 1; }; sleep 1; done
"$py" - "$port" "$n" "$mode" <<'PY'
import sys, time, pika
port, n, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
c = pika.BlockingConnection(pika.ConnectionParameters(
    "127.0.0.1", port, heartbeat=0, blocked_connection_timeout=None, socket_timeout=600))
ch = c.channel()
props = None
if mode == "confirm":
    ch.queue_declare("cg", durable=True)
    ch.confirm_delivery()
    props = pika.BasicProperties(delivery_mode=2)
else:
    ch.queue_declare("cg")
body = b"x" * 100
for i in range(n):
    ch.basic_publish("", "cg", body, props)
    if (i + 1) % 1000 == 0:
        print(f"{i + 1} published", file=sys.stderr, flush=True)
while ch.queue_declare("cg", passive=True).method.message_count < n:
    time.sleep(0.5)
if mode == "roundtrip" and n:
    ch.basic_qos(prefetch_count=100)
    got = 0
    for method, _props, _body in ch.consume("cg"):
        got += 1
        ch.basic_ack(method.delivery_tag)
        if got == n:
            break
    ch.cancel()
c.close()
PY
kill -INT $vp; wait $vp || true
rm -rf "$data"
grep -E "^summary|^totals" "$out.cg" | head -1
