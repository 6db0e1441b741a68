"""The web UI's stream connections (as RabbitMQ's management UI with
rabbitmq_stream_management): the "Stream Connections" tab lists the stream protocol's
connections the user may see (the Connections page's rule: administrators and
monitoring users every one of their vhosts, others their own), each leading to its
page with its details and its Publishers and Consumers tabs. The rows are the stream
API's (server/views_stream.py); refreshed live."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ackmq.server import views, views_stream
from ackmq.server.http.ui import render, visible_connections
from ackmq.server.http.ui_html import as_json, e, href, num, table

PATH = "/stream/connections"


def _streams(request: web.Request) -> list[Any]:
    return [c for c in visible_connections(request) if views_stream.is_stream(c)]


def _link(c: Any) -> str:
    name = views.connection_name(c)
    return (f'<a href="{href("/stream/connection", vhost=c.vhost_name, name=name)}">'
            f'{e(name)}</a>')


async def connections_page(request: web.Request) -> web.Response:
    rows = []
    for c in _streams(request):
        s = views_stream.stream_connection(c)
        rows.append([e(s["vhost"]), _link(c), e(s["user"]), e(s["state"]),
                     "&#9679;" if s.get("ssl") else "&#9675;", num(s["publishers"]),
                     num(s["consumers"])])
    live = table(["Virtual host", "Name", "User name", "State", "SSL / TLS", "Publishers",
                  "Consumers"], rows, "stream-connections", "... no stream connections ...")
    return render(request, "Stream connections", PATH, live)


def publishers_table(pubs: list[dict[str, Any]]) -> str:
    rows = [[e(p["queue"]["name"]), num(p["publisher_id"]), e(p["reference"]),
             num(p["published"]), num(p["confirmed"]), num(p["errored"])] for p in pubs]
    return table(["Stream", "Publisher ID", "Reference", "Published", "Confirmed",
                  "Errored"], rows, "stream-publishers", "... no publishers ...")


def consumers_table(subs: list[dict[str, Any]]) -> str:
    rows = [[e(s["queue"]["name"]), num(s["subscription_id"]), num(s["credits"]),
             num(s["consumed"]), num(s["offset"]), num(s["offset_lag"]),
             "&#9679;" if s["active"] else "&#9675;", e(s["activity_status"]),
             as_json(s["properties"])] for s in subs]
    return table(["Stream", "Subscription ID", "Credits", "Consumed", "Offset",
                  "Offset lag", "Active", "Activity status", "Properties"], rows,
                 "stream-consumers", "... no consumers ...")


async def connection_page(request: web.Request) -> web.Response:
    vhost, name = request.query.get("vhost", ""), request.query.get("name", "")
    for c in _streams(request):
        if c.vhost_name == vhost and views.connection_name(c) == name:
            break
    else:
        raise web.HTTPNotFound()
    s = views_stream.stream_connection(c)
    details = table(["", ""], [[e(k), e(v)] for k, v in (
        ("Virtual host", s["vhost"]), ("User name", s["user"]), ("Protocol", "stream"),
        ("State", s["state"]), ("Heartbeat", s.get("timeout")),
        ("Frame max", s.get("frame_max")), ("SSL / TLS", bool(s.get("ssl"))))],
        "stream-connection")
    live = (f'<h2>Overview</h2>{details}'
            f'<h2>Publishers</h2>{publishers_table(views_stream.publishers(c))}'
            f'<h2>Consumers</h2>{consumers_table(views_stream.consumers(c))}')
    return render(request, f"Stream connection {name}", PATH, live)


def register(app: web.Application) -> None:
    app.router.add_get(PATH, connections_page)
    app.router.add_get("/stream/connection", connection_page)
