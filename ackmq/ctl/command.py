"""`ackmq ctl VERB ...`: rabbitmqctl's verbs against a running broker, over its admin
socket (`<data dir>/ctl.sock`, mode 0600: socket_client.py) or a management API
(`--url`: http_client.py); the parser, the verbs' info lines and the printing."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

HELP = ("manage users, vhosts, permissions, resource limits and policies of a running "
        "broker (rabbitmqctl's verbs)")
DESCRIPTION = """\
Manage a running ackmq broker with rabbitmqctl's verbs and output (tab-separated, with a
header line). `ackmq ctl` talks to the broker over
its local admin socket, <data dir>/ctl.sock (mode 0600, so only the user running the
broker, or root, can use it). Point it at the broker with --data-dir (default
./ackmq-data) or --socket. (A broker started with --no-persistence has no data dir and
so no admin socket: its users are guest or --default-user only.)

verbs (rabbitmqctl's; with --url http://user:pass@host:15672 the listing, purge,
delete, close, status, definitions, user, vhost, permission, policy, global parameter
and scheduled-message verbs go to a broker's management HTTP API, ackmq's or RabbitMQ's,
with the same output):
  list_queues [-p <vhost>] [<column> ...]   (default: name messages; --formatter json)
  list_exchanges [-p <vhost>] [<column> ...]  list_bindings [-p <vhost>] [<column> ...]
  list_connections [<column> ...]           list_channels [<column> ...]
  list_consumers [-p <vhost>] [<column> ...]
  list_stream_connections [<column> ...]    (rabbitmq-streams'; default: conn_name)
  list_stream_consumers [-p <vhost>] [<column> ...]  list_stream_publishers [-p <vhost>] [<column> ...]
  list_stream_group_consumers --stream <s> --reference <r> [--vhost <vhost>] [<column> ...]
  list_stream_tracking <stream> [--all|--offset|--writer] [--vhost <vhost>]
  purge_queue [-p <vhost>] <queue>          delete_queue [-p <vhost>] <queue> [--if-empty] [--if-unused]
  close_connection <connection name> <explanation>
  status [--formatter json]                 environment
  await_startup [-t <seconds>]              wait until the broker answers (default 300 s)
  await_online_nodes <count> [-t <seconds>] the same; ackmq is one node (count 1)
  add_user <user> <password>          delete_user <user>
  change_password <user> <password>   set_user_tags <user> [<tag> ...]
  list_users
  add_vhost <vhost>                   delete_vhost <vhost>
  list_vhosts
  set_permissions [-p <vhost>] <user> <conf> <write> <read>
  clear_permissions [-p <vhost>] <user>
  list_permissions [-p <vhost>]       list_user_permissions <user>
  set_vhost_limits [-p <vhost>] '{"max-connections": N, "max-queues": N}'
  clear_vhost_limits [-p <vhost>]     list_vhost_limits [-p <vhost>]
  set_user_limits <user> '{"max-connections": N, "max-channels": N}'
  clear_user_limits <user> <name>|all list_user_limits --user <user>
  set_vm_memory_high_watermark <fraction> | absolute <value>   (e.g. 0.4, absolute 2GiB)
  set_disk_free_limit <disk_limit> | mem_relative <fraction>  (e.g. 1GiB, mem_relative 1.5)
  alarms                              the resource alarms set now (memory, disk)
  set_topic_permissions [-p <vhost>] <user> <exchange> <write> <read>
  clear_topic_permissions [-p <vhost>] <user> [<exchange>]
  list_topic_permissions [-p <vhost>] list_user_topic_permissions <user>
  set_policy [-p <vhost>] [--priority N] [--apply-to queues|exchanges|all|...]
             <name> <pattern> '{"max-length": N, "dead-letter-exchange": "x", ...}'
  clear_policy [-p <vhost>] <name>    list_policies [-p <vhost>]
  set_operator_policy [-p <vhost>] [--priority N] [--apply-to ...] <name> <pattern> <json>
  clear_operator_policy [-p <vhost>] <name>  list_operator_policies [-p <vhost>]
  set_global_parameter <name> <json>  clear_global_parameter <name>
  list_global_parameters              global runtime parameters (the MQTT vhost mappings
                                      mqtt_port_to_vhost_mapping, mqtt_default_vhosts:
                                      docs/mqtt.md)
  import_definitions <file.json>      a `rabbitmqctl export_definitions` file: users
                                      (RabbitMQ's sha256/sha512/md5 hashes), vhosts,
                                      permissions, topic permissions, limits, policies,
                                      operator policies, exchanges, queues, bindings
  export_definitions <file.json>      the same, in that layout ("-" for stdout)
  shovel_status                       dynamic shovels (docs/shovels.md)
  delete_shovel [-p <vhost>] <name>   restart_shovel [-p <vhost>] <name>
  replay_messages [-p <vhost>] <queue> [<destination>]   a dead-letter queue's messages
                                      back to their x-first-death-queue, or to a queue
  list_scheduled_messages [-p <vhost>]  delete_scheduled_message [-p <vhost>] <id>
                                      STOMP's AMQ_SCHEDULED_* jobs (docs/delays.md)
  trace_on [-p <vhost>] [--lifecycle] trace_off [-p <vhost>]   the firehose tracer:
                                      copies to amq.rabbitmq.trace (docs/management.md;
                                      --url too)
"""

# verb -> (argument names, rabbitmqctl's info line)
VERBS: dict[str, tuple[list[str], str]] = {
    "add_user": (["username", "password"], 'Adding user "{0}" ...'),
    "delete_user": (["username"], 'Deleting user "{0}" ...'),
    "change_password": (["username", "password"], 'Changing password for user "{0}" ...'),
    "set_user_tags": (["username", "tags*"], 'Setting tags for user "{0}" to [{tags}] ...'),
    "list_users": ([], "Listing users ..."),
    "add_vhost": (["vhost_name"], 'Adding vhost "{0}" ...'),
    "delete_vhost": (["vhost_name"], 'Deleting vhost "{0}" ...'),
    "list_vhosts": ([], "Listing vhosts ..."),
    "set_permissions": (["username", "conf", "write", "read"],
                        'Setting permissions for user "{0}" in vhost "{vhost}" ...'),
    "clear_permissions": (["username"],
                          'Clearing permissions for user "{0}" in vhost "{vhost}" ...'),
    "list_permissions": ([], 'Listing permissions for vhost "{vhost}" ...'),
    "list_user_permissions": (["username"], 'Listing permissions for user "{0}" ...'),
    "set_vhost_limits": (["definition"],
                         'Setting vhost limits to "{0}" for vhost "{vhost}" ...'),
    "clear_vhost_limits": ([], 'Clearing vhost "{vhost}" limits ...'),
    "list_vhost_limits": ([], 'Listing limits for vhost "{vhost}" ...'),
    "set_user_limits": (["username", "definition"],
                        'Setting user limits to "{1}" for user "{0}" ...'),
    "clear_user_limits": (["username", "limit_name"],
                          'Clearing "{1}" limit for user "{0}" ...'),
    "list_user_limits": ([], 'Listing limits for user "{user}" ...'),
    "set_topic_permissions": (["username", "exchange", "write", "read"],
                              'Setting topic permissions on "{1}" for user "{0}" in vhost '
                              '"{vhost}" ...'),
    "clear_topic_permissions": (["username", "exchange?"],
                                'Clearing topic permissions{on} for user "{0}" in vhost '
                                '"{vhost}" ...'),
    "list_topic_permissions": ([], 'Listing topic permissions for vhost "{vhost}" ...'),
    "list_user_topic_permissions": (["username"],
                                    'Listing topic permissions for user "{0}" ...'),
    "set_vm_memory_high_watermark": (["value*"], "Setting memory threshold to {all} ..."),
    "set_disk_free_limit": (["value*"], "Setting disk free limit to {all} ..."),
    "alarms": ([], "Listing resource alarms ..."),
    "set_policy": (["name", "pattern", "definition"],
                   'Setting policy "{0}" for pattern "{1}" to "{2}" with priority '
                   '"{priority}" for vhost "{vhost}" ...'),
    "clear_policy": (["name"], 'Clearing policy "{0}" on vhost "{vhost}" ...'),
    "list_policies": ([], 'Listing policies for vhost "{vhost}" ...'),
    "set_operator_policy": (["name", "pattern", "definition"],
                            'Setting operator policy override "{0}" for pattern "{1}" to '
                            '"{2}" with priority "{priority}" for vhost "{vhost}" ...'),
    "clear_operator_policy": (["name"],
                              'Clearing operator policy "{0}" on vhost "{vhost}" ...'),
    "list_operator_policies": ([], 'Listing operator policy overrides for vhost "{vhost}" ...'),
    "set_global_parameter": (["name", "value"],
                             'Setting global runtime parameter "{0}" to "{1}" ...'),
    "clear_global_parameter": (["name"], 'Clearing global runtime parameter "{0}" ...'),
    "list_global_parameters": ([], "Listing global runtime parameters ..."),
    "import_definitions": (["file"], 'Importing definitions in JSON from a file at '
                                     '"{0}" ...'),
    "export_definitions": (["file"], 'Exporting definitions in JSON to a file at "{0}" ...'),
    "trace_on": ([], 'Starting tracing for vhost "{vhost}" ...'),
    "trace_off": ([], 'Stopping tracing for vhost "{vhost}" ...'),
    "list_scheduled_messages": ([], 'Listing scheduled messages for vhost "{vhost}" ...'),
    "delete_scheduled_message": (["id"], 'Deleting scheduled message "{0}" in vhost '
                                         '"{vhost}" ...'),
    # the shovel verbs: the server words the status and restart lines (its node name)
    "shovel_status": ([], ""),
    "delete_shovel": (["name"], "Deleting shovel {0} in vhost {vhost}"),
    "restart_shovel": (["name"], ""),
    "replay_messages": (["queue", "destination?"],
                        'Replaying the messages of queue "{0}" in vhost "{vhost}" ...'),
}
VHOST_VERBS = {"set_permissions", "clear_permissions", "list_permissions",
               "set_vhost_limits", "clear_vhost_limits", "list_vhost_limits",
               "set_topic_permissions", "clear_topic_permissions", "list_topic_permissions",
               "set_policy", "clear_policy", "list_policies", "set_operator_policy",
               "clear_operator_policy", "list_operator_policies",
               "trace_on", "trace_off", "list_scheduled_messages",
               "delete_scheduled_message", "delete_shovel", "restart_shovel",
               "replay_messages"}
SET_POLICY_VERBS = ("set_policy", "set_operator_policy")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir", type=Path, default=Path("./ackmq-data"),
                   help="the broker's data dir (its admin socket is ctl.sock there)")
    p.add_argument("--socket", type=Path, default=None, help="the admin socket itself")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no informational line, only results (as rabbitmqctl -q)")
    p.add_argument("--url", default=None,
                   help="a remote broker's management API, http://user:pass@host:15672 "
                        "(the list_*/purge/delete/close/status/environment, definitions, "
                        "user, vhost, permission, policy and scheduled-message verbs), "
                        "instead of the admin socket")
    sub = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    from ackmq.ctl import topology
    topology.add_parsers(sub)
    from ackmq.ctl import awaiting
    awaiting.add_parsers(sub)
    for verb, (names, _info) in VERBS.items():
        vp = sub.add_parser(verb)
        if verb in VHOST_VERBS:
            vp.add_argument("-p", "--vhost", default="/", help="virtual host (default /)")
        if verb == "list_user_limits":
            vp.add_argument("--user", required=True, help="the user whose limits to list")
        if verb in SET_POLICY_VERBS:
            vp.add_argument("--priority", default="0", help="higher wins (default 0)")
            vp.add_argument("--apply-to", default="all",
                            help="queues, exchanges, all (default), classic_queues, "
                                 "quorum_queues, streams")
        if verb == "trace_on":
            vp.add_argument("--lifecycle", action="store_true",
                            help="also ackmq's own lifecycle events (docs/management.md)")
        for n in names:
            if n.endswith("*"):
                vp.add_argument(n[:-1], nargs="*")
            elif n.endswith("?"):
                vp.add_argument(n[:-1], nargs="?")
            else:
                vp.add_argument(n)


def run(args: argparse.Namespace) -> int:
    from ackmq.ctl import topology
    from ackmq.ctl.errors import CtlError
    from ackmq.ctl.http_client import HttpSource
    from ackmq.ctl.socket_client import SocketSource, request
    path = args.socket or args.data_dir / "ctl.sock"
    from ackmq.ctl import awaiting
    if args.verb in awaiting.VERBS:
        return awaiting.run(args, path)
    if args.verb in topology.VERBS or (args.url and args.verb in (
            "export_definitions", "import_definitions")):
        try:
            src: Any = HttpSource(args.url) if args.url else SocketSource(path)
        except CtlError as e:
            print(f"Error:\n{e.text}", file=sys.stderr)
            return e.code
        if args.verb in topology.VERBS:
            try:
                return topology.run(args, src)
            except (OSError, ValueError) as e:
                return _unreachable(path, e)
        return _definitions_http(args, src)
    # the verbs a management API serves too, each family's module doing them over --url
    # and formatting its listings (the API's JSON, whichever way it came) once
    from ackmq.ctl import access, global_parameters, policies, scheduled
    families = (access, policies, scheduled, global_parameters)
    over_url = {verb: family.handle for family in families for verb in family.VERBS}
    listings = {verb: f for family in families for verb, f in family.LISTINGS.items()}
    if args.url and args.verb not in over_url:
        print(f"Error:\n{args.verb} is not available with --url (the admin socket only)",
              file=sys.stderr)
        return 64
    names, info = VERBS[args.verb]
    values: list[str] = []
    for n in names:
        v = getattr(args, n.rstrip("*?"))
        if v is not None:
            values.extend(v if isinstance(v, list) else [v])
    vhost = getattr(args, "vhost", "/")
    if args.verb == "list_user_limits":
        values = [args.user]
    if getattr(args, "lifecycle", False):
        values = ["lifecycle"]
    if args.verb == "add_user" and not values[0]:  # rabbitmqctl refuses before asking
        from ackmq.broker.access import EMPTY_USER
        print(f"Error (argument validation): {EMPTY_USER}", file=sys.stderr)
        return 65
    if not args.quiet and info and not (args.verb == "export_definitions"
                                         and values[0] == "-"):
        on = f' on "{values[1]}"' if len(values) > 1 else ""  # clear_topic_permissions
        print(info.format(*values, vhost=vhost, tags=", ".join(values[1:]),
                          user=getattr(args, "user", ""), on=on, all=" ".join(values),
                          priority=getattr(args, "priority", "")))
    extra: dict[str, Any] = {}
    if args.verb == "import_definitions":
        try:
            extra["definitions"] = json.loads(Path(values[0]).read_text("utf-8"))
        except (OSError, ValueError) as e:
            print(f"Error:\ncannot read definitions from {values[0]}: {e}", file=sys.stderr)
            return 66
    try:
        if args.verb in SET_POLICY_VERBS:  # the API's body, for either way
            extra["body"] = policies.body(values + [args.priority, args.apply_to])
            values = values[:1]
        if args.verb == "set_global_parameter":
            extra["body"] = global_parameters.body(values)
            values = values[:1]
        if args.url:
            reply = over_url[args.verb](HttpSource(args.url), args.verb, values, vhost,
                                        extra.get("body"))
        else:
            reply = request(path, args.verb, values, vhost, **extra)
    except CtlError as e:
        print(f"Error:\n{e.text}", file=sys.stderr)
        return e.code
    except (OSError, ValueError) as e:
        return _unreachable(path, e)
    if not reply.get("ok"):
        print(f"Error:\n{reply.get('error')}", file=sys.stderr)
        return int(reply.get("code") or 1)
    if args.verb == "export_definitions":
        text = json.dumps(reply["definitions"], indent=2, sort_keys=True)
        if values[0] == "-":
            print(text)
        else:
            try:
                Path(values[0]).write_text(text + "\n", "utf-8")
            except OSError as e:
                print(f"Error:\ncannot write definitions to {values[0]}: {e}", file=sys.stderr)
                return 73
        return 0
    if reply.get("message"):  # trace_on/off: printed with -q too, as rabbitmqctl
        print(reply["message"])
    if reply.get("skipped"):
        print("not imported (ackmq has no model for them so far): "
              + ", ".join(reply["skipped"]))
    for refused in reply.get("refused") or []:
        print(f"not imported: {refused}")
    for note in reply.get("notes") or []:  # e.g. ha-* policy keys: no effect on one node
        print(note, file=sys.stderr)
    # list_*_limits: one JSON object, as rabbitmqctl prints it (nothing for a vhost
    # without limits, "{}" for a user without)
    if "items" in reply:  # a listing in the management API's JSON, either way (C6)
        reply["columns"], row = listings[args.verb]
        reply["rows"] = [row(item) for item in reply["items"]]
    if "json" in reply and (reply["json"] or args.verb == "list_user_limits"):
        print(json.dumps(reply["json"], separators=(",", ":"), sort_keys=True))
    if reply.get("rows"):  # rabbitmqctl prints no header for an empty list
        if reply.get("columns"):  # (nor any for list_user_topic_permissions)
            print("\t".join(reply["columns"]))
        for row in reply["rows"]:
            print("\t".join(row))
    return 0


def _unreachable(path: Path, e: BaseException) -> int:
    print(f"Error: cannot reach the broker's admin socket {path}: "
          f"{getattr(e, 'strerror', None) or e}.\nIs `ackmq serve --data-dir "
          f"{path.parent}` running? (give its data dir with --data-dir, or --socket; or "
          "--url for a broker's management API)", file=sys.stderr)
    return 69


def _definitions_http(args: argparse.Namespace, src: Any) -> int:
    """export/import_definitions with --url: GET/POST /api/definitions."""
    from ackmq.ctl.errors import CtlError
    try:
        if args.verb == "export_definitions":
            text = json.dumps(src.call("GET", "/api/definitions"), indent=2, sort_keys=True)
            if args.file == "-":
                print(text)
            else:
                if not args.quiet:
                    print(f'Exporting definitions in JSON to a file at "{args.file}" ...')
                Path(args.file).write_text(text + "\n", "utf-8")
            return 0
        if not args.quiet:
            print(f'Importing definitions in JSON from a file at "{args.file}" ...')
        defs = json.loads(Path(args.file).read_text("utf-8"))
        src.call("POST", "/api/definitions", defs)
        return 0
    except CtlError as e:
        print(f"Error:\n{e.text}", file=sys.stderr)
        return e.code
    except (OSError, ValueError) as e:
        print(f"Error:\n{args.file}: {e}", file=sys.stderr)
        return 66
