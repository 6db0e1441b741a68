"""V4 replay: move a queue's messages (a dead-letter queue's above all) back to where
each came from (its `x-first-death-queue`) or to a named queue, through a dynamic shovel
with `src-delete-after` (so it is on-confirm safe, shows in /api/shovels while it runs,
and deletes itself when done). For the API (`POST /api/queues/<vhost>/<name>/replay`),
the UI's button and `ackmq ctl replay_messages`.

The body: `destination` (a queue; none: each message to its x-first-death-queue, one
without to the exchange and routing key it carries), `count` (the first N; none: the
queue's depth when the replay starts). The user needs read on the queue (checked as a
get's) and is the one the shovel runs as, so writing to the destination is checked by
the broker as for any publish of theirs."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ackmq.broker.browse import READY
from ackmq.broker.errors import ReplyError
from ackmq.server.ops import MgmtChannel, bad_request, get_refusal
from ackmq.server.parameters import ParameterError

if TYPE_CHECKING:
    from ackmq.server.context import HttpContext

BACK_KEY = "ackmq-dest-x-first-death-queue"  # the shovel's key (ackmq/shovel/config.py)


def _local(vhost: str) -> str:
    from urllib.parse import quote
    return "amqp:///" + quote(vhost, safe="")


def replay(server: HttpContext, user: str | None, vhost: str, queue: str,
           destination: str | None = None, count: int | None = None) -> dict[str, Any]:
    """Start the replay; returns the shovel's name and definition."""
    reg = server.parameters
    if reg is None or "shovel" not in reg.components:
        raise bad_request("replay needs the shovel component (ackmq serve)")
    if destination is not None and (not isinstance(destination, str) or not destination):
        raise bad_request("destination must be a queue name")
    if count is not None and (not isinstance(count, int) or isinstance(count, bool)
                              or count < 1):
        raise bad_request("count must be a positive integer")
    try:
        with MgmtChannel(server, user, vhost) as ch:
            ch.browse(queue, READY, 0, 0)  # read on the queue, as a get; 404 if none
    except ReplyError as e:
        raise get_refusal(e) from None
    value: dict[str, Any] = {"src-uri": _local(vhost), "src-queue": queue,
                             "dest-uri": _local(vhost), "ack-mode": "on-confirm",
                             "src-delete-after": count if count is not None else "queue-length"}
    if destination is not None:
        value["dest-queue"] = destination
    else:
        value[BACK_KEY] = True
    name = f"replay-{queue}-{int(time.time() * 1000)}"
    try:
        reg.set("shovel", vhost, name, value, user or "")
    except ParameterError as e:
        raise bad_request(e.reason) from None
    return {"shovel": name, "value": value}
