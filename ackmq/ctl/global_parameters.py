"""`ackmq ctl`'s global runtime parameter verbs (set_global_parameter,
clear_global_parameter, list_global_parameters; rabbitmqctl's), once for both ways to a
broker (C6): the value is parsed here into the management API's body and sent to the
admin socket (server/ctl/global_parameters.py) or, with `--url`, PUT to
/api/global-parameters/<name> (ackmq's or RabbitMQ's); both answer a listing in the
API's JSON, formatted here as rabbitmqctl prints it (`name`, `value` as JSON)."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

from ackmq.ctl.errors import CtlError
from ackmq.ctl.http_client import HttpSource

VERBS = ("set_global_parameter", "clear_global_parameter", "list_global_parameters")
COLUMNS = ["name", "value"]


def _row(g: dict[str, Any]) -> list[str]:
    return [str(g["name"]), json.dumps(g["value"], separators=(",", ":"))]


# listing verb -> (rabbitmqctl's columns, the row of one item of the API's JSON)
LISTINGS = {"list_global_parameters": (COLUMNS, _row)}


def body(values: list[str]) -> dict[str, Any]:
    """`name value` as the API's PUT body, with rabbitmqctl's refusal of a value that is
    not JSON."""
    try:
        return {"value": json.loads(values[1])}
    except ValueError:
        raise CtlError("JSON decoding error. Reason: badarg", 69) from None


def handle(src: HttpSource, verb: str, args: list[str], vhost: str,
           body: Any = None) -> dict[str, Any]:
    """The verb over the management API, answered as the admin socket answers it."""
    try:
        if verb == "list_global_parameters":
            return {"ok": True, "items": src.call("GET", "/api/global-parameters")}
        path = f"/api/global-parameters/{quote(args[0], safe='')}"
        src.call("DELETE" if verb.startswith("clear_") else "PUT", path, body)
        return {"ok": True}
    except CtlError as e:
        if e.code == 69 and verb.startswith("clear_"):
            return {"ok": False, "code": 69, "error": "Parameter does not exist"}
        return {"ok": False, "code": e.code, "error": e.text}
