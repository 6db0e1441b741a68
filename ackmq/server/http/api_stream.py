"""/api/stream/...: RabbitMQ's `rabbitmq_stream_management` plugin's listings of the
stream protocol's connections, publishers and consumers (server/views_stream.py), all or
per vhost (publishers also per stream). Who sees what is /api/connections' rule: an
administrator or monitoring user every connection of the vhosts it sees, others their
own."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ackmq.broker.access import READ
from ackmq.server import ops, views, views_stream
from ackmq.server.http import common
from ackmq.server.http.api_node import CLOSED_VIA_MGMT, visible_connections
from ackmq.server.ops import OpError, not_found


def _streams(request: web.Request) -> list[Any]:
    vhost = common.vhost_arg(request) if "vhost" in request.match_info else None
    return [c for c in visible_connections(request, vhost) if views_stream.is_stream(c)]


async def list_connections(request: web.Request) -> web.Response:
    return common.listing(request, [views_stream.stream_connection(c) for c in _streams(request)])


async def list_publishers(request: web.Request) -> web.Response:
    queue = request.match_info.get("queue")
    return common.listing(request, [p for c in _streams(request)
                                    for p in views_stream.publishers(c, queue)])


async def list_consumers(request: web.Request) -> web.Response:
    return common.listing(request, [s for c in _streams(request)
                                    for s in views_stream.consumers(c)])


def _connection(request: web.Request) -> Any:
    """The stream connection `{name}` of `{vhost}` (RabbitMQ's per-connection pages)."""
    name = request.match_info["name"]
    for c in _streams(request):
        if views.connection_name(c) == name:
            return c
    raise not_found()


async def get_connection(request: web.Request) -> web.Response:
    return common.one(request, views_stream.stream_connection(_connection(request)))


async def close_connection(request: web.Request) -> web.Response:
    """As DELETE /api/connections/{name}: closed with X-Reason's text."""
    conn = _connection(request)
    ops.close_connection(common.server(request), conn,
                         request.headers.get("X-Reason", CLOSED_VIA_MGMT)[:200])
    return common.no_content()


async def connection_publishers(request: web.Request) -> web.Response:
    return common.listing(request, views_stream.publishers(_connection(request)))


async def connection_consumers(request: web.Request) -> web.Response:
    return common.listing(request, views_stream.consumers(_connection(request)))


async def list_tracking(request: web.Request) -> web.Response:
    """ackmq's own (RabbitMQ reads it over Erlang distribution): a stream's tracking,
    rabbitmq-streams list_stream_tracking's rows, for `ackmq ctl --url`. Who may: an
    administrator or monitoring user, or one with read permission on the stream."""
    vhost = common.vhost_arg(request)
    srv = common.server(request)
    q = views_stream.stream_of(srv.broker.vhosts[vhost], request.match_info["queue"])
    if q is None:
        raise not_found()
    u = common.user(request)
    perm = srv.access.permission(u.name, vhost)
    if not common.sees_all(u) and (perm is None or not perm.allows(READ, q.name)):
        raise OpError(401, "not_authorised", "Access refused.")
    return common.one(request, {"items": views_stream.tracking(q)})


def register(app: web.Application) -> None:
    r = app.router
    common.add_listing(r, "/api/stream/connections", list_connections)
    common.add_listing(r, "/api/stream/publishers", list_publishers)
    r.add_get("/api/stream/publishers/{vhost}/{queue}", list_publishers)
    common.add_listing(r, "/api/stream/consumers", list_consumers)
    r.add_get("/api/stream/tracking/{vhost}/{queue}", list_tracking)
    # rabbitmq_stream_management's per-connection pages
    conn = "/api/stream/connections/{vhost}/{name}"
    r.add_get(conn, get_connection)
    r.add_delete(conn, close_connection)
    r.add_get(conn + "/publishers", connection_publishers)
    r.add_get(conn + "/consumers", connection_consumers)
