"""The admin socket's verbs (rabbitmqctl's): users, vhosts, permissions, topic
permissions and limits against the live access model (durable before the reply); the
topology verbs are topology.py's, the resource alarm verbs alarms.py's. The listings
that the management API also serves answer in its JSON (`items`, server/views.py), which
`ackmq ctl` formats once whichever way it asked (C6)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from ackmq.broker.access import AccessError
from ackmq.server import views
from ackmq.server.ctl import alarms, global_parameters, policies, scheduled, shovels, topology
from ackmq.server.ctl.errors import USAGE, nargs

if TYPE_CHECKING:
    from ackmq.server.context import HttpContext


def handle(ctx: HttpContext, verb: str, args: list[str], vhost: str,
           body: Any = None) -> dict[str, Any]:
    """One rabbitmqctl verb against the live access model (durable before the reply);
    `body`: a verb's JSON argument as the management API takes it (set_policy's)."""
    a = ctx.access
    ok: dict[str, Any] = {"ok": True}
    if verb == "add_user":
        nargs(args, 2, "add_user <username> <password>")
        a.add_user(args[0], args[1])
    elif verb == "delete_user":
        nargs(args, 1, "delete_user <username>")
        a.delete_user(args[0])
    elif verb == "change_password":
        nargs(args, 2, "change_password <username> <password>")
        a.change_password(args[0], args[1])
    elif verb == "set_user_tags":
        if not args:
            raise AccessError("wrong number of arguments: usage: set_user_tags "
                              "<username> <tag> [...]", USAGE)
        a.set_user_tags(args[0], args[1:])
    elif verb == "list_users":
        nargs(args, 0, "list_users")
        return {**ok, "items": [views.user(a, u) for u in a.users.values()]}
    elif verb == "add_vhost":
        nargs(args, 1, "add_vhost <vhost>")
        a.add_vhost(args[0])
    elif verb == "delete_vhost":
        nargs(args, 1, "delete_vhost <vhost>")
        a.delete_vhost(args[0])
    elif verb == "list_vhosts":
        nargs(args, 0, "list_vhosts")
        return {**ok, "items": [{"name": n} for n in a.vhosts]}  # /api/vhosts' names
    elif verb == "set_permissions":
        nargs(args, 4, "set_permissions [-p <vhost>] <username> <conf> <write> <read>")
        a.set_permissions(args[0], vhost, *args[1:])
    elif verb == "clear_permissions":
        nargs(args, 1, "clear_permissions [-p <vhost>] <username>")
        a.clear_permissions(args[0], vhost)
    elif verb == "list_permissions":
        nargs(args, 0, "list_permissions [-p <vhost>]")
        if vhost not in a.vhosts:
            raise AccessError(f"Virtual host '{vhost}' does not exist", 65)
        return {**ok, "items": views.permissions(a, vhost=vhost)}
    elif verb == "list_user_permissions":
        nargs(args, 1, "list_user_permissions <username>")
        if args[0] not in a.users:
            raise AccessError(f"User \"{args[0]}\" does not exist", 69)
        return {**ok, "items": views.permissions(a, user=args[0])}
    elif verb == "set_topic_permissions":
        nargs(args, 4, "set_topic_permissions [-p <vhost>] <username> <exchange> "
                        "<write> <read>")
        a.set_topic_permissions(args[0], vhost, *args[1:])
    elif verb == "clear_topic_permissions":
        if len(args) not in (1, 2):
            raise AccessError("wrong number of arguments: usage: clear_topic_permissions "
                              "[-p <vhost>] <username> [<exchange>]", USAGE)
        a.clear_topic_permissions(args[0], vhost, args[1] if len(args) == 2 else None)
    elif verb == "list_topic_permissions":
        nargs(args, 0, "list_topic_permissions [-p <vhost>]")
        if vhost not in a.vhosts:
            raise AccessError(f"Virtual host '{vhost}' does not exist", 65)
        return {**ok, "columns": ["user", "exchange", "write", "read"],
                "rows": [[u, x, t.write, t.read]
                         for (u, v), by_x in a.topic_permissions.items() if v == vhost
                         for x, t in by_x.items()]}
    elif verb == "list_user_topic_permissions":
        nargs(args, 1, "list_user_topic_permissions <username>")
        if args[0] not in a.users:
            raise AccessError(f'{{:no_such_user, "{args[0]}"}}', 69)
        # RabbitMQ 3.10 prints this list without a header line
        return {**ok, "columns": None,
                "rows": [[v, x, t.write, t.read]
                         for (u, v), by_x in a.topic_permissions.items() if u == args[0]
                         for x, t in by_x.items()]}
    elif verb in ("set_vhost_limits", "set_user_limits"):
        n = 1 if verb == "set_vhost_limits" else 2
        nargs(args, n, "set_vhost_limits [-p <vhost>] <json>" if n == 1 else
               "set_user_limits <username> <json>")
        try:
            limits = json.loads(args[-1])
        except ValueError as e:
            raise AccessError(f"JSON decoding error: {e}", 69) from e
        if n == 1:
            a.set_vhost_limits(vhost, limits)
        else:
            a.set_user_limits(args[0], limits)
    elif verb == "clear_vhost_limits":
        nargs(args, 0, "clear_vhost_limits [-p <vhost>]")
        a.clear_vhost_limits(vhost)
    elif verb == "clear_user_limits":
        nargs(args, 2, "clear_user_limits <username> <limit>|all")
        a.clear_user_limits(args[0], args[1])
    elif verb == "list_vhost_limits":
        nargs(args, 0, "list_vhost_limits [-p <vhost>]")
        if vhost not in a.vhosts:
            raise AccessError(f"Virtual host '{vhost}' does not exist", 65)
        return {**ok, "json": a.vhosts[vhost].get("limits", {})}
    elif verb == "list_user_limits":
        nargs(args, 1, "list_user_limits --user <username>")
        if args[0] not in a.users:
            raise AccessError(f"User \"{args[0]}\" does not exist", 69)
        return {**ok, "json": a.user_limits.get(args[0], {})}
    elif verb in ("list_items", "node_status", "purge_queue", "delete_queue",
                  "close_connection", "stream_tracking"):
        return topology.handle(ctx, verb, args, vhost)
    elif verb in ("trace_on", "trace_off"):  # M9, S10
        return topology.trace(ctx, verb, args, vhost)
    elif verb in ("set_vm_memory_high_watermark", "set_disk_free_limit", "alarms"):
        return alarms.handle(ctx, verb, args)
    elif verb in policies.VERBS:
        return policies.handle(ctx, verb, args, vhost, body)
    elif verb in global_parameters.VERBS:
        return global_parameters.handle(ctx, verb, args, body)
    elif verb in scheduled.VERBS:
        return scheduled.handle(ctx, verb, args, vhost)
    elif verb in shovels.VERBS:
        return shovels.handle(ctx, verb, args, vhost)
    else:
        raise AccessError(f"unknown verb '{verb}'", USAGE)
    return ok
