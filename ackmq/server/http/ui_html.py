"""HTML building blocks of the web UI: escaped text, tables, bars, an SVG chart, the page
frame. Plain functions over strings (no template engine, no build step); everything
that comes from a client (queue names, headers, payloads) goes through `e()`."""

from __future__ import annotations

import html
import json
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import quote, urlencode

from ackmq.server.views import jsonable

NAV = (("/", "Overview"), ("/connections", "Connections"),
       ("/stream/connections", "Stream Connections"), ("/queues", "Queues"),
       ("/exchanges", "Exchanges"), ("/policies", "Policies"), ("/admin", "Admin"))


def e(v: Any) -> str:
    return html.escape("" if v is None else str(v), quote=True)


def as_json(v: Any, empty: str = "") -> str:
    """An arguments / definition / headers value as the API shows it: JSON (AMQP text
    as a string, not a Python repr such as `b'dlx'`), escaped; `empty` for none."""
    if v is None or v == {}:
        return e(empty)
    text = json.dumps(jsonable(v), ensure_ascii=False, sort_keys=True)
    return f'<code class="json">{e(text)}</code>'


def policy_anchor(kind: str, vhost: str, name: str) -> str:
    """The id of a policy's row on /policies (`kind`: policy or operator), which a
    queue's or exchange's policy links to."""
    return f"{kind}/{quote(vhost, safe='')}/{quote(name, safe='')}"


def href(path: str, **params: str) -> str:
    return e(f"{path}?{urlencode(params)}" if params else path)


def num(n: float) -> str:
    return f"{n:,.0f}" if float(n).is_integer() else f"{n:,.1f}"


def rate(r: float | None) -> str:
    return "" if r is None else f"{r:,.1f}/s"


def size(n: float | None) -> str:
    if n is None:
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return str(n)


def secs(s: float | None) -> str:
    if s is None:
        return "–"
    if s == float("inf"):
        return "> 10 s"
    if s < 0.001:
        return f"{s * 1e6:,.0f} µs"
    if s < 1:
        return f"{s * 1e3:,.1f} ms"
    return f"{s:,.2f} s"


def duration(ms: int) -> str:
    s = ms // 1000
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    return (f"{d}d " if d else "") + f"{h}h {m:02d}m {s:02d}s"


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], id_: str = "",
          empty: str = "none") -> str:
    """`rows` hold HTML already (escape with e() first)."""
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    if not body:
        body = f'<tr><td colspan="{len(headers)}" class="empty">{e(empty)}</td></tr>'
    ident = f' id="{e(id_)}"' if id_ else ""
    head = "".join(f"<th>{e(h)}</th>" for h in headers)
    thead = f"<thead><tr>{head}</tr></thead>" if any(headers) else ""
    return f'<table{ident}>{thead}<tbody>{body}</tbody></table>'


def bar(used: float, limit: float, label: str, alarm: bool) -> str:
    """`used` against `limit` (memory against the watermark, disk limit against free)."""
    frac = 0.0 if limit <= 0 else min(1.0, used / limit)
    cls = "bar alarm" if alarm else ("bar warn" if frac > 0.8 else "bar")
    return (f'<div class="{cls}"><div class="fill" style="width:{frac * 100:.1f}%"></div>'
            f'<span>{e(label)}</span></div>')


def chart(series: dict[str, list[float]], width: int = 560, height: int = 120) -> str:
    """An SVG line chart of rates (the sampler's history), newest on the right."""
    top = max([max(v) for v in series.values() if v] + [1.0])
    lines = []
    for i, (name, values) in enumerate(series.items()):
        if len(values) < 2:
            continue
        step = width / (len(values) - 1)
        pts = " ".join(f"{j * step:.1f},{height - v / top * (height - 4) - 2:.1f}"
                       for j, v in enumerate(values))
        lines.append(f'<polyline class="s{i}" points="{pts}"><title>{e(name)}</title>'
                     '</polyline>')
    legend = "".join(f'<span class="key s{i}">{e(n)}</span>' for i, n in enumerate(series))
    return (f'<div class="chart"><svg viewBox="0 0 {width} {height}" '
            f'preserveAspectRatio="none" width="100%" height="{height}">'
            f'{"".join(lines)}</svg><div class="legend">{legend} '
            f'<span class="scale">max {e(num(top))}/s</span></div></div>')


def form(action: str, fields: str, button: str, confirm: str = "", cls: str = "") -> str:
    onsubmit = f' data-confirm="{e(confirm)}"' if confirm else ""
    return (f'<form method="post" action="{e(action)}" class="{e(cls)}"{onsubmit}>'
            f'{fields}<button type="submit">{e(button)}</button></form>')


def hidden(**values: str) -> str:
    return "".join(f'<input type="hidden" name="{e(k)}" value="{e(v)}">'
                   for k, v in values.items())


def page(title: str, active: str, user: str, live: str, static: str = "", flash: str = "",
         error: bool = False, node: str = "", alarms: Sequence[str] = ()) -> str:
    """The frame: navigation, `live` (refreshed by ackmq.js every few seconds) and
    `static` (forms, left alone so a half-typed message survives a refresh)."""
    nav = "".join(f'<a href="{e(p)}" class="{"on" if p == active else ""}">{e(t)}</a>'
                  for p, t in NAV)
    banner = "".join(f'<div class="alarm-banner" id="alarm-{e(a)}">{e(a)} alarm: '
                     'publishers are blocked</div>' for a in alarms)
    msg = (f'<div class="flash{" err" if error else ""}" id="flash">{e(flash)}</div>'
           if flash else "")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{e(title)} · ackmq</title>
<link rel="stylesheet" href="/static/ackmq.css">
<script src="/static/ackmq.js" defer></script>
</head><body>
<header><span class="logo">ackmq</span><nav>{nav}</nav>
<span class="who">{e(node)} · user <b>{e(user)}</b></span>
<form method="post" action="/logout" class="logout"><button type="submit" id="logout">Log out\
</button></form></header>
<main><h1>{e(title)}</h1>{msg}
<div id="live" data-refresh="5">{banner}{live}</div>
{static}</main>
<footer>Refreshes every 5 s · <a href="/api/overview">HTTP API</a> ·
<a href="/metrics">/metrics</a></footer>
</body></html>"""
