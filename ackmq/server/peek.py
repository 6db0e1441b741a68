"""V3 peek: `POST /api/queues/<vhost>/<name>/peek` for the API and the UI — a queue's
messages looked at without being taken (JMS's QueueBrowser; LavinMQ's route of the same
name), answered as the same message objects as RabbitMQ's `/get`.

The body: `offset` (default 0; a stream's offset for a stream queue), `count` (default
10, at most MAX_COUNT), `state` (`ready`, the default, or `unacked`), `encoding` (`auto`
| `base64`) and `truncate` as `/get`. A bad field is a 400 naming it. The user needs what
a get needs (read on the queue), checked by the model's channel (`ChannelModel.browse`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ackmq.broker.browse import READY, STATES
from ackmq.broker.errors import ReplyError
from ackmq.server.ops import MgmtChannel, bad_request, get_refusal, message_json

if TYPE_CHECKING:
    from ackmq.server.context import HttpContext

MAX_COUNT = 1000  # messages in one answer: a page, not a dump


def _int_field(body: dict[str, Any], key: str, default: int, top: int | None) -> int:
    v = body.get(key, default)
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise bad_request(f"{key} must be a non-negative integer")
    if top is not None and v > top:
        raise bad_request(f"{key} must be at most {top}")
    return v


def parse(body: Any) -> tuple[int, int, str, str, int | None]:
    """(offset, count, state, encoding, truncate) from a peek's JSON body."""
    if not isinstance(body, dict):
        raise bad_request("not_json")
    offset = _int_field(body, "offset", 0, (1 << 63) - 1)
    count = _int_field(body, "count", 10, MAX_COUNT)
    state = body.get("state", READY)
    if state not in STATES:
        raise bad_request(f"state must be one of {', '.join(STATES)}")
    encoding = body.get("encoding", "auto")
    if encoding not in ("auto", "base64"):
        raise bad_request("Unsupported encoding. Please use auto or base64.")
    truncate = body.get("truncate")
    if truncate in ("", None):
        truncate = None
    elif not isinstance(truncate, int) or isinstance(truncate, bool) or truncate < 0:
        raise bad_request("truncate must be a non-negative integer")
    return offset, count, state, encoding, truncate


def peek_json(server: HttpContext, user: str | None, vhost: str, queue: str,
              body: Any) -> list[dict[str, Any]]:
    """The peek's answer. `message_count` is what a get of that message would say (the
    ready messages after it; for an unacked one the queue's ready count)."""
    offset, count, state, encoding, truncate = parse(body)
    channels = [model for conn in list(server.connections)
                for _n, model in conn.open_channels()]
    try:
        with MgmtChannel(server, user, vhost) as ch:
            q, entries = ch.browse(queue, state, offset, count, channels)
    except ReplyError as refused:
        raise get_refusal(refused) from None
    ready = q.message_count
    out = []
    for i, e in enumerate(entries):
        if state != READY:
            left = ready
        elif q.kind == "stream":
            left = max(0, q.log.next_offset - e.seq - 1) if q.log is not None else 0
        else:
            left = max(0, ready - offset - i - 1)
        out.append(message_json(e, left, encoding, truncate))
    return out
