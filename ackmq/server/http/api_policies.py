"""/api/policies and /api/operator-policies (SPEC M5, M6): RabbitMQ 3.10's paths, JSON,
codes and texts. Listing needs management (the vhosts the user sees), changing needs
policymaker (policies) or administrator (operator policies), as RabbitMQ. A refused
policy is 400 with RabbitMQ's `reason`; RabbitMQ HTML-escapes that text for
/api/policies (`&lt;&lt;"x"&gt;&gt;`) and not for /api/operator-policies, and so does
ackmq. The operations are server/policy_ops.py's (the UI and ctl call the same)."""

from __future__ import annotations

import html

from aiohttp import web

from ackmq.broker.policy_check import PolicyError
from ackmq.server import policy_ops
from ackmq.server.http import common
from ackmq.server.http.app import Handler, requires
from ackmq.server.ops import OpError, bad_request, not_found


def _operator(request: web.Request) -> bool:
    return request.path.startswith("/api/operator-policies")


async def list_policies(request: web.Request) -> web.Response:
    broker, operator = common.server(request).broker, _operator(request)
    return common.listing(request, [p for v in common.listed_vhosts(request)
                                    for p in policy_ops.list_policies(broker, v, operator)])


async def get_policy(request: web.Request) -> web.Response:
    vhost = common.vhost_arg(request)
    p = common.server(request).broker.policies.get(vhost, request.match_info["name"],
                                                   _operator(request))
    if p is None:
        raise not_found()
    return common.one(request, p.as_json())


async def _put(request: web.Request) -> web.Response:
    srv = common.server(request)
    vhost, name, operator = request.match_info["vhost"], request.match_info["name"], \
        _operator(request)
    if vhost in srv.broker.vhosts:
        common.vhost_arg(request)  # a user without access to the vhost: 401, as RabbitMQ
    body = await common.body_json(request)
    try:
        new = policy_ops.set_policy(srv.broker, vhost, name, body, operator)
    except policy_ops.NoVhost:
        raise OpError(404, "not_found", "vhost_not_found") from None
    except PolicyError as e:
        raise bad_request(e.text if operator else html.escape(e.text, quote=False)) from None
    note = policy_ops.no_effect_note(body)
    return common.no_content(201 if new else 204,
                      {policy_ops.NOTE_HEADER: note} if note is not None else None)


async def _delete(request: web.Request) -> web.Response:
    srv = common.server(request)
    vhost = common.vhost_arg(request)
    if not policy_ops.clear_policy(srv.broker, vhost, request.match_info["name"],
                                   _operator(request)):
        raise not_found()
    return common.no_content()


def _needing(tag: str, handler: Handler) -> Handler:
    """`handler` under `tag`: policies and operator policies share their handlers and
    differ only in who may change them."""
    async def tagged(request: web.Request) -> web.StreamResponse:
        return await handler(request)
    return requires(tag)(tagged)


def register(app: web.Application) -> None:
    r = app.router
    for base, tag in (("/api/policies", "policymaker"),
                      ("/api/operator-policies", "administrator")):
        common.add_listing(r, base, list_policies)
        common.add_methods(r, base + "/{vhost}/{name}", get=get_policy, put=_needing(tag, _put),
                           delete=_needing(tag, _delete))
