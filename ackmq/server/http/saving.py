"""A request that changes something answers once the access model's change is on disk
(server/durable.py): the handlers change the model on the event loop, the writer thread
fsyncs access.json, and this middleware waits for it off the loop. A write that fails
(disk full) answers 500 with what happened: the change is in effect but not saved."""

from __future__ import annotations

import logging

from aiohttp import web

from ackmq.server import durable
from ackmq.server.http.app import SERVER_KEY, Handler, error

log = logging.getLogger("ackmq.http")
READS = frozenset(("GET", "HEAD", "OPTIONS"))


@web.middleware
async def wait_saved(request: web.Request, handler: Handler) -> web.StreamResponse:
    response = await handler(request)
    if request.method not in READS:
        try:
            await durable.access_saved(request.app[SERVER_KEY].access)
        except OSError as e:
            log.error("saving the access model failed: %s", e)
            return error(500, "internal_server_error", (
                f"the change could not be saved ({e}): it is in effect now but will be "
                "lost on restart unless saved by a later change"))
    return response
