"""The node's routes: overview, nodes, health checks, connections, channels and
consumers (SPEC M1), with RabbitMQ's visibility: management users see their own
connections and channels, monitoring and administrator users everyone's."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from aiohttp import web

from ackmq.server import ops, views
from ackmq.server.http import common, health
from ackmq.server.http.app import json_response, public, requires
from ackmq.server.http.sampler import SAMPLER_KEY, channel_message_stats, connection_rates

CLOSED_VIA_MGMT = "Closed via management plugin"


async def overview(request: web.Request) -> web.Response:
    sampler = request.app.get(SAMPLER_KEY)  # the UI's rate sampler (server/http/ui.py)
    stats = sampler.message_stats() if sampler is not None else None
    return common.one(request, views.overview(common.server(request), common.user(request), stats))


async def whoami(request: web.Request) -> web.Response:
    u = common.user(request)
    return json_response({"name": u.name, "tags": list(u.tags)})


async def cluster_name(request: web.Request) -> web.Response:
    return json_response({"name": views.node_name()})


async def extensions(request: web.Request) -> web.Response:
    return json_response([])


@requires("monitoring")
async def nodes(request: web.Request) -> web.Response:
    return common.listing(request, [views.node(common.server(request))])


@requires("monitoring")
async def node(request: web.Request) -> web.Response:
    if request.match_info["node"] != views.node_name():
        raise ops.not_found()
    return common.one(request, views.node(common.server(request)))


# -- health checks (rabbit_mgmt_wm_health_check_*) --------------------------------------
def _failed(body: dict[str, Any]) -> web.Response:
    return json_response({"status": "failed", **body}, 503)


async def check_alarms(request: web.Request) -> web.Response:
    mon = common.server(request).alarms
    active = sorted(mon.limits.active) if mon is not None else []
    if not active:
        return json_response({"status": "ok"})
    where = "on the node" if "local-alarms" in request.path else "in the cluster"
    return _failed({"reason": f"There are alarms in effect {where}",
                    "alarms": [{"node": views.node_name(), "resource": r} for r in active]})


def _ports(srv: Any) -> dict[str, int]:
    return {x["protocol"]: x["port"] for x in views.listeners(srv)}


async def check_port(request: web.Request) -> web.Response:
    try:
        port = int(request.match_info["port"])
    except ValueError:
        return json_response({"error": "bad_request", "reason": "Invalid port"}, 400)
    ports = _ports(common.server(request))
    if port in ports.values():
        return json_response({"status": "ok", "port": port})
    return _failed({"reason": "No active listener", "missing": port,
                    "ports": sorted(ports.values())})


async def check_protocol(request: web.Request) -> web.Response:
    proto = health.normalize_protocol(request.match_info["protocol"])  # "amqp091": amqp
    ports = _ports(common.server(request))
    if proto in ports:
        return json_response({"status": "ok", "protocol": proto})
    return _failed({"reason": "No active listener", "missing": proto,
                    "protocols": sorted(ports)})


async def check_ok(request: web.Request) -> web.Response:
    return json_response({"status": "ok"})


async def check_certificates(request: web.Request) -> web.Response:
    """503 when a TLS listener's certificate expires within the window (RabbitMQ's)."""
    try:
        window = health.expiration_window(request.match_info["within"],
                                          request.match_info["unit"])
    except ValueError as e:
        return json_response({"error": "bad_request", "reason": str(e)}, 400)
    srv = common.server(request)
    expired = health.expiring(srv.config, views.listeners(srv), window)
    if expired:
        return _failed({"reason": "Certificates expiring", "expired": expired})
    return json_response({"status": "ok"})


async def check_node(request: web.Request) -> web.Response:
    """The deprecated /api/healthchecks/node[/{node}] of RabbitMQ 3.10 (a node is
    healthy when it answers; another node's name is a 404)."""
    if request.match_info.get("node", views.node_name()) != views.node_name():
        raise ops.not_found()
    return json_response({"status": "ok"})


async def check_single_node(request: web.Request) -> web.Response:
    return json_response({"status": "ok", "reason": "single node cluster"})


async def aliveness(request: web.Request) -> web.Response:
    common.vhost_arg(request)
    return json_response({"status": "ok"})


# -- connections, channels, consumers ---------------------------------------------------
def visible_connections(request: web.Request, vhost: str | None = None) -> list[Any]:
    srv, u = common.server(request), common.user(request)
    allowed = set(views.visible_vhosts(srv, u))
    out = []
    for c in list(srv.connections):
        v = c.vhost_name
        if v is None or v not in allowed or (vhost is not None and v != vhost):
            continue
        if common.sees_all(u) or c.user == u.name:
            out.append(c)
    return out


async def list_connections(request: web.Request) -> web.Response:
    vhost = common.vhost_arg(request) if "vhost" in request.match_info else None
    sampler = request.app.get(SAMPLER_KEY)
    return common.listing(request, [views.connection(c, connection_rates(sampler, c))
                                    for c in visible_connections(request, vhost)])


def _connection(request: web.Request) -> Any:
    name = request.match_info["name"]
    for c in visible_connections(request):
        if views.connection_name(c) == name:
            return c
    raise ops.not_found()


async def get_connection(request: web.Request) -> web.Response:
    c = _connection(request)
    rates = connection_rates(request.app.get(SAMPLER_KEY), c)
    return common.one(request, views.connection(c, rates))


async def close_connection(request: web.Request) -> web.Response:
    """As RabbitMQ: 320 CONNECTION_FORCED with the X-Reason header's text, or "Closed
    via management plugin"."""
    conn = _connection(request)
    reason = request.headers.get("X-Reason", CLOSED_VIA_MGMT)[:200]
    ops.close_connection(common.server(request), conn, reason)
    return common.no_content()


async def connection_channels(request: web.Request) -> web.Response:
    conn = _connection(request)
    sampler = request.app.get(SAMPLER_KEY)
    return common.listing(request, [views.channel(conn, n, ch, channel_message_stats(sampler, ch))
                                    for n, ch in views.channels_of(conn)])


def _channel_rows(request: web.Request,
                  vhost: str | None = None) -> Iterator[tuple[Any, dict[str, Any]]]:
    """Each visible channel with its API row, for the listing and the one-channel page."""
    sampler = request.app.get(SAMPLER_KEY)
    for c in visible_connections(request, vhost):
        for n, ch in views.channels_of(c):
            yield ch, views.channel(c, n, ch, channel_message_stats(sampler, ch))


async def list_channels(request: web.Request) -> web.Response:
    vhost = common.vhost_arg(request) if "vhost" in request.match_info else None
    return common.listing(request, [shown for _, shown in _channel_rows(request, vhost)])


async def get_channel(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    for ch, shown in _channel_rows(request):
        if shown["name"] == name:
            # RabbitMQ's details: the consumers; publishes and deliveries per
            # exchange/queue need rates_mode detailed (empty there too)
            return common.one(request, {**shown, "publishes": [], "deliveries": [],
                                        "consumer_details": [views.consumer(k) for k in
                                                      list(ch.consumers.values())]})
    raise ops.not_found()


async def list_consumers(request: web.Request) -> web.Response:
    srv = common.server(request)
    return common.listing(request, [views.consumer(c) for n in common.listed_vhosts(request)
                                    if n in srv.broker.vhosts
                                    for q in srv.broker.vhosts[n].queues.values()
                                    for c in q.consumers.values()])


@public
async def auth_settings(request: web.Request) -> web.Response:
    """What RabbitMQ's UI asks before login: no OAuth 2 here."""
    return json_response({"enable_uaa": False, "uaa_client_id": "", "uaa_location": ""})


# RabbitMQ 3.10's management agent counts an unroutable drop and an empty basic.get in
# message_stats only under these two flags; a node whose first boot predates the
# management plugin (Debian's package starts one on install) has them off and shows 0.
# ackmq always counts both: it lists them as enabled, so a tool can tell.
FEATURE_FLAGS = (
    ("drop_unroutable_metric", "Count unroutable publishes to be dropped in stats"),
    ("empty_basic_get_metric", "Count AMQP `basic.get` on empty queues in stats"),
)


@requires("administrator")
async def feature_flags(request: web.Request) -> web.Response:
    return json_response([{"name": name, "desc": desc, "doc_url": "", "state": "enabled",
                           "stability": "stable", "provided_by": "rabbitmq_management_agent"}
                          for name, desc in FEATURE_FLAGS])


def register(app: web.Application) -> None:
    r = app.router
    r.add_get("/api/auth", auth_settings)
    r.add_get("/api/overview", overview)
    r.add_get("/api/whoami", whoami)
    r.add_get("/api/cluster-name", cluster_name)
    r.add_get("/api/extensions", extensions)
    r.add_get("/api/feature-flags", feature_flags)
    r.add_get("/api/nodes", nodes)
    r.add_get("/api/nodes/{node}", node)
    h = "/api/health/checks/"
    r.add_get(h + "alarms", check_alarms)
    r.add_get(h + "local-alarms", check_alarms)
    r.add_get(h + "port-listener/{port}", check_port)
    r.add_get(h + "protocol-listener/{protocol}", check_protocol)
    r.add_get(h + "virtual-hosts", check_ok)
    r.add_get(h + "certificate-expiration/{within}/{unit}", check_certificates)
    r.add_get("/api/healthchecks/node", check_node)
    r.add_get("/api/healthchecks/node/{node}", check_node)
    r.add_get(h + "node-is-quorum-critical", check_single_node)
    r.add_get(h + "node-is-mirror-sync-critical", check_single_node)
    r.add_get("/api/aliveness-test/{vhost}", aliveness)
    r.add_get("/api/connections", list_connections)
    r.add_get("/api/vhosts/{vhost}/connections", list_connections)
    r.add_get("/api/connections/{name}", get_connection)
    r.add_delete("/api/connections/{name}", close_connection)
    r.add_get("/api/connections/{name}/channels", connection_channels)
    r.add_get("/api/channels", list_channels)
    r.add_get("/api/vhosts/{vhost}/channels", list_channels)
    r.add_get("/api/channels/{name}", get_channel)
    common.add_listing(r, "/api/consumers", list_consumers)
