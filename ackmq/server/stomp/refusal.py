"""How the STOMP front end refuses a frame (an ERROR, then the connection closes: W9),
and the two header readings every part of it shares."""

from __future__ import annotations


class Refused(Exception):
    """A frame the connection refuses: ERROR with this message and detail, then close."""

    def __init__(self, message: str, detail: str) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail


def quoted(text: str) -> str:
    """A string as Erlang's ~p prints it in RabbitMQ's texts."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def boolean_header(value: str | None) -> bool | None:
    """RabbitMQ's boolean header: true/false, and Python clients' True/False."""
    if value in ("true", "True"):
        return True
    if value in ("false", "False"):
        return False
    return None
