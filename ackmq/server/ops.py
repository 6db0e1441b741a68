"""The management operations, once for every management front end (the HTTP API and
the web UI in server/http/, the `ackmq ctl` socket in server/ctl/): publish (confirmed),
get, purge, delete a queue, close a connection.

Each is done the way an AMQP client would: through a short-lived `ChannelModel` of the
logged-in user, so the same permission checks (U3), exclusivity, limits and RabbitMQ
texts apply as for a publish, get or purge over AMQP (RabbitMQ's management plugin
likewise opens an internal channel as the user). `user=None` is the admin socket's
owner, who owns the broker (rabbitmqctl's verbs check nothing).

Errors: the model's `ReplyError`s go up as they are (the UI shows their text, the API
answers `http_error(e)`); a bad argument is an `OpError`, RabbitMQ's JSON error.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ackmq.broker.access import ChannelAccess
from ackmq.broker.errors import ACCESS_REFUSED, NOT_FOUND, REPLY_TEXT, ReplyError
from ackmq.protocol.amqp.property_names import RABBIT_NAMES, RABBIT_TO_PAMQP, to_pamqp
from ackmq.server.views import jsonable

if TYPE_CHECKING:
    from ackmq.server.context import HttpContext

ACKMODES = ("ack_requeue_true", "ack_requeue_false", "reject_requeue_true",
            "reject_requeue_false")
PROPERTY_FIELDS = RABBIT_NAMES  # RabbitMQ's names for the basic properties


class OpError(Exception):
    """A refused operation, as RabbitMQ's management JSON error (the API answers it;
    the UI shows `reason`)."""

    def __init__(self, status: int, err: str, reason: str, shown: Any = None) -> None:
        """`shown`: the reason as RabbitMQ's JSON has it when that is not a string
        (["not_boolean", "yes"])."""
        super().__init__(reason)
        self.status, self.err, self.reason, self.shown = status, err, reason, shown


def not_found() -> OpError:
    return OpError(404, "Object Not Found", "Not Found")


def bad_request(reason: str) -> OpError:
    return OpError(400, "bad_request", reason)


def http_error(e: ReplyError) -> OpError:
    """rabbit_mgmt_util's mapping of a channel's close: 404 NOT_FOUND keeps its text,
    403 ACCESS_REFUSED is 401 "Access refused.", anything else a 400 without the
    code's name."""
    if e.code == NOT_FOUND:
        return OpError(404, "not_found", e.text)
    if e.code == ACCESS_REFUSED:
        return OpError(401, "not_authorised", "Access refused.")
    prefix = REPLY_TEXT.get(e.code, "") + " - "
    text = e.text[len(prefix):] if e.text.startswith(prefix) else e.text
    return OpError(400, "bad_request", text)


@contextmanager
def as_http() -> Iterator[None]:
    """A model refusal inside the block is answered over HTTP as `http_error` maps it."""
    try:
        yield
    except ReplyError as e:
        raise http_error(e) from None


class _Output:
    """The ChannelOutput of a management channel: the confirm of its publish."""

    def __init__(self) -> None:
        self.confirmed: asyncio.Future[bool] | None = None

    def deliver(self, consumer: Any, delivery_tag: int, entry: Any) -> None:
        raise AssertionError("a management channel has no consumers")

    def unroutable(self, message: Any) -> None:
        """`basic_publish` returns it (C2)."""

    def confirm(self, ack: bool, delivery_tag: int, multiple: bool) -> None:
        if self.confirmed is not None and not self.confirmed.done():
            self.confirmed.set_result(ack)

    cancel_notify = False

    def consumer_cancelled(self, consumer_tag: str, reason: str = "") -> None:
        pass

    def close(self, code: int, text: str) -> None:
        pass


class _Owner:
    """Stands for the connection a management channel has none of."""

    user = ""
    peer = None


class MgmtChannel:
    """`with MgmtChannel(server, user, vhost) as ch:` a model channel with the user's
    permission checks; closed (anything unacked requeued) on exit."""

    def __init__(self, server: HttpContext, user: str | None, vhost: str) -> None:
        self.server = server
        vh = server.broker.vhosts.get(vhost)
        if vh is None:
            raise OpError(404, "not_found", "vhost_not_found")
        self.out = _Output()
        self.model = server.broker.open_channel(vh, _Owner(), self.out, user or "")
        if user is not None:
            self.model.access = ChannelAccess(server.access, user, vhost)
        else:  # the admin socket: rabbitmqctl's verbs check nothing
            self.model.superuser = True

    def __enter__(self) -> Any:
        return self.model

    def __exit__(self, *exc: Any) -> None:
        self.model.close()
        self.server.request_flush()


