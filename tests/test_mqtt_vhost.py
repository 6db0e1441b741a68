"""N1: which vhost an MQTT connection opens, as RabbitMQ's MQTT plugin picks it: the
global runtime parameters `mqtt_port_to_vhost_mapping` (the listener's port -> vhost: TCP,
TLS, WebSocket) and `mqtt_default_vhosts` (a client certificate's subject DN -> vhost,
with `--mqtt-ssl-cert-login`), before `vhost:user` or after it as RabbitMQ orders them
(rabbit_mqtt_processor:get_vhost, RabbitMQ 3.10; its docs, "MQTT Plugin", "Virtual
Hosts"); the parameters themselves through `ackmq ctl` and /api/global-parameters as
rabbitmqctl's and RabbitMQ 3.10's management API (compared against the shared RabbitMQ
with names no one else uses, removed at once). paho-mqtt over real sockets against
`ackmq serve`. docs/mqtt.md ("Which vhost")."""

from __future__ import annotations

import json
import re
import ssl
import threading
import urllib.request
from base64 import b64encode
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import paho.mqtt.client as mqtt
import pytest
import trustme
from conftest import BrokerProcess
from cryptography import x509
from paho.mqtt.enums import CallbackAPIVersion
from support.mgmthelp import Target, http_url_of
from support.mqtthelp import Raw, client_id, wait_for
from support.tlshelp import cert_broker, port_in_log, server_files
from test_mgmt_ctl import ctl, http_of, ok

from ackmq.ctl.socket_client import request
from ackmq.protocol.mqtt import ConnAck
from ackmq.protocol.mqtt import constants as rc
from ackmq.server.mqtt.vhosts import choose_vhost, split_user
from ackmq.server.parameters import Parameters
from ackmq.server.tls import certificate_subject, certificate_user

PORTS = "mqtt_port_to_vhost_mapping"
CERTS = "mqtt_default_vhosts"
WS_URL = re.compile(r"ws://\S+:(\d+)/ws")
MQTTS = re.compile(r"mqtts://\S+:(\d+)")
WSS_URL = re.compile(r"wss://\S+:(\d+)/ws")
HTTP_URL = re.compile(r"(http://127\.0\.0\.1:\d+)")


# -- the rule, in process ---------------------------------------------------------------
def _params(**values: Any) -> Parameters:
    p = Parameters()  # no data dir: nothing saved
    for name, value in values.items():
        p.set_global(name, value)
    return p


def test_N1_vhost_choice_follows_rabbitmqs_order() -> None:
    """Without a certificate: `vhost:user`, then the port's mapping, then `/`. With a
    verified one: the certificate's mapping (its DN, or its CN as with
    RabbitMQ's ssl_cert_login_from = common_name), then the port's, then `vhost:user`."""
    none = _params()
    assert choose_vhost(none, "guest", 1883) == ("/", "guest")
    assert choose_vhost(None, "vh:guest", 1883) == ("vh", "guest")
    assert choose_vhost(none, "a:b:guest", 1883) == ("a:b", "guest")  # the last colon
    assert choose_vhost(none, ":guest", 1883) == ("", "guest")  # no such vhost: refused
    ports = _params(**{PORTS: {"1883": "pv", "8883": "tv"}})
    assert choose_vhost(ports, "guest", 1883) == ("pv", "guest")
    assert choose_vhost(ports, "guest", 8883) == ("tv", "guest")
    assert choose_vhost(ports, "guest", 1884) == ("/", "guest")
    assert choose_vhost(ports, "vh:guest", 1883) == ("vh", "guest")  # the name wins
    assert choose_vhost(ports, None, 1883) == ("pv", "")
    dn, cn = "O=client,CN=dev", "dev"
    both = _params(**{PORTS: {"8883": "pv"}, CERTS: {dn: "cv", "other": "x"}})
    assert choose_vhost(both, None, 8883, (dn, cn)) == ("cv", "")
    assert choose_vhost(both, "vh:guest", 8883, (dn, cn)) == ("cv", "guest")
    by_cn = _params(**{CERTS: {cn: "cnv"}})
    assert choose_vhost(by_cn, None, 8883, (dn, cn)) == ("cnv", "")
    # a certificate not in the mapping: the port's, before the user name's
    assert choose_vhost(both, "vh:guest", 8883, ("O=client,CN=else", "else")) == (
        "pv", "guest")
    assert choose_vhost(both, "vh:guest", 8884, ("O=client,CN=else", "else")) == (
        "vh", "guest")
    assert choose_vhost(both, None, 8884, ("O=client,CN=else", "else")) == ("/", "")
    # without a certificate the certificate mapping is not read
    assert choose_vhost(both, "guest", 8884) == ("/", "guest")
    # values RabbitMQ does not check when they are set map nothing here
    odd = _params(**{PORTS: ["1883", "pv"], CERTS: {dn: 5}})
    assert choose_vhost(odd, "guest", 1883, (dn, cn)) == ("/", "guest")
    assert split_user("u") == (None, "u")


