"""In-process tests of the shovel's rules (ackmq/shovel/config.py) and of the server's
parameter registry (server/parameters.py): RabbitMQ's validation order, the defaults a
definition gets, URIs shown without credentials, where `amqp://` connects, and the
registry's saving, clearing and vhost deletion. The wire behaviour is
tests/test_shovel*.py's, beside RabbitMQ."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ackmq.server.parameters import LOCAL_LOGINS, ParameterError, Parameters
from ackmq.shovel.amqp10 import target_of
from ackmq.shovel.config import erl, parse, redact, validate
from ackmq.shovel.ends import _runs
from ackmq.shovel.worker import connect_url


def test_V1_validation_order_is_rabbitmqs() -> None:
    """Source/destination rules first, then the key checks last-first, unrecognised keys
    first of those (rabbit_parameter_validation:proplist prepends)."""
    got = validate("n", {"src-queue": 1, "src-exchange": "x", "bogus": True,
                         "ack-mode": "x", "reconnect-delay": "y"})
    assert got == [
        "Cannot specify 'src-exchange' and 'src-queue'",
        "Unrecognised terms [{<<\"bogus\">>,true}] in n",
        'Key "dest-uri" not found in n',
        "src-queue should be binary, actually was 1",
        'Key "src-uri" not found in n',
        'ack-mode should be one of [<<"no-ack">>,<<"on-publish">>,<<"on-confirm">>], '
        'actually was <<"x">>',
        'reconnect-delay should be a number, actually was <<"y">>']


def test_V1_erlang_terms() -> None:
    assert erl("a\"b") == '<<"a\\"b">>'
    assert erl([1, None, False, 1.5]) == "[1,null,false,1.5]"


def test_V1_defaults_and_aliases() -> None:
    cfg = parse("/", "s", {"src-uri": "amqp://", "src-queue": "a", "dest-uri": ["amqp://"],
                           "prefetch-count": 10, "delete-after": 3,
                           "add-forward-headers": True, "reconnect-delay": 1e308})
    assert (cfg.ack_mode, cfg.prefetch, cfg.delete_after, cfg.forward_headers,
            cfg.reconnect_delay, cfg.dest.uris) == ("on-confirm", 10, 3, True, 3600.0,
                                                    ["amqp://"])
    cfg = parse("/", "s", {"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://",
                           "src-prefetch-count": -1})
    assert cfg.prefetch == 1000 and cfg.reconnect_delay == 5.0


@pytest.mark.parametrize("uri,shown", [
    ("amqp://", "amqp://"), ("amqp:///v", "amqp:///v"),
    ("amqp://u:p@h:5672/v", "amqp://h:5672/v"), ("amqp://[::1", "amqp://[::1")])
def test_V1_uris_shown_without_credentials(uri: str, shown: str) -> None:
    assert redact(uri) == shown


def test_V1_local_uri_is_this_broker_as_the_user() -> None:
    p = Parameters()
    p.local.host, p.local.port = "127.0.0.1", 5999
    url = connect_url("amqp:///my%2Fvhost", p.local, "alice")
    assert url.startswith("amqp://alice:") and url.endswith("@127.0.0.1:5999/my%2Fvhost")
    password = url.split(":")[2].split("@")[0]
    assert LOCAL_LOGINS.accepts("alice", password)
    assert not LOCAL_LOGINS.accepts("bob", password)
    assert connect_url("amqp://", p.local, "alice").endswith(":5999/%2F")
    assert connect_url("amqp://h:1/v?heartbeat=5&connection_timeout=9", p.local, "a") \
        == "amqp://h:1/v?heartbeat=5"

    assert connect_url("amqps://h/v?cacertfile=/ca.pem&verify=verify_none&x=1", p.local,
                       "a") == "amqps://h/v?cacertfile=%2Fca.pem&verify=verify_none"
    assert connect_url("amqp://h/v?cacertfile=/ca.pem", p.local, "a") == "amqp://h/v"


def test_V1_amqp10_uris_as_amqp10_client_reads_them() -> None:
    """hostname from the query (RabbitMQ's `?hostname=vhost:x`), else vhost:<path>, else
    the host; PLAIN with credentials, ANONYMOUS without; amqps with the TLS keys; no
    host: this broker as the user, with the one-off loopback password."""
    p = Parameters()
    p.local.host, p.local.port = "127.0.0.1", 5999
    t = target_of("amqp://u:p%40ss@h:1?hostname=vhost:v1", p.local, "alice")
    assert (t.host, t.port, t.user, t.password, t.hostname, t.sasl, t.tls) == (
        "h", 1, "u", "p@ss", "vhost:v1", "PLAIN", None)
    t = target_of("amqp://h/v2", p.local, "alice")
    assert (t.port, t.user, t.hostname, t.sasl) == (5672, None, "vhost:v2", "ANONYMOUS")
    assert target_of("amqp://h", p.local, "a").hostname == "h"
    t = target_of("amqps://h?verify=verify_none&server_name_indication=x.example",
                  p.local, "a")
    assert t.port == 5671 and t.tls is not None and t.server_hostname == "x.example"
    t = target_of("amqp:///v3", p.local, "alice")
    assert (t.host, t.port, t.user, t.hostname, t.sasl) == (
        "127.0.0.1", 5999, "alice", "vhost:v3", "PLAIN")
    assert LOCAL_LOGINS.accepts("alice", t.password or "")


def test_V1_amqp10_definition_parsed() -> None:
    cfg = parse("/", "n", {"src-protocol": "amqp10", "src-uri": "amqp://h",
                           "src-address": "/queue/a", "dest-protocol": "amqp10",
                           "dest-uri": "amqp://h", "dest-address": "/queue/b",
                           "dest-properties": [], "dest-application-properties": {"k": "v"},
                           "src-prefetch-count": 7})
    assert (cfg.src.protocol, cfg.src.address, cfg.src.queue, cfg.dest.protocol,
            cfg.dest.address, cfg.prefetch) == ("amqp10", "/queue/a", None, "amqp10",
                                                "/queue/b", 7)
    assert cfg.dest_properties == {} and cfg.dest_application_properties == {"k": "v"}
    assert validate("n", {"src-protocol": "amqp10", "src-uri": "amqp://h",
                          "src-address": "a", "dest-uri": "amqp://", "dest-queue": "b",
                          "dest-exchange": "x"}) == [
        "Cannot specify 'dest-exchange' and 'dest-queue'"]


def test_V1_amqp10_settlement_ranges() -> None:
    assert _runs([5, 3, 4, 9, 10, 1]) == [(1, 1, 1), (3, 5, 3), (9, 10, 2)]


class _Comp:
    name = "shovel"

    def __init__(self) -> None:
        self.running: dict[tuple[str, str], Any] = {}

    def validate(self, vhost: str, name: str, value: Any, user: str) -> None:
        if value == "bad":
            raise ParameterError(["bad value"])

    def set(self, vhost: str, name: str, value: Any, user: str) -> None:
        self.running[(vhost, name)] = (value, user)

    def clear(self, vhost: str, name: str) -> None:
        self.running.pop((vhost, name), None)

    def status(self, vhost: str | None) -> list[dict[str, Any]]:
        return []

    def restart(self, vhost: str, name: str) -> bool:
        return False

    async def stop(self) -> None:
        self.running.clear()


def test_V1_registry_saves_runs_clears(tmp_path: Path) -> None:
    p = Parameters()
    comp = _Comp()
    p.register(comp)
    p.attach(tmp_path)
    with pytest.raises(ParameterError) as e:
        p.set("shovel", "/", "x", "bad", "u")
    assert e.value.reason == "Validation failed\n\nbad value\n"
    with pytest.raises(ParameterError, match="component nope not found"):
        p.set("nope", "/", "x", {}, "u")
    assert p.set("shovel", "/", "a", {"k": 1}, "alice") is True
    assert p.set("shovel", "v2", "b", {"k": 2}, "bob") is True
    assert p.set("shovel", "v2", "b", {"k": 2}, "bob") is False  # replaced
    assert comp.running == {}  # not started yet: the broker is not listening
    p.start("127.0.0.1", 1, "ackmq@x")
    assert comp.running == {("/", "a"): ({"k": 1}, "alice"), ("v2", "b"): ({"k": 2}, "bob")}
    # a new registry over the same data dir has them back
    again = Parameters()
    again.attach(tmp_path)
    assert again.listing() == p.listing()
    p.vhost_deleted("v2")
    assert comp.running == {("/", "a"): ({"k": 1}, "alice")}
    assert p.clear("shovel", "/", "a") and not p.clear("shovel", "/", "a")
    assert comp.running == {} and p.listing() == []
