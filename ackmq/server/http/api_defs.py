"""GET/POST /api/definitions (and per vhost): RabbitMQ's definitions format both ways
(server/definitions.py); administrators only, as RabbitMQ."""

from __future__ import annotations

from aiohttp import web
from aiohttp.web_request import FileField

from ackmq.server import definitions
from ackmq.server.http.app import json_response, requires
from ackmq.server.http.common import (
    add_methods,
    body_json,
    no_content,
    parse_json,
    server,
    vhost_arg,
)
from ackmq.server.ops import OpError, bad_request

NOT_PARSED = "failed_to_parse_json"  # RabbitMQ's reason here (elsewhere "not_json")


def _download(request: web.Request, data: dict) -> web.Response:
    r = json_response(data)
    name = request.query.get("download")
    if name:
        safe = "".join(ch for ch in name if ch.isalnum() or ch in "._-") or "definitions.json"
        r.headers["Content-Disposition"] = f'attachment; filename="{safe}"'
    return r


@requires("administrator")
async def get_definitions(request: web.Request) -> web.Response:
    if "vhost" in request.match_info:
        return _download(request, definitions.export_vhost(server(request),
                                                           vhost_arg(request)))
    return _download(request, definitions.export(server(request)))


@requires("administrator")
async def post_definitions(request: web.Request) -> web.Response:
    """The body is the JSON document (or, from the UI's upload form, a `file` field)."""
    try:
        if request.content_type == "multipart/form-data":
            field = (await request.post()).get("file")
            defs = parse_json(field.file.read() if isinstance(field, FileField)
                              else str(field or ""))
        else:
            defs = await body_json(request)
    except OpError as e:
        if e.reason != "not_json":  # too deep: said so; 415, 413: as they are
            raise
        raise bad_request(NOT_PARSED) from None
    vhost = vhost_arg(request) if "vhost" in request.match_info else None
    try:
        done = definitions.import_(server(request), defs, vhost)
    except definitions.DefinitionsError as e:
        raise bad_request(str(e)) from None
    if done["refused"]:  # the others are imported; the answer names what was not
        raise bad_request("not imported: " + "; ".join(done["refused"]))
    return no_content()


def register(app: web.Application) -> None:
    r = app.router
    add_methods(r, "/api/definitions", get=get_definitions, post=post_definitions)
    add_methods(r, "/api/definitions/{vhost}", get=get_definitions, post=post_definitions)
