"""Is a reference broker's port there: the one check every comparison test skips by."""

from __future__ import annotations

import socket

import pytest


def listening(addr: tuple[str, int]) -> bool:
    try:
        socket.create_connection(addr, timeout=1).close()
        return True
    except OSError:
        return False


def need(addr: tuple[str, int], name: str) -> None:
    if not listening(addr):
        pytest.skip(f"{name} is not listening on {addr[0]}:{addr[1]}")
