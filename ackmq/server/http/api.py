"""The management API's routes (SPEC M1): RabbitMQ 3.10's paths, JSON keys and codes.

Handlers only read snapshots (server/http/views.py) and call the same model operations
an AMQP channel or `ackmq ctl` calls; none of them touches a queue's internals.
"""

from __future__ import annotations

from aiohttp import web

from ackmq.server.http import views
from ackmq.server.http.app import SERVER_KEY, json_response


async def overview(request: web.Request) -> web.Response:
    return json_response(views.overview(request.app[SERVER_KEY], request["user"]))


async def whoami(request: web.Request) -> web.Response:
    u = request["user"]
    return json_response({"name": u.name, "tags": list(u.tags)})


def register(app: web.Application) -> None:
    app.router.add_get("/api/overview", overview)
    app.router.add_get("/api/whoami", whoami)
