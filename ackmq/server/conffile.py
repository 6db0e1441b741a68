"""`ackmq serve --config ackmq.conf`: every serve option in a file, in RabbitMQ's
`rabbitmq.conf` (sysctl / cuttlefish) style.

One `key = value` a line; `#` starts a comment (a whole line, or after a value, as
cuttlefish: a value cannot contain `#`); blank lines are skipped. The keys
RabbitMQ and ackmq share are spelled as in rabbitmq.conf (`listeners.tcp.default`,
`vm_memory_high_watermark.relative`, `ssl_options.certfile`, ...), with RabbitMQ's
units (`handshake_timeout` and `consumer_timeout` in milliseconds); every serve option
is also `ackmq.<option>` (`ackmq.data_dir`, `ackmq.queue_memory_mb`, ...). The result is
a dict of argparse destinations: the command line sets them as defaults and parses
again, so a flag given on the command line wins over the file.

An unknown key, a key set twice or a bad value raises ConfigFileError naming the file
and line (`ackmq serve` exits with 2).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ackmq.server.alarms import parse_bytes, parse_disk_limit, parse_watermark

TIMEOUT_RESPONSES = ("notify_consumer", "close_channel")  # consumer_timeout_response (L7)


class ConfigFileError(ValueError):
    pass


@dataclass(frozen=True)
class Option:
    """One `ackmq serve` option as argparse knows it."""

    dest: str
    convert: Callable[[str], Any]  # the option's type (str when none)
    flag: bool = False  # store_true: the value is true/false


_KEY = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")
_TRUE = {"true": True, "yes": True, "on": True, "1": True,
         "false": False, "no": False, "off": False, "0": False}

T = TypeVar("T")


def _as(convert: Callable[[str], T], v: str, what: str) -> T:
    """`convert(v)`, or a ValueError saying what `v` is not (the one text each kind has)."""
    try:
        return convert(v)
    except (ValueError, KeyError):
        raise ValueError(f"{v!r} is not {what}") from None


def boolean(v: str) -> bool:
    return _as(lambda s: _TRUE[s.strip().lower()], v, "true or false")


def integer(v: str) -> int:
    return _as(int, v, "a whole number")


N = TypeVar("N", int, float)


def _within(convert: Callable[[str], N], v: str, low: N, high: N | None, why: str) -> N:
    """`convert(v)` if it lies in [low, high] (no upper bound: None), else a ValueError
    saying `why` ({n}: the number, {v}: the text)."""
    n = convert(v)
    if not (low <= n and (high is None or n <= high)):  # NaN is in no range
        raise ValueError(why.format(n=n, v=v))
    return n


def port(v: str) -> int:
    return _within(integer, v, 0, 65535, "{n} is not a port (0 to 65535)")


def _listener(v: str) -> dict[str, Any]:
    """RabbitMQ's `listeners.tcp.x = 5672` or `= 0.0.0.0:5672` / `= [::1]:5672`."""
    host, sep, p = v.rpartition(":")
    if not sep:
        return {"port": port(v)}
    host = host.strip("[]")
    if not host:
        raise ValueError(f"{v!r}: write PORT or IP:PORT")
    return {"host": host, "port": port(p)}


def _ms_to_s(v: str) -> float:
    return _within(integer, v, 1, None, "{n} must be a positive number of milliseconds") / 1000


def _nonneg(v: str) -> int:
    return _within(integer, v, 0, None, "{n} must not be negative")


def _response(v: str) -> str:
    if v not in TIMEOUT_RESPONSES:
        raise ValueError(f"{v!r}: {' or '.join(TIMEOUT_RESPONSES)}")
    return v


def _float(v: str) -> float:
    return _as(float, v, "a number")


def _watermark_relative(v: str) -> str:
    return str(_within(_float, v, 0.0, 1.0, "{v} is not a fraction of RAM (0.0 to 1.0)"))


def _checked(parse: Callable[[str], Any]) -> Callable[[str], str]:
    def check(v: str) -> str:
        parse(v)
        return v
    return check


