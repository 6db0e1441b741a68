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
from ackmq.server.http.app import requires
from ackmq.server.http.common import body_json, listing, no_content, one, server, user, vhost_arg
from ackmq.server.ops import OpError, bad_request, not_found
from ackmq.server.views import visible_vhosts


def _operator(request: web.Request) -> bool:
    return request.path.startswith("/api/operator-policies")


async def list_policies(request: web.Request) -> web.Response:
    srv = server(request)
    operator = _operator(request)
    if "vhost" in request.match_info:
        names = [vhost_arg(request)]
    else:
        names = visible_vhosts(srv, user(request))
    return listing(request, [p for v in names
                             for p in policy_ops.list_policies(srv.broker, v, operator)])


async def get_policy(request: web.Request) -> web.Response:
    vhost = vhost_arg(request)
    p = server(request).broker.policies.get(vhost, request.match_info["name"],
                                            _operator(request))
    if p is None:
        raise not_found()
    return one(request, p.as_json())


async def _put(request: web.Request) -> web.Response:
    srv = server(request)
    vhost, name, operator = request.match_info["vhost"], request.match_info["name"], \
        _operator(request)
    if vhost in srv.broker.vhosts:
        vhost_arg(request)  # a user without access to the vhost: 401, as RabbitMQ
    body = await body_json(request)
    try:
        new = policy_ops.set_policy(srv.broker, vhost, name, body, operator)
    except policy_ops.NoVhost:
        raise OpError(404, "not_found", "vhost_not_found") from None
    except PolicyError as e:
        raise bad_request(e.text if operator else html.escape(e.text, quote=False)) from None
    note = policy_ops.no_effect_note(body)
    return no_content(201 if new else 204,
                      {policy_ops.NOTE_HEADER: note} if note is not None else None)


async def _delete(request: web.Request) -> web.Response:
    srv = server(request)
    vhost = vhost_arg(request)
    if not policy_ops.clear_policy(srv.broker, vhost, request.match_info["name"],
                                   _operator(request)):
        raise not_found()
    return no_content()


@requires("policymaker")
async def put_policy(request: web.Request) -> web.Response:
    return await _put(request)


@requires("policymaker")
async def delete_policy(request: web.Request) -> web.Response:
    return await _delete(request)


@requires("administrator")
async def put_operator_policy(request: web.Request) -> web.Response:
    return await _put(request)


@requires("administrator")
async def delete_operator_policy(request: web.Request) -> web.Response:
    return await _delete(request)


def register(app: web.Application) -> None:
    r = app.router
    for base, put, delete in (("/api/policies", put_policy, delete_policy),
                              ("/api/operator-policies", put_operator_policy,
                               delete_operator_policy)):
        r.add_get(base, list_policies)
        r.add_get(base + "/{vhost}", list_policies)
        r.add_get(base + "/{vhost}/{name}", get_policy)
        r.add_put(base + "/{vhost}/{name}", put)
        r.add_delete(base + "/{vhost}/{name}", delete)
