"""/api/stream/...: RabbitMQ's `rabbitmq_stream_management` plugin's listings of the
stream protocol's connections, publishers and consumers (server/views_stream.py), all or
per vhost (publishers also per stream). Who sees what is /api/connections' rule: an
administrator or monitoring user every connection of the vhosts it sees, others their
own."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ackmq.broker.access import READ
from ackmq.server import views_stream
from ackmq.server.http.api_node import visible_connections
from ackmq.server.http.common import add_listing, listing, one, sees_all, server, user, vhost_arg
from ackmq.server.ops import OpError, not_found


def _streams(request: web.Request) -> list[Any]:
    vhost = vhost_arg(request) if "vhost" in request.match_info else None
    return [c for c in visible_connections(request, vhost) if views_stream.is_stream(c)]


async def list_connections(request: web.Request) -> web.Response:
    return listing(request, [views_stream.stream_connection(c) for c in _streams(request)])


async def list_publishers(request: web.Request) -> web.Response:
    queue = request.match_info.get("queue")
    return listing(request, [p for c in _streams(request)
                             for p in views_stream.publishers(c, queue)])


async def list_consumers(request: web.Request) -> web.Response:
    return listing(request, [s for c in _streams(request) for s in views_stream.consumers(c)])


async def list_tracking(request: web.Request) -> web.Response:
    """ackmq's own (RabbitMQ reads it over Erlang distribution): a stream's tracking,
    rabbitmq-streams list_stream_tracking's rows, for `ackmq ctl --url`. Who may: an
    administrator or monitoring user, or one with read permission on the stream."""
    vhost = vhost_arg(request)
    srv = server(request)
    q = views_stream.stream_of(srv.broker.vhosts[vhost], request.match_info["queue"])
    if q is None:
        raise not_found()
    u = user(request)
    perm = srv.access.permission(u.name, vhost)
    if not sees_all(u) and (perm is None or not perm.allows(READ, q.name)):
        raise OpError(401, "not_authorised", "Access refused.")
    return one(request, {"items": views_stream.tracking(q)})


def register(app: web.Application) -> None:
    r = app.router
    add_listing(r, "/api/stream/connections", list_connections)
    add_listing(r, "/api/stream/publishers", list_publishers)
    r.add_get("/api/stream/publishers/{vhost}/{queue}", list_publishers)
    add_listing(r, "/api/stream/consumers", list_consumers)
    r.add_get("/api/stream/tracking/{vhost}/{queue}", list_tracking)
