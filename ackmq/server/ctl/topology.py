"""The M4 verbs' broker side for the local admin socket (`ackmq ctl list_queues`, ...):
the same JSON the management API answers (server/views.py) and the same operations
(server/ops.py), so `ackmq ctl` formats one shape whether it asked the socket or, with
`--url`, a remote broker's HTTP API."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ackmq.broker.access import AccessError
from ackmq.broker.errors import ReplyError
from ackmq.server import ops, views, views_stream
from ackmq.server.ctl.errors import USAGE, nargs

if TYPE_CHECKING:
    from ackmq.server.context import HttpContext


class _Admin:
    """Whoever can open the admin socket owns the broker: sees everything."""

    name = ""
    tags = ["administrator"]


def _vhost(server: HttpContext, name: str) -> Any:
    vh = server.broker.vhosts.get(name)
    if vh is None:
        raise AccessError(f"Virtual host '{name}' does not exist", 65)
    return vh


def items(server: HttpContext, kind: str, vhost: str | None) -> list[dict[str, Any]]:
    """`kind`: queues, exchanges, bindings, connections, channels, consumers; `vhost`
    None: every vhost (connections and channels are listed broker-wide, as
    rabbitmqctl does)."""
    names = [vhost] if vhost is not None else list(server.broker.vhosts)
    vhs = [_vhost(server, n) for n in names]
    if kind == "queues":
        return [views.queue(q) for vh in vhs for q in vh.queues.values()]
    if kind == "exchanges":
        return [views.exchange(vh.name, x) for vh in vhs for x in vh.exchanges.values()]
    if kind == "bindings":
        return [b for vh in vhs for b in views.bindings(vh)]
    if kind == "consumers":
        return [views.consumer(c) for vh in vhs for q in vh.queues.values()
                for c in q.consumers.values()]
    conns = [c for c in list(server.connections) if c.vhost_name is not None]
    if kind.startswith("stream/"):  # rabbitmq-streams' listings (server/views_stream.py)
        streams = [c for c in conns if views_stream.is_stream(c) and c.vhost_name in names]
        if kind == "stream/connections":
            return [views_stream.stream_connection(c) for c in streams]
        if kind == "stream/publishers":
            return [p for c in streams for p in views_stream.publishers(c)]
        if kind == "stream/consumers":
            return [s for c in streams for s in views_stream.consumers(c)]
    if kind == "connections":
        return [views.connection(c) for c in conns]
    if kind == "channels":
        return [views.channel(c, n, ch) for c in conns for n, ch in views.channels_of(c)]
    raise AccessError(f"unknown listing '{kind}'", 64)


def node(server: HttpContext) -> dict[str, Any]:
    """What `status` shows: the overview and the node, as GET /api/overview and
    /api/nodes/{node} answer them."""
    return {"overview": views.overview(server, _Admin()), "node": views.node(server)}


def purge_queue(server: HttpContext, vhost: str, name: str) -> int:
    q = _vhost(server, vhost).queues.get(name)
    if q is None:
        raise AccessError(f"Queue '{name}' in vhost '{vhost}' not found", 69)
    return ops.purge(server, None, q)


def delete_queue(server: HttpContext, vhost: str, name: str, if_empty: bool, if_unused: bool
                 ) -> int:
    vh = _vhost(server, vhost)
    q = vh.queues.get(name)
    if q is None:
        raise AccessError("Queue not found", 64)
    try:
        return ops.delete_queue(server, None, q, if_unused, if_empty)
    except ReplyError as e:
        raise AccessError(e.text, 70) from None


def close_connection(server: HttpContext, name: str, reason: str) -> None:
    for c in list(server.connections):
        if views.connection_name(c) == name:
            ops.close_connection(server, c, reason)
            return
    raise AccessError(f"connection '{name}' not found (the name as list_connections "
                      "name shows it)", 69)


def handle(ctx: HttpContext, verb: str, args: list[str], vhost: str) -> dict[str, Any]:
    """M4's verbs: listings in the management API's JSON, which `ackmq ctl` turns into
    rabbitmqctl's columns; purge, delete, close."""
    if verb == "list_items":  # args: [kind] or [kind, "all"] for every vhost
        if not args:  # (found by the admin-socket fuzzer: was an IndexError)
            raise AccessError("wrong number of arguments: usage: list_items <kind> "
                              "[all]", USAGE)
        return {"ok": True, "items": items(
            ctx, args[0], None if args[1:] == ["all"] else vhost)}
    if verb == "node_status":
        return {"ok": True, **node(ctx)}
    if verb == "stream_tracking":
        nargs(args, 1, "stream_tracking [-p <vhost>] <stream>")
        q = views_stream.stream_of(_vhost(ctx, vhost), args[0])
        if q is None:  # rabbitmq-streams' words
            raise AccessError("The stream does not exist.", 70)
        return {"ok": True, "items": views_stream.tracking(q)}
    if verb == "purge_queue":
        nargs(args, 1, "purge_queue [-p <vhost>] <queue>")
        return {"ok": True, "count": purge_queue(ctx, vhost, args[0])}
    if verb == "delete_queue":
        if not args:
            raise AccessError("wrong number of arguments: usage: delete_queue [-p "
                              "<vhost>] <queue> [--if-empty] [--if-unused]", USAGE)
        return {"ok": True, "count": delete_queue(
            ctx, vhost, args[0], "if-empty" in args[1:], "if-unused" in args[1:])}
    nargs(args, 2, "close_connection <connection name> <explanation>")
    close_connection(ctx, args[0], args[1])
    return {"ok": True}


def trace(server: HttpContext, verb: str, args: list[str], vhost: str) -> dict[str, Any]:
    """trace_on [--lifecycle] / trace_off, with rabbitmqctl's answer (a vhost that does
    not exist is answered the same, as RabbitMQ does)."""
    from ackmq.server.tracing import trace_off, trace_on
    if verb == "trace_on":
        if args not in ([], ["lifecycle"]):
            raise AccessError("usage: trace_on [-p <vhost>] [--lifecycle]", USAGE)
        trace_on(server, vhost, lifecycle=bool(args))
        return {"ok": True, "message": f"Trace enabled for vhost {vhost}"}
    nargs(args, 0, "trace_off [-p <vhost>]")
    trace_off(server, vhost)
    return {"ok": True, "message": f"Trace disabled for vhost {vhost}"}
