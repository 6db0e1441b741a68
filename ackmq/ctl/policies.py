"""`ackmq ctl --url ...` for the policy verbs (set_policy, clear_policy,
list_policies and the operator-policy three): the replies the admin socket gives
(server/ctl/policies.py), made from a management API's /api/policies and
/api/operator-policies, ackmq's or RabbitMQ's."""

from __future__ import annotations

import html
import json
from typing import Any
from urllib.parse import quote

from ackmq.ctl.errors import CtlError
from ackmq.ctl.http_client import HttpSource

VERBS = ("set_policy", "clear_policy", "list_policies", "set_operator_policy",
         "clear_operator_policy", "list_operator_policies")
COLUMNS = ["vhost", "name", "pattern", "apply-to", "definition", "priority"]


def _number(text: str) -> int | float:
    try:
        return int(text)
    except ValueError:
        return float(text)


def handle(src: HttpSource, verb: str, args: list[str], vhost: str) -> dict[str, Any]:
    base = "/api/operator-policies/" if "operator" in verb else "/api/policies/"
    where = base + quote(vhost, safe="")
    try:
        if verb.startswith("list_"):
            rows = [[p["vhost"], p["name"], p["pattern"], p["apply-to"],
                     json.dumps(p["definition"], separators=(",", ":"), sort_keys=True),
                     str(p["priority"])] for p in src.call("GET", where)]
            return {"ok": True, "columns": COLUMNS, "rows": rows}
        path = f"{where}/{quote(args[0], safe='')}"
        if verb.startswith("clear_"):
            src.call("DELETE", path)
            return {"ok": True}
        try:
            definition = json.loads(args[2])
        except ValueError:
            return {"ok": False, "code": 69, "error": "JSON decoding error. Reason: badarg"}
        src.call("PUT", path, {"pattern": args[1], "definition": definition,
                               "priority": _number(args[3]), "apply-to": args[4]})
        return {"ok": True}
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
