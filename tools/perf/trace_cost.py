"""What the firehose tracer (broker/trace.py) costs the model, in process:
`python -m tools.perf.trace_cost [--mode off|on|lifecycle]`.

One cycle is `ChannelModel.basic_publish` of a 100-byte message to the default
exchange, its push delivery to a consumer (manual ack) and `basic_ack`: every hook of
the tracer (publish, deliver, settle) is on the path. Timed with the process's CPU
clock; the minimum over rounds is the figure to quote. `off` is the zero-cost claim
(one attribute check per hook): compare it with a tree without the tracer by running
this file with that tree first on PYTHONPATH (`git archive 78f9668 ackmq | tar -x -C
/tmp/base`; `PYTHONPATH=/tmp/base python tools/perf/trace_cost.py`). `on` and
`lifecycle` bind a queue to amq.rabbitmq.trace and purge it every round.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from ackmq.broker import BrokerModel, NullScheduler


class _Output:
    writable = True
    number = 1

    def __init__(self) -> None:
        self.tags: list[int] = []

    def deliver(self, consumer: Any, tag: int, entry: Any) -> None:
        self.tags.append(tag)

    def __getattr__(self, name: str) -> Any:
        return lambda *a, **kw: None


def measure(mode: str = "off", rounds: int = 30, per_round: int = 5000) -> float:
    """ns of CPU per publish+deliver+ack cycle (the minimum over rounds)."""
    broker = BrokerModel(NullScheduler())
    broker.start()
    vh = broker.vhosts["/"]
    vh.declare_queue("q", False, False, False, False, {}, None)
    sink = None
    if mode != "off":
        from ackmq.broker.trace import TRACE_EXCHANGE, Tracer
        vh.trace = Tracer(vh, "bench@localhost", lambda owner: "bench",
                          lifecycle=mode == "lifecycle")
        sink = vh.declare_queue("sink", False, False, False, False, {}, None)
        vh.bind(TRACE_EXCHANGE, sink, "#", {})
    out = _Output()
    ch = broker.open_channel(vh, object(), out, "guest")
    ch.basic_consume("q", "c", False, False, {})
    ch.start_consumer("c")
    props, body = b"\x00\x00", b"x" * 100
    pub, ack, tags = ch.basic_publish, ch.basic_ack, out.tags
    best = float("inf")
    for _ in range(rounds):
        t0 = time.process_time()
        for _ in range(per_round):
            pub("", "q", False, False, props, body)
            ack(tags.pop(), False)
        best = min(best, (time.process_time() - t0) / per_round)
        if sink is not None:
            sink.purge()
    return best * 1e9


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=("off", "on", "lifecycle"), default="off")
    p.add_argument("--rounds", type=int, default=30)
    a = p.parse_args(argv)
    print(f"{a.mode}: {measure(a.mode, a.rounds) / 1000:.2f} µs CPU per "
          "publish+deliver+ack (min over rounds)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
