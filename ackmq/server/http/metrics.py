"""`/metrics` (SPEC M3): Prometheus text with RabbitMQ 3.10's metric names, types and
label names where one exists (its rabbitmq_prometheus plugin is the model), plus ackmq's
own histograms: fdatasync latency, records per fdatasync (group-commit batch size) and
publish→confirm latency.

As RabbitMQ: `/metrics` aggregates queue metrics over all queues (no labels),
`/metrics/per-object` gives them per queue (`vhost`, `queue` labels). No login (a
Prometheus scrape), as RabbitMQ's port 15692. A scrape reads counters the broker keeps
anyway (broker/stats.py, the store's StoreStats, the alarm monitor's last samples): it
costs O(queues) on the loop and nothing on the message path. The text is made by
prometheus_client's exposition from metric families built per scrape.
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    UnknownMetricFamily,
)
from prometheus_client.exposition import generate_latest

from ackmq.broker.stats import Histogram
from ackmq.protocol.stream.constants import ERROR_NAMES
from ackmq.server.http.app import SERVER_KEY, public

log = logging.getLogger("ackmq.http.metrics")

if TYPE_CHECKING:
    from ackmq.server.context import HttpContext

# the text format generate_latest writes (prometheus_client >= 0.22 names 1.0.0 its
# default; RabbitMQ 3.10 and every Prometheus server read 0.0.4)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
CLASSIC = "rabbit_classic_queue"  # ackmq's queues (quorum declarations are served by it)

# (counter, HELP text as RabbitMQ's, carries the queue_type label as RabbitMQ's)
GLOBAL_COUNTERS = (
    ("received", "Total number of messages received from publishers", False),
    ("received_confirm", "Total number of messages received from publishers expecting "
     "confirmations", False),
    ("confirmed", "Total number of messages confirmed to publishers", False),
    ("routed", "Total number of messages routed to queues or streams", False),
    ("unroutable_dropped", "Total number of messages published as non-mandatory into an "
     "exchange and dropped as unroutable", False),
    ("unroutable_returned", "Total number of messages published as mandatory into an "
     "exchange and returned to the publisher as unroutable", False),
    ("delivered", "Total number of messages delivered to consumers", True),
    ("delivered_consume_auto_ack", "Total number of messages delivered to consumers using "
     "basic.consume with automatic acknowledgment", True),
    ("delivered_consume_manual_ack", "Total number of messages delivered to consumers "
     "using basic.consume with manual acknowledgment", True),
    ("delivered_get_auto_ack", "Total number of messages delivered to consumers using "
     "basic.get with automatic acknowledgment", True),
    ("delivered_get_manual_ack", "Total number of messages delivered to consumers using "
     "basic.get with manual acknowledgment", True),
    ("get_empty", "Total number of times basic.get operations fetched no message", True),
    ("redelivered", "Total number of messages redelivered to consumers", True),
    ("acknowledged", "Total number of messages acknowledged by consumers", True),
)

STREAM_ERRORS = sorted(ERROR_NAMES.values())

QUEUE_GAUGES = (
    ("rabbitmq_queue_messages_ready", "Messages ready to be delivered to consumers"),
    ("rabbitmq_queue_messages_unacked",
     "Messages delivered to consumers but not yet acknowledged"),
    ("rabbitmq_queue_messages",
     "Sum of ready and unacknowledged messages - total queue depth"),
    ("rabbitmq_queue_consumers", "Consumers on a queue"),
)


def _histogram(name: str, doc: str, h: Histogram, labels: list[str] | None = None,
               values: list[str] | None = None) -> HistogramMetricFamily:
    fam = HistogramMetricFamily(name, doc, labels=labels)
    fam.add_metric(values or [], h.cumulative(), h.sum)
    return fam


def _channels(conn: Any) -> int:
    chans = getattr(conn, "channels", None)
    if chans is not None:
        return len(chans)
    return 1 if getattr(conn, "channel", None) is not None else 0


def _fds() -> tuple[int, int]:
    try:
        open_fds = len(os.listdir("/proc/self/fd"))
    except OSError:
        open_fds = 0
    return open_fds, resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def collect(server: HttpContext, per_object: bool) -> Iterator[Metric]:
    """Every metric family of one scrape."""
    from ackmq.server.views import node_name  # the API's node name
    from ackmq.version import VERSION as __version__
    node = node_name()
    info = UnknownMetricFamily("rabbitmq_identity_info", "RabbitMQ node & cluster identity info",
                               labels=["rabbitmq_node", "rabbitmq_cluster",
                                       "rabbitmq_cluster_permanent_id"])
    info.add_metric([node, node, f"ackmq-{node}"], 1)
    yield info
    build = UnknownMetricFamily("rabbitmq_build_info", "RabbitMQ & Erlang/OTP version info",
                                labels=["rabbitmq_version", "prometheus_plugin_version",
                                        "prometheus_client_version", "erlang_version"])
    build.add_metric(["3.10.8", __version__, "python", f"ackmq {__version__}"], 1)
    yield build

    # -- node: memory, disk, alarms, file descriptors -------------------------------
    mon = server.alarms
    if mon is not None:
        lim = mon.limits
        yield GaugeMetricFamily("rabbitmq_process_resident_memory_bytes",
                                "Memory used in bytes", value=mon.rss)
        yield GaugeMetricFamily("rabbitmq_resident_memory_limit_bytes",
                                "Memory high watermark in bytes", value=lim.memory_limit)
        if mon.disk_free is not None:
            yield GaugeMetricFamily("rabbitmq_disk_space_available_bytes",
                                    "Disk space available in bytes", value=mon.disk_free)
            yield GaugeMetricFamily("rabbitmq_disk_space_available_limit_bytes",
                                    "Free disk space low watermark in bytes",
                                    value=lim.disk_free_limit)
        active = lim.active
    else:
        active = set()
    alarms = () if per_object else (  # RabbitMQ 3.10 has them on /metrics only
            ("rabbitmq_alarms_file_descriptor_limit",
             "is 1 if file descriptor limit alarm is in effect", False),
            ("rabbitmq_alarms_free_disk_space_watermark",
             "is 1 if free disk space watermark alarm is in effect", "disk" in active),
            ("rabbitmq_alarms_memory_used_watermark",
             "is 1 if VM memory watermark alarm is in effect", "memory" in active))
    for name, doc, on in alarms:
        yield UnknownMetricFamily(name, doc, value=int(bool(on)))
    open_fds, max_fds = _fds()
    yield GaugeMetricFamily("rabbitmq_process_open_fds", "Open file descriptors",
                            value=open_fds)
    yield GaugeMetricFamily("rabbitmq_process_max_fds", "Open file descriptors limit",
                            value=max_fds)

    # -- objects ----------------------------------------------------------------------
    conns = [c for c in server.connections]
    queues = server.broker.queues()
    yield GaugeMetricFamily("rabbitmq_connections", "Connections currently open",
                            value=len(conns))
    yield GaugeMetricFamily("rabbitmq_channels", "Channels currently open",
                            value=sum(_channels(c) for c in conns))
    yield GaugeMetricFamily("rabbitmq_consumers", "Consumers currently connected",
                            value=sum(q.consumer_count for q in queues))
    yield GaugeMetricFamily("rabbitmq_queues", "Queues available", value=len(queues))
    yield from _queue_metrics(queues, per_object)
    from ackmq.server.http.metrics_detailed import object_families
    yield from object_families(server, per_object)  # connections, channels (M8)
    yield _delayed(server)

    # -- message counters, per protocol (rabbit_global_counters) ------------------------
    stats = server.broker.stats
    for counter, doc, typed in GLOBAL_COUNTERS:
        labels = ["protocol", "queue_type"] if typed else ["protocol"]
        fam = CounterMetricFamily(f"rabbitmq_global_messages_{counter}", doc, labels=labels)
        for proto, ms in stats.messages.items():
            fam.add_metric([proto, CLASSIC] if typed else [proto], ms.total(counter))
        yield fam

    # -- the stream protocol's refusals, by code (rabbitmq_stream's protocol counters) --
    errors = stats.errors["stream"]
    for name in STREAM_ERRORS:
        fam = CounterMetricFamily(f"rabbitmq_global_stream_error_{name}", "Total number of "
                                  f"commands failed with {name.replace('_', ' ')}",
                                  labels=["protocol"])
        fam.add_metric(["stream"], errors[name])
        yield fam

    # -- ackmq's own: the disk and the confirms ---------------------------------------------
    yield _histogram("ackmq_confirm_latency_seconds",
                     "Seconds from the loop turn that read a publish on a confirm channel "
                     "to the turn that confirms it (fsync included), per publish",
                     stats.confirm_latency)
    store = server.broker.store
    st = getattr(store, "stats", None)
    if st is not None and hasattr(st, "fsync_seconds"):
        yield _histogram("ackmq_fdatasync_seconds",
                         "Seconds per fdatasync of the message store (its count is the "
                         "number of fdatasyncs)", st.fsync_seconds)
        yield _histogram("ackmq_fdatasync_records",
                         "Records (messages, acks) made durable by one fdatasync: the "
                         "group-commit batch size", st.fsync_records)
        yield CounterMetricFamily("ackmq_store_commits", "Group commits asked of the store",
                                  value=st.commits)
        yield CounterMetricFamily("ackmq_store_bytes_written",
                                  "Bytes written to the message store", value=st.bytes_written)
    yield CounterMetricFamily("ackmq_store_failed_commits",
                              "Store commits that failed (their publishes were nacked)",
                              value=server.broker.store_failures)


def _delayed(server: HttpContext) -> Metric:
    """Messages waiting in delaying exchanges (L8; the plugin's messages_delayed)."""
    fam = GaugeMetricFamily("ackmq_exchange_messages_delayed", "Messages waiting in a "
                            "delaying exchange until their x-delay is due",
                            labels=["vhost", "exchange"])
    for vh in server.broker.vhosts.values():
        for x in vh.exchanges.values():
            n = getattr(x, "messages_delayed", None)
            if n is not None:
                fam.add_metric([vh.name, x.name], n)
    return fam


def _queue_metrics(queues: list[Any], per_object: bool) -> Iterable[Metric]:
    """RabbitMQ's queue gauges summed over all queues (no labels), for /metrics;
    /metrics/per-object writes them per queue with `per_queue_text`."""
    if per_object:
        return
    ready = sum(q.message_count for q in queues)
    unacked = sum(q.unacked_count for q in queues)
    values = (ready, unacked, ready + unacked, sum(q.consumer_count for q in queues))
    for (name, doc), v in zip(QUEUE_GAUGES, values, strict=True):
        yield GaugeMetricFamily(name, doc, value=v)
    yield CounterMetricFamily("rabbitmq_queue_messages_published", PUBLISHED_DOC,
                              value=sum(q.stat_published for q in queues))


PUBLISHED_DOC = "Total number of messages published to queues"


def _label(v: str) -> str:
    """A label value in the text format: backslash, double quote and newline escaped."""
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


PUBLISHED_TOTAL = "ackmq_queue_messages_published_total"
PER_QUEUE = (*QUEUE_GAUGES, (PUBLISHED_TOTAL, PUBLISHED_DOC))
CHUNK = 1000  # queues written per loop turn: /metrics/per-object yields in between


def _per_queue_lines(queues: list[Any], out: list[list[str]]) -> None:
    """Append each queue's sample lines to its family's list in `out` (PER_QUEUE
    order), written directly in the text format: prometheus_client's metric objects
    cost ~40 µs a sample (1.6 s for 10,000 queues on the broker's loop); this ~10x less.
    RabbitMQ's per-object rabbitmq_queue_messages_published_total is per channel x
    exchange x queue, so the per-queue count has its own name (ackmq_...)."""
    ready, unacked, total, consumers, published = out
    for q in queues:
        lab = f'{{vhost="{_label(q.vhost.name)}",queue="{_label(q.name)}"}} '
        r, u = q.message_count, q.unacked_count
        ready.append(f"rabbitmq_queue_messages_ready{lab}{r}\n")
        unacked.append(f"rabbitmq_queue_messages_unacked{lab}{u}\n")
        total.append(f"rabbitmq_queue_messages{lab}{r + u}\n")
        consumers.append(f"rabbitmq_queue_consumers{lab}{q.consumer_count}\n")
        published.append(f"{PUBLISHED_TOTAL}{lab}{q.stat_published}\n")


def _join(out: list[list[str]]) -> str:
    parts = []
    for (name, doc), lines in zip(PER_QUEUE, out, strict=True):
        kind = "counter" if name.endswith("_total") else "gauge"
        parts.append(f"# HELP {name} {doc}\n# TYPE {name} {kind}\n")
        parts.extend(lines)
    return "".join(parts)


def per_queue_text(queues: list[Any]) -> str:
    """The per-queue families of /metrics/per-object in one go."""
    out: list[list[str]] = [[] for _ in PER_QUEUE]
    _per_queue_lines(sorted(queues, key=lambda q: (q.vhost.name, q.name)), out)
    return _join(out)


async def per_queue_text_chunked(queues: list[Any]) -> str:
    """The same, `CHUNK` queues per loop turn, so that a scrape of 10,000 queues does
    not hold deliveries up for its whole length (a queue deleted meanwhile still shows
    its last counts in this scrape)."""
    queues = sorted(queues, key=lambda q: (q.vhost.name, q.name))
    out: list[list[str]] = [[] for _ in PER_QUEUE]
    for i in range(0, len(queues), CHUNK):
        if i:
            await asyncio.sleep(0)
        _per_queue_lines(queues[i:i + CHUNK], out)
    return _join(out)


class _Scrape:
    """What generate_latest wants: something with collect()."""

    def __init__(self, server: HttpContext, per_object: bool) -> None:
        self.server, self.per_object = server, per_object

    def collect(self) -> Iterator[Metric]:
        return collect(self.server, self.per_object)


def render(server: HttpContext, per_object: bool = False, queues: bool = True) -> bytes:
    """The whole scrape (`queues=False`: without /metrics/per-object's queue lines)."""
    text = generate_latest(_Scrape(server, per_object))
    if per_object and queues:
        text += per_queue_text(server.broker.queues()).encode()
    return text


@public
async def metrics(request: web.Request) -> web.Response:
    return _reply(render(request.app[SERVER_KEY]))


@public
async def metrics_per_object(request: web.Request) -> web.Response:
    server = request.app[SERVER_KEY]
    head = render(server, per_object=True, queues=False)
    return _reply(head + (await per_queue_text_chunked(server.broker.queues())).encode())


def _reply(body: bytes) -> web.Response:
    r = web.Response(body=body)
    r.headers["Content-Type"] = CONTENT_TYPE
    return r


class PrometheusListener:
    """`--prometheus-port`: /metrics and /metrics/per-object alone on their own port,
    as RabbitMQ's prometheus plugin (15692), started and stopped with the management
    app (on the same loop, no login)."""

    def __init__(self, server: HttpContext) -> None:
        self.server = server
        self.port = 0
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def start(self, app: web.Application) -> None:
        port = self.server.config.prometheus_port
        if port is None:
            return
        papp = web.Application()
        papp[SERVER_KEY] = self.server
        papp.router.add_get("/metrics", metrics)
        papp.router.add_get("/metrics/per-object", metrics_per_object)
        papp.router.add_get("/metrics/detailed", metrics_detailed)
        runner = web.AppRunner(papp, access_log=None, handle_signals=False)
        await runner.setup()
        host = self.server.config.host or None
        site = web.TCPSite(runner, host, port, backlog=128, reuse_address=True)
        try:
            await site.start()
        except OSError as e:
            await runner.cleanup()
            e.listener = f"{host or '*'}:{port} (Prometheus)"  # type: ignore[attr-defined]
            raise
        self._runner = runner
        sock = site._server.sockets[0]  # type: ignore[union-attr]
        self.port = sock.getsockname()[1]
        shown = "127.0.0.1" if host in (None, "", "0.0.0.0") else host
        self.url = f"http://{shown}:{self.port}"
        log.info("Prometheus metrics on %s/metrics (no login)", self.url)

    async def stop(self, app: web.Application) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


from ackmq.server.http.metrics_detailed import metrics_detailed  # noqa: E402

PROMETHEUS_KEY: web.AppKey[PrometheusListener] = web.AppKey("ackmq_prometheus",
                                                              PrometheusListener)


def register(app: web.Application) -> None:
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/metrics/per-object", metrics_per_object)
    app.router.add_get("/metrics/detailed", metrics_detailed)
    prom = app[PROMETHEUS_KEY] = PrometheusListener(app[SERVER_KEY])
    app.on_startup.append(prom.start)
    app.on_cleanup.append(prom.stop)
