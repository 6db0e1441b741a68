"""The web UI (SPEC M2) under `/`, as RabbitMQ's management UI: overview, connections
and channels, queues and a queue's page (get / publish / purge / delete), exchanges and
bindings, users / vhosts / permissions / limits.

Server-rendered from the model's public attributes on the broker's loop (a page is a
snapshot: no lock, no thread), with the same users, tags and per-vhost visibility as the
API. ackmq.js re-fetches the page every few seconds and swaps its `#live` part. Actions
are POSTed forms that run the operation an AMQP client would, under the user's
permissions (a ChannelAccess, as a channel of that user): purge needs read, delete
configure, publish write, get read; closing another user's connection needs the
administrator tag, as RabbitMQ. The operations are the management plane's own
(server/ops.py), the same the API and `ackmq ctl` call: a publish answers once it is
confirmed, a purge is refused on another connection's exclusive queue. Login is a form
and a session cookie (ui_login.py); a POST from another origin is refused for every
route, the API's included (session.py's origin rule, in app.py's middleware).
"""

from __future__ import annotations

import functools
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from ackmq.broker import argument_table
from ackmq.broker.access import AccessError
from ackmq.broker.arguments import declared_type
from ackmq.broker.errors import ReplyError
from ackmq.protocol.amqp.property_names import RABBIT_NAMES
from ackmq.server import ops, views
from ackmq.server.http.app import SERVER_KEY, has_tag
from ackmq.server.http.sampler import SAMPLER_KEY, RateSampler
from ackmq.server.http.ui_html import (
    as_json,
    bar,
    chart,
    duration,
    e,
    form,
    hidden,
    href,
    num,
    page,
    policy_anchor,
    rate,
    secs,
    size,
    table,
)

if TYPE_CHECKING:
    from ackmq.server.context import HttpContext

log = logging.getLogger("ackmq.http.ui")

STATIC = Path(__file__).parent / "static"
CLOSE_REASON = "Closed via management plugin"  # RabbitMQ's UI sends this text
GET_LIMIT = 100  # messages one get may show
PAGE_SIZE = 500  # queues on one page of /queues


class UIError(Exception):
    """An action refused: shown to the user as the page's message."""


# -- snapshots of the model -----------------------------------------------------------
def _server(request: web.Request) -> HttpContext:
    return request.app[SERVER_KEY]


def _vhosts(request: web.Request) -> list[str]:
    return views.visible_vhosts(_server(request), request["user"])


def _connections(request: web.Request) -> list[Any]:
    server, user = _server(request), request["user"]
    vhosts = set(_vhosts(request))
    all_ = views.sees_all_connections(user)
    conns = [c for c in server.connections if c.vhost_name in vhosts
             and (all_ or c.user == user.name)]
    return sorted(conns, key=views.connection_name)


def _queues(request: web.Request) -> list[Any]:
    broker = _server(request).broker
    return [q for v in _vhosts(request) if v in broker.vhosts
            for _, q in sorted(broker.vhosts[v].queues.items())]


def _queue(request: web.Request, vhost: str, name: str) -> Any:
    broker = _server(request).broker
    if vhost not in _vhosts(request) or vhost not in broker.vhosts:
        raise web.HTTPNotFound()
    q = broker.vhosts[vhost].queues.get(name)
    if q is None:
        raise web.HTTPNotFound()
    return q


# the order RabbitMQ's UI (its global.js KNOWN_ARGS) shows the labels of the arguments it
# knows, after D, AD, I, Excl; each label is declared with its key (argument_table's
# `abbr`); every other argument is folded into "Args"
LABEL_ORDER = ("AE", "TTL", "Exp", "Lim", "Lim B", "DlL", "Ovfl", "DLX", "DLK", "ML", "Pri",
               "SAC")


def known_args() -> list[tuple[str, str]]:
    """(argument, label) of every labelled key, in RabbitMQ's UI order (read per call,
    so a key added to the table is shown with its label)."""
    rank = {label: i for i, label in enumerate(LABEL_ORDER)}
    return sorted(argument_table.INDEX.abbr.items(),
                  key=lambda kv: rank.get(kv[1], len(rank)))


def _abbr(title: str, short: str) -> str:
    return f'<abbr title="{e(title)}">{e(short)}</abbr>'