def test_N1_certificate_subject_is_the_rfc4514_dn(tmp_path: Path) -> None:
    """The key of `mqtt_default_vhosts` is the subject DN as RabbitMQ writes it (RFC 4514,
    last RDN first: `O=client,CN=guest` in its docs): what `cryptography` writes."""
    ca = trustme.CA()
    for cn in ("certuser", "dev, one+two", "#lead \"q\" <x>;"):
        pem = tmp_path / "c.pem"
        ca.issue_cert("x", common_name=cn, organization_name="client"
                      ).cert_chain_pems[0].write_to_path(str(pem))
        decoded = ssl._ssl._test_decode_cert(str(pem))  # type: ignore[attr-defined]
        want = x509.load_pem_x509_certificate(pem.read_bytes()).subject.rfc4514_string()
        assert certificate_subject(decoded) == want
        assert certificate_user(decoded) == cn
    assert certificate_subject(None) is None


# -- over the wire --------------------------------------------------------------------
def _get(b: BrokerProcess, path: str) -> Any:
    http_url_of(b)  # logged
    base = HTTP_URL.findall("".join(b.log))[-1]  # the last start's (a restart moves it)
    req = urllib.request.Request(base + path, headers={
        "Authorization": "Basic " + b64encode(b"guest:guest").decode()})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def _set(b: BrokerProcess, name: str, value: Any) -> None:
    assert request(b.data_dir / "ctl.sock", "set_global_parameter", [name],
                   body={"value": value})["ok"]


def _clear(b: BrokerProcess, name: str) -> None:
    request(b.data_dir / "ctl.sock", "clear_global_parameter", [name])


def _landed(b: BrokerProcess, port: int, user: str | None = "guest",
            ws: bool = False, tls: dict[str, Path] | None = None,
            cert: str | None = None, v5: bool = False) -> str | int:
    """Connect (paho, over TCP, WebSocket or TLS with the client certificate `cert`),
    subscribe, and answer the vhost the session's queue is in; or the refusal's code."""
    cid = client_id("mv")
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=cid,
                    transport="websockets" if ws else "tcp",
                    protocol=mqtt.MQTTv5 if v5 else mqtt.MQTTv311)
    if ws:
        c.ws_set_options(path="/ws")
    if tls is not None:
        c.tls_set(ca_certs=str(tls["ca"]), certfile=None if cert is None else str(tls[cert]))
    if user is not None:
        c.username_pw_set(user, "guest" if user.endswith("guest") else "pw")
    codes: list[int] = []
    subscribed = threading.Event()
    c.on_connect = lambda cl, u, f, reason, p: codes.append(reason.value)
    c.on_subscribe = lambda *a: subscribed.set()
    c.connect("127.0.0.1", port)
    c.loop_start()
    try:
        assert wait_for(lambda: bool(codes))
        if codes[0] != 0:
            return codes[0]
        c.subscribe("mv/t", 1)
        assert subscribed.wait(10)
        name = f"mqtt-subscription-{cid}qos1"
        found: list[str] = []
        assert wait_for(lambda: bool(found.extend(
            q["vhost"] for q in _get(b, "/api/queues") if q["name"] == name) or found))
        return found[0]
    finally:
        c.disconnect()
        c.loop_stop()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("mqtt-vhost") / "d", "--mqtt-ws-port", "0")
    b.start()
    sock = b.data_dir / "ctl.sock"
    for vh in ("mv-tcp", "mv-ws", "mv-name"):
        assert request(sock, "add_vhost", [vh])["ok"]
        assert request(sock, "set_permissions", ["guest", ".*", ".*", ".*"], vhost=vh)["ok"]
    yield b
    b.stop()
    assert not [line for line in b.log if "Traceback" in line], "".join(b.log[-40:])


def _ws_port(b: BrokerProcess) -> int:
    return int(port_in_log(b, WS_URL, "ws:// URL"))


