"""U1/U2 and `ackmq ctl`: users, hashes, vhosts, durable in the data dir, managed by the
real `ackmq ctl` command against a real `ackmq serve` subprocess (and compared with
RabbitMQ 3.10 where it answers a client)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pika
import pika.exceptions
import pytest
from conftest import BrokerProcess, rabbitmq_url
from support.mgmthelp import Target as Api
from support.mgmthelp import q, rabbit_http

PW = "s3cret-pw"


def ctl(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ackmq", "ctl", "--data-dir", str(data_dir),
                           *args], capture_output=True, text=True, timeout=60)


def ok(data_dir: Path, *args: str) -> str:
    r = ctl(data_dir, *args)
    assert r.returncode == 0, (args, r.stdout, r.stderr)
    return r.stdout


def params(port: int, user: str, password: str, vhost: str = "/") -> pika.ConnectionParameters:
    return pika.ConnectionParameters("127.0.0.1", port, vhost,
                                     pika.PlainCredentials(user, password),
                                     connection_attempts=1)


def connect_error(p: pika.ConnectionParameters) -> tuple[int, str] | None:
    """None if the connection opens, else the broker's (code, text) from its
    connection.close (pika wraps it in a "probable" error whose text holds both)."""
    try:
        pika.BlockingConnection(p).close()
        return None
    except pika.exceptions.AMQPConnectionError as e:
        m = re.search(r"\((\d+)\) (['\"])(.*)\2", str(e))
        if m is None:
            raise
        return int(m.group(1)), m.group(3).replace("\\'", "'")


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path / "data")
    b.start()
    yield b
    b.stop()


# -- U1 ---------------------------------------------------------------------------------

def test_U1_guest_by_default_and_ctl_users_log_in(broker: BrokerProcess) -> None:
    d = broker.data_dir
    assert ok(d, "list_users") == "Listing users ...\nuser\ttags\nguest\t[administrator]\n"
    ok(d, "add_user", "alice", PW)
    ok(d, "set_permissions", "alice", ".*", ".*", ".*")
    ok(d, "set_user_tags", "alice", "monitoring", "policymaker")
    assert "alice\t[monitoring, policymaker]\n" in ok(d, "list_users")
    assert connect_error(params(broker.port, "alice", PW)) is None
    code, text = connect_error(params(broker.port, "alice", "wrong"))  # type: ignore[misc]
    assert (code, text) == (403, "ACCESS_REFUSED - Login was refused using authentication "
                                 "mechanism PLAIN. For details see the broker logfile.")
    ok(d, "change_password", "alice", "new-pw")
    assert connect_error(params(broker.port, "alice", PW))[0] == 403  # type: ignore[index]
    assert connect_error(params(broker.port, "alice", "new-pw")) is None
    ok(d, "delete_user", "alice")
    assert connect_error(params(broker.port, "alice", "new-pw"))[0] == 403  # type: ignore[index]


def test_U1_users_are_durable_and_the_file_is_private(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "data")
    b.start()
    try:
        ok(b.data_dir, "add_user", "dora", PW)
        ok(b.data_dir, "set_permissions", "dora", "^d", ".*", ".*")
    finally:
        b.stop()
    f = b.data_dir / "access.json"
    assert stat.S_IMODE(f.stat().st_mode) == 0o600
    assert not (b.data_dir / "access.json.tmp").exists()
    assert PW not in f.read_text()  # only the salted hash is stored
    b2 = BrokerProcess(b.data_dir)
    b2.start()
    try:
        assert connect_error(params(b2.port, "dora", PW)) is None
        assert "/\t^d\t.*\t.*" in ok(b2.data_dir, "list_user_permissions", "dora")
    finally:
        b2.stop()


def _rabbit_hash(algorithm: str, password: str) -> str:
    """RabbitMQ's layout computed here independently: base64(salt4 + H(salt4 + pw))."""
    salt = os.urandom(4)
    h = {"sha512": hashlib.sha512, "md5": hashlib.md5}[algorithm]
    return base64.b64encode(salt + h(salt + password.encode()).digest()).decode()


