"""The management node `/management` (SPEC A7): RabbitMQ 4's HTTP-over-AMQP, so
rabbitmq-amqp-python-client declares and deletes what it uses. The client attaches a
link pair (a sender whose target and a receiver whose source are `/management`); each
request is a message with `to` = a path, `subject` = an HTTP method, `message-id`, and an
amqp-value body; the answer goes back on the pair's receiver with `correlation-id` = the
request's id, `subject` = the status code, and an amqp-value body:

    PUT    /queues/:q              declare (body: durable, exclusive, auto_delete,
                                   arguments) -> 200 + the queue's info; a different
                                   existing queue -> 409
    GET    /queues/:q              200 + info, 404
    DELETE /queues/:q              200 + {message_count}
    DELETE /queues/:q/messages     purge -> 200 + {message_count}, 404
    PUT    /exchanges/:x           declare (type, durable, auto_delete, internal,
                                   arguments) -> 204, 409
    DELETE /exchanges/:x           204
    POST   /bindings               bind (source, binding_key, arguments,
                                   destination_queue | destination_exchange) -> 204
    DELETE /bindings/src=S;dstq=Q;key=K;args=   (dste= for an exchange) -> 204

Errors: 404 not found, 403 access refused, 409 a precondition (equivalence), 400 a
request ackmq does not read; the body is the error text. Access is checked as for the
0-9-1 methods that do the same (U3).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from ackmq.broker.errors import ReplyError
from ackmq.protocol.amqp10 import Composite
from ackmq.protocol.amqp10.message import AMQP_VALUE, Message10

if TYPE_CHECKING:
    from ackmq.server.amqp10.transfers import SessionTransfers

ADDRESS = "/management"
NODE = "ackmq@localhost"
_CODES = {404: 404, 403: 403, 406: 409, 405: 409, 530: 403}


class BadRequest(Exception):
    pass


def _plain(v: Any) -> Any:
    """A request body's value as the model's arguments take it (symbols as text)."""
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_plain(x) for x in v]
    if isinstance(v, str):
        return str(v)
    return v


def answer(session: SessionTransfers, request: Message10) -> Message10:
    """The response to one management request."""
    props = request.properties
    path = props.to if props is not None else None
    method = props.subject if props is not None else None
    body = request.body[0][1] if request.body and request.body[0][0] == AMQP_VALUE else None
    code: int
    out: Any = None
    try:
        if not isinstance(path, str) or not isinstance(method, str):
            raise BadRequest("a request needs `to` (a path) and `subject` (a method)")
        code, out = _dispatch(session, method, path, _plain(body))
    except BadRequest as e:
        code, out = 400, str(e)
    except ReplyError as e:
        code, out = _CODES.get(e.code, 400), e.text
    mid = props.message_id if props is not None else None
    return Message10(properties=Composite("properties", correlation_id=mid,
                                          subject=str(code)),
                     body=[(AMQP_VALUE, out)])


def _segments(path: str, prefix: str) -> list[str]:
    return [unquote(s) for s in path[len(prefix):].split("/")]


def _dispatch(session: SessionTransfers, method: str, path: str, body: Any) -> tuple[int, Any]:
    ch = session.channel
    if path.startswith("/queues/"):
        parts = _segments(path, "/queues/")
        name = parts[0]
        if len(parts) == 2 and parts[1] == "messages" and method == "DELETE":
            return 200, {"message_count": ch.purge(name)}
        if len(parts) != 1:
            raise BadRequest(f"no such path {path}")
        if method == "PUT":
            b = body if isinstance(body, dict) else {}
            q = ch.declare_queue(name, False, bool(b.get("durable", True)),
                                 bool(b.get("exclusive", False)),
                                 bool(b.get("auto_delete", False)),
                                 dict(b.get("arguments") or {}))
            return 200, _queue_info(q)
        if method == "GET":
            return 200, _queue_info(ch.declare_queue(name, passive=True))
        if method == "DELETE":
            return 200, {"message_count": ch.delete_queue(name)}
    elif path.startswith("/exchanges/"):
        parts = _segments(path, "/exchanges/")
        if len(parts) != 1:
            raise BadRequest(f"no such path {path}")
        name = parts[0]
        if method == "PUT":
            b = body if isinstance(body, dict) else {}
            ch.declare_exchange(name, str(b.get("type", "direct")), False,
                                bool(b.get("durable", True)), bool(b.get("auto_delete", False)),
                                bool(b.get("internal", False)), dict(b.get("arguments") or {}))
            return 204, None
        if method == "DELETE":
            ch.delete_exchange(name)
            return 204, None
    elif path == "/bindings" and method == "POST":
        b = body if isinstance(body, dict) else {}
        source, key = str(b.get("source", "")), str(b.get("binding_key", ""))
        args = dict(b.get("arguments") or {})
        if "destination_queue" in b:
            ch.bind("queue", str(b["destination_queue"]), source, key, args)
        elif "destination_exchange" in b:
            ch.bind("exchange", str(b["destination_exchange"]), source, key, args)
        else:
            raise BadRequest("a binding needs destination_queue or destination_exchange")
        return 204, None
    elif path.startswith("/bindings/") and method == "DELETE":
        fields = dict(part.split("=", 1) for part in path[len("/bindings/"):].split(";")
                      if "=" in part)
        source, key = unquote(fields.get("src", "")), unquote(fields.get("key", ""))
        vh = ch.vhost
        if "dste" in fields or ("dstq" in fields
                                and unquote(fields["dstq"]) not in vh.queues
                                and unquote(fields["dstq"]) in vh.exchanges):
            # rabbitmq-amqp-python-client 1.0 writes dstq= for an exchange too
            dest, kind = unquote(fields.get("dste", fields.get("dstq", ""))), "exchange"
        else:
            dest, kind = unquote(fields.get("dstq", "")), "queue"
        ch.unbind(kind, dest, source, key, {})
        return 204, None
    raise BadRequest(f"{method} {path} is not a management request ackmq serves")


def _queue_info(q: Any) -> dict[str, Any]:
    args = dict(q.arguments)
    qtype = str(args.get("x-queue-type") or q.kind)
    return {"name": q.name, "vhost": q.vhost.name, "durable": q.durable,
            "auto_delete": q.auto_delete, "exclusive": q.exclusive_owner is not None,
            "type": qtype,
            "arguments": args, "leader": NODE, "replicas": [NODE],
            "message_count": q.message_count, "consumer_count": q.consumer_count}
