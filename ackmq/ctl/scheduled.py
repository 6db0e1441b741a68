"""`ackmq ctl`'s scheduled-message verbs (list_scheduled_messages,
delete_scheduled_message; ackmq's own), once for both ways to a broker (C6): the admin
socket (server/ctl/scheduled.py) and, with `--url`, ackmq's /api/scheduled both answer
the listing in that route's JSON, formatted here; refusals in the socket's words (65: no
such vhost, 69: no such job)."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from ackmq.ctl.errors import CtlError
from ackmq.ctl.http_client import HttpSource

VERBS = ("list_scheduled_messages", "delete_scheduled_message")
COLUMNS = ["id", "exchange", "routing_key", "user", "next_run", "delay", "period", "repeat",
           "repeats_left", "cron"]
# listing verb -> (columns, the row of one item of the API's JSON)
LISTINGS = {"list_scheduled_messages": (COLUMNS, lambda j: [str(j[c]) for c in COLUMNS])}


def handle(src: HttpSource, verb: str, args: list[str], vhost: str,
           body: Any = None) -> dict[str, Any]:
    """The verb over the management API, answered as the admin socket answers it."""
    where = f"/api/scheduled/{quote(vhost, safe='')}"
    try:
        if verb == "list_scheduled_messages":
            return {"ok": True, "items": src.call("GET", where)}
        src.call("DELETE", f"{where}/{quote(args[0], safe='')}")
        return {"ok": True}
    except CtlError as e:
        if e.code != 69:
            return {"ok": False, "code": e.code, "error": e.text}
    # 404: no such vhost, or no such job in it
    try:
        src.call("GET", f"/api/vhosts/{quote(vhost, safe='')}")
    except CtlError:
        return {"ok": False, "code": 65, "error": f"Virtual host '{vhost}' does not exist"}
    return {"ok": False, "code": 69, "error": f"Scheduled message '{args[0]}' in vhost "
                                              f"'{vhost}' does not exist"}