def test_N1_port_to_vhost_mapping_for_tcp_and_websocket_listeners(
        broker: BrokerProcess) -> None:
    """`mqtt_port_to_vhost_mapping` (set with `ackmq ctl set_global_parameter`): a client
    on the TCP port opens its vhost, one on the WebSocket port that port's; a `vhost:user`
    name still wins (no certificate login); cleared, the default vhost `/` again. Read at
    each CONNECT (RabbitMQ: connected clients keep theirs)."""
    tcp, ws = broker.mqtt_port, _ws_port(broker)
    assert _landed(broker, tcp) == "/"
    _set(broker, PORTS, {str(tcp): "mv-tcp", str(ws): "mv-ws"})
    try:
        assert _landed(broker, tcp) == "mv-tcp"
        assert _landed(broker, tcp, v5=True) == "mv-tcp"
        assert _landed(broker, ws, ws=True) == "mv-ws"
        assert _landed(broker, tcp, user="mv-name:guest") == "mv-name"
        assert _landed(broker, tcp, user="/:guest") == "/"
    finally:
        _clear(broker, PORTS)
    assert _landed(broker, tcp) == "/"
    assert _landed(broker, ws, ws=True) == "/"


@pytest.mark.parametrize(("level", "code"), [(4, rc.REFUSED_BAD_USERNAME_PASSWORD),
                                             (5, rc.BAD_USER_NAME_OR_PASSWORD)])
def test_N1_port_mapped_to_a_missing_vhost_is_refused(broker: BrokerProcess, level: int,
                                                      code: int) -> None:
    """A port mapped to a vhost that does not exist: RabbitMQ's plugin refuses it as a
    failed login (3.10: CONNACK 4, seen on 127.0.0.1:1883 with `nosuchvhost:guest`;
    3.13 for MQTT 5: 0x86, its check_vhost_exists), with the reason string naming it."""
    _set(broker, PORTS, {str(broker.mqtt_port): "mv-none"})
    try:
        with Raw("127.0.0.1", broker.mqtt_port, level) as r:
            ack = r.connect(client_id(), "guest", "guest")
            assert isinstance(ack, ConnAck) and ack.reason_code == code
            if level == 5:
                assert ack.properties["reason_string"] == \
                    "virtual host 'mv-none' does not exist"
            assert r.closed()
        with Raw("127.0.0.1", broker.mqtt_port, level) as r:  # the same for a named one
            ack = r.connect(client_id(), "mv-none2:guest", "guest")
            assert isinstance(ack, ConnAck) and ack.reason_code == code
    finally:
        _clear(broker, PORTS)


def test_N1_global_parameters_with_ctl_as_rabbitmqctl(broker: BrokerProcess) -> None:
    """set/clear/list_global_parameter: RabbitMQ 3.10's rabbitmqctl lines, texts and exit
    codes (recorded: a value that is not JSON is 69 "JSON decoding error", clearing one
    that is not there 69 "Parameter does not exist")."""
    d = ["--data-dir", str(broker.data_dir)]
    assert ok(*d, "set_global_parameter", PORTS, '{"1":"mv-tcp"}') == (
        f'Setting global runtime parameter "{PORTS}" to "{{"1":"mv-tcp"}}" ...\n')
    try:
        r = ctl(*d, "set_global_parameter", "x", "notjson")
        assert (r.returncode, r.stderr) == (69, "Error:\nJSON decoding error. Reason: badarg\n")
        assert ok(*d, "list_global_parameters") == (
            "Listing global runtime parameters ...\nname\tvalue\n"
            f'{PORTS}\t{{"1":"mv-tcp"}}\n')
        assert _get(broker, f"/api/global-parameters/{PORTS}") == {
            "name": PORTS, "value": {"1": "mv-tcp"}}
    finally:
        assert ok(*d, "clear_global_parameter", PORTS) == (
            f'Clearing global runtime parameter "{PORTS}" ...\n')
    r = ctl(*d, "clear_global_parameter", PORTS)
    assert (r.returncode, r.stdout, r.stderr) == (
        69, f'Clearing global runtime parameter "{PORTS}" ...\n',
        "Error:\nParameter does not exist\n")
    assert ok(*d, "-q", "list_global_parameters") == ""


@pytest.mark.parametrize("where", ["ackmq", pytest.param("rabbitmq",
                                                         marks=pytest.mark.rabbitmq)])
