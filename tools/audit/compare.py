"""Differences between RabbitMQ's recorded answers and a broker's (SPEC M8).

A probe's answers differ or they do not; a metrics probe differs per family: a family
RabbitMQ has and the broker lacks ("missing"), or one both have with another type or
other label names ("differs"); families only the broker has (ackmq's own) are fine.

`KNOWN` lists the differences that stay, by id pattern, each with its reason; the
same reasons are in docs/management.md and docs/metrics.md ("Differences from
RabbitMQ"). The audit test fails on a difference that is not known AND on a known one
that no longer differs (a fix must remove its entry).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RECORDED = Path(__file__).with_name("rabbitmq-3.10.json")

# the Erlang VM, Raft, Mnesia, the distribution, the prometheus plugin's own
# telemetry: what ackmq (one Python process, no cluster) does not have
_VM = (r"(erlang_|rabbitmq_erlang_|rabbitmq_raft_|rabbitmq_io_|rabbitmq_mnesia_|"
       r"rabbitmq_msg_store_|rabbitmq_queue_index_|rabbitmq_schema_db_|"
       r"rabbitmq_auth_attempts|rabbitmq_connections_opened|telemetry_|"
       r"rabbitmq_process_max_tcp|rabbitmq_process_open_tcp|rabbitmq_cluster_|"
       r"rabbitmq_identity|rabbitmq_build|rabbitmq_.*_reductions|rabbitmq_.*_memory_|"
       r"rabbitmq_global_publishers|rabbitmq_global_consumers)")

KNOWN: list[tuple[str, str]] = [
    (r"^metrics .* (missing|differs) (erlang_|telemetry_|rabbitmq_erlang_|rabbitmq_raft_|"
     r"rabbitmq_io_|rabbitmq_mnesia_|rabbitmq_msg_store_|rabbitmq_queue_index_|"
     r"rabbitmq_schema_db_)",
     "the Erlang VM, Raft, Mnesia, the message store's and the queue index's internals, "
     "the Prometheus plugin's own telemetry: ackmq is one Python process with its own "
     "store (its figures are the ackmq_* families)"),
]


@dataclass
class Difference:
    id: str
    rabbitmq: Any
    broker: Any

    def __str__(self) -> str:
        return (f"{self.id}\n  RabbitMQ: {json.dumps(self.rabbitmq)[:300]}\n"
                f"  broker:   {json.dumps(self.broker)[:300]}")


def load() -> dict[str, Any]:
    return json.loads(RECORDED.read_text())


def differences(recorded: dict[str, Any], got: dict[str, Any]) -> list[Difference]:
    out: list[Difference] = []
    for pid, theirs in recorded.items():
        if pid not in got:
            continue
        ours = got[pid]
        if pid.startswith("metrics "):
            out += _metric_differences(pid, theirs, ours)
        elif theirs != ours:
            out.append(Difference(pid, theirs, ours))
    return out


def _metric_differences(pid: str, theirs: Any, ours: Any) -> list[Difference]:
    if theirs[0] != ours[0] or not isinstance(theirs[1], dict) \
            or not isinstance(ours[1], dict):
        return [Difference(f"{pid} status", theirs[0], ours[0])] if theirs[0] != ours[0] \
            else []
    out = []
    for fam, spec in sorted(theirs[1].items()):
        mine = ours[1].get(fam)
        if mine is None:
            out.append(Difference(f"{pid} missing {fam}", spec, None))
        elif mine != spec:
            out.append(Difference(f"{pid} differs {fam}", spec, mine))
    return out


def known_reason(d: Difference) -> str | None:
    for pattern, reason in KNOWN:
        if re.search(pattern, d.id):
            return reason
    return None


def unexplained(diffs: list[Difference]) -> list[Difference]:
    return [d for d in diffs if known_reason(d) is None]


def stale_known(diffs: list[Difference]) -> list[str]:
    """KNOWN patterns that match no difference any more (fixed: remove the entry)."""
    return [p for p, _ in KNOWN if not any(re.search(p, d.id) for d in diffs)]