# -- publish (POST /api/exchanges/v/x/publish) -------------------------------------------
def encode_properties(props: Any) -> bytes:
    from pamqp.commands import Basic

    from ackmq.protocol.amqp import encode_properties as encode
    if isinstance(props, list) and not props:
        props = {}  # RabbitMQ's UI sends [] for no properties
    if not isinstance(props, dict):
        raise bad_request("properties must be a JSON object")
    unknown = sorted(set(props) - set(PROPERTY_FIELDS))
    if unknown:
        raise bad_request(f"unknown properties: {', '.join(unknown)}")
    kw = {k: v for k, v in props.items() if v is not None}
    try:
        for k in ("delivery_mode", "priority", "timestamp"):
            if k in kw:
                kw[k] = int(kw[k])
        if "timestamp" in kw:
            import datetime
            kw["timestamp"] = datetime.datetime.fromtimestamp(kw["timestamp"],
                                                              datetime.UTC)
        if "headers" in kw and not isinstance(kw["headers"], dict):
            raise bad_request("headers must be a JSON object")
        cluster_id = kw.pop("cluster_id", None)
        p = Basic.Properties(**to_pamqp(kw))
        if cluster_id is not None:  # deprecated in 0-9-1: pamqp refuses it in its
            p.cluster_id = str(cluster_id)  # constructor, RabbitMQ carries it
        return encode(p)
    except (TypeError, ValueError) as e:
        raise bad_request(f"invalid properties: {e}") from e


def decode_payload(body: dict[str, Any]) -> bytes:
    missing = [k for k in ("properties", "payload", "payload_encoding") if k not in body]
    if "routing_key" not in body:
        missing.insert(0, "routing_key")
    if missing:
        raise bad_request("[" + ",\n ".join(f"{{key_missing,{k}}}" for k in missing) + "]")
    enc, payload = body["payload_encoding"], body["payload"]
    if not isinstance(payload, str):
        raise bad_request("payload_not_string")
    if enc == "string":
        return payload.encode("utf-8")
    if enc == "base64":
        try:
            return base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise _refused("not_base64", payload) from None
    raise _refused("unsupported_encoding", enc)


def _refused(what: str, value: Any) -> OpError:
    """RabbitMQ's two-element reason: ["not_int", "priority"]."""
    return OpError(400, "bad_request", f"{what}: {value}", [what, value])


_INTEGERS = ("delivery_mode", "priority", "timestamp")


def rabbit_properties(props: Any) -> Any:
    """The API's `properties` as RabbitMQ's to_basic_properties takes them: unknown
    names ignored; delivery_mode, priority and timestamp JSON integers (else
    ["not_int", name]), the others strings (["not_string", name]), no null in the
    headers ("null_not_allowed"); names checked in order, the first refusal answered."""
    if not isinstance(props, dict):
        return props
    known = {k: v for k, v in props.items() if k in PROPERTY_FIELDS}
    for k in sorted(known):
        v = known[k]
        if k == "headers":
            if v == []:  # JSON's empty object as Erlang writes it
                known[k] = {}
            elif _has_null(v):
                raise bad_request("null_not_allowed")
        elif k in _INTEGERS:
            if not isinstance(v, int) or isinstance(v, bool):
                raise _refused("not_int", k)
        elif not isinstance(v, str):
            raise _refused("not_string", k)
    return known


def _has_null(v: Any) -> bool:
    if v is None:
        return True
    if isinstance(v, dict):
        return any(_has_null(x) for x in v.values())
    if isinstance(v, list):
        return any(_has_null(x) for x in v)
    return False


async def publish(server: HttpContext, user: str, vhost: str, exchange: str,
                  routing_key: str, properties: bytes, payload: bytes,
                  mandatory: bool = True) -> bool:
    """Publish on a confirm channel and return once the message is where a confirm
    would say it is (fsynced if persistent and queued durably): True if it was routed.
    A refusal of the model is its ReplyError; a queue's nack (x-overflow
    reject-publish) an OpError with RabbitMQ's text."""
    loop = asyncio.get_running_loop()
    with MgmtChannel(server, user, vhost) as ch:
        out = ch.output
        out.confirmed = loop.create_future()
        ch.confirm_select()
        _seq, routed = ch.basic_publish(exchange, routing_key, mandatory, False, properties,
                                        payload)
        server.request_flush()
        async with asyncio.timeout(60):  # (not wait_for: 3.11's may drop a cancel)
            ok = await out.confirmed
        if not ok:  # a queue refused it (x-overflow reject-publish), as RabbitMQ says
            raise bad_request("rejected Unable to publish message. Check queue limits.")
        return routed


async def publish_json(server: HttpContext, user: str, vhost: str, exchange: str,
                       body: dict[str, Any]) -> dict[str, bool]:
    """POST /api/exchanges/v/x/publish: RabbitMQ's body in, `{"routed": …}` out."""
    payload = decode_payload(body)
    props = encode_properties(rabbit_properties(body["properties"]))
    rk = body["routing_key"]
    if not isinstance(rk, str):
        raise bad_request("routing_key must be a string")
    try:
        routed = await publish(server, user, vhost, exchange, rk, props, payload)
    except ReplyError as e:
        if e.code == ACCESS_REFUSED:
            raise http_error(e) from None
        # RabbitMQ: a publish's failure is a 400 with the code and the channel's text
        raise bad_request(f"{e.code} {e.text}") from None
    return {"routed": routed}


