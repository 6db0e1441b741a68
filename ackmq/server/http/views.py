"""Read-only JSON views of the running broker in RabbitMQ 3.10's management layout.

Each function reads counters and names through the model's public attributes (the
`Queue` interface's counters, exchange and binding fields, the access model) and builds
plain dicts; nothing here changes state or holds a reference past the call. Who may see
what (RabbitMQ's per-vhost visibility) is decided by `visible_vhosts`.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ackmq.server.server import Server

_STARTED = time.monotonic()
EXCHANGE_TYPES = [
    {"name": t, "description": f"AMQP {t} exchange, as per the AMQP specification",
     "enabled": True} for t in ("direct", "fanout", "headers", "topic")]


def node_name() -> str:
    return f"ackmq@{socket.gethostname().split('.')[0]}"


def product() -> dict[str, str]:
    from ackmq import __version__
    return {"management_version": __version__, "product_version": __version__,
            "product_name": "ackmq", "rabbitmq_version": "3.10.8"}


def visible_vhosts(server: Server, user: Any) -> list[str]:
    """RabbitMQ: administrator and monitoring users see every vhost; others the vhosts
    they have permissions on."""
    access = server.access
    if {"administrator", "monitoring"}.intersection(user.tags):
        return list(access.vhosts)
    return [v for v in access.vhosts if access.vhost_access(user.name, v)]


def sees_all_connections(user: Any) -> bool:
    return bool({"administrator", "monitoring"}.intersection(user.tags))


def _rate(n: int) -> dict[str, Any]:
    return {"rate": 0.0}


def listeners(server: Server) -> list[dict[str, Any]]:
    node = node_name()
    out = []
    cfg = server.config
    ip = cfg.host or "::"
    for proto, port in (("amqp", server.port), ("amqp/ssl", server.tls_port),
                        ("stomp", server.stomp_port), ("stomp/ssl", server.stomp_tls_port),
                        ("http", server.http.port if server.http else 0),
                        ("https", server.http.https_port if server.http else 0)):
        if port:
            out.append({"node": node, "protocol": proto, "ip_address": ip, "port": port,
                        "socket_opts": {}})
    return out


def overview(server: Server, user: Any) -> dict[str, Any]:
    """GET /api/overview. Totals cover the vhosts `user` may see; message rates are not
    sampled yet (0.0)."""
    vhosts = set(visible_vhosts(server, user))
    queues = [q for name, vh in server.broker.vhosts.items() if name in vhosts
              for q in vh.queues.values()]
    ready = sum(q.message_count for q in queues)
    unacked = sum(q.unacked_count for q in queues)
    conns = [c for c in server.connections if _conn_vhost(c) in vhosts
             and (sees_all_connections(user) or c.user == user.name)]
    node = node_name()
    return {
        **product(),
        "rates_mode": "basic",
        "sample_retention_policies": {"global": [600, 3600, 28800, 86400],
                                      "basic": [600, 3600], "detailed": [600]},
        "exchange_types": EXCHANGE_TYPES,
        "cluster_name": node,
        "erlang_version": "python " + sys.version.split()[0],
        "erlang_full_version": "Python " + sys.version.replace("\n", " "),
        "release_series_support_status": "supported",
        "disable_stats": False,
        "enable_queue_totals": False,
        "message_stats": {},
        "churn_rates": {},
        "queue_totals": {"messages": ready + unacked, "messages_details": _rate(0),
                         "messages_ready": ready, "messages_ready_details": _rate(0),
                         "messages_unacknowledged": unacked,
                         "messages_unacknowledged_details": _rate(0)},
        "object_totals": {
            "channels": sum(len(getattr(c, "channels", {}) or {}) for c in conns),
            "connections": len(conns),
            "consumers": sum(q.consumer_count for q in queues),
            "exchanges": sum(len(vh.exchanges) for name, vh in server.broker.vhosts.items()
                             if name in vhosts),
            "queues": len(queues)},
        "statistics_db_event_queue": 0,
        "node": node,
        "listeners": listeners(server),
        "contexts": [{"node": node, "description": "ackmq management", "path": "/",
                      "port": str(server.http.port if server.http else 0)}],
    }


def _conn_vhost(conn: Any) -> str | None:
    from ackmq.server.connection import vhost_name
    return vhost_name(conn)


def uptime_ms() -> int:
    return int((time.monotonic() - _STARTED) * 1000)


def os_pid() -> str:
    return str(os.getpid())
