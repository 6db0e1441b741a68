"""The admin socket's policy verbs (rabbitmqctl's set_policy, clear_policy,
list_policies and the operator-policy three): server/policy_ops.py's operations, with
rabbitmqctl's texts and exit codes (69 for a refused or missing policy, 65 for a
missing vhost)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from ackmq.broker.access import AccessError
from ackmq.broker.policy import policy_from_json
from ackmq.broker.policy_check import PolicyError
from ackmq.server import policy_ops
from ackmq.server.ctl.errors import nargs

if TYPE_CHECKING:
    from ackmq.server.context import HttpContext

VERBS = ("set_policy", "clear_policy", "list_policies", "set_operator_policy",
         "clear_operator_policy", "list_operator_policies")
COLUMNS = ["vhost", "name", "pattern", "apply-to", "definition", "priority"]
NO_SUCH_VHOST = 65
REFUSED = 69


def _number(text: str) -> int | float:
    try:
        return int(text)
    except ValueError:
        return float(text)


def handle(ctx: HttpContext, verb: str, args: list[str], vhost: str) -> dict[str, Any]:
    broker = ctx.broker
    operator = "operator" in verb
    if verb.startswith("set_"):
        return _set(ctx, verb, args, vhost, operator)
    if vhost not in broker.vhosts:
        raise AccessError(f"Virtual host '{vhost}' does not exist", NO_SUCH_VHOST)
    if verb.startswith("list_"):
        nargs(args, 0, f"{verb} [-p <vhost>]")
        rows = [[p["vhost"], p["name"], p["pattern"], p["apply-to"],
                 json.dumps(p["definition"], separators=(",", ":"), sort_keys=True),
                 str(p["priority"])]
                for p in policy_ops.list_policies(broker, vhost, operator)]
        return {"ok": True, "columns": COLUMNS, "rows": rows}
    if verb.startswith("clear_"):
        nargs(args, 1, f"{verb} [-p <vhost>] <name>")
        if not policy_ops.clear_policy(broker, vhost, args[0], operator):
            raise AccessError("Parameter does not exist", REFUSED)
        return {"ok": True}
    raise AccessError(f"unknown verb '{verb}'", REFUSED)


def _set(ctx: HttpContext, verb: str, args: list[str], vhost: str,
         operator: bool) -> dict[str, Any]:
    """rabbitmqctl checks the policy first, then the vhost (the API the other way)."""
    nargs(args, 5, f"{verb} [-p <vhost>] [--priority <priority>] [--apply-to <apply-to>] "
                   "<name> <pattern> <definition>")
    name, pattern, text, priority, apply_to = args
    try:
        definition = json.loads(text)
    except ValueError:
        raise AccessError("JSON decoding error. Reason: badarg", REFUSED) from None
    body = {"pattern": pattern, "definition": definition, "priority": _number(priority),
            "apply-to": apply_to}
    try:
        policy_from_json(vhost, name, body, operator)
        policy_ops.set_policy(ctx.broker, vhost, name, body, operator)
    except PolicyError as e:
        raise AccessError(e.text, REFUSED) from None
    except policy_ops.NoVhost:
        raise AccessError(f"Virtual host '{vhost}' does not exist", NO_SUCH_VHOST) from None
    note = policy_ops.no_effect_note({"definition": definition})
    return {"ok": True, "notes": [note] if note else []}
