"""The workload registry: names are part of the CLI contract."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ackmq.bench import confirms, latency, memory, throughput
from ackmq.bench.context import RunContext


@dataclass(frozen=True)
class Workload:
    name: str
    run: Callable[[RunContext], None]
    summary: str


WORKLOADS: dict[str, Workload] = {w.name: w for w in (
    Workload("confirms-individual", confirms.confirms_individual,
             "50,000 persistent msgs, pika: publish + wait for confirm each (ms, lower better)"),
    Workload("confirms-batch", confirms.confirms_batch,
             "50,000 persistent msgs in batches of 100, wait for each batch (ms, lower better)"),
    Workload("confirms-async", confirms.confirms_async,
             "50,000 persistent msgs pipelined, confirms tracked async (ms, lower better)"),
    Workload("tx", confirms.tx,
             "50,000 persistent msgs, tx.commit per message and per 100 (ms, lower better)"),
    Workload("publish", throughput.publish,
             "transient 100-byte msgs, no confirms (msgs/s, higher better)"),
    Workload("consume-auto", throughput.consume_auto,
             "drain a pre-filled queue with no-ack (msgs/s, higher better)"),
    Workload("consume-prefetch", throughput.consume_prefetch,
             "drain with manual acks at prefetch 1,10,100,300,1000,0 (msgs/s, higher better)"),
    Workload("latency", latency.latency,
             "publish→deliver and publish→confirm percentiles at --rate (ms, lower better)"),
    Workload("memory", memory.memory,
             "broker RSS per queued 100-byte message, 1M queued (bytes/msg, lower better)"),
    Workload("fanout", throughput.fanout,
             "one publish to 10 queues with 10 consumers (deliveries/s, higher better)"),
)}