@functools.lru_cache(maxsize=1024)  # a few policies, shown on up to 500 rows a page
def _policy_link(kind: str, vhost: str, name: str | None, title: str) -> str:
    """A policy's badge linking to its row on /policies (RabbitMQ's fmt_policy_short)."""
    if not name:
        return ""
    target = f"/policies#{policy_anchor(kind, vhost, name)}"
    return (f'<abbr class="policy" title="{e(title)}: {e(name)}">'
            f'<a href="{e(target)}">{e(name)}</a></abbr>')


def features(obj: Any, vhost: str, exclusive: bool = False, policy: str | None = None,
             operator_policy: str | None = None) -> str:
    """A queue's or exchange's features as RabbitMQ's lists show them: D, AD, I, Excl,
    the known arguments' short names (TTL, DLX, ...), "Args" for the others (hover:
    their JSON), then the policy and operator policy in force, linked."""
    args = views.jsonable(obj.arguments)
    f = [_abbr(f"{flag}: true", short) for flag, short, on in (
        ("durable", "D", obj.durable), ("auto-delete", "AD", obj.auto_delete),
        ("internal", "I", getattr(obj, "internal", False)),
        ("exclusive", "Excl", exclusive)) if on]
    known = known_args()
    f += [_abbr(f"{k}: {json.dumps(args[k], ensure_ascii=False)}", short)
          for k, short in known if k in args and args[k] is not False]
    labelled = {k for k, _short in known}
    others = {k: v for k, v in args.items() if k not in labelled}
    if others:
        f.append(_abbr(json.dumps(others, ensure_ascii=False, sort_keys=True), "Args"))
    f += [_policy_link("policy", vhost, policy, "Policy"),
          _policy_link("operator", vhost, operator_policy, "Operator policy")]
    return " ".join(x for x in f if x)


def _features(q: Any) -> str:
    vhost = q.vhost.name
    pol, op = q.vhost.broker.policies.in_force(vhost, "queue", q.name,
                                               declared_type(q.arguments))
    return features(q, vhost, q.exclusive_owner is not None, pol and pol.name,
                    op and op.name)


def _short_arg(k: str) -> str:
    """RabbitMQ's UI label of an argument (declared with the key: argument_table)."""
    return argument_table.INDEX.abbr.get(k, k)


def _qtype(q: Any) -> str:
    return str(q.arguments.get("x-queue-type") or getattr(q, "kind", "") or "classic")


def _latency(server: HttpContext) -> dict[str, float | None]:
    st = getattr(server.broker.store, "stats", None)
    cl = server.broker.stats.confirm_latency
    out: dict[str, float | None] = {"confirm_p50": cl.quantile(0.5),
                                    "confirm_p99": cl.quantile(0.99),
                                    "confirm_mean": cl.sum / cl.count if cl.count else None,
                                    "fsync_p50": None, "fsync_p99": None, "fsync_mean": None,
                                    "fsyncs": None, "records": None}
    if st is not None and hasattr(st, "fsync_seconds"):
        h, r = st.fsync_seconds, st.fsync_records
        out.update(fsync_p50=h.quantile(0.5), fsync_p99=h.quantile(0.99),
                   fsync_mean=h.sum / h.count if h.count else None, fsyncs=h.count,
                   records=r.sum / r.count if r.count else None)
    return out


def _alarms(server: HttpContext) -> list[str]:
    return sorted(server.alarms.limits.active) if server.alarms is not None else []


def _render(request: web.Request, title: str, active: str, live: str, static: str = "",
            flash: str = "", error: bool = False) -> web.Response:
    server = _server(request)
    flash = flash or request.query.get("msg", "")
    error = error or request.query.get("err") == "1"
    body = page(title, active, request["user"].name, live, static, flash, error,
                views.node_name(), _alarms(server))
    return web.Response(text=body, content_type="text/html",
                        headers={"Cache-Control": "no-store",
                                 "X-Frame-Options": "DENY",
                                 "Content-Security-Policy":
                                     "default-src 'self'; style-src 'self' 'unsafe-inline'"})


