"""/api/scheduled: the pending ActiveMQ-style scheduled messages (STOMP's AMQ_SCHEDULED_*,
broker/scheduled.py), ackmq's own route (RabbitMQ has no scheduler). GET lists them per
vhost (administrator and monitoring users see every job of the vhosts they see, others
only the jobs they scheduled); DELETE /api/scheduled/<vhost>/<id> cancels one (an
administrator any, others their own): 204, or 404 when there is no such job."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ackmq.broker import scheduled
from ackmq.server.http.common import (
    add_listing,
    is_admin,
    listed_vhosts,
    listing,
    no_content,
    sees_all,
    server,
    user,
    vhost_arg,
)
from ackmq.server.ops import not_found
from ackmq.server.views import scheduled_jobs


def _jobs(srv: Any, vhost: str, u: Any) -> list[dict[str, Any]]:
    return scheduled_jobs(srv.broker.vhosts.get(vhost),
                          None if sees_all(u) else scheduled.made_by(u.name))


async def list_scheduled(request: web.Request) -> web.Response:
    srv, u = server(request), user(request)
    return listing(request, [j for v in listed_vhosts(request) for j in _jobs(srv, v, u)])


async def delete_scheduled(request: web.Request) -> web.Response:
    srv, u = server(request), user(request)
    vh = srv.broker.vhosts[vhost_arg(request)]
    store = scheduled.existing(vh)
    one = scheduled.job_is(request.match_info["id"])
    mine = scheduled.made_by(u.name)
    if store is None or not store.cancel(
            one if is_admin(u) else (lambda m: one(m) and mine(m))):
        raise not_found()
    return no_content()


def register(app: web.Application) -> None:
    add_listing(app.router, "/api/scheduled", list_scheduled)
    app.router.add_delete("/api/scheduled/{vhost}/{id}", delete_scheduled)
