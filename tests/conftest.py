"""Shared fixtures: a real ackmq broker on a real socket (or any broker via ACKMQ_TEST_URL)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

pytest_plugins = ("support.stomphelp", "support.tlshelp", "support.mgmthelp",
                  "support.sparkcluster", "support.sparkjvm")  # STOMP fixtures (target, queue, ...); TLS: ca; mgmt
# every `ackmq serve` the tests start takes a free management port: RabbitMQ's
# management plugin holds 15672 on CI
os.environ.setdefault("ACKMQ_HTTP_PORT", "0")
# and a free stream protocol port: RabbitMQ's stream plugin holds 5552
os.environ.setdefault("ACKMQ_STREAM_PORT", "0")
# and RabbitMQ's MQTT plugin (or Mosquitto) holds 1883: every test broker picks a free port
os.environ.setdefault("ACKMQ_MQTT_PORT", "0")

URL_LINE = re.compile(r"listening on (amqp://\S+)")
STOMP_URL = re.compile(r"(stomp://\S+:(\d+))")
STREAM_URL = re.compile(r"rabbitmq-stream://(\S+):(\d+)")
MQTT_URL = re.compile(r"mqtt://(\S+):(\d+)")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """`./run test`'s workers: each test in its lane (support/lanes.py)."""
    from support import lanes
    return lanes.make_scheduler(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On xdist's workers: the big lanes first, so the last worker to finish is not left
    with them (xdist tells its workers `workerinput`)."""
    if hasattr(config, "workerinput"):
        from support import lanes
        lanes.order(items, config.rootpath)


# the broker's log line when a port it was given is taken
CANNOT_LISTEN = re.compile(r"cannot listen on \S+:(\d+)(?: \((\w+)\))?: .*already in use")


class BrokerProcess:
    """`ackmq serve` as a subprocess; the tests talk to it over loopback like any client."""

    def __init__(self, data_dir: Path, *extra: str, port: int = 0, stomp_port: int = 0) -> None:
        """STOMP listens on a free port (`stomp_url`, kept across restarts like the AMQP
        one) unless `extra` says --no-stomp or its own --stomp-port: many brokers run at
        once, and ActiveMQ may hold 61613."""
        self.data_dir = data_dir
        self.extra = extra
        self.port = port
        self.stomp_port = stomp_port
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""
        self.stomp_url = ""
        self.stream_port = 0  # the stream protocol's, from the log line (0: none)
        self.mqtt_port = 0  # where MQTT listens (--mqtt-port 0: a free one, from the log)
        self.log: list[str] = []
        self._retried = 0  # starts retried on a taken port (start's end)

    def start(self, timeout: float = 30.0) -> str:
        from support import ports
        own_port = not self.port  # the AMQP port chosen here, not by the test
        if own_port:
            self.port = ports.pick()
        stomp = []
        if "--no-stomp" not in self.extra and "--stomp-port" not in self.extra:
            self.stomp_port = self.stomp_port or ports.pick()
            stomp = ["--stomp-port", str(self.stomp_port)]
        env = dict(os.environ)
        if self.mqtt_port and "--mqtt-port" not in self.extra and "--no-mqtt" not in self.extra:
            stomp += ["--mqtt-port", str(self.mqtt_port)]  # a restart keeps its MQTT port
        elif env.get("ACKMQ_MQTT_PORT") == "0":  # the default a config file may override
            env["ACKMQ_MQTT_PORT"] = str(ports.pick())  # self.mqtt_port: from the log line
        cmd = [sys.executable, "-m", "ackmq", "serve", "--port", str(self.port), *stomp,
               "--data-dir", str(self.data_dir), *self.extra]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, bufsize=1, env=env)
        deadline = time.monotonic() + timeout
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.log.append(line)
            m = URL_LINE.search(line)
            if m:
                self.url = m.group(1)
                self.port = int(self.url.rsplit(":", 1)[1].split("/")[0])
                ms = STOMP_URL.search(line)
                if ms:
                    self.stomp_url, self.stomp_port = ms.group(1), int(ms.group(2))
                mx = STREAM_URL.search(line)
                if mx:
                    self.stream_port = int(mx.group(2))
                mm = MQTT_URL.search(line)
                if mm:
                    self.mqtt_port = int(mm.group(2))
                # keep draining output so the broker never blocks on a full pipe
                import threading
                threading.Thread(target=self._drain, daemon=True).start()
                return self.url
        self.stop()
        # the ports come from below the ephemeral range (support.ports), so no client's
        # socket takes one between a kill and the restart; another worker's broker can
        # still pick the same free port at the same moment: a first start picks afresh
        # (a restart keeps its AMQP port, which clients reconnect to; STOMP and MQTT
        # move), a few times
        m = CANNOT_LISTEN.search("".join(self.log[-3:]))
        tries = self._retried
        if m and tries < 3:
            name = {"STOMP": "stomp_port", "MQTT": "mqtt_port"}.get(m.group(2) or "", "port")
            if name != "port" or own_port:
                setattr(self, name, 0)
                self._retried = tries + 1
                try:
                    return self.start(timeout)
                finally:
                    self._retried = tries
        raise RuntimeError("ackmq did not start:\n" + "".join(self.log))

    def _drain(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self.log.append(line)

    def kill(self) -> None:
        """SIGKILL: the crash the durability promise is about."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


# the stream protocol's URL of a test broker, by its AMQP URL (the session broker's
# stream port is a free one; ACKMQ_TEST_STREAM_URL with ACKMQ_TEST_URL)
STREAM_URLS: dict[str, str] = {}


@pytest.fixture(scope="session")
def broker_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of the broker under test: ACKMQ_TEST_URL if set, else a fresh `ackmq serve`."""
    external = os.environ.get("ACKMQ_TEST_URL")
    if external:
        if os.environ.get("ACKMQ_TEST_STREAM_URL"):
            STREAM_URLS[external] = os.environ["ACKMQ_TEST_STREAM_URL"]
        yield external
        return
    broker = BrokerProcess(tmp_path_factory.mktemp("ackmq-data"))
    url = broker.start()
    if broker.stream_port:
        STREAM_URLS[url] = f"rabbitmq-stream://guest:guest@127.0.0.1:{broker.stream_port}/"
    yield url
    broker.stop()


_rabbitmq_checked: dict[str, str | None] = {}


def rabbitmq_url() -> str:
    """The reference RabbitMQ's URL (`ACKMQ_RABBITMQ_URL`, default loopback 5672), or a skip
    saying why it is not there (CI starts Debian's; `../shared/tools/rabbitmq-local start`)."""
    url = os.environ.get("ACKMQ_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/")
    if url not in _rabbitmq_checked:
        try:
            conn = pika.BlockingConnection(pika.URLParameters(url))
            product = conn._impl.server_properties.get("product", b"")
            conn.close()
            product = product.decode() if isinstance(product, bytes) else str(product)
            _rabbitmq_checked[url] = None if "RabbitMQ" in product else \
                f"{url.split('@')[-1]} is {product!r}, not RabbitMQ"
        except Exception as exc:  # noqa: BLE001 - any failure means: no reference broker
            _rabbitmq_checked[url] = f"no RabbitMQ at {url.split('@')[-1]} ({exc!r})"
    reason = _rabbitmq_checked[url]
    if reason is not None:
        pytest.skip(reason + "; start one with ../shared/tools/rabbitmq-local start")
    return url


@pytest.fixture(scope="session")
def is_rabbitmq(broker_url: str) -> bool:
    """True when the suite runs against a real RabbitMQ (reference behaviour)."""
    conn = pika.BlockingConnection(pika.URLParameters(broker_url))
    try:
        product = conn._impl.server_properties.get("product", b"")
        if isinstance(product, bytes):
            product = product.decode()
        return "RabbitMQ" in product
    finally:
        conn.close()


@pytest.fixture
def params(broker_url: str) -> pika.URLParameters:
    return pika.URLParameters(broker_url)


@pytest.fixture
def connection(params: pika.URLParameters) -> Iterator[pika.BlockingConnection]:
    conn = pika.BlockingConnection(params)
    yield conn
    if conn.is_open:
        conn.close()


@pytest.fixture
def other(params: pika.URLParameters) -> Iterator[pika.BlockingConnection]:
    """A second connection (exclusive queues, cross-connection checks)."""
    conn = pika.BlockingConnection(params)
    yield conn
    if conn.is_open:
        conn.close()


@pytest.fixture
def channel(connection: pika.BlockingConnection):
    return connection.channel()


@pytest.fixture
def qname(request: pytest.FixtureRequest) -> str:
    """A queue name unique to the test, so tests can share one broker."""
    return f"t.{request.node.name[:60]}.{uuid.uuid4().hex[:8]}"


