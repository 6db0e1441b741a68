"""A transfer's outcomes in AMQP 1.0's words (SPEC A3): the delivery states a publisher
is answered with, and the model's refusals as their error conditions."""

from __future__ import annotations

from ackmq.broker.errors import AccessRefused, ReplyError
from ackmq.protocol.amqp10 import Composite
from ackmq.protocol.amqp10 import frames as F
from ackmq.server.amqp10.errors import AmqpError, LinkError, SessionError

ACCEPTED, RELEASED, REJECTED = "accepted", "released", "rejected"
_CONDITIONS = {404: F.NOT_FOUND, 403: F.UNAUTHORIZED_ACCESS, 405: "amqp:resource-locked",
               406: F.PRECONDITION_FAILED, 530: F.NOT_ALLOWED}


def outcome(state: str, err: Composite | None = None) -> Composite:
    if state == REJECTED:
        return Composite("rejected", error=err)
    return Composite(state)


# a publisher's outcomes without an error, encoded once
ENCODED: dict[str, bytes] = {state: outcome(state).encode_amqp()
                             for state in (ACCEPTED, RELEASED, REJECTED)}


def reply_condition(e: ReplyError) -> str:
    return _CONDITIONS.get(e.code, F.INTERNAL_ERROR)


def refusal(e: ReplyError) -> AmqpError:
    """The model's refusal of an attach or a transfer, in AMQP 1.0's words. A missing
    permission (U3) ends the session with amqp:unauthorized-access and RabbitMQ 4's
    description, which names the permission ("write access to exchange 'x' in vhost
    '/' refused for user 'u'"), as RabbitMQ 4 does; anything else detaches the link."""
    if isinstance(e, AccessRefused):
        return SessionError(F.UNAUTHORIZED_ACCESS, f"{e.permission} {e.detail}")
    return LinkError(reply_condition(e), e.text)


class Reject(Exception):
    """A transfer refused with `rejected` and this error; the link stays."""

    def __init__(self, condition: str, description: str) -> None:
        super().__init__(description)
        self.condition = condition
        self.description = description
