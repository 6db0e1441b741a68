"""The brokers under test: find their process, start a local RabbitMQ or an ackmq."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from ackmq.bench.stomp_wire import StompWireError, parse_stomp_url, probe_stomp
from ackmq.bench.wire import URL_FORM, BadURL, parse_url, redact
from ackmq.client import ClientError, connect
from ackmq.client import parse_url as client_url

RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:5672/"
RABBITMQ_STOMP_URL = "stomp://guest:guest@127.0.0.1:61623/"
ACTIVEMQ_STOMP_URL = "stomp://guest:guest@127.0.0.1:61613/"
_URL_LINE = re.compile(r"listening on (amqp://\S+)")
_STOMP_LINE = re.compile(r"(stomp://[^\s,)]+)")
_STREAM_LINE = re.compile(r"(rabbitmq-stream://[^\s,)]+)")
_MQTT_LINE = re.compile(r"(mqtt://[^\s,)]+)")
RABBITMQ_MQTT_URL = "mqtt://guest:guest@127.0.0.1:1883"
MOSQUITTO_URL = "mqtt://127.0.0.1:1884"  # /work/shared/tools/mosquitto-local: anonymous


class BenchSetupError(Exception):
    """A broker could not be found or started; the message says what to do."""


@dataclass
class Target:
    """One broker: where it listens, what it is, and its process (for CPU and memory)."""

    url: str
    label: str = ""
    product: str = ""
    version: str = ""
    pid: int | None = None
    data_dir: Path | None = None
    stomp_url: str = ""  # stomp://host:port when the broker has a STOMP listener
    # rabbitmq-stream://host:port of its stream-protocol listener (ackmq's from its log;
    # RabbitMQ's stream plugin: 5552 on the AMQP host)
    stream_url: str = ""
    mqtt_url: str = ""  # mqtt://[user:pass@]host:port when the broker has an MQTT listener
    _cleanup: list = field(default_factory=list, repr=False)

    @property
    def process(self) -> psutil.Process | None:
        if self.pid is None:
            return None
        try:
            return psutil.Process(self.pid)
        except psutil.Error:
            return None

    def public_url(self) -> str:
        """The URL without its password, for reports (the STOMP one when it has one)."""
        return redact(self.stomp_url or self.mqtt_url or self.url)

    def close(self) -> None:
        while self._cleanup:
            self._cleanup.pop()()


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def find_listener_pid(port: int) -> int | None:
    """pid of the process listening on `port` (RabbitMQ: beam.smp), or None if hidden."""
    try:
        conns = psutil.net_connections(kind="tcp")
    except psutil.Error:
        return None
    for c in conns:
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid:
            return c.pid
    return None


def check_url(url: str) -> None:
    """A BenchSetupError saying what form is expected unless both the bench and
    ackmq.client accept the URL (amqp://user:pass@host:port/vhost; no amqps, no other
    scheme)."""
    try:
        parse_url(url)
    except BadURL as exc:
        raise BenchSetupError(str(exc)) from None
    try:
        client_url(url)
    except (ValueError, TypeError) as exc:
        raise BenchSetupError(f"bad broker URL {redact(url)!r} ({exc}); "
                              f"expected {URL_FORM}") from None


def probe(target: Target) -> Target:
    """Fill in product/version/label from connection.start and the pid from the port."""
    check_url(target.url)
    parts = parse_url(target.url)
    try:
        with connect(target.url, heartbeat=0, connect_timeout=10.0,
                     connection_name="ackmq-bench-probe") as conn:
            props = dict(conn.server_properties or {})
    except (ClientError, OSError) as exc:  # any failure here means "cannot reach"
        raise BenchSetupError(f"cannot connect to {target.public_url()}: {exc!r}") from exc

    def text(v: object) -> str:
        return v.decode() if isinstance(v, bytes) else str(v or "")

    target.product = text(props.get("product"))
    target.version = text(props.get("version"))
    if not target.label:
        p = target.product.lower()
        target.label = "rabbitmq" if "rabbitmq" in p else "ackmq" if "ackmq" in p else (
            f"{parts.host}:{parts.port}")
    if target.pid is None and parts.host in ("127.0.0.1", "localhost", "::1"):
        target.pid = find_listener_pid(parts.port)
    return target


def rabbitmq_env() -> dict[str, str]:
    """Loopback-only RabbitMQ, as /work/shared/tools/rabbitmq-local starts it."""
    env = dict(os.environ)
    env.update(RABBITMQ_NODE_IP_ADDRESS="127.0.0.1", RABBITMQ_NODE_PORT="5672",
               ERL_EPMD_ADDRESS="127.0.0.1", RABBITMQ_DIST_PORT="25672",
               RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}")
    return env


def _listener(port: int) -> str:
    """'pid N, name' of what listens on `port`, for messages."""
    pid = find_listener_pid(port)
    if pid is None:
        return "process unknown"
    try:
        return f"pid {pid}, {psutil.Process(pid).name()}"
    except psutil.Error:
        return f"pid {pid}"


def _expect_rabbitmq(url: str) -> Target:
    """Probe `url` and insist that connection.start says RabbitMQ."""
    parts = parse_url(url)
    where = f"{parts.host}:{parts.port}"
    try:
        target = probe(Target(url))
    except BenchSetupError as exc:
        raise BenchSetupError(f"--rabbitmq: something listens on {where} ({_listener(parts.port)}) "
                              f"but no RabbitMQ answered there as guest/guest: {exc}") from None
    if "rabbitmq" not in target.product.lower():
        what = f"{target.product or 'a broker without a product name'} {target.version}".strip()
        raise BenchSetupError(f"--rabbitmq: {where} is answered by {what} ({_listener(parts.port)}), "
                              "not RabbitMQ; stop it, or name it with --compare URL if you "
                              "meant to compare against it")
    return target


def local_rabbitmq(start_timeout: float = 120.0, url: str | None = None) -> Target:
    """Use the RabbitMQ on 127.0.0.1:5672, starting one (and stopping it later) if needed.

    Whatever answers there must say it is RabbitMQ in connection.start. (`url` and
    RABBITMQ_URL are for tests; a RabbitMQ started here always listens on 5672.)"""
    url = url or RABBITMQ_URL
    parts = parse_url(url)
    if port_open(parts.host, parts.port):
        return _expect_rabbitmq(url)
    server = shutil.which("rabbitmq-server")
    if server is None:
        raise BenchSetupError(
            f"--rabbitmq: nothing listens on {parts.host}:{parts.port} and rabbitmq-server is not "
            "installed. Install it with `apt-get install rabbitmq-server` (Debian/Ubuntu), "
            "or pass --compare amqp://user:pass@host:port/ for a broker you already run.")
    env = rabbitmq_env()
    try:
        subprocess.run([server, "-detached"], env=env, check=True, timeout=start_timeout,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        why = (f"exit status {exc.returncode}" if isinstance(exc, subprocess.CalledProcessError)
               else str(exc))
        raise BenchSetupError(f"--rabbitmq: nothing listens on {parts.host}:{parts.port} and "
                              f"`{server} -detached` failed ({why}); run it yourself to see why "
                              "(logs in /var/log/rabbitmq/), or pass --compare URL") from None
    deadline = time.monotonic() + start_timeout
    while not port_open(parts.host, parts.port):
        if time.monotonic() > deadline:
            raise BenchSetupError(f"rabbitmq-server -detached did not open {parts.host}:{parts.port} "
                                  f"within {start_timeout:.0f}s; see /var/log/rabbitmq/")
        time.sleep(0.5)

    def stop() -> None:
        subprocess.run(["rabbitmqctl", "stop"], env=env, check=False,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    try:
        target = _expect_rabbitmq(url)
    except BaseException:
        stop()
        raise
    target._cleanup.append(stop)
    return target


def start_ackmq(data_dir: Path | None = None, timeout: float = 60.0,
                stomp: bool = False, mqtt: bool = False) -> Target:
    """`python -m ackmq serve --port 0` in a fresh data directory; stopped by Target.close.

    With `stomp`, STOMP listens on a free port (`--stomp-port 0`, never 61613: that is
    ActiveMQ's, a reference broker in the same run), read from the log line; with `mqtt`,
    MQTT on a free one (`--mqtt-port 0`: 1883 and 1884 are the reference brokers')."""
    owned = data_dir is None
    # /var/tmp, not /tmp: /tmp is often tmpfs, where fsync costs nothing and flatters ackmq
    base = "/var/tmp" if os.path.isdir("/var/tmp") else None
    ddir = Path(tempfile.mkdtemp(prefix="ackmq-bench-data-", dir=base)) if owned else data_dir
    assert ddir is not None
    ddir.mkdir(parents=True, exist_ok=True)
    stomp_args = ((["--stomp-port", "0"] if stomp else ["--no-stomp"])
                  + (["--mqtt-port", "0"] if mqtt else ["--no-mqtt"]))
    proc = subprocess.Popen([sys.executable, "-m", "ackmq", "serve", "--port", "0", *stomp_args,
                             "--http-port", "0", "--stream-port", "0",
                             "--data-dir", str(ddir)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    log: list[str] = []
    url = stomp_url = stream_url = mqtt_url = ""
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        log.append(line)
        m = _URL_LINE.search(line)
        if m:
            url = m.group(1)
            sm = _STOMP_LINE.search(line)
            stomp_url = sm.group(1) if sm else ""
            st = _STREAM_LINE.search(line)
            stream_url = st.group(1) if st else ""
            mq = _MQTT_LINE.search(line)
            mqtt_url = mq.group(1).replace("mqtt://", "mqtt://guest:guest@", 1) if mq else ""
            break
    if not url:
        proc.kill()
        proc.wait(10)
        if owned:
            shutil.rmtree(ddir, ignore_errors=True)
        raise BenchSetupError("`python -m ackmq serve` did not start:\n" + "".join(log[-20:]))

    def drain() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            log.append(line)
            del log[:-200]

    threading.Thread(target=drain, daemon=True).start()
    target = Target(url, pid=proc.pid, data_dir=ddir, stomp_url=stomp_url,
                    stream_url=stream_url, mqtt_url=mqtt_url)

    def stop() -> None:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        if owned:
            shutil.rmtree(ddir, ignore_errors=True)

    target._cleanup.append(stop)
    try:
        probe(target)
    except BaseException:
        target.close()
        raise
    if mqtt and not mqtt_url:
        target.close()
        raise BenchSetupError("`python -m ackmq serve --mqtt-port 0` logged no mqtt:// URL:\n"
                              + "".join(log[-20:]))
    if stomp and not stomp_url:
        target.close()
        raise BenchSetupError("`python -m ackmq serve --stomp-port 0` logged no stomp:// URL:\n"
                              + "".join(log[-20:]))
    return target


def check_stomp_url(url: str) -> None:
    """A BenchSetupError naming the expected form unless `url` is stomp://..."""
    try:
        parse_stomp_url(url)
    except ValueError as exc:
        raise BenchSetupError(str(exc)) from None


def probe_stomp_target(url: str, amqp_url: str = "", label: str = "") -> Target:
    """A STOMP broker: product and version from CONNECTED's `server` header, the pid of
    the process on its port. `amqp_url`, when the broker also speaks AMQP, is how the
    runs delete their queues afterwards."""
    check_stomp_url(url)
    parts = parse_stomp_url(url)
    try:
        headers = probe_stomp(url)
    except (OSError, StompWireError) as exc:
        raise BenchSetupError(f"cannot connect to {redact(url)} over STOMP as {parts.user}: "
                              f"{exc}") from None
    product, _, version = headers.get("server", "").partition("/")
    p = product.lower()
    if not label:
        label = ("rabbitmq" if "rabbitmq" in p else "activemq" if "activemq" in p
                 else "ackmq" if "ackmq" in p else f"{parts.host}:{parts.port}")
    pid = (find_listener_pid(parts.port) if parts.host in ("127.0.0.1", "localhost", "::1")
           else None)
    return Target(amqp_url, label=label, product=product, version=version.split(" ")[0],
                  pid=pid, stomp_url=url)


def _expect_stomp(url: str, want: str, flag: str, how: str, amqp_url: str = "") -> Target:
    """The STOMP broker at `url`, which must call itself `want` in CONNECTED."""
    parts = parse_stomp_url(url)
    where = f"{parts.host}:{parts.port}"
    if not port_open(parts.host, parts.port):
        raise BenchSetupError(f"{flag}: nothing listens on {where}; {how}")
    target = probe_stomp_target(url, amqp_url)
    if want.lower() not in target.product.lower():
        what = f"{target.product or 'a broker without a server header'} {target.version}".strip()
        raise BenchSetupError(f"{flag}: {where} is answered by {what} ({_listener(parts.port)}), "
                              f"not {want}; name it with --stomp-url URL if you meant it")
    return target


def rabbitmq_stomp(url: str | None = None) -> Target:
    """RabbitMQ's STOMP plugin on 127.0.0.1:61623 (as rabbitmq-local starts it); its
    AMQP side on 5672 deletes the runs' queues."""
    amqp = RABBITMQ_URL if port_open("127.0.0.1", 5672) else ""
    return _expect_stomp(url or RABBITMQ_STOMP_URL, "RabbitMQ", "--rabbitmq-stomp",
                         "start RabbitMQ with its STOMP plugin "
                         "(/work/shared/tools/rabbitmq-local start)", amqp)


def activemq(url: str | None = None) -> Target:
    """ActiveMQ Classic's STOMP transport on 127.0.0.1:61613 (activemq-local start)."""
    return _expect_stomp(url or ACTIVEMQ_STOMP_URL, "ActiveMQ", "--activemq",
                         "start ActiveMQ (/work/shared/tools/activemq-local start)")


def ackmq_and_rabbitmq(url: str | None = None, pid: int | None = None,
                       rabbitmq: bool = True) -> list[Target]:
    """The two brokers the per-message benches measure, labelled "ackmq" and "rabbitmq":
    ackmq at `url` (else one started here) and the local RabbitMQ unless `rabbitmq` is
    False. A set-up error closes what was opened and is raised (BenchSetupError)."""
    targets: list[Target] = []
    try:
        if url:
            targets.append(Target(url, label="ackmq", pid=pid))
        else:
            targets.append(start_ackmq())
            targets[0].label = "ackmq"
        if rabbitmq:
            rmq = local_rabbitmq()
            rmq.label = "rabbitmq"
            targets.append(rmq)
    except BenchSetupError:
        for t in targets:
            t.close()
        raise
    return targets


def probe_mqtt_target(url: str, label: str = "", product: str = "", version: str = "",
                      amqp_url: str = "") -> Target:
    """An MQTT broker: a CONNECT answered by CONNACK 0 (MQTT says nothing of the product:
    `label`/`product` are the caller's, else host:port), the pid of the process on its
    port. `amqp_url`: the broker's AMQP side, when it has one (RabbitMQ's version)."""
    from ackmq.bench.mqtt_wire import MqttConnection, MqttWireError, parse_mqtt_url

    try:
        host, port, user, _ = parse_mqtt_url(url)
    except ValueError as exc:
        raise BenchSetupError(str(exc)) from None

    async def connect() -> None:
        c = await MqttConnection.open(url, "ackmq-bench-probe")
        await c.close()

    from ackmq.bench.context import run_async
    try:
        run_async(connect())
    except (OSError, MqttWireError, TimeoutError) as exc:
        raise BenchSetupError(f"cannot connect to {redact(url)} over MQTT"
                              f"{' as ' + user if user else ''}: {exc!r}") from None
    pid = find_listener_pid(port) if host in ("127.0.0.1", "localhost", "::1") else None
    return Target(amqp_url, label=label or f"{host}:{port}", product=product or "MQTT broker",
                  version=version, pid=pid, mqtt_url=url)


def rabbitmq_mqtt(url: str | None = None) -> Target:
    """RabbitMQ's MQTT plugin on 127.0.0.1:1883 (MQTT 3.1.1; QoS 2 downgraded to 1); its
    AMQP side on 5672 gives the version."""
    url = url or RABBITMQ_MQTT_URL
    from ackmq.bench.mqtt_wire import parse_mqtt_url

    host, port, _, _ = parse_mqtt_url(url)
    if not port_open(host, port):
        raise BenchSetupError(f"--rabbitmq-mqtt: nothing listens on {host}:{port}; enable "
                              "RabbitMQ's MQTT plugin (/work/shared/tools/rabbitmq-local "
                              "enable mqtt)")
    version, amqp = "", ""
    if port_open("127.0.0.1", 5672):
        try:
            rmq = _expect_rabbitmq(RABBITMQ_URL)
            version, amqp = rmq.version, RABBITMQ_URL
        except BenchSetupError:
            pass
    return probe_mqtt_target(url, "rabbitmq", "RabbitMQ MQTT plugin", version, amqp)


def mosquitto(url: str | None = None) -> Target:
    """Mosquitto 2.0 on 127.0.0.1:1884 (/work/shared/tools/mosquitto-local start);
    its version from `mosquitto -h` when it is installed here."""
    url = url or MOSQUITTO_URL
    from ackmq.bench.mqtt_wire import parse_mqtt_url

    host, port, _, _ = parse_mqtt_url(url)
    if not port_open(host, port):
        raise BenchSetupError(f"--mosquitto: nothing listens on {host}:{port}; start it "
                              "(/work/shared/tools/mosquitto-local start)")
    version = ""
    exe = shutil.which("mosquitto")
    if exe:
        try:
            out = subprocess.run([exe, "-h"], capture_output=True, text=True, timeout=10).stdout
            m = re.search(r"version (\S+)", out)
            version = m.group(1) if m else ""
        except (OSError, subprocess.SubprocessError):
            pass
    return probe_mqtt_target(url, "mosquitto", "Mosquitto", version)
