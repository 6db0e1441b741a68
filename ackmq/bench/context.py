"""What one workload run gets: its target, options, a meter, and names it must clean up."""

from __future__ import annotations

import asyncio
import resource
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import Any

from pamqp import commands

from ackmq.bench.brokers import Target
from ackmq.client import ClientError
from ackmq.client.lowlevel import RawChannel, open_connection

try:  # uvloop keeps the client's per-message cost low; plain asyncio works too
    import uvloop
except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
    uvloop = None  # type: ignore[assignment]

PREFIX = "ackmq-bench."
DEFAULT_PREFETCH = (1, 10, 100, 300, 1000, 0)
DEFAULT_STOMP_PREFETCH = (1, 100, 1000)


@dataclass
class Options:
    """Knobs shared by all workloads (see `ackmq bench --help`)."""

    messages: int | None = None     # overrides every workload's default count
    scale: float = 1.0              # multiplies the default counts
    rate: float = 5000.0            # latency: offered msgs/s
    prefetch: tuple[int, ...] = DEFAULT_PREFETCH
    body_size: int = 100
    floor_dir: str | None = None    # where confirms-individual measures fdatasync
    stomp_prefetch: tuple[int, ...] = DEFAULT_STOMP_PREFETCH  # stomp-consume-ci sweep


@dataclass
class Metric:
    name: str
    value: float
    unit: str
    better: str  # "lower" | "higher"
    # the measured section behind this metric, when it is not the whole run
    wall_s: float | None = None
    client_cpu_s: float | None = None
    broker_cpu_s: float | None = None


def _client_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def run_async(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run a workload coroutine on a fresh (uv)loop."""
    if uvloop is not None:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(coro)
    return asyncio.run(coro)


RUN_TIMEOUT = 900.0  # one stuck broker must not hang the whole bench


def run_rate(ctx: RunContext, metric: str, default_n: int,
             run: Callable[[RunContext, int], Coroutine[Any, Any, Any]]) -> None:
    """A throughput workload: `run(ctx, n)` moves n messages (within RUN_TIMEOUT), recorded
    as `metric` in msgs/s, higher better."""
    n = ctx.n(default_n)
    run_async(asyncio.wait_for(run(ctx, n), RUN_TIMEOUT))
    ctx.messages = n
    ctx.add(metric, n / ctx.wall_s, "msgs/s", "higher")


@dataclass
class RunContext:
    """One run of one workload against one broker; it meters only the measured sections."""

    workload: str
    target: Target
    options: Options
    metrics: list[Metric] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0
    client_cpu_s: float = 0.0
    broker_cpu_s: float | None = 0.0
    messages: int = 0
    queues: list[str] = field(default_factory=list)
    exchanges: list[str] = field(default_factory=list)

    def n(self, default: int) -> int:
        """The message count for this workload: --messages, else default × --scale."""
        if self.options.messages is not None:
            return max(1, self.options.messages)
        return max(1, int(default * self.options.scale))

    def name(self, kind: str = "q") -> str:
        """A fresh `ackmq-bench.` name, remembered so the run deletes it at the end."""
        nm = f"{PREFIX}{self.workload}.{uuid.uuid4().hex[:8]}"
        (self.exchanges if kind == "x" else self.queues).append(nm)
        return nm

    def mark(self) -> tuple[float, float, float | None]:
        """Meter totals so far; pass to `add(since=...)` to give a metric its own CPU."""
        return (self.wall_s, self.client_cpu_s, self.broker_cpu_s)

    def add(self, name: str, value: float, unit: str, better: str,
            since: tuple[float, float, float | None] | None = None) -> None:
        m = Metric(name, float(value), unit, better)
        if since is not None:
            m.wall_s = self.wall_s - since[0]
            m.client_cpu_s = self.client_cpu_s - since[1]
            if since[2] is not None and self.broker_cpu_s is not None:
                m.broker_cpu_s = self.broker_cpu_s - since[2]
        self.metrics.append(m)

    async def _delete(self, queues: list[str], exchanges: list[str]) -> None:
        conn = await open_connection(self.target.url, "ackmq-bench-cleanup")
        try:
            ch = None
            deletes = [commands.Queue.Delete(queue=q) for q in queues] + \
                [commands.Exchange.Delete(exchange=x) for x in exchanges]
            for method in deletes:
                try:
                    if ch is None or ch.chan.error is not None:
                        ch = await conn.channel()
                    await ch.call(method)
                except ClientError:
                    if not conn.is_open:
                        raise
                    # a channel error (e.g. 404): keep deleting the others
        finally:
            await conn.close()

    def _broker_cpu(self) -> float | None:
        proc = self.target.process
        if proc is None:
            return None
        try:
            t = proc.cpu_times()
            return t.user + t.system
        except Exception:  # noqa: BLE001 - the broker may have died; report n/a
            return None

    @asynccontextmanager
    async def channel(self) -> AsyncIterator[RawChannel]:
        """A channel on a connection of its own to the target, closed after the block:
        what most workloads open, publish or count on, and close."""
        conn = await open_connection(self.target.url, "ackmq-bench")
        try:
            yield await conn.channel()
        finally:
            await conn.close()

    @contextmanager
    def measure(self) -> Iterator[None]:
        """Time and CPU (client and broker) of the section; sections add up."""
        b0 = self._broker_cpu()
        c0 = _client_cpu()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.wall_s += time.perf_counter() - t0
            self.client_cpu_s += _client_cpu() - c0
            b1 = self._broker_cpu()
            if b0 is None or b1 is None or self.broker_cpu_s is None:
                self.broker_cpu_s = None
            else:
                self.broker_cpu_s += b1 - b0

    def cleanup(self) -> bool:
        """Delete every queue and exchange the run created (fresh connection: the run's
        own may be broken by then). False when the broker has no AMQP URL to do it with
        (a STOMP-only target: STOMP cannot delete a queue; the STOMP runs drain theirs,
        so what is left is empty and named ackmq-bench.*)."""
        if not (self.queues or self.exchanges):
            return True
        if not self.target.url.startswith("amqp"):
            self.queues.clear()
            self.exchanges.clear()
            return False
        try:
            run_async(self._delete(self.queues, self.exchanges))
        except (ClientError, OSError, TimeoutError):
            return False  # nothing more we can do; the name prefix tells
        self.queues.clear()
        self.exchanges.clear()
        return True
