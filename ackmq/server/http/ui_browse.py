"""The web UI's message browser (V3): a queue's messages paged through with the peek
operation (server/peek.py, the API's `POST /api/queues/<vhost>/<name>/peek`), nothing
taken, nothing marked redelivered. Each message shows its routing, properties, headers,
x-death (where it died, why, how often) and a body preview; Previous / Next page
through `ready` or `unacked` messages (a stream by offset). "Replay" (V4) moves the
queue's messages back to their x-first-death-queue, or to a queue named, through a
self-deleting on-confirm shovel (server/replay.py)."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from ackmq.server.http.ui import back, render, ui_server
from ackmq.server.http.ui_html import e, form, hidden, href, table
from ackmq.server.ops import OpError
from ackmq.server.peek import peek_json
from ackmq.server.replay import replay

PAGE = 20  # messages on one page
PREVIEW = 300  # body bytes shown


def link(vhost: str, name: str) -> str:
    """The queue page's way in."""
    return (f'<p><a class="browse" href="{href("/queue/browse", vhost=vhost, name=name)}">'
            "Browse messages</a> (without taking them)</p>")


def _deaths(headers: dict[str, Any]) -> str:
    deaths = headers.get("x-death")
    if not isinstance(deaths, list):
        return ""
    return "<br>".join(e(f"{d.get('queue')}: {d.get('reason')} ×{d.get('count')}")
                       for d in deaths if isinstance(d, dict))


def _row(n: int, m: dict[str, Any]) -> list[str]:
    props = m["properties"] or {}
    headers = props.get("headers") or {}
    others = {k: v for k, v in props.items() if k != "headers"}
    body = m["payload"] if m["payload_encoding"] == "string" else f"(base64) {m['payload']}"
    more = "…" if m["payload_bytes"] > PREVIEW else ""
    return [str(n), e(m["exchange"] or "(default)"), e(m["routing_key"]),
            e(m["redelivered"]),
            f"<code>{e(json.dumps(others, ensure_ascii=False))}</code>",
            f"<code>{e(json.dumps(headers, ensure_ascii=False))}</code>" if headers else "",
            _deaths(headers),
            f"<pre>{e(body)}{more}</pre><small>{m['payload_bytes']} bytes</small>"]


async def browse_page(request: web.Request) -> web.Response:
    qs = request.query
    vhost, name = qs.get("vhost", "/"), qs.get("name", "")
    state = qs.get("state", "ready")
    try:
        offset = max(0, int(qs.get("offset", "0")))
    except ValueError:
        offset = 0
    flash = ""
    try:
        msgs = peek_json(ui_server(request), request["user"].name, vhost, name,
                         {"offset": offset, "count": PAGE, "state": state,
                          "truncate": PREVIEW})
    except OpError as refused:
        msgs, flash = [], refused.reason
    rows = [_row(offset + i, m) for i, m in enumerate(msgs)]
    tabs = " | ".join(
        (f"<b>{s}</b>" if s == state else
         f'<a href="{href("/queue/browse", vhost=vhost, name=name, state=s)}">{s}</a>')
        for s in ("ready", "unacked"))
    pager = []
    if offset > 0:
        pager.append(f'<a class="prev" href="{href("/queue/browse", vhost=vhost, name=name, state=state, offset=str(max(0, offset - PAGE)))}">Previous</a>')
    if len(msgs) == PAGE:
        pager.append(f'<a class="next" href="{href("/queue/browse", vhost=vhost, name=name, state=state, offset=str(offset + PAGE))}">Next</a>')
    back = f'<a href="{href("/queue", vhost=vhost, name=name)}">Queue {e(name)}</a>'
    static = (f"<p>{back} · {tabs} · messages {offset}–{offset + len(msgs)}</p>"
              + table(["#", "Exchange", "Routing key", "Redelivered", "Properties",
                       "Headers", "x-death", "Body"], rows, "messages", "no messages")
              + f'<p class="pager">{" ".join(pager)}</p>'
              + "<section><h2>Replay</h2>"
              + form("/queue/browse/replay", hidden(vhost=vhost, name=name)
                     + '<label>To queue <input name="destination" placeholder='
                       '"(empty: each to its x-first-death-queue)"></label>',
                     "Replay messages", f"Move every message of {name}?", cls="replay")
              + "</section>")
    return render(request, f"Browse {name}", "/queues", "", static, flash, bool(flash))


async def replay_action(request: web.Request) -> web.StreamResponse:
    data = await request.post()
    vhost, name = str(data.get("vhost", "/")), str(data.get("name", ""))
    dest = str(data.get("destination", "")).strip() or None
    where = {"vhost": vhost, "name": name}
    try:
        started = replay(ui_server(request), request["user"].name, vhost, name, dest)
    except OpError as refused:
        raise back("/queue/browse", refused.reason, True, **where) from None
    raise back("/queue/browse", f"Replay started: shovel {started['shovel']}", False, **where)


def register(app: web.Application) -> None:
    app.router.add_get("/queue/browse", browse_page)
    app.router.add_post("/queue/browse/replay", replay_action)
