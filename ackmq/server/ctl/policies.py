"""The admin socket's policy verbs (rabbitmqctl's set_policy, clear_policy,
list_policies and the operator-policy three): server/policy_ops.py's operations, with
rabbitmqctl's texts and exit codes (69 for a refused or missing policy, 65 for a
missing vhost). As the management API: a listing is its JSON (`items`), a set takes its
body (`{"pattern", "definition", "priority", "apply-to"}`, built by `ackmq ctl`) and
says the policy's "no effect" note; ackmq/ctl/policies.py formats both (C6)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ackmq.broker.access import AccessError
from ackmq.broker.policy import policy_from_json
from ackmq.broker.policy_check import PolicyError
from ackmq.server import policy_ops
from ackmq.server.ctl.errors import USAGE, nargs

if TYPE_CHECKING:
    from ackmq.server.context import HttpContext

VERBS = ("set_policy", "clear_policy", "list_policies", "set_operator_policy",
         "clear_operator_policy", "list_operator_policies")
NO_SUCH_VHOST = 65
REFUSED = 69


def handle(ctx: HttpContext, verb: str, args: list[str], vhost: str,
           body: Any = None) -> dict[str, Any]:
    broker = ctx.broker
    operator = "operator" in verb
    if verb.startswith("set_"):
        return _set(ctx, verb, args, vhost, operator, body)
    if vhost not in broker.vhosts:
        raise AccessError(f"Virtual host '{vhost}' does not exist", NO_SUCH_VHOST)
    if verb.startswith("list_"):
        nargs(args, 0, f"{verb} [-p <vhost>]")
        return {"ok": True, "items": policy_ops.list_policies(broker, vhost, operator)}
    if verb.startswith("clear_"):
        nargs(args, 1, f"{verb} [-p <vhost>] <name>")
        if not policy_ops.clear_policy(broker, vhost, args[0], operator):
            raise AccessError("Parameter does not exist", REFUSED)
        return {"ok": True}
    raise AccessError(f"unknown verb '{verb}'", REFUSED)


def _set(ctx: HttpContext, verb: str, args: list[str], vhost: str,
         operator: bool, body: Any) -> dict[str, Any]:
    """rabbitmqctl checks the policy first, then the vhost (the API the other way)."""
    nargs(args, 1, f"{verb} [-p <vhost>] <name> (and the policy as the API's body)")
    if not isinstance(body, dict):
        raise AccessError(f"{verb}: the policy's body must be a JSON object", USAGE)
    name = args[0]
    try:
        policy_from_json(vhost, name, body, operator)
        policy_ops.set_policy(ctx.broker, vhost, name, body, operator)
    except PolicyError as e:
        raise AccessError(e.text, REFUSED) from None
    except policy_ops.NoVhost:
        raise AccessError(f"Virtual host '{vhost}' does not exist", NO_SUCH_VHOST) from None
    note = policy_ops.no_effect_note(body)
    return {"ok": True, "notes": [note] if note else []}
