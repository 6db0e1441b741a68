"""`ackmq ctl`'s policy verbs (set_policy, clear_policy, list_policies and the
operator-policy three), once for both ways to a broker (C6): the policy is built here
as the management API's body and sent to the admin socket (server/ctl/policies.py) or,
with `--url`, PUT to /api/policies or /api/operator-policies (ackmq's or RabbitMQ's);
both answer a listing in the API's JSON, formatted here, and a set with the broker's
"no effect" notes (the socket's "notes", the API's NOTE_HEADER)."""

from __future__ import annotations

import html
import json
from typing import Any
from urllib.parse import quote

from ackmq.ctl.errors import CtlError
from ackmq.ctl.http_client import HttpSource
from ackmq.server.policy_ops import NOTE_HEADER

VERBS = ("set_policy", "clear_policy", "list_policies", "set_operator_policy",
         "clear_operator_policy", "list_operator_policies")
COLUMNS = ["vhost", "name", "pattern", "apply-to", "definition", "priority"]


def _row(p: dict[str, Any]) -> list[str]:
    return [p["vhost"], p["name"], p["pattern"], p["apply-to"],
            json.dumps(p["definition"], separators=(",", ":"), sort_keys=True),
            str(p["priority"])]


# listing verb -> (rabbitmqctl's columns, the row of one item of the API's JSON)
LISTINGS = {"list_policies": (COLUMNS, _row), "list_operator_policies": (COLUMNS, _row)}


def _number(text: str) -> int | float:
    try:
        return int(text)
    except ValueError:
        return float(text)


def body(values: list[str]) -> dict[str, Any]:
    """`name pattern definition priority apply-to` as the API's PUT body, with
    rabbitmqctl's refusal of a definition that is not JSON."""
    _name, pattern, text, priority, apply_to = values
    try:
        definition = json.loads(text)
    except ValueError:
        raise CtlError("JSON decoding error. Reason: badarg", 69) from None
    try:
        number = _number(priority)
    except ValueError as e:
        raise CtlError(f"bad request: {e}", 64) from None
    return {"pattern": pattern, "definition": definition, "priority": number,
            "apply-to": apply_to}


def handle(src: HttpSource, verb: str, args: list[str], vhost: str,
           body: Any = None) -> dict[str, Any]:
    """The verb over the management API, answered as the admin socket answers it."""
    base = "/api/operator-policies/" if "operator" in verb else "/api/policies/"
    where = base + quote(vhost, safe="")
    try:
        if verb.startswith("list_"):
            return {"ok": True, "items": src.call("GET", where)}
        path = f"{where}/{quote(args[0], safe='')}"
        if verb.startswith("clear_"):
            src.call("DELETE", path)
            return {"ok": True}
        _, headers = src.exchange("PUT", path, body)
        note = headers.get(NOTE_HEADER)
        return {"ok": True, "notes": [note] if note else []}
    except CtlError as e:
        code, text = _error(e, verb, vhost)
        return {"ok": False, "code": code, "error": text}


def _error(e: CtlError, verb: str, vhost: str) -> tuple[int, str]:
    """rabbitmqctl's exit code and words for what the API answered."""
    if " 400 " in e.text:
        return 69, html.unescape(e.text.split(" 400 ", 1)[1])
    if e.code == 69 and verb.startswith("clear_"):
        return 69, "Parameter does not exist"
    if e.code == 69:
        return 65, f"Virtual host '{vhost}' does not exist"
    return e.code, e.text
