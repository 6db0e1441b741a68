"""Errors the AMQP 1.0 front end answers, by scope (SPEC A9): a connection error closes
the connection (close with the error), a session error ends the session (end), a link
error detaches the link (detach closed=true). The condition is the specification's
symbol (protocol/amqp10/frames.py lists them)."""

from __future__ import annotations


class AmqpError(Exception):
    scope = "connection"

    def __init__(self, condition: str, description: str) -> None:
        super().__init__(f"{condition}: {description}")
        self.condition = condition
        self.description = description


class SessionError(AmqpError):
    scope = "session"


class LinkError(AmqpError):
    scope = "link"
