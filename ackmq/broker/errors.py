"""Errors the model raises; the server turns them into channel.close / connection.close.

Reply codes are the AMQP ones (a STOMP front end maps them to ERROR frames). The class
and method ids of the offending method are filled in by the server, which knows them.
"""

from __future__ import annotations

from ackmq.protocol.amqp.constants import (  # noqa: F401 - the codes the model raises
    ACCESS_REFUSED,
    CHANNEL_ERROR,
    COMMAND_INVALID,
    INTERNAL_ERROR,
    NOT_ALLOWED,
    NOT_FOUND,
    NOT_IMPLEMENTED,
    PRECONDITION_FAILED,
    REPLY_TEXT,
    RESOURCE_LOCKED,
    fit_shortstr,
)
from ackmq.protocol.amqp.erlang import erl_bytes, erl_string  # noqa: F401 - for the model


class ReplyError(Exception):
    """A refusal by the model, with an AMQP reply code (which STOMP maps to an ERROR
    frame); `text` is prefixed with the code's name as RabbitMQ does."""

    hard = False  # True: closes the whole connection

    def __init__(self, code: int, text: str) -> None:
        name = REPLY_TEXT.get(code, "")
        self.code = code
        self.text = f"{name} - {text}" if name else text
        super().__init__(self.text)


class SoftError(ReplyError):
    """AMQP's soft error (channel exception): only the channel is closed."""


SHORTSTR_MAX = 255  # AMQP's shortstr: exchange and queue names, routing keys


def check_shortstr(what: str, value: str) -> None:
    """Names and routing keys are AMQP shortstrs, at most 255 bytes: AMQP cannot carry
    longer ones and the store keeps them in a byte-counted field. STOMP destinations and
    the HTTP API could send more; they get a 406 for their own call instead of reaching
    the store (where one over-long key failed every later commit)."""
    if len(value) > SHORTSTR_MAX // 4 and len(value.encode("utf-8")) > SHORTSTR_MAX:
        raise SoftError(PRECONDITION_FAILED, f"{what} is longer than {SHORTSTR_MAX} bytes "
                                             f"(AMQP's shortstr limit)")


class AccessRefused(SoftError):
    """U3's 403 (ACCESS_REFUSED), naming the permission that was missing ("configure",
    "write", "read"): AMQP 0-9-1 shows `text` (RabbitMQ 3's words); AMQP 1.0 shows
    `permission + " " + detail`, RabbitMQ 4's amqp:unauthorized-access description."""

    def __init__(self, permission: str, detail: str) -> None:
        super().__init__(ACCESS_REFUSED, detail)
        self.permission = permission
        self.detail = detail


class HardError(ReplyError):
    """AMQP's hard error (connection exception): the whole connection is closed."""

    hard = True


def not_found(what: str, name: str, vhost: str) -> SoftError:
    return SoftError(NOT_FOUND, f"no {what} '{name}' in vhost '{vhost}'")