def test_N1_ctl_url_global_parameter_verbs(broker: BrokerProcess, where: str) -> None:
    """`ackmq ctl --url` drives /api/global-parameters of ackmq and of RabbitMQ 3.10
    alike (a name no one else uses on the shared RabbitMQ, cleared at once)."""
    if where == "rabbitmq":
        from support.mgmthelp import rabbit_http
        url = rabbit_http().replace("http://", "http://guest:guest@")
    else:
        url = http_of(broker)
    u, name = ["--url", url], f"ackmq_test_{client_id('g').replace('-', '_')}"
    try:
        ok(*u, "set_global_parameter", name, '{"1":"v"}')
        assert f'{name}\t{{"1":"v"}}\n' in ok(*u, "-q", "list_global_parameters")
    finally:
        ctl(*u, "clear_global_parameter", name)
    r = ctl(*u, "clear_global_parameter", name)
    assert (r.returncode, r.stderr) == (69, "Error:\nParameter does not exist\n")


def _target(broker: BrokerProcess, where: str) -> Target:
    if where == "rabbitmq":
        from support.mgmthelp import rabbit_http
        return Target("rabbitmq", rabbit_http(), "")
    return Target("ackmq", http_url_of(broker), "")


@pytest.mark.parametrize("where", ["ackmq", pytest.param("rabbitmq",
                                                         marks=pytest.mark.rabbitmq)])
def test_N1_global_parameters_http_api_as_rabbitmq(broker: BrokerProcess, where: str) -> None:
    """PUT /api/global-parameters/<name> `{"value": ...}`: 201 new, 204 replaced; GET
    `{"name", "value"}` and in the listing; a body without `value` or not JSON: 400 with
    RabbitMQ's reasons; DELETE 204, then 404; a `management` user may not (policymaker);
    in the definitions (export and import), as RabbitMQ 3.10's."""
    t = _target(broker, where)
    name = f"ackmq_test_{client_id('g').replace('-', '_')}"
    path = f"/api/global-parameters/{quote(name, safe='')}"
    try:
        assert t.call("PUT", path, {"value": {"1883": "a"}}).status == 201
        assert t.call("PUT", path, {"value": {"1883": "b"}}).status == 204
        got = t.call("GET", path)
        assert (got.status, got.body) == (200, {"name": name, "value": {"1883": "b"}})
        assert {"name": name, "value": {"1883": "b"}} in t.call(
            "GET", "/api/global-parameters").body
        r = t.call("PUT", path, {"name": name})
        assert (r.status, r.body) == (400, {"error": "bad_request",
                                            "reason": "[{key_missing,value}]"})
        r = t.call("PUT", path, b"notjson")
        assert (r.status, r.body["reason"]) == (400, "not_json")
        assert {"name": name, "value": {"1883": "b"}} in t.call(
            "GET", "/api/definitions").body["global_parameters"]
        user = t.user("management")
        try:
            assert t.call("GET", path, auth=user).status == 401
            assert t.call("PUT", path, {"value": 1}, auth=user).status == 401
        finally:
            t.forget()
        assert t.call("DELETE", path).status == 204
        assert t.call("DELETE", path).status == 404
        assert t.call("GET", path).status == 404
        r = t.call("POST", "/api/definitions", {"global_parameters": [
            {"name": name, "value": {"8883": "c"}}]})
        assert r.status in (200, 201, 204), r
        assert t.call("GET", path).body == {"name": name, "value": {"8883": "c"}}
    finally:
        t.call("DELETE", path)


def test_N1_global_parameters_survive_a_restart(tmp_path: Path) -> None:
    """Saved with the other runtime parameters (parameters.json, synced before the
    answer): after a restart the mapping is there and applies."""
    b = BrokerProcess(tmp_path / "d")
    b.start()
    try:
        assert request(b.data_dir / "ctl.sock", "add_vhost", ["mv-kept"])["ok"]
        assert request(b.data_dir / "ctl.sock", "set_permissions",
                       ["guest", ".*", ".*", ".*"], vhost="mv-kept")["ok"]
        _set(b, PORTS, {str(b.mqtt_port): "mv-kept"})
        b.stop()
        b.start()  # the same MQTT port
        assert _get(b, "/api/global-parameters") == [
            {"name": PORTS, "value": {str(b.mqtt_port): "mv-kept"}}]
        assert _landed(b, b.mqtt_port) == "mv-kept"
    finally:
        b.stop()


# -- certificates -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def files(ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("mqtt-vhost-tls")
    out = server_files(ca, d)
    ca.issue_cert("certuser", common_name="certuser", organization_name="client"
                  ).private_key_and_cert_chain_pem.write_to_path(str(d / "certuser.pem"))
    out["certuser"] = d / "certuser.pem"
    return out


def _dn(pem: Path) -> str:
    return x509.load_pem_x509_certificate(pem.read_bytes()).subject.rfc4514_string()


