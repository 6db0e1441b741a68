"""The stream protocol's connections, publishers and consumers as RabbitMQ's
`rabbitmq_stream_management` plugin lists them (`/api/stream/...`) and
`rabbitmq-streams list_stream_*` prints them (the same JSON for `ackmq ctl`, from the
admin socket or `--url`). The connections are read duck-typed (`publishers.by_id`,
`subscriptions.by_id`): the HTTP API and ctl do not import the stream front end."""

from __future__ import annotations

from typing import Any

from ackmq.broker.stream import TRACK_PUBLISHER
from ackmq.server.views import connection, connection_name, hostport, node_name


def is_stream(conn: Any) -> bool:
    return getattr(conn, "protocol", "") == "stream" and conn.vhost_name is not None


def publishers_and_subscriptions(conn: Any) -> tuple[int, int]:
    """A stream connection's declared publishers and its subscriptions (/metrics)."""
    return len(conn.publishers.by_id), len(conn.subscriptions.by_id)


def _details(conn: Any) -> dict[str, Any]:
    """RabbitMQ's `connection_details` of a publisher or a consumer."""
    ph, pp = hostport(conn.peer)
    return {"name": connection_name(conn), "user": conn.user, "node": node_name(),
            "peer_host": ph, "peer_port": pp}


def stream_connection(conn: Any) -> dict[str, Any]:
    """/api/stream/connections: the connection as /api/connections lists it, with the
    counts of its publishers and consumers (rabbitmq-streams' columns)."""
    return {**connection(conn), "publishers": len(conn.publishers.by_id),
            "consumers": len(conn.subscriptions.by_id)}


def publishers(conn: Any, queue: str | None = None) -> list[dict[str, Any]]:
    """The connection's publishers (on `queue` only, if given)."""
    details = _details(conn)
    return [{"queue": {"name": p.queue.name, "vhost": p.queue.vhost.name},
             "connection_details": details, "publisher_id": p.publisher_id,
             "reference": p.reference, "published": p.published, "confirmed": p.confirmed,
             "errored": p.errored}
            for p in list(conn.publishers.by_id.values())
            if queue is None or p.queue.name == queue]


def consumers(conn: Any, queue: str | None = None) -> list[dict[str, Any]]:
    """The connection's subscriptions: `offset` is the next one to be sent, `offset_lag`
    how far that is behind the stream's end."""
    details = _details(conn)
    out = []
    for s in list(conn.subscriptions.by_id.values()):
        q = s.queue
        if queue is not None and q.name != queue:
            continue
        lg = q.log
        lag = 0 if lg is None else max(lg.next_offset - s.offset, 0)
        status = "up" if s.group is None else "single_active" if s.ready else "waiting"
        out.append({"queue": {"name": q.name, "vhost": q.vhost.name},
                    "connection_details": details, "subscription_id": s.subscription_id,
                    "credits": s.credit, "consumed": s.consumed, "offset": s.offset,
                    "offset_lag": lag, "properties": dict(s.properties),
                    "active": s.ready, "activity_status": status})
    return out


def stream_of(vhost: Any, name: str) -> Any:
    """The vhost's stream queue `name`, or None (not there, or not a stream)."""
    q = vhost.queues.get(name)
    return q if q is not None and hasattr(q, "tracked_all") and not q.deleted else None


def tracking(q: Any) -> list[dict[str, Any]]:
    """rabbitmq-streams list_stream_tracking's rows: each named publisher's last
    publishing id (`writer`, deduplication) and each named consumer's stored offset
    (`offset`), writers first, as RabbitMQ lists them."""
    rows = [{"type": "writer" if kind == TRACK_PUBLISHER else "offset", "name": ref,
             "tracking_value": value} for kind, ref, value in q.tracked_all()]
    return sorted(rows, key=lambda r: r["type"] != "writer")
