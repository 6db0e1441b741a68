"""/api/parameters/<component>/<vhost>/<name> and /api/shovels: RabbitMQ 3.10's runtime
parameters (changing and reading them needs policymaker, as RabbitMQ) and its shovel
plugin's status API, answered by the components registered in server/parameters.py (the
dynamic shovel, ackmq/shovel/, when `ackmq serve` runs). A refused value is 400 with
RabbitMQ's "Validation failed" text, HTML-escaped as RabbitMQ's (`&lt;&lt;"x"&gt;&gt;`);
a component that is not there is RabbitMQ's "component … not found"; no registry (an
embedded broker) lists nothing. docs/shovels.md.

/api/global-parameters[/<name>]: RabbitMQ's global runtime parameters (policymaker, as
RabbitMQ's `is_authorized_global_parameters`): any JSON value under `value`, 201 when
new, 204 when replaced or cleared; MQTT's vhost mappings are two of them (docs/mqtt.md).
RabbitMQ lists its `internal_cluster_id` there too; ackmq has none."""

from __future__ import annotations

import html
from typing import Any

from aiohttp import web

from ackmq.server.http import common
from ackmq.server.http.app import requires
from ackmq.server.ops import OpError, bad_request, not_found
from ackmq.server.parameters import ParameterError, Parameters
from ackmq.server.views import visible_vhosts


def _registry(request: web.Request) -> Parameters | None:
    return getattr(common.server(request), "parameters", None)


def _refused(e: ParameterError) -> OpError:
    return bad_request(html.escape(e.reason, quote=False))


@requires("policymaker")
async def list_parameters(request: web.Request) -> web.Response:
    reg, mi = _registry(request), request.match_info
    if reg is None:
        if "vhost" in mi:
            common.vhost_arg(request)
        return common.listing(request, [])
    return common.listing(request, [p for v in common.listed_vhosts(request)
                                    for p in reg.listing(mi.get("component"), v)])


@requires("policymaker")
async def get_parameter(request: web.Request) -> web.Response:
    vhost, reg, mi = common.vhost_arg(request), _registry(request), request.match_info
    p = reg.get(mi["component"], vhost, mi["name"]) if reg is not None else None
    if p is None:
        raise not_found()
    return common.one(request, p)


@requires("policymaker")
async def put_parameter(request: web.Request) -> web.Response:
    srv, mi = common.server(request), request.match_info
    vhost = mi["vhost"]
    if vhost not in srv.broker.vhosts:
        raise OpError(404, "not_found", "vhost_not_found")
    common.vhost_arg(request)
    value = await _value(request)
    reg = _registry(request)
    try:
        if reg is None:
            raise ParameterError([f"component {mi['component']} not found"])
        new = reg.set(mi["component"], vhost, mi["name"], value, common.user(request).name)
    except ParameterError as e:
        raise _refused(e) from None
    return common.no_content(201 if new else 204)


@requires("policymaker")
async def delete_parameter(request: web.Request) -> web.Response:
    vhost, reg, mi = common.vhost_arg(request), _registry(request), request.match_info
    if reg is None or not reg.clear(mi["component"], vhost, mi["name"]):
        raise not_found()
    return common.no_content()


@requires("policymaker")
async def list_global_parameters(request: web.Request) -> web.Response:
    reg = _registry(request)
    return common.listing(request, reg.global_listing() if reg is not None else [])


@requires("policymaker")
async def get_global_parameter(request: web.Request) -> web.Response:
    reg, name = _registry(request), request.match_info["name"]
    found = [g for g in reg.global_listing() if g["name"] == name] if reg is not None else []
    if not found:
        raise not_found()
    return common.one(request, found[0])


@requires("policymaker")
async def put_global_parameter(request: web.Request) -> web.Response:
    value = await _value(request)
    reg = _registry(request)
    if reg is None:
        raise not_found()
    return common.no_content(201 if reg.set_global(request.match_info["name"], value) else 204)


async def _value(request: web.Request) -> Any:
    """A parameter PUT's `value` (RabbitMQ's texts for a body without one)."""
    body = await common.body_json(request)
    if not isinstance(body, dict):
        raise bad_request("not_json")
    if "value" not in body:
        raise bad_request("[{key_missing,value}]")
    return body["value"]


@requires("policymaker")
async def delete_global_parameter(request: web.Request) -> web.Response:
    reg = _registry(request)
    if reg is None or not reg.clear_global(request.match_info["name"]):
        raise not_found()
    return common.no_content()


def _shovels(request: web.Request) -> Any:
    reg = _registry(request)
    comp = reg.components.get("shovel") if reg is not None else None
    if comp is None:  # RabbitMQ without rabbitmq_shovel_management: no such route
        raise not_found()
    return comp


async def list_shovels(request: web.Request) -> web.Response:
    comp = _shovels(request)
    if "vhost" in request.match_info:
        return common.listing(request, comp.status(common.vhost_arg(request)))
    vhosts = set(visible_vhosts(common.server(request), common.user(request)))
    return common.listing(request, [s for s in comp.status(None) if s["vhost"] in vhosts])


async def get_shovel(request: web.Request) -> web.Response:
    comp, vhost = _shovels(request), common.vhost_arg(request)
    found = [s for s in comp.status(vhost) if s["name"] == request.match_info["name"]]
    if not found:
        raise not_found()
    return common.one(request, found[0])


@requires("policymaker")
async def restart_shovel(request: web.Request) -> web.Response:
    comp, vhost = _shovels(request), common.vhost_arg(request)
    if not comp.restart(vhost, request.match_info["name"]):
        raise not_found()
    return common.no_content()


@requires("policymaker")
async def delete_shovel(request: web.Request) -> web.Response:
    """DELETE /api/shovels/vhost/<vhost>/<name>: the dynamic shovel's parameter goes."""
    _shovels(request)
    vhost, reg = common.vhost_arg(request), _registry(request)
    if reg is None or not reg.clear("shovel", vhost, request.match_info["name"]):
        raise not_found()
    return common.no_content()


def register(app: web.Application) -> None:
    r = app.router
    r.add_get("/api/parameters", list_parameters)
    r.add_get("/api/parameters/{component}", list_parameters)
    r.add_get("/api/parameters/{component}/{vhost}", list_parameters)
    base = "/api/parameters/{component}/{vhost}/{name}"
    common.add_methods(r, base, get=get_parameter, put=put_parameter, delete=delete_parameter)
    r.add_get("/api/global-parameters", list_global_parameters)
    common.add_methods(r, "/api/global-parameters/{name}", get=get_global_parameter,
                       put=put_global_parameter, delete=delete_global_parameter)
    common.add_listing(r, "/api/shovels", list_shovels)
    common.add_methods(r, "/api/shovels/vhost/{vhost}/{name}", get=get_shovel, delete=delete_shovel)
    r.add_delete("/api/shovels/vhost/{vhost}/{name}/restart", restart_shovel)
