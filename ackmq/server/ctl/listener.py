"""The admin endpoint `ackmq ctl` talks to: a Unix socket `ctl.sock` in the data dir,
mode 0600 (whoever can read the data dir's files owns the broker anyway). `ackmq ctl
--url` reaches a remote broker over the management HTTP API instead
(ackmq/ctl/http_client.py).

One JSON object a line each way: `{"verb": "add_user", "args": [...], "vhost": "/"}`
(and `"body"`: a JSON argument as the management API takes it) -> `{"ok": true}` with
`"items"` (a listing in the management API's JSON, formatted by `ackmq ctl` as it formats
the API's), or `"columns"`/`"rows"` (the verbs the API does not serve), or
`{"ok": false, "code": 67, "error": "User \"x\" does not exist"}` (rabbitmqctl's exit
codes and texts).
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
from ackmq.server import durable
from ackmq.server.ctl import verbs
from ackmq.server.ctl.errors import USAGE

if TYPE_CHECKING:
    from ackmq.server.context import HttpContext

log = logging.getLogger("ackmq.admin")

REQUEST_LIMIT = 256 * 1024 * 1024  # one request line at most (import_definitions)


class CtlListener:
    """The admin socket of one broker, on its management context."""

    def __init__(self, ctx: HttpContext) -> None:
        self.ctx = ctx
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
                        reply = verbs.handle(self.ctx, req["verb"],
                                             [str(a) for a in req.get("args", [])],
                                             str(req.get("vhost") or "/"), req.get("body"))
                    # the change on disk before the answer; the fsync off the loop
                    await durable.access_saved(self.ctx.access)
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
            done = definitions.import_(self.ctx, defs)
        except definitions.DefinitionsError as e:
            raise AccessError(str(e), USAGE) from None
        return {"ok": True, "skipped": done["skipped"], "refused": done["refused"]}

    def export_definitions(self) -> dict[str, Any]:
        """The whole broker in `rabbitmqctl export_definitions`' layout."""
        from ackmq.server import definitions
        return {"ok": True, "definitions": definitions.export(self.ctx)}
