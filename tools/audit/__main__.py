"""`python -m tools.audit record | compare` (SPEC M8): record RabbitMQ 3.10's answers
into tools/audit/rabbitmq-3.10.json, or compare a broker's answers with them."""

from __future__ import annotations

import argparse
import json
import sys

from tools.audit import compare, probes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.audit", description=__doc__)
    ap.add_argument("what", choices=("record", "compare"))
    ap.add_argument("--url", default="http://127.0.0.1:15672",
                    help="management base URL (record: RabbitMQ's)")
    ap.add_argument("--metrics-url", default=None,
                    help="base URL of /metrics (default: RabbitMQ's :15692 for record, "
                         "--url for compare)")
    ap.add_argument("--amqp-port", type=int, default=5672)
    ap.add_argument("--only", default=None, help="a regex on the probe ids")
    ap.add_argument("--all", action="store_true",
                    help="compare: also print the known differences")
    a = ap.parse_args(argv)
    if a.what == "record":
        t = probes.Target("rabbitmq", a.url, a.metrics_url or "http://127.0.0.1:15692",
                          a.amqp_port)
        got = probes.run(t, a.only)
        old = compare.load() if a.only and compare.RECORDED.exists() else {}
        compare.RECORDED.write_text(json.dumps({**old, **got}, indent=1, sort_keys=True)
                                    + "\n")
        print(f"{len(got)} answers recorded in {compare.RECORDED}")
        return 0
    t = probes.Target("ackmq", a.url, a.metrics_url or a.url, a.amqp_port)
    diffs = compare.differences(compare.load(), probes.run(t, a.only))
    bad = compare.unexplained(diffs)
    for d in diffs if a.all else bad:
        reason = compare.known_reason(d)
        print(d, f"\n  known: {reason}" if reason else "", sep="")
    print(f"{len(diffs)} differences, {len(bad)} not known", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
