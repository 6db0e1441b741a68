"""Exceptions of ackmq.client: one class per thing a caller can do something about."""

from __future__ import annotations

from typing import Any


class ClientError(Exception):
    """Base of every error ackmq.client raises."""


class ConnectionLost(ClientError):
    """The connection is gone: dropped socket, missed heartbeats, broker restart, or the
    broker closed it (then `code` and `text` are the broker's, e.g. 320 CONNECTION_FORCED,
    403 ACCESS_REFUSED on a refused login; `class_id` and `method_id` are those of its
    connection.close, 0 otherwise). Unacked deliveries come back redelivered (D8);
    a publish not yet confirmed may or may not have been taken."""

    def __init__(self, text: str, code: int | None = None, class_id: int = 0,
                 method_id: int = 0) -> None:
        self.code = code
        self.text = text
        self.class_id = class_id
        self.method_id = method_id
        super().__init__(f"{code} {text}" if code else text)


class ChannelClosed(ClientError):
    """The broker closed the session's channel (403, 404, 406, ...): `code` and `text` are
    the broker's reply code and text. The session is unusable afterwards."""

    def __init__(self, code: int, text: str, class_id: int = 0, method_id: int = 0) -> None:
        self.code = code
        self.text = text
        self.class_id = class_id
        self.method_id = method_id
        super().__init__(f"{code} {text}")


class PublishError(ClientError):
    """A publish the broker did not take. `messages` are the OutboundMessages concerned,
    ready to publish again."""

    def __init__(self, text: str, messages: list[Any]) -> None:
        self.messages = messages
        super().__init__(text)


class NackError(PublishError):
    """The broker answered basic.nack (P6): it could not take responsibility."""


class ReturnedError(PublishError):
    """A mandatory publish routed to no queue: basic.return with `code` (312 NO_ROUTE)."""

    def __init__(self, text: str, messages: list[Any], code: int = 312) -> None:
        self.code = code
        super().__init__(text, messages)


class ConfirmTimeout(ClientError, TimeoutError):
    """No confirm within the timeout; the message may still be confirmed later."""


class IllegalStateError(ClientError):
    """The call does not fit the object's state (J4, J5, closed session, wrong mode)."""


class ConsumerCancelled(IllegalStateError):
    """The broker cancelled this consumer (basic.cancel): its queue was deleted, or (L7)
    a delivery stayed unacknowledged past its consumer timeout — then, on ackmq and
    RabbitMQ 4.3, its unacknowledged messages went back to the queue (acks of them are
    ignored). receive() raises it; the session and its other consumers go on.
    `unacked`: how many of its messages the application held unacknowledged."""

    def __init__(self, text: str, consumer_tag: str, unacked: int) -> None:
        self.consumer_tag = consumer_tag
        self.unacked = unacked
        super().__init__(text)


class TransactionRolledBack(ClientError):
    """commit() could not complete (connection lost mid-transaction): nothing of the
    transaction took effect; consumed messages come back redelivered."""
