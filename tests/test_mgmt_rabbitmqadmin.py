"""M1: RabbitMQ's own `rabbitmqadmin` 3.10 (the script its management plugin serves at
/cli/rabbitmqadmin) driven against ackmq: list / declare / delete / publish / get /
export / import. The script is fetched from CI's RabbitMQ; without one the test skips
saying so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from support.mgmthelp import RABBIT_HTTP


@pytest.fixture(scope="module")
def rabbitmqadmin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = os.environ.get("ACKMQ_RABBITMQADMIN")
    if path:
        return Path(path)
    dest = tmp_path_factory.mktemp("rabbitmqadmin") / "rabbitmqadmin"
    try:
        with urllib.request.urlopen(RABBIT_HTTP + "/cli/rabbitmqadmin", timeout=10) as r:
            dest.write_bytes(r.read())
    except OSError as e:
        pytest.skip(f"rabbitmqadmin is served by RabbitMQ's management plugin at "
                    f"{RABBIT_HTTP}/cli/rabbitmqadmin, which is not reachable ({e!r}); "
                    "start one with ../shared/tools/rabbitmq-local start, or set "
                    "ACKMQ_RABBITMQADMIN to the script")
    return dest


def _admin(script: Path, port: int, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(script), "-H", "127.0.0.1", "-P", str(port),
                           "-u", "guest", "-p", "guest", *args],
                          capture_output=True, text=True, timeout=60)


def _rows(out: str) -> list[list[str]]:
    """rabbitmqadmin's table (`-f tsv` has no header line) as rows of cells."""
    return [line.split("\t") for line in out.splitlines() if line]


def test_M1_rabbitmqadmin_against_ackmq(rabbitmqadmin: Path, ackmq_mgmt: Any,
                                        tmp_path: Path) -> None:
    port = ackmq_mgmt.http_port

    def ok(*args: str) -> str:
        r = _admin(rabbitmqadmin, port, *args)
        assert r.returncode == 0, (args, r.stdout, r.stderr)
        return r.stdout

    assert "queue declared" in ok("declare", "queue", "name=ra-q", "durable=true",
                                  'arguments={"x-max-length": 100}')
    assert "exchange declared" in ok("declare", "exchange", "name=ra-x", "type=fanout")
    assert "binding declared" in ok("declare", "binding", "source=ra-x", "destination=ra-q")
    assert "Message published" in ok("publish", "exchange=ra-x", "routing_key=k",
                                     "payload=hello")
    assert ["ra-q", "1"] in _rows(ok("-f", "tsv", "list", "queues", "name", "messages"))
    assert ["ra-x", "fanout"] in _rows(ok("-f", "tsv", "list", "exchanges", "name", "type"))
    assert ["ra-x", "ra-q", ""] in _rows(ok("-f", "tsv", "list", "bindings", "source",
                                            "destination", "routing_key"))
    assert ["guest"] in _rows(ok("-f", "tsv", "list", "users", "name"))
    assert ["/"] in _rows(ok("-f", "tsv", "list", "vhosts", "name"))
    got = json.loads(ok("-f", "raw_json", "get", "queue=ra-q", "ackmode=ack_requeue_false"))
    assert [(m["payload"], m["exchange"], m["routing_key"]) for m in got] == [
        ("hello", "ra-x", "k")]
    assert ["ra-q", "0"] in _rows(ok("-f", "tsv", "list", "queues", "name", "messages"))
    overview = json.loads(ok("-f", "raw_json", "show", "overview"))
    assert overview[0]["object_totals"]["queues"] >= 1

    defs = tmp_path / "defs.json"
    ok("export", str(defs))
    exported = json.loads(defs.read_text())
    assert {"name": "ra-q", "vhost": "/", "durable": True, "auto_delete": False,
            "arguments": {"x-max-length": 100}} in exported["queues"]
    assert "queue deleted" in ok("delete", "queue", "name=ra-q")
    assert "exchange deleted" in ok("delete", "exchange", "name=ra-x")
    assert "ra-q" not in [r[0] for r in _rows(ok("-f", "tsv", "list", "queues", "name"))]
    ok("import", str(defs))
    assert ["ra-q", "0"] in _rows(ok("-f", "tsv", "list", "queues", "name", "messages"))
    assert ["ra-x", "ra-q", ""] in _rows(ok("-f", "tsv", "list", "bindings", "source",
                                            "destination", "routing_key"))
    assert "queue purged" in ok("purge", "queue", "name=ra-q")
    r = _admin(rabbitmqadmin, port, "close", "connection", "name=nope")
    assert r.returncode != 0 and "Not found: /api/connections/nope" in r.stdout + r.stderr
    ok("delete", "queue", "name=ra-q")
    ok("delete", "exchange", "name=ra-x")
