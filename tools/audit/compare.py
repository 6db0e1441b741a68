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

# (id pattern, why it stays); docs/management.md and docs/metrics.md say the same
VM = ("the Erlang VM, Raft, Mnesia, the message store's and the queue index's internals, "
      "Erlang process reductions and memory, the prometheus plugin's own telemetry: "
      "ackmq is one Python process with its own store (its figures: ackmq_* families)")
NOT_COUNTED = "not counted by ackmq yet (docs/metrics.md, \"Not served\")"
RABBIT_500 = ("RabbitMQ 3.10 answers 500 (a crash in its handler); ackmq answers 400/404 "
              "with a reason")
KNOWN: list[tuple[str, str]] = [
    (r"^metrics .* (missing|differs) (erlang_|telemetry_|rabbitmq_erlang_|rabbitmq_raft_|"
     r"rabbitmq_io_|rabbitmq_mnesia_|rabbitmq_msg_store_|rabbitmq_queue_index_|"
     r"rabbitmq_schema_db_|"
     r"rabbitmq_(detailed_)?\w+_process_(reductions_total|memory_bytes))", VM),
    (r"^metrics /metrics/(per-object|detailed).* missing rabbitmq_(detailed_)?"
     r"(channel_messages_\w+_total|channel_get\w*_total|queue_messages_published_total)",
     NOT_COUNTED + ": message counts per channel x exchange and channel x queue (ackmq "
     "counts per protocol, rabbitmq_global_*, and per queue; /metrics has their sums)"),
    (r"^metrics .* missing rabbitmq_global_messages_dead_lettered_",
     NOT_COUNTED + ": dead-lettered messages per reason"),
    (r"^metrics .* missing rabbitmq_(detailed_)?queue_(messages_(bytes|ready_bytes|"
     r"unacked_bytes|ram|ram_bytes|ready_ram|unacked_ram|persistent|persistent_bytes|"
     r"paged_out|paged_out_bytes)|disk_(reads|writes)_total|head_message_timestamp|"
     r"consumer_capacity|consumer_utilisation)$",
     NOT_COUNTED + ": a queue's bytes, RAM/disk split, disk reads and writes, head "
     "timestamp and consumer utilisation"),
    (r"^(400 bad JSON: bindings|400 get: ackmode|404 node|property none, as \[\])$",
     RABBIT_500),
    (r"^404 queue: bindings$", "RabbitMQ lists the default exchange's binding of a queue "
     "that does not exist; ackmq lists none"),
    (r"^404 vhost: publish$", "RabbitMQ checks the user's permissions before the vhost "
     "exists (401 Access refused.); ackmq answers 404 for the missing vhost"),
]
# differences another issue removes: not "stale" when gone (none left: the firehose
# tracer landed with amq.rabbitmq.trace and the vhost's `tracing` flag)
PENDING: list[tuple[str, str]] = []


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
        if pid.startswith(KEYED):
            out += _keyed_differences(pid, theirs, ours)
        elif theirs != ours:
            out.append(Difference(pid, theirs, ours))
    return out


# answers [status..., {key: value}] compared key by key: metric families, exchanges
KEYED = ("metrics ", "new vhost's exchanges")


def _keyed_differences(pid: str, theirs: Any, ours: Any) -> list[Difference]:
    if theirs[:-1] != ours[:-1] or not isinstance(theirs[-1], dict) \
            or not isinstance(ours[-1], dict):
        return [Difference(f"{pid} status", theirs, ours)] if theirs != ours else []
    out = []
    for fam, spec in sorted(theirs[-1].items()):
        mine = ours[-1].get(fam)
        if mine is None:
            out.append(Difference(f"{pid} missing {fam}", spec, None))
        elif mine != spec:
            out.append(Difference(f"{pid} differs {fam}", spec, mine))
    return out


def known_reason(d: Difference) -> str | None:
    for pattern, reason in KNOWN + PENDING:
        if re.search(pattern, d.id):
            return reason
    return None


def unexplained(diffs: list[Difference]) -> list[Difference]:
    return [d for d in diffs if known_reason(d) is None]


def stale_known(diffs: list[Difference]) -> list[str]:
    """KNOWN patterns that match no difference any more (fixed: remove the entry)."""
    return [p for p, _ in KNOWN if not any(re.search(p, d.id) for d in diffs)]
