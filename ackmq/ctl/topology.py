"""`ackmq ctl`'s SPEC M4 verbs: list_queues / list_exchanges / list_bindings /
list_connections / list_channels / list_consumers with rabbitmqctl's columns (default
and named), `--formatter json`, purge_queue, delete_queue, close_connection, status,
environment.

Both ways to a broker answer in the management API's JSON: the local admin socket
(socket_client.py, served by server/ctl/) and, with `--url http://user:pass@host:15672`,
a remote broker's HTTP API (http_client.py, RabbitMQ's paths, so it also reads a
RabbitMQ). This module turns that JSON into rabbitmqctl's rows.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

from ackmq.ctl import streams
from ackmq.ctl.errors import CtlError

Item = dict[str, Any]


def _get(path: str) -> Callable[[Item], Any]:
    keys = path.split(".")

    def pick(item: Item) -> Any:
        v: Any = item
        for k in keys:
            v = v.get(k) if isinstance(v, dict) else None
        return v
    return pick


def _const(v: Any) -> Callable[[Item], Any]:
    return lambda item: v


def _columns(same: tuple[str, ...], **renamed: str) -> dict[str, Callable[[Item], Any]]:
    """rabbitmqctl's columns of a listing: those the API names alike, then the others
    ({column: the API's dotted path})."""
    return {k: _get(k) for k in same} | {k: _get(path) for k, path in renamed.items()}


# verb -> (listing, info line, default columns, {column: value from the API's JSON})
LISTS: dict[str, tuple[str, str, list[str], dict[str, Callable[[Item], Any]]]] = {
    "list_queues": ("queues", "Timeout: 60.0 seconds ...\nListing queues for vhost {vhost} ...",
                    ["name", "messages"],
                    _columns(("name", "durable", "auto_delete", "arguments", "exclusive",
                              "messages", "messages_ready", "messages_unacknowledged",
                              "consumers", "type", "state", "policy", "vhost",
                              "exclusive_consumer_tag", "node"))),
    "list_exchanges": ("exchanges", "Listing exchanges for vhost {vhost} ...", ["name", "type"],
                       _columns(("name", "type", "durable", "auto_delete", "internal",
                                 "arguments", "vhost", "policy",
                                 "messages_delayed"))),  # L8: the plugin's
    "list_bindings": ("bindings", "Listing bindings for vhost {vhost}...",
                      ["source_name", "source_kind", "destination_name", "destination_kind",
                       "routing_key", "arguments"],
                      _columns(("routing_key", "arguments", "vhost"), source_name="source",
                               destination_name="destination",
                               destination_kind="destination_type")
                      | {"source_kind": _const("exchange")}),
    "list_connections": ("connections", "Listing connections ...",
                         ["user", "peer_host", "peer_port", "state"],
                         _columns(("name", "user", "peer_host", "peer_port", "host", "port",
                                   "state", "vhost", "protocol", "channels", "ssl", "timeout",
                                   "frame_max", "channel_max", "client_properties",
                                   "connected_at", "auth_mechanism", "node"), pid="name")),
    "list_channels": ("channels", "Listing channels ...",
                      ["pid", "user", "consumer_count", "messages_unacknowledged"],
                      _columns(("name", "user", "consumer_count", "messages_unacknowledged",
                                "vhost", "number", "prefetch_count", "global_prefetch_count",
                                "confirm", "transactional", "messages_unconfirmed",
                                "messages_uncommitted", "acks_uncommitted", "node"),
                               pid="name", connection="connection_details.name")),
    "list_consumers": ("consumers", "Listing consumers in vhost {vhost} ...",
                       ["queue_name", "channel_pid", "consumer_tag", "ack_required",
                        "prefetch_count", "active", "arguments"],
                       _columns(("consumer_tag", "ack_required", "prefetch_count", "active",
                                 "arguments", "exclusive", "activity_status"),
                                queue_name="queue.name", channel_pid="channel_details.name")),
    # rabbitmq-streams' verbs (RabbitMQ's stream plugin), over its management plugin's
    # /api/stream/... listings
    "list_stream_connections": ("stream/connections", "Listing stream connections ...",
                                ["conn_name"],
                                _columns(("port", "peer_port", "host", "peer_host", "user",
                                          "vhost", "ssl", "auth_mechanism", "frame_max",
                                          "client_properties", "connected_at",
                                          "publishers"),
                                         conn_name="name", heartbeat="timeout",
                                         connection_state="state",
                                         subscriptions="consumers")),
    "list_stream_consumers": ("stream/consumers", "Listing stream consumers ...",
                              ["connection_pid", "subscription_id", "stream",
                               "messages_consumed", "offset", "offset_lag", "credits",
                               "properties"],
                              _columns(("subscription_id", "offset", "offset_lag", "credits",
                                        "properties", "active", "activity_status"),
                                       connection_pid="connection_details.name",
                                       stream="queue.name", messages_consumed="consumed")),
    "list_stream_publishers": ("stream/publishers", "Listing stream publishers ...",
                               ["publisher_id", "stream", "reference", "messages_published",
                                "messages_confirmed", "messages_errored"],
                               _columns(("publisher_id", "reference"),
                                        connection_pid="connection_details.name",
                                        stream="queue.name", messages_published="published",
                                        messages_confirmed="confirmed",
                                        messages_errored="errored")),
}
BROKER_WIDE = {"list_connections", "list_channels",  # rabbitmqctl: not per vhost
               "list_stream_connections"}
OTHER_VERBS = ("purge_queue", "delete_queue", "close_connection", "status", "environment",
               *streams.VERBS)
VERBS = tuple(LISTS) + OTHER_VERBS


# -- values as rabbitmqctl prints them ---------------------------------------------------
def _erl(v: Any) -> str:
    """rabbitmqctl's table text: [{"key",value}, ...], in the table's order."""
    if isinstance(v, dict):
        return "[" + ",".join(f'{{"{k}",{_erl(x)}}}' for k, x in v.items()) + "]"
    if isinstance(v, list):
        return "[" + ",".join(_erl(x) for x in v) + "]"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    return "undefined" if v is None else str(v)


def text_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, dict | list):
        return _erl(v)
    return "" if v is None else str(v)


def _amqp_type(v: Any) -> str:
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "long"
    if isinstance(v, float):
        return "double"
    if isinstance(v, dict):
        return "table"
    if isinstance(v, list):
        return "array"
    return "longstr"


def _triples(v: Any) -> Any:
    """--formatter json: a table is a list of [key, AMQP type, value] (rabbitmqctl)."""
    if isinstance(v, dict):
        return [[k, _amqp_type(x), _triples(x)] for k, x in v.items()]
    if isinstance(v, list):
        return [[_amqp_type(x), _triples(x)] for x in v]
    return v


# -- the verbs -----------------------------------------------------------------------------
def _print_rows(verb: str, items: list[Item], columns: list[str], formatter: str,
                quiet: bool, vhost: str) -> int:
    _, info, default, getters = LISTS[verb]
    cols = columns or default
    unknown = [c for c in cols if c not in getters]
    if unknown:
        raise CtlError(f"Info key(s) {','.join(unknown)} are not supported", 64)
    rows = [{c: getters[c](i) for c in cols} for i in items]
    if formatter == "json":
        print("[\n" + "\n,".join(json.dumps({c: _triples(v) if c == "arguments" else v
                                             for c, v in r.items()}, separators=(",", ":"))
                                 for r in rows) + ("\n" if rows else "") + "]")
        return 0
    if not quiet:
        print(info.format(vhost=vhost))
    if rows:  # rabbitmqctl prints no header for an empty list
        print("\t".join(cols))
        for r in rows:
            print("\t".join(text_value(r[c]) for c in cols))
    return 0


def _status(src: Any, formatter: str, quiet: bool) -> int:
    st = src.node()
    ov, node = st["overview"], st["node"]
    alarms = ([{"resource": "memory"}] if node.get("mem_alarm") else []) + \
             ([{"resource": "disk"}] if node.get("disk_free_alarm") else [])
    data = {
        "pid": node.get("os_pid"), "os": "Linux", "uptime": (node.get("uptime") or 0) // 1000,
        "product_name": ov.get("product_name"), "product_version": ov.get("product_version"),
        "rabbitmq_version": ov.get("rabbitmq_version"), "erlang_version": ov.get(
            "erlang_version"), "alarms": alarms,
        "listeners": [{"node": x["node"], "protocol": x["protocol"], "interface":
                       x["ip_address"], "port": x["port"]} for x in ov.get("listeners", [])],
        "memory": {"total": {"rss": node.get("mem_used")}},
        "vm_memory_high_watermark_limit": node.get("mem_limit"),
        "disk_free": node.get("disk_free"), "disk_free_limit": node.get("disk_free_limit"),
        "data_directory": node.get("db_dir"),
        "totals": {"virtual_host_count": None, "connection_count":
                   ov["object_totals"]["connections"], "queue_count":
                   ov["object_totals"]["queues"]},
        "file_descriptors": {"total_limit": node.get("fd_total"),
                             "sockets_used": node.get("sockets_used")},
    }
    if formatter == "json":
        print(json.dumps(data, separators=(",", ":")))
        return 0
    if not quiet:
        print(f"Status of node {node['name']} ...")
    print(f"Runtime\n\nOS PID: {data['pid']}\nOS: Linux\nUptime (seconds): {data['uptime']}\n"
          f"{ov.get('product_name')} version: {ov.get('product_version')} (RabbitMQ "
          f"{ov.get('rabbitmq_version')} compatible)\nNode name: {node['name']}\n"
          f"Runtime: {ov.get('erlang_version')}\n")
    print("Alarms\n\n" + ("\n".join(f"{a['resource']} alarm" for a in alarms)
                          or "(none)") + "\n")
    print(f"Memory\n\nTotal memory used: {data['memory']['total']['rss']} bytes\n"
          f"Memory high watermark limit: {data['vm_memory_high_watermark_limit']} bytes\n")
    print(f"Free Disk Space\n\nLow free disk space watermark: {data['disk_free_limit']} "
          f"bytes\nFree disk space: {data['disk_free']} bytes\n")
    print("Totals\n\nConnection count: {connection_count}\nQueue count: {queue_count}\n"
          .format(**data["totals"]))
    print("Listeners\n\n" + "\n".join(
        f"Interface: {x['interface']}, port: {x['port']}, protocol: {x['protocol']}"
        for x in data["listeners"]))
    return 0


def run(args: Any, src: Any) -> int:
    verb = args.verb
    vhost = getattr(args, "vhost", "/") or "/"
    formatter = getattr(args, "formatter", "table")
    try:
        if verb in LISTS:
            scope = None if verb in BROKER_WIDE else vhost
            items = src.items(LISTS[verb][0], scope)
            return _print_rows(verb, items, list(args.columns or []), formatter, args.quiet,
                               vhost)
        if verb == "purge_queue":
            if not args.quiet:
                print(f"Purging queue '{args.queue}' in vhost '{vhost}' ...")
            src.purge(vhost, args.queue)
            return 0
        if verb == "delete_queue":
            if not args.quiet:
                print(f"Deleting queue '{args.queue}' on vhost '{vhost}' ...")
            n = src.delete_queue(vhost, args.queue, args.if_empty, args.if_unused)
            print(f"Queue was successfully deleted with {n} message{'s' if n != 1 else ''}")
            return 0
        if verb == "close_connection":
            if not args.quiet:
                print(f"Closing connection {args.connection}, reason: {args.explanation}...")
            src.close(args.connection, args.explanation)
            return 0
        if verb == "status":
            return _status(src, formatter, args.quiet)
        if verb in streams.VERBS:
            return streams.run(args, src)
        if verb == "environment":
            st = src.node()
            env = {"node": st["node"]["name"], "listeners": st["overview"]["listeners"],
                   "mem_limit": st["node"].get("mem_limit"),
                   "disk_free_limit": st["node"].get("disk_free_limit"),
                   "data_directory": st["node"].get("db_dir")}
            if not args.quiet and formatter != "json":
                print(f"Application environment of node {env['node']} ...")
            print(json.dumps(env, indent=None if formatter == "json" else 2))
            return 0
    except CtlError as e:
        print(f"Error:\n{e.text}", file=sys.stderr)
        return e.code
    raise AssertionError(verb)


def add_parsers(sub: Any) -> None:
    """The M4 verbs' arguments, as rabbitmqctl's."""
    for verb in LISTS:
        vp = sub.add_parser(verb)
        if verb not in BROKER_WIDE:
            vp.add_argument("-p", "--vhost", default="/", help="virtual host (default /)")
        vp.add_argument("columns", nargs="*",
                        help=f"columns (default: {' '.join(LISTS[verb][2])})")
        vp.add_argument("--formatter", choices=("table", "json"), default="table")
    vp = sub.add_parser("purge_queue")
    vp.add_argument("-p", "--vhost", default="/")
    vp.add_argument("queue")
    vp = sub.add_parser("delete_queue")
    vp.add_argument("-p", "--vhost", default="/")
    vp.add_argument("queue")
    vp.add_argument("--if-empty", "-e", action="store_true")
    vp.add_argument("--if-unused", "-u", action="store_true")
    vp = sub.add_parser("close_connection")
    vp.add_argument("connection", help="the connection's name (list_connections name)")
    vp.add_argument("explanation")
    for verb in ("status", "environment"):
        vp = sub.add_parser(verb)
        vp.add_argument("--formatter", choices=("table", "json"), default="table")
    streams.add_parsers(sub)
