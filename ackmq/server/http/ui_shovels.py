"""The web UI's shovel status page (Admin → Shovel status, as RabbitMQ's management UI):
every dynamic shovel of the vhosts the user sees, with its state, source, destination
and termination reason (the status API's documents, server/parameters.py's `shovel`
component), and a Restart button for policymakers. Refreshed live."""

from __future__ import annotations

from aiohttp import web

from ackmq.server.http.app import has_tag
from ackmq.server.http.ui import back, render, ui_server, user_vhosts
from ackmq.server.http.ui_html import e, form, hidden, table

HEADS = ["Vhost", "Name", "State", "Source", "Destination", "Last changed", "Reason", ""]


def _where(s: dict[str, object], side: str) -> str:
    what = s.get(f"{side}_queue") or s.get(f"{side}_exchange") or ""
    return f"{s.get(f'{side}_uri', '')} {what}".strip()


async def shovels_page(request: web.Request) -> web.Response:
    reg = ui_server(request).parameters
    comp = reg.components.get("shovel") if reg is not None else None
    vhosts = set(user_vhosts(request))
    maker = has_tag(request["user"], "policymaker")
    rows = []
    for s in (comp.status(None) if comp is not None else []):
        if s["vhost"] not in vhosts:
            continue
        restart = form("/shovels/restart", hidden(vhost=s["vhost"], name=s["name"]),
                       "Restart", cls="inline") if maker else ""
        rows.append([e(s["vhost"]), e(s["name"]), e(s["state"]), e(_where(s, "src")),
                     e(_where(s, "dest")), e(s["timestamp"]), e(s.get("reason", "")),
                     restart])
    empty = "no shovels" if comp is not None else "no shovel component (ackmq serve has it)"
    return render(request, "Shovel status", "/admin", table(HEADS, rows, "shovels", empty))


async def restart_shovel(request: web.Request) -> web.StreamResponse:
    data = await request.post()
    vhost, name = str(data.get("vhost", "/")), str(data.get("name", ""))
    reg = ui_server(request).parameters
    comp = reg.components.get("shovel") if reg is not None else None
    if (not has_tag(request["user"], "policymaker") or vhost not in user_vhosts(request)
            or comp is None or not comp.restart(vhost, name)):
        raise back("/shovels", f"no shovel {name} in vhost {vhost}", True)
    raise back("/shovels", f"Shovel {name} restarted")


def register(app: web.Application) -> None:
    app.router.add_get("/shovels", shovels_page)
    app.router.add_post("/shovels/restart", restart_shovel)
