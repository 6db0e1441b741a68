"""The admin socket's verbs for ActiveMQ-style scheduled messages (issue 34):
`list_scheduled_messages [-p vhost]` and `delete_scheduled_message [-p vhost] <job id>`
(ackmq's own; rabbitmqctl has no scheduler). Exit codes as the other verbs: 65 for a
missing vhost, 69 for a job that does not exist. The listing is /api/scheduled's JSON
(`items`), formatted by ackmq/ctl/scheduled.py (C6)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ackmq.broker import scheduled
from ackmq.broker.access import AccessError
from ackmq.server import views
from ackmq.server.ctl.errors import nargs

if TYPE_CHECKING:
    from ackmq.server.context import HttpContext

VERBS = ("list_scheduled_messages", "delete_scheduled_message")


def handle(ctx: HttpContext, verb: str, args: list[str], vhost: str) -> dict[str, Any]:
    vh = ctx.broker.vhosts.get(vhost)
    if vh is None:
        raise AccessError(f"Virtual host '{vhost}' does not exist", 65)
    store = scheduled.existing(vh)
    if verb == "list_scheduled_messages":
        nargs(args, 0, "list_scheduled_messages [-p <vhost>]")
        return {"ok": True, "items": views.scheduled_jobs(vh)}
    nargs(args, 1, "delete_scheduled_message [-p <vhost>] <id>")
    if store is None or not store.cancel(scheduled.job_is(args[0])):
        raise AccessError(f"Scheduled message '{args[0]}' in vhost '{vhost}' does not "
                          "exist", 69)
    return {"ok": True}
