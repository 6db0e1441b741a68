"""The admin socket's shovel verbs, as rabbitmqctl's (rabbitmq_shovel 3.10):
`shovel_status` (every vhost; its columns, alphabetical as rabbitmqctl prints them),
`delete_shovel [-p vhost] <name>`, `restart_shovel [-p vhost] <name>`; a shovel that
is not there: exit 69 with RabbitMQ's text. The shovels are the `shovel` component of
the parameter registry (server/parameters.py), registered by `ackmq serve`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ackmq.broker.access import AccessError
from ackmq.server.ctl.errors import USAGE, nargs
from ackmq.server.views import node_name

if TYPE_CHECKING:
    from ackmq.server.context import HttpContext

VERBS = ("shovel_status", "delete_shovel", "restart_shovel", "replay_messages")
COLUMNS = ["destination", "destination_protocol", "destination_queue", "last_changed",
           "name", "source", "source_protocol", "source_queue", "state",
           "termination_reason", "type", "vhost"]
_FROM_STATUS = {"destination": "dest_uri", "destination_protocol": "dest_protocol",
                "destination_queue": "dest_queue", "last_changed": "timestamp",
                "source": "src_uri", "source_protocol": "src_protocol",
                "source_queue": "src_queue", "termination_reason": "reason"}


def _missing(vhost: str) -> AccessError:
    return AccessError("Shovel with the given name was not found on the target node "
                       f"'{node_name()}' and / or virtual host '{vhost}'", 69)


def handle(ctx: HttpContext, verb: str, args: list[str], vhost: str) -> dict[str, Any]:
    reg = ctx.parameters
    comp = reg.components.get("shovel") if reg is not None else None
    if verb == "shovel_status":
        nargs(args, 0, "shovel_status")
        rows = [[str(s.get(_FROM_STATUS.get(c, c), "")) for c in COLUMNS]
                for s in (comp.status(None) if comp is not None else [])]
        return {"ok": True, "message": f"Shovel status on node {node_name()}",
                "columns": COLUMNS, "rows": rows}
    if verb == "replay_messages":  # V4, ackmq's own: server/replay.py
        if len(args) not in (1, 2):
            raise AccessError("wrong number of arguments: usage: replay_messages "
                              "[-p <vhost>] <queue> [<destination queue>]", USAGE)
        from ackmq.broker.errors import ReplyError
        from ackmq.server.ops import OpError
        from ackmq.server.replay import replay
        if vhost not in ctx.broker.vhosts:
            raise AccessError(f"Virtual host '{vhost}' does not exist", 65)
        try:
            started = replay(ctx, None, vhost, args[0], args[1] if len(args) > 1 else None)
        except OpError as e:
            raise AccessError(e.reason, 69 if e.status == 404 else 65) from None
        except ReplyError as e:
            raise AccessError(e.text, 69) from None
        return {"ok": True, "message": f"Started shovel {started['shovel']}"}
    nargs(args, 1, f"{verb} [-p <vhost>] <name>")
    name = args[0]
    if verb == "delete_shovel":
        if reg is None or not reg.clear("shovel", vhost, name):
            raise _missing(vhost)
        return {"ok": True}
    message = f"Restarting dynamic Shovel {name} in virtual host {vhost} on node {node_name()}"
    if comp is None or not comp.restart(vhost, name):
        raise AccessError(message + "\nShovel with the given name was not found on the "
                          f"target node '{node_name()}' and / or virtual host '{vhost}'", 69)
    return {"ok": True, "message": message}