# -- pages ----------------------------------------------------------------------------
async def overview(request: web.Request) -> web.Response:
    server = _server(request)
    sampler = request.app[SAMPLER_KEY]
    r = sampler.rates()
    queues = _queues(request)
    ready = sum(q.message_count for q in queues)
    unacked = sum(q.unacked_count for q in queues)
    conns = _connections(request)
    broker = server.broker
    vhosts = _vhosts(request)
    totals = table(["Ready", "Unacked", "Total"],
                   [[f'<span id="total-ready">{num(ready)}</span>',
                     f'<span id="total-unacked">{num(unacked)}</span>',
                     f'<span id="total-messages">{num(ready + unacked)}</span>']])
    rates = table(["Publish", "Confirm", "Routed", "Deliver / get", "Ack", "Redelivered",
                   "Unroutable (drop)", "Unroutable (return)"],
                  [[rate(r.get(k, 0.0)) for k in ("received", "confirmed", "routed",
                                                   "delivered", "acknowledged",
                                                   "redelivered", "unroutable_dropped",
                                                   "unroutable_returned")]])
    graph = chart({"publish": sampler.series("received"),
                   "deliver": sampler.series("delivered"),
                   "ack": sampler.series("acknowledged")})
    objects = table(["Connections", "Channels", "Exchanges", "Queues", "Consumers"],
                    [[num(len(conns)), num(sum(len(views.channels_of(c)) for c in conns)),
                      num(sum(len(broker.vhosts[v].exchanges) for v in vhosts
                              if v in broker.vhosts)),
                      f'<span id="total-queues">{num(len(queues))}</span>',
                      num(sum(q.consumer_count for q in queues))]])
    mon = server.alarms
    active = _alarms(server)
    node_rows = [["Node", e(views.node_name())],
                 ["Uptime", e(duration(views.uptime_ms()))]]
    if mon is not None:
        lim = mon.limits
        node_rows.append(["Memory", bar(mon.rss, lim.memory_limit,
                                        f"{size(mon.rss)} of {size(lim.memory_limit)} "
                                        "high watermark", "memory" in active)])
        if mon.disk_free is not None:
            node_rows.append(["Disk free", bar(lim.disk_free_limit, mon.disk_free,
                                               f"{size(mon.disk_free)} free, limit "
                                               f"{size(lim.disk_free_limit)}",
                                               "disk" in active)])
    alarm_html = ("".join(f'<span class="badge red alarm-{e(a)}">{e(a)}</span>'
                          for a in active) or '<span class="badge green">none</span>')
    node_rows.append(["Alarms", f'<span id="alarms">{alarm_html}</span>'])
    lat = _latency(server)
    node_rows.append(["fdatasync", e(f"p50 {secs(lat['fsync_p50'])} · p99 "
                                     f"{secs(lat['fsync_p99'])} · mean "
                                     f"{secs(lat['fsync_mean'])} · "
                                     f"{num(lat['fsyncs'] or 0)} calls · "
                                     f"{num(lat['records'] or 0)} records each")
                      if lat["fsyncs"] is not None else "no store (transient broker)"])
    node_rows.append(["Publish → confirm", e(f"p50 {secs(lat['confirm_p50'])} · p99 "
                                             f"{secs(lat['confirm_p99'])} · mean "
                                             f"{secs(lat['confirm_mean'])}")])
    listeners = table(["Protocol", "Port"], [[e(x["protocol"]), e(x["port"])]
                                             for x in views.listeners(server)])
    live = (f'<div class="grid"><section><h2>Queued messages</h2>{totals}'
            f'<h2>Message rates</h2>{rates}{graph}</section>'
            f'<section><h2>Node</h2>{table(["", ""], node_rows, "node")}'
            f'<h2>Totals</h2>{objects}<h2>Listeners</h2>{listeners}</section></div>')
    return _render(request, "Overview", "/", live)