def test_U1_sha512_and_md5_hashes_import_and_log_in(broker: BrokerProcess,
                                                     tmp_path: Path) -> None:
    defs = {"users": [
        {"name": "u512", "password_hash": _rabbit_hash("sha512", PW),
         "hashing_algorithm": "rabbit_password_hashing_sha512", "tags": ""},
        {"name": "umd5", "password_hash": _rabbit_hash("md5", PW),
         "hashing_algorithm": "rabbit_password_hashing_md5", "tags": "management"}],
        "permissions": [{"user": u, "vhost": "/", "configure": ".*", "write": ".*",
                         "read": ".*"} for u in ("u512", "umd5")]}
    f = tmp_path / "defs.json"
    f.write_text(json.dumps(defs))
    ok(broker.data_dir, "import_definitions", str(f))
    for user in ("u512", "umd5"):
        assert connect_error(params(broker.port, user, PW)) is None
        assert connect_error(params(broker.port, user, PW + "x"))[0] == 403  # type: ignore[index]
    assert "umd5\t[management]" in ok(broker.data_dir, "list_users")


def test_U1_rabbitmq_exported_hash_logs_in_on_ackmq(broker: BrokerProcess,
                                                    tmp_path: Path) -> None:
    """`rabbitmqctl add_user` + `export_definitions`, imported with `ackmq ctl`: the
    RabbitMQ-made hash logs in on ackmq with the same password."""
    rabbitmq_url()
    if shutil.which("rabbitmqctl") is None:
        pytest.skip("rabbitmqctl is not on PATH")
    user = f"ackU_exp_{uuid.uuid4().hex[:6]}"
    # written by the RabbitMQ node (its own OS user): not into pytest's private tmp dir
    out = Path("/tmp") / f"{user}.json"
    subprocess.run(["rabbitmqctl", "add_user", user, PW], check=True, capture_output=True)
    try:
        subprocess.run(["rabbitmqctl", "export_definitions", str(out)], check=True,
                       capture_output=True)
    finally:
        subprocess.run(["rabbitmqctl", "delete_user", user], capture_output=True)
    exported = json.loads(out.read_text())
    out.unlink()
    mine = [u for u in exported["users"] if u["name"] == user]
    assert mine and mine[0]["hashing_algorithm"] == "rabbit_password_hashing_sha256"
    # only this user: the export also holds the reference broker's other users
    f = tmp_path / "one.json"
    f.write_text(json.dumps({"users": mine}))
    assert "Importing definitions" in ok(broker.data_dir, "import_definitions", str(f))
    ok(broker.data_dir, "set_permissions", user, ".*", ".*", ".*")
    assert connect_error(params(broker.port, user, PW)) is None
    assert connect_error(params(broker.port, user, "not-it"))[0] == 403  # type: ignore[index]


def test_U1_default_user_on_first_start_only(tmp_path: Path) -> None:
    data = tmp_path / "data"
    b = BrokerProcess(data, "--default-user", "boss", "--default-pass", PW)
    b.start()
    try:
        assert "guest" not in b.url  # the URL shows no credentials then
        assert connect_error(params(b.port, "boss", PW)) is None
        assert connect_error(params(b.port, "guest", "guest"))[0] == 403  # type: ignore[index]
        assert ok(data, "list_users").endswith("boss\t[administrator]\n")
    finally:
        b.stop()
    env_b = BrokerProcess(data)  # restart with other env defaults: ignored, users kept
    os.environ["ACKMQ_DEFAULT_USER"], os.environ["ACKMQ_DEFAULT_PASS"] = "other", "pw2"
    try:
        env_b.start()
    finally:
        del os.environ["ACKMQ_DEFAULT_USER"], os.environ["ACKMQ_DEFAULT_PASS"]
    try:
        assert connect_error(params(env_b.port, "boss", PW)) is None
        assert connect_error(params(env_b.port, "other", "pw2"))[0] == 403  # type: ignore[index]
    finally:
        env_b.stop()


def test_U1_default_user_from_environment(tmp_path: Path) -> None:
    env = {**os.environ, "ACKMQ_DEFAULT_USER": "envboss", "ACKMQ_DEFAULT_PASS": PW}
    os.environ.update({"ACKMQ_DEFAULT_USER": "envboss", "ACKMQ_DEFAULT_PASS": PW})
    try:
        b = BrokerProcess(tmp_path / "data")
        b.start()
    finally:
        for k in ("ACKMQ_DEFAULT_USER", "ACKMQ_DEFAULT_PASS"):
            os.environ.pop(k)
    try:
        assert env["ACKMQ_DEFAULT_USER"] == "envboss"
        assert connect_error(params(b.port, "envboss", PW)) is None
    finally:
        b.stop()


