"""The admin endpoint `ackmq ctl` talks to: a Unix socket `ctl.sock` in the data dir,
mode 0600 (whoever can read the data dir's files owns the broker anyway). `ackmq ctl
--url` reaches a remote broker over the management HTTP API instead (ctl_http.py).

One JSON object a line each way: `{"verb": "add_user", "args": [...], "vhost": "/"}` ->
`{"ok": true, "columns": [...], "rows": [[...], ...]}` or `{"ok": false, "code": 67,
"error": "User \"x\" does not exist"}` (rabbitmqctl's exit codes and texts).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ackmq.broker.access import AccessError

if TYPE_CHECKING:
    from ackmq.server.server import Server

log = logging.getLogger("ackmq.admin")

USAGE = 64  # rabbitmqctl's exit code for bad arguments
REQUEST_LIMIT = 256 * 1024 * 1024  # one request line at most (import_definitions)


def _nargs(args: list[str], n: int, usage: str) -> None:
    if len(args) != n:
        raise AccessError(f"wrong number of arguments: usage: {usage}", USAGE)


class AdminServer:
    def __init__(self, server: Server) -> None:
        self.server = server
        self.path: Path | None = None
        self._srv: asyncio.AbstractServer | None = None

    async def start(self, path: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # a stale socket from a killed broker
        old = os.umask(0o177)  # created 0600: no window in which others may connect
        try:
            # a request is one line: a definitions file can be far above asyncio's
            # 64 KiB default line limit (a RabbitMQ export with its queues)
            self._srv = await asyncio.start_unix_server(self._client, path=str(path),
                                                        limit=REQUEST_LIMIT)
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
        self.path = path

    async def stop(self) -> None:
        if self._srv is not None:
            self._srv.close()
            await self._srv.wait_closed()
        if self.path is not None:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                try:
                    req = json.loads(line)
                    if req["verb"] == "import_definitions":
                        reply = self.import_definitions(req["definitions"])
                    elif req["verb"] == "export_definitions":
                        reply = self.export_definitions()
                    else:
                        reply = self.handle(req["verb"], [str(a) for a in req.get("args", [])],
                                            str(req.get("vhost") or "/"))
                except AccessError as e:
                    reply = {"ok": False, "code": e.code, "error": e.text}
                except (ValueError, KeyError, TypeError) as e:
                    reply = {"ok": False, "code": USAGE, "error": f"bad request: {e}"}
                except OSError as e:  # access.json could not be written (disk full, ...)
                    log.error("saving the access model failed: %s", e)
                    reply = {"ok": False, "code": 74, "error": (
                        f"the change could not be saved ({e}): it is in effect now but "
                        "will be lost on restart unless saved by a later change")}
                except Exception as e:  # never leave ctl without an answer
                    log.exception("admin request failed")
                    reply = {"ok": False, "code": 70, "error": f"internal error: {e!r}"}
                writer.write(json.dumps(reply).encode() + b"\n")
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        except ValueError:  # a line above REQUEST_LIMIT: say so rather than hang up
            with contextlib.suppress(ConnectionError, OSError):
                writer.write(json.dumps({"ok": False, "code": USAGE, "error": (
                    f"request above {REQUEST_LIMIT >> 20} MiB")}).encode() + b"\n")
                await writer.drain()
        finally:
            writer.close()

    def import_definitions(self, defs: dict[str, Any]) -> dict[str, Any]:
        """A RabbitMQ definitions file (server/definitions.py): users (their hashes as
        exported: sha256, sha512 or md5), vhosts, permissions, topic permissions,
        limits, exchanges, queues and bindings; the reply names what was skipped
        (policies, other parameters) and what the broker refused (with its text)."""
        from ackmq.server import definitions
        try:
            done = definitions.import_(self.server, defs)
        except definitions.DefinitionsError as e:
            raise AccessError(str(e), USAGE) from None
        return {"ok": True, "skipped": done["skipped"], "refused": done["refused"]}

    def export_definitions(self) -> dict[str, Any]:
        """The whole broker in `rabbitmqctl export_definitions`' layout."""
        from ackmq.server import definitions
        return {"ok": True, "definitions": definitions.export(self.server)}

    def handle(self, verb: str, args: list[str], vhost: str) -> dict[str, Any]:
        """One rabbitmqctl verb against the live access model (durable before the reply)."""
        a = self.server.access
        ok: dict[str, Any] = {"ok": True}
        if verb == "add_user":
            _nargs(args, 2, "add_user <username> <password>")
            a.add_user(args[0], args[1])
        elif verb == "delete_user":
            _nargs(args, 1, "delete_user <username>")
            a.delete_user(args[0])
        elif verb == "change_password":
            _nargs(args, 2, "change_password <username> <password>")
            a.change_password(args[0], args[1])
        elif verb == "set_user_tags":
            if not args:
                raise AccessError("wrong number of arguments: usage: set_user_tags "
                                  "<username> <tag> [...]", USAGE)
            a.set_user_tags(args[0], args[1:])
        elif verb == "list_users":
            _nargs(args, 0, "list_users")
            return {**ok, "columns": ["user", "tags"],
                    "rows": [[u.name, "[" + ", ".join(u.tags) + "]"]
                             for u in a.users.values()]}
        elif verb == "add_vhost":
            _nargs(args, 1, "add_vhost <vhost>")
            a.add_vhost(args[0])
        elif verb == "delete_vhost":
            _nargs(args, 1, "delete_vhost <vhost>")
            a.delete_vhost(args[0])
        elif verb == "list_vhosts":
            _nargs(args, 0, "list_vhosts")
            return {**ok, "columns": ["name"], "rows": [[n] for n in a.vhosts]}
        elif verb == "set_permissions":
            _nargs(args, 4, "set_permissions [-p <vhost>] <username> <conf> <write> <read>")
            a.set_permissions(args[0], vhost, *args[1:])
        elif verb == "clear_permissions":
            _nargs(args, 1, "clear_permissions [-p <vhost>] <username>")
            a.clear_permissions(args[0], vhost)
        elif verb == "list_permissions":
            _nargs(args, 0, "list_permissions [-p <vhost>]")
            if vhost not in a.vhosts:
                raise AccessError(f"Virtual host '{vhost}' does not exist", 65)
            return {**ok, "columns": ["user", "configure", "write", "read"],
                    "rows": [[u, p.configure, p.write, p.read]
                             for (u, v), p in a.permissions.items() if v == vhost]}
        elif verb == "list_user_permissions":
            _nargs(args, 1, "list_user_permissions <username>")
            if args[0] not in a.users:
                raise AccessError(f"User \"{args[0]}\" does not exist", 69)
            return {**ok, "columns": ["vhost", "configure", "write", "read"],
                    "rows": [[v, p.configure, p.write, p.read]
                             for (u, v), p in a.permissions.items() if u == args[0]]}
        elif verb == "set_topic_permissions":
            _nargs(args, 4, "set_topic_permissions [-p <vhost>] <username> <exchange> "
                            "<write> <read>")
            a.set_topic_permissions(args[0], vhost, *args[1:])
        elif verb == "clear_topic_permissions":
            if len(args) not in (1, 2):
                raise AccessError("wrong number of arguments: usage: clear_topic_permissions "
                                  "[-p <vhost>] <username> [<exchange>]", USAGE)
            a.clear_topic_permissions(args[0], vhost, args[1] if len(args) == 2 else None)
        elif verb == "list_topic_permissions":
            _nargs(args, 0, "list_topic_permissions [-p <vhost>]")
            if vhost not in a.vhosts:
                raise AccessError(f"Virtual host '{vhost}' does not exist", 65)
            return {**ok, "columns": ["user", "exchange", "write", "read"],
                    "rows": [[u, x, t.write, t.read]
                             for (u, v), by_x in a.topic_permissions.items() if v == vhost
                             for x, t in by_x.items()]}
        elif verb == "list_user_topic_permissions":
            _nargs(args, 1, "list_user_topic_permissions <username>")
            if args[0] not in a.users:
                raise AccessError(f'{{:no_such_user, "{args[0]}"}}', 69)
            # RabbitMQ 3.10 prints this list without a header line
            return {**ok, "columns": None,
                    "rows": [[v, x, t.write, t.read]
                             for (u, v), by_x in a.topic_permissions.items() if u == args[0]
                             for x, t in by_x.items()]}
        elif verb in ("set_vhost_limits", "set_user_limits"):
            n = 1 if verb == "set_vhost_limits" else 2
            _nargs(args, n, "set_vhost_limits [-p <vhost>] <json>" if n == 1 else
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
            _nargs(args, 0, "clear_vhost_limits [-p <vhost>]")
            a.clear_vhost_limits(vhost)
        elif verb == "clear_user_limits":
            _nargs(args, 2, "clear_user_limits <username> <limit>|all")
            a.clear_user_limits(args[0], args[1])
        elif verb == "list_vhost_limits":
            _nargs(args, 0, "list_vhost_limits [-p <vhost>]")
            if vhost not in a.vhosts:
                raise AccessError(f"Virtual host '{vhost}' does not exist", 65)
            return {**ok, "json": a.vhosts[vhost].get("limits", {})}
        elif verb == "list_user_limits":
            _nargs(args, 1, "list_user_limits --user <username>")
            if args[0] not in a.users:
                raise AccessError(f"User \"{args[0]}\" does not exist", 69)
            return {**ok, "json": a.user_limits.get(args[0], {})}
        elif verb in ("list_items", "node_status", "purge_queue", "delete_queue",
                      "close_connection"):
            return self.topology(verb, args, vhost)
        elif verb in ("set_vm_memory_high_watermark", "set_disk_free_limit", "alarms"):
            return self.alarms(verb, args)
        else:
            raise AccessError(f"unknown verb '{verb}'", USAGE)
        return ok

    def topology(self, verb: str, args: list[str], vhost: str) -> dict[str, Any]:
        """M4's verbs (server/ctl_ops.py): listings in the management API's JSON, which
        `ackmq ctl` turns into rabbitmqctl's columns; purge, delete, close."""
        from ackmq.server import ctl_ops
        srv = self.server
        if verb == "list_items":  # args: [kind] or [kind, "all"] for every vhost
            if not args:  # (found by the admin-socket fuzzer: was an IndexError)
                raise AccessError("wrong number of arguments: usage: list_items <kind> "
                                  "[all]", USAGE)
            return {"ok": True, "items": ctl_ops.items(
                srv, args[0], None if args[1:] == ["all"] else vhost)}
        if verb == "node_status":
            return {"ok": True, **ctl_ops.node(srv)}
        if verb == "purge_queue":
            _nargs(args, 1, "purge_queue [-p <vhost>] <queue>")
            return {"ok": True, "count": ctl_ops.purge_queue(srv, vhost, args[0])}
        if verb == "delete_queue":
            if not args:
                raise AccessError("wrong number of arguments: usage: delete_queue [-p "
                                  "<vhost>] <queue> [--if-empty] [--if-unused]", USAGE)
            return {"ok": True, "count": ctl_ops.delete_queue(
                srv, vhost, args[0], "if-empty" in args[1:], "if-unused" in args[1:])}
        _nargs(args, 2, "close_connection <connection name> <explanation>")
        ctl_ops.close_connection(srv, args[0], args[1])
        return {"ok": True}

    def alarms(self, verb: str, args: list[str]) -> dict[str, Any]:
        """U5 at run time, rabbitmqctl's `set_vm_memory_high_watermark <fraction> |
        absolute <value>` and `set_disk_free_limit <disk_limit> | mem_relative
        <fraction>` (exit 65 on a bad value, as rabbitmqctl), and the alarms now set."""
        from ackmq.server.alarms import parse_disk_limit, parse_watermark
        monitor = self.server.alarms
        if verb == "alarms":
            _nargs(args, 0, "alarms")
            lim = monitor.limits
            return {"ok": True, "columns": ["alarm", "used", "limit"], "rows": [
                [f"{r}", str(monitor.rss if r == "memory" else monitor.disk_free),
                 str(lim.memory_limit if r == "memory" else lim.disk_free_limit)]
                for r in sorted(lim.active)]}
        memory = verb == "set_vm_memory_high_watermark"
        keyword = "absolute" if memory else "mem_relative"
        if not (len(args) == 1 or (len(args) == 2 and args[0] == keyword)):
            raise AccessError("Bad argument.\nusage: " + (
                "set_vm_memory_high_watermark <fraction> | absolute <value>" if memory else
                "set_disk_free_limit <disk_limit> | mem_relative <fraction>"), 65)
        try:
            if memory:
                if len(args) == 2:
                    limit = parse_watermark("absolute:" + args[1])
                else:  # rabbitmqctl takes a fraction here, an amount after `absolute`
                    try:
                        fraction = float(args[0])
                    except ValueError:
                        raise AccessError("Bad argument.\nusage: set_vm_memory_high_"
                                          "watermark <fraction> | absolute <value>", 65) from None
                    if not 0.0 <= fraction <= 1.0:
                        raise ValueError("The threshold should be a fraction between "
                                         "0.0 and 1.0")
                    limit = parse_watermark(args[0])
                monitor.set_watermark(limit)
            else:
                limit = parse_disk_limit(("mem_relative:" if len(args) == 2 else "")
                                         + args[-1])
                monitor.set_disk_limit(limit)
        except ValueError as e:
            raise AccessError(f"Bad argument: {e}", 65) from e
        self.server.request_flush()
        return {"ok": True}
