"""The version of ackmq, read once from the installed package's metadata (pyproject.toml
is the one place it is written): the AMQP server properties, STOMP's CONNECTED, the
client's client properties and `ackmq ctl status` all say this."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    VERSION = version("ackmq")
except PackageNotFoundError:  # run from a source tree that was never installed
    VERSION = "0+unknown"