def test_U1_default_user_without_password_is_a_clear_error(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "ackmq", "serve", "--port", "0", "--data-dir",
                        str(tmp_path), "--default-user", "boss"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2
    assert "--default-pass" in r.stderr and "Traceback" not in r.stderr


# -- U2 ---------------------------------------------------------------------------------

def test_U2_connection_open_answers_as_rabbitmq(broker: BrokerProcess) -> None:
    """A missing vhost, and one the user has no permission on: 530 with RabbitMQ's text,
    compared with the reference broker when it is there."""
    d = broker.data_dir
    user, vhost = "ackU_open", "ackU_open_v"
    ok(d, "add_user", user, PW)
    ok(d, "add_vhost", vhost)
    mine = [connect_error(params(broker.port, user, PW, "ackU_nowhere")),
            connect_error(params(broker.port, user, PW, vhost))]
    assert mine == [(530, "NOT_ALLOWED - vhost ackU_nowhere not found"),
                    (530, f"NOT_ALLOWED - access to vhost '{vhost}' refused for user '{user}'")]
    try:
        url = rabbitmq_url()
        # made through RabbitMQ's management API: a rabbitmqctl call is an Erlang VM start
        api = Api("rabbitmq", rabbit_http(), url)
    except pytest.skip.Exception:
        return
    port = pika.URLParameters(url).port
    assert api.call("PUT", f"/api/users/{q(user)}", {"password": PW, "tags": ""}).status \
        in (201, 204)
    assert api.call("PUT", f"/api/vhosts/{q(vhost)}").status in (201, 204)
    try:
        theirs = [connect_error(params(port, user, PW, "ackU_nowhere")),
                  connect_error(params(port, user, PW, vhost))]
    finally:
        api.call("DELETE", f"/api/users/{q(user)}")
        api.call("DELETE", f"/api/vhosts/{q(vhost)}")
    assert mine == theirs


def test_U2_vhosts_are_separate_and_durable(tmp_path: Path) -> None:
    data = tmp_path / "data"
    b = BrokerProcess(data)
    b.start()
    try:
        ok(data, "add_vhost", "v1")
        ok(data, "set_permissions", "-p", "v1", "guest", ".*", ".*", ".*")
        for vhost, body in (("/", b"root"), ("v1", b"in-v1")):
            conn = pika.BlockingConnection(params(b.port, "guest", "guest", vhost))
            ch = conn.channel()
            ch.confirm_delivery()
            ch.queue_declare("same-name", durable=True)
            ch.exchange_declare("x-same", "fanout", durable=True)
            ch.queue_bind("same-name", "x-same")
            ch.basic_publish("x-same", "", body, pika.BasicProperties(delivery_mode=2))
            conn.close()
    finally:
        b.stop()
    b2 = BrokerProcess(data)
    b2.start()
    try:
        assert "/\nv1\n" in ok(data, "list_vhosts")
        for vhost, body in (("/", b"root"), ("v1", b"in-v1")):
            conn = pika.BlockingConnection(params(b2.port, "guest", "guest", vhost))
            ch = conn.channel()
            ch.basic_publish("x-same", "", body + b"2")  # the binding came back too
            got = [ch.basic_get("same-name", auto_ack=True)[2] for _ in range(2)]
            assert got == [body, body + b"2"], vhost
            conn.close()
    finally:
        b2.stop()


def test_U2_delete_vhost_closes_its_connections_and_removes_its_queues(tmp_path: Path) -> None:
    data = tmp_path / "data"
    b = BrokerProcess(data)
    b.start()
    try:
        ok(data, "add_vhost", "gone")
        ok(data, "set_permissions", "-p", "gone", "guest", ".*", ".*", ".*")
        conn = pika.BlockingConnection(params(b.port, "guest", "guest", "gone"))
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("dq", durable=True)
        ch.basic_publish("", "dq", b"persistent", pika.BasicProperties(delivery_mode=2))
        root = pika.BlockingConnection(params(b.port, "guest", "guest", "/"))
        assert "Deleting vhost" in ok(data, "delete_vhost", "gone")
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as e:
            for _ in range(50):
                conn.process_data_events(0.1)
        assert (e.value.reply_code, e.value.reply_text) == (
            320, "CONNECTION_FORCED - vhost 'gone' is deleted")  # as RabbitMQ 3.10
        assert root.is_open  # other vhosts' connections stay
        root.process_data_events(0.1)
        root.close()
        ok(data, "add_vhost", "gone")
        ok(data, "set_permissions", "-p", "gone", "guest", ".*", ".*", ".*")
        conn = pika.BlockingConnection(params(b.port, "guest", "guest", "gone"))
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e2:
            conn.channel().queue_declare("dq", passive=True)
        assert e2.value.reply_code == 404
        conn.close()
    finally:
        b.stop()
    b2 = BrokerProcess(data)  # and its stored messages are gone for good
    b2.start()
    try:
        conn = pika.BlockingConnection(params(b2.port, "guest", "guest", "gone"))
        ch = conn.channel()
        ch.queue_declare("dq", durable=True)
        assert ch.basic_get("dq")[0] is None
        conn.close()
    finally:
        b2.stop()


# -- ackmq ctl ----------------------------------------------------------------------------

def test_ctl_errors_as_rabbitmqctl(broker: BrokerProcess) -> None:
    d = broker.data_dir
    cases = [
        (("add_user", "guest", "x"), 70, 'User "guest" already exists'),
        (("delete_user", "nobody"), 67, 'User "nobody" does not exist'),
        (("change_password", "nobody", "x"), 67, 'User "nobody" does not exist'),
        (("delete_vhost", "novh"), 65, "Virtual host 'novh' does not exist"),
        (("set_permissions", "-p", "novh", "guest", "a", "b", "c"), 69,
         "Virtual host novh does not exist"),
        (("set_permissions", "guest", "(", ".*", ".*"), 69, "regular expression '('"),
        (("list_permissions", "-p", "novh"), 65, "Virtual host 'novh' does not exist"),
    ]
    for args, code, text in cases:
        r = ctl(d, *args)
        assert r.returncode == code, (args, r.stdout, r.stderr)
        assert text in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
    r = ctl(d, "add_user", "onlyname")  # argparse: usage and exit 2
    assert r.returncode == 2 and "password" in r.stderr


def test_ctl_socket_is_private_and_says_what_to_fix(broker: BrokerProcess,
                                                    tmp_path: Path) -> None:
    sock = broker.data_dir / "ctl.sock"
    assert stat.S_ISSOCK(sock.stat().st_mode) and stat.S_IMODE(sock.stat().st_mode) == 0o600
    r = ctl(tmp_path / "not-a-data-dir", "list_users")
    assert r.returncode == 69 and "Traceback" not in r.stderr
    assert "admin socket" in r.stderr and "--data-dir" in r.stderr
    h = subprocess.run([sys.executable, "-m", "ackmq", "ctl", "--help"], capture_output=True,
                       text=True, timeout=60)
    assert "admin socket" in h.stdout and "management" in h.stdout


def test_ctl_list_output_is_tab_separated_with_header(broker: BrokerProcess) -> None:
    d = broker.data_dir
    ok(d, "add_vhost", "lv")
    assert ok(d, "list_permissions", "-p", "lv") == 'Listing permissions for vhost "lv" ...\n'
    ok(d, "set_permissions", "-p", "lv", "guest", "^c", "^w", "^r")
    assert ok(d, "-q", "list_permissions", "-p", "lv") == \
        "user\tconfigure\twrite\tread\nguest\t^c\t^w\t^r\n"
    assert ok(d, "-q", "list_user_permissions", "guest") == \
        "vhost\tconfigure\twrite\tread\n/\t.*\t.*\t.*\nlv\t^c\t^w\t^r\n"
    ok(d, "clear_permissions", "-p", "lv", "guest")
    assert ok(d, "-q", "list_vhosts") == "name\n/\nlv\n"
    assert ok(d, "-q", "list_user_permissions", "guest") == \
        "vhost\tconfigure\twrite\tread\n/\t.*\t.*\t.*\n"


def test_U1_delete_user_closes_its_connections(broker: BrokerProcess) -> None:
    """As RabbitMQ 3.10 (checked by hand: `rabbitmqctl delete_user` with a client open
    gives 320 "CONNECTION_FORCED - user '...' is deleted")."""
    d = broker.data_dir
    ok(d, "add_user", "carl", PW)
    ok(d, "set_permissions", "carl", ".*", ".*", ".*")
    conn = pika.BlockingConnection(params(broker.port, "carl", PW))
    guest = pika.BlockingConnection(params(broker.port, "guest", "guest"))
    ok(d, "delete_user", "carl")
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as e:
        for _ in range(50):
            conn.process_data_events(0.1)
    assert (e.value.reply_code, e.value.reply_text) == (
        320, "CONNECTION_FORCED - user 'carl' is deleted")
    guest.process_data_events(0.1)
    assert guest.is_open
    guest.close()


def test_U3_revoked_permission_applies_to_open_channels(broker: BrokerProcess) -> None:
    """As RabbitMQ 3.10: clear_permissions leaves the connection open, and the next
    operation is refused even on a resource the channel was allowed before (the
    channel's cache is emptied); a publish cached as allowed is refused too."""
    d = broker.data_dir
    ok(d, "add_user", "erin", PW)
    ok(d, "set_permissions", "erin", ".*", ".*", ".*")
    conn = pika.BlockingConnection(params(broker.port, "erin", PW))
    ch = conn.channel()
    ch.queue_declare("erin-q", exclusive=True)
    ch.confirm_delivery()
    ch.basic_publish("", "erin-q", b"1")
    pub = conn.channel()
    pub.confirm_delivery()
    pub.basic_publish("", "erin-q", b"2")
    ok(d, "clear_permissions", "erin")
    conn.process_data_events(0.2)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
        ch.queue_declare("erin-q", exclusive=True)
    assert (e.value.reply_code, e.value.reply_text) == (
        403, "ACCESS_REFUSED - access to queue 'erin-q' in vhost '/' refused for user 'erin'")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
        pub.basic_publish("", "erin-q", b"3")
    assert e.value.reply_text == ("ACCESS_REFUSED - access to exchange 'amq.default' in "
                                  "vhost '/' refused for user 'erin'")
    conn.close()


def test_U1_damaged_access_file_stops_the_broker_with_its_name(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "access.json").write_text('{"users": [{"nam')
    r = subprocess.run([sys.executable, "-m", "ackmq", "serve", "--port", "0", "--data-dir",
                        str(data)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 3
    assert "access.json" in r.stdout + r.stderr and "Traceback" not in r.stdout + r.stderr


def test_U1_other_users_may_connect_from_other_hosts_guest_only_via_loopback(
        tmp_path: Path) -> None:
    import socket

    from test_connection_edges import _local_address
    address = _local_address(socket.AF_INET)
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address to connect from")
    b = BrokerProcess(tmp_path / "data", "--host", "0.0.0.0")
    b.start()
    try:
        ok(b.data_dir, "add_user", "remote", PW)
        ok(b.data_dir, "set_permissions", "remote", ".*", ".*", ".*")
        p = pika.ConnectionParameters(address, b.port, "/", pika.PlainCredentials("remote", PW),
                                      connection_attempts=1)
        assert connect_error(p) is None
        g = pika.ConnectionParameters(address, b.port, "/",
                                      pika.PlainCredentials("guest", "guest"),
                                      connection_attempts=1)
        assert connect_error(g) == (403, "ACCESS_REFUSED - PLAIN login refused: user 'guest' "
                                         "can only connect via localhost")
    finally:
        b.stop()


def test_ctl_admin_socket_answers_garbage_and_keeps_serving(broker: BrokerProcess) -> None:
    """Bad requests on the admin socket get an error line, never a dead broker."""
    import socket
    sock = broker.data_dir / "ctl.sock"
    for bad in (b"not json\n", b'{"verb": 5}\n', b'{"verb": "add_user", "args": []}\n',
                b'{"verb": "import_definitions", "definitions": [1]}\n', b"[]\n"):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(10)
            s.connect(str(sock))
            s.sendall(bad)
            reply = json.loads(s.makefile("rb").readline())
            assert reply["ok"] is False and reply["code"] in (64, 70), (bad, reply)
    assert "guest" in ok(broker.data_dir, "list_users")
    assert connect_error(params(broker.port, "guest", "guest")) is None
