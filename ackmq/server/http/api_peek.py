"""POST /api/queues/<vhost>/<name>/peek (V3): messages looked at, not taken
(server/peek.py; docs/management.md)."""

from __future__ import annotations

from aiohttp import web

from ackmq.server.http.app import json_response
from ackmq.server.http.common import body_json, server, user, vhost_arg
from ackmq.server.peek import peek_json


async def peek_messages(request: web.Request) -> web.Response:
    vhost = vhost_arg(request)
    body = await body_json(request)
    return json_response(peek_json(server(request), user(request).name, vhost,
                                   request.match_info["name"], body))


def register(app: web.Application) -> None:
    app.router.add_post("/api/queues/{vhost}/{name}/peek", peek_messages)
