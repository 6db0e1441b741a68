"""rabbitmqctl's exit code for bad arguments, and the check that raises it."""

from __future__ import annotations

from ackmq.broker.access import AccessError

USAGE = 64  # rabbitmqctl's exit code for bad arguments


def nargs(args: list[str], n: int, usage: str) -> None:
    if len(args) != n:
        raise AccessError(f"wrong number of arguments: usage: {usage}", USAGE)
