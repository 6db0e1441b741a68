"""Instructions per message in the broker for any `ackmq bench` workload, counted by
callgrind (deterministic on a busy machine, where wall-clock figures are not):

    python -m tools.perf.callgrind_bench [--small 200] [--large 1200] WORKLOAD ...

e.g. `stomp-send-stream stomp-consume-auto mqtt-publish-qos1-window mqtt-fanout`, or
AMQP 0-9-1's `fanout consume-prefetch` (with `--prefetch`, the bench's option).
Runs `python -m ackmq serve` (this checkout) under valgrind --tool=callgrind with its
STOMP and MQTT listeners on free ports, then each workload twice with `ackmq bench`
(the bench's own clients, outside valgrind): with `--small` and with `--large`
messages, the broker's counters zeroed before and dumped after each run; per message =
(large − small) / (large − small messages), so connection set-up and the workload's own
declarations cancel out. The protocols' figures beside AMQP 0-9-1's
(tools/perf/instructions.py) are in docs/performance.md.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from tools.perf.callgrind import dump, free_port, start, stop, zero


def _bench(workload: str, n: int, ports: dict[str, int], extra: list[str]) -> None:
    if workload.startswith("mqtt-"):
        family = ["--mqtt", "--mqtt-url", f"mqtt://guest:guest@127.0.0.1:{ports['mqtt']}"]
    elif workload.startswith("stomp-"):
        family = ["--stomp", "--stomp-url", f"stomp://guest:guest@127.0.0.1:{ports['stomp']}/",
                  "--stomp-prefetch", "100"]
    else:  # AMQP 0-9-1's (and 1.0's, on the same port)
        family = ["--url", f"amqp://guest:guest@127.0.0.1:{ports['amqp']}/", *extra]
    subprocess.run([sys.executable, "-m", "ackmq", "bench", *family, "--rounds", "1",
                    "--messages", str(n), workload],
                   check=True, capture_output=True, timeout=3600)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("workloads", nargs="+")
    ap.add_argument("--small", type=int, default=200)
    ap.add_argument("--large", type=int, default=1200)
    ap.add_argument("--serve-args", default="--no-stream --mqtt-port {mqtt}",
                    help="the broker's listener flags beside --stomp-port (an older tree, "
                         "run with PYTHONPATH=<its export>, may not have these: pass '')")
    ap.add_argument("--prefetch", help="consume-prefetch's prefetch counts (the bench's option)")
    args = ap.parse_args()
    extra = ["--prefetch", args.prefetch] if args.prefetch else []
    work = Path(tempfile.mkdtemp(prefix="ackmq-cgb-", dir="/var/tmp"))
    out = str(work / "cg")
    ports = {"amqp": free_port(), "stomp": free_port(), "mqtt": free_port()}
    proc, log = start(work, out, ["--port", str(ports["amqp"]), "--http-port", "0",
                                  *args.serve_args.format(mqtt=ports["mqtt"]).split(),
                                  "--stomp-port", str(ports["stomp"])])
    try:
        for w in args.workloads:
            _bench(w, 20, ports, extra)  # warm-up: first connections under valgrind
            counts = []
            for n in (args.small, args.large):
                zero(proc.pid)
                _bench(w, n, ports, extra)
                counts.append(dump(proc.pid, out, f"{w}-{n}"))
            per = (counts[1] - counts[0]) / (args.large - args.small)
            print(f"{w:28} {per:>10,.0f} instructions per message "
                  f"(({counts[1]:,} − {counts[0]:,}) / {args.large - args.small})", flush=True)
    finally:
        stop(proc, log, work / "data")


if __name__ == "__main__":
    main()
