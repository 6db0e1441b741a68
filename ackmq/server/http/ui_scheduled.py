"""The web UI's scheduled-messages page (Admin → Scheduled messages): the pending
ActiveMQ-style scheduled STOMP jobs (broker/scheduled.py) of the vhosts the user sees,
with a button to cancel each. The API's rules (server/http/api_scheduled.py):
administrators and monitoring users see every job, others their own; administrators
cancel any job, others their own."""

from __future__ import annotations

import time

from aiohttp import web

from ackmq.broker import scheduled
from ackmq.server.http.app import has_tag
from ackmq.server.http.ui import back, render, ui_server, user_vhosts
from ackmq.server.http.ui_html import e, form, hidden, table

HEADS = ["Vhost", "Id", "Exchange", "Routing key", "User", "Next run (UTC)", "Period (ms)",
         "Repeats left", "Cron", ""]


def _when(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000))


async def scheduled_page(request: web.Request) -> web.Response:
    user = request["user"]
    sees_all = has_tag(user, "monitoring")
    admin = has_tag(user, "administrator")
    broker = ui_server(request).broker
    rows = []
    for v in user_vhosts(request):
        vh = broker.vhosts.get(v)
        store = scheduled.existing(vh) if vh is not None else None
        if store is None:
            continue
        for j in store.jobs(None if sees_all else scheduled.made_by(user.name)):
            cancel = form("/scheduled/delete", hidden(vhost=v, id=j["id"]), "Cancel",
                          confirm=f"Cancel {j['id']}?", cls="inline") \
                if admin or j["user"] == user.name else ""
            rows.append([e(v), e(j["id"]), e(j["exchange"]), e(j["routing_key"]),
                         e(j["user"]), e(_when(j["next_run"])), e(j["period"]),
                         e(j["repeats_left"]), e(j["cron"]), cancel])
    live = table(HEADS, rows, "scheduled", "no scheduled messages")
    return render(request, "Scheduled messages", "/admin", live)


async def delete_scheduled(request: web.Request) -> web.StreamResponse:
    data = await request.post()
    user = request["user"]
    vhost, job = str(data.get("vhost", "/")), str(data.get("id", ""))
    vh = ui_server(request).broker.vhosts.get(vhost)
    store = scheduled.existing(vh) if vh is not None and vhost in user_vhosts(request) \
        else None
    one, mine = scheduled.job_is(job), scheduled.made_by(user.name)
    if store is None or not store.cancel(
            one if has_tag(user, "administrator") else (lambda m: one(m) and mine(m))):
        raise back("/scheduled", f"no scheduled message {job} in vhost {vhost}", True)
    raise back("/scheduled", f"Scheduled message {job} cancelled")


def register(app: web.Application) -> None:
    app.router.add_get("/scheduled", scheduled_page)
    app.router.add_post("/scheduled/delete", delete_scheduled)