def _verify(v: str) -> bool:
    if v not in ("verify_peer", "verify_none"):
        raise ValueError(f"{v!r}: verify_peer or verify_none")
    return v == "verify_peer"


def _disable(v: str) -> bool:
    """`stomp.listeners.tcp = none`-style: only `none` is a value."""
    if v != "none":
        raise ValueError(f"{v!r}: only 'none' (no listener) may be set here")
    return True


def _split(dest_port: str, v: str) -> dict[str, Any]:
    d = _listener(v)
    out: dict[str, Any] = {dest_port: d["port"]}
    if "host" in d:
        out["host"] = d["host"]
    return out


# rabbitmq.conf key (or a pattern for numbered listeners) -> value -> {dest: value}
SHARED: dict[str, Callable[[str], dict[str, Any]]] = {
    "listeners.tcp.*": lambda v: _split("port", v),
    "listeners.ssl.*": lambda v: _split("tls_port", v),
    "stomp.listeners.tcp.*": lambda v: _split("stomp_port", v),
    "stomp.listeners.tcp": lambda v: {"no_stomp": _disable(v)},
    "stomp.listeners.ssl.*": lambda v: _split("stomp_tls_port", v),
    "stomp.ssl_cert_login": lambda v: {"stomp_ssl_cert_login": boolean(v)},
    "stream.listeners.tcp.*": lambda v: _split("stream_port", v),
    "stream.listeners.tcp": lambda v: {"no_stream": _disable(v)},
    "stream.listeners.ssl.*": lambda v: _split("stream_tls_port", v),
    "mqtt.listeners.tcp.*": lambda v: _split("mqtt_port", v),
    "mqtt.listeners.tcp": lambda v: {"no_mqtt": _disable(v)},
    "mqtt.listeners.ssl.*": lambda v: _split("mqtt_tls_port", v),
    "mqtt.ssl_cert_login": lambda v: {"mqtt_ssl_cert_login": boolean(v)},
    "web_mqtt.tcp.port": lambda v: {"mqtt_ws_port": port(v)},
    "web_mqtt.ssl.port": lambda v: {"mqtt_wss_port": port(v)},
    "web_mqtt.ssl.certfile": lambda v: {"tls_cert": Path(v)},
    "web_mqtt.ssl.keyfile": lambda v: {"tls_key": Path(v)},
    "web_mqtt.ssl.cacertfile": lambda v: {"tls_ca": Path(v)},
    "management.tcp.port": lambda v: {"http_port": port(v)},
    "management.ssl.port": lambda v: {"https_port": port(v)},
    "prometheus.tcp.port": lambda v: {"prometheus_port": port(v)},
    "management.ssl.certfile": lambda v: {"tls_cert": Path(v)},
    "management.ssl.keyfile": lambda v: {"tls_key": Path(v)},
    "management.ssl.cacertfile": lambda v: {"tls_ca": Path(v)},
    "vm_memory_high_watermark.relative": lambda v: {
        "memory_high_watermark": _watermark_relative(v)},
    "vm_memory_high_watermark.absolute": lambda v: {
        "memory_high_watermark": str(parse_bytes(v))},
    "disk_free_limit.absolute": lambda v: {"disk_free_limit": _checked(parse_disk_limit)(v)},
    "disk_free_limit.relative": lambda v: {
        "disk_free_limit": _checked(parse_disk_limit)(f"mem_relative:{_float(v)}")},
    "default_user": lambda v: {"default_user": v},
    "default_pass": lambda v: {"default_pass": v},
    "consumer_timeout": lambda v: {"consumer_timeout_ms": _nonneg(v)},
    "consumer_timeout_response": lambda v: {"consumer_timeout_response": _response(v)},
    "heartbeat": lambda v: {"heartbeat": _nonneg(v)},
    "handshake_timeout": lambda v: {"handshake_timeout": _ms_to_s(v)},
    "max_message_size": lambda v: {"max_message_size": _nonneg(v)},
    "ssl_options.certfile": lambda v: {"tls_cert": Path(v)},
    "ssl_options.keyfile": lambda v: {"tls_key": Path(v)},
    "ssl_options.cacertfile": lambda v: {"tls_ca": Path(v)},
    "ssl_options.verify": lambda v: {"tls_verify_peer": _verify(v)},
    "ssl_options.fail_if_no_peer_cert": lambda v: {"tls_fail_if_no_peer_cert": boolean(v)},
    "log.console.level": lambda v: {"log_level": v.upper()},
    "load_definitions": lambda v: {"load_definitions": Path(v)},
}
# rabbitmq.conf keys whose setting ackmq does not offer: refused, not silently ignored
# (accepted when they name ackmq's fixed value, RabbitMQ's default)
FIXED = {"frame_max": 131072, "channel_max": 2047}
# friendlier spellings of the negative flags: ackmq.fsync = false is --no-fsync
INVERTED = {"ackmq.fsync": "no_fsync", "ackmq.persistence": "no_persistence",
            "ackmq.stomp": "no_stomp", "ackmq.http": "no_http", "ackmq.stream": "no_stream",
            "ackmq.mqtt": "no_mqtt"}


