"""Waiting for the access model's last save (store/accessfile.py's writer thread) before
a management request answers: the change is on disk when the client hears it is done,
and the fsync ran off the event loop meanwhile. Used by the HTTP API's middleware, the
ctl socket and `load_definitions` at start."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future
from typing import Any


async def access_saved(access: Any) -> None:
    """Return once the access model's last submitted snapshot is on disk (raises the
    write's OSError if it failed)."""
    token = access.saved
    if isinstance(token, Future):
        await asyncio.wrap_future(token)


def access_saved_now(access: Any) -> None:
    """The same, blocking (at start, before any client is served)."""
    token = access.saved
    if isinstance(token, Future):
        token.result()
