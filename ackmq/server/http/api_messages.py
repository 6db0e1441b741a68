"""A queue's messages looked at and moved (docs/management.md, docs/shovels.md):
POST /api/queues/<vhost>/<name>/peek (V3, server/peek.py: not taken) and
POST /api/queues/<vhost>/<name>/replay (V4, server/replay.py: moved back by a shovel)."""

from __future__ import annotations

from aiohttp import web

from ackmq.server.http.app import json_response
from ackmq.server.http.common import body_json, body_object, server, user, vhost_arg
from ackmq.server.peek import peek_json
from ackmq.server.replay import replay


async def peek_messages(request: web.Request) -> web.Response:
    vhost = vhost_arg(request)
    body = await body_json(request)
    return json_response(peek_json(server(request), user(request).name, vhost,
                                   request.match_info["name"], body))


async def replay_messages(request: web.Request) -> web.Response:
    vhost = vhost_arg(request)
    body = await body_object(request)
    return json_response(replay(server(request), user(request).name, vhost,
                                request.match_info["name"], body.get("destination"),
                                body.get("count")), 201)


def register(app: web.Application) -> None:
    app.router.add_post("/api/queues/{vhost}/{name}/peek", peek_messages)
    app.router.add_post("/api/queues/{vhost}/{name}/replay", replay_messages)