def test_N1_certificate_to_vhost_mapping(tmp_path: Path, files: dict[str, Path]) -> None:
    """`mqtt_default_vhosts` (RabbitMQ's docs: "considered more specific than the
    port-to-vhost mapping ... and so takes precedence over it"): a client with a
    verified certificate opens the vhost its
    subject DN maps to (or its CN, the login name ackmq uses); one not in the mapping,
    the TLS port's mapping, which then wins over `vhost:user` (RabbitMQ's get_vhost_ssl);
    neither: `vhost:user`, then `/`. The same over secure WebSocket (its own port). A
    password login with a certificate is mapped too (RabbitMQ's reader takes the
    certificate's name whenever there is one, `ssl_cert_login` or not)."""
    b = cert_broker(tmp_path, files, "--mqtt-tls-port", "0", "--mqtt-wss-port", "0",
                    "--tls-verify-peer", "--mqtt-ssl-cert-login")
    try:
        port = int(port_in_log(b, MQTTS, "mqtts:// URL"))
        wss = int(port_in_log(b, WSS_URL, "wss:// URL"))
        sock = b.data_dir / "ctl.sock"
        assert request(sock, "add_user", ["certuser", "pw"])["ok"]
        for vh in ("mv-cert", "mv-port", "mv-name"):
            assert request(sock, "add_vhost", [vh])["ok"]
            for user in ("certuser", "guest"):
                assert request(sock, "set_permissions", [user, ".*", ".*", ".*"],
                               vhost=vh)["ok"]
        assert request(sock, "set_permissions", ["certuser", ".*", ".*", ".*"])["ok"]
        dn = _dn(files["certuser"])
        assert dn.startswith("CN=certuser,") and dn.endswith(",O=client")
        tls = {"tls": files}
        assert _landed(b, port, None, cert="certuser", **tls) == "/"
        _set(b, CERTS, {dn: "mv-cert"})
        _set(b, PORTS, {str(port): "mv-port", str(wss): "mv-port"})
        assert _landed(b, port, None, cert="certuser", **tls) == "mv-cert"
        assert _landed(b, wss, None, cert="certuser", ws=True, **tls) == "mv-cert"
        assert _landed(b, wss, "guest", ws=True, **tls) == "mv-port"  # wss://: its port
        assert _landed(b, port, "guest", cert="certuser", **tls) == "mv-cert"
        assert _landed(b, port, "mv-name:guest", **tls) == "mv-name"  # no certificate
        _set(b, CERTS, {"certuser": "mv-cert"})
        assert _landed(b, port, None, cert="certuser", **tls) == "mv-cert"
        _set(b, CERTS, {"O=client,CN=someone else": "mv-cert"})
        assert _landed(b, port, None, cert="certuser", **tls) == "mv-port"
        assert _landed(b, port, "mv-name:guest", cert="certuser", **tls) == "mv-port"
        _clear(b, PORTS)
        assert _landed(b, port, "mv-name:guest", cert="certuser", **tls) == "mv-name"
        _set(b, CERTS, {dn: "mv-gone"})
        assert _landed(b, port, None, cert="certuser", **tls) == 134  # 0x86 / CONNACK 4
        assert "Traceback" not in "".join(b.log)
    finally:
        b.stop()


def test_N1_certificate_mapping_without_certificate_login(tmp_path: Path,
                                                          files: dict[str, Path]) -> None:
    """Without `--mqtt-ssl-cert-login` a verified certificate still picks the vhost of a
    password login (RabbitMQ: `rabbit_mqtt_reader:ssl_login_name` does not look at
    ssl_cert_login, only `creds` does); without a user name it is still refused."""
    b = cert_broker(tmp_path, files, "--mqtt-tls-port", "0", "--tls-verify-peer")
    try:
        port = int(port_in_log(b, MQTTS, "mqtts:// URL"))
        sock = b.data_dir / "ctl.sock"
        assert request(sock, "add_vhost", ["mv-cert"])["ok"]
        assert request(sock, "set_permissions", ["guest", ".*", ".*", ".*"],
                       vhost="mv-cert")["ok"]
        _set(b, CERTS, {_dn(files["certuser"]): "mv-cert"})
        tls = {"tls": files}
        assert _landed(b, port, "guest", cert="certuser", **tls) == "mv-cert"
        assert _landed(b, port, "guest", **tls) == "/"
        assert _landed(b, port, None, cert="certuser", **tls) == 135  # 0x87 / CONNACK 5
    finally:
        b.stop()
