"""Running a broker inside your own process: `Broker` for asyncio code, `EmbeddedBroker`
(a background thread with its own loop) for synchronous code and pytest fixtures, the
way Java users embed ActiveMQ's BrokerService."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import threading
from pathlib import Path
from types import TracebackType
from typing import Any

from ackmq.server.config import Config
from ackmq.server.server import Server


def _config(host: str, port: int, data_dir: str | Path | None, persistent: bool,
            fsync: bool, **kw: Any) -> tuple[Config, str | None]:
    kw.setdefault("stomp_port", 0)  # embedded: a free port (None: no STOMP listener)
    kw.setdefault("stream_port", 0)  # the stream protocol's too (None: none)
    kw.setdefault("mqtt_port", 0)  # and MQTT (None: no MQTT listener)
    kw.setdefault("http_port", 0)  # the management API too (None: no HTTP listener)
    tmp = None
    if not persistent:
        path = None
    elif data_dir is None:
        tmp = tempfile.mkdtemp(prefix="ackmq-")
        path = Path(tmp)
    else:
        path = Path(data_dir)
    return Config(host=host, port=port, data_dir=path, fsync=fsync, **kw), tmp


class _Addresses:
    """Where a started broker listens ("" / 0 until it starts, or for a listener that is
    off): one list for `Broker` and `EmbeddedBroker`, which copies its `Broker`'s."""

    url: str = ""
    port: int = 0
    stomp_url: str = ""
    stomp_port: int = 0
    tls_url: str = ""  # amqps://...: with tls_port=0 (a free port) and tls_cert/tls_key
    stomp_tls_url: str = ""  # stomp+ssl://...: with stomp_tls_port=0 and tls_cert/tls_key
    stomp_tls_port: int = 0
    stream_url: str = ""  # rabbitmq-stream://127.0.0.1:PORT (stream_port=None: none)
    stream_port: int = 0
    mqtt_url: str = ""  # mqtt://127.0.0.1:PORT (mqtt_port=None: no MQTT listener)
    mqtt_port: int = 0
    http_url: str = ""  # http://127.0.0.1:PORT: the management API (http_port=None: none)
    http_port: int = 0

    def _take_addresses(self, other: _Addresses) -> None:
        for name in _Addresses.__annotations__:
            setattr(self, name, getattr(other, name))


class Broker(_Addresses):
    """`async with ackmq.Broker(port=0) as broker: broker.url`.

    `data_dir=None` uses a temporary directory removed on exit; `persistent=False` keeps
    nothing on disk at all. STOMP listens on a free port by default (`broker.stomp_url`,
    `stomp://127.0.0.1:PORT`): tests and apps embedding several brokers must not collide
    on 61613; `stomp_port=61613` asks for the usual one, `stomp_port=None` for none.
    The management API likewise (`broker.http_url`; `http_port=None` for none).
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, data_dir: str | Path | None = None,
                 *, persistent: bool = True, fsync: bool = True, **options: Any) -> None:
        self.config, self._tmp = _config(host, port, data_dir, persistent, fsync, **options)
        self.server = Server(self.config)

    async def start(self) -> str:
        self.url = await self.server.start()
        self.port = self.server.port
        self.stomp_url, self.stomp_port = self.server.stomp_url, self.server.stomp_port
        self.stream_url, self.stream_port = self.server.stream_url, self.server.stream_port
        self.mqtt_url, self.mqtt_port = self.server.mqtt_url, self.server.mqtt_port
        self.tls_url = self.server.tls_url
        self.stomp_tls_url = self.server.stomp_tls_url
        self.stomp_tls_port = self.server.stomp_tls_port
        if self.server.http is not None:
            self.http_url, self.http_port = self.server.http.url, self.server.http.port
        return self.url

    async def stop(self) -> None:
        await self.server.stop()
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    async def __aenter__(self) -> Broker:
        await self.start()
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()


class EmbeddedBroker(_Addresses):
    """`with ackmq.EmbeddedBroker() as broker: pika.URLParameters(broker.url)`;
    `broker.stomp_url` as for `Broker`."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, data_dir: str | Path | None = None,
                 *, persistent: bool = True, fsync: bool = True, **options: Any) -> None:
        self._broker = Broker(host, port, data_dir, persistent=persistent, fsync=fsync,
                              **options)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None

    def start(self, timeout: float = 30.0) -> str:
        self._thread = threading.Thread(target=self._run, name="ackmq-broker", daemon=True)
        self._thread.start()
        if not self._started.wait(timeout):
            raise TimeoutError("embedded ackmq broker did not start")
        if self._error is not None:
            raise self._error
        self._take_addresses(self._broker)
        return self.url

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._broker.start())
        except BaseException as e:  # report to the starting thread
            self._error = e
            self._started.set()
            loop.close()
            return
        self._started.set()
        loop.run_forever()
        loop.run_until_complete(self._broker.stop())
        loop.close()

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(30)

    @property
    def server(self) -> Server:
        return self._broker.server

    def __enter__(self) -> EmbeddedBroker:
        self.start()
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
