"""`/metrics/detailed?family=…&vhost=…` (SPEC M3, M8): RabbitMQ 3.10's per-object
endpoint, where a scrape config picks the metric groups it wants.

As RabbitMQ: without `family` only the identity and build info; `family` may repeat
(queue_coarse_metrics, queue_consumer_count, queue_metrics, connection_coarse_metrics,
connection_metrics, channel_metrics, exchange_names, exchange_bindings, vhost_status);
`vhost` (may repeat) keeps the objects of those vhosts; an unknown family adds
nothing. Families are named `rabbitmq_detailed_*` (the cluster-wide ones
`rabbitmq_cluster_*`) with RabbitMQ's labels: connections and channels are labelled
`channel` (RabbitMQ's label for both, holding the Erlang process; here the API's
connection or channel name). What ackmq does not count (Erlang reductions, memory per
queue process, per channel x exchange counters, churn) is left out: docs/metrics.md.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest

from ackmq.server import views, views_stream
from ackmq.server.http.app import SERVER_KEY, public

if TYPE_CHECKING:
    from ackmq.server.context import HttpContext

Q = ["vhost", "queue"]
X = ["vhost", "exchange", "type"]
# family -> [(metric, HELP, kind, labels, value of one object)]
Spec = list[tuple[str, str, str, list[str], Callable[[Any], float]]]
QUEUE: dict[str, Spec] = {
    "queue_coarse_metrics": [
        ("rabbitmq_detailed_queue_messages_ready",
         "Messages ready to be delivered to consumers", "gauge", Q,
         lambda q: q.message_count),
        ("rabbitmq_detailed_queue_messages_unacked",
         "Messages delivered to consumers but not yet acknowledged", "gauge", Q,
         lambda q: q.unacked_count),
        ("rabbitmq_detailed_queue_messages",
         "Sum of ready and unacknowledged messages - total queue depth", "gauge", Q,
         lambda q: q.message_count + q.unacked_count)],
    "queue_consumer_count": [
        ("rabbitmq_detailed_queue_consumers", "Consumers on a queue", "gauge", Q,
         lambda q: q.consumer_count)],
    "queue_metrics": [
        ("rabbitmq_detailed_queue_consumers", "Consumers on a queue", "gauge", Q,
         lambda q: q.consumer_count)],
}
C = ["channel"]
CONNECTION: dict[str, Spec] = {
    "connection_coarse_metrics": [
        ("rabbitmq_detailed_connection_incoming_bytes_total",
         "Total number of bytes received on a connection", "counter", C,
         lambda c: c["recv_oct"]),
        ("rabbitmq_detailed_connection_outgoing_bytes_total",
         "Total number of bytes sent on a connection", "counter", C,
         lambda c: c["send_oct"])],
    "connection_metrics": [
        ("rabbitmq_detailed_connection_incoming_packets_total",
         "Total number of packets received on a connection", "counter", C,
         lambda c: c["recv_cnt"]),
        ("rabbitmq_detailed_connection_outgoing_packets_total",
         "Total number of packets sent on a connection", "counter", C,
         lambda c: c["send_cnt"]),
        ("rabbitmq_detailed_connection_pending_packets",
         "Number of packets waiting to be sent on a connection", "gauge", C,
         lambda c: c["send_pend"]),
        ("rabbitmq_detailed_connection_channels", "Channels on a connection", "gauge", C,
         lambda c: c["channels"])],
}
CHANNEL: dict[str, Spec] = {
    "channel_metrics": [
        ("rabbitmq_detailed_channel_consumers", "Consumers on a channel", "gauge", C,
         lambda ch: ch["consumer_count"]),
        ("rabbitmq_detailed_channel_messages_unacked",
         "Delivered but not yet acknowledged messages", "gauge", C,
         lambda ch: ch["messages_unacknowledged"]),
        ("rabbitmq_detailed_channel_messages_unconfirmed",
         "Published but not yet confirmed messages", "gauge", C,
         lambda ch: ch["messages_unconfirmed"]),
        ("rabbitmq_detailed_channel_messages_uncommitted",
         "Messages received in a transaction but not yet committed", "gauge", C,
         lambda ch: ch["messages_uncommitted"]),
        ("rabbitmq_detailed_channel_acks_uncommitted",
         "Message acknowledgements in a transaction not yet committed", "gauge", C,
         lambda ch: ch["acks_uncommitted"]),
        ("rabbitmq_detailed_consumer_prefetch",
         "Limit of unacknowledged messages for each consumer", "gauge", C,
         lambda ch: ch["prefetch_count"]),
        ("rabbitmq_detailed_channel_prefetch",
         "Total limit of unacknowledged messages for all consumers on a channel", "gauge",
         C, lambda ch: ch["global_prefetch_count"])],
}
EXCHANGE: dict[str, Spec] = {
    "exchange_names": [
        ("rabbitmq_cluster_exchange_name", "Enumerates exchanges without any additional "
         "info. This value is cluster-wide. A cheaper alternative to `exchange_bindings`",
         "gauge", X, lambda x: 1)],
    "exchange_bindings": [
        ("rabbitmq_cluster_exchange_bindings", "Number of bindings for an exchange. This "
         "value is cluster-wide.", "gauge", X, lambda x: len(x.bindings))],
}
VHOST: dict[str, Spec] = {
    "vhost_status": [
        ("rabbitmq_cluster_vhost_status", "Whether a given vhost is running", "gauge",
         ["vhost"], lambda vh: 1)],
}
# connection_churn_metrics: (metric without "rabbitmq_detailed_", HELP, the count)
CHURN: list[tuple[str, str, Callable[[Any], int]]] = [
    ("connections_opened_total", "Total number of connections opened",
     lambda s: getattr(s.connections, "opened", 0)),
    ("connections_closed_total", "Total number of connections closed or terminated",
     lambda s: getattr(s.connections, "closed", 0)),
    ("channels_opened_total", "Total number of channels opened",
     lambda s: s.broker.stats.churn.channels_opened),
    ("channels_closed_total", "Total number of channels closed",
     lambda s: s.broker.stats.churn.channels_closed),
    ("queues_declared_total", "Total number of queues declared",
     lambda s: s.broker.stats.churn.queues_declared),
    ("queues_created_total", "Total number of queues created",
     lambda s: s.broker.stats.churn.queues_created),
    ("queues_deleted_total", "Total number of queues deleted",
     lambda s: s.broker.stats.churn.queues_deleted),
]
# /metrics' channel message counters (RabbitMQ sums its channels' there, no labels):
# ackmq's global counters of every protocol, which never go down when a channel closes
CHANNEL_COUNTERS = [
    ("rabbitmq_channel_messages_published_total", "received",
     "Total number of messages published into an exchange on a channel"),
    ("rabbitmq_channel_messages_confirmed_total", "confirmed",
     "Total number of messages published into an exchange and confirmed on the channel"),
    ("rabbitmq_channel_messages_unroutable_returned_total", "unroutable_returned",
     "Total number of messages published as mandatory into an exchange and returned to "
     "the publisher as unroutable"),
    ("rabbitmq_channel_messages_unroutable_dropped_total", "unroutable_dropped",
     "Total number of messages published as non-mandatory into an exchange and dropped "
     "as unroutable"),
    ("rabbitmq_channel_get_ack_total", "delivered_get_manual_ack",
     "Total number of messages fetched with basic.get in manual acknowledgement mode"),
    ("rabbitmq_channel_get_total", "delivered_get_auto_ack",
     "Total number of messages fetched with basic.get in automatic acknowledgement mode"),
    ("rabbitmq_channel_messages_delivered_ack_total", "delivered_consume_manual_ack",
     "Total number of messages delivered to consumers in manual acknowledgement mode"),
    ("rabbitmq_channel_messages_delivered_total", "delivered_consume_auto_ack",
     "Total number of messages delivered to consumers in automatic acknowledgement mode"),
    ("rabbitmq_channel_messages_redelivered_total", "redelivered",
     "Total number of messages redelivered to consumers"),
    ("rabbitmq_channel_messages_acked_total", "acknowledged",
     "Total number of messages acknowledged by consumers"),
    ("rabbitmq_channel_get_empty_total", "get_empty",
     "Total number of times basic.get operations fetched no message"),
]
FAMILIES = (*QUEUE, *CONNECTION, *CHANNEL, *EXCHANGE, *VHOST, "connection_churn_metrics")


def churn(server: HttpContext, prefix: str) -> Iterator[Metric]:
    for name, doc, value in CHURN:
        yield CounterMetricFamily(prefix + name.removesuffix("_total"), doc,
                                  value=value(server))


def _family(spec: Spec, objects: list[tuple[list[str], Any]]) -> Iterator[Metric]:
    for name, doc, kind, labels, value in spec:
        fam: Any = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(
            name.removesuffix("_total"), doc, labels=labels)
        for values, obj in objects:
            fam.add_metric(values, value(obj))
        yield fam


def collect(server: HttpContext, families: Iterable[str], vhosts: set[str] | None
            ) -> Iterator[Metric]:
    from ackmq.server.http.metrics import collect as node_collect
    yield from (m for m in node_collect(server, per_object=True)
                if m.name in ("rabbitmq_identity_info", "rabbitmq_build_info"))
    seen: set[str] = set()  # a family named twice, or two sharing a metric, once
    vhs = [vh for name, vh in sorted(server.broker.vhosts.items())
           if vhosts is None or name in vhosts]
    for fam in families:
        if fam in seen:
            continue
        seen.add(fam)
        if fam in QUEUE:
            objs = [([vh.name, q.name], q) for vh in vhs
                    for q in sorted(vh.queues.values(), key=lambda q: q.name)]
            spec = [m for m in QUEUE[fam] if m[0] not in seen]
            seen.update(m[0] for m in spec)
            yield from _family(spec, objs)
        elif fam in EXCHANGE:
            xs = [([vh.name, x.name, x.type], x) for vh in vhs
                  for x in sorted(vh.exchanges.values(), key=lambda x: x.name)]
            yield from _family(EXCHANGE[fam], xs)
        elif fam == "connection_churn_metrics":
            yield from churn(server, "rabbitmq_detailed_")
        elif fam in VHOST:
            yield from _family(VHOST[fam], [([vh.name], vh) for vh in vhs])
        elif fam in CONNECTION or fam in CHANNEL:
            names = {vh.name for vh in vhs}
            conns = [c for c in list(server.connections) if c.vhost_name in names]
            if fam in CONNECTION:
                shown = [_connection_row(c) for c in conns]
                yield from _family(CONNECTION[fam], [([c["name"]], c) for c in shown])
            else:
                chans = [views.channel(c, n, ch) for c in conns
                         for n, ch in views.channels_of(c)]
                yield from _family(CHANNEL[fam], [([ch["name"]], ch) for ch in chans])


def _connection_row(c: Any) -> dict[str, Any]:
    """What the connection families read (views.connection's keys, without the rest
    of its JSON: a scrape costs O(connections) on the loop)."""
    return {"name": views.connection_name(c), "recv_oct": c.recv_oct, "send_oct": c.send_oct,
            "recv_cnt": c.recv_cnt, "send_cnt": c.send_cnt, "send_pend": 0,
            "channels": len(views.channels_of(c))}


def _auth_attempts(server: HttpContext, per_object: bool) -> Iterator[Metric]:
    """rabbitmq_auth_attempts_* per protocol; on /metrics/per-object also RabbitMQ's
    _detailed_ families (per user and source), empty as in RabbitMQ by default."""
    counts = server.broker.stats.auth.counts
    for what, doc, pick in (
            ("", "Total number of authorization attempts", lambda c: c[0] + c[1]),
            ("_succeeded", "Total number of successful authentication attempts",
             lambda c: c[0]),
            ("_failed", "Total number of failed authentication attempts", lambda c: c[1])):
        fam = CounterMetricFamily(f"rabbitmq_auth_attempts{what}", doc, labels=["protocol"])
        for proto, c in sorted(counts.items()):
            fam.add_metric([proto], pick(c))
        yield fam
        if per_object:
            yield CounterMetricFamily(f"rabbitmq_auth_attempts_detailed{what}", doc,
                                      labels=["protocol", "user", "source"])


def _publishers_consumers(server: HttpContext) -> Iterator[Metric]:
    """rabbitmq_global_publishers / _consumers per protocol: open channels that have
    published (RabbitMQ counts a channel as a publisher from its first publish), and
    consumers on open channels; the stream protocol's are its declared publishers and
    its subscriptions (which read the log, not as model consumers), as RabbitMQ's
    stream plugin counts them."""
    consumers: dict[int, int] = {}
    stream_pubs = 0
    for c in list(server.connections):
        if views_stream.is_stream(c):
            npub, nsub = views_stream.publishers_and_subscriptions(c)
            stream_pubs += npub
            consumers[-1] = consumers.get(-1, 0) + nsub
            continue
        for _n, ch in views.channels_of(c):
            key = id(getattr(ch, "protocol_stats", None))
            consumers[key] = consumers.get(key, 0) + len(ch.consumers)
    pubs = GaugeMetricFamily("rabbitmq_global_publishers", "Current number of publishers",
                             labels=["protocol"])
    cons = GaugeMetricFamily("rabbitmq_global_consumers", "Current number of consumers",
                             labels=["protocol"])
    for proto, ps in server.broker.stats.messages.items():
        if proto == "stream":
            pubs.add_metric([proto], stream_pubs)
            cons.add_metric([proto], consumers.get(-1, 0))
            continue
        pubs.add_metric([proto], sum(1 for m in list(ps.open) if m.received))
        cons.add_metric([proto], consumers.get(id(ps), 0))
    yield pubs
    yield cons


class _Scrape:
    def __init__(self, server: HttpContext, families: list[str], vhosts: set[str] | None
                 ) -> None:
        self.args = server, families, vhosts

    def collect(self) -> Iterator[Metric]:
        return collect(*self.args)


def render(server: HttpContext, families: list[str], vhosts: set[str] | None) -> bytes:
    return generate_latest(_Scrape(server, families, vhosts))


@public
async def metrics_detailed(request: web.Request) -> web.Response:
    from ackmq.server.http.metrics import CONTENT_TYPE
    qs = request.query
    vhosts = set(qs.getall("vhost")) if "vhost" in qs else None
    r = web.Response(body=render(request.app[SERVER_KEY], qs.getall("family", []), vhosts))
    r.headers["Content-Type"] = CONTENT_TYPE
    return r


# -- the same connection and channel figures on /metrics and /metrics/per-object ---------
STARTED = time.time()  # the management app is loaded as the broker starts


def object_families(server: HttpContext, per_object: bool) -> Iterator[Metric]:
    """RabbitMQ's rabbitmq_connection_* and rabbitmq_channel_* gauges and counters of
    the figures above: summed without labels on /metrics (plus
    process_start_time_seconds), per connection or channel (`channel` label) on
    /metrics/per-object."""
    conns = [_connection_row(c) for c in list(server.connections)]
    chans = [views.channel(c, n, ch) for c in list(server.connections)
             for n, ch in views.channels_of(c)]
    groups = [(spec, conns) for spec in CONNECTION.values()] + \
        [(spec, chans) for spec in CHANNEL.values()]
    for spec, objs in groups:
        for name, doc, kind, labels, value in spec:
            name = name.replace("rabbitmq_detailed_", "rabbitmq_").removesuffix("_total")
            fam: Any = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(
                name, doc, labels=labels if per_object else None)
            if per_object:
                for o in objs:
                    fam.add_metric([o["name"]], value(o))
            else:
                fam.add_metric([], sum(value(o) for o in objs))
            yield fam
    yield from churn(server, "rabbitmq_")
    yield from _publishers_consumers(server)
    yield from _auth_attempts(server, per_object)
    # RabbitMQ's TCP socket limit follows the file descriptors; a client connection is
    # one socket (the RabbitMQ-Overview dashboard's "TCP sockets available")
    yield GaugeMetricFamily("rabbitmq_process_max_tcp_sockets", "Open TCP sockets limit",
                            value=resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    yield GaugeMetricFamily("rabbitmq_process_open_tcp_sockets", "Open TCP sockets",
                            value=len(server.connections))
    if not per_object:
        stats = server.broker.stats
        for name, counter, doc in CHANNEL_COUNTERS:
            yield CounterMetricFamily(name.removesuffix("_total"), doc,
                                      value=stats.total(counter))
        yield GaugeMetricFamily("process_start_time_seconds",
                                "Start time of the process since unix epoch in seconds.",
                                value=STARTED)