# -- get (POST /api/queues/v/q/get) -----------------------------------------------------
def _properties_json(raw: bytes) -> dict[str, Any]:
    from ackmq.protocol.amqp import decode_properties
    p = decode_properties(raw)
    out: dict[str, Any] = {}
    for k, attr in RABBIT_TO_PAMQP.items():
        v = getattr(p, attr, None)
        if v is None or (k == "cluster_id" and v == ""):
            continue
        if k == "timestamp" and hasattr(v, "timestamp"):
            v = int(v.timestamp())
        out[k] = jsonable(v)
    return out


def _payload(body: bytes, encoding: str, truncate: int | None) -> dict[str, Any]:
    shown = body if truncate is None else body[:truncate]
    if encoding == "auto":
        try:
            return {"payload": shown.decode("utf-8"), "payload_encoding": "string"}
        except UnicodeDecodeError:
            pass
    return {"payload": base64.b64encode(shown).decode(), "payload_encoding": "base64"}


def message_json(entry: Any, remaining: int, encoding: str = "auto",
                 truncate: int | None = None) -> dict[str, Any]:
    """One message as RabbitMQ's get shows it (the get and peek answers' items)."""
    m = entry.message
    return {"payload_bytes": len(m.body), "redelivered": entry.redelivered,
            "exchange": m.exchange, "routing_key": m.routing_key,
            "message_count": remaining,
            # none: [] as RabbitMQ (Erlang's empty list)
            "properties": _properties_json(m.properties) or [],
            **_payload(m.body, encoding, truncate)}


def get_json(server: HttpContext, user: str, vhost: str, queue: str,
             body: dict[str, Any]) -> list[dict[str, Any]]:
    """POST /api/queues/v/q/get: RabbitMQ's body checked, the model's refusal as
    RabbitMQ's HTTP answer."""
    missing = [k for k in ("count", "ackmode", "encoding") if k not in body]
    if missing:
        raise bad_request("[" + ",\n ".join(f"{{key_missing,{k}}}" for k in missing) + "]")
    count, ackmode, encoding = body["count"], body["ackmode"], body["encoding"]
    if isinstance(count, str) and count.isdigit():
        count = int(count)
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise bad_request("count must be a non-negative integer")
    if ackmode not in ACKMODES:
        raise bad_request(f"ackmode must be one of {', '.join(ACKMODES)}")
    if encoding not in ("auto", "base64"):
        raise bad_request("Unsupported encoding. Please use auto or base64.")
    truncate = body.get("truncate")
    if truncate in ("", None):
        truncate = None
    elif not isinstance(truncate, int) or truncate < 0:
        raise bad_request("truncate must be a non-negative integer")
    try:
        return get(server, user, vhost, queue, count, ackmode, encoding, truncate)
    except ReplyError as e:
        raise get_refusal(e) from None


def get_refusal(e: ReplyError) -> OpError:
    """A get's (or a peek's) refusal by the model as RabbitMQ's HTTP answer."""
    if e.code in (NOT_FOUND, ACCESS_REFUSED):
        return http_error(e)
    # RabbitMQ's get (unlike purge and delete) keeps the close's code and name
    reason = http_error(e).reason
    return bad_request(f"{e.code} {REPLY_TEXT.get(e.code, '')} - {reason}")


def get(server: HttpContext, user: str, vhost: str, queue: str, count: int,
        ackmode: str, encoding: str = "auto", truncate: int | None = None
        ) -> list[dict[str, Any]]:
    """Up to `count` messages as RabbitMQ's get shows them; `ackmode` (ACKMODES) says
    whether they are acked (gone) or put back in place."""
    out: list[dict[str, Any]] = []
    with MgmtChannel(server, user, vhost) as ch:
        tags = []
        for _ in range(count):
            got = ch.basic_get(queue, False)
            if got is None:
                break
            tag, entry, remaining = got
            tags.append(tag)
            out.append(message_json(entry, remaining, encoding, truncate))
        if tags:
            if ackmode == "ack_requeue_false":
                ch.basic_ack(tags[-1], True)
            else:
                ch.basic_nack(tags[-1], True, ackmode == "ack_requeue_true"
                              or ackmode == "reject_requeue_true")
    return out


# -- purge, delete, close -----------------------------------------------------------------
def purge(server: HttpContext, user: str | None, q: Any) -> int:
    """Purge the ready messages of `q`: the purge verb (read on it, not another
    connection's exclusive queue), as a queue.purge over AMQP."""
    with MgmtChannel(server, user, q.vhost.name) as ch:
        return int(ch.purge(q.name))


def delete_queue(server: HttpContext, user: str | None, q: Any, if_unused: bool = False,
                 if_empty: bool = False) -> int:
    """Delete `q` with the delete verb (configure on it), as queue.delete; the messages
    it held."""
    with MgmtChannel(server, user, q.vhost.name) as ch:
        return int(ch.delete_queue(q.name, if_unused, if_empty))


def close_connection(server: HttpContext, conn: Any, reason: str) -> None:
    """320 CONNECTION_FORCED with `reason`, whatever the connection's protocol."""
    conn.force_close(reason)
    server.request_flush()