# string options checked here, so that their error names the line
_VALIDATE: dict[str, Callable[[str], Any]] = {"memory_high_watermark": parse_watermark,
                                              "disk_free_limit": parse_disk_limit}


def _shared(key: str) -> Callable[[str], dict[str, Any]] | None:
    conv = SHARED.get(key)
    if conv is not None:
        return conv
    head, _, tail = key.rpartition(".")
    if tail and head.endswith(("listeners.tcp", "listeners.ssl")):
        return SHARED.get(head + ".*")
    return None


def parse(text: str, options: Iterable[Option], source: str = "ackmq.conf"
          ) -> dict[str, Any]:
    """{argparse dest: value} from the file's text; ConfigFileError names the line."""
    by_dest = {o.dest: o for o in options}
    out: dict[str, Any] = {}
    seen: dict[str, int] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{source}:{lineno}"
        key, sep, value = line.partition("=")
        # as cuttlefish: a `#` ends the value (a trailing comment)
        key, value = key.strip(), value.partition("#")[0].strip()
        if not sep or not _KEY.match(key):
            raise ConfigFileError(f"{where}: expected 'key = value', got {line!r}")
        if not value:
            raise ConfigFileError(f"{where}: {key} has no value")
        if key in seen:
            raise ConfigFileError(f"{where}: {key} is set twice (first on line {seen[key]})")
        seen[key] = lineno
        try:
            got = _convert(key, value, by_dest)
        except ValueError as e:
            raise ConfigFileError(f"{where}: {key} = {value}: {e}") from None
        if got is None:
            raise ConfigFileError(f"{where}: unknown key {key!r} (rabbitmq.conf keys ackmq "
                                  "shares, or ackmq.<serve option>: see docs/config.md)")
        out.update(got)
    return out


def _convert(key: str, value: str, by_dest: dict[str, Option]) -> dict[str, Any] | None:
    if key in FIXED:
        if integer(value) != FIXED[key]:
            raise ValueError(f"ackmq's {key} is fixed at {FIXED[key]} (RabbitMQ's default)")
        return {}
    conv = _shared(key)
    if conv is not None:
        return conv(value)
    if key in INVERTED:
        return {INVERTED[key]: not boolean(value)}
    if key.startswith("ackmq."):
        dest = key[6:].replace("-", "_")
        opt = by_dest.get(dest)
        if opt is None:
            return None
        if opt.flag:
            return {dest: boolean(value)}
        if (dest == "port" or dest.endswith("_port")) and opt.convert is int:
            return {dest: port(value)}
        if dest in _VALIDATE:
            _VALIDATE[dest](value)
        if opt.convert is int:
            return {dest: integer(value)}
        try:
            return {dest: opt.convert(value)}
        except (TypeError, ValueError, ArithmeticError) as e:
            raise ValueError(str(e) or f"not a valid {dest}") from None
    return None


def load(path: Path, options: Iterable[Option]) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigFileError(f"cannot read the config file {path}: {e}") from None
    return parse(text, options, str(path))
