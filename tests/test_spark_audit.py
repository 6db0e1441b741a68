"""S10: `ackmq pipeline audit` lands the broker's lifecycle events into a table, once.

Known messages are published (confirmed), consumed and acked, nacked into a dead-letter
queue, rejected and requeued, and left to expire; `ackmq pipeline audit
--available-now` lands the events, twice (a second run on the same checkpoint after more
events: nothing of the first lands again). Each expected event must be in the table
exactly once, joined to its message by `id`, and the two questions of the issue ("where
is message X", "p99 publish→ack per queue") answered by one SQL query each.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pika
import pytest
from conftest import BrokerProcess

pytestmark = [pytest.mark.spark, pytest.mark.slow]

try:
    import pyspark  # noqa: F401
except ImportError:  # pragma: no cover
    pytest.skip("pyspark is not installed", allow_module_level=True)
if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
    pytest.skip("Spark needs Java (no java on PATH, no JAVA_HOME)", allow_module_level=True)

from ackmq.cli import main  # noqa: E402
from ackmq.spark.lake import read_committed  # noqa: E402


def _ctl(*args: str) -> int:
    with contextlib.redirect_stdout(io.StringIO()):
        return main(["ctl", *args])


def _audit(url: str, to: Path, chk: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "ackmq.spark", "pipeline", "audit",
                        "--url", url, "--to", str(to), "--checkpoint", str(chk),
                        "--available-now"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr


def _traffic(url: str, prefix: str) -> None:
    """<prefix>-ack: acked; -nack: nacked to the DLQ, acked there; -reject: rejected with
    requeue, redelivered, acked; -exp: expires in a TTL queue. All confirmed."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        ch.exchange_declare("au.dlx", "fanout")
        ch.queue_declare("au.dlq", durable=True)
        ch.queue_bind("au.dlq", "au.dlx")
        ch.queue_declare("au.q", durable=True, arguments={"x-dead-letter-exchange": "au.dlx"})
        ch.queue_declare("au.ttl", durable=True, arguments={"x-message-ttl": 100})
        ch.confirm_delivery()
        for kind, queue in (("ack", "au.q"), ("nack", "au.q"), ("reject", "au.q"),
                            ("exp", "au.ttl")):
            ch.basic_publish("", queue, kind.encode(), pika.BasicProperties(
                message_id=f"{prefix}-{kind}", delivery_mode=2))
        tags = {}
        for _ in range(3):
            m, p, _b = ch.basic_get("au.q")
            tags[p.message_id] = m.delivery_tag
        ch.basic_ack(tags[f"{prefix}-ack"])
        ch.basic_nack(tags[f"{prefix}-nack"], requeue=False)
        ch.basic_reject(tags[f"{prefix}-reject"], requeue=True)
        m, _p, _b = ch.basic_get("au.q")
        ch.basic_ack(m.delivery_tag)
        m, _p, _b = ch.basic_get("au.dlq")
        ch.basic_ack(m.delivery_tag)
        deadline = time.monotonic() + 30
        while ch.queue_declare("au.ttl", passive=True).method.message_count and \
                time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        conn.close()


EXPECTED = {
    "ack": ["publish", "route", "confirm", "deliver", "ack"],
    "nack": ["publish", "route", "confirm", "deliver", "nack", "deadletter", "deliver",
             "ack"],
    "reject": ["publish", "route", "confirm", "deliver", "reject", "deliver", "ack"],
    "exp": ["publish", "route", "confirm", "expire"],
}


@pytest.mark.timeout(600)
def test_S10_audit_lands_each_event_once(tmp_path: Path) -> None:
    from ackmq.spark.audit import prepare
    b = BrokerProcess(tmp_path / "data", "--no-stomp")
    b.start()
    try:
        assert _ctl("--data-dir", str(b.data_dir), "trace_on", "--lifecycle") == 0
        prepare(b.url)  # the audit queue exists before the first event
        to, chk = tmp_path / "events", tmp_path / "chk"
        _traffic(b.url, "one")
        _audit(b.url, to, chk)
        _traffic(b.url, "two")  # more events, then the same checkpoint again: in this
        spark = _land_again(b.url, to, chk)  # process (one JVM start less)
        try:
            audit_left = pika.BlockingConnection(pika.URLParameters(b.url))
            left = audit_left.channel().queue_declare("ackmq.audit", passive=True)
            audit_left.close()
            _check(to)
            _queries(spark, str(to))
        finally:
            spark.stop()
    finally:
        b.stop()
    assert left.method.message_count == 0  # everything landed and acked


def _land_again(url: str, to: Path, chk: Path) -> Any:
    """The second run: `pipeline audit`'s own land call, in this process's Spark."""
    from ackmq.spark.audit import events
    from ackmq.spark.pipeline import land, spark_session
    spark = spark_session("ackmq-audit-test")
    s = land(spark, url=url, queue="ackmq.audit", to=str(to), checkpoint=str(chk),
             available_now=True, transform=events)
    assert s.rows == sum(len(ev) for ev in EXPECTED.values())  # the second traffic's only
    return spark


def _check(to: Path) -> None:
    t = read_committed(to)
    assert t is not None
    rows = t.to_pylist()
    assert len({r["landed_seq"] for r in rows}) == len(rows)  # no event landed twice
    by_message: dict[str, list[str]] = {}
    for r in rows:
        by_message.setdefault(r["message_id"], []).append(r["event"])
    want = {f"{p}-{k}": Counter(ev) for p in ("one", "two") for k, ev in EXPECTED.items()}
    assert {m: Counter(ev) for m, ev in by_message.items()} == want
    for m in want:
        mine = [r for r in rows if r["message_id"] == m]
        assert len({r["id"] for r in mine}) == 1, mine  # joined on one broker identity
        assert all(r["time_us"] and r["at"] for r in mine)
        confirm = next(r for r in mine if r["event"] == "confirm")
        assert confirm["ack"] is True and confirm["fsync_us"] > 0
    dl = next(r for r in rows if r["message_id"] == "one-nack" and r["event"] == "deadletter")
    assert (dl["queue"], dl["reason"], dl["exchange"], dl["routed_queues"]) == (
        "au.q", "rejected", "au.dlx", ["au.dlq"])
    redelivered = [r for r in rows if r["message_id"] == "one-reject"
                   and r["event"] == "deliver"]
    assert sorted(r["redelivered"] for r in redelivered) == [False, True]


def _queries(spark: Any, table: str) -> None:
    """The docs' two queries, run by Spark on the landed table."""
    from ackmq.spark.audit import P99_PUBLISH_TO_ACK, WHERE_IS, events_view
    events_view(spark, table)
    where = spark.sql(WHERE_IS.format(message_id="one-nack")).collect()
    assert [(r.event, r.name) for r in where] == [
        ("publish", ""), ("route", ""), ("confirm", ""), ("deliver", "au.q"),
        ("nack", "au.q"), ("deadletter", "au.q"), ("deliver", "au.dlq"),
        ("ack", "au.dlq")]
    p99 = {r.queue: r for r in spark.sql(P99_PUBLISH_TO_ACK).collect()}
    assert set(p99) == {"au.q", "au.dlq"}
    assert p99["au.q"].acked == 4 and p99["au.q"].p99_ms >= 0
