"""The admin socket's global runtime parameter verbs (rabbitmqctl's
set_global_parameter, clear_global_parameter, list_global_parameters) on the parameter
registry (server/parameters.py), with rabbitmqctl's texts and exit codes. As the
management API: a listing is its JSON (`items`), a set takes its body (`{"value": ...}`,
built by `ackmq ctl` from the JSON argument); ackmq/ctl/global_parameters.py formats
both (C6). MQTT's vhost mappings are two of them (docs/mqtt.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ackmq.broker.access import AccessError
from ackmq.server.ctl.errors import USAGE, nargs

if TYPE_CHECKING:
    from ackmq.server.context import HttpContext

VERBS = ("set_global_parameter", "clear_global_parameter", "list_global_parameters")
REFUSED = 69


def handle(ctx: HttpContext, verb: str, args: list[str], body: Any = None
           ) -> dict[str, Any]:
    reg = ctx.parameters
    if verb == "list_global_parameters":
        nargs(args, 0, verb)
        return {"ok": True, "items": reg.global_listing() if reg is not None else []}
    nargs(args, 1, f"{verb} <name>" + (" <value>" if verb.startswith("set_") else ""))
    if reg is None:
        raise AccessError("this broker keeps no runtime parameters", REFUSED)
    if verb == "clear_global_parameter":
        if not reg.clear_global(args[0]):
            raise AccessError("Parameter does not exist", REFUSED)
        return {"ok": True}
    if not isinstance(body, dict) or "value" not in body:
        raise AccessError(f"{verb}: the value comes as the API's body, "
                          '{"value": ...}', USAGE)
    reg.set_global(args[0], body["value"])
    return {"ok": True}
