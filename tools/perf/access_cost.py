"""What the permission checks cost a publish, in process: `python -m tools.perf.access_cost`.

`ChannelModel.basic_publish` to the default exchange (the path of `ackmq bench publish`)
on three channels of one model: no checks (access None), checks for a user with `.*`
and no topic permission, and checks for a user with a topic permission on another
exchange. Rounds are interleaved in rotating order and timed with the process's CPU
clock, so load from other processes and its trend over the run hit all three alike;
the minimum over rounds is the figure to quote. End to end a publish costs the broker
several times the model's share, so the relative end-to-end cost is smaller still.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from ackmq.broker import BrokerModel, NullScheduler
from ackmq.broker.access import AccessModel, ChannelAccess


class _Output:
    writable = True
    number = 1

    def __getattr__(self, name: str) -> Any:
        return lambda *a, **kw: None


def measure(rounds: int = 60, per_round: int = 5000) -> dict[str, list[float]]:
    """ns per publish, per round, for each configuration."""
    broker = BrokerModel(NullScheduler())
    broker.start()
    vh = broker.vhosts["/"]
    q = vh.declare_queue("q", False, False, False, False, {}, None)
    access = AccessModel.seeded({"guest": "guest"}, None)
    access.add_user("t", "pw")
    access.set_permissions("t", "/", ".*", ".*", ".*")
    access.set_topic_permissions("t", "/", "amq.topic", "^a", "^a")
    channels = {}
    for name, user in (("no checks", None), ("checks", "guest"),
                       ("checks + topic permission elsewhere", "t")):
        ch = broker.open_channel(vh, object(), _Output(), user or "guest")
        ch.access = None if user is None else ChannelAccess(access, user, "/")
        channels[name] = ch
    out: dict[str, list[float]] = {k: [] for k in channels}
    props, body = b"\x00\x00", b"x" * 100
    order = list(channels.items())
    for r in range(rounds):
        for name, ch in order[r % 3:] + order[:r % 3]:
            publish = ch.basic_publish
            t0 = time.process_time()
            for _ in range(per_round):
                publish("", "q", False, False, props, body)
            out[name].append((time.process_time() - t0) / per_round * 1e9)
            q.purge()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=60)
    p.add_argument("--per-round", type=int, default=5000)
    a = p.parse_args()
    res = measure(a.rounds, a.per_round)
    base = res["no checks"]
    for name, v in res.items():
        print(f"{name:38s} min {min(v):6.0f} ns  median {statistics.median(v):6.0f} ns"
              f"  ratio to no checks: min {min(v) / min(base):.3f}, median "
              f"{statistics.median(v) / statistics.median(base):.3f}")


if __name__ == "__main__":
    main()
