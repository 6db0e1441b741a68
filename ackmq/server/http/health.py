"""The health checks' argument rules as RabbitMQ 3.10 has them (SPEC M1, M8):
protocol names and their aliases (rabbit_mgmt_wm_health_check_protocol_listener's
normalize_protocol), the certificate-expiration window and its texts, and the check
of the TLS listeners' certificates against it."""

from __future__ import annotations

import datetime
import ssl
from pathlib import Path
from typing import Any

# RabbitMQ's aliases (lower-cased first); any other name stands for itself
_ALIASES = {
    **dict.fromkeys(("amqp091", "amqp0.9.1", "amqp0-9-1", "amqp0_9_1", "amqp10", "amqp1.0",
                     "amqp1-0", "amqp1_0"), "amqp"),
    "amqps": "amqp/ssl",
    **dict.fromkeys(("mqtt3.1", "mqtt3.1.1", "mqtt31", "mqtt311", "mqtt3_1", "mqtt3_1_1"),
                    "mqtt"),
    **dict.fromkeys(("mqtts", "mqtt+tls", "mqtt+ssl"), "mqtt/ssl"),
    **dict.fromkeys(("stomp1.0", "stomp1.1", "stomp1.2", "stomp10", "stomp11", "stomp12",
                     "stomp1_0", "stomp1_1", "stomp1_2"), "stomp"),
    **dict.fromkeys(("stomps", "stomp+tls", "stomp+ssl"), "stomp/ssl"),
    **dict.fromkeys(("http1", "http1.1", "http_api", "management", "management_ui", "ui"),
                    "http"),
    **dict.fromkeys(("cli", "distribution"), "clustering"),
}


def normalize_protocol(name: str) -> str:
    low = name.lower()
    return _ALIASES.get(low, low)


UNIT_DAYS = {"days": 1, "weeks": 7, "months": 30, "years": 365}
BAD_UNIT = "Time unit not recognised. Supported units: days, weeks, months, years."
BAD_VALUE = "Invalid expiration value."


def expiration_window(within: str, unit: str) -> datetime.timedelta:
    """The window of /certificate-expiration/{within}/{unit}; ValueError with
    RabbitMQ's text for a bad one (as RabbitMQ: the value first, an integer, negative
    allowed; the unit in any case)."""
    try:
        n = int(within)
    except ValueError:
        raise ValueError(BAD_VALUE) from None
    if unit.lower() not in UNIT_DAYS:
        raise ValueError(BAD_UNIT)
    return datetime.timedelta(days=n * UNIT_DAYS[unit.lower()])


def _not_after(path: Path) -> datetime.datetime | None:
    """The first certificate's expiry in a PEM file (None: unreadable)."""
    try:
        decoded = ssl._ssl._test_decode_cert(str(path))  # type: ignore[attr-defined]
        return datetime.datetime.fromtimestamp(
            ssl.cert_time_to_seconds(decoded["notAfter"]), datetime.UTC)
    except (OSError, ssl.SSLError, KeyError, ValueError, AttributeError):
        return None


def expiring(config: Any, listeners: list[dict[str, Any]], window: datetime.timedelta
             ) -> list[dict[str, Any]]:
    """The TLS listeners whose certificate or CA certificate expires within `window`
    (RabbitMQ's "expired" entries)."""
    tls = [x for x in listeners if x["protocol"].endswith("/ssl") or x["protocol"] == "https"]
    cert, ca = config.tls_cert, config.tls_ca
    if not tls or cert is None:
        return []
    deadline = datetime.datetime.now(datetime.UTC) + window
    ends = {"certfile": _not_after(cert), "cacertfile": _not_after(ca) if ca else None}
    if not any(e is not None and e <= deadline for e in ends.values()):
        return []
    return [{"node": x["node"], "protocol": x["protocol"], "interface": x["ip_address"],
             "port": x["port"], "certfile": str(cert), "cacertfile": str(ca or ""),
             "certfile_expires_on": _fmt(ends["certfile"]),
             "cacertfile_expires_on": _fmt(ends["cacertfile"])} for x in tls]


def _fmt(t: datetime.datetime | None) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ") if t is not None else ""
