"""What the message counters (broker/stats.py, /metrics, the UI's rates) cost the
model, in process: `python -m tools.perf.stats_cost`.

One cycle is `ChannelModel.basic_publish` to the default exchange, `basic_get` and
`basic_ack` of a 100-byte message: every counter of the publish, get and ack paths.
Timed with the process's CPU clock; the minimum over rounds is the figure to quote. To
compare with a tree without the counters, run the same file with that tree first on
PYTHONPATH (`git archive a25c3f3 ackmq | tar -x -C /tmp/base`; docs/metrics.md).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from ackmq.broker import BrokerModel, NullScheduler


class _Output:
    writable = True

    def __getattr__(self, name: str) -> Any:
        return lambda *a, **kw: None


def measure(rounds: int = 40, per_round: int = 5000) -> float:
    """ns per publish+get+ack cycle (the minimum over rounds)."""
    broker = BrokerModel(NullScheduler())
    broker.start()
    vh = broker.vhosts["/"]
    vh.declare_queue("q", False, False, False, False, {}, None)
    ch = broker.open_channel(vh, object(), _Output(), "guest")
    props, body = b"\x00\x00", b"x" * 100
    pub, get, ack = ch.basic_publish, ch.basic_get, ch.basic_ack
    best = float("inf")
    for _ in range(rounds):
        t0 = time.process_time()
        for _ in range(per_round):
            pub("", "q", False, False, props, body)
        for _ in range(per_round):
            ack(get("q", False)[0], False)
        best = min(best, (time.process_time() - t0) / per_round * 1e9)
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--per-round", type=int, default=5000)
    a = p.parse_args()
    print(f"{measure(a.rounds, a.per_round):.0f} ns per publish + get + ack (min of "
          f"{a.rounds} rounds)")


if __name__ == "__main__":
    main()