async def queues_page(request: web.Request) -> web.Response:
    sampler = request.app[SAMPLER_KEY]
    lat = _latency(_server(request))
    rows = []
    queues = _queues(request)
    flt = request.query.get("filter", "")
    if flt:
        queues = [q for q in queues if flt.lower() in q.name.lower()]
    try:
        pageno = max(1, int(request.query.get("page", "1")))
    except ValueError:
        pageno = 1
    pages = max(1, -(-len(queues) // PAGE_SIZE))
    pageno = min(pageno, pages)
    first = (pageno - 1) * PAGE_SIZE
    shown = queues[first:first + PAGE_SIZE]
    for q in shown:
        inc, dlv, ack = sampler.queue(q)
        confirm = secs(lat["confirm_p99"]) if q.persistent_store is not None else "–"
        rows.append([e(q.vhost.name),
                     f'<a href="{href("/queue", vhost=q.vhost.name, name=q.name)}">'
                     f'{e(q.name)}</a>',
                     e(_qtype(q)), _features(q),
                     f'<span class="ready">{num(q.message_count)}</span>',
                     num(q.unacked_count), num(q.message_count + q.unacked_count),
                     num(q.consumer_count), rate(inc), rate(dlv), rate(ack), e(confirm)])
    pager = (f'<p class="hint" id="pager">{e(num(first + 1 if shown else 0))}–'
             f'{e(num(first + len(shown)))} of {e(num(len(queues)))} queues')
    if pageno > 1:
        pager += f' · <a href="{href("/queues", page=str(pageno - 1), filter=flt)}">previous</a>'
    if pageno < pages:
        pager += f' · <a href="{href("/queues", page=str(pageno + 1), filter=flt)}">next</a>'
    pager += "</p>"
    live = pager + table(["Vhost", "Name", "Type", "Features", "Ready", "Unacked", "Total",
                          "Consumers", "Incoming", "Deliver / get", "Ack", "Confirm p99"],
                         rows, "queues", "no queues")
    search = (f'<form method="get" action="/queues" class="filter"><label>Filter by name '
              f'<input name="filter" value="{e(flt)}"></label>'
              '<button type="submit">Filter</button></form>')
    return _render(request, "Queues", "/queues", live, search)


async def queue_page(request: web.Request, flash: str = "", error: bool = False,
                     got: str = "") -> web.Response:
    vhost, name = request.query.get("vhost", "/"), request.query.get("name", "")
    if request.method == "POST":
        data = await request.post()
        vhost, name = str(data.get("vhost", "/")), str(data.get("name", ""))
    q = _queue(request, vhost, name)
    inc, dlv, ack = request.app[SAMPLER_KEY].queue(q)
    vh = q.vhost
    counts = table(["Type", "Ready", "Unacked", "Total", "Consumers",
                    "Incoming", "Deliver / get", "Ack"],
                   [[e(_qtype(q)),
                     f'<span id="q-ready">{num(q.message_count)}</span>',
                      f'<span id="q-unacked">{num(q.unacked_count)}</span>',
                     num(q.message_count + q.unacked_count), num(q.consumer_count),
                     rate(inc), rate(dlv), rate(ack)]], "queue")
    pol = views.policy_fields(q)
    # RabbitMQ's queue page's Details: what was declared, and what policies add to it
    details = counts + table(["", ""], [
        ["Features", _features(q) or "–"],
        ["Arguments", as_json(q.arguments, "–")],
        ["Policy", _policy_link("policy", vh.name, pol["policy"], "Policy") or "–"],
        ["Operator policy", _policy_link("operator", vh.name, pol["operator_policy"],
                                         "Operator policy") or "–"],
        ["Effective policy definition", as_json(pol["effective_policy_definition"], "–")],
    ], "queue-details")
    names = {id(ch): (views.connection_name(c), n) for c in _server(request).connections
             for n, ch in views.channels_of(c)}
    consumers = table(["Channel", "Consumer tag", "Ack required", "Prefetch", "Unacked",
                       "Exclusive"],
                      [[e(f"{names.get(id(c.channel), ('?', 0))[0]} "
                          f"({names.get(id(c.channel), ('?', 0))[1]})"),
                        e(c.tag), e(not c.no_ack), num(c.limit), num(c.unacked),
                        e(c.exclusive)] for c in q.consumers.values()], "consumers",
                      "no consumers")
    bindings = [["(default exchange)", e(q.name), "", ""]]
    for x in sorted(vh.exchanges.values(), key=lambda x: x.name):
        for b in x.bindings.values():
            if b.destination is q:
                bindings.append([e(x.name), e(b.routing_key), as_json(b.arguments), ""])
    live = (f'{details}<h2>Consumers</h2>{consumers}'
            f'<h2>Bindings</h2>{table(["From exchange", "Routing key", "Arguments", ""], bindings, "bindings")}')
    ident = hidden(vhost=vhost, name=name)
    from ackmq.server.http import ui_browse
    static = (
        '<div class="actions">'
        '<section><h2>Publish message</h2>'
        + form("/queue/publish", ident +
               '<label>Delivery mode <select name="delivery_mode">'
               '<option value="1">1 - non-persistent</option>'
               '<option value="2" selected>2 - persistent</option></select></label>'
               '<label>Headers <input name="headers" placeholder="key=value, …"></label>'
               '<label>Properties <input name="properties" '
               'placeholder="content_type=text/plain, …"></label>'
               '<label>Payload <textarea name="payload" id="payload" rows="3">'
               '</textarea></label>', "Publish message", cls="publish")
        + '<p class="hint">Published to the default exchange with this queue\'s name as '
          'the routing key.</p></section>'
        '<section><h2>Get messages</h2>'
        + form("/queue/get", ident +
               '<label>Ack mode <select name="ackmode">'
               '<option value="ack_requeue_true">Nack message requeue true</option>'
               '<option value="ack_requeue_false">Automatic ack</option></select></label>'
               '<label>Messages <input name="count" value="1" size="4"></label>',
               "Get message(s)", cls="get")
        + got + ui_browse.link(vhost, name) + '</section>'
        '<section><h2>Purge</h2>'
        + form("/queue/purge", ident, "Purge messages",
               f"Purge every ready message of {name}?", cls="purge")
        + '<h2>Delete</h2>'
        + form("/queue/delete", ident, "Delete queue", f"Delete the queue {name}?",
               cls="delete danger")
        + '</section></div>')
    return _render(request, f"Queue {name}", "/queues", live, static, flash, error)


async def connections_page(request: web.Request) -> web.Response:
    rows, chans = [], []
    for c in _connections(request):
        name = views.connection_name(c)
        props = getattr(c, "client_properties", None) or {}
        client = " ".join(str(props.get(k, "")) for k in ("product", "version")).strip()
        rows.append([e(name), e(c.user), e(c.vhost_name), e(c.protocol),
                     e(client), num(len(views.channels_of(c))),
                     '<span class="badge red">blocked</span>'
                     if getattr(c, "alarm_blocked", False) else "running",
                     form("/connections/close", hidden(name=name), "Close",
                          f"Close the connection {name}?", cls="close danger")])
        for n, ch in views.channels_of(c):
            mode = "confirm" if ch.confirms is not None else (
                "transactional" if ch.tx is not None else "")
            chans.append([e(f"{name} ({n})"), e(c.user), e(ch.vhost.name), e(mode),
                          num(len(ch.consumers)), num(ch.prefetch_count),
                          num(len(ch.unacked)),
                          num(ch.confirms.outstanding if ch.confirms is not None else 0)])
    live = (table(["Name", "User", "Vhost", "Protocol", "Client", "Channels", "State", ""],
                  rows, "connections", "no connections")
            + '<h2>Channels</h2>'
            + table(["Channel", "User", "Vhost", "Mode", "Consumers", "Prefetch",
                     "Unacked", "Unconfirmed"], chans, "channels", "no channels"))
    return _render(request, "Connections and channels", "/connections", live)


async def exchanges_page(request: web.Request) -> web.Response:
    broker = _server(request).broker
    xs, bs = [], []
    for v in _vhosts(request):
        vh = broker.vhosts.get(v)
        if vh is None:
            continue
        for name, x in sorted(vh.exchanges.items()):
            delayed = getattr(x, "messages_delayed", None)  # L8
            xs.append([e(v), e(name or "(AMQP default)"), e(x.type),
                       features(x, v, policy=x.policy), as_json(x.arguments),
                       num(len(x.bindings)),
                       "" if delayed is None else num(delayed)])
            for b in x.bindings.values():
                d = b.destination
                kind = "exchange" if hasattr(d, "bindings") else "queue"
                bs.append([e(v), e(name), e(kind), e(d.name), e(b.routing_key),
                           as_json(b.arguments)])
    live = (table(["Vhost", "Name", "Type", "Features", "Arguments", "Bindings", "Delayed"], xs,
                  "exchanges")
            + "<h2>Bindings</h2>"
            + table(["Vhost", "Source", "Destination type", "Destination", "Routing key",
                     "Arguments"], bs, "bindings", "no bindings"))
    return _render(request, "Exchanges and bindings", "/exchanges", live)


async def admin_page(request: web.Request) -> web.Response:
    access = _server(request).access
    user = request["user"]
    admin = has_tag(user, "administrator")
    vhosts = set(_vhosts(request))
    users = [[e(u.name), e(", ".join(u.tags)), e(_limits(access.user_limits.get(u.name)))]
             for u in sorted(access.users.values(), key=lambda u: u.name)
             if admin or u.name == user.name]
    vrows = [[e(v), e(_limits((meta or {}).get("limits")))]
             for v, meta in sorted(access.vhosts.items()) if v in vhosts]
    perms = [[e(u), e(v), e(p.configure), e(p.write), e(p.read)]
             for (u, v), p in sorted(access.permissions.items())
             if v in vhosts and (admin or u == user.name)]
    topics = [[e(u), e(v), e(x), e(t.write), e(t.read)]
              for (u, v), by_x in sorted(access.topic_permissions.items())
              for x, t in sorted(by_x.items()) if v in vhosts and (admin or u == user.name)]
    live = ("<h2>Users</h2>" + table(["Name", "Tags", "Limits"], users, "users")
            + "<h2>Virtual hosts</h2>" + table(["Name", "Limits"], vrows, "vhosts")
            + "<h2>Permissions</h2>" + table(["User", "Vhost", "Configure", "Write", "Read"],
                                             perms, "permissions")
            + "<h2>Topic permissions</h2>" + table(["User", "Vhost", "Exchange", "Write",
                                                    "Read"], topics, "topic-permissions")
            + '<h2><a href="/policies" id="policies-link">Policies</a></h2>'
            + '<h2><a href="/scheduled" id="scheduled-link">Scheduled messages</a></h2>'
            + '<h2><a href="/shovels" id="shovels-link">Shovel status</a></h2>')
    return _render(request, "Users, virtual hosts, permissions", "/admin", live)


def _limits(limits: dict[str, Any] | None) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted((limits or {}).items())) or "–"


# -- actions --------------------------------------------------------------------------
def _back(path: str, msg: str, error: bool = False, **params: str) -> web.HTTPSeeOther:
    params = {**params, "msg": msg}
    if error:
        params["err"] = "1"
    return web.HTTPSeeOther(href(path, **params).replace("&amp;", "&"))


async def queue_action(request: web.Request) -> web.StreamResponse:
    action = request.match_info["action"]
    data = await request.post()
    vhost, name = str(data.get("vhost", "/")), str(data.get("name", ""))
    q = _queue(request, vhost, name)
    server = _server(request)
    who = request["user"].name
    try:
        if action == "purge":
            n = ops.purge(server, who, q)
            msg = f"Queue purged ({n} messages)"
        elif action == "delete":
            ops.delete_queue(server, who, q)
            raise _back("/queues", f"Queue {name} deleted")
        elif action == "publish":
            msg = await _publish(request, q, data)
        elif action == "get":
            return await queue_page(request, got=_get(request, q, data))
        else:
            raise web.HTTPNotFound()
    except ops.OpError as err:
        raise _back("/queue", err.reason, True, vhost=vhost, name=name) from None
    except (ReplyError, AccessError, UIError) as err:
        text = getattr(err, "text", None) or str(err)
        raise _back("/queue", text, True, vhost=vhost, name=name) from None
    server.request_flush()
    raise _back("/queue", msg, vhost=vhost, name=name)


def _pairs(text: str) -> dict[str, str]:
    out = {}
    for part in text.split(","):
        if part.strip():
            k, sep, v = part.partition("=")
            if not sep or not k.strip():
                raise UIError(f"{part.strip()!r}: write key=value")
            out[k.strip()] = v.strip()
    return out


# the publish form's own fields: the delivery mode and the headers
FORM_PROPERTIES = tuple(n for n in RABBIT_NAMES if n not in ("headers", "delivery_mode"))


async def _publish(request: web.Request, q: Any, data: Any) -> str:
    """The form's message to the default exchange with the queue's name, answered once
    confirmed (on disk if persistent and the queue durable), as the API's publish."""
    props: dict[str, Any] = _pairs(str(data.get("properties", "")))
    headers = _pairs(str(data.get("headers", "")))
    mode = 2 if str(data.get("delivery_mode", "2")) == "2" else 1
    bad = sorted(set(props) - set(FORM_PROPERTIES))
    if bad:
        raise UIError(f"unknown properties {', '.join(bad)} (known: "
                      f"{', '.join(sorted(FORM_PROPERTIES))})")
    for k in ("priority", "timestamp"):
        if k in props:
            try:
                props[k] = int(props[k])
            except ValueError:
                raise UIError(f"{k}: a number" + (" from 0 to 255" if k == "priority"
                                                   else " (seconds since 1970)")) from None
    blob = ops.encode_properties({**props, "delivery_mode": mode,
                                  "headers": headers or None})
    payload = str(data.get("payload", "")).encode()
    await ops.publish(_server(request), request["user"].name, q.vhost.name, "", q.name,
                      blob, payload, mandatory=False)
    return "Message published."


def _get(request: web.Request, q: Any, data: Any) -> str:
    try:
        count = max(1, min(GET_LIMIT, int(str(data.get("count", "1")))))
    except ValueError:
        count = 1
    ackmode = str(data.get("ackmode", "ack_requeue_true"))
    if ackmode != "ack_requeue_false":
        ackmode = "ack_requeue_true"  # put back in place, in order
    got = ops.get(_server(request), request["user"].name, q.vhost.name, q.name, count,
                  ackmode)
    if not got:
        return '<p class="flash" id="got">Queue is empty</p>'
    parts = []
    for i, m in enumerate(got, 1):
        props = m["properties"] or {}
        others = {k: v for k, v in props.items() if k != "headers"}
        parts.append(table(["Message", str(i)], [
            ["Exchange", e(m["exchange"] or "(AMQP default)")],
            ["Routing key", e(m["routing_key"])],
            ["Redelivered", e(m["redelivered"])],
            ["Remaining", e(m["message_count"])],
            ["Properties", as_json(others, "–")],
            ["Headers", as_json(props.get("headers"), "–")],
            ["Payload", f'<pre class="payload">{e(m["payload"])}</pre> '
                        f'<span class="hint">{m["payload_bytes"]} bytes, '
                        f'{m["payload_encoding"]}</span>']]))
    return f'<div id="got">{"".join(parts)}</div>'


async def close_connection(request: web.Request) -> web.StreamResponse:
    data = await request.post()
    name = str(data.get("name", ""))
    user = request["user"]
    for c in _connections(request):
        if views.connection_name(c) == name:
            if c.user != user.name and "administrator" not in user.tags:
                raise _back("/connections", "Not administrator user", True)
            ops.close_connection(_server(request), c, CLOSE_REASON)
            log.info("connection %s closed from the web UI by %s", name, user.name)
            raise _back("/connections", f"Connection {name} closed")
    raise _back("/connections", f"no connection {name}", True)


async def static(request: web.Request) -> web.StreamResponse:
    name = request.match_info["file"]
    path = STATIC / name
    if "/" in name or name.startswith(".") or not path.is_file():
        raise web.HTTPNotFound()
    ctype = {"css": "text/css", "js": "application/javascript", "svg": "image/svg+xml"
             }.get(name.rsplit(".", 1)[-1], "application/octet-stream")
    return web.Response(body=path.read_bytes(), content_type=ctype,
                        headers={"Cache-Control": "max-age=300"})


static.ackmq_tag = None  # type: ignore[attr-defined]  # the login page's CSS needs no login


# -- wiring ---------------------------------------------------------------------------
async def _start_sampler(app: web.Application) -> None:
    sampler = app[SAMPLER_KEY]
    sampler.start()


async def _stop_sampler(app: web.Application) -> None:
    app[SAMPLER_KEY].stop()


def register(app: web.Application) -> None:
    app[SAMPLER_KEY] = RateSampler(app[SERVER_KEY])
    app.on_startup.append(_start_sampler)
    app.on_cleanup.append(_stop_sampler)
    app.router.add_get("/", overview)
    app.router.add_get("/queues", queues_page)
    app.router.add_get("/queue", queue_page)
    app.router.add_post("/queue/{action}", queue_action)
    app.router.add_get("/connections", connections_page)
    app.router.add_post("/connections/close", close_connection)
    app.router.add_get("/exchanges", exchanges_page)
    app.router.add_get("/admin", admin_page)
    app.router.add_get("/static/{file}", static)
    from ackmq.server.http import (
        ui_browse,
        ui_login,
        ui_policies,
        ui_scheduled,
        ui_shovels,
        ui_stream,
    )
    ui_policies.register(app)
    ui_stream.register(app)
    ui_scheduled.register(app)
    ui_login.register(app)
    ui_browse.register(app)
    ui_shovels.register(app)


# what the policies page (ui_policies.py) shares: the page frame, the form checks
render, back, user_vhosts, ui_server = _render, _back, _vhosts, _server
visible_connections = _connections

