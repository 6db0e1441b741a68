"""The management API's routes for queues, exchanges and bindings (SPEC M1): RabbitMQ
3.10's paths, JSON keys and codes. The other route modules (`api_access`, `api_node`,
`api_defs`) are registered from here.

Handlers read snapshots (views.py) and change things through a user's management
channel (ops.py); none of them touches a queue's internals.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote

from aiohttp import web

from ackmq.broker.errors import ReplyError
from ackmq.broker.queue_type import Queue
from ackmq.server import ops, views
from ackmq.server.http import common
from ackmq.server.http.app import json_response
from ackmq.server.http.sampler import SAMPLER_KEY, RateSampler, exchange_message_stats

DEFAULT = "amq.default"  # the default exchange's name in paths


def _xname(request: web.Request, key: str = "name") -> str:
    name = request.match_info[key]
    return "" if name == DEFAULT else name


def _vhosts(request: web.Request) -> list[Any]:
    """The VHosts a listing covers (listed_vhosts)."""
    vhosts = common.server(request).broker.vhosts
    return [vhosts[n] for n in common.listed_vhosts(request) if n in vhosts]


def _vh(request: web.Request) -> Any:
    return common.server(request).broker.vhosts[common.vhost_arg(request)]


def _vhost_to_write(request: web.Request) -> str:
    """A PUT's or binding POST's vhost: RabbitMQ answers a missing one with 404
    "not_found"/"vhost_not_found" there (a GET's is "Object Not Found")."""
    name = request.match_info["vhost"]
    if name not in common.server(request).broker.vhosts:
        raise ops.OpError(404, "not_found", "vhost_not_found")
    return common.vhost_arg(request)


# -- queues --------------------------------------------------------------------------
async def list_queues(request: web.Request) -> web.StreamResponse:
    sampler = request.app.get(SAMPLER_KEY)
    return await common.alisting(request, (
        views.queue(q, message_stats=_queue_stats(sampler, q))
        for vh in _vhosts(request) for q in list(vh.queues.values())))


def _queue_stats(sampler: RateSampler | None, q: Any) -> dict[str, Any] | None:
    return sampler.queue_message_stats(q) if sampler is not None else None


def _queue(request: web.Request) -> Queue:
    q = _vh(request).queues.get(request.match_info["name"])
    if q is None:
        raise ops.not_found()
    return q


async def get_queue(request: web.Request) -> web.Response:
    q = _queue(request)
    stats = _queue_stats(request.app.get(SAMPLER_KEY), q)
    return common.one(request, views.queue(q, details=True, message_stats=stats))


async def put_queue(request: web.Request) -> web.Response:
    vhost = _vhost_to_write(request)
    name = request.match_info["name"]
    body = await common.body_object(request)
    args = body.get("arguments") or {}
    if not isinstance(args, dict):
        raise ops.bad_request("arguments must be a JSON object")
    durable, auto_delete = common.flag(body.get("durable")), common.flag(body.get("auto_delete"))
    srv = common.server(request)
    existed = name in srv.broker.vhosts[vhost].queues
    with ops.MgmtChannel(srv, common.user(request).name, vhost) as ch:
        try:
            ch.declare_queue(name, False, durable, False, auto_delete, args)
        except ReplyError as e:
            raise ops.http_error(_from_json(e)) from None
    return common.no_content(204 if existed else 201)


def _from_json(e: ReplyError) -> ReplyError:
    """RabbitMQ's management API makes every JSON integer argument a 'long': its
    inequivalent-argument text says so of the received value (the model names the
    type an AMQP client would have sent)."""
    e.text = re.sub(r"(received the value '-?\d+' of type )'signedint'", r"\1'long'", e.text)
    return e


async def delete_queue(request: web.Request) -> web.Response:
    q = _queue(request)
    qs = request.query
    with ops.as_http():
        ops.delete_queue(common.server(request), common.user(request).name, q,
                         if_unused=common.flag(qs.get("if-unused")),
                         if_empty=common.flag(qs.get("if-empty")))
    return common.no_content()


async def purge_queue(request: web.Request) -> web.Response:
    q = _queue(request)
    with ops.as_http():
        ops.purge(common.server(request), common.user(request).name, q)
    return common.no_content()


async def get_messages(request: web.Request) -> web.Response:
    vhost = common.vhost_arg(request)
    body = await common.body_object(request)
    return json_response(ops.get_json(common.server(request), common.user(request).name, vhost,
                                 request.match_info["name"], body))


async def queue_bindings(request: web.Request) -> web.Response:
    vh = _vh(request)
    name = request.match_info["name"]
    return common.listing(request, [
        b for b in views.bindings(vh)
        if b["destination_type"] == "queue" and b["destination"] == name])


# -- exchanges -----------------------------------------------------------------------
async def list_exchanges(request: web.Request) -> web.StreamResponse:
    vhs = _vhosts(request)
    sampler = request.app.get(SAMPLER_KEY)
    return await common.alisting(request, (
        views.exchange(vh.name, x, exchange_message_stats(sampler, x))
        for vh in vhs for x in list(vh.exchanges.values())))


def _exchange(request: web.Request) -> Any:
    x = _vh(request).exchanges.get(_xname(request))
    if x is None:
        raise ops.not_found()
    return x


async def get_exchange(request: web.Request) -> web.Response:
    vhost = common.vhost_arg(request)
    x = _exchange(request)
    stats = exchange_message_stats(request.app.get(SAMPLER_KEY), x)
    return common.one(request, {**views.exchange(vhost, x, stats), "incoming": [], "outgoing": []})


async def put_exchange(request: web.Request) -> web.Response:
    vhost = _vhost_to_write(request)
    name = _xname(request)
    body = await common.body_object(request)
    args = body.get("arguments") or {}
    if not isinstance(args, dict):
        raise ops.bad_request("arguments must be a JSON object")
    type_ = body.get("type") or "direct"
    srv = common.server(request)
    existed = name in srv.broker.vhosts[vhost].exchanges
    with ops.MgmtChannel(srv, common.user(request).name, vhost) as ch:
        with ops.as_http():
            ch.declare_exchange(name, str(type_), False, common.flag(body.get("durable")),
                                common.flag(body.get("auto_delete")),
                                common.flag(body.get("internal")), args)
    return common.no_content(204 if existed else 201)


async def delete_exchange(request: web.Request) -> web.Response:
    vhost = common.vhost_arg(request)
    x = _exchange(request)
    with ops.MgmtChannel(common.server(request), common.user(request).name, vhost) as ch:
        with ops.as_http():
            ch.delete_exchange(x.name, common.flag(request.query.get("if-unused")))
    return common.no_content()


async def publish(request: web.Request) -> web.Response:
    vhost = common.vhost_arg(request)
    body = await common.body_object(request)
    return json_response(await ops.publish_json(common.server(request),
                                                common.user(request).name, vhost,
                                                _xname(request), body))


async def exchange_bindings(request: web.Request) -> web.Response:
    vh = _vh(request)
    name = _xname(request)
    side = request.match_info["side"]
    if side == "source":
        found = [b for b in views.bindings(vh) if b["source"] == name]
    else:
        found = [b for b in views.bindings(vh)
                 if b["destination_type"] == "exchange" and b["destination"] == name]
    return common.listing(request, found)


# -- bindings ----------------------------------------------------------------------
async def list_bindings(request: web.Request) -> web.StreamResponse:
    return await common.alisting(request, (b for vh in _vhosts(request)
                                           for b in views.iter_bindings(vh)))


def _pair(request: web.Request) -> tuple[Any, str, str, str]:
    """(vhost, source, destination kind, destination) of a /api/bindings/v/e/X/q|e/Y
    path; 404 when either end does not exist."""
    vh = _vh(request)
    src = _xname(request, "source")
    kind = "queue" if request.match_info["dtype"] == "q" else "exchange"
    dest = request.match_info["dest"]
    if kind == "exchange" and dest == DEFAULT:
        dest = ""
    if src not in vh.exchanges or dest not in (vh.queues if kind == "queue" else vh.exchanges):
        raise ops.not_found()
    return vh, src, kind, dest


def _between(vh: Any, src: str, kind: str, dest: str) -> list[dict[str, Any]]:
    return [b for b in views.bindings(vh) if b["source"] == src
            and b["destination_type"] == kind and b["destination"] == dest]


async def pair_bindings(request: web.Request) -> web.Response:
    try:
        found = _between(*_pair(request))
    except ops.OpError:  # an end missing: none between them, as RabbitMQ answers
        common.vhost_arg(request)  # (a missing vhost is still a 404)
        found = []
    return common.listing(request, found)


def _missing_end(request: web.Request) -> None:
    """A binding POST's missing end as RabbitMQ names it (source first): 404
    "not_found", "no exchange 'x' in vhost '/'"."""
    vh = common.server(request).broker.vhosts[_vhost_to_write(request)]
    src = _xname(request, "source")
    dest = request.match_info["dest"]
    is_queue = request.match_info["dtype"] == "q"
    if not is_queue and dest == DEFAULT:
        dest = ""
    for kind, name, there in (("exchange", src, vh.exchanges),
                              ("queue" if is_queue else "exchange", dest,
                               vh.queues if is_queue else vh.exchanges)):
        if name not in there:
            raise ops.OpError(404, "not_found", f"no {kind} '{name}' in vhost '{vh.name}'")


async def create_binding(request: web.Request) -> web.Response:
    _missing_end(request)
    vh, src, kind, dest = _pair(request)
    body = await common.body_object(request)
    key = body.get("routing_key", "")
    args = body.get("arguments") or {}
    if not isinstance(key, str) or not isinstance(args, dict):
        raise ops.bad_request("routing_key must be a string and arguments an object")
    with ops.MgmtChannel(common.server(request), common.user(request).name, vh.name) as ch:
        with ops.as_http():
            ch.bind(kind, dest, src, key, args)
    loc = quote(dest, safe="") + "/" + quote(views.properties_key(key, args), safe="")
    return common.no_content(201, {"Location": loc})


def _binding(request: web.Request) -> tuple[Any, str, str, str, dict[str, Any]]:
    vh, src, kind, dest = _pair(request)
    props = request.match_info["props"]
    for b in _between(vh, src, kind, dest):
        if b["properties_key"] == props:
            return vh, src, kind, dest, b
    raise ops.not_found()


async def get_binding(request: web.Request) -> web.Response:
    return common.one(request, _binding(request)[4])


async def delete_binding(request: web.Request) -> web.Response:
    vh, src, kind, dest, b = _binding(request)
    with ops.MgmtChannel(common.server(request), common.user(request).name, vh.name) as ch:
        with ops.as_http():
            x = vh.exchanges[src]
            destination = (vh.queues if kind == "queue" else vh.exchanges)[dest]
            args: dict[str, Any] = {}  # the bound arguments, as stored (JSON shows them)
            for bound in list(x.bindings.values()):
                if bound.destination is destination and bound.routing_key == b["routing_key"] \
                        and views.jsonable(bound.arguments) == b["arguments"]:
                    args = bound.arguments
                    break
            ch.unbind(kind, dest, src, b["routing_key"], args)
    return common.no_content()


def register(app: web.Application) -> None:
    from ackmq.server.http import (
        api_access,
        api_defs,
        api_messages,
        api_node,
        api_parameters,
        api_policies,
        api_scheduled,
        api_stream,
    )
    r = app.router
    common.add_listing(r, "/api/queues", list_queues)
    common.add_methods(r, "/api/queues/{vhost}/{name}", get=get_queue, put=put_queue,
                       delete=delete_queue)
    r.add_delete("/api/queues/{vhost}/{name}/contents", purge_queue)
    r.add_post("/api/queues/{vhost}/{name}/get", get_messages)
    r.add_get("/api/queues/{vhost}/{name}/bindings", queue_bindings)
    common.add_listing(r, "/api/exchanges", list_exchanges)
    common.add_methods(r, "/api/exchanges/{vhost}/{name}",
                       get=get_exchange, put=put_exchange, delete=delete_exchange)
    r.add_post("/api/exchanges/{vhost}/{name}/publish", publish)
    r.add_get("/api/exchanges/{vhost}/{name}/bindings/{side:source|destination}",
              exchange_bindings)
    common.add_listing(r, "/api/bindings", list_bindings)
    pair = "/api/bindings/{vhost}/e/{source}/{dtype:q|e}/{dest}"
    common.add_methods(r, pair, get=pair_bindings, post=create_binding)
    common.add_methods(r, pair + "/{props}", get=get_binding, delete=delete_binding)
    api_access.register(app)
    api_node.register(app)
    api_defs.register(app)
    api_policies.register(app)
    api_scheduled.register(app)
    api_messages.register(app)
    api_parameters.register(app)
    api_stream.register(app)
