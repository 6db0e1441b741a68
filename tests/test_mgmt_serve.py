"""M1: `ackmq serve --http-port N | --no-http`: the listener is logged with the others,
a bad or busy port stops the start with a message naming it."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from conftest import BrokerProcess
from support.mgmthelp import Target


def _serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ackmq", "serve", "--port", "0",
                           "--stomp-port", "0", "--no-persistence", *args],
                          capture_output=True, text=True, timeout=60)


def test_M1_serve_logs_http_url_and_answers(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "data", "--http-port", "0")
    b.start()
    try:
        line = next(x for x in b.log if "listening on" in x)
        url = line.split(" and ")[-1].split(" ")[0]
        assert url.startswith("http://127.0.0.1:")
        assert Target("ackmq", url, b.url).call("GET", "/api/whoami").status == 200
    finally:
        b.stop()


def test_M1_serve_no_http(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "data", "--no-http")
    b.start()
    try:
        assert "http://" not in next(x for x in b.log if "listening on" in x)
    finally:
        b.stop()


def test_M1_serve_bad_and_busy_http_port() -> None:
    r = _serve("--http-port", "70000")
    assert r.returncode == 2
    assert "--http-port must be between 0 and 65535, got 70000" in r.stderr
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = _serve("--http-port", str(port))
    assert r.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port} (HTTP)" in r.stdout + r.stderr
    assert "Traceback" not in r.stdout + r.stderr
